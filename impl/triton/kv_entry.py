"""SPEC §6/§7 in Triton device code for the 512-wide head: which channels RoPE rotates, the NoPE
quantization and the store of one entry in each of the three layouts.

A token's normalized vector travels as ``y8``: fp32 ``[8, 64]``, row ``g`` = channels
``64g .. 64g+63``. Rows 0..6 are exactly the seven NoPE quantization blocks and row 7 is the
RoPE part, so block amaxes are row maxima and every layout's store is one masked ``[8, 64]``
store. The RoPE rotation and the encoders run on all 8 rows (a few hundred extra ALU ops per
token, invisible next to the 32 KiB - 512 KiB the token reads) and the stores pick rows.
"""


import triton
import triton.language as tl

from .exact_math import bf16_rne_bits, bf16_round, e4m3_code, ue8m0_scale
from .postprocess import apply_rope

BLOCKS = tl.constexpr(8)  # 7 NoPE quantization blocks + the RoPE block
BLOCK_W = tl.constexpr(64)
ROPE_BLOCK = tl.constexpr(7)
DATA_RECORD_BYTES = tl.constexpr(576)
SCALE_RECORD_BYTES = tl.constexpr(8)
LOG2_HEAD_DIM = tl.constexpr(9)

LAYOUT_FLASHMLA_FP8 = 0
LAYOUT_BF16 = 1
LAYOUT_FP8_PER_TENSOR = 2
LAYOUT_CODES = {"flashmla_fp8": LAYOUT_FLASHMLA_FP8, "bf16": LAYOUT_BF16, "fp8_per_tensor": LAYOUT_FP8_PER_TENSOR}


@triton.jit
def rope_rotate(y8, cos_sin_row_ptr):
    """SPEC §6 RoPE (:func:`.postprocess.apply_rope`) of row 7 of ``y8``, channels 448..511 (the
    other rows are rotated alike and not stored). ``cos_sin_row_ptr``: fp32 [64] row."""
    return apply_rope(y8, cos_sin_row_ptr, ROPE_BLOCK, BLOCKS, BLOCK_W)


@triton.jit
def quantize_nope_blocks(y8):
    """SPEC §6 NoPE quantization of every row of ``y8`` as one block of 64.

    ``q = bf16(y)``; ``amax`` is an integer max over ``|q|``'s bit patterns; UE8M0 per block;
    codes ``e4m3(q * 2^-k)`` (a power-of-two scaling). Returns ``(codes uint32 [8, 64],
    scale_bytes int32 [8])``.
    """
    q_bits = bf16_rne_bits(y8) << 16
    amax_bits = tl.max((q_bits & 0x7FFFFFFF).to(tl.int32, bitcast=True), axis=1)
    scale_bytes, inv_scale = ue8m0_scale(amax_bits)
    codes = e4m3_code(q_bits.to(tl.float32, bitcast=True) * inv_scale[:, None])
    return codes, scale_bytes


@triton.jit
def store_entry(y8, rope8, cache_u8_ptr, cache_i16_ptr, slot, entries_per_page, page_stride, entry_stride,
                fp8_scale, LAYOUT: tl.constexpr):
    """SPEC §7: write the entry of ``slot`` in the chosen layout; nothing else is touched.

    ``y8``: normalized fp32 [8, 64]; ``rope8``: rotated fp32 [8, 64] (row 7 is the RoPE part).
    flashmla_fp8: ``cache_u8_ptr``/``cache_i16_ptr`` both address the page bytes (uint8 and int16
    views), ``page_stride`` in bytes, data record at ``page*stride + o*576`` (448 E4M3 bytes, then
    64 little-endian bf16), scale record at ``page*stride + B*576 + o*8`` (7 UE8M0 bytes, 0).
    bf16: ``cache_i16_ptr`` [pages, B, 512] (strides in elements). fp8_per_tensor:
    ``cache_u8_ptr`` [pages, B, 512] bytes, codes ``e4m3(z * (1 / fp8_scale))``.
    """
    page = slot // entries_per_page
    entry = slot - page * entries_per_page
    block = tl.arange(0, BLOCKS)[:, None]
    channels = block * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]
    is_nope = block < ROPE_BLOCK
    is_rope = block == ROPE_BLOCK
    rope_bits = bf16_rne_bits(rope8)
    if LAYOUT == 0:  # flashmla_fp8
        codes, scale_bytes = quantize_nope_blocks(y8)
        record = page * page_stride + entry * DATA_RECORD_BYTES
        tl.store(cache_u8_ptr + (record + channels), codes.to(tl.uint8), mask=is_nope)
        # RoPE bf16 values at bytes 448 + 2c of the record: int16 element (record + 448) / 2 + c
        rope_i16 = rope_bits.to(tl.uint16).to(tl.int16, bitcast=True)
        tl.store(cache_i16_ptr + ((record >> 1) + (channels - ROPE_BLOCK * BLOCK_W // 2)), rope_i16, mask=is_rope)
        scale_record = page * page_stride + entries_per_page * DATA_RECORD_BYTES + entry * SCALE_RECORD_BYTES
        blocks_1d = tl.arange(0, BLOCKS)
        pad_or_scale = tl.where(blocks_1d < ROPE_BLOCK, scale_bytes, 0)
        tl.store(cache_u8_ptr + (scale_record + blocks_1d), pad_or_scale.to(tl.uint8))
    elif LAYOUT == 1:  # bf16
        values = tl.where(is_nope, bf16_rne_bits(y8), rope_bits)
        tl.store(cache_i16_ptr + (page * page_stride + entry * entry_stride + channels),
                 values.to(tl.uint16).to(tl.int16, bitcast=True))
    else:  # fp8_per_tensor
        one = tl.full((), 1.0, tl.float32)
        inv = tl.div_rn(one, fp8_scale)
        z = tl.where(is_nope, bf16_round(y8), (rope_bits << 16).to(tl.float32, bitcast=True))
        tl.store(cache_u8_ptr + (page * page_stride + entry * entry_stride + channels), e4m3_code(z * inv).to(tl.uint8))
