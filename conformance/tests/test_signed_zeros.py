"""The sign of zero: the exact verdict requires it, the tolerant verdict accepts either sign
wherever a zero is allowed (a reduction that starts its accumulator at +0 turns a sum of -0
into +0), and a nonzero code where only a zero is allowed still fails."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dsv4_compressor.conformance import bounds
from dsv4_compressor.conformance.fast_math import FastMathReference
from dsv4_compressor.conformance.implementations import LoadedImplementation, load_implementation
from dsv4_compressor.conformance.runner import run_scenario
from dsv4_compressor.conformance.scenarios import Scenario, scenarios
from dsv4_compressor.conformance.torch_reference import MUTANTS, TorchReference


def _signed_zeros_in(layout: str, **recipe) -> Scenario:
    """The catalogue's ``signed_zeros`` step stored into another layout."""
    base = scenarios(["signed_zeros"])[0]
    return replace(base, name=f"signed_zeros_{layout}", recipe=replace(base.recipe, layout=layout, **recipe))


SIGNED_ZEROS = [scenarios(["signed_zeros"])[0], _signed_zeros_in("bf16"), _signed_zeros_in("fp8_per_tensor", fp8_scale=0.02),
                *scenarios(["indexer_fp8_signed_zeros", "indexer_mxfp4_signed_zeros"])]
SIGN_OF_ZERO_MUTANTS = ("plus_zero_sum", "skip_invalid_rows")  # they change nothing but the sign of a zero sum


# (sign bit, smallest nonzero magnitude) of E4M3, bf16 and E2M1
CODES = [(0x80, 0x01), (0x8000, 0x0001), (0x8, 0x1)]


@pytest.mark.parametrize("sign_bit, tiny", CODES, ids=["e4m3", "bf16", "e2m1"])
def test_where_only_a_zero_is_allowed_either_sign_passes_and_nothing_else(sign_bit, tiny):
    written = np.array([0, sign_bit, tiny, sign_bit | tiny])  # +0, -0, the smallest nonzero of either sign
    for zero in (0, sign_bit):  # a bound of zero: both ends are the spec's zero
        ends = np.full(written.shape, zero)
        assert bounds.within(written, ends, ends, sign_bit).tolist() == [True, True, False, False]
    ends = np.full(written.shape, sign_bit | tiny)  # a nonzero value with a bound of zero: that code only
    assert bounds.within(written, ends, ends, sign_bit).tolist() == [False, False, False, True]


@pytest.mark.parametrize("mutation", SIGN_OF_ZERO_MUTANTS)
@pytest.mark.parametrize("scenario", SIGNED_ZEROS, ids=lambda s: s.name)
def test_a_flipped_sign_of_zero_fails_exact_and_passes_tolerant(mutation, scenario):
    impl = LoadedImplementation(mutation, getattr(MUTANTS, mutation), ("cpu",))
    exact = run_scenario(impl, scenario)
    assert exact.status == "fail", f"{mutation} writes the spec's bytes on {scenario.name}"
    tolerant = run_scenario(impl, scenario, tolerant=True)
    assert tolerant.status == "pass" and tolerant.counts, (tolerant.first_difference, tolerant.counts)


def test_the_fast_math_sum_starts_at_plus_zero():
    minus_zeros = torch.full((3, 8), -0.0)
    assert not torch.signbit(FastMathReference()._sum(minus_zeros, 1)).any()
    assert torch.signbit(TorchReference()._sum(minus_zeros, 1)).all()  # SPEC's tree keeps -0


@pytest.mark.parametrize("scenario", SIGNED_ZEROS, ids=lambda s: s.name)
def test_the_fast_math_reference_fails_exact_and_passes_tolerant(scenario):
    fast_math = load_implementation("fast-math")
    assert run_scenario(fast_math, scenario).status == "fail"  # its zero sums are +0 where SPEC's are -0
    verdict = run_scenario(fast_math, scenario, tolerant=True)
    assert verdict.status == "pass", (verdict.first_difference, verdict.counts)


class NonzeroWhereTheWeightIsZero(TorchReference):
    """Writes y = 1 where ``w[d]`` is a zero: the spec's y is a zero there, with a bound of zero."""

    def _normalize(self, x, rr, w):  # x float32 [n, H], rr [n], w [H]
        y = super()._normalize(x, rr, w)
        return torch.where(w[None, :] == 0, torch.ones_like(y), y)


@pytest.mark.parametrize("scenario", SIGNED_ZEROS, ids=lambda s: s.name)
def test_a_nonzero_code_where_only_a_zero_is_allowed_fails_tolerant(scenario):
    impl = LoadedImplementation("nonzero", NonzeroWhereTheWeightIsZero(), ("cpu",))
    verdict = run_scenario(impl, scenario, tolerant=True)
    assert verdict.status == "fail"
    beyond = {kind for kind in verdict.counts if kind in ("NoPE beyond bound", "values beyond bound")}
    assert beyond, verdict.counts
