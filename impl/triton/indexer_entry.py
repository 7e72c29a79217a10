"""SPEC §12 in Triton device code for the indexer's 128-wide head: RoPE on channels 64..127, the
optional Hadamard rotation, and the two whole-entry quantizations with their stores (the
RMSNorm and the RoPE pairs are :mod:`.postprocess`'s, at width 128).

A token's 128-wide vector travels as ``x4``: fp32 ``[4, 32]``, row ``g`` = channels
``32g .. 32g+31``. Rows are exactly the four MXFP4 blocks (block amaxes are row maxima); rows 2
and 3 are the RoPE channels. Flattening ``[4, 32]`` row-major is channel order.
"""


import triton
import triton.language as tl

from ...spec.constants import HADAMARD_SCALE
from .exact_math import bf16_rne_bits, e2m1_code, e4m3_code, mxfp4_scale, ue8m0_scale
from .postprocess import apply_rope

INDEXER_HEAD = tl.constexpr(128)
ROWS = tl.constexpr(4)  # MXFP4 blocks of 32 channels
ROW_W = tl.constexpr(32)
ROPE_FIRST_ROW = tl.constexpr(2)  # channels 64..127
LOG2_INDEXER_HEAD = tl.constexpr(7)
HADAMARD_SCALE_F32 = tl.constexpr(float(HADAMARD_SCALE))  # 0x3DB504F3, exactly representable
FP8_DATA_BYTES = tl.constexpr(128)
FP8_SCALE_BYTES = tl.constexpr(4)
MXFP4_DATA_BYTES = tl.constexpr(64)
MXFP4_SCALE_BYTES = tl.constexpr(4)

INDEXER_LAYOUT_CODES = {"indexer_fp8": 0, "indexer_mxfp4": 1}


@triton.jit
def indexer_rope(y4, cos_sin_row_ptr):
    """``z``: rows 0, 1 of ``y4`` unchanged; rows 2, 3 (channels 64..127) rotated as pairs
    ``(y[64+2j], y[65+2j])`` (:func:`.postprocess.apply_rope`) with the fp32 row
    ``cos_sin_row_ptr`` (``cos[0:32] ‖ sin[0:32]``)."""
    rotated = apply_rope(y4, cos_sin_row_ptr, ROPE_FIRST_ROW, ROWS, ROW_W)
    return tl.where(tl.arange(0, ROWS)[:, None] >= ROPE_FIRST_ROW, rotated, y4)


@triton.jit
def hadamard_rotate(z4):
    """SPEC §12's rotation: butterflies with spans 64, 32, ..., 1, each pair ``(z[i], z[i+S])``
    becoming ``(z[i] + z[i+S], z[i] - z[i+S])`` (one add.rn / sub.rn), then ``* 0x3DB504F3``."""
    z = tl.reshape(z4, (INDEXER_HEAD, ))
    for level in tl.static_range(7):
        # view [2^level groups, 2 halves, span 64 >> level]; the halves axis moved last to split it
        first, second = tl.split(tl.permute(tl.reshape(z, (1 << level, 2, 64 >> level)), (0, 2, 1)))
        z = tl.reshape(tl.permute(tl.join(first + second, first - second), (0, 2, 1)), (INDEXER_HEAD, ))
    return tl.reshape(z * HADAMARD_SCALE_F32, (ROWS, ROW_W))


@triton.jit
def store_indexer_fp8(q_bits, cache_ptr, record, scale_record):
    """``indexer_fp8``: ``q_bits`` (uint32 [4, 32], bf16 patterns << 16) as one E4M3 block.

    ``amax`` is an integer max over the sign-cleared patterns; UE8M0 exponent ``k`` (SPEC §2);
    128 bytes ``e4m3(q * 2^-k)`` at ``record``, the binary32 ``2^k`` (exponent field = the UE8M0
    byte) little-endian at ``scale_record``.
    """
    amax_bits = tl.max(tl.max((q_bits & 0x7FFFFFFF).to(tl.int32, bitcast=True), axis=1), axis=0)
    scale_byte, inv_scale = ue8m0_scale(amax_bits)
    codes = e4m3_code(q_bits.to(tl.float32, bitcast=True) * inv_scale)
    channels = tl.arange(0, ROWS)[:, None] * ROW_W + tl.arange(0, ROW_W)[None, :]
    tl.store(cache_ptr + (record + channels), codes.to(tl.uint8))
    byte = tl.arange(0, FP8_SCALE_BYTES)
    scale_bits = scale_byte << 23
    tl.store(cache_ptr + (scale_record + byte), ((scale_bits >> (byte * 8)) & 0xFF).to(tl.uint8))


@triton.jit
def store_indexer_mxfp4(q_bits, cache_ptr, record, scale_record):
    """``indexer_mxfp4``: ``q_bits`` (uint32 [4, 32]) as four E2M1 blocks of 32.

    Per row: integer amax, MXFP4 exponent, ``v = q * 2^-k`` (one rounded mul), ``e2m1(v)``; byte
    ``j`` at ``record + j`` is ``code[2j] | code[2j+1] << 4``; the four UE8M0 bytes at ``scale_record``.
    """
    amax_bits = tl.max((q_bits & 0x7FFFFFFF).to(tl.int32, bitcast=True), axis=1)
    scale_bytes, inv_scale = mxfp4_scale(amax_bits)
    codes = e2m1_code(q_bits.to(tl.float32, bitcast=True) * inv_scale[:, None])
    low, high = tl.split(tl.reshape(codes, (ROWS, ROW_W // 2, 2)))
    packed = low | (high << 4)
    data_bytes = tl.arange(0, ROWS)[:, None] * (ROW_W // 2) + tl.arange(0, ROW_W // 2)[None, :]
    tl.store(cache_ptr + (record + data_bytes), packed.to(tl.uint8))
    tl.store(cache_ptr + (scale_record + tl.arange(0, MXFP4_SCALE_BYTES)), scale_bytes.to(tl.uint8))


@triton.jit
def store_indexer_entry(z4, cache_ptr, slot, entries_per_page, page_stride, LAYOUT: tl.constexpr):
    """SPEC §12: ``q = bf16(z)`` and the entry of ``slot`` in the chosen layout; nothing else is
    touched. ``cache_ptr``: uint8 page bytes, ``page_stride`` in bytes; per page ``B`` data
    records, then ``B`` scale records."""
    page = slot // entries_per_page
    entry = slot - page * entries_per_page
    q_bits = bf16_rne_bits(z4) << 16
    if LAYOUT == 0:  # indexer_fp8, E = 132
        page_base = page * page_stride
        store_indexer_fp8(q_bits, cache_ptr, page_base + entry * FP8_DATA_BYTES,
                          page_base + entries_per_page * FP8_DATA_BYTES + entry * FP8_SCALE_BYTES)
    else:  # indexer_mxfp4, E = 68
        page_base = page * page_stride
        store_indexer_mxfp4(q_bits, cache_ptr, page_base + entry * MXFP4_DATA_BYTES,
                            page_base + entries_per_page * MXFP4_DATA_BYTES + entry * MXFP4_SCALE_BYTES)
