"""On a GPU: the project's kernels replayed inside CUDA graphs captured per bucket, and a short
soak of both kernel families side by side with graph replays (skipped without a GPU)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

NAMES = ("c4_mixed_padding", "verify_c4_group8", "c128_decode_boundary", "verify_c128_group5", "c128_layout_bf16",
         "indexer_c4_mxfp4_hadamard", "indexer_c128_fp8")


@pytest.mark.parametrize("impl", ("triton", "cutedsl", "dsv4_compressor.impl.cutedsl.variants:nopdl"))
def test_graph_replays_match_the_spec(impl):
    from dsv4_compressor.conformance.graphs import group_steps, plan_groups, run_group
    from dsv4_compressor.conformance.implementations import load_implementation
    from dsv4_compressor.conformance.scenarios import scenarios

    loaded = load_implementation(impl)
    groups, _ = plan_groups(scenarios(list(NAMES)), (1, 8, 64, 512))
    verdicts = [v for g in groups for v in run_group(loaded, group_steps(g), (1, 8, 64, 512), graph=True, device="cuda")]
    bad = [(v.scenario, v.bucket, v.form, v.status, v.first_difference) for v in verdicts if v.status != "pass"]
    assert not bad, bad
    assert {v.bucket for v in verdicts} >= {8, 64, 512}


def test_a_short_soak_with_graphs():
    from dsv4_compressor.conformance.implementations import load_implementation
    from dsv4_compressor.conformance.soak import LAYERS, SIZES, Soak, SoakOptions

    implementations = [(load_implementation(name), "cuda") for name in ("triton", "cutedsl")]
    layers = tuple(layer for layer in LAYERS if layer.name in ("c4_flashmla", "c128_flashmla", "indexer_c4_mxfp4"))
    report = Soak(implementations, SoakOptions(seconds=45, size=SIZES["small"], layers=layers), log=print).run()
    assert report.differences == [] and not report.stopped, (report.differences, report.stopped)
    assert report.captures > 0 and report.calls.get("graph", 0) > 0 and report.spec_checks > 0
