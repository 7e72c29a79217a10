"""SPEC §2 arithmetic against independent references: float64, exact rationals, properties."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_compressor.spec.arithmetic import add, exp2s, pow2, tree
from dsv4_compressor.spec.constants import AMAX_FLOOR, EXP2S_COEFFS, LOG2E

F32 = np.float32


def _ulp_f32(v: np.ndarray) -> np.ndarray:
    """The binary32 ulp at |v| (float64), subnormal spacing 2^-149 at the bottom."""
    exponent = np.floor(np.log2(np.maximum(np.abs(v), 2.0**-149)))
    return np.ldexp(1.0, np.maximum(exponent, -126).astype(np.int64) - 23)


def test_constants_are_the_spec_bit_patterns():
    assert LOG2E.view(np.uint32) == 0x3FB8AA3B and abs(float(LOG2E) - 1 / math.log(2)) < 1e-7
    assert AMAX_FLOOR.view(np.uint32) == 0x38D1B717 and abs(float(AMAX_FLOOR) - 1e-4) < 1e-11
    assert [int(c.view(np.uint32)) for c in EXP2S_COEFFS] == [
        0x3F800000, 0x3F317218, 0x3E75FDED, 0x3D63576A, 0x3C1D96DE, 0x3AAFA2B5, 0x3920E999]


def test_exp2s_error_on_a_dense_sample_of_its_domain():
    """<= 1.23 ulp against float64 2^x over [-126, 0]: 4M uniformly spread plus 1M near integers."""
    rng = np.random.default_rng(0)
    x = np.concatenate([
        np.linspace(-126.0, 0.0, 4_000_001, dtype=np.float64).astype(F32),
        (rng.integers(-126, 1, 1_000_000) + rng.uniform(-1e-3, 1e-3, 1_000_000)).astype(F32),
        np.array([-126.0, -125.5, -0.5, -1.5, -2.5, np.nextafter(F32(0), F32(-1))], dtype=F32),
    ])
    x = x[(x <= 0) & (x >= -126)]
    got = exp2s(x).astype(np.float64)
    ideal = np.exp2(x.astype(np.float64))
    errors = np.abs(got - ideal) / _ulp_f32(ideal)
    assert errors.max() <= 1.23, f"max error {errors.max():.4f} ulp at x = {x[errors.argmax()]!r}"
    assert exp2s(np.array([0.0], F32))[0] == F32(1.0)
    assert exp2s(np.array([-0.0], F32))[0] == F32(1.0)


def test_exp2s_underflow_is_plus_zero_and_the_domain_stays_normal():
    below = np.array([np.nextafter(F32(-126), F32(-200)), -127.0, -1000.0, -np.inf], dtype=F32)
    assert np.all(exp2s(below).view(np.uint32) == 0)
    # On [-126, 0], j = -126 only with f >= 0 (p >= 1), so every result is a normal binary32:
    # SPEC §2's "the product may be subnormal" never happens inside the domain.
    x = np.linspace(-126.0, -124.0, 20_001, dtype=F32)
    assert np.all(exp2s(x) >= np.finfo(F32).tiny)


def test_exp2s_matches_the_written_out_recipe_in_exact_rationals():
    """Each step per SPEC §2, evaluated with Fractions and rounded to binary32 at every op."""

    def rnd(q: Fraction) -> Fraction:
        """q rounded to the nearest binary32, ties to even, subnormals kept."""
        if q == 0:
            return q
        exponent = max(math.floor(math.log2(abs(q))), -126)
        while Fraction(2) ** exponent > abs(q):  # log2 of a Fraction may be off by one
            exponent -= 1
        while Fraction(2) ** (exponent + 1) <= abs(q):
            exponent += 1
        quantum = Fraction(2) ** (max(exponent, -126) - 23)
        return round(q / quantum) * quantum  # round() of a Fraction is half-to-even

    rng = np.random.default_rng(1)
    for x in rng.uniform(-126, 0, 300).astype(F32):
        j = round(float(x))  # Python rounds half to even
        f = Fraction(float(x)) - j
        assert f == Fraction(float(F32(float(f))))  # exact
        p = Fraction(float(EXP2S_COEFFS[6]))
        for k in (5, 4, 3, 2, 1, 0):
            p = rnd(rnd(p * f) + Fraction(float(EXP2S_COEFFS[k])))
        expected = F32(float(p * Fraction(2) ** j))
        assert exp2s(np.array([x]))[0] == expected


def test_exp2s_rejects_positive_arguments():
    with pytest.raises(ValueError):
        exp2s(np.array([0.5], F32))


def test_pow2_is_the_exponent_field():
    j = np.arange(-126, 128)
    assert np.array_equal(pow2(j).astype(np.float64), np.ldexp(1.0, j))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.integers(0, 2**32 - 1))
def test_tree_is_the_recursive_halving(log_n, seed):
    """tree(v) = add(tree(first half), tree(second half)), checked against the recursion."""
    n = 1 << log_n
    v = np.random.default_rng(seed).standard_normal(n).astype(F32) * F32(10.0) ** np.random.default_rng(seed).integers(-8, 8, n).astype(F32)

    def recursive(a):
        if len(a) == 1:
            return a[0]
        return add(recursive(a[: len(a) // 2]), recursive(a[len(a) // 2:]))

    assert tree(v).view(np.uint32) == recursive(v).view(np.uint32)


def test_tree_order_matters_and_is_index_order():
    """A case where left-to-right and pairwise sums differ: the tree must be the pairwise one."""
    v = np.array([1.0, 2.0**-24, 2.0**-24, 2.0**-24], dtype=F32)
    sequential = F32(F32(F32(v[0] + v[1]) + v[2]) + v[3])
    assert tree(v) == F32(F32(v[0] + v[1]) + F32(v[2] + v[3]))
    assert tree(v) != sequential


def test_tree_rejects_non_power_of_two_lengths():
    with pytest.raises(ValueError):
        tree(np.ones(6, F32))


def test_binary32_ops_refuse_float64():
    with pytest.raises(TypeError):
        add(np.ones(2), np.ones(2, F32))
