"""GPU checks of the indexer compressor's CuTe DSL kernels (SPEC §12): byte-identical to the spec.

Every case builds a vLLM-style batch with :mod:`dsv4_compressor.spec.batch` (shuffled block
tables, scattered padding tokens, non-boundary and dropped tokens, the ``p = 3`` window
with invalid rows, padded state strides, canary-filled caches with padded pages) at head
width 128, runs the spec on NumPy copies and the kernels on CUDA copies of the same bytes,
and compares the whole memory span of every buffer, so a stray write shows as a changed
canary and an inactive token's write as a changed entry. The MXFP4 encoders (E2M1 code,
scale byte, ``2^-k``) are also checked element by element against the spec's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from dsv4_compressor import spec  # noqa: E402
from dsv4_compressor.spec import batch as B  # noqa: E402
from cuda_bytes import (assert_same_bytes, capture_after_warm_up, check_save_partial_states, cuda_args,  # noqa: E402
                        mixed_requests, replay_with_moved_metadata, span, span_bytes, storage, to_cuda)

pytestmark = pytest.mark.gpu

F32 = np.float32
HEAD = 128


# ---- cases --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    ratio: int
    block_size: int
    entries: int  # B
    layout: str = "indexer_fp8"
    hadamard: bool = False
    bf16_weight: bool = True
    values: str = "normal"
    seed: int = 0
    slots_for_all: bool = False  # non-boundary tokens carry their group's kv slot too (they still write nothing)

    @property
    def name(self) -> str:
        return (f"r{self.ratio}-bs{self.block_size}-B{self.entries}-{self.layout}{'-hadamard' if self.hadamard else ''}-"
                f"{'wbf16' if self.bf16_weight else 'wf32'}-{self.values}{'-slots' if self.slots_for_all else ''}")


def _values(case: Case, state: np.ndarray, weight: np.ndarray, rng) -> np.ndarray:
    """Edge-case value profiles (in place on the state; returns the weight)."""
    half = state.shape[-1] // 2
    if case.values == "spread":  # most exp2s arguments below -126 (+0) or subnormal results
        state[..., half:] *= F32(30.0)
    elif case.values == "signed_zeros":  # +0/-0 everywhere: every value and code is a signed zero
        state[...] = np.where(rng.random(state.shape) < 0.5, F32(-0.0), F32(0.0))
        state[::2, :, :half] = F32(-0.0)
    elif case.values == "tiny_weight":  # amax below the FP8 floor, MXFP4 blocks at and below 6*2^-126, zeros
        assert weight.dtype == np.float32
        weight = weight.copy()
        for block, factor in ((0, 1e-9), (1, 1e-39), (2, 0.0), (3, 3e-38)):
            weight[32 * block:32 * (block + 1)] *= F32(factor)
    elif case.values == "huge":  # large scale bytes; one block far above the others
        assert weight.dtype == np.float32
        weight = weight.copy()
        weight[:32] *= F32(1e30)
        weight[96:] *= F32(1e-20)
    return weight


def build(case: Case):
    rng = np.random.default_rng(case.seed)
    batch = B.build_batch(mixed_requests(case.ratio, rng), compress_ratio=case.ratio, block_size=case.block_size,
                          entries_per_page=case.entries, rng=rng, num_padding=3, padding_at_end=False,
                          drop_entry_fraction=0.15, slot_for_non_boundary=case.slots_for_all)
    state = B.random_state_cache(batch.num_state_blocks, case.block_size, case.ratio, rng, row_pad=4, block_pad_rows=1,
                                 head_dim=HEAD)
    weight = _values(case, state, B.random_norm_weight(rng, bf16=case.bf16_weight, head_dim=HEAD), rng)
    k_cache = B.canary_k_cache(case.layout, batch.num_pages, case.entries, page_pad_bytes=32)
    cos_sin = B.rope_cos_sin_cache(int(batch.positions.max()) + 1)
    return batch, state, weight, cos_sin, k_cache


def fresh_k_cache(case: Case, batch) -> np.ndarray:
    return B.canary_k_cache(case.layout, batch.num_pages, case.entries, page_pad_bytes=32)


def spec_run(case: Case, batch, state, weight, cos_sin) -> np.ndarray:
    """The spec's k_cache bytes (whole span) after compress_norm_rope_store."""
    k = fresh_k_cache(case, batch)
    spec.compress_norm_rope_store(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping,
                                  batch.block_table, batch.block_size, weight, 1e-6, cos_sin, k, batch.kv_slot_mapping,
                                  compress_ratio=batch.compress_ratio, layout=case.layout, hadamard=case.hadamard,
                                  debug=True)
    return span(k).copy()


C4_CASES = [
    Case(4, 16, 64),  # production: bs 16
    Case(4, 16, 64, hadamard=True),
    Case(4, 16, 64, layout="indexer_mxfp4"),
    Case(4, 16, 7, layout="indexer_mxfp4", hadamard=True),
    Case(4, 4, 1, bf16_weight=False, values="spread"),
    Case(4, 3, 2, hadamard=True, values="spread", seed=1),
    Case(4, 1, 64, layout="indexer_mxfp4", values="signed_zeros"),
    Case(4, 2, 64, hadamard=True, values="signed_zeros"),
    Case(4, 6, 3, bf16_weight=False, values="tiny_weight"),
    Case(4, 5, 64, layout="indexer_mxfp4", hadamard=True, bf16_weight=False, values="tiny_weight"),
    Case(4, 8, 2, layout="indexer_mxfp4", bf16_weight=False, values="huge"),
    Case(4, 12, 64, hadamard=True, bf16_weight=False, values="huge"),
    Case(4, 16, 4, layout="indexer_mxfp4", slots_for_all=True, seed=2),
]
C128_CASES = [
    Case(128, 8, 64),  # production: bs 8
    Case(128, 8, 2, layout="indexer_mxfp4", hadamard=True),
    Case(128, 5, 3, hadamard=True, bf16_weight=False, values="spread"),
    Case(128, 16, 1, layout="indexer_mxfp4", values="signed_zeros"),
    Case(128, 12, 64, layout="indexer_mxfp4", bf16_weight=False, values="tiny_weight"),
    Case(128, 4, 2, hadamard=True, bf16_weight=False, values="huge"),
    Case(128, 8, 3, slots_for_all=True, seed=2),
]


def _run_and_compare(case: Case, **kwargs):
    from dsv4_compressor.impl import cutedsl

    batch, state, weight, cos_sin, k_cache = build(case)
    assert batch.num_active > 0 and (~batch.active).any()
    expected = spec_run(case, batch, state, weight, cos_sin)
    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    state_before = span_bytes(args["state_cache"]).copy()
    cutedsl.compress_norm_rope_store(**args, compress_ratio=case.ratio, layout=case.layout, hadamard=case.hadamard,
                                     **kwargs)
    torch.cuda.synchronize()
    assert_same_bytes(f"{case.name} k_cache", span_bytes(args["k_cache"]), expected)
    assert_same_bytes(f"{case.name} state_cache", span_bytes(args["state_cache"]), state_before)
    return args


@pytest.mark.parametrize("case", C4_CASES + C128_CASES, ids=lambda c: c.name)
def test_indexer_matches_spec(case):
    _run_and_compare(case)


@pytest.mark.parametrize("choices, case", [
    (dict(indexer_c4_warps=4), C4_CASES[1]),
    (dict(indexer_c4_warps=2), C4_CASES[3]),
    (dict(indexer_c4_warps=8), C4_CASES[5]),  # a partial last CTA
    (dict(indexer_c128_warps=8), C128_CASES[0]),
    (dict(indexer_c128_warps=8), C128_CASES[2]),
    (dict(pdl=False), C4_CASES[0]),
    (dict(pdl=False), C128_CASES[1]),
], ids=lambda v: "-".join(f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else v.name)
def test_indexer_mapping_knobs_keep_the_bytes(choices, case):
    """Other mappings (a frozen policy's indexer shapes) and ``pdl=False`` write the same bytes."""
    from dsv4_compressor.impl import cutedsl

    choices = dict(choices)
    pdl = choices.pop("pdl", True)
    _run_and_compare(case, pdl=pdl, policy=cutedsl.DEFAULT_POLICY.with_overrides(**choices))


def test_indexer_bad_arguments_write_nothing():
    """Bad calls raise ValueError naming the argument, and no byte of any buffer changes."""
    from dsv4_compressor.impl import cutedsl

    case = C4_CASES[0]
    batch, state, weight, cos_sin, k_cache = build(case)
    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    before = {k: span_bytes(v).copy() for k, v in args.items() if isinstance(v, torch.Tensor)}
    bad_calls = [
        (dict(layout="flashmla_fp8"), {}, "layout"),  # a 512-wide layout on the 128-wide state
        (dict(layout="indexer_mxfp4"), {}, "k_cache"),  # 132-byte entries given for a 68-byte layout
        (dict(hadamard=1), {}, "hadamard"),
        (dict(fp8_scale=1.0), {}, "fp8_scale"),
        (dict(c128_path="cluster"), {}, "c128_path"),
        ({}, dict(rms_norm_weight=args["rms_norm_weight"][:64]), "rms_norm_weight"),
        ({}, dict(positions=args["positions"].int()), "positions"),
        ({}, dict(kv_slot_mapping=args["kv_slot_mapping"][:-1]), "kv_slot_mapping"),
        ({}, dict(rms_norm_eps=0.0), "rms_norm_eps"),
    ]
    for kwargs, changed, needle in bad_calls:
        call = {**args, **changed}
        keywords = {"compress_ratio": 4, "layout": case.layout, **kwargs}
        with pytest.raises(ValueError, match=needle):
            cutedsl.compress_norm_rope_store(**call, **keywords)
    with pytest.raises(ValueError, match="hadamard"):
        cutedsl.compress_norm_rope_store(**args, compress_ratio=4, layout="indexer_fp8", hadamard="yes")
    torch.cuda.synchronize()
    for key, value in before.items():
        assert_same_bytes(f"bad calls: {key}", span_bytes(args[key]), value)


def test_indexer_empty_call_writes_nothing():
    from dsv4_compressor.impl import cutedsl

    case = C4_CASES[0]
    batch, state, weight, cos_sin, k_cache = build(case)
    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    for key in ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping"):
        args[key] = args[key][:0]
    before = span_bytes(args["k_cache"]).copy()
    cutedsl.compress_norm_rope_store(**args, compress_ratio=4, layout=case.layout)
    torch.cuda.synchronize()
    assert_same_bytes("T = 0", span_bytes(args["k_cache"]), before)


# ---- the MXFP4 device encoders, element by element ---------------------------------------------
def _compile_mxfp4_encoders():
    """A CuTe kernel: element ``i`` of fp32 ``x [n]`` gives ``code[i] = e2m1_code(x[i])``,
    ``byte[i] = e2m1_scale_byte(|x[i]|)`` (int32 ``[n]`` each) and ``inv[i] = pow2_neg_k(byte[i])``
    (fp32 ``[n]``), compiled for TVM-FFI (torch tensors, the current stream)."""
    from cutlass import Float32, Int32

    from dsv4_compressor.impl.cutedsl import compile_cache
    from dsv4_compressor.impl.cutedsl.exact_math import e2m1_code, e2m1_scale_byte, pow2_neg_k

    threads = 128

    class Mxfp4Encoders:
        @cute.jit
        def __call__(self, mX: cute.Tensor, mCode: cute.Tensor, mByte: cute.Tensor, mInv: cute.Tensor,
                     stream: cuda.CUstream):
            n = mX.shape[0]
            self.kernel(mX, mCode, mByte, mInv).launch(grid=((n + threads - 1) // threads, 1, 1),
                                                       block=(threads, 1, 1), stream=stream)

        @cute.kernel
        def kernel(self, mX: cute.Tensor, mCode: cute.Tensor, mByte: cute.Tensor, mInv: cute.Tensor):
            tidx, _, _ = cute.arch.thread_idx()
            cta, _, _ = cute.arch.block_idx()
            i = cta * threads + tidx
            if i < mX.shape[0]:
                x = mX[i]
                byte = e2m1_scale_byte(cute.math.absf(x))
                mCode[i] = e2m1_code(x).to(Int32)
                mByte[i] = byte.to(Int32)
                mInv[i] = pow2_neg_k(byte)

    def build():
        n = cute.sym_int()
        fake = [cute.runtime.make_fake_compact_tensor(dtype, (n,), assumed_align=4)
                for dtype in (Float32, Int32, Int32, Float32)]
        return cute.compile(Mxfp4Encoders(), *fake, compile_cache.fake_stream(), options=compile_cache._options(False))

    return compile_cache.cached(("test", "mxfp4_encoders"), build)


def test_mxfp4_encoders_match_spec_element_by_element():
    """``e2m1_code`` on every grid value, midpoint and their neighbours, a dense range, signed
    zeros and random binary32 (beyond 6 included: saturation); ``e2m1_scale_byte`` and
    ``pow2_neg_k`` around every ``6 * 2^k`` and at the floor: SPEC §12's ``e2m1`` and ``k``."""
    from dsv4_compressor.spec import formats

    rng = np.random.default_rng(21)
    first, last = (int(np.array(v, F32).view(np.uint32)) for v in (0.125, 8.0))
    dense = np.arange(first, last, 7, dtype=np.uint32).view(F32)
    grid = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0], F32)
    boundaries = (6.0 * np.exp2(np.arange(-126, 126, dtype=np.float64))).astype(F32)  # 6 * 2^k, exact
    marks = np.concatenate([grid, boundaries])
    near = np.concatenate([marks, np.nextafter(marks, F32(0)), np.nextafter(marks, F32(np.inf))])
    edges = np.array([1e-45, 1e-40, 2.0**-126, 6 * 2.0**-126, 3.4028235e38], F32)
    randoms = rng.integers(0, 0x7F800000, 100_000, dtype=np.uint64).astype(np.uint32).view(F32)
    values = np.concatenate([dense, near, edges, randoms]).astype(F32)
    values = np.concatenate([values, -values])  # -0.0 included
    x = torch.from_numpy(values).cuda()
    code, byte = (torch.empty(x.shape, dtype=torch.int32, device="cuda") for _ in range(2))
    inv = torch.empty_like(x)
    _compile_mxfp4_encoders()(x, code, byte, inv)
    torch.cuda.synchronize()
    code, byte, inv = code.cpu().numpy(), byte.cpu().numpy(), inv.cpu().numpy()

    expected_code = formats.e2m1_bits(values).astype(np.int32)
    bad = np.flatnonzero(code != expected_code)
    assert bad.size == 0, f"e2m1({values[bad[0]]!r}): cutedsl {code[bad[0]]:#x}, spec {expected_code[bad[0]]:#x}"
    minus_zero = values.view(np.uint32) == np.uint32(0x80000000)
    assert minus_zero.any() and (code[minus_zero] == 0x8).all()  # -0 keeps its sign
    k = formats.mxfp4_exponent(np.abs(values))
    bad = np.flatnonzero(byte != k + 127)
    assert bad.size == 0, f"scale byte of {abs(values[bad[0]])!r}: cutedsl {byte[bad[0]]}, spec {k[bad[0]] + 127}"
    assert np.array_equal(inv.view(np.uint32), (127 - k).astype(np.uint32) << np.uint32(23))


# ---- save_partial_states at the indexer's state widths ------------------------------------------------
@pytest.mark.parametrize("ratio, block_size, misaligned", [(4, 16, False), (128, 8, False), (4, 3, True), (128, 5, True)])
def test_indexer_save_partial_states_matches_spec(ratio, block_size, misaligned):
    check_save_partial_states(ratio, block_size, misaligned, head_dim=HEAD)


@pytest.mark.parametrize("case", [C4_CASES[1], C128_CASES[1]], ids=lambda c: c.name)
def test_indexer_save_and_compress_in_one_graph(case):
    """``save_and_compress_norm_rope_store`` captured in a CUDA graph and replayed, PDL on:
    the compress kernel pools the rows the save kernel has just written (spec's bytes)."""
    from dsv4_compressor.impl import cutedsl

    batch, state, weight, cos_sin, k_cache = build(case)
    rng = np.random.default_rng(11)
    kv, ape = B.random_kv_score(batch.num_tokens, case.ratio, rng, head_dim=HEAD), B.random_ape(case.ratio, rng, head_dim=HEAD)
    saved = np.lib.stride_tricks.as_strided(span(state).copy().view(F32), state.shape, state.strides)
    spec.save_partial_states(kv, ape, batch.positions, batch.slot_mapping, saved, batch.block_size, debug=True)
    assert not np.array_equal(span(saved), span(state))
    expected = spec_run(case, batch, saved, weight, cos_sin)

    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    state_clean, k_clean = span_bytes(args["state_cache"]).copy(), span_bytes(args["k_cache"]).copy()
    kv_t, ape_t = to_cuda(kv), to_cuda(ape)
    kwargs = dict(compress_ratio=case.ratio, layout=case.layout, hadamard=case.hadamard)
    cutedsl.save_and_compress_norm_rope_store(kv_t, ape_t, **args, **kwargs)  # compiles both before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cutedsl.save_and_compress_norm_rope_store(kv_t, ape_t, **args, **kwargs)
    for replay in range(2):
        for key, clean in (("state_cache", state_clean), ("k_cache", k_clean)):
            storage(args[key]).copy_(torch.from_numpy(clean).cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(f"replay {replay}: k_cache", span_bytes(args["k_cache"]), expected)


@pytest.mark.parametrize("case", [C4_CASES[2], C128_CASES[0]], ids=lambda c: c.name)
def test_indexer_graph_replay_with_new_metadata(case):
    """Capture once, then change the metadata in place and replay: the spec's bytes."""
    from dsv4_compressor.impl import cutedsl

    batch, state, weight, cos_sin, k_cache = build(case)
    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    k_clean = args["k_cache"].clone()
    kwargs = dict(compress_ratio=case.ratio, layout=case.layout, hadamard=case.hadamard)
    graph = capture_after_warm_up(cutedsl.compress_norm_rope_store, args, kwargs)
    moved, moved_state = replay_with_moved_metadata(graph, args, batch, state, case.entries, k_clean)
    assert_same_bytes("graph replay vs spec", span_bytes(args["k_cache"]), spec_run(case, moved, moved_state, weight, cos_sin))


# ---- the host path: bound layers, warm-up, torch custom ops ----------------------------------------------
@pytest.mark.parametrize("case", [C4_CASES[0], C4_CASES[2], C128_CASES[1]], ids=lambda c: c.name)
def test_indexer_bound_layer_after_warm_up_in_a_graph(case):
    """A bound indexer layer, warmed up, captured right after (no compile during capture) and
    replayed: the spec's bytes."""
    from dsv4_compressor.impl import cutedsl
    from dsv4_compressor.impl.cutedsl import compile_cache

    batch, state, weight, cos_sin, k_cache = build(case)
    expected = spec_run(case, batch, state, weight, cos_sin)
    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    layer = cutedsl.bind(args["state_cache"], args["k_cache"], args["rms_norm_weight"], args["cos_sin_cache"],
                         block_size=batch.block_size, compress_ratio=case.ratio, rms_norm_eps=1e-6,
                         layout=case.layout, hadamard=case.hadamard)
    layer.warm_up()
    compiled = len(compile_cache._CACHE)
    per_token = [args[n] for n in ("token_to_req_indices", "positions", "slot_mapping", "block_table",
                                   "kv_slot_mapping")]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.compress_norm_rope_store(*per_token)
    graph.replay()
    torch.cuda.synchronize()
    assert len(compile_cache._CACHE) == compiled
    assert_same_bytes(f"{case.name} k_cache", span_bytes(args["k_cache"]), expected)


@pytest.mark.parametrize("case", [C4_CASES[1], C128_CASES[1]], ids=lambda c: c.name)
def test_indexer_compiled_custom_ops_match_spec(case):
    """torch.compile(fullgraph=True) over the save and compress ops with an indexer layout and
    ``hadamard``: the spec's bytes."""
    import dsv4_compressor.impl.cutedsl  # noqa: F401  (registers the ops)

    torch._dynamo.reset()
    batch, state, weight, cos_sin, k_cache = build(case)
    rng = np.random.default_rng(5)
    kv, ape = B.random_kv_score(batch.num_tokens, case.ratio, rng, head_dim=HEAD), B.random_ape(case.ratio, rng, head_dim=HEAD)
    saved = np.lib.stride_tricks.as_strided(span(state).copy().view(F32), state.shape, state.strides)
    spec.save_partial_states(kv, ape, batch.positions, batch.slot_mapping, saved, batch.block_size, debug=True)
    expected = spec_run(case, batch, saved, weight, cos_sin)
    args = cuda_args(batch, state, weight, cos_sin, k_cache)
    ops = torch.ops.dsv4_compressor

    @torch.compile(fullgraph=True)
    def step(kv, ape, state_cache, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots):
        ops.cutedsl_save_partial_states(kv, ape, positions, slots, state_cache, batch.block_size)
        ops.cutedsl_compress_norm_rope_store(state_cache, token_req, positions, slots, table, batch.block_size, weight,
                                             1e-6, cos_sin, k_cache, kv_slots, case.ratio, case.layout,
                                             hadamard=case.hadamard)

    step(to_cuda(kv), to_cuda(ape), *(args[n] for n in ("state_cache", "token_to_req_indices", "positions",
                                                         "slot_mapping", "block_table", "rms_norm_weight",
                                                         "cos_sin_cache", "k_cache", "kv_slot_mapping")))
    torch.cuda.synchronize()
    assert_same_bytes(f"{case.name} k_cache", span_bytes(args["k_cache"]), expected)
