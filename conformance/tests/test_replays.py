"""Steps padded into buckets and replayed through one set of buffers per configuration
(``conformance --padded``, and ``--graph`` on a GPU), and the command line around them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsv4_compressor.conformance import cli
from dsv4_compressor.conformance.buckets import ArenaPlan, StaticKey, buckets_holding, pad_batch, padding_only, placement
from dsv4_compressor.conformance.graphs import group_steps, plan_groups, run_group
from dsv4_compressor.conformance.implementations import LoadedImplementation, load_implementation
from dsv4_compressor.conformance.scenarios import scenarios

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import example_kernels  # noqa: E402

CHOSEN = ("c4_decode_boundary", "c4_first_window", "verify_c4_group3", "c128_decode_boundary", "verify_c128_group2",
          "indexer_c4_mxfp4_hadamard")


def _cli(*args: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-m", "dsv4_compressor", "conformance", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_padding_and_buckets():
    batch = scenarios(["c4_decode_boundary"])[0].build().batch
    padded = pad_batch(batch, 64)
    assert padded.num_tokens == 64 and (padded.slot_mapping[6:] == -1).all() and (padded.kv_slot_mapping[6:] == -1).all()
    assert np.array_equal(padded.positions[:6], batch.positions) and padded.num_active == batch.num_active
    empty = padding_only(batch, 8)
    assert empty.num_tokens == 8 and empty.num_active == 0 and (empty.slot_mapping == -1).all()
    assert buckets_holding(6, (1, 8, 64, 512)) == (8, 64, 512) and buckets_holding(600, (8, 64)) == ()
    with pytest.raises(ValueError, match="bucket"):
        pad_batch(batch, 4)


def test_scenarios_of_one_configuration_share_an_arena():
    groups, too_large = plan_groups(scenarios(["c4_decode_boundary", "c4_first_window", "tiny_amax", "c4_layout_bf16"]),
                                    (8, 64))
    assert not too_large
    shared = next(g for g in groups if len(g.scenarios) == 3)
    assert {s.name for s in shared.scenarios} == {"c4_decode_boundary", "c4_first_window", "tiny_amax"}
    steps = [inputs for _, inputs, _ in group_steps(shared)]
    plan = ArenaPlan.of(steps)
    for inputs in steps:  # every step's allocation fits, its view where the arena's is
        at = placement(plan.state, inputs.state_cache)
        assert 0 <= at.start and at.stop <= plan.state.nbytes
        assert at.start + inputs.state_cache.offset == plan.state.offset
        assert StaticKey.of(inputs, "x") == shared.key


@pytest.mark.parametrize("impl", ("spec", "torch", "triton"))
def test_padded_replays_pass(impl):
    loaded = load_implementation(impl)
    groups, _ = plan_groups(scenarios(list(CHOSEN)), (8, 64))
    verdicts = [v for g in groups for v in run_group(loaded, group_steps(g), (8, 64), graph=False, device="cpu")]
    assert [v for v in verdicts if v.status != "pass"] == []
    names = {v.scenario for v in verdicts}
    assert set(CHOSEN) <= names and any(n.startswith("(padding only)") for n in names)
    assert {v.form for v in verdicts} == ({"two calls", "combined"} if impl == "torch" else {"two calls"})
    assert any(v.bucket == 64 and v.tokens <= 8 for v in verdicts)  # small steps in a large bucket


STATE_CHOSEN = ("state_c4_fp32_save_paged_two_call", "state_c4_fp32_compress_paged_two_call",
                "state_c4_fp32_save_ring_two_call", "state_c4_bf16_save_paged_two_call", "state_c4_bf16_ties_compress",
                "state_c4_verify_ring_step")


def test_steps_of_other_state_formats_get_graphs_of_their_own():
    """Scenarios that differ only in SPEC §13's options (the state's dtype, where ape is added, a
    ring) are configurations of their own: one captured graph bakes its options in."""
    groups, _ = plan_groups(scenarios(list(STATE_CHOSEN[:4])), (64,))
    assert len(groups) == 4
    assert {(g.key.state_dtype, g.key.ape_at, g.key.ring_capacity) for g in groups} == {
        ("float32", "save", None), ("float32", "compress", None), ("float32", "save", 12), ("uint16", "save", None)}


@pytest.mark.parametrize("impl", ("torch", "cutedsl_formats_stub"))
def test_padded_replays_of_state_formats_pass(impl, monkeypatch):
    """Replays of SPEC §13 scenarios in one run, every format beside the others, match the spec;
    the combined call gets the step's options where it takes them, else the step runs as two
    calls; a step-call scenario (SPEC §13.4) is left to the eager verdict."""
    loaded = load_implementation("torch")
    if impl != "torch":  # a combined call that takes the options: the two calls behind it
        target = loaded.target

        class Formatted:
            def __getattr__(self, name):
                return getattr(target, name)

            def save_and_compress_norm_rope_store(self, kv_score, ape, state_cache, *args, ape_at="save",
                                                  ring_capacity=None, **keywords):
                rest = dict(ape_at=ape_at, ring_capacity=ring_capacity)
                target.save_partial_states(kv_score, ape, args[1], args[2], state_cache, args[4], **rest)
                target.compress_norm_rope_store(state_cache, *args, **keywords, **rest,
                                                **({"ape": ape} if ape_at == "compress" else {}))

        loaded = LoadedImplementation("formatted", Formatted(), loaded.devices, loaded.capabilities)
    groups, _ = plan_groups(scenarios(list(STATE_CHOSEN)), (64,))
    verdicts = [v for g in groups for v in run_group(loaded, group_steps(g), (64,), graph=False, device="cpu")]
    assert [v for v in verdicts if v.status not in ("pass", "skip")] == []
    assert {v.scenario for v in verdicts if v.status == "skip"} == {"state_c4_verify_ring_step"}
    forms = {v.form for v in verdicts if v.status == "pass" and "ring" in v.scenario}
    assert forms == ({"two calls"} if impl == "torch" else {"two calls", "combined"})


def test_padded_replays_judge_a_tolerant_implementation_by_the_bounds():
    fast = load_implementation("fast-math")
    groups, _ = plan_groups(scenarios(["c4_ulp_ties"]), (8,))
    steps = group_steps(groups[0])
    exact = run_group(fast, steps, (8,), graph=False, device="cpu")
    tolerant = run_group(fast, steps, (8,), graph=False, device="cpu", tolerant=True)
    assert [v.status for v in exact] == ["pass", "fail", "pass", "fail"]  # padding only, the scenario; two forms
    assert all(v.status == "pass" for v in tolerant) and any("within" in k for v in tolerant for k in v.counts)


def test_work_for_the_padding_of_a_bucket_fails():
    writes = LoadedImplementation("writes_from_padding", example_kernels.WritesFromPadding(), ("cpu",))
    groups, _ = plan_groups(scenarios(["c4_decode_boundary"]), (8,))
    verdicts = run_group(writes, group_steps(groups[0]), (8,), graph=False, device="cpu")
    padding, scenario = verdicts[0], verdicts[1]
    assert padding.status == "fail" and "padding only" in padding.first_difference and "state" in padding.first_difference
    assert scenario.status == "fail" and "save_partial_states" in scenario.first_difference


def test_cli_padded_and_graph():
    ok = _cli("--impl", "spec", "--impl", "torch", "--padded", "--buckets", "8", "64", "--scenarios", "c4_decode_boundary",
              "verify_c128_group2")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "eager calls padded into buckets" in ok.stdout and "| combined " in ok.stdout and "PASSED" in ok.stdout
    numpy_graph = _cli("--impl", "spec", "--graph")
    assert numpy_graph.returncode == 2 and "--graph" in numpy_graph.stderr and "NumPy" in numpy_graph.stderr
    assert _cli("--impl", "spec", "--buckets", "8").returncode == 2  # buckets without a replay mode
    import torch

    if not torch.cuda.is_available():
        no_gpu = _cli("--impl", "torch", "--graph")
        assert no_gpu.returncode == 3, no_gpu.stdout + no_gpu.stderr
        assert "--graph needs a CUDA GPU" in no_gpu.stdout and "NOTHING CHECKED" in no_gpu.stdout


def test_cli_reports_batch_variance_by_verdict():
    args = ("--impl", "example_kernels:BatchVariant", "--scenarios", "c4_ulp_ties", "--no-errors")
    tolerant = _cli(*args, "--tolerant")
    assert tolerant.returncode == 0, tolerant.stdout + tolerant.stderr
    assert "| VARIANT " in tolerant.stdout and "NOT BATCH-INVARIANT: example_kernels:BatchVariant" in tolerant.stdout
    exact = _cli(*args)
    assert exact.returncode == 1 and "batch invariance c4_ulp_ties" in exact.stdout


def test_cli_sequences_by_name_and_in_json(tmp_path):
    out = tmp_path / "result.json"
    result = _cli("--impl", "spec", "--scenarios", "rollback_c4*", "--no-errors", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "multi-step sequences (3:" in result.stdout
    import json

    data = json.loads(out.read_text())
    assert {s["sequence"] for s in data["sequences"]} == {"rollback_c4_verify8", "rollback_c4_rerun_accepted",
                                                          "rollback_c4_fp8_per_tensor"}
    assert data["scenarios"] == [] and data["invariance"] == []


def test_cli_functions_have_one_job_each():
    tree = ast.parse(Path(cli.__file__).read_text())
    lengths = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert max(lengths.values()) <= 45, lengths


def test_pytest_face_has_sequences_and_batch_invariance(tmp_path):
    import os

    (tmp_path / "conftest.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))}

    def pytest_run(*extra: str) -> subprocess.CompletedProcess:
        args = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "dsv4_compressor.pytest_plugin",
                "--rootdir", str(tmp_path), "--dsv4-impl", "example_kernels:BatchVariant", "--dsv4-no-errors",
                "--dsv4-scenarios", "c4_ulp_ties,rollback_c4_verify8", *extra, str(tmp_path)]
        return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)

    tolerant = pytest_run("--dsv4-tolerant")
    assert tolerant.returncode == 0 and "2 passed, 1 xfailed" in tolerant.stdout, tolerant.stdout + tolerant.stderr
    assert "invariance::c4_ulp_ties" in tolerant.stdout and "sequences::rollback_c4_verify8" in tolerant.stdout
    exact = pytest_run("--dsv4-xfail", "c4_ulp_ties,rollback_c4_verify8")
    assert exact.returncode == 1 and "1 failed" in exact.stdout and "2 xfailed" in exact.stdout, exact.stdout
