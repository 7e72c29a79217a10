"""SPEC §2/§12: the number formats of the cache: bf16, E4M3, E2M1 and the UE8M0 block exponents.

bf16 values travel as ``uint16`` arrays of bf16 bit patterns and E4M3 values as ``uint8``
arrays of E4M3FN bytes, so NumPy alone can represent every stored byte.
"""

from __future__ import annotations

import numpy as np

from .arithmetic import div
from .constants import AMAX_FLOOR, E2M1_MAX, FP8_MAX, NVFP4_AMAX_FLOOR

F32 = np.float32


# ---- bf16 -----------------------------------------------------------------------------
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round finite binary32 values to bfloat16 (nearest, ties to even); ``uint16`` patterns.

    Adding ``0x7FFF`` plus the lowest kept bit to the 32-bit pattern and dropping the low
    16 bits rounds the magnitude to nearest-even; a carry moves into the exponent, as it
    should. The sign bit is untouched, so ``-0`` stays ``-0``.
    """
    bits = np.asarray(x, dtype=F32).view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    return ((bits + np.uint32(0x7FFF) + lowest_kept) >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """The binary32 value of bf16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(F32)


def bf16(x: np.ndarray) -> np.ndarray:
    """SPEC ``bf16(x)``: round to bfloat16 and use the result as the binary32 it represents."""
    return bf16_to_f32(bf16_bits(x))


# ---- rounding onto a small float grid ----------------------------------------------------
def nearest_grid_code(magnitude: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The code (index into the ascending magnitude grid ``table``) nearest to each binary32
    ``magnitude`` in ``[0, table[-1]]``, ties to the even code (mantissa LSB 0), as ``uint8``.

    Both distances are exact: the magnitude lies between two neighbouring grid values at most a
    factor 2 apart (or the lower one is 0), so each subtraction is exact (Sterbenz)."""
    upper = np.clip(np.searchsorted(table, magnitude, side="left"), 1, len(table) - 1)
    lower = upper - 1
    to_lower = magnitude - table[lower]
    to_upper = table[upper] - magnitude
    code = np.where(to_lower < to_upper, lower, upper)
    code = np.where(to_lower == to_upper, np.where(lower % 2 == 0, lower, upper), code)
    return code.astype(np.uint8)


def signed_grid_code(v: np.ndarray, table: np.ndarray, code_bits: int) -> np.ndarray:
    """The ``code_bits``-bit code of binary32 ``v`` on a sign-magnitude grid, as ``uint8``: the
    magnitude saturated at ``table[-1]`` and rounded by :func:`nearest_grid_code`, the sign of
    ``v`` (of ``-0`` too) in the top bit."""
    v = np.asarray(v, dtype=F32)
    magnitude = np.minimum(np.abs(v), table[-1])
    sign = ((v.view(np.uint32) >> np.uint32(31)) << np.uint32(code_bits - 1)).astype(np.uint8)
    return nearest_grid_code(magnitude, table) | sign


# ---- E4M3FN ---------------------------------------------------------------------------
def _e4m3_magnitudes() -> np.ndarray:
    """The 127 finite non-negative E4M3FN values, indexed by their 7-bit code (0x00..0x7E)."""
    codes = np.arange(0x7F)
    exponent = codes >> 3
    mantissa = codes & 7
    subnormal = mantissa * 2.0**-9  # exponent field 0: m/8 * 2^-6
    normal = (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7.0)
    return np.where(exponent == 0, subnormal, normal).astype(F32)


E4M3_MAGNITUDES = _e4m3_magnitudes()  # increasing: 0, 2^-9, ..., 448


def e4m3_bits(v: np.ndarray) -> np.ndarray:
    """SPEC ``e4m3(v)``: OCP E4M3FN byte of binary32 ``v``.

    Round to the nearest representable magnitude, ties to the even code (mantissa LSB 0),
    subnormals kept (smallest 2^-9), magnitudes beyond 448 saturate to 448 (code 0x7E; the
    NaN code 0x7F is never produced), and the sign is kept, so ``-0`` gives ``0x80``.
    """
    return signed_grid_code(v, E4M3_MAGNITUDES, 8)


def e4m3_to_f32(codes: np.ndarray) -> np.ndarray:
    """The binary32 value of E4M3FN bytes (finite codes only)."""
    codes = np.asarray(codes, dtype=np.uint8)
    magnitude = E4M3_MAGNITUDES[np.minimum(codes & 0x7F, 0x7E)]
    return np.where(codes & 0x80, -magnitude, magnitude).astype(F32)


# ---- UE8M0 block exponent -------------------------------------------------------------
def smallest_scale_exponent(a: np.ndarray, grid_max: float) -> np.ndarray:
    """The smallest integer ``k`` with ``a <= grid_max * 2^k``, for binary32 ``a > 0``, as ``int64``.

    With ``a = m * 2^e`` and ``grid_max = g * 2^s``, ``1/2 <= m, g < 1`` (``frexp``, exact):
    ``grid_max * 2^(e-s) = g * 2^e`` holds ``a`` iff ``m <= g``, and ``g * 2^(e-1) < 2^(e-1) <= a``
    never does; so ``k = e - s``, plus one when ``m > g`` (then ``g * 2^(e+1) >= 2^e > a``).
    The comparison is exact, with no rounded division or logarithm.
    """
    g, s = np.frexp(F32(grid_max))
    mantissa, exponent = np.frexp(a)
    return (exponent.astype(np.int64) - int(s)) + (mantissa > g)


def ue8m0_exponent(amax: np.ndarray) -> np.ndarray:
    """SPEC ``ue8m0``: the smallest integer ``k`` with ``max(amax, AMIN) <= 448 * 2^k``."""
    return smallest_scale_exponent(np.maximum(np.asarray(amax, dtype=F32), AMAX_FLOOR), FP8_MAX)


def ue8m0_scale_byte(k: np.ndarray) -> np.ndarray:
    """The stored UE8M0 byte ``127 + k``."""
    return (np.asarray(k, dtype=np.int64) + 127).astype(np.uint8)


# ---- E2M1 (SPEC §12, MXFP4) -------------------------------------------------------------
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)  # indexed by the 3-bit code
_MXFP4_AMAX_FLOOR = F32(E2M1_MAX * 2.0**-126)  # exact: 6 * 2^-126 is a normal binary32


def e2m1_bits(v: np.ndarray) -> np.ndarray:
    """SPEC §12 ``e2m1(v)``: the 4-bit E2M1 code (in a ``uint8``) of binary32 ``v``.

    Round to the nearest grid magnitude ``0, 0.5, 1, 1.5, 2, 3, 4, 6``, ties to the even code
    (mantissa bit 0), magnitudes beyond 6 saturate to 6 (code 7), and the sign bit is kept,
    so ``-0`` gives ``0x8``.
    """
    return signed_grid_code(v, E2M1_MAGNITUDES, 4)


def e2m1_to_f32(codes: np.ndarray) -> np.ndarray:
    """The binary32 value of 4-bit E2M1 codes (the low nibble of each ``uint8``)."""
    codes = np.asarray(codes, dtype=np.uint8)
    magnitude = E2M1_MAGNITUDES[codes & 0x7]
    return np.where(codes & 0x8, -magnitude, magnitude).astype(F32)


def mxfp4_exponent(amax: np.ndarray) -> np.ndarray:
    """SPEC §12: the smallest integer ``k`` with ``max(amax, 6 * 2^-126) <= 6 * 2^k``, in ``[-126, 126]``."""
    return smallest_scale_exponent(np.maximum(np.asarray(amax, dtype=F32), _MXFP4_AMAX_FLOOR), E2M1_MAX)


# ---- NVFP4 tile scale (SPEC §14.5) ------------------------------------------------------------
def nvfp4_scale_bits(amax: np.ndarray) -> np.ndarray:
    """SPEC §14.5: the E4M3 byte of a tile's scale ``sigma = e4m3(div(max(amax, 6 * 2^-9), 6))``.

    ``amax``: binary32 ``>= 0``. ``sigma`` is a positive E4M3 value (not a power of two), at
    least ``2^-9`` (byte ``0x01``, what an all-zero tile gets) and saturating to 448 (``0x7E``).
    """
    a = np.maximum(np.asarray(amax, dtype=F32), F32(NVFP4_AMAX_FLOOR))
    return e4m3_bits(div(a, F32(E2M1_MAX)))
