"""Tests of the suite itself: it passes conforming implementations, and it fails each
deliberately wrong one (a mutant of the independent torch implementation) with a precise
message naming the scenario's token, region and channel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dsv4_compressor.conformance.implementations import LoadedImplementation, load_implementation
from dsv4_compressor.conformance.runner import run_scenario
from dsv4_compressor.conformance.scenarios import CATALOGUE, scenarios
from dsv4_compressor.conformance.torch_reference import MUTANTS, TorchReference

SMALL = scenarios(size="small")


def _mutant(name: str) -> LoadedImplementation:
    return LoadedImplementation(name, getattr(MUTANTS, name), ("cpu",))


def test_catalogue_names_are_unique_and_documented():
    names = [s.name for s in CATALOGUE]
    assert len(names) == len(set(names))
    assert all(s.description and s.size in ("small", "medium", "large") for s in CATALOGUE)
    assert {s.size for s in CATALOGUE} == {"small", "medium", "large"}


@pytest.mark.parametrize("scenario", SMALL, ids=lambda s: s.name)
def test_the_independent_torch_implementation_passes_exact(scenario):
    verdict = run_scenario(load_implementation("torch"), scenario)
    assert verdict.status == "pass", verdict.first_difference


# mutant -> (scenario that exposes it, region of the first difference)
EXPOSED_BY = {
    "scale_floor": ("tiny_amax", {"NoPE", "scale"}),
    "rope_at_token_position": ("c128_decode_boundary", {"RoPE"}),
    "rope_rounded_to_bf16_first": ("c128_decode_boundary", {"RoPE"}),
    "skip_invalid_rows": ("signed_zeros", {"NoPE", "RoPE"}),
    "write_non_boundary": ("non_boundary_slots", {"untouched"}),
    "pad_byte_ff": ("c4_decode_boundary", {"pad"}),
}


@pytest.mark.parametrize("mutation", sorted(EXPOSED_BY))
def test_each_mutant_fails_with_a_precise_message(mutation):
    name, regions = EXPOSED_BY[mutation]
    verdict = run_scenario(_mutant(mutation), scenarios([name])[0])
    assert verdict.status == "fail"
    assert verdict.region in regions, verdict.first_difference
    message = verdict.first_difference
    assert "region" in message and "expected" in message and "got" in message
    if verdict.region != "untouched":
        assert "token" in message and ("channel" in message or "block" in message or verdict.region == "pad")


def test_scale_floor_is_named_as_the_known_deviation_in_the_tolerant_verdict():
    verdict = run_scenario(_mutant("scale_floor"), scenarios(["tiny_amax"])[0], tolerant=True)
    assert verdict.status == "fail"
    assert verdict.counts.get("scale floor (SPEC §11)", 0) > 0, verdict.counts


@pytest.mark.parametrize("mutation, scenario_name", [("approximate_exp2", "medium_c4_decode_2048"),
                                                     ("sequential_sum", "medium_c128_decode_512")])
def test_one_ulp_deviations_fail_exact_and_are_counted_by_the_tolerant_verdict(mutation, scenario_name):
    scenario = scenarios([scenario_name])[0]
    exact = run_scenario(_mutant(mutation), scenario)
    assert exact.status == "fail" and exact.region in ("NoPE", "RoPE", "scale")
    tolerant = run_scenario(_mutant(mutation), scenario, tolerant=True)
    assert tolerant.counts and all("within one" in kind for kind in tolerant.counts), tolerant.counts
    assert tolerant.status == "pass"


def test_every_mutation_is_exposed_by_some_scenario():
    covered = set(EXPOSED_BY) | {"approximate_exp2", "sequential_sum"}
    assert covered == set(vars(MUTANTS))


def test_loading_by_module_attribute_and_errors():
    loaded = load_implementation("dsv4_compressor.conformance.torch_reference:MUTANTS.pad_byte_ff")
    assert isinstance(loaded.target, TorchReference) and loaded.devices == ("cpu", "cuda")
    with pytest.raises(ValueError, match="--impl"):
        load_implementation("no_such_kernel")
    with pytest.raises(ValueError, match="missing"):
        load_implementation("dsv4_compressor.spec.constants:HEAD_DIM")
    with pytest.raises(ValueError, match="factory"):
        load_implementation("dsv4_compressor.spec.constants:ratio_config")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv4_compressor", "conformance", *args], capture_output=True, text=True, timeout=600)


def test_cli_passes_the_spec_and_fails_a_mutant():
    ok = _cli("--impl", "spec", "--scenarios", "c4_decode_boundary", "tiny_amax")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASSED" in ok.stdout and "positions int32" in ok.stdout
    bad = _cli("--impl", "dsv4_compressor.conformance.torch_reference:MUTANTS.scale_floor", "--scenarios", "tiny_amax", "--no-errors")
    assert bad.returncode == 1
    assert "tiny_amax" in bad.stdout and "FAIL" in bad.stdout and "region" in bad.stdout


def test_cli_skips_a_gpu_implementation_cleanly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    pytest.importorskip("cutlass")
    result = _cli("--impl", "cutedsl")  # SUPPORTED_DEVICES = ("cuda",)
    assert result.returncode == 3, result.stdout + result.stderr  # nothing checked is not a pass
    assert "SKIPPED" in result.stdout and "no CUDA GPU" in result.stdout and "NOTHING CHECKED" in result.stdout
    gpu_only = LoadedImplementation("gpu-only", TorchReference(), ("cuda",))
    verdict = run_scenario(gpu_only, SMALL[0])
    assert verdict.status == "skip" and "cuda" in verdict.first_difference
