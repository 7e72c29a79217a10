"""GPU checks of the CuTe DSL kernels: byte-identical to the NumPy specification.

Every case builds a vLLM-style batch with :mod:`dsv4_compressor.spec.batch` (shuffled block
tables, padding tokens, non-boundary and dropped tokens, padded state strides, canary-filled
caches with padded pages), runs the spec on NumPy copies and the kernels on CUDA copies
of the same bytes, and compares the *whole memory span* of every buffer, padding included,
so a stray write shows as a changed canary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from dsv4_compressor import spec  # noqa: E402
from dsv4_compressor.spec import batch as B  # noqa: E402
from cuda_bytes import (assert_same_bytes, capture_after_warm_up, check_save_partial_states, cuda_args,  # noqa: E402
                        mixed_requests, replay_with_moved_metadata, span, span_bytes, storage, to_cuda)

pytestmark = pytest.mark.gpu

F32 = np.float32
K_DTYPE = {"flashmla_fp8": torch.uint8, "bf16": torch.bfloat16, "fp8_per_tensor": torch.float8_e4m3fn}  # k_cache per layout


# ---- cases --------------------------------------------------------------------------------------
def _values(profile: str, state: np.ndarray, weight: np.ndarray, rng) -> np.ndarray:
    """Edge-case value profiles (in place on the state; returns the weight)."""
    half = state.shape[-1] // 2
    if profile == "spread":  # most exp2s arguments below -126 (+0) or subnormal results
        state[..., half:] *= F32(30.0)
    elif profile == "signed_zeros":  # +0/-0 everywhere: the tree order decides the sign of zero
        state[...] = np.where(rng.random(state.shape) < 0.5, F32(-0.0), F32(0.0))
        state[::2, :, :half] = F32(-0.0)
    elif profile == "tiny_weight":  # block amax below the 1e-4 floor and 448*2^-14
        w = weight.astype(F32) if weight.dtype != np.uint16 else None
        if w is not None:
            for block, factor in ((1, 1e-2), (2, 1e-4), (5, 1e-9), (6, 5e-6)):
                w[block * 64:(block + 1) * 64] *= F32(factor)
            weight = w
    elif profile == "huge":  # large scale bytes, kv far from 1
        state[..., :half] *= F32(1e15)
        if weight.dtype != np.uint16:
            weight = weight.copy()
            weight[:64] *= F32(1e20)
            weight[-64:] *= F32(1e12)
    return weight


@dataclass(frozen=True)
class Case:
    ratio: int
    block_size: int
    entries: int  # B
    layout: str = "flashmla_fp8"
    bf16_weight: bool = True
    values: str = "normal"
    odd_cache_stride: bool = False  # bf16 / fp8_per_tensor: entry stride 513 (no vector stores)
    seed: int = 0

    @property
    def name(self) -> str:
        return (f"r{self.ratio}-bs{self.block_size}-B{self.entries}-{self.layout}-"
                f"{'wbf16' if self.bf16_weight else 'wf32'}-{self.values}{'-odd' if self.odd_cache_stride else ''}")


def build(case: Case):
    rng = np.random.default_rng(case.seed)
    batch = B.build_batch(mixed_requests(case.ratio, rng), compress_ratio=case.ratio, block_size=case.block_size,
                          entries_per_page=case.entries, rng=rng, num_padding=3, padding_at_end=False,
                          drop_entry_fraction=0.15)
    state = B.random_state_cache(batch.num_state_blocks, case.block_size, case.ratio, rng, row_pad=4, block_pad_rows=1)
    weight = _values(case.values, state, B.random_norm_weight(rng, bf16=case.bf16_weight), rng)
    if case.layout == "flashmla_fp8":
        k_cache = B.canary_k_cache(case.layout, batch.num_pages, case.entries, page_pad_bytes=32)
    else:
        dtype = np.uint16 if case.layout == "bf16" else np.uint8
        fill = B.CANARY_BYTE * (0x0101 if dtype == np.uint16 else 1)
        pad = (0, 0, 1) if case.odd_cache_stride else (0, 0, 0)
        k_cache = B.padded_view((batch.num_pages, case.entries, 512), dtype, pad, fill)
    cos_sin = B.rope_cos_sin_cache(int(batch.positions.max()) + 1)
    fp8_scale = 0.0371 if case.layout == "fp8_per_tensor" else None
    return batch, state, weight, cos_sin, k_cache, fp8_scale


def spec_run(case: Case, batch, state, weight, cos_sin, k_cache, fp8_scale) -> np.ndarray:
    """The spec's k_cache bytes (whole span) after compress_norm_rope_store."""
    k = k_cache.copy() if case.layout != "flashmla_fp8" else None
    if k is None:  # keep the padded page layout of the canary cache
        k = B.canary_k_cache(case.layout, batch.num_pages, case.entries, page_pad_bytes=32)
    else:
        k = B.padded_view(k_cache.shape, k_cache.dtype, (0, 0, 1) if case.odd_cache_stride else (0, 0, 0), 0)
        span(k)[...] = span(k_cache)
    spec.compress_norm_rope_store(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping,
                                  batch.block_table, batch.block_size, weight, 1e-6, cos_sin, k, batch.kv_slot_mapping,
                                  compress_ratio=batch.compress_ratio, layout=case.layout, fp8_scale=fp8_scale, debug=True)
    return span(k).copy()


C4_CASES = [
    Case(4, 4, 64),
    Case(4, 8, 1, bf16_weight=False, values="spread"),
    Case(4, 16, 2, layout="bf16", values="signed_zeros"),
    Case(4, 4, 2, layout="fp8_per_tensor", bf16_weight=False),
    Case(4, 3, 64, layout="bf16", bf16_weight=False, values="tiny_weight", odd_cache_stride=True),
    Case(4, 4, 1, layout="fp8_per_tensor", bf16_weight=False, values="huge", odd_cache_stride=True),
    Case(4, 1, 64, values="signed_zeros"),
]
C128_CASES = [
    (Case(128, 8, 64), ("fused_cluster", "fused_handoff", "split_block8", "split_generic")),
    (Case(128, 8, 1, bf16_weight=False, values="spread"), ("fused_cluster", "fused_handoff", "split_block8")),
    (Case(128, 4, 2, layout="bf16", values="signed_zeros"), ("fused_cluster", "fused_handoff", "split_generic")),
    (Case(128, 16, 2, layout="fp8_per_tensor", bf16_weight=False), ("fused_cluster", "fused_handoff", "split_block8")),
    (Case(128, 5, 64, bf16_weight=False, values="huge"), ("fused_cluster", "fused_handoff", "split_generic")),
    (Case(128, 8, 2, layout="bf16", bf16_weight=False, values="tiny_weight", odd_cache_stride=True), ("fused_cluster", "fused_handoff", "split_block8")),
    (Case(128, 8, 3, layout="fp8_per_tensor", values="normal", odd_cache_stride=True), ("fused_cluster", "fused_handoff")),
]


def _run_and_compare(case: Case, **kwargs):
    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    assert batch.num_active > 0
    expected = spec_run(case, batch, state, weight, cos_sin, k_cache, fp8_scale)
    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    state_before = span_bytes(args["state_cache"]).copy()
    from dsv4_compressor.impl import cutedsl

    cutedsl.compress_norm_rope_store(**args, compress_ratio=case.ratio, layout=case.layout, fp8_scale=fp8_scale, **kwargs)
    torch.cuda.synchronize()
    assert_same_bytes(f"{case.name} k_cache", span_bytes(args["k_cache"]), expected)
    assert_same_bytes(f"{case.name} state_cache", span_bytes(args["state_cache"]), state_before)
    return args


@pytest.mark.parametrize("case", C4_CASES, ids=lambda c: c.name)
def test_c4_matches_spec(case):
    _run_and_compare(case)


@pytest.mark.parametrize("case, path", [(c, p) for c, paths in C128_CASES for p in paths],
                         ids=lambda v: v.name if isinstance(v, Case) else v)
def test_c128_matches_spec(case, path):
    _run_and_compare(case, c128_path=path)


def test_c128_split_with_caller_workspace():
    case = C128_CASES[0][0]
    batch = build(case)[0]
    workspace = torch.empty(batch.num_tokens + 5, 512, dtype=torch.float32, device="cuda")
    _run_and_compare(case, c128_path="split_block8", workspace=workspace)
    _run_and_compare(case, c128_path="split_generic", workspace=workspace.view(-1))


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
      ((0, "fused_cluster"), (1, "fused_handoff"), (3, "split_block8"), (4, "split_generic"),
       (5, "auto"))],
    (dict(c128_handoff_kv_after_max=False), C128_CASES[5][0], "fused_handoff"),
], ids=lambda v: "-".join(f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else (v.name if isinstance(v, Case) else str(v)))
def test_tuning_knobs_keep_the_bytes(overrides, case, path):
    _run_and_compare(case, **_choices(overrides), **({} if path is None else {"c128_path": path}))


def _choices(knobs: dict) -> dict:
    """``policy=`` and ``pdl=`` keywords from knob names: ``pdl``, ``c128_{split,cluster}_<PoolShape
    field>``, and the other fields of Policy or KernelShapes with an optional ``c128_`` prefix."""
    from dataclasses import fields, replace

    from dsv4_compressor.impl.cutedsl.dispatch import DEFAULT_POLICY, PoolShape

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
@pytest.mark.parametrize("case, path", [
    (Case(4, 4, 2), "auto"), (Case(4, 3, 2, values="spread"), "auto"),
    (Case(128, 8, 2), "split_block8"), (Case(128, 5, 2, values="spread"), "split_generic"),
    (Case(128, 4, 2, values="signed_zeros"), "auto"),
], ids=lambda v: v.name if isinstance(v, Case) else v)
def test_compress_x_bits(case, path):
    from dsv4_compressor.impl import cutedsl

    batch, state, *_ = build(case)
    expected = spec.compress(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping, batch.block_table,
                             batch.block_size, batch.kv_slot_mapping, compress_ratio=case.ratio)
    x = cutedsl.compress(to_cuda(state), to_cuda(batch.token_to_req_indices), to_cuda(batch.positions),
                         to_cuda(batch.slot_mapping), to_cuda(batch.block_table), batch.block_size,
                         to_cuda(batch.kv_slot_mapping), compress_ratio=case.ratio, c128_path=path).cpu().numpy()
    active = batch.active
    assert active.any()
    assert_same_bytes(f"{case.name} x", x[active].view(np.uint32).ravel().view(np.uint8),
                      expected[active].view(np.uint32).ravel().view(np.uint8))
    assert np.isnan(x[~active]).all()


def test_compress_per_row_lookups_at_block8_size():
    """The generic kernel's one-lookup-per-row code path on a Block8-sized cache."""
    from dsv4_compressor.impl.cutedsl import compile_cache, config

    case = Case(128, 8, 2)
    batch, state, *_ = build(case)
    expected = spec.compress(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping, batch.block_table,
                             batch.block_size, batch.kv_slot_mapping, compress_ratio=128)
    out = torch.full((batch.num_tokens, 512), float("nan"), device="cuda")
    kernel = compile_cache.compile_c128_pool(config.C128PoolConfig(8, 1))
    kernel(to_cuda(state), to_cuda(batch.token_to_req_indices), to_cuda(batch.positions), to_cuda(batch.slot_mapping),
           to_cuda(batch.block_table), to_cuda(batch.kv_slot_mapping), out)
    active = batch.active
    np.testing.assert_array_equal(out.cpu().numpy()[active].view(np.uint32), expected[active].view(np.uint32))


# ---- save_partial_states ------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, block_size, misaligned", [(4, 4, False), (128, 8, False), (4, 3, True), (128, 5, True)])
def test_save_partial_states_matches_spec(ratio, block_size, misaligned):
    check_save_partial_states(ratio, block_size, misaligned, head_dim=512)


# ---- CUDA graphs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, path", [
    (Case(4, 4, 2), "auto"), (Case(128, 8, 2), "fused_cluster"), (Case(128, 8, 2), "split_block8"),
    (Case(128, 4, 2, layout="bf16"), "split_generic"),
    (Case(128, 8, 2), "fused_handoff"),
], ids=lambda v: v.name if isinstance(v, Case) else v)
def test_cuda_graph_replay_with_new_metadata(case, path):
    """Capture once, then change the metadata in place and replay: same bytes as eager."""
    from dsv4_compressor.impl import cutedsl

    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    k_clean = args["k_cache"].clone()
    workspace = torch.empty(batch.num_tokens, 512, device="cuda")
    kwargs = dict(compress_ratio=case.ratio, layout=case.layout, fp8_scale=fp8_scale, c128_path=path, workspace=workspace)
    graph = capture_after_warm_up(cutedsl.compress_norm_rope_store, args, kwargs)
    moved, moved_state = replay_with_moved_metadata(graph, args, batch, state, case.entries, k_clean)
    replayed = span_bytes(args["k_cache"]).copy()

    args["k_cache"].copy_(k_clean)
    cutedsl.compress_norm_rope_store(**args, **kwargs)
    torch.cuda.synchronize()
    eager = span_bytes(args["k_cache"]).copy()
    assert_same_bytes("graph replay vs eager", replayed, eager)
    expected = spec_run(case, moved, moved_state, weight, cos_sin, k_cache, fp8_scale)
    assert_same_bytes("graph replay vs spec", replayed, expected)


# ---- programmatic dependent launch ---------------------------------------------------------------
@pytest.mark.parametrize("case, path, how", [
    *[(Case(128, 8, 2), path, how) for path in ("fused_cluster", "split_block8", "fused_handoff")
      for how in ("separate", "early_metadata", "combined")],
    (Case(4, 4, 2), "auto", "separate"), (Case(4, 4, 2), "auto", "combined"),
    (Case(128, 5, 64, layout="bf16"), "auto", "combined"),
], ids=lambda v: v.name if isinstance(v, Case) else v)
def test_pdl_chain_reads_what_the_previous_kernel_wrote(monkeypatch, case, path, how):
    """``save_partial_states`` then ``compress_norm_rope_store`` (two calls, the two with
    ``c128_early_metadata``, or one ``save_and_compress_norm_rope_store``), every kernel
    launched with PDL and captured in one graph: each boundary token's window includes the
    row the save kernel has just written, so a compress kernel that read state before its
    ``griddepcontrol.wait`` returned would pool stale rows (early metadata reads only the
    metadata and block table before it). Every replay must give the spec's bytes."""
    from dsv4_compressor.impl import cutedsl
    from dsv4_compressor.impl.cutedsl.dispatch import Policy

    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    rng = np.random.default_rng(11)
    kv, ape = B.random_kv_score(batch.num_tokens, case.ratio, rng), B.random_ape(case.ratio, rng)
    saved = np.lib.stride_tricks.as_strided(span(state).copy().view(F32), state.shape, state.strides)
    spec.save_partial_states(kv, ape, batch.positions, batch.slot_mapping, saved, batch.block_size, debug=True)
    assert not np.array_equal(span(saved), span(state))  # the save changes rows the windows read
    expected = spec_run(case, batch, saved, weight, cos_sin, k_cache, fp8_scale)

    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    state_clean, k_clean = storage(args["state_cache"]).clone(), storage(args["k_cache"]).clone()
    kv_t, ape_t = to_cuda(kv), to_cuda(ape)
    kwargs = dict(compress_ratio=case.ratio, layout=case.layout, fp8_scale=fp8_scale, c128_path=path,
                  workspace=torch.empty(batch.num_tokens, 512, device="cuda"), pdl=True,
                  policy=Policy(early_metadata=how == "early_metadata"))

    def step():
        if how == "combined":
            cutedsl.save_and_compress_norm_rope_store(kv_t, ape_t, **args, **kwargs)
            return
        cutedsl.save_partial_states(kv_t, ape_t, args["positions"], args["slot_mapping"], args["state_cache"],
                                    batch.block_size)
        cutedsl.compress_norm_rope_store(**args, **kwargs)

    step()  # compiles both kernels before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(3):
        storage(args["state_cache"]).copy_(state_clean)
        storage(args["k_cache"]).copy_(k_clean)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(f"replay {replay}: k_cache", span_bytes(args["k_cache"]), expected)


def test_save_and_compress_writes_nothing_when_an_argument_is_bad():
    """A bad compress argument fails the combined call before its save kernel runs: the state
    cache and the k_cache keep every byte."""
    from dsv4_compressor.impl import cutedsl

    case = Case(128, 8, 2)
    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    rng = np.random.default_rng(12)
    kv_t = to_cuda(B.random_kv_score(batch.num_tokens, case.ratio, rng))
    ape_t = to_cuda(B.random_ape(case.ratio, rng))
    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    state_before, k_before = storage(args["state_cache"]).clone(), storage(args["k_cache"]).clone()
    for bad, needle in ((dict(layout="fp8"), "layout"), (dict(c128_path="cluster"), "c128_path")):
        with pytest.raises(ValueError, match=needle):
            cutedsl.save_and_compress_norm_rope_store(kv_t, ape_t, **args, **{"compress_ratio": 128, **bad})
    with pytest.raises(ValueError, match="ape"):
        cutedsl.save_and_compress_norm_rope_store(kv_t, ape_t[:, :256], **args, compress_ratio=128)
    torch.cuda.synchronize()
    assert torch.equal(storage(args["state_cache"]), state_before)
    assert torch.equal(storage(args["k_cache"]), k_before)


def test_handoff_counters_are_zero_between_calls():
    """The handoff kernel's last CTA of each token resets its counter: after calls of every
    size (some tokens inactive) the whole counter array of this stream is zero again."""
    from dsv4_compressor.impl.cutedsl import launch

    for case in (Case(128, 8, 64), Case(128, 5, 2, layout="bf16")):
        args = _run_and_compare(case, c128_path="fused_handoff")
        device = args["state_cache"].device
        entry = launch._COUNTERS[(device, launch._current_stream(device))]  # the array the calls used, as they left it
        assert entry.zeroed and int(torch.count_nonzero(entry.tensor)) == 0


def test_handoff_graphs_captured_before_any_eager_use_start_from_zero_counters():
    """Two graphs captured on a stream whose counter array has never been used outside capture
    (the array then holds whatever its memory held): each graph zero-fills it once, so either
    can be replayed first, whatever the array holds before the replay."""
    from dsv4_compressor.impl import cutedsl
    from dsv4_compressor.impl.cutedsl import launch

    case = Case(128, 8, 2)
    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    expected = spec_run(case, batch, state, weight, cos_sin, k_cache, fp8_scale)
    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    k_clean = storage(args["k_cache"]).clone()
    kwargs = dict(compress_ratio=case.ratio, layout=case.layout, fp8_scale=fp8_scale, c128_path="fused_handoff",
                  workspace=torch.empty(batch.num_tokens, 512, device="cuda"))
    cutedsl.compress_norm_rope_store(**args, **kwargs)  # compiles, on the default stream's own array
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    for calls, graph in zip((2, 1), graphs):
        with torch.cuda.graph(graph, stream=side):
            for _ in range(calls):
                cutedsl.compress_norm_rope_store(**args, **kwargs)
    counters = launch._COUNTERS[(args["state_cache"].device, side.cuda_stream)].tensor
    for garbage, graph in ((5, graphs[1]), (3, graphs[0]), (7, graphs[1])):
        counters.fill_(garbage)  # no fill outside capture has run: the graph must bring its own
        storage(args["k_cache"]).copy_(k_clean)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(f"graph of {2 if graph is graphs[0] else 1} call(s)", span_bytes(args["k_cache"]), expected)
        assert int(torch.count_nonzero(counters)) == 0


@pytest.mark.parametrize("chunk", [3, 32])
@pytest.mark.parametrize("case", [C128_CASES[0][0], C128_CASES[4][0], C128_CASES[5][0]], ids=lambda c: c.name)
def test_handoff_chunks_of_tokens(monkeypatch, case, chunk):
    """Several tokens per CTA (a ballot over the chunk, then its active tokens in order),
    padding and inactive tokens among them: the same bytes as the spec, and every counter
    zero afterwards."""
    from dsv4_compressor.impl.cutedsl import api, dispatch, launch

    monkeypatch.setattr(dispatch, "handoff_chunk", lambda num_tokens, sm_count, policy: chunk)
    api._PLANS.clear()  # plans are keyed by the policy, not by this function
    try:
        args = _run_and_compare(case, c128_path="fused_handoff")
    finally:
        api._PLANS.clear()
    device = args["state_cache"].device
    entry = launch._COUNTERS[(device, launch._current_stream(device))]
    assert int(torch.count_nonzero(entry.tensor)) == 0


# ---- host path: bound layers, warm-up, torch custom ops -----------------------------------------
@pytest.mark.parametrize("case", [C4_CASES[0], C128_CASES[0][0], C128_CASES[2][0], C128_CASES[5][0]],
                         ids=lambda c: c.name)
def test_bound_layer_after_warm_up_matches_spec_and_compiles_nothing_more(case):
    """A layer warmed up for its token count writes the spec's bytes through the bound call,
    inside a CUDA graph captured right after the warm-up (no compile during capture)."""
    from dsv4_compressor.impl import cutedsl
    from dsv4_compressor.impl.cutedsl import compile_cache

    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    expected = spec_run(case, batch, state, weight, cos_sin, k_cache, fp8_scale)
    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    layer = cutedsl.bind(args["state_cache"], args["k_cache"], args["rms_norm_weight"], args["cos_sin_cache"],
                         block_size=batch.block_size, compress_ratio=case.ratio, rms_norm_eps=1e-6,
                         layout=case.layout, fp8_scale=fp8_scale)
    layer.warm_up(token_counts=(batch.num_tokens,))
    compiled = len(compile_cache._CACHE)
    per_token = [args[n] for n in ("token_to_req_indices", "positions", "slot_mapping", "block_table",
                                   "kv_slot_mapping")]
    workspace = torch.empty(batch.num_tokens, 512, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.compress_norm_rope_store(*per_token, workspace=workspace)
    graph.replay()
    torch.cuda.synchronize()
    assert len(compile_cache._CACHE) == compiled
    assert_same_bytes(f"{case.name} k_cache", span_bytes(args["k_cache"]), expected)


@pytest.mark.parametrize("case", [C4_CASES[0], C128_CASES[0][0], C128_CASES[3][0]], ids=lambda c: c.name)
def test_compiled_custom_ops_match_spec(case):
    """torch.compile(fullgraph=True) over save_partial_states and compress_norm_rope_store as
    torch.ops.dsv4_compressor.cutedsl_* ops: the spec's bytes."""
    import dsv4_compressor.impl.cutedsl  # noqa: F401  (registers the ops)

    torch._dynamo.reset()
    batch, state, weight, cos_sin, k_cache, fp8_scale = build(case)
    rng = np.random.default_rng(5)
    kv, ape = B.random_kv_score(batch.num_tokens, case.ratio, rng), B.random_ape(case.ratio, rng)
    saved = np.lib.stride_tricks.as_strided(span(state).copy().view(F32), state.shape, state.strides)
    spec.save_partial_states(kv, ape, batch.positions, batch.slot_mapping, saved, batch.block_size, debug=True)
    expected = spec_run(case, batch, saved, weight, cos_sin, k_cache, fp8_scale)
    args = cuda_args(batch, state, weight, cos_sin, k_cache, K_DTYPE[case.layout])
    ops = torch.ops.dsv4_compressor

    @torch.compile(fullgraph=True)
    def step(kv, ape, state_cache, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots):
        ops.cutedsl_save_partial_states(kv, ape, positions, slots, state_cache, batch.block_size)
        ops.cutedsl_compress_norm_rope_store(state_cache, token_req, positions, slots, table, batch.block_size, weight,
                                             1e-6, cos_sin, k_cache, kv_slots, case.ratio, case.layout, fp8_scale)

    step(to_cuda(kv), to_cuda(ape), *(args[n] for n in ("state_cache", "token_to_req_indices", "positions",
                                                         "slot_mapping", "block_table", "rms_norm_weight",
                                                         "cos_sin_cache", "k_cache", "kv_slot_mapping")))
    torch.cuda.synchronize()
    assert_same_bytes(f"{case.name} k_cache", span_bytes(args["k_cache"]), expected)
