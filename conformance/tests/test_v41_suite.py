"""Tests of the suite's DeepSeek-V4.1 part (SPEC §14): it passes conforming implementations (the
spec, the spec behind torch tensors, the Triton kernels), fails every mutant in the default exact
run with a message naming the token, region and channel, names SPEC §14.10's departures, and
keeps its tolerant verdict calibrated (fast-math arithmetic passes, semantic changes fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dsv4_compressor.conformance.capabilities import V41Capabilities, Capabilities
from dsv4_compressor.conformance.errors import run_error_cases
from dsv4_compressor.conformance.implementations import LoadedImplementation, load_implementation
from dsv4_compressor.conformance.runner import run_scenario
from dsv4_compressor.conformance.scenarios import scenarios
from dsv4_compressor.conformance.v41_errors import V41_CASES
from dsv4_compressor.conformance.v41_runner import run_v41_scenario
from dsv4_compressor.conformance.v41_scenarios import V41_CATALOGUE, v41_scenarios
from dsv4_compressor.conformance.v41_variants import DEPARTURES, MUTATIONS, V41_MUTANTS, V41Variant
from dsv4_compressor.spec.entry_layout import V41_INDEX_KEY_LAYOUTS, V41_STORE_LAYOUTS

SMALL = v41_scenarios(size="small")
HERE = Path(__file__).parent
GPU = torch.cuda.is_available()


def _variant(name: str, changes: tuple[str, ...]) -> LoadedImplementation:
    return LoadedImplementation(name, V41Variant(changes), ("cpu",))


def _failures(impl: LoadedImplementation, chosen=SMALL, **kwargs) -> list:
    return [v for sc in chosen for v in [run_v41_scenario(impl, sc, **kwargs)] if v.status != "pass"]


# ---- the catalogue --------------------------------------------------------------------------------------
def test_catalogue_names_are_unique_documented_and_cover_section_14():
    names = [s.name for s in V41_CATALOGUE]
    assert len(names) == len(set(names)) and all(n.startswith("v41_") for n in names)
    assert {s.size for s in V41_CATALOGUE} == {"small", "medium", "large"}
    features = [s.build().features for s in SMALL]
    stores = {(f.compress_ratio, f.layout) for f in features if f.operation in ("compress_norm_rope_store",
                                                                                 "rope_quant_store")}
    assert stores == {(r, l) for r in (1, 2) for l in V41_STORE_LAYOUTS}
    keys = {(f.compress_ratio, f.layout) for f in features if f.operation == "index_key_store"}
    assert keys == {(r, l) for r in (1, 2) for l in V41_INDEX_KEY_LAYOUTS}
    states = {(f.state_dtype, f.ring_capacity, f.block_size) for f in features if f.state_dtype}
    assert {("fp32", 2, 2), ("bf16", 2, 2), ("fp32", 8, 8), ("bf16", 8, 8), ("fp32", None, 4),
            ("bf16", None, 2)} <= states
    assert {f.entries_per_page for f in features} >= {1, 2, 64}
    assert {d for f in features for d in f.input_dtypes} == {"fp32", "bf16"}
    assert {f.latent for f in features} == {"written", "input", "none"}
    assert any(f.separate_projections for f in features) and any(f.latent_row_pad for f in features)


def test_the_spec_and_the_spec_through_torch_pass_every_small_scenario_exactly():
    assert _failures(load_implementation("spec")) == []
    torch_adapter = load_implementation("dsv4_compressor.conformance.v41_torch_adapter:SpecThroughTorch")
    assert torch_adapter.capabilities.v41 is not None and not torch_adapter.capabilities.v4
    assert _failures(torch_adapter) == []


def test_a_variant_without_changes_writes_the_specs_bytes():
    """The mutants differ from the spec by their one change and nothing else."""
    assert _failures(_variant("unchanged", ())) == []


TRITON_SCENARIOS = ["v41_r1_mxfp8", "v41_r2_paged_nvfp4", "v41_r2_reference_ring_bf16", "v41_r2_vllm_ring_fp32",
                    "v41_r2_mixed_inputs", "v41_r1_zeros", "v41_r2_pooled_ties", "v41_r1_store_nvfp4",
                    "v41_r2_store_mxfp8", "v41_r2_index_key_indexer_mxfp4", "v41_r2_compress_norm", "v41_r2_no_latent"]


def test_the_triton_kernels_declare_v41_and_pass_exactly():
    """Under the interpreter a dozen small scenarios (every state option, ties, zeros, each
    operation); on a GPU every scenario of every size."""
    triton = load_implementation("triton")
    assert triton.capabilities.v41 == V41Capabilities()
    chosen = v41_scenarios(None, "all") if GPU else v41_scenarios(TRITON_SCENARIOS)
    assert len(chosen) >= len(TRITON_SCENARIOS)
    failures = _failures(triton, chosen)
    assert failures == [], [(v.scenario, v.status, v.first_difference) for v in failures]


# ---- mutants and departures -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DEPARTURES) + sorted(MUTATIONS))
def test_every_mutant_fails_the_default_run_with_a_precise_message(name):
    mutant = LoadedImplementation(name, getattr(V41_MUTANTS, name), ("cpu",))
    failures = _failures(mutant)
    assert failures, f"{name} passes every small scenario"
    assert all(v.status == "fail" for v in failures), [(v.scenario, v.first_difference) for v in failures]
    message = failures[0].first_difference
    assert "expected" in message and "got" in message and "region" in message and "differ:" in message
    if failures[0].region not in ("untouched", "latent", "state"):
        assert "token" in message and ("channel" in message or "block" in message)
    if name in ("unrounded_pooled", "unrounded_rope_records", "nope_rotation"):
        assert all(DEPARTURES[name] in v.departure and v.departure.startswith("explained by") for v in failures)
    elif name == "fast_math":
        assert all(v.departure.startswith("within the tolerant bounds") for v in failures)


def test_a_combination_of_departures_is_named_whole():
    """vLLM's three reproducible departures at once, on signed zeros into the 288 B record."""
    changes = ("unrounded_pooled", "unrounded_rope_records", "nope_rotation")
    verdict = run_v41_scenario(_variant("vllm-like", changes), v41_scenarios(["v41_r1_zeros"])[0])
    assert verdict.status == "fail"
    assert all(DEPARTURES[c] in verdict.departure for c in changes), verdict.departure
    mostly = run_v41_scenario(_variant("fast", ("unrounded_pooled", "fast_math")), v41_scenarios(["v41_r1_nvfp4"])[0])
    assert mostly.departure.startswith("mostly explained") and DEPARTURES["unrounded_pooled"] in mostly.departure


SEMANTIC = ("unrounded_pooled", "unrounded_rope_records", "rope_first_half", "rope_split_halves", "latent_not_written",
            "latent_for_non_boundary", "save_before_compress_on_ring", "ring_without_modulo", "nibbles_swapped",
            "scales_per_page")
UNDECIDABLE = ("nope_rotation", "e2m1_ties_away", "nvfp4_reciprocal")  # a zero's sign; ties under approximate division


def test_the_tolerant_verdict_passes_fast_math_and_fails_semantic_changes():
    assert _failures(LoadedImplementation("fast_math", V41_MUTANTS.fast_math, ("cpu",)), tolerant=True,
                     name_departures=False) == []
    for name in SEMANTIC:
        mutant = LoadedImplementation(name, getattr(V41_MUTANTS, name), ("cpu",))
        assert _failures(mutant, tolerant=True, name_departures=False), f"{name} passes the tolerant verdict"
    for name in UNDECIDABLE:  # documented: the tolerant verdict cannot tell these from allowed arithmetic
        mutant = LoadedImplementation(name, getattr(V41_MUTANTS, name), ("cpu",))
        assert _failures(mutant, tolerant=True, name_departures=False) == []


def test_a_left_out_rounding_fails_the_tolerant_verdict_where_its_bytes_are_within_the_bounds():
    """In v41_nvfp4 the unrounded RoPE output writes codes an approximate division could write too;
    SPEC §14.9 fails it all the same, by its name, where the departure reproduces the bytes."""
    mutant = LoadedImplementation("d2", V41_MUTANTS.unrounded_rope_records, ("cpu",))
    verdict = run_v41_scenario(mutant, v41_scenarios(["v41_r1_store_nvfp4"])[0], tolerant=True)
    assert verdict.status == "fail" and verdict.counts.get("left-out bf16 rounding (SPEC §14.9)", 0) > 0
    assert all("within" in kind for kind in verdict.counts if not kind.startswith("left-out"))
    assert DEPARTURES["unrounded_rope_records"] in verdict.departure


# ---- declarations, NotImplementedError, loading -------------------------------------------------------------
VLLM_LIKE = V41Capabilities(input_dtypes=("fp32",), state_dtypes=("fp32",), paged_state=False, ring_in_one_block=True,
                            tail_saves_only=True, separate_projections=False, latent_row_pad=False)


def test_a_declaration_makes_scenarios_unsupported_without_calling():
    declared = LoadedImplementation("declared", V41Variant(()), ("cpu",),
                                    Capabilities(devices=("cpu",), arrays="numpy", v4=False, v41=VLLM_LIKE))
    verdicts = [run_v41_scenario(declared, sc) for sc in SMALL]
    unsupported = {v.scenario for v in verdicts if v.status == "unsupported"}
    assert {v.status for v in verdicts} == {"pass", "unsupported"}
    assert {"v41_r2_paged_nvfp4", "v41_r2_bf16_inputs", "v41_r2_separate_projections", "v41_r1_compress_norm",
            "v41_r2_reference_ring_bf16"} <= unsupported
    assert "v41_r2_vllm_ring_fp32" not in unsupported and "v41_r2_reference_ring_fp32" not in unsupported
    assert run_scenario(declared, scenarios(["c4_decode_boundary"])[0]).status == "unsupported"  # V4.1 alone


def test_not_implemented_before_writing_is_unsupported_after_writing_a_failure():
    declines = load_implementation("v41_example_kernels:DeclinesLikeVllm")
    assert declines.capabilities.v41 is not None and not declines.capabilities.v4  # undeclared: every V4.1 call
    verdicts = {sc.name: run_v41_scenario(declines, sc) for sc in SMALL}
    assert verdicts["v41_r2_paged_nvfp4"].status == "unsupported"
    assert "NotImplementedError" in verdicts["v41_r2_paged_nvfp4"].first_difference
    assert verdicts["v41_r2_vllm_ring_fp32"].status == "pass" and verdicts["v41_r1_mxfp8"].status == "pass"
    assert {v.status for v in verdicts.values()} == {"pass", "unsupported"}
    late = load_implementation("v41_example_kernels:WritesThenDeclines")
    verdict = run_v41_scenario(late, v41_scenarios(["v41_r1_mxfp8"])[0])
    assert verdict.status == "fail" and "after writing" in verdict.first_difference


def test_loading_an_implementation_of_v41_alone_and_its_checks():
    loaded = load_implementation("dsv4_compressor.conformance.v41_variants:V41_MUTANTS.nibbles_swapped")
    assert loaded.capabilities.v41 is not None and not loaded.capabilities.v4
    with pytest.raises(ValueError, match="v41_index_key_store"):
        load_implementation("v41_example_kernels:MissingDeclaredOperation")


# ---- SPEC §14.8 ------------------------------------------------------------------------------------------
def test_error_cases_pass_for_the_spec_and_catch_a_write_before_the_error():
    verdicts = run_error_cases(load_implementation("spec"), V41_CASES)
    assert len(verdicts) == len(V41_CASES) >= 40
    assert all(v.status == "pass" for v in verdicts), [(v.case, v.detail) for v in verdicts if v.status != "pass"]
    late = replace(load_implementation("v41_example_kernels:ValidatesAfterWriting"), reference="")  # in this process
    results = {v.case: v for v in run_error_cases(late, V41_CASES)}
    assert results["v41 kv float64"].status == "fail" and "wrote to" in results["v41 kv float64"].detail
    assert results["v41 index key k_pre float32"].status == "pass"


def test_triton_error_cases():
    verdicts = run_error_cases(load_implementation("triton"), V41_CASES)
    assert all(v.status == "pass" for v in verdicts), [(v.case, v.detail) for v in verdicts if v.status != "pass"]


# ---- the command line ------------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-m", "dsv4_compressor", "conformance", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_cli_runs_v41_for_an_implementation_that_declares_it_alone_and_fails_a_mutant():
    ok = _cli("--impl", "v41_example_kernels:DeclinesLikeVllm", "--scenarios", "v41_r1_*", "v41_r2_vllm_ring_fp32")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "DeepSeek-V4.1" in ok.stdout and "v41_r2_vllm_ring_fp32" in ok.stdout and "SPEC §14.8" in ok.stdout
    assert "c4_decode_boundary" not in ok.stdout  # V4 not declared: not run
    bad = _cli("--impl", "dsv4_compressor.conformance.v41_variants:V41_MUTANTS.unrounded_rope_records",
               "--scenarios", "v41_r1_mxfp8", "--no-errors")
    assert bad.returncode == 1 and "FAIL" in bad.stdout
    assert DEPARTURES["unrounded_rope_records"] in bad.stdout


def test_cli_model_flag_selects_the_catalogue():
    v4_only = _cli("--impl", "spec", "--model", "v4", "--scenarios", "c4_decode_boundary", "v41_r1_mxfp8", "--no-errors",
                   "--no-invariance")
    assert v4_only.returncode == 0 and "v41_r1_mxfp8" not in v4_only.stdout and "c4_decode_boundary" in v4_only.stdout
    both = _cli("--impl", "spec", "--scenarios", "c4_decode_boundary", "v41_r1_mxfp8", "--no-errors", "--no-invariance")
    assert both.returncode == 0 and "v41_r1_mxfp8" in both.stdout and "c4_decode_boundary" in both.stdout
    nothing = _cli("--impl", "spec", "--model", "v4", "--scenarios", "v41_r1_mxfp8", "--no-errors")
    assert nothing.returncode == 2  # the pattern selects no V4 scenario


def test_pytest_items_hold_the_v41_scenarios_and_error_cases(tmp_path):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "dsv4_compressor.pytest_plugin", "--rootdir", str(tmp_path),
               "--dsv4-impl", "dsv4_compressor.conformance.v41_variants:V41_MUTANTS.nibbles_swapped", "-m", "spec_s14"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "v41_r1_nvfp4" in result.stdout and "v41_r1_mxfp8" not in result.stdout.split("short test summary")[-1]
    passed = subprocess.run(command[:-3] + ["spec", "-m", "spec_s14"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert passed.returncode == 0 and f"{len(SMALL) + len(V41_CASES)} passed" in passed.stdout, passed.stdout
