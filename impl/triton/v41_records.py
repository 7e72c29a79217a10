"""SPEC §14.4-§14.5 in Triton device code: RoPE on the bf16 latent and the record of the rotated
entry ``z`` in each of the five layouts of ``v41_rope_quant_store``.

A latent travels as ``l8``: fp32 ``[8, 64]`` holding bf16 values (row-major = channel order,
row 7 = channels 448..511). RoPE rotates row 7's pairs with :mod:`.kv_entry`'s
:func:`rope_rotate` (SPEC §6's products, unrounded); ``z`` is ``l8`` with row 7 replaced by the
bf16 of the rotated pairs, NoPE copied bit for bit (``-0`` stays ``-0``).

- ``flashmla_fp8``, ``bf16``, ``fp8_per_tensor``: V4's stores unchanged
  (:func:`.kv_entry.store_entry`), fed ``l8`` for the NoPE values (already bf16, so their
  ``bf16`` rounding changes nothing) and the rotated pairs (which it rounds to bf16);
- ``v41_mxfp8`` (E = 528): ``z`` as ``[16, 32]``, UE8M0 blocks, E4M3 codes, then the 16 scale bytes;
- ``v41_nvfp4`` (E = 288): ``z`` as ``[32, 16]``, ``sigma = e4m3(div(max(amax, 6 * 2^-9), 6))``,
  codes ``e2m1(div(z, sigma))`` (a true division: a rounded reciprocal changes codes), packed
  two a byte, then the 32 scale bytes.

The two V4.1 records are interleaved: entry ``o`` of a page is the ``E`` bytes at
``page * page_stride + o * E``, its data then its scales.

``cache``: ``(cache_u8_ptr, cache_i16_ptr, page_stride, entry_stride, entries_per_page, fp8_scale)``:
uint8 and int16 views of ``k_cache`` (page bytes for the record layouts; bf16 values for
``bf16``; E4M3 bytes for ``fp8_per_tensor``), the page stride (bytes for the record layouts,
elements for the others), the entry stride (elements; ``bf16`` / ``fp8_per_tensor`` only),
``B`` and the fp32 ``fp8_scale`` (``fp8_per_tensor`` only; any value for the others).
"""


import triton
import triton.language as tl

from .exact_math import bf16_round, e2m1_code, e4m3_code, ue8m0_scale
from .kv_entry import ROPE_BLOCK, rope_rotate, store_entry

LAYOUT_CODES = {"flashmla_fp8": 0, "bf16": 1, "fp8_per_tensor": 2, "v41_mxfp8": 3, "v41_nvfp4": 4}
LAYOUT_V41_MXFP8 = tl.constexpr(3)

MXFP8_BLOCKS = tl.constexpr(16)
MXFP8_BLOCK = tl.constexpr(32)
MXFP8_ENTRY_BYTES = tl.constexpr(528)  # 512 E4M3 codes, then 16 UE8M0 bytes
NVFP4_TILES = tl.constexpr(32)
NVFP4_TILE = tl.constexpr(16)
NVFP4_DATA_BYTES = tl.constexpr(256)
NVFP4_ENTRY_BYTES = tl.constexpr(288)  # 256 bytes of packed E2M1 codes, then 32 E4M3 scales
NVFP4_FLOOR_BITS = tl.constexpr(0x3C400000)  # 6 * 2^-9 = 1.5 * 2^-7: sigma >= 2^-9, E4M3's smallest
E2M1_MAX_F32 = tl.constexpr(6.0)
E4M3_SUBNORMAL_STEP = tl.constexpr(0.001953125)  # 2^-9


@triton.jit
def rotate_latent(l8, cos_sin_row_ptr):
    """SPEC §14.4: ``(rope8, z8)``. ``rope8``: fp32 ``[8, 64]`` whose row 7 holds the rotated pairs
    ``o0, o1`` of ``l8``'s row 7 with the fp32 ``cos_sin_cache`` row at ``cos_sin_row_ptr``
    (unrounded; the other rows are by-products); ``z8``: ``l8`` with row 7 replaced by
    ``bf16(rope8)``."""
    rope8 = rope_rotate(l8, cos_sin_row_ptr)
    z8 = tl.where(tl.arange(0, 8)[:, None] == ROPE_BLOCK, bf16_round(rope8), l8)
    return rope8, z8


@triton.jit
def abs_max_bits(values):
    """Per row of fp32 ``values [rows, n]``: the bit pattern (int32) of ``max |v|`` (an integer max
    over sign-cleared patterns: exact, and ``-0`` counts as 0)."""
    return tl.max((values.to(tl.uint32, bitcast=True) & 0x7FFFFFFF).to(tl.int32, bitcast=True), axis=1)


@triton.jit
def store_mxfp8(z8, cache_ptr, record):
    """``v41_mxfp8`` at byte ``record`` of ``cache_ptr`` (uint8): sixteen blocks of 32 channels,
    ``amax``, UE8M0 exponent ``k`` (SPEC §2: ``AMIN`` floor, 448), data byte ``d``
    ``e4m3(z[d] * 2^-k)`` (a power-of-two scaling), scale byte ``512 + g`` = ``127 + k``."""
    z = tl.reshape(z8, (MXFP8_BLOCKS, MXFP8_BLOCK))
    scale_bytes, inv_scale = ue8m0_scale(abs_max_bits(z))
    codes = e4m3_code(z * inv_scale[:, None])
    data = tl.arange(0, MXFP8_BLOCKS)[:, None] * MXFP8_BLOCK + tl.arange(0, MXFP8_BLOCK)[None, :]
    tl.store(cache_ptr + (record + data), codes.to(tl.uint8))
    tl.store(cache_ptr + (record + MXFP8_BLOCKS * MXFP8_BLOCK + tl.arange(0, MXFP8_BLOCKS)), scale_bytes.to(tl.uint8))


@triton.jit
def e4m3_value(codes):
    """The fp32 value of non-negative E4M3FN codes (uint32, 0x00..0x7E): exponent field 0 is
    ``m * 2^-9``, else ``(1 + m/8) * 2^(e - 7)`` built from its binary32 fields (exact)."""
    exponent = codes >> 3
    mantissa = codes & 7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    subnormal = mantissa.to(tl.float32) * E4M3_SUBNORMAL_STEP
    return tl.where(exponent == 0, subnormal, normal)


@triton.jit
def store_nvfp4(z8, cache_ptr, record):
    """``v41_nvfp4`` at byte ``record`` of ``cache_ptr`` (uint8): thirty-two tiles of 16 channels,
    ``a = max(max |z|, 6 * 2^-9)`` (an integer max on bit patterns), ``sigma = e4m3(div(a, 6))``,
    ``code = e2m1(div(z, sigma))``; data byte ``j`` = ``code[2j] | code[2j+1] << 4``, scale byte
    ``256 + g`` = the E4M3 code of tile ``g``'s ``sigma``."""
    z = tl.reshape(z8, (NVFP4_TILES, NVFP4_TILE))
    a = tl.maximum(abs_max_bits(z), NVFP4_FLOOR_BITS).to(tl.float32, bitcast=True)
    scale_codes = e4m3_code(tl.div_rn(a, tl.full(a.shape, E2M1_MAX_F32, tl.float32)))
    sigma = e4m3_value(scale_codes)
    codes = e2m1_code(tl.div_rn(z, tl.broadcast_to(sigma[:, None], (NVFP4_TILES, NVFP4_TILE))))
    low, high = tl.split(tl.reshape(codes, (NVFP4_TILES, NVFP4_TILE // 2, 2)))
    packed = low | (high << 4)
    data = tl.arange(0, NVFP4_TILES)[:, None] * (NVFP4_TILE // 2) + tl.arange(0, NVFP4_TILE // 2)[None, :]
    tl.store(cache_ptr + (record + data), packed.to(tl.uint8))
    tl.store(cache_ptr + (record + NVFP4_DATA_BYTES + tl.arange(0, NVFP4_TILES)), scale_codes.to(tl.uint8))


@triton.jit
def store_record(l8, cos_sin_row_ptr, cache, slot, LAYOUT: tl.constexpr):
    """SPEC §14.4-§14.5: rotate the latent ``l8`` at the ``cos_sin_cache`` row ``cos_sin_row_ptr``
    and write the record of ``z`` at ``slot`` (int64) in ``LAYOUT`` (:data:`LAYOUT_CODES`);
    nothing else is touched."""
    cache_u8_ptr, cache_i16_ptr, page_stride, entry_stride, entries_per_page, fp8_scale = cache
    rope8, z8 = rotate_latent(l8, cos_sin_row_ptr)
    if LAYOUT < LAYOUT_V41_MXFP8:  # V4's three records, fed from z
        store_entry(l8, rope8, cache_u8_ptr, cache_i16_ptr, slot, entries_per_page, page_stride, entry_stride,
                    fp8_scale, LAYOUT)
    else:
        page = slot // entries_per_page
        entry = slot - page * entries_per_page
        if LAYOUT == LAYOUT_V41_MXFP8:
            store_mxfp8(z8, cache_u8_ptr, page * page_stride + entry * MXFP8_ENTRY_BYTES)
        else:
            store_nvfp4(z8, cache_u8_ptr, page * page_stride + entry * NVFP4_ENTRY_BYTES)
