"""Device helpers for SPEC §2's exact binary32 arithmetic, the pairwise trees and the formats.

Why every operation is an explicit round-to-nearest intrinsic: PTX lets ptxas contract an
unrounded ``mul.f32`` followed by ``add.f32`` into one FMA, which rounds once instead of
twice and changes bits. ``cute.math.add/mul/div/sqrt(..., rounding=NEAREST_EVEN)`` lower to
the NVVM intrinsics ``add.rn.f32`` / ``mul.rn.f32`` / ``div.rn.f32`` / ``sqrt.rn.f32``,
which are never contracted, never flushed (no ``.ftz``) and never approximated. Plain
``a * b + c`` on ``Float32`` would contract; plain ``/`` happens to give ``div.rn`` but we
say so explicitly. ``max``/``min``/``abs``/negation are exact and need no rounding mode.

Everything here is a plain Python function that emits IR while a ``@cute.kernel`` is
traced (no dynamic control flow inside), so it can take Python lists of ``Float32``
values: ``tree_sum`` over a list is a compile-time-shaped tree.

Trees (SPEC §2): ``tree(v)`` is the perfect binary tree in index order. Three pieces make
one tree over a long index range, as long as each level covers consecutive aligned index
ranges:

- :func:`tree_sum` over values a thread holds (consecutive indices);
- :func:`butterfly_sum` over lanes ``L, L^1, L^2, ...``: after the offset-``d`` step every
  lane holds the sum of its aligned group of ``2d`` lanes, left half first (``a + b`` and
  ``b + a`` round identically, signed zeros included), so lanes holding consecutive
  aligned chunks build exactly the upper levels of the tree;
- :func:`tree_sum` again over per-warp (or per-CTA) partials read from shared memory.
"""

from __future__ import annotations

import struct

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float32, Uint32

from ....spec.constants import AMAX_FLOOR, E2M1_MAX, EXP2S_COEFFS, FP8_MAX, LOG2E

RN = cute.math.RoundingMode.NEAREST_EVEN

LOG2E_F32 = float(LOG2E)  # L = 0x3FB8AA3B; exactly representable, so Float32(...) is exact
AMIN_F32 = float(AMAX_FLOOR)  # AMIN = 0x38D1B717
EXP2S_C = tuple(float(c) for c in EXP2S_COEFFS)  # C0..C6
INV_HEAD_DIM = 2.0**-9  # 1/512, exact
EXP2S_MAGIC = 12582912.0  # 1.5 * 2^23: adding it rounds |x| < 2^22 to an integer, ties to even
MXFP4_AMIN_F32 = E2M1_MAX * 2.0**-126  # SPEC §12's MXFP4 amax floor, 6 * 2^-126 (exact)


# ---- separately rounded binary32 operations ------------------------------------------
def fadd(a, b):
    """``add``: one correctly rounded binary32 addition (``add.rn.f32``)."""
    return cute.math.add(a, b, rounding=RN)


def fsub(a, b):
    """``sub``: ``a + (-b)``; negation is exact, so this is ``sub.rn.f32``."""
    return cute.math.add(a, -b, rounding=RN)


def fmul(a, b):
    """``mul``: one correctly rounded binary32 product (``mul.rn.f32``), never fused."""
    return cute.math.mul(a, b, rounding=RN)


def fdiv(a, b):
    """``div``: IEEE division (``div.rn.f32``), not ``div.full``/``div.approx``."""
    return cute.math.div(a, b, rounding=RN)


def fsqrt(a):
    """``sqrt``: IEEE square root (``sqrt.rn.f32``), not ``sqrt.approx``."""
    return cute.math.sqrt(a, rounding=RN)


def fmax(a, b):
    """``max`` of finite values (exact; ``max.f32``, subnormals kept)."""
    return cute.arch.fmax(a, b)


# ---- exp2s -----------------------------------------------------------------------------
def exp2s(x):
    """SPEC §2 ``exp2s(x)`` for binary32 ``x <= 0``.

    ``x < -126`` becomes ``-127``, whose ``2^j`` bit pattern below is ``+0``, so the result
    ``mul(p(0), +0)`` is ``+0`` as the spec says (``-inf`` takes the same way). Otherwise
    ``t = add(x, 1.5*2^23)`` rounds ``x`` to the integer ``j = rint(x)`` (ties to even: the
    magic constant is even and the sum's ulp is 1), ``j = t - 1.5*2^23`` and ``f = x - j``
    are exact, and ``2^j`` is built from ``t``'s low mantissa bits: ``(t_bits << 23)`` keeps
    ``j mod 512`` in the exponent field, ``+ 127 << 23`` biases it.
    """
    xs = Float32(cutlass.select_(x < Float32(-126.0), Float32(-127.0), x))
    t = fadd(xs, Float32(EXP2S_MAGIC))
    j = fadd(t, Float32(-EXP2S_MAGIC))
    two_j = ((t.bitcast(Uint32) << Uint32(23)) + Uint32(0x3F800000)).bitcast(Float32)
    f = fsub(xs, j)
    p = Float32(EXP2S_C[6])
    for k in (5, 4, 3, 2, 1, 0):
        p = fadd(fmul(p, f), Float32(EXP2S_C[k]))
    return fmul(p, two_j)


def softmax_weight(score, row_max):
    """``e = exp2s(mul(sub(s, M), L))`` of SPEC §5."""
    return weight_of_difference(fsub(score, row_max))


def weight_of_difference(d):
    """``exp2s(mul(d, L))``: SPEC §5's weight of a row whose ``sub(s, M)`` is ``d``."""
    return exp2s(fmul(d, Float32(LOG2E_F32)))


# ---- trees -----------------------------------------------------------------------------
def tree_sum(values, add=fadd):
    """SPEC ``tree`` over a Python list (length a power of two), in index order."""
    values = list(values)
    n = len(values)
    if n < 1 or n & (n - 1):
        raise ValueError(f"tree_sum: expected a power-of-two number of values, got {n}")
    while len(values) > 1:
        values = [add(values[2 * i], values[2 * i + 1]) for i in range(len(values) // 2)]
    return values[0]


def tree_max(values):
    """Maximum of a Python list (exact and order-free, any length)."""
    values = list(values)
    result = values[0]
    for v in values[1:]:
        result = fmax(result, v)
    return result


def butterfly_sum(value, first_offset: int, last_offset: int):
    """Upper tree levels across lanes: xor offsets ``first, 2*first, ..., last``.

    Every participating lane must execute it (shuffles are warp-synchronous).
    """
    offset = first_offset
    while offset <= last_offset:
        value = fadd(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
        offset *= 2
    return value


def butterfly_max(value, first_offset: int, last_offset: int):
    """Maximum across lanes ``L ^ offset`` for offsets ``first .. last`` (powers of two)."""
    offset = first_offset
    while offset <= last_offset:
        value = fmax(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
        offset *= 2
    return value


# ---- formats ---------------------------------------------------------------------------
def bf16_round(x):
    """SPEC ``bf16(x)``: round to bfloat16 (``cvt.rn.bf16.f32``), as the binary32 it represents."""
    return x.to(BFloat16).to(Float32)


def bf16_round_fragment(frag: cute.Tensor) -> cute.Tensor:
    """``bf16`` of every element of a register fragment (``cvt.rn.bf16x2.f32``), as fp32."""
    rounded = cute.make_rmem_tensor(frag.shape, BFloat16)
    rounded.store(frag.load().to(BFloat16))
    out = cute.make_rmem_tensor(frag.shape, Float32)
    out.store(rounded.load().to(Float32))
    return out


def to_bf16_fragment(frag: cute.Tensor) -> cute.Tensor:
    """A bf16 register fragment of an fp32 one (RNE)."""
    out = cute.make_rmem_tensor(frag.shape, BFloat16)
    out.store(frag.load().to(BFloat16))
    return out


def to_e4m3_fragment(frag: cute.Tensor) -> cute.Tensor:
    """SPEC ``e4m3``: ``cvt.rn.satfinite.e4m3x2.f32`` (RNE, subnormals kept, +-448 saturation,
    the sign of zero kept)."""
    out = cute.make_rmem_tensor(frag.shape, Float8E4M3FN)
    out.store(frag.load().to(Float8E4M3FN))
    return out


def _f32_exponent_and_mantissa_field(value: float) -> tuple[int, int]:
    """The unbiased exponent and the 23-bit mantissa field of a normal binary32 ``value``."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return (bits >> 23) - 127, bits & 0x7FFFFF


def pow2_scale_byte(amax, floor: float, format_max: float):
    """The byte ``127 + k``, ``k`` the smallest integer with ``max(amax, floor) <= format_max * 2^k``.

    ``a = max(amax, floor)`` is normal, ``a = 1.m * 2^(E-127)`` with biased exponent ``E``;
    with ``format_max = 1.f * 2^e``, ``format_max * 2^k`` holds ``a`` iff ``k + e > E - 127``
    or (``k + e == E - 127`` and ``1.m <= 1.f``, mantissa fields compared), so
    ``127 + k = E - e`` plus one when ``a``'s mantissa field exceeds ``format_max``'s. Exact
    integer work, no rounded division.
    """
    e, f = _f32_exponent_and_mantissa_field(format_max)
    a = fmax(amax, Float32(floor))
    bits = a.bitcast(Uint32)
    byte = (bits >> Uint32(23)) - Uint32(e)
    bump = Uint32(cutlass.select_((bits & Uint32(0x7FFFFF)) > Uint32(f), Uint32(1), Uint32(0)))
    return byte + bump


def ue8m0_scale_byte(amax):
    """SPEC §2's UE8M0 byte ``127 + k``, ``k`` the smallest integer with ``max(amax, AMIN) <=
    448 * 2^k`` (``448 = 1.75 * 2^8``: ``E - 8``, plus one above mantissa field ``0x600000``;
    SPEC's amax-floor rule: vLLM's scale-floor rule differs for tiny blocks)."""
    return pow2_scale_byte(amax, AMIN_F32, FP8_MAX)


def pow2_neg_k(scale_byte):
    """``2^-k`` for the scale byte ``127 + k`` (``1 <= 127 + k <= 253``): a normal binary32."""
    return ((Uint32(254) - scale_byte) << Uint32(23)).bitcast(Float32)


def e2m1_scale_byte(amax):
    """MXFP4 (SPEC §12) block byte ``127 + k``, ``k`` the smallest integer with
    ``max(amax, 6 * 2^-126) <= 6 * 2^k`` (``6 = 1.5 * 2^2``: ``E - 2``, plus one above
    mantissa field ``0x400000``). The floor keeps ``k >= -126`` and binary32's range
    ``k <= 126``, so ``2^-k`` is normal."""
    return pow2_scale_byte(amax, MXFP4_AMIN_F32, E2M1_MAX)


# (threshold, inclusive): |v| reaches the next E2M1 code above the threshold, or at it when
# the tie goes up to the even code; grid 0, 0.5, 1, 1.5, 2, 3, 4, 6 = codes 0..7
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_code(v):
    """SPEC §12 ``e2m1(v)``, a 4-bit code in a ``Uint32``: round ``|v|`` to the nearest of
    ``0, 0.5, 1, 1.5, 2, 3, 4, 6``, ties to the even code, saturating at 6, then the sign bit
    (``-0 -> 0x8``).

    The magnitude code is the number of midpoints ``|v|`` passes: exact comparisons with
    binary32 constants, ``>=`` where the tie rounds up to an even code (0.75 -> 1, 1.75 -> 2,
    3.5 -> 4), ``>`` where it rounds down (0.25 -> 0, 1.25 -> 1, 2.5 -> 2, 5 -> 4); anything
    above 5 is 6. Integer arithmetic rather than ``cvt.rn.satfinite.e2m1x2.f32``, which
    sm_90 does not have.
    """
    bits = v.bitcast(Uint32)
    magnitude = (bits & Uint32(0x7FFFFFFF)).bitcast(Float32)
    code = (bits >> Uint32(31)) << Uint32(3)
    for threshold, inclusive in _E2M1_STEPS:
        passed = magnitude >= Float32(threshold) if inclusive else magnitude > Float32(threshold)
        code = code + Uint32(cutlass.select_(passed, Uint32(1), Uint32(0)))
    return code


def abs_max_fragment(frag: cute.Tensor, n: int):
    """``max |v|`` over the first ``n`` elements of a register fragment."""
    return tree_max([cute.math.absf(frag[i]) for i in range(n)])


__all__ = [
    "RN", "LOG2E_F32", "AMIN_F32", "INV_HEAD_DIM", "FP8_MAX",
    "fadd", "fsub", "fmul", "fdiv", "fsqrt", "fmax",
    "exp2s", "softmax_weight", "weight_of_difference", "tree_sum", "tree_max", "butterfly_sum", "butterfly_max",
    "bf16_round", "bf16_round_fragment", "to_bf16_fragment", "to_e4m3_fragment",
    "pow2_scale_byte", "ue8m0_scale_byte", "pow2_neg_k", "e2m1_scale_byte", "e2m1_code", "abs_max_fragment",
]
