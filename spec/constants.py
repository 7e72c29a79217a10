"""SPEC §1: notation and constants.

Every binary32 constant is written as its bit pattern, exactly as SPEC.md gives it, and
decoded once here, so no decimal literal can round differently on another platform.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HEAD_DIM = 512  # H: width of a compressed entry
INDEXER_HEAD_DIM = 128  # H_I: the lightning indexer's head width (SPEC §12)
HEAD_DIMS = (HEAD_DIM, INDEXER_HEAD_DIM)
ROPE_DIM = 64  # R: channels 448..511 are rotated
NOPE_DIM = 448  # N: channels 0..447 are quantized to E4M3
QUANT_BLOCK = 64  # G: one UE8M0 scale per 64 NoPE channels
NUM_QUANT_BLOCKS = NOPE_DIM // QUANT_BLOCK  # 7
FP8_MAX = 448.0  # largest finite E4M3FN magnitude

# FlashMLA "MODEL1" sparse FP8 entry: 448 E4M3 bytes + 64 bf16 RoPE values, plus 8 scale bytes.
DATA_RECORD_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
SCALE_RECORD_BYTES = 8  # 7 UE8M0 bytes + one pad byte 0
ENTRY_BYTES = DATA_RECORD_BYTES + SCALE_RECORD_BYTES  # 584


# SPEC §12: the indexer's entry (head width 128, RoPE on channels 64..127).
INDEXER_ROPE_START = INDEXER_HEAD_DIM - ROPE_DIM  # 64
INDEXER_FP8_DATA_BYTES = INDEXER_HEAD_DIM  # 128 E4M3 bytes
INDEXER_FP8_SCALE_BYTES = 4  # one binary32 scale 2^k, little-endian
INDEXER_MXFP4_BLOCK = 32  # channels per UE8M0 scale
INDEXER_MXFP4_BLOCKS = INDEXER_HEAD_DIM // INDEXER_MXFP4_BLOCK  # 4
INDEXER_MXFP4_DATA_BYTES = INDEXER_HEAD_DIM // 2  # 64: two E2M1 codes per byte
INDEXER_MXFP4_SCALE_BYTES = INDEXER_MXFP4_BLOCKS  # 4 UE8M0 bytes
E2M1_MAX = 6.0  # largest finite E2M1 magnitude
HADAMARD_SPANS = (64, 32, 16, 8, 4, 2, 1)  # the seven butterfly stages, in order


def f32_from_bits(bits: int) -> np.float32:
    """The binary32 number with the given 32-bit pattern."""
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


LOG2E = f32_from_bits(0x3FB8AA3B)  # L = log2(e) rounded to binary32
AMAX_FLOOR = f32_from_bits(0x38D1B717)  # AMIN = 1e-4 rounded to binary32
HADAMARD_SCALE = f32_from_bits(0x3DB504F3)  # h = 128^-1/2 rounded to binary32
EXP2S_COEFFS = tuple(
    f32_from_bits(b)
    for b in (0x3F800000, 0x3F317218, 0x3E75FDED, 0x3D63576A, 0x3C1D96DE, 0x3AAFA2B5, 0x3920E999)
)  # C0..C6 of exp2s' polynomial

SUPPORTED_RATIOS = (4, 128)


@dataclass(frozen=True)
class RatioConfig:
    """The shape constants that follow from a compress ratio ``r``."""

    ratio: int  # r: tokens pooled into one entry
    overlap: int  # coff: 2 for C4 (overlapped windows), 1 for C128
    state_width: int  # SW = coff * H: kv (and score) channels saved per token
    window: int  # W = coff * r: rows pooled per entry
    head_dim: int = HEAD_DIM  # H: 512, or 128 for the indexer (SPEC §12)

    @property
    def state_row_width(self) -> int:
        """Floats in one state-cache row: kv[0:SW] then score[0:SW]."""
        return 2 * self.state_width


def ratio_config(compress_ratio: int, head_dim: int = HEAD_DIM) -> RatioConfig:
    """SPEC §1/§12: coff, SW and W for ratio 4 (C4) or 128 (C128) and head width 512 or 128."""
    if compress_ratio not in SUPPORTED_RATIOS:
        raise ValueError(f"compress_ratio: expected one of {SUPPORTED_RATIOS}, got {compress_ratio!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {head_dim!r}")
    overlap = 2 if compress_ratio == 4 else 1
    return RatioConfig(
        ratio=compress_ratio,
        overlap=overlap,
        state_width=overlap * head_dim,
        window=overlap * compress_ratio,
        head_dim=head_dim,
    )


# ---- SPEC §14: the DeepSeek-V4.1 compressors (ratios 1 and 2, no overlap, no ape) ----------
V41_RATIOS = (1, 2)  # r; W = r rows per window, SW = 512
V41_STATE_ROW_WIDTH = 2 * HEAD_DIM  # a ratio-2 state row: kv[0:512] then the raw score[0:512]
MXFP8_BLOCK = 32  # v41_mxfp8: one UE8M0 scale per 32 channels
MXFP8_BLOCKS = HEAD_DIM // MXFP8_BLOCK  # 16
NVFP4_TILE = 16  # v41_nvfp4: one E4M3 scale per 16 channels
NVFP4_TILES = HEAD_DIM // NVFP4_TILE  # 32
NVFP4_AMAX_FLOOR = E2M1_MAX * 2.0**-9  # 6 * 2^-9: the tile amax floor, so that sigma >= 2^-9 (E4M3's smallest)


def v41_ratio_config(compress_ratio: int) -> RatioConfig:
    """SPEC §14.1: ``coff = 1``, ``SW = 512`` and ``W = r`` for ratio 1 or 2 (head width 512)."""
    if isinstance(compress_ratio, bool) or compress_ratio not in V41_RATIOS:
        raise ValueError(f"compress_ratio: expected one of {V41_RATIOS}, got {compress_ratio!r}")
    return RatioConfig(ratio=int(compress_ratio), overlap=1, state_width=HEAD_DIM, window=int(compress_ratio))
