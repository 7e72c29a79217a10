"""SPEC §6: RMSNorm of the compressed vector, NoPE quantization and RoPE of the last 64.

RMSNorm and RoPE serve both head widths (512, and 128 for the indexer of SPEC §12).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arithmetic import add, div, mul, sqrt, sub, tree
from .constants import NOPE_DIM, QUANT_BLOCK, ROPE_DIM
from .formats import bf16, bf16_bits, bf16_to_f32, e4m3_bits, ue8m0_exponent, ue8m0_scale_byte

F32 = np.float32
INV_HEAD_DIM = F32(2.0**-9)  # 1/512, exact
INV_HEAD_DIMS = {512: INV_HEAD_DIM, 128: F32(2.0**-7)}  # 1/H, exact


def norm_weight_f32(weight: np.ndarray) -> np.ndarray:
    """SPEC §3: the RMSNorm weight (fp32, or bf16 as uint16 patterns) as binary32, exactly."""
    return bf16_to_f32(weight) if weight.dtype == np.uint16 else weight


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: np.float32) -> np.ndarray:
    """``y[d] = mul(mul(x[d], rr), w[d])`` with ``rr = div(1, sqrt(add(mul(ss, 1/H), eps)))``.

    ``ss = tree(mul(x[d], x[d]))`` over the H channels (512, or 128 for the indexer) in channel
    order; ``1/H`` is ``2^-9`` or ``2^-7``. ``weight`` is the binary32 value of the (bf16 or
    fp32) norm weight.
    """
    ss = tree(mul(x, x), axis=-1)
    ms = mul(ss, INV_HEAD_DIMS[x.shape[-1]])
    rr = div(F32(1.0), sqrt(add(ms, F32(eps))))
    return mul(mul(x, rr[..., None]), weight)


@dataclass(frozen=True)
class QuantizedNope:
    """NoPE channels of each token quantized in 7 blocks of 64."""

    codes: np.ndarray  # uint8 [n, 448]: E4M3 bytes
    scale_bytes: np.ndarray  # uint8 [n, 7]: UE8M0 bytes 127 + k
    amax: np.ndarray  # float32 [n, 7]: block amax of the bf16-rounded values (for reports)


def e4m3_blocks(q: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of ``block`` consecutive channels of ``q`` (fp32 ``[..., m*block]``, bf16 values)
    with power-of-two scales: ``amax = max |q|``, ``k`` per UE8M0 (``AMIN`` floor, 448), bytes
    ``e4m3(q * 2^-k)``. Returns (codes uint8 ``[..., m*block]``, scale bytes ``127 + k`` uint8
    ``[..., m]``, amax fp32 ``[..., m]``).

    Scaling by a power of two is exact whenever the result is a normal binary32; when it is
    subnormal it is far below E4M3's smallest half-step 2^-10 and encodes to a signed zero
    either way.
    """
    blocks = q.reshape(*q.shape[:-1], -1, block)
    amax = np.max(np.abs(blocks), axis=-1)
    k = ue8m0_exponent(amax)
    codes = e4m3_bits(np.ldexp(blocks, (-k[..., None]).astype(np.int32))).reshape(q.shape)
    return codes, ue8m0_scale_byte(k), amax.astype(F32)


def quantize_nope(y: np.ndarray) -> QuantizedNope:
    """Per block ``g`` of 64: ``q = bf16(y)``, ``amax = max |q|``, ``k`` per UE8M0, ``e4m3(q * 2^-k)``."""
    codes, scale_bytes, amax = e4m3_blocks(bf16(y[..., :NOPE_DIM]), QUANT_BLOCK)
    return QuantizedNope(codes=codes, scale_bytes=scale_bytes, amax=amax)


def rope_row(positions: np.ndarray, compress_ratio: int) -> np.ndarray:
    """The ``cos_sin_cache`` row of an entry: ``cp = (p // r) * r``, the group's first position."""
    return (positions // compress_ratio) * compress_ratio


def apply_rope(y: np.ndarray, cos_sin: np.ndarray, start: int = NOPE_DIM) -> np.ndarray:
    """Rotate the pairs ``(a, b) = (y[start + 2j], y[start + 1 + 2j])`` of the unrounded ``y``.

    ``start`` is 448 for the 512-wide head and 64 for the indexer's (SPEC §12).

    ``o0 = sub(mul(a, co), mul(b, si))``, ``o1 = add(mul(a, si), mul(b, co))`` with
    ``co = cos_sin[j]`` and ``si = cos_sin[32 + j]``; returns the 64 rotated fp32 values in
    channel order (interleaved pairs).
    """
    half = ROPE_DIM // 2
    a, b = y[..., start:start + ROPE_DIM:2], y[..., start + 1:start + ROPE_DIM:2]
    co, si = cos_sin[..., :half], cos_sin[..., half:]
    o0 = sub(mul(a, co), mul(b, si))
    o1 = add(mul(a, si), mul(b, co))
    return np.stack([o0, o1], axis=-1).reshape(*y.shape[:-1], ROPE_DIM)


def rope_bf16_bits(y: np.ndarray, cos_sin: np.ndarray) -> np.ndarray:
    """The stored RoPE part: ``bf16`` bit patterns (uint16 ``[n, 64]``) of the rotated pairs."""
    return bf16_bits(apply_rope(y, cos_sin))
