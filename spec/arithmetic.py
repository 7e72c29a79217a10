"""SPEC §2: binary32 arithmetic, the pairwise tree and exp2s.

NumPy's float32 ufuncs are exactly SPEC §2's operations: each ``add``, ``subtract``,
``multiply``, ``divide`` and ``sqrt`` is one correctly rounded IEEE 754 binary32 operation
with round-to-nearest-even, subnormals are kept, and nothing is fused. The thin wrappers
below only make sure no operand is silently promoted to float64.
"""

from __future__ import annotations

import numpy as np

from .constants import EXP2S_COEFFS

F32 = np.float32


def _f32(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != F32:
        raise TypeError(f"binary32 operation on {a.dtype} data; the spec converts inputs explicitly")
    return a


def add(a, b) -> np.ndarray:
    """One correctly rounded binary32 addition."""
    return np.add(_f32(a), _f32(b), dtype=F32)


def sub(a, b) -> np.ndarray:
    """One correctly rounded binary32 subtraction."""
    return np.subtract(_f32(a), _f32(b), dtype=F32)


def mul(a, b) -> np.ndarray:
    """One correctly rounded binary32 multiplication (never fused with a later add)."""
    return np.multiply(_f32(a), _f32(b), dtype=F32)


def div(a, b) -> np.ndarray:
    """One correctly rounded binary32 division."""
    return np.divide(_f32(a), _f32(b), dtype=F32)


def sqrt(a) -> np.ndarray:
    """One correctly rounded binary32 square root."""
    return np.sqrt(_f32(a), dtype=F32)


def tree(v: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sum over ``axis`` as a perfect binary tree in index order.

    ``tree(v) = add(tree(first half), tree(second half))``; pairing neighbours level by
    level, ``(v0+v1), (v2+v3), ...`` then ``((v0+v1)+(v2+v3)), ...``, builds the same tree.
    The length of ``axis`` must be a power of two.
    """
    v = np.moveaxis(_f32(v), axis, 0)
    n = v.shape[0]
    if n < 1 or n & (n - 1):
        raise ValueError(f"tree: the reduced length must be a power of two, got {n}")
    while v.shape[0] > 1:
        v = add(v[0::2], v[1::2])
    return v[0]


def pow2(j: np.ndarray) -> np.ndarray:
    """The binary32 ``2^j`` for integer ``-126 <= j <= 127``, built from its exponent field."""
    j = np.asarray(j, dtype=np.int64)
    if np.any((j < -126) | (j > 127)):
        raise ValueError("pow2: exponent outside the normal binary32 range [-126, 127]")
    return ((j + 127).astype(np.uint32) << np.uint32(23)).view(F32)


def exp2s(x: np.ndarray) -> np.ndarray:
    """SPEC §2 ``exp2s(x)`` for binary32 ``x <= 0``.

    1. ``x < -126`` gives ``+0``;
    2. ``j = rint(x)`` (ties to even, exact) and ``f = sub(x, j)`` (exact, ``|f| <= 1/2``);
    3. ``p = C6``, then ``p = add(mul(p, f), Ck)`` for ``k = 5 .. 0``;
    4. ``mul(p, 2^j)``, which may round to a subnormal (never flushed).
    """
    x = _f32(x)
    if np.any(x > 0):
        raise ValueError("exp2s is defined for x <= 0 only")
    underflow = x < F32(-126.0)
    x_in_range = np.where(underflow, F32(0.0), x)  # the +0 result is selected below
    j = np.rint(x_in_range)
    f = sub(x_in_range, j)
    p = np.full_like(f, EXP2S_COEFFS[6])
    for k in (5, 4, 3, 2, 1, 0):
        p = add(mul(p, f), EXP2S_COEFFS[k])
    result = mul(p, pow2(j.astype(np.int64)))
    return np.where(underflow, F32(0.0), result).astype(F32)
