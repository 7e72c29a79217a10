"""The soak (briefly, at its small size) and the sanitizer step's plan: the scheduler's steps are
what an engine makes, a short soak of the spec, the torch implementation and Triton (under the
interpreter) finds nothing and says what it compared, a deliberately wrong implementation is
found, and the sanitizers' workload covers every kernel path."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dsv4_compressor.conformance import sanitize
from dsv4_compressor.conformance.implementations import load_implementation
from dsv4_compressor.conformance.soak import LAYERS, SIZES, Soak, SoakOptions
from dsv4_compressor.conformance.soak_engine import ScheduleConfig, Scheduler


def test_the_scheduler_makes_engine_steps():
    config = ScheduleConfig(rows=5, max_len=90, max_prompt=40, max_decode=30, chunk=16, step_tokens=32)
    scheduler = Scheduler(config, np.random.default_rng(7))
    for _ in range(300):
        plan = scheduler.plan()
        assert 0 < sum(count for _, _, count in plan) <= config.step_tokens
        assert len({row for row, _, _ in plan}) == len(plan)
        for row, first, count in plan:
            request = scheduler.live[row]
            assert first == request.computed and first + count <= request.total_len <= config.max_len
        scheduler.finish(plan)
    assert scheduler.arrived > scheduler.finished > 10
    assert scheduler.verify_groups > 20 and scheduler.rerun_positions > 20


def _soak(names, layers, seconds: float, seed: int = 1) -> Soak:
    implementations = [(load_implementation(name), "cpu") for name in names]
    chosen = tuple(layer for layer in LAYERS if layer.name in layers)
    return Soak(implementations, SoakOptions(seconds=seconds, size=SIZES["small"], layers=chosen, seed=seed),
                log=lambda line: None)


def test_a_short_soak_finds_nothing_and_reports_what_it_compared():
    report = _soak(("spec", "torch", "triton"), ("c4_flashmla", "indexer_c128_mxfp4_hadamard"), 8).run()
    assert report.differences == [] and not report.stopped
    assert report.layer_steps >= 3 and report.entries > 0 and report.bytes_compared > 0
    assert report.spec_checks >= 1 and report.spec_bytes > 0 and report.invariance_checks >= 1
    assert set(report.calls) <= {"eager", "padded"} and sum(report.calls.values()) == 3 * report.layer_steps


def test_the_soak_finds_a_wrong_implementation():
    report = _soak(("torch", "dsv4_compressor.conformance.torch_reference:MUTANTS.pad_byte_ff"), ("c4_flashmla",), 3).run()
    assert report.differences and "region pad" in report.differences[0] and "against torch" in report.differences[0]


def test_the_soak_command():
    done = subprocess.run([sys.executable, "-m", "dsv4_compressor", "soak", "--minutes", "0.05", "--impl", "spec",
                           "--impl", "torch", "--layers", "c128_flashmla"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED" in done.stdout and "differences: 0" in done.stdout and "bytes with the spec" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "dsv4_compressor", "soak", "--minutes", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--minutes" in bad.stderr


def test_the_sanitizers_cover_every_kernel_path():
    from dsv4_compressor.impl.cutedsl.host.paths import C128_PATHS
    from dsv4_compressor.conformance.scenarios import scenarios
    from dsv4_compressor.conformance.sequences import sequences

    # loaded as the workload loads them (by module:attribute)
    variants = [load_implementation(name).target for name in sanitize.IMPLEMENTATIONS
                if name.startswith(sanitize.VARIANTS)]
    assert {v.c128_path for v in variants} >= set(C128_PATHS) - {"auto"}
    assert {v.pdl for v in variants} == {True, False} and any(v.policy.early_metadata for v in variants)
    assert {"cutedsl", "triton"} <= set(sanitize.IMPLEMENTATIONS)
    chosen = scenarios(list(sanitize.SCENARIOS))
    assert len(chosen) == len(sanitize.SCENARIOS) and len(sequences(list(sanitize.SEQUENCES))) == len(sanitize.SEQUENCES)
    layouts = {s.recipe.layout for s in chosen}
    assert {"flashmla_fp8", "indexer_fp8", "indexer_mxfp4"} <= layouts and {s.recipe.compress_ratio for s in chosen} == {4, 128}
    assert all(s.recipe.block_size == 8 for s in chosen if s.recipe.compress_ratio == 128)  # split_block8 takes them
    command = sanitize.sanitizer_command("compute-sanitizer", "racecheck", ("cutedsl",), (8, 64))
    assert command[:5] == ["compute-sanitizer", "--tool", "racecheck", "--report-api-errors", "no"]
    assert command[command.index("--workload") - 2:command.index("--workload")] == ["-m", "dsv4_compressor.conformance.sanitize"]


def test_the_sanitizers_workload_runs_on_the_cpu():
    assert sanitize.workload(("torch",), (8,), device="cpu") == 0


@pytest.mark.parametrize("summary, errors", [("========= ERROR SUMMARY: 0 errors", 0),
                                             ("========= ERROR SUMMARY: 3 errors", 3),
                                             ("========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)", 0),
                                             ("========= RACECHECK SUMMARY: 1 hazards displayed (1 errors, 0 warnings)", 1),
                                             ("", None)])
def test_a_tools_summary_and_the_workloads_verdict_are_read_from_its_output(tmp_path, summary, errors):
    """Each tool's error count is read from its own summary line (racecheck counts hazards), and
    a run passes only with no error and the workload's passing verdict."""
    script = f"print('WORKLOAD PASSED: 3 verdicts'); print({summary!r})"
    result = sanitize.run_tool([sys.executable, "-c", script], "racecheck", str(tmp_path))
    assert result.errors == errors and result.passed == (errors == 0)
    assert (tmp_path / "sanitize-racecheck.log").read_text().startswith("WORKLOAD PASSED")


def test_every_tools_command_ends_in_the_workload():
    """No tool option takes the next word as its value: the python executable follows the options."""
    for tool in sanitize.TOOLS:
        command = sanitize.sanitizer_command("compute-sanitizer", tool, ("cutedsl",), (8,))
        assert command[command.index(sys.executable) - 2:command.index(sys.executable)] == ["--print-limit", "20"]
