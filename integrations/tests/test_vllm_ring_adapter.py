"""vLLM's newer compressor call (``kv=``, ``score=``, ``ape=``, ``query_start_loc=``,
``is_circular=``) and the tail save after it, on a per-request ring state, judged by the spec.

A small ring engine keeps each request's state in a ring of ``C`` rows (vLLM's layout: one
state block of ``C`` rows per request; or, through ``ring_capacity=``, ``C / bs`` blocks) and
runs steps of prefill chunks, decode tokens and speculative verify groups. Each step calls the
adapter the way vLLM's compressor layer does (the compressor with ``is_circular=True``, then
``save_partial_states`` with the tail slots) on torch buffers, and SPEC §13.4's
``compress_and_save`` with ``save_slot_mapping`` = the tail on NumPy mirrors; every byte of the
state and the compressed cache must agree after every step. Triton runs under its interpreter
on CPU.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.integrations import vllm, vllm_ring
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.constants import ratio_config
from dsv4_compressor.spec.formats import bf16_bits, bf16_to_f32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CACHE_DTYPE = {"flashmla_fp8": "uint8", "bf16": "bfloat16", "fp8_per_tensor": "float8_e4m3fn"}
EPS = 1e-6

# The keywords vLLM's newer compressor layer adds to the older call (test_vllm_adapter.VLLM_COMPRESS).
VLLM_NEWER_KEYWORDS = ["int8_ds_mla", "kv", "score", "ape", "query_start_loc", "is_circular"]
VLLM_CUTEDSL_EXTRA = ["store_full_kv", "store_full_fp8", "fp8_scale"]


@dataclass
class RingEngine:
    """Rings, compressed-cache pages and their NumPy mirrors and torch copies, kept across steps."""

    ratio: int
    capacity: int  # C
    block_size: int  # bs: C for vLLM's one-block ring
    block_table: np.ndarray  # int32 [num_reqs, C / bs]: each request's ring blocks
    entries_per_page: int
    kv_block_table: np.ndarray  # int32 [num_reqs, pages per request]
    state: np.ndarray  # float32 [blocks, bs, 2*SW]: the spec's mirror
    k_cache: np.ndarray  # the layout's cache: the spec's mirror
    state_torch: torch.Tensor
    k_cache_torch: torch.Tensor
    state_owner: torch.Tensor  # the whole allocations behind the torch buffers
    k_owner: torch.Tensor
    ape: np.ndarray  # float32 [r, SW]
    weight: np.ndarray  # uint16 bf16 patterns [512]
    cos_sin: np.ndarray  # float32 [max_pos, 64]
    layout: str
    rng: np.random.Generator


def _engine(ratio: int, capacity: int, block_size: int, num_reqs: int, *, layout: str = "flashmla_fp8",
            max_pos: int = 1024, seed: int = 0) -> RingEngine:
    rng = np.random.default_rng(seed)
    blocks_per_ring, entries_per_page = capacity // block_size, 4
    num_blocks = num_reqs * blocks_per_ring + 2  # two spare blocks: the table is not the identity
    block_table = rng.permutation(num_blocks)[:num_reqs * blocks_per_ring].reshape(num_reqs, -1).astype(np.int32)
    pages_per_req = -(-(max_pos // ratio) // entries_per_page)
    num_pages = num_reqs * pages_per_req + 1
    kv_block_table = rng.permutation(num_pages)[:num_reqs * pages_per_req].reshape(num_reqs, -1).astype(np.int32)
    state = spec_batch.random_state_cache(num_blocks, block_size, ratio, rng, row_pad=4)  # earlier steps' rows
    k_cache = spec_batch.canary_k_cache(layout, num_pages, entries_per_page)
    state_owner, state_torch = Buffer.of(state).torch_copy(DEVICE)
    k_owner, k_cache_torch = Buffer.of(k_cache, CACHE_DTYPE[layout]).torch_copy(DEVICE)
    return RingEngine(ratio=ratio, capacity=capacity, block_size=block_size, block_table=block_table,
                      entries_per_page=entries_per_page, kv_block_table=kv_block_table, state=state, k_cache=k_cache,
                      state_torch=state_torch, k_cache_torch=k_cache_torch, state_owner=state_owner, k_owner=k_owner,
                      ape=spec_batch.random_ape(ratio, rng), weight=spec_batch.random_norm_weight(rng, bf16=True),
                      cos_sin=spec_batch.rope_cos_sin_cache(max_pos), layout=layout, rng=rng)


@dataclass
class Step:
    """One step's metadata as vLLM's ring metadata builder gives it (NumPy)."""

    positions: np.ndarray  # int64 [T]
    token_to_req: np.ndarray  # int32 [T]
    query_start_loc: np.ndarray  # int32 [num_reqs + 1]
    slot_mapping: np.ndarray  # int64 [T]: ring slots, -1 = padding
    tail_slot_mapping: np.ndarray  # int64 [T]: the last C tokens of each chunk, -1 elsewhere
    kv_slot_mapping: np.ndarray  # int64 [T]
    kv_score: np.ndarray  # float32 [T, 2*SW]


def _step(engine: RingEngine, plan: list[tuple[int, int]], num_padding: int = 2) -> Step:
    """``plan``: ``(first position, count)`` per request row, in row order (count 0: not scheduled)."""
    requests = [Request(first, count) for first, count in plan]
    positions = np.concatenate([np.arange(r.context_len, r.context_len + r.num_tokens) for r in requests]).astype(np.int64)
    token_to_req = np.concatenate([np.full(r.num_tokens, i) for i, r in enumerate(requests)]).astype(np.int32)
    starts = spec_batch.query_start_loc(requests)
    slots = spec_batch.ring_slots(engine.block_table, token_to_req, positions, engine.capacity, engine.block_size)
    tail = spec_batch.tail_saves(slots, starts, engine.capacity)
    r, per_page = engine.ratio, engine.entries_per_page
    entry = positions // r
    kv_slots = np.where((positions + 1) % r == 0,
                        engine.kv_block_table[token_to_req, entry // per_page].astype(np.int64) * per_page + entry % per_page, -1)
    pad = lambda values, fill: np.concatenate([values, np.full(num_padding, fill, values.dtype)])  # noqa: E731
    num_tokens = positions.shape[0] + num_padding
    width = ratio_config(r).state_row_width
    return Step(positions=pad(positions, 0), token_to_req=pad(token_to_req, 0), query_start_loc=starts,
                slot_mapping=pad(slots, -1), tail_slot_mapping=pad(tail, -1), kv_slot_mapping=pad(kv_slots, -1),
                kv_score=engine.rng.standard_normal((num_tokens, width)).astype(np.float32))


def _on_device(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(DEVICE)


def _spec_step(engine: RingEngine, step: Step) -> None:
    """SPEC §13.4 on the mirrors: compress from the ring and the chunk, then save the tail."""
    sw = step.kv_score.shape[1] // 2
    spec.compress_and_save(
        step.kv_score[:, :sw], step.kv_score[:, sw:], engine.ape, step.positions, step.token_to_req, step.query_start_loc,
        step.slot_mapping, step.tail_slot_mapping, engine.block_table, engine.block_size, engine.state, engine.weight, EPS,
        engine.cos_sin, engine.k_cache, step.kv_slot_mapping, compress_ratio=engine.ratio, layout=engine.layout,
        ring_capacity=engine.capacity)


def _compress_kwargs(engine: RingEngine, step: Step, kv: torch.Tensor, score: torch.Tensor, **changes) -> dict:
    """The compressor call's keywords as vLLM's newer compressor layer passes them."""
    state_width = step.kv_score.shape[1] // 2
    _, weight = Buffer.of(engine.weight).torch_copy(DEVICE)  # uint16 patterns become bfloat16
    kwargs = dict(
        state_cache=engine.state_torch, kv=kv, score=score, ape=_on_device(engine.ape), num_actual=step.positions.shape[0],
        token_to_req_indices=_on_device(step.token_to_req), positions=_on_device(step.positions),
        slot_mapping=_on_device(step.slot_mapping), block_table=_on_device(engine.block_table),
        block_size=engine.block_size, query_start_loc=_on_device(step.query_start_loc), is_circular=True,
        state_width=state_width, cos_sin_cache=_on_device(engine.cos_sin), kv_cache=engine.k_cache_torch,
        k_cache_metadata=SimpleNamespace(slot_mapping=_on_device(step.kv_slot_mapping)), pdl_kwargs={"launch_pdl": False},
        head_dim=512, rope_head_dim=64, compress_ratio=engine.ratio, overlap=engine.ratio == 4, use_fp4_cache=False,
        rms_norm_weight=weight, rms_norm_eps=EPS, quant_block=64, token_stride=576, scale_dim=8, int8_ds_mla=False,
    )
    if engine.block_size != engine.capacity:
        kwargs["ring_capacity"] = engine.capacity
    kwargs.update(changes)
    return kwargs


def _adapter_step(engine: RingEngine, step: Step, compress, *, projection_dtype=torch.float32, **extra) -> None:
    """vLLM's forward on a ring: split ``kv_score``, the compressor call, then the tail save."""
    kv_score = _on_device(step.kv_score).to(projection_dtype)
    sw = kv_score.shape[1] // 2
    kv, score = kv_score.split([sw, sw], dim=-1)
    compress(**_compress_kwargs(engine, step, kv, score, **extra))
    vllm_ring.save_partial_states(
        kv=kv, score=score, ape=_on_device(engine.ape), positions=_on_device(step.positions), state_cache=engine.state_torch,
        slot_mapping=_on_device(step.tail_slot_mapping), block_size=engine.block_size, state_width=sw,
        compress_ratio=engine.ratio, pdl_kwargs={"launch_pdl": False})


def _assert_same_bytes(engine: RingEngine, label: str) -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    expected = {"state_cache": Buffer.of(engine.state).owner, "k_cache": Buffer.of(engine.k_cache).owner}
    for name, owner in (("state_cache", engine.state_owner), ("k_cache", engine.k_owner)):
        got = owner.cpu().numpy().view(np.uint8)
        differ = np.flatnonzero(got != expected[name])
        assert differ.size == 0, f"{label}: {name}: {differ.size} bytes differ from the spec's, the first at byte {differ[0]}"


def _run(engine: RingEngine, plans: list[list[tuple[int, int]]], compress, **extra) -> int:
    """Run the steps on both sides, comparing after each; returns the entries written."""
    written = 0
    for index, plan in enumerate(plans):
        step = _step(engine, plan)
        if "projection_dtype" in extra:  # values the bf16 projection holds exactly
            step.kv_score = bf16_to_f32(bf16_bits(step.kv_score))
        _adapter_step(engine, step, compress, **extra)
        _spec_step(engine, step)
        _assert_same_bytes(engine, f"step {index}")
        written += int((step.kv_slot_mapping >= 0).sum())
    return written


# ---- the signatures ------------------------------------------------------------------------------
def test_signatures_extend_the_older_call_with_vllms_newer_keywords():
    older = list(inspect.signature(vllm.compress_norm_rope_store_triton).parameters)
    triton_params = list(inspect.signature(vllm_ring.compress_norm_rope_store_triton).parameters)
    cutedsl_params = list(inspect.signature(vllm_ring.compress_norm_rope_store_cutedsl).parameters)
    assert triton_params == older + VLLM_NEWER_KEYWORDS + ["ring_capacity"]
    assert cutedsl_params == older + VLLM_NEWER_KEYWORDS + VLLM_CUTEDSL_EXTRA + ["ring_capacity"]
    # the older adapters stay as they were
    assert "is_circular" not in inspect.signature(vllm.compress_norm_rope_store_cutedsl).parameters
    assert vllm_ring.save_partial_states is vllm.save_partial_states


def test_c128_ring_capacity_holds_a_window_and_the_drafts():
    window = ratio_config(128).window
    for drafts in range(0, 400):
        capacity = vllm_ring.c128_ring_capacity(drafts)
        assert capacity % 128 == 0 and capacity >= window + drafts > capacity - 128  # the smallest such multiple
        assert drafts <= capacity - window + 1  # SPEC §13.3: every rejected draft keeps the next window whole
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        vllm_ring.c128_ring_capacity(-1)


# ---- ring steps, Triton (interpreter on CPU) ------------------------------------------------------
def test_c128_ring_prefill_longer_than_the_ring_wraparound_and_decode():
    capacity = vllm_ring.c128_ring_capacity(3)  # 256 rows: vLLM with three speculative tokens
    engine = _engine(128, capacity, capacity, num_reqs=3, seed=1)
    plans = [
        # a chunk longer than the ring (windows 0..127 and 128..255 from the chunk, the last C saved);
        # a chunk whose window starts in the ring and whose tail wraps past the ring's end;
        # a decode token closing a window of ring rows
        [(0, 300), (200, 100), (383, 1)],
        # decode: each window reads rows the tails of step 0 saved (and the first a wrapped one)
        [(300, 84), (300, 84), (384, 1)],
    ]
    written = _run(engine, plans, vllm_ring.compress_norm_rope_store_triton)
    assert written == 2 + 1 + 1 + 1 + 1


def test_c128_ring_speculative_verify_groups_and_a_rollback():
    drafts = 3
    capacity = vllm_ring.c128_ring_capacity(drafts)
    engine = _engine(128, capacity, capacity, num_reqs=2, seed=2)
    group = drafts + 1
    plans = [
        [(0, 125), (0, 254)],
        [(125, group), (254, group)],  # verify groups: boundaries 127 and 255 among the drafts
        [(126, group), (255, group)],  # one draft accepted in each: the positions from 126 / 255 run again
    ]
    written = _run(engine, plans, vllm_ring.compress_norm_rope_store_triton)
    assert written == 1 + 1 + 1 + 1 + 1


@pytest.mark.parametrize("block_size, ring_capacity", [(12, 12), (4, 12)])
def test_c4_ring_windows_across_the_rings_end(block_size, ring_capacity):
    """C4 windows (8 rows, overlapping) on a ring of 12: rows 8..11 then 0..3; one block of C
    rows (vLLM's layout) or three blocks of 4 (``ring_capacity=``)."""
    engine = _engine(4, ring_capacity, block_size, num_reqs=2, seed=3)
    plans = [[(0, 10), (0, 17)]] + [[(10 + i, 1), (17 + i, 1)] for i in range(8)]
    written = _run(engine, plans, vllm_ring.compress_norm_rope_store_triton, projection_dtype=torch.bfloat16)
    assert written == sum(len([p for p in range(end) if (p + 1) % 4 == 0]) for end in (18, 25))


@pytest.mark.gpu
def test_cutedsl_call_on_a_ring_runs_the_step_call_with_its_store_layout():
    """``is_circular=True`` on the CuTe DSL entry point runs CuTe DSL's step call, with
    ``store_full_kv`` as the bf16 layout, and writes the spec's bytes."""
    capacity = vllm_ring.c128_ring_capacity(1)
    engine = _engine(128, capacity, capacity, num_reqs=2, layout="bf16", seed=4)
    plans = [[(127, 1), (100, 160)]]
    written = _run(engine, plans, vllm_ring.compress_norm_rope_store_cutedsl, store_full_kv=True, store_full_fp8=False)
    assert written == 1 + 2


@pytest.mark.parametrize("store_full_kv, layout", [(False, "flashmla_fp8"), (True, "bf16")])
def test_a_cutedsl_ring_call_passes_its_store_layout(monkeypatch, store_full_kv, layout):
    """The CuTe DSL entry point's ring step hands ``store_full_kv`` on as the layout it names."""
    try:
        import dsv4_compressor.impl.cutedsl as cutedsl_impl
    except ImportError:
        pytest.skip("the CuTe DSL family needs nvidia-cutlass-dsl")
    seen = []
    monkeypatch.setattr(cutedsl_impl, "compress_and_save", lambda *a, **k: seen.append(k))
    capacity = vllm_ring.c128_ring_capacity(1)
    engine = _engine(128, capacity, capacity, num_reqs=1, layout=layout, seed=6)
    step = _step(engine, [(0, 130)])
    _adapter_step(engine, step, vllm_ring.compress_norm_rope_store_cutedsl, store_full_kv=store_full_kv,
                  store_full_fp8=False)
    (keywords,) = seen
    assert keywords["layout"] == layout


@pytest.mark.parametrize("tokens", [3, 512, 600])
def test_a_ring_call_takes_its_familys_step_call_at_every_size(monkeypatch, tokens):
    """The CuTe DSL entry point's ring step goes to ``cutedsl.compress_and_save`` and the Triton
    entry point's to ``triton.compress_and_save``, decode-sized or carrying a prefill chunk, with
    the same arguments."""
    import dsv4_compressor.impl.triton as triton_impl

    seen = []
    monkeypatch.setattr(triton_impl, "compress_and_save", lambda *a, **k: seen.append(("triton", a, k)))
    try:
        import dsv4_compressor.impl.cutedsl as cutedsl_impl
    except ImportError:
        pytest.skip("the CuTe DSL family needs nvidia-cutlass-dsl")
    monkeypatch.setattr(cutedsl_impl, "compress_and_save", lambda *a, **k: seen.append(("cutedsl", a, k)))
    capacity = vllm_ring.c128_ring_capacity(1)
    engine = _engine(128, capacity, capacity, num_reqs=1, layout="flashmla_fp8", seed=5)
    step = _step(engine, [(0, tokens - 2)], num_padding=2)  # num_actual = tokens, padding included
    _adapter_step(engine, step, vllm_ring.compress_norm_rope_store_cutedsl)
    _adapter_step(engine, step, vllm_ring.compress_norm_rope_store_triton)
    (first, args, keywords), (second, args2, keywords2) = seen
    assert (first, second) == ("cutedsl", "triton") and keywords == keywords2 and len(args) == len(args2) == 16
    for index, (a, b) in enumerate(zip(args, args2)):  # the same arguments, tensor for tensor
        same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        assert same, f"positional argument {index} differs between the two calls"
    assert args[0].shape[0] == tokens and bool((args[7] == -1).all())  # kv of num_actual rows; no saves
    assert keywords["ring_capacity"] == capacity and keywords["ape_at"] == "save"


# ---- a paged call through the newer keywords ------------------------------------------------------
@pytest.mark.parametrize("entry_point", [
    "compress_norm_rope_store_triton",
    pytest.param("compress_norm_rope_store_cutedsl", marks=pytest.mark.gpu),
])
def test_paged_call_with_the_newer_keywords_is_the_older_call(entry_point):
    """``is_circular=False``: the state was saved first; ``kv``, ``score``, ``ape`` and
    ``query_start_loc`` are checked, the compress reads every row from the state."""
    rng = np.random.default_rng(5)
    b = spec_batch.build_batch([Request(11, 1), Request(34, 2), Request(6, 7)], compress_ratio=4, block_size=4,
                               entries_per_page=2, rng=rng, num_padding=2)
    state = spec_batch.random_state_cache(b.num_state_blocks, 4, 4, rng)
    k_cache = spec_batch.canary_k_cache("flashmla_fp8", b.num_pages, 2)
    kv_score, ape = spec_batch.random_kv_score(b.num_tokens, 4, rng), spec_batch.random_ape(4, rng)
    weight, cos_sin = spec_batch.random_norm_weight(rng, bf16=False), spec_batch.rope_cos_sin_cache(64)
    state_owner, state_t = Buffer.of(state).torch_copy(DEVICE)
    k_owner, k_t = Buffer.of(k_cache).torch_copy(DEVICE)
    kv, score = _on_device(kv_score).split([1024, 1024], dim=-1)
    vllm_ring.save_partial_states(kv=kv, score=score, ape=_on_device(ape), positions=_on_device(b.positions),
                                  state_cache=state_t, slot_mapping=_on_device(b.slot_mapping), block_size=4,
                                  state_width=1024, compress_ratio=4, pdl_kwargs={})
    getattr(vllm_ring, entry_point)(
        state_cache=state_t, kv=kv, score=score, ape=_on_device(ape), num_actual=b.num_tokens,
        token_to_req_indices=_on_device(b.token_to_req_indices), positions=_on_device(b.positions),
        slot_mapping=_on_device(b.slot_mapping), block_table=_on_device(b.block_table.clip(min=0)), block_size=4,
        query_start_loc=_on_device(b.query_start_loc), is_circular=False, state_width=1024,
        cos_sin_cache=_on_device(cos_sin), kv_cache=k_t, k_cache_metadata=SimpleNamespace(slot_mapping=_on_device(b.kv_slot_mapping)),
        pdl_kwargs={}, head_dim=512, rope_head_dim=64, compress_ratio=4, overlap=True, use_fp4_cache=False,
        rms_norm_weight=_on_device(weight), rms_norm_eps=EPS, quant_block=64, token_stride=576, scale_dim=8,
        int8_ds_mla=False)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    spec.save_partial_states(kv_score, ape, b.positions, b.slot_mapping, state, 4)
    spec.compress_norm_rope_store(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table.clip(min=0), 4,
                                  weight, EPS, cos_sin, k_cache, b.kv_slot_mapping, compress_ratio=4)
    assert np.array_equal(state_owner.cpu().numpy().view(np.uint8), Buffer.of(state).owner)
    assert np.array_equal(k_owner.cpu().numpy().view(np.uint8), Buffer.of(k_cache).owner)


# ---- errors: named, before anything is written ----------------------------------------------------
def _error_case(**changes) -> tuple[RingEngine, dict]:
    engine = _engine(4, 12, 12, num_reqs=2, seed=6)
    step = _step(engine, [(0, 9), (5, 3)])
    kv, score = _on_device(step.kv_score).split([1024, 1024], dim=-1)
    kwargs = _compress_kwargs(engine, step, kv, score)
    kwargs.update(changes)
    return engine, kwargs


@pytest.mark.parametrize("changes, argument", [
    (dict(kv=None), "kv"),
    (dict(score=torch.zeros(4, 1024)), "score"),
    (dict(kv=torch.zeros(30, 1024, dtype=torch.float64)), "kv"),
    (dict(query_start_loc=None), "query_start_loc"),
    (dict(query_start_loc=torch.zeros(3, dtype=torch.int64)), "query_start_loc"),
    (dict(ape=None), "ape"),
    (dict(int8_ds_mla=True), "int8_ds_mla"),
    (dict(is_circular="yes"), "is_circular"),
    (dict(block_size=4, slot_mapping=torch.zeros(30, dtype=torch.int64)), "block_size"),
    (dict(ring_capacity=10), "ring_capacity"),
    (dict(head_dim=128), "head_dim"),
    (dict(state_width=512), "state_width"),
])
def test_ring_call_errors_name_the_argument_and_write_nothing(changes, argument):
    engine, kwargs = _error_case(**changes)
    state_before, cache_before = engine.state_owner.clone(), engine.k_owner.clone()
    with pytest.raises(ValueError, match=argument):
        vllm_ring.compress_norm_rope_store_triton(**kwargs)
    assert torch.equal(engine.state_owner, state_before) and torch.equal(engine.k_owner, cache_before)


def test_cutedsl_ring_call_errors_before_anything_is_written():
    engine, kwargs = _error_case(store_full_fp8=True)  # store_full_fp8 without store_full_kv
    cache_before = engine.k_owner.clone()
    with pytest.raises(ValueError, match="store_full_fp8"):
        vllm_ring.compress_norm_rope_store_cutedsl(**kwargs)
    assert torch.equal(engine.k_owner, cache_before)
