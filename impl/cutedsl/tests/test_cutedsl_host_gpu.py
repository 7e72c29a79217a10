"""GPU checks of the CuTe DSL host path: a bound layer after its warm-up, and the torch custom
ops under ``torch.compile``, for the 512-wide and the indexer layouts: the spec's bytes
(:mod:`cutedsl_steps`, whole allocations)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import (C4_CASES, C128_CASES, INDEXER_C4_CASES, INDEXER_C128_CASES, METADATA, DeviceStep,  # noqa: E402
                           assert_bytes, case_id)

from dsv4_compressor.conformance.runner import run_spec  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", [C4_CASES[0], C128_CASES[0][0], C128_CASES[2][0], C128_CASES[5][0],
                                  INDEXER_C4_CASES[0], INDEXER_C4_CASES[2], INDEXER_C128_CASES[1]], ids=case_id)
def test_bound_layer_after_warm_up_matches_spec_and_compiles_nothing_more(case):
    """A layer warmed up for its token count writes the spec's bytes through the bound call,
    inside a CUDA graph captured right after the warm-up (no compile during capture); the
    indexer layouts (SPEC §12, with ``hadamard``) too."""
    from dsv4_compressor.impl import cutedsl
    from dsv4_compressor.impl.cutedsl.host import compile_cache

    inputs = case.inputs()
    expected = run_spec(inputs)
    step = DeviceStep(inputs)
    step.load_state(expected.state_after_save)  # the store alone, on the spec's post-save state
    layer = cutedsl.bind(step.state, step.k_cache, step.weight, step.cos_sin, block_size=step.batch.block_size,
                         compress_ratio=case.ratio, rms_norm_eps=inputs.rms_norm_eps, layout=inputs.layout,
                         fp8_scale=inputs.fp8_scale, hadamard=inputs.hadamard)
    layer.warm_up(token_counts=(step.batch.num_tokens,))
    compiled = len(compile_cache._CACHE)
    per_token = [step.meta[n] for n in METADATA]
    workspace = torch.empty(step.batch.num_tokens, 512, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.compress_norm_rope_store(*per_token, workspace=workspace)
    graph.replay()
    torch.cuda.synchronize()
    assert len(compile_cache._CACHE) == compiled
    assert_bytes(f"{case.name} k_cache", inputs, "k_cache", step.k_bytes(), expected.k_cache_after_store)


@pytest.mark.parametrize("case", [C4_CASES[0], C128_CASES[0][0], C128_CASES[3][0], INDEXER_C4_CASES[1],
                                  INDEXER_C128_CASES[1]], ids=case_id)
def test_compiled_custom_ops_match_spec(case):
    """torch.compile(fullgraph=True) over save_partial_states and compress_norm_rope_store as
    torch.ops.dsv4_compressor.cutedsl_* ops: the spec's bytes, in the state cache and the k_cache;
    the indexer layouts with ``hadamard`` too."""
    import dsv4_compressor.impl.cutedsl  # noqa: F401  (registers the ops)

    torch._dynamo.reset()
    inputs = case.inputs()
    expected = run_spec(inputs)
    step = DeviceStep(inputs)
    b = step.batch
    ops = torch.ops.dsv4_compressor

    @torch.compile(fullgraph=True)
    def run(kv, ape, state_cache, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots):
        ops.cutedsl_save_partial_states(kv, ape, positions, slots, state_cache, b.block_size)
        ops.cutedsl_compress_norm_rope_store(state_cache, token_req, positions, slots, table, b.block_size, weight,
                                             inputs.rms_norm_eps, cos_sin, k_cache, kv_slots, case.ratio,
                                             inputs.layout, inputs.fp8_scale, hadamard=inputs.hadamard)

    m = step.meta
    run(step.kv_score, step.ape, step.state, m["token_to_req_indices"], m["positions"], m["slot_mapping"],
        m["block_table"], step.weight, step.cos_sin, step.k_cache, m["kv_slot_mapping"])
    assert_bytes(f"{case.name} state", inputs, "state", step.state_bytes(), expected.state_after_save)
    assert_bytes(f"{case.name} k_cache", inputs, "k_cache", step.k_bytes(), expected.k_cache_after_store)
