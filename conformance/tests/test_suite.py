"""Tests of the suite itself: it passes conforming implementations, and it fails each
deliberately wrong one (a mutant of the independent torch implementation) with a precise
message naming the scenario's token, region and channel."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

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
    # SPEC §13's state formats
    "ape_added_twice": ("state_c4_fp32_compress_paged_two_call", {"state"}),
    "ape_at_token_position": ("state_c4_bf16_compress_paged_two_call", {"NoPE", "RoPE", "scale"}),
    "bf16_by_truncation": ("state_c4_bf16_ties_save", {"state"}),
    "ring_without_modulo": ("state_c4_ring_wraparound", {"NoPE", "RoPE", "scale"}),
    "chunk_rows_from_state": ("state_c4_fp32_save_paged_step", {"NoPE", "RoPE", "scale"}),
    "save_before_compress_on_ring": ("state_c4_chunk_longer_than_ring", {"NoPE", "RoPE"}),
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
    assert tolerant.counts and all("within" in kind for kind in tolerant.counts), tolerant.counts
    assert tolerant.status == "pass"


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


# ---- v1.1: capabilities, exit statuses, crash-proof error cases, the catalogue's reach ----
import os  # noqa: E402
from pathlib import Path  # noqa: E402

from dsv4_compressor.conformance.capabilities import Capabilities, Features  # noqa: E402
from dsv4_compressor.conformance.errors import CASES, names_argument, run_error_cases  # noqa: E402
from dsv4_compressor.conformance.torch_reference import MUTATIONS  # noqa: E402

HERE = Path(__file__).parent


def _cli_here(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-m", "dsv4_compressor", "conformance", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_exit_statuses_usage_errors_and_nothing_checked():
    unknown = _cli("--impl", "spec", "--scenarios", "no_such_scenario*")
    assert unknown.returncode == 2 and "no scenario matches" in unknown.stderr and "Traceback" not in unknown.stderr
    bad_impl = _cli("--impl", "no_such_module:attr")
    assert bad_impl.returncode == 2 and "--impl" in bad_impl.stderr and "Traceback" not in bad_impl.stderr
    import torch

    if not torch.cuda.is_available():
        gpu_only = _cli_here("--impl", "example_kernels:GpuOnly")
        assert gpu_only.returncode == 3 and "NOTHING CHECKED" in gpu_only.stdout, gpu_only.stdout


def test_a_scenario_name_is_found_without_size():
    result = _cli("--impl", "spec", "--scenarios", "c4_decode_boundary", "medium_c128*", "--no-errors", "--no-invariance",
                  "--size", "small")
    assert result.returncode == 0 and "1 check(s)" in result.stdout, result.stdout
    by_name = _cli("--impl", "spec", "--scenarios", "c4_eps_1", "--no-errors")
    assert by_name.returncode == 0 and "c4_eps_1 " in by_name.stdout


def test_capabilities_make_scenarios_unsupported_and_not_called():
    result = _cli_here("--impl", "example_kernels:VllmLike", "--scenarios", "c4_layout_bf16", "c128_bs16_b1",
                       "c4_padded_strides", "c4_decode_boundary", "c128_decode_boundary", "--no-errors")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "UNSUPPORTED by example_kernels:VllmLike (declared; not called): 3" in result.stdout
    for name in ("c4_layout_bf16", "c128_bs16_b1", "c4_padded_strides"):
        assert name in result.stdout.split("UNSUPPORTED")[-1]
    nothing = _cli_here("--impl", "example_kernels:VllmLike", "--scenarios", "c4_layout_bf16", "--no-errors")
    assert nothing.returncode == 3 and "NOTHING CHECKED" in nothing.stdout


def test_capability_checks():
    caps = Capabilities(devices=("cuda",), layouts=("flashmla_fp8",), block_sizes={128: (8,)}, state_stride_multiple=16)
    base = dict(head_width=512, compress_ratio=128, layout="flashmla_fp8", block_size=8, entries_per_page=2,
                state_strides=(8192, 1024), strided_inputs=False)
    assert caps.unsupported(Features(**base)) is None
    assert "block_size 16" in caps.unsupported(Features(**{**base, "block_size": 16}))
    assert "layout 'bf16'" in caps.unsupported(Features(**{**base, "layout": "bf16"}))
    assert "state strides" in caps.unsupported(Features(**{**base, "state_strides": (8196, 1028)}))
    assert Capabilities().unsupported(Features(**{**base, "head_width": 128, "layout": "indexer_fp8"}))


def test_a_named_variant_declares_what_its_family_runs():
    """A CuTe DSL variant (``impl.cutedsl.variants:nopdl``) passes every call to the family's
    operations, so the suite calls it on the indexer's head width too, and not on V4.1's
    operations, which a variant does not have."""
    pytest.importorskip("cutlass")
    family = load_implementation("cutedsl").capabilities
    for name in ("dsv4_compressor.impl.cutedsl.variants:nopdl", "dsv4_compressor.impl.cutedsl.variants:indexer_nopdl"):
        variant = load_implementation(name).capabilities
        assert variant.head_widths == family.head_widths == (512, 128)
        assert variant.v41 is None and family.v41 is not None


def test_names_argument_requires_the_name_first():
    assert names_argument(ValueError("k_cache: expected ..."), "k_cache")
    assert names_argument(ValueError("'k_cache' must be ..."), "k_cache")
    assert not names_argument(ValueError("k_cache_bytes: ..."), "k_cache")
    assert not names_argument(ValueError("bad call f(state_cache, k_cache)"), "k_cache")
    error = ValueError("Mismatched type")
    error.argument = "k_cache"
    assert names_argument(error, "k_cache")


def test_error_cases_survive_a_crash_and_catch_signature_messages_and_early_writes(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")])))
    chosen = [c for c in CASES if c.name in ("unknown layout", "positions int32", "rms_norm_eps 0", "k_cache int8")]
    crashing = run_error_cases(load_implementation("example_kernels:CrashesOnUnknownLayout"), chosen, "cpu")
    by_case = {v.case: v for v in crashing}
    assert by_case["unknown layout"].status == "fail" and "crashed" in by_case["unknown layout"].detail
    assert all(v.status == "pass" for v in crashing if v.case != "unknown layout"), crashing
    signature = run_error_cases(load_implementation("example_kernels:SignatureMessages"), chosen[:2], "cpu")
    assert all(v.status == "fail" and "does not lead" in v.detail for v in signature if v.case != "unknown layout")
    early = run_error_cases(load_implementation("example_kernels:WritesBeforeRaising"), chosen[:2], "cpu")
    assert any("wrote to" in v.detail for v in early), early


def test_the_builtins_pass_every_error_case():
    verdicts = run_error_cases(load_implementation("torch"), CASES, "cpu")
    assert [v for v in verdicts if v.status != "pass"] == []
    assert len(CASES) >= 50


# Where each mutant is expected to die first (a hint: the test falls back to the whole catalogue).
KILLER_HINTS = {
    "approximate_exp2": "c4_ulp_ties", "sequential_sum": "c4_ulp_ties", "interleaved_tree": "c4_ulp_ties",
    "fma_exp2": "c4_ulp_ties", "fma_rope": "c4_ulp_ties", "weight_first": "c4_ulp_ties",
    "rsqrt_rounded_once": "c128_ulp_ties", "eps_before_mean": "c4_eps_1", "exp2_cutoff_inclusive": "c4_exp2_cutoff",
    "exp2_no_cutoff": "c4_exp2_cutoff", "plus_zero_sum": "signed_zeros", "active_without_state_slot": "c128_activity_combinations",
    "padding_is_minus_one": "c4_negative_slots", "power_of_two_block_size": "c4_bs3_b5", "ape_by_slot": "c128_decode_boundary",
    "assume_contiguous_inputs": "c4_strided_inputs", "position_low_16_bits": "c4_positions_2e15_2e16",
    "mxfp4_nibble_order": "indexer_c4_mxfp4", "indexer_scale_from_unrounded": "indexer_fp8_ties",
    "hadamard_stages_reversed": "indexer_fp8_hadamard_cancel", "mxfp4_ties_away": "indexer_mxfp4_ties",
    **{m: name for m, (name, _) in EXPOSED_BY.items()},
}


def _killed(mutation: str, *, tolerant: bool = False) -> bool:
    """Whether some scenario of the default catalogue fails the mutant (an exception fails the
    run too), the scenario of :data:`KILLER_HINTS` tried first."""
    impl = _mutant(mutation)
    hint = [s for s in SMALL if s.name == KILLER_HINTS.get(mutation)]
    return any(run_scenario(impl, scenario, tolerant=tolerant).status in ("fail", "error")
               for scenario in hint + [s for s in SMALL if s not in hint])


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_default_run_kills_every_mutant(mutation):
    assert _killed(mutation), f"no scenario of the default catalogue fails the mutant {mutation}"


def _assert_fast_math_passes_tolerant(scenario) -> None:
    verdict = run_scenario(load_implementation("fast-math"), scenario, tolerant=True)
    assert verdict.status == "pass", (verdict.first_difference, verdict.counts)


@pytest.mark.parametrize("scenario", SMALL, ids=lambda s: s.name)
def test_the_fast_math_reference_passes_tolerant(scenario):
    _assert_fast_math_passes_tolerant(scenario)


def _one_ulp_up(function):
    def moved(x, *args, **kwargs):
        r = function(x, *args, **kwargs)
        return torch.nextafter(r, torch.full_like(r, math.inf))
    return moved


@pytest.fixture
def cuda_like_transcendentals(monkeypatch):
    """torch's log2, exp2 and rsqrt one ulp above the rounded result, as a device's math library
    may return them (CUDA documents up to 1 ulp for float64 log2 and exp2): e.g. log2(2^k) just
    above k, which moved a ceil(log2(amax / 448)) up by one where amax sat on 448·2^k."""
    for name in ("log2", "exp2", "rsqrt"):
        monkeypatch.setattr(torch, name, _one_ulp_up(getattr(torch, name)))


@pytest.mark.parametrize("name", ("indexer_fp8_ties", "indexer_mxfp4_ties", "c4_ulp_ties_flashmla", "medium_c128_decode_512"))
def test_the_references_do_not_depend_on_the_math_library(name, cuda_like_transcendentals):
    scenario = scenarios([name])[0]
    _assert_fast_math_passes_tolerant(scenario)
    if scenario.size == "small":
        verdict = run_scenario(load_implementation("torch"), scenario)
        assert verdict.status == "pass", verdict.first_difference


def test_the_fast_math_reference_is_not_exact():
    for name in ("c4_ulp_ties", "indexer_fp8_hadamard_cancel"):
        verdict = run_scenario(load_implementation("fast-math"), scenarios([name])[0])
        assert verdict.status == "fail", name  # so passing the tolerant verdict means something


# skip_invalid_rows is not among them: it changes nothing but the sign of a zero sum, which the
# tolerant verdict accepts (test_signed_zeros.py)
SEMANTIC = ("scale_floor", "rope_at_token_position", "rope_rounded_to_bf16_first", "write_non_boundary", "pad_byte_ff",
            "eps_before_mean", "active_without_state_slot", "padding_is_minus_one", "power_of_two_block_size",
            "ape_by_slot", "assume_contiguous_inputs", "position_low_16_bits", "mxfp4_nibble_order",
            "indexer_scale_from_unrounded", "mxfp4_ties_away", "ape_added_twice", "ape_at_token_position",
            "bf16_by_truncation", "ring_without_modulo", "chunk_rows_from_state", "save_before_compress_on_ring")


@pytest.mark.parametrize("mutation", SEMANTIC)
def test_semantic_mutants_fail_the_tolerant_verdict(mutation):
    assert _killed(mutation, tolerant=True), f"the tolerant verdict passes the semantic mutant {mutation}"


def test_strided_inputs_reach_the_implementation():
    seen = {}

    class Spy(TorchReference):
        def save_partial_states(self, kv_score, *args):
            seen["kv_score"] = (kv_score.is_contiguous(), kv_score.storage_offset())
            return super().save_partial_states(kv_score, *args)

    verdict = run_scenario(LoadedImplementation("spy", Spy(), ("cpu",)), scenarios(["c4_strided_inputs"])[0])
    assert verdict.status == "pass" and seen["kv_score"] == (False, 1)


def test_json_output(tmp_path):
    out = tmp_path / "result.json"
    result = _cli("--impl", "spec", "--scenarios", "c4_decode_boundary", "--no-errors", "--json", str(out))
    assert result.returncode == 0
    import json

    data = json.loads(out.read_text())
    assert data["exit_status"] == 0 and data["scenarios"][0]["scenario"] == "c4_decode_boundary"
    assert data["scenarios"][0]["status"] == "pass"


def test_pytest_face(tmp_path):
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "dsv4_compressor.pytest_plugin",
            "--rootdir", str(tmp_path), "--dsv4-impl", "dsv4_compressor.conformance.torch_reference:MUTANTS.scale_floor",
            "--dsv4-scenarios", "tiny_amax,c4_decode_boundary,signed_zeros", "--dsv4-xfail", "tiny_amax", str(tmp_path)]
    (tmp_path / "conftest.py").write_text("")
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert "1 failed, 4 passed" in result.stdout and "1 xfailed" in result.stdout, result.stdout + result.stderr
    assert "signed_zeros" in result.stdout and result.returncode == 1
    import torch

    if not torch.cuda.is_available():  # every conformance test skipped: nothing checked, not a pass
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))}
        args[args.index("--dsv4-impl") + 1] = "example_kernels:GpuOnly"
        skipped = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
        assert skipped.returncode == 3 and "nothing was checked" in skipped.stdout, skipped.stdout + skipped.stderr
