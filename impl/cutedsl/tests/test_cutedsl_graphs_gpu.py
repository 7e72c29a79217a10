"""GPU checks of the CuTe DSL kernels inside CUDA graphs and programmatic dependent launch chains.

A graph captured once must write the spec's bytes for whatever metadata its tensors hold when
it is replayed; a kernel launched with PDL must read what the kernel before it wrote. Steps and
byte comparisons come from :mod:`cutedsl_steps` (conformance buffers, whole allocations).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import (INDEXER_C4_CASES, INDEXER_C128_CASES, Case, DeviceStep, assert_bytes, case_id,  # noqa: E402
                           spec_store)

from dsv4_compressor.conformance.runner import run_spec  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case, path", [
    (Case(4, 4, 2), "auto"), (Case(128, 8, 2), "fused_cluster"), (Case(128, 8, 2), "split_block8"),
    (Case(128, 4, 2, layout="bf16"), "split_generic"), (Case(128, 8, 2), "fused_handoff"),
    (Case(128, 8, 2), "fused_pipelined"), (INDEXER_C4_CASES[2], "auto"), (INDEXER_C128_CASES[0], "auto"),  # the indexer kernels (SPEC §12)
], ids=case_id)
def test_cuda_graph_replay_with_new_metadata(case, path):
    """Capture once, then change the metadata in place and replay: same bytes as eager, and the
    spec's bytes for the moved metadata."""
    from dsv4_compressor.impl import cutedsl

    step = DeviceStep(case.inputs())
    k_clean = step.k_owner.clone()
    workspace = torch.empty(step.batch.num_tokens, 512, device="cuda")
    kwargs = dict(**step.layout_kwargs(), c128_path=path, workspace=workspace)
    cutedsl.compress_norm_rope_store(**step.compress_args(), **kwargs)  # compiles: no compile during capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cutedsl.compress_norm_rope_store(**step.compress_args(), **kwargs)
    moved = step.move_metadata()
    assert not np.array_equal(moved.block_table, step.inputs.batch.block_table)  # the replay reads other blocks
    step.k_owner.copy_(k_clean)
    graph.replay()
    replayed = step.k_bytes()

    step.k_owner.copy_(k_clean)
    cutedsl.compress_norm_rope_store(**step.compress_args(), **kwargs)
    assert_bytes("graph replay vs eager", step.inputs, "k_cache", replayed, step.k_bytes())
    expected = spec_store(step.inputs, step.state_bytes(), moved)
    assert_bytes("graph replay vs spec", step.inputs, "k_cache", replayed, expected)


@pytest.mark.parametrize("case, path, how", [
    *[(Case(128, 8, 2), path, how) for path in ("fused_cluster", "split_block8", "fused_handoff", "fused_pipelined")
      for how in ("separate", "early_metadata", "combined")],
    (Case(4, 4, 2), "auto", "separate"), (Case(4, 4, 2), "auto", "combined"),
    (Case(128, 5, 64, layout="bf16"), "auto", "combined"),
    (INDEXER_C4_CASES[1], "auto", "combined"), (INDEXER_C128_CASES[1], "auto", "combined"),  # SPEC §12
], ids=case_id)
def test_pdl_chain_reads_what_the_previous_kernel_wrote(case, path, how):
    """``save_partial_states`` then ``compress_norm_rope_store`` (two calls, the two with
    ``c128_early_metadata``, or one ``save_and_compress_norm_rope_store``), every kernel
    launched with PDL and captured in one graph: each boundary token's window includes the
    row the save kernel has just written, so a compress kernel that read state before its
    ``griddepcontrol.wait`` returned would pool stale rows (early metadata reads only the
    metadata and block table before it). Every replay must give the spec's bytes, in the
    state cache and in the k_cache."""
    from dsv4_compressor.impl import cutedsl
    from dsv4_compressor.impl.cutedsl.host.policy import Policy

    inputs = case.inputs()
    expected = run_spec(inputs)
    assert not np.array_equal(expected.state_after_save, inputs.state_cache.owner)  # the save changes rows
    step = DeviceStep(inputs)
    state_clean, k_clean = step.state_owner.clone(), step.k_owner.clone()
    kwargs = dict(**step.layout_kwargs(), c128_path=path, workspace=torch.empty(step.batch.num_tokens, 512, device="cuda"),
                  pdl=True, policy=Policy(early_metadata=how == "early_metadata"))

    def run():
        if how == "combined":
            cutedsl.save_and_compress_norm_rope_store(step.kv_score, step.ape, **step.compress_args(), **kwargs)
            return
        cutedsl.save_partial_states(*step.save_args())
        cutedsl.compress_norm_rope_store(**step.compress_args(), **kwargs)

    run()  # compiles both kernels before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for replay in range(3):
        step.state_owner.copy_(state_clean)
        step.k_owner.copy_(k_clean)
        graph.replay()
        assert_bytes(f"replay {replay}: k_cache", inputs, "k_cache", step.k_bytes(), expected.k_cache_after_store)
        assert_bytes(f"replay {replay}: state", inputs, "state", step.state_bytes(), expected.state_after_save)
