"""SPEC §12: the indexer's post-processing after RMSNorm: RoPE on 64..127, the optional
Hadamard rotation, and the two whole-entry quantizations (FP8 with one fp32 scale, MXFP4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arithmetic import add, mul, pow2, sub
from .constants import HADAMARD_SCALE, HADAMARD_SPANS, INDEXER_HEAD_DIM, INDEXER_MXFP4_BLOCK, INDEXER_ROPE_START
from .formats import bf16, e2m1_bits, e4m3_bits, mxfp4_exponent, ue8m0_exponent, ue8m0_scale_byte
from .postprocess import apply_rope

F32 = np.float32


def rotated_entry(y: np.ndarray, cos_sin: np.ndarray) -> np.ndarray:
    """``z``: ``y[0:64]`` unchanged, then the RoPE pairs of ``y[64:128]`` (binary32, unrounded).

    ``y``: fp32 ``[n, 128]``; ``cos_sin``: fp32 ``[n, 64]`` (each entry's ``cos_sin_cache`` row).
    """
    rope = apply_rope(y, cos_sin, start=INDEXER_ROPE_START)
    return np.concatenate([y[..., :INDEXER_ROPE_START], rope], axis=-1)


def hadamard_rotate(z: np.ndarray) -> np.ndarray:
    """The seven butterfly stages ``S = 64, 32, ..., 1``, then ``mul(z[d], 0x3DB504F3)``.

    In a stage, every ``i`` with ``i mod 2S < S`` turns ``(z[i], z[i+S])`` into
    ``(add(z[i], z[i+S]), sub(z[i], z[i+S]))``. ``z``: fp32 ``[n, 128]``.
    """
    n = z.shape[0]
    for span in HADAMARD_SPANS:
        pairs = z.reshape(n, INDEXER_HEAD_DIM // (2 * span), 2, span)
        first, second = pairs[:, :, 0, :], pairs[:, :, 1, :]
        z = np.stack([add(first, second), sub(first, second)], axis=2).reshape(n, INDEXER_HEAD_DIM)
    return mul(z, HADAMARD_SCALE)


def quantized_values(y: np.ndarray, cos_sin: np.ndarray, hadamard: bool) -> np.ndarray:
    """``q = bf16(z)`` (fp32 ``[n, 128]``): RoPE, then the rotation when ``hadamard``."""
    z = rotated_entry(y, cos_sin)
    if hadamard:
        z = hadamard_rotate(z)
    return bf16(z)


@dataclass(frozen=True)
class IndexerFp8:
    """``indexer_fp8`` entries: one E4M3 block of 128 channels with a power-of-two fp32 scale."""

    codes: np.ndarray  # uint8 [n, 128]: E4M3 bytes of q * 2^-k
    scale: np.ndarray  # float32 [n]: 2^k


def quantize_fp8(q: np.ndarray) -> IndexerFp8:
    """``amax = max |q|``; ``k`` per SPEC §2 (``AMIN`` floor, 448); codes ``e4m3(q * 2^-k)``.

    The power-of-two scalings are exact (a subnormal product encodes to a signed zero either way,
    as in :func:`.postprocess.quantize_nope`).
    """
    k = ue8m0_exponent(np.max(np.abs(q), axis=-1))
    codes = e4m3_bits(np.ldexp(q, (-k[:, None]).astype(np.int32)))
    return IndexerFp8(codes=codes, scale=np.ldexp(F32(1.0), k.astype(np.int32)).astype(F32))


@dataclass(frozen=True)
class IndexerMxfp4:
    """``indexer_mxfp4`` entries: four E2M1 blocks of 32 channels with UE8M0 scales."""

    packed: np.ndarray  # uint8 [n, 64]: code[2j] | code[2j+1] << 4
    scale_bytes: np.ndarray  # uint8 [n, 4]: 127 + k of blocks 0..3


def quantize_mxfp4(q: np.ndarray) -> IndexerMxfp4:
    """Per block ``g``: ``k`` from ``max(amax, 6 * 2^-126) <= 6 * 2^k``; ``v = mul(q, 2^-k)``;
    ``code = e2m1(v)``; two codes per byte, the even channel in the low nibble."""
    n = q.shape[0]
    blocks = q.reshape(n, -1, INDEXER_MXFP4_BLOCK)
    k = mxfp4_exponent(np.max(np.abs(blocks), axis=-1))  # [n, 4], in [-126, 126]
    codes = e2m1_bits(mul(blocks, pow2(-k)[:, :, None])).reshape(n, INDEXER_HEAD_DIM)  # 2^-k: a normal binary32
    packed = codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))
    return IndexerMxfp4(packed=packed.astype(np.uint8), scale_bytes=ue8m0_scale_byte(k))
