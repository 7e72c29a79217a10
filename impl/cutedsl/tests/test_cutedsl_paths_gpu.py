"""GPU checks of every CuTe DSL compress path and tuning knob: byte-identical to the NumPy specification.

Each case is a conformance step (:mod:`cutedsl_steps`): ``save_partial_states`` then
``compress_norm_rope_store`` on the spec's post-save state, with the C4 kernel or a forced C128
path (``fused_cluster``, ``fused_handoff``, ``split_block8``, ``split_generic``), the dispatch
policy's shapes and ``pdl``; the whole state and k_cache allocations, padding included, are
compared with the spec's. Also the compressed vector ``x`` itself (``cutedsl.compress``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import C4_CASES, C128_CASES, Case, DeviceStep, case_id, run_step  # noqa: E402

from dsv4_compressor import spec  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", C4_CASES, ids=case_id)
def test_c4_matches_spec(case):
    run_step(case)


@pytest.mark.parametrize("case, path", [(c, p) for c, paths in C128_CASES for p in paths], ids=case_id)
def test_c128_matches_spec(case, path):
    run_step(case, c128_path=path)


def test_c128_split_with_caller_workspace():
    case = C128_CASES[0][0]
    workspace = torch.empty(case.inputs().batch.num_tokens + 5, 512, dtype=torch.float32, device="cuda")
    run_step(case, c128_path="split_block8", workspace=workspace)
    run_step(case, c128_path="split_generic", workspace=workspace.view(-1))


@pytest.mark.parametrize("overrides, case, path", [
    (dict(c4_tokens_per_cta=2), C4_CASES[0], None),
    (dict(c4_tokens_per_cta=4), C4_CASES[3], None),
    (dict(c128_split_warps=16), C128_CASES[0][0], "split_block8"),
    (dict(c128_split_warps=4), Case(128, 16, 2), "split_block8"),
    (dict(c128_split_tile=32), C128_CASES[0][0], "split_block8"),
    (dict(c128_split_tile=32), C128_CASES[2][0], "split_generic"),
    (dict(c128_split_kv_in_smem=True), C128_CASES[0][0], "split_block8"),
    (dict(c128_split_kv_in_smem=True), C128_CASES[4][0], "split_generic"),
    (dict(c128_store_tokens_per_cta=4), C128_CASES[3][0], "split_block8"),
    (dict(save_tokens_per_cta=4), C4_CASES[2], None),  # the save kernel's token groups
    (dict(c128_cluster_kv_in_smem=False), C128_CASES[0][0], "fused_cluster"),
    (dict(c128_cluster_kv_in_smem=False), C128_CASES[2][0], "fused_cluster"),
    (dict(c128_cluster_warps=16, c128_cluster_kv_in_smem=False), C128_CASES[0][0], "fused_cluster"),
    (dict(c128_cluster_warps=4, c128_cluster_kv_in_smem=False), C128_CASES[4][0], "fused_cluster"),
    *[(dict(c128_cluster_tile=32), case, "fused_cluster") for case, _ in C128_CASES],  # 16-CTA clusters
    (dict(c128_cluster_tile=32, c128_cluster_warps=16), C128_CASES[0][0], "fused_cluster"),
    (dict(c128_cluster_tile=32, c128_cluster_warps=4), C128_CASES[3][0], "fused_cluster"),
    (dict(c128_cluster_tile=32, c128_cluster_kv_in_smem=False), C128_CASES[4][0], "fused_cluster"),
    (dict(c128_cluster_kv_after_max=False), C128_CASES[0][0], "fused_cluster"),  # kv loads with the scores
    (dict(c128_cluster_kv_after_max=False, c128_cluster_kv_in_smem=False), C128_CASES[4][0], "fused_cluster"),
    (dict(c128_cluster_kv_after_max=False, c128_cluster_tile=32), C128_CASES[2][0], "fused_cluster"),
    (dict(c128_split_kv_after_max=True), C128_CASES[3][0], "split_block8"),
    (dict(c128_split_kv_after_max=True, c128_split_kv_in_smem=True), C128_CASES[4][0], "split_generic"),
    (dict(pdl=False), C4_CASES[1], None),  # without programmatic dependent launch (the default uses it)
    *[(dict(pdl=False), C128_CASES[i][0], path) for i, path in
      ((0, "fused_cluster"), (1, "fused_handoff"), (3, "split_block8"), (4, "split_generic"))],
    *[(dict(c128_early_metadata=True), C128_CASES[i][0], path) for i, path in  # metadata before the PDL wait
      ((0, "fused_cluster"), (1, "fused_handoff"), (3, "split_block8"), (4, "split_generic"), (5, "auto"))],
    (dict(c128_handoff_kv_after_max=False), C128_CASES[5][0], "fused_handoff"),
    # the split kernels on runs of tokens found by a ballot (from T = 2 with split_runs=1)
    *[(dict(split_runs=1), C128_CASES[i][0], path) for i, path in ((0, "split_block8"), (2, "split_generic"),
                                                                  (3, "split_block8"), (4, "split_generic"))],
    (dict(split_runs=1, pdl=False), C128_CASES[4][0], "split_generic"),
    (dict(split_runs=1, c128_early_metadata=True), C128_CASES[3][0], "split_block8"),
], ids=lambda v: "-".join(f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else case_id(v))
def test_tuning_knobs_keep_the_bytes(overrides, case, path):
    run_step(case, **_choices(overrides), **({} if path is None else {"c128_path": path}))


def _choices(knobs: dict) -> dict:
    """``policy=`` and ``pdl=`` keywords from knob names: ``pdl``, ``c128_{split,cluster}_<PoolShape
    field>``, and the other fields of Policy or KernelShapes with an optional ``c128_`` prefix."""
    from dataclasses import fields, replace

    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY, PoolShape

    pool_fields = {f.name for f in fields(PoolShape)}
    pdl, shapes, flat = knobs.get("pdl", True), {}, {}
    for knob, value in knobs.items():
        if knob == "pdl":
            continue
        name = knob.removeprefix("c128_")
        family, _, rest = name.partition("_")
        if family in ("split", "cluster") and rest in pool_fields:
            shapes.setdefault(family, {})[rest] = value
        else:
            flat[name] = value
    for family, changes in shapes.items():
        flat[family] = replace(getattr(DEFAULT_POLICY.shapes, family), **changes)
    return {"policy": DEFAULT_POLICY.with_overrides(**flat), "pdl": pdl}


# ---- compress: x bits ------------------------------------------------------------------------------
def _spec_x(step: DeviceStep) -> np.ndarray:
    """SPEC §5's ``x`` of the step's tokens on its initial state (NaN rows for inactive tokens)."""
    b = step.batch
    _, state = step.inputs.state_cache.numpy_copy()
    return spec.compress(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                         b.kv_slot_mapping, compress_ratio=b.compress_ratio)


@pytest.mark.parametrize("case, path", [
    (Case(4, 4, 2), "auto"), (Case(4, 3, 2, values="spread_scores"), "auto"),
    (Case(128, 8, 2), "split_block8"), (Case(128, 5, 2, values="spread_scores"), "split_generic"),
    (Case(128, 4, 2, values="signed_zeros"), "auto"),
], ids=case_id)
def test_compress_x_bits(case, path):
    from dsv4_compressor.impl import cutedsl

    step = DeviceStep(case.inputs())
    expected = _spec_x(step)
    m = step.meta
    x = cutedsl.compress(step.state, m["token_to_req_indices"], m["positions"], m["slot_mapping"], m["block_table"],
                         step.batch.block_size, m["kv_slot_mapping"], compress_ratio=case.ratio,
                         c128_path=path).cpu().numpy()
    active = step.batch.active
    assert active.any()
    np.testing.assert_array_equal(x[active].view(np.uint32), expected[active].view(np.uint32))
    assert np.isnan(x[~active]).all()


def test_compress_per_row_lookups_at_block8_size():
    """The generic kernel's one-lookup-per-row code path on a Block8-sized cache."""
    from dsv4_compressor.impl.cutedsl import config
    from dsv4_compressor.impl.cutedsl.host import compile_cache

    step = DeviceStep(Case(128, 8, 2).inputs())
    expected = _spec_x(step)
    out = torch.full((step.batch.num_tokens, 512), float("nan"), device="cuda")
    kernel = compile_cache.compile_kernel("split_pool", config.C128PoolConfig(8, 1))
    m = step.meta
    kernel(step.state, m["token_to_req_indices"], m["positions"], m["slot_mapping"], m["block_table"],
           m["kv_slot_mapping"], out)
    active = step.batch.active
    assert active.any()
    np.testing.assert_array_equal(out.cpu().numpy()[active].view(np.uint32), expected[active].view(np.uint32))
