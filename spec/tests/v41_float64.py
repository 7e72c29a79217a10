"""Hand formulations of SPEC §14 in float64, written from the text and not from ``spec/``'s code:
brute-force nearest-on-grid searches (E4M3, E2M1, bf16 by integer rounding), the records byte by
byte, softmax pooling and RMSNorm. The V4.1 tests hold the spec against these."""

from __future__ import annotations

import numpy as np

F32 = np.float32
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _e4m3_grid() -> np.ndarray:
    """The 127 finite non-negative E4M3FN magnitudes by code: subnormals m * 2^-9, normals (8 + m) * 2^(e - 10)."""
    values = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        values.append(m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10))
    return np.array(values)


E4M3_GRID = _e4m3_grid()


def sign_bit(values: np.ndarray) -> np.ndarray:
    """The sign bit of float64 values (of -0 too)."""
    return np.signbit(np.asarray(values, dtype=np.float64))


def nearest_code(magnitude: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the grid value nearest to each magnitude by exhaustive float64 distances, ties to
    the even index, magnitudes beyond the grid saturating to its last value."""
    magnitude = np.minimum(np.asarray(magnitude, dtype=np.float64), grid[-1])
    distance = np.abs(magnitude[..., None] - grid)
    best = distance.min(axis=-1, keepdims=True)
    tied = distance == best
    even = tied & (np.arange(grid.size) % 2 == 0)
    return np.where(even.any(axis=-1), np.argmax(even, axis=-1), np.argmax(tied, axis=-1))


def e4m3_byte(values: np.ndarray) -> np.ndarray:
    """OCP E4M3FN bytes of float64 values: nearest, ties to even, saturating, sign kept."""
    return (nearest_code(np.abs(values), E4M3_GRID) | (sign_bit(values) << 7)).astype(np.uint8)


def e2m1_code(values: np.ndarray) -> np.ndarray:
    """E2M1 codes of float64 values: nearest on 0, .5, 1, 1.5, 2, 3, 4, 6, ties to even, saturating, sign kept."""
    return (nearest_code(np.abs(values), E2M1_GRID) | (sign_bit(values) << 3)).astype(np.uint8)


def bf16_round(values: np.ndarray) -> np.ndarray:
    """float64 values rounded to bfloat16 (8 significant bits, ties to even) by integer rounding
    of the scaled significand; normal range only."""
    values = np.asarray(values, dtype=np.float64)
    mantissa, exponent = np.frexp(values)  # 0.5 <= |m| < 1
    return np.ldexp(np.round(mantissa * 256.0), exponent - 8)  # np.round: half to even


def bf16_ulp(values: np.ndarray) -> np.ndarray:
    """The spacing of bf16 values at each magnitude (normal range)."""
    return np.ldexp(1.0, np.frexp(np.maximum(np.abs(values), 2.0**-126))[1] - 8)


def bits_value(bits: np.ndarray) -> np.ndarray:
    """float64 value of bf16 bit patterns."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(F32).astype(np.float64)


def smallest_exponent(amax: np.ndarray, top: float, floor: float) -> np.ndarray:
    """The smallest integer ``k`` with ``max(amax, floor) <= top * 2^k``, by counting."""
    a = np.maximum(np.asarray(amax, dtype=np.float64), floor)
    k = np.full(a.shape, -160, dtype=np.int64)
    for _ in range(320):
        short = a > top * np.ldexp(1.0, k)
        if not short.any():
            break
        k = k + short
    return k


AMIN = float(np.array([0x38D1B717], np.uint32).view(F32)[0])


def mxfp8_record(z: np.ndarray) -> np.ndarray:
    """The 528 bytes of a ``v41_mxfp8`` record of ``z`` (float64 [512], bf16 values)."""
    blocks = z.reshape(16, 32)
    k = smallest_exponent(np.abs(blocks).max(axis=1), 448.0, AMIN)
    data = e4m3_byte(blocks * np.ldexp(1.0, -k)[:, None]).reshape(512)
    return np.concatenate([data, (127 + k).astype(np.uint8)])


def nvfp4_sigma(amax: np.ndarray) -> np.ndarray:
    """E4M3 byte of ``sigma``: the E4M3 value nearest to ``max(amax, 6 * 2^-9) / 6`` (float64)."""
    return e4m3_byte(np.maximum(amax, 6.0 * 2.0**-9) / 6.0)


def nvfp4_record(z: np.ndarray) -> np.ndarray:
    """The 288 bytes of a ``v41_nvfp4`` record of ``z`` (float64 [512], bf16 values)."""
    tiles = z.reshape(32, 16)
    scale_bytes = nvfp4_sigma(np.abs(tiles).max(axis=1))
    sigma = E4M3_GRID[scale_bytes]
    codes = e2m1_code(tiles / sigma[:, None]).reshape(512)
    return np.concatenate([(codes[0::2] | (codes[1::2] << 4)).astype(np.uint8), scale_bytes])


def flashmla_fp8_entry(z: np.ndarray, z_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(576-byte data record, 8-byte scale record) of ``z`` per SPEC §7: 7 NoPE blocks of 64, RoPE bf16 LE."""
    blocks = z[:448].reshape(7, 64)
    k = smallest_exponent(np.abs(blocks).max(axis=1), 448.0, AMIN)
    nope = e4m3_byte(blocks * np.ldexp(1.0, -k)[:, None]).reshape(448)
    rope = np.asarray(z_bits[448:], dtype="<u2").view(np.uint8)
    return np.concatenate([nope, rope]), np.concatenate([(127 + k).astype(np.uint8), [0]]).astype(np.uint8)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * w`` in float64, rows of ``x`` (float64 [n, H])."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_pairs(values: np.ndarray, cos_sin: np.ndarray) -> np.ndarray:
    """Interleaved pairs ``(a, b)`` of ``values`` (float64 [n, 64]) rotated by ``cos_sin`` rows."""
    a, b = values[:, 0::2], values[:, 1::2]
    co, si = cos_sin[:, :32].astype(np.float64), cos_sin[:, 32:].astype(np.float64)
    out = np.empty_like(values)
    out[:, 0::2] = a * co - b * si
    out[:, 1::2] = a * si + b * co
    return out


def softmax_then_sum(kv: np.ndarray, score: np.ndarray) -> np.ndarray:
    """``sum_i kv_i * softmax(score)_i`` over axis 1 (rows), float64."""
    w = np.exp(score - score.max(axis=1, keepdims=True))
    return (kv * (w / w.sum(axis=1, keepdims=True))).sum(axis=1)


def near_bf16_tie(values: np.ndarray, relative: float) -> np.ndarray:
    """Values within ``relative`` (of their magnitude) of a bf16 rounding tie."""
    ulp = bf16_ulp(values)
    offset = np.abs(values) / ulp
    return np.abs(offset - np.floor(offset) - 0.5) * ulp <= relative * np.abs(values)
