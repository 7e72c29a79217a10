"""SPEC §2 arithmetic as Triton device functions: exp2s, bf16/E4M3 encoders, UE8M0, pairwise trees.

Why everything here is written with integer bit operations and explicit pairwise adds:

- **Encoders.** ``x.to(tl.bfloat16)`` / ``x.to(tl.float8e4nv)`` are correct when compiled but
  wrong under ``TRITON_INTERPRET=1`` (ties away from zero, dropped mantissa carries, truncated
  bf16; CUTEDSL.md §7). The integer recipes below are exact in both modes, so the CPU tests
  prove the same code the GPU runs.
- **exp2s.** SPEC §2's polynomial, not ``tl.exp2`` (``ex2.approx``). The kernel must be compiled
  with ``enable_fp_fusion=False`` so that every ``p * f + C`` stays a rounded ``mul.rn`` followed
  by an ``add.rn`` (no FMA contraction).
- **Trees.** ``tl.sum`` over an axis longer than 2 reduces in an order the compiler picks
  (in-thread, then shuffles, then shared memory), which is not SPEC §2's ``tree``. The trees
  here add explicit pairs, one tree level at a time (:func:`add_pairs`); an add of two values is
  commutative, so which lane or register holds which operand does not matter.
- No ``abs``/``max`` on floats where the result's bits matter: the block amax is an integer
  max over sign-cleared bit patterns (exact and immune to ``.ftz`` variants).
"""


import triton
import triton.language as tl

from ...spec.constants import AMAX_FLOOR, EXP2S_COEFFS, LOG2E

# SPEC §1/§2 constants, decoded once from their bit patterns by the spec (exactly representable
# as binary32, so Triton materializes them as the identical fp32 constants).
EXP2S_C0 = tl.constexpr(float(EXP2S_COEFFS[0]))
EXP2S_C1 = tl.constexpr(float(EXP2S_COEFFS[1]))
EXP2S_C2 = tl.constexpr(float(EXP2S_COEFFS[2]))
EXP2S_C3 = tl.constexpr(float(EXP2S_COEFFS[3]))
EXP2S_C4 = tl.constexpr(float(EXP2S_COEFFS[4]))
EXP2S_C5 = tl.constexpr(float(EXP2S_COEFFS[5]))
EXP2S_C6 = tl.constexpr(float(EXP2S_COEFFS[6]))
LOG2E_F32 = tl.constexpr(float(LOG2E))
AMAX_FLOOR_BITS = tl.constexpr(int(AMAX_FLOOR.view("uint32")))  # 0x38D1B717
ROUND_SHIFTER = tl.constexpr(12582912.0)  # 1.5 * 2^23: x + this rounds x to an integer, ties to even
ROUND_SHIFTER_BITS = tl.constexpr(0x4B400000)
F32_SIGN_MASK = tl.constexpr(0x7FFFFFFF)
E4M3_MAX_BITS = tl.constexpr(0x43E00000)  # 448.0
E4M3_MIN_NORMAL_BITS = tl.constexpr(0x3C800000)  # 2^-6
TWO_POW_23_BITS = tl.constexpr(0x4B000000)


@triton.jit
def exp2s(x):
    """SPEC §2 ``exp2s`` of fp32 ``x <= 0`` (any shape).

    ``j = rint(x)`` via the 1.5·2^23 shifter (round-half-even, exact for |x| <= 2^22),
    ``f = x - j`` (exact), Horner with separately rounded mul and add, times ``2^j`` built
    from its exponent field (``j >= -126``: normal), the product rounded (may be subnormal).
    ``x < -126`` gives ``+0``; such lanes use ``x = 0`` internally so nothing overflows.
    """
    underflow = x < -126.0
    xs = tl.where(underflow, 0.0, x)
    shifted = xs + ROUND_SHIFTER
    j = shifted - ROUND_SHIFTER
    f = xs - j
    p = f * EXP2S_C6 + EXP2S_C5
    p = p * f + EXP2S_C4
    p = p * f + EXP2S_C3
    p = p * f + EXP2S_C2
    p = p * f + EXP2S_C1
    p = p * f + EXP2S_C0
    # the shifter's low mantissa bits hold j: bits(shifted) = 0x4B400000 + j
    j_int = shifted.to(tl.int32, bitcast=True) - ROUND_SHIFTER_BITS
    two_pow_j = ((j_int + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(underflow, 0.0, p * two_pow_j)


@triton.jit
def bf16_rne_bits(x):
    """bfloat16 bit pattern (in the low 16 bits of a uint32) of fp32 ``x``, round-to-nearest-even.

    Adding 0x7FFF plus the lowest kept bit rounds the magnitude; a carry moves into the
    exponent. The sign bit is untouched (``-0 -> 0x8000``). Finite inputs.
    """
    bits = x.to(tl.uint32, bitcast=True)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


@triton.jit
def bf16_round(x):
    """SPEC ``bf16(x)``: the fp32 value of the bf16 nearest to ``x`` (ties to even)."""
    return (bf16_rne_bits(x) << 16).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_code(x):
    """SPEC ``e4m3(x)``: the E4M3FN byte (in a uint32) of fp32 ``x``.

    Saturate the magnitude to 448 first (so the NaN code 0x7F never appears), then round to
    nearest-even: normals (|x| >= 2^-6) round the fp32 mantissa at bit 20 and rebias the
    exponent 127 -> 7; subnormals are ``rint(|x| * 2^9)`` through a 2^23 shifter (an exact
    scaling, an RNE add, and the integer read back from the shifter's mantissa bits).
    The sign is kept, so ``-0 -> 0x80``.
    """
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    magnitude = tl.minimum(bits & F32_SIGN_MASK, E4M3_MAX_BITS)
    normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
    subnormal_shifted = magnitude.to(tl.float32, bitcast=True) * 512.0 + 8388608.0
    subnormal = subnormal_shifted.to(tl.uint32, bitcast=True) - TWO_POW_23_BITS
    return tl.where(magnitude >= E4M3_MIN_NORMAL_BITS, normal, subnormal) | sign


@triton.jit
def ue8m0_scale(amax_bits):
    """UE8M0 exponent of blocks from the int32 bit patterns of their (non-negative) amax.

    For ``a = max(amax, AMIN)`` with biased exponent ``E`` and mantissa bits ``m``,
    ``k = E - 135 + (m > 0x600000)`` is the smallest integer with ``a <= 448 * 2^k``
    (448 = 1.75 * 2^8, and 1.75 has mantissa bits 0x600000). Integer max on the bit patterns
    of non-negative floats is the float max. Returns ``(scale_byte, inv_scale)``: the stored
    byte ``127 + k`` (int32) and ``2^-k`` (fp32, exponent field ``127 - k``, always normal).
    """
    a = tl.maximum(amax_bits, AMAX_FLOOR_BITS)
    scale_byte = (a >> 23) - 8 + ((a & 0x7FFFFF) > 0x600000).to(tl.int32)
    inv_scale = ((254 - scale_byte) << 23).to(tl.float32, bitcast=True)
    return scale_byte, inv_scale


@triton.jit
def add_pairs(v, OUTER: tl.constexpr, INNER: tl.constexpr):
    """``v`` viewed as ``[OUTER, 2, INNER]``: returns ``v[:, 0, :] + v[:, 1, :]`` as ``[OUTER, INNER]``.

    One explicit fp32 add per output element through ``tl.split`` (the pair axis moved last).
    Not ``tl.sum`` over a size-2 axis: the interpreter's ``tl.sum`` is ``np.sum``, which starts
    from +0 and turns ``-0 + -0`` into ``+0``, while SPEC's tree (and the GPU's add) keep ``-0``.
    """
    pairs = tl.permute(tl.reshape(v, (OUTER, 2, INNER)), (0, 2, 1))
    first, second = tl.split(pairs)
    return first + second


@triton.jit
def tree_sum_of_squares(v, N: tl.constexpr, LOG2_N: tl.constexpr):
    """SPEC ``tree(v[0..N-1])`` of a 1-D tensor of squares (never ``-0``); returns a scalar.

    Level by level, neighbours ``(2i, 2i+1)`` are added by a reduction over a size-2 axis (one add,
    so its order is irrelevant); pairing neighbours level by level builds exactly the perfect
    binary tree in index order. ``tl.sum`` is safe here only because no operand is ``-0``
    (see :func:`add_pairs`); it lets Triton keep the vector spread over the threads (a
    ``tl.split`` chain makes Triton 3.6 gather all 512 values into every thread and spill).
    """
    for level in tl.static_range(LOG2_N):
        v = tl.sum(tl.reshape(v, (N >> (level + 1), 2)), axis=1)
    return tl.reshape(v, ())


E2M1_MAX_BITS = tl.constexpr(0x40C00000)  # 6.0
F32_ONE_BITS = tl.constexpr(0x3F800000)
MXFP4_FLOOR_BITS = tl.constexpr(0x01C00000)  # 6 * 2^-126 = 1.5 * 2^-124


@triton.jit
def e2m1_code(x):
    """SPEC §12 ``e2m1(x)``: the 4-bit E2M1 code (in a uint32) of fp32 ``x``.

    Saturate the magnitude to 6 first, then round to nearest-even: for ``|x| >= 1`` round the
    fp32 mantissa at bit 22 and rebias (``bits >> 22`` of 1.0 is 254, code 2); below 1 the
    codes 0, 1, 2 are ``rint(|x| * 2)`` through a 2^23 shifter (an exact doubling, an RNE add).
    Ties land on the even code either way. The sign is kept, so ``-0 -> 0x8``.
    """
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 28) & 0x8
    magnitude = tl.minimum(bits & F32_SIGN_MASK, E2M1_MAX_BITS)
    normal = ((magnitude + 0x1FFFFF + ((magnitude >> 22) & 1)) >> 22) - 252
    small_shifted = magnitude.to(tl.float32, bitcast=True) * 2.0 + 8388608.0
    small = small_shifted.to(tl.uint32, bitcast=True) - TWO_POW_23_BITS
    return tl.where(magnitude >= F32_ONE_BITS, normal, small) | sign


@triton.jit
def mxfp4_scale(amax_bits):
    """SPEC §12's MXFP4 block exponent from the int32 bit patterns of (non-negative) block amaxes.

    For ``a = max(amax, 6 * 2^-126)`` with biased exponent ``E`` and mantissa bits ``m``,
    ``k = E - 129 + (m > 0x400000)`` is the smallest integer with ``a <= 6 * 2^k``
    (6 = 1.5 * 2^2, and 1.5 has mantissa bits 0x400000). Returns ``(scale_byte, inv_scale)``:
    the stored byte ``127 + k`` (int32, in [1, 253]) and ``2^-k`` (fp32, always normal).
    """
    a = tl.maximum(amax_bits, MXFP4_FLOOR_BITS)
    scale_byte = (a >> 23) - 2 + ((a & 0x7FFFFF) > 0x400000).to(tl.int32)
    inv_scale = ((254 - scale_byte) << 23).to(tl.float32, bitcast=True)
    return scale_byte, inv_scale


@triton.jit
def load_values(ptr, offsets, IS_BF16: tl.constexpr):
    """fp32 values of fp32 elements, or of bf16 bit patterns read through an int16 view (exact)."""
    if IS_BF16:
        bits = tl.load(ptr + offsets).to(tl.uint16, bitcast=True).to(tl.uint32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offsets)
