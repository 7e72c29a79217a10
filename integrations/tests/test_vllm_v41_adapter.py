"""The vLLM V4.1 adapters, called the way vLLM's DeepSeek-V4.1 compressor layer calls its own kernels.

Each case builds one step with :mod:`dsv4_compressor.spec.v41_batch` (vLLM's ring: one shuffled
block of ``C`` rows per request, ring slots ``block * C + p % C``, padding tokens, buffers
longer than the step as for a CUDA graph), runs the NumPy spec on one copy of the buffers with
SPEC §14.7's arguments (the block table and the tail saves of the batch builder) and the
adapter on a torch copy with vLLM's (one ``[T, 512 * r]`` ``kv_score``, the ring slots, the
compressed-cache slots), and compares whole allocations byte for byte: the latent, the ring
and the compressed or indexer cache. Triton runs under its interpreter on CPU.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.integrations import vllm_v41
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
RECORDS = ("flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4")
CACHE_DTYPES = {"bf16": "bfloat16", "fp8_per_tensor": "float8_e4m3fn"}  # every other record: uint8
GRAPH_ROWS = 3  # rows of kv_score, positions, latent and token_to_req beyond the step's tokens

# vLLM 0.33.0's parameters: (name, default) in order; inspect.Parameter.empty = no default
NO = inspect.Parameter.empty
VLLM_SIGNATURES = {
    "fused_save_compress_norm": [
        ("kv_score", NO), ("positions", NO), ("state_cache", NO), ("slot_mapping", NO), ("query_start_loc", NO),
        ("token_to_req_indices", NO), ("rms_norm_weight", NO), ("rms_norm_eps", NO), ("compress_ratio", NO),
        ("latent_out", NO), ("prev_rows", None), ("prev_row_indices", None)],
    "save_ring_rows": [("rows", NO), ("slot_mapping", NO), ("state_cache", NO)],
    "rope_quant_insert": [("latent", NO), ("positions", NO), ("cos_sin_cache", NO), ("kv_cache", NO),
                          ("slot_mapping", NO), ("compress_ratio", NO), ("fp8_scale", None)],
    "indexer_k_norm_rope_store": [
        ("k_pre", NO), ("positions", NO), ("cos_sin_cache", NO), ("rms_norm_weight", NO), ("rms_norm_eps", NO),
        ("k_cache", NO), ("kv_slot_mapping", NO), ("compress_ratio", NO), ("use_fp4_cache", NO)],
}

# prefill chunks longer than vLLM's smallest ring (8), one from an odd position (its first group
# closes with the ring's row), decode at an odd and an even position
MIXED = [Request(0, 11), Request(5, 10), Request(9, 1), Request(12, 1)]


@dataclass
class Step:
    """One layer's step as NumPy arrays: the spec's view (bf16 as uint16 patterns)."""

    ratio: int
    tables: V.V41Tables
    step: V.V41Step
    kv_score: np.ndarray  # float32 [T + GRAPH_ROWS, 512 * r]
    state_cache: np.ndarray | None  # float32 [blocks, C, 1024] (ratio 2)
    weight: np.ndarray  # uint16 bf16 patterns [512]
    cos_sin: np.ndarray  # float32 [max_pos, 64]
    latent: np.ndarray  # uint16 [T + GRAPH_ROWS, 512], canary-filled

    @property
    def capacity(self) -> int:
        return self.tables.state.block_size

    @property
    def num_tokens(self) -> int:
        return self.step.num_tokens

    def kv(self) -> np.ndarray:
        return self.kv_score[:self.num_tokens, :512]

    def score(self) -> np.ndarray | None:
        return self.kv_score[:self.num_tokens, 512:] if self.ratio == 2 else None


def _build(requests: list[Request], *, ratio: int, seed: int, num_speculative: int = 0, entries_per_page: int = 4,
           num_padding: int = 2) -> Step:
    rng = np.random.default_rng(seed)
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=ratio,
                          state=V.vllm_ring(num_speculative), entries_per_page=entries_per_page, rng=rng)
    step = V.v41_step(tables, requests, rng=rng, num_padding=num_padding)
    kv, score = V.projections(step.num_tokens + GRAPH_ROWS, rng)
    state = V.state_cache(tables.num_state_blocks, tables.state.block_size, rng) if ratio == 2 else None
    max_pos = int(step.positions.max()) + 2
    return Step(ratio=ratio, tables=tables, step=step,
                kv_score=np.ascontiguousarray(np.concatenate([kv, score], axis=1) if ratio == 2 else kv),
                state_cache=state, weight=B.random_norm_weight(rng, bf16=True), cos_sin=B.rope_cos_sin_cache(max_pos),
                latent=V.latent_buffer(step.num_tokens + GRAPH_ROWS, row_pad=0))


def _twin(array: np.ndarray | None, logical: str | None = None):
    """``(allocation, view)`` torch copies of a NumPy buffer on the test device."""
    return (None, None) if array is None else Buffer.of(array, logical).torch_copy(DEVICE)


def _copy(array: np.ndarray | None):
    return (None, None) if array is None else Buffer.of(array).numpy_copy()


def _tensor(array: np.ndarray, extra: int = 0, fill: int = 0) -> torch.Tensor:
    """A metadata tensor, lengthened by ``extra`` garbage entries (buffers sized for a CUDA graph)."""
    return torch.from_numpy(np.concatenate([array, np.full(extra, fill, array.dtype)])).to(DEVICE)


def _table(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array).to(DEVICE)


def _weight(array: np.ndarray) -> torch.Tensor:
    return _twin(array)[1]


def _assert_identical(name: str, expected: np.ndarray, actual: np.ndarray) -> None:
    differ = np.flatnonzero(expected.view(np.uint8) != actual.view(np.uint8))
    assert differ.size == 0, f"{name}: {differ.size} bytes differ, the first at byte {differ[0]}"


def _assert_written(name: str, before: np.ndarray, after: np.ndarray) -> None:
    """Guards against comparing two untouched buffers."""
    assert np.any(before.view(np.uint8) != after.view(np.uint8)), f"{name}: the spec wrote nothing"


# ---- the spec's side: SPEC §14.7 arguments from the batch builder ---------------------------------------------
def _spec_state(s: Step, state: np.ndarray | None) -> dict:
    if s.ratio == 1:
        return dict(token_to_req=None, query_start_loc=None, slot_mapping=None, save_slot_mapping=None, block_table=None,
                    bs=None, state_cache=None, ring_capacity=None)
    st = s.step
    return dict(token_to_req=st.token_to_req, query_start_loc=st.query_start_loc, slot_mapping=st.slot_mapping,
                save_slot_mapping=st.save_slot_mapping, block_table=s.tables.block_table, bs=s.capacity, state_cache=state,
                ring_capacity=s.capacity)


def _spec_compress(s: Step) -> dict:
    """``{name: allocation}`` of the latent and the ring after the spec's ``v41_compress_norm``."""
    latent_owner, latent = _copy(s.latent)
    state_owner, state = _copy(s.state_cache)
    spec.v41_compress_norm(s.kv(), s.score(), s.step.positions, **_spec_state(s, state), rms_norm_weight=s.weight,
                           rms_norm_eps=EPS, kv_slot_mapping=s.step.kv_slot_mapping, latent=latent[:s.num_tokens],
                           compress_ratio=s.ratio)
    return {"latent": latent_owner, "state_cache": state_owner}


def _spec_combined(s: Step, k_cache: np.ndarray, layout: str, fp8_scale: float | None, latent: bool = True) -> dict:
    latent_owner, latent_view = _copy(s.latent)
    state_owner, state = _copy(s.state_cache)
    k_owner, k_view = _copy(k_cache)
    spec.v41_compress_norm_rope_store(
        s.kv(), s.score(), s.step.positions, **_spec_state(s, state), rms_norm_weight=s.weight, rms_norm_eps=EPS,
        cos_sin_cache=s.cos_sin, k_cache=k_view, kv_slot_mapping=s.step.kv_slot_mapping,
        latent=latent_view[:s.num_tokens] if latent else None, compress_ratio=s.ratio, layout=layout, fp8_scale=fp8_scale)
    return {"latent": latent_owner, "state_cache": state_owner, "k_cache": k_owner}


# ---- vLLM's side -------------------------------------------------------------------------------------------
def _vllm_compress(s: Step, latent=None, state=None, kv_score=None, **extra) -> None:
    """``DeepseekCompressor.forward``'s call: ratio 1 passes the compressed-cache slots and no state."""
    st = s.step
    ratio2 = s.ratio == 2
    vllm_v41.fused_save_compress_norm(
        kv_score if kv_score is not None else _twin(s.kv_score)[1], _tensor(st.positions, GRAPH_ROWS, 10**6), state,
        _tensor(st.slot_mapping if ratio2 else st.kv_slot_mapping), _tensor(st.query_start_loc) if ratio2 else None,
        _tensor(st.token_to_req, GRAPH_ROWS, 0) if ratio2 else None, _weight(s.weight), EPS, s.ratio, latent, **extra)


def _vllm_insert(s: Step, latent: torch.Tensor, k_cache: torch.Tensor, fp8_scale) -> None:
    """``DeepseekCompressor.insert_cache``'s call."""
    vllm_v41.rope_quant_insert(latent, _tensor(s.step.positions, GRAPH_ROWS, 10**6), _table(s.cos_sin),
                               k_cache, _tensor(s.step.kv_slot_mapping), s.ratio, fp8_scale=fp8_scale)


def _cache(s: Step, layout: str) -> tuple[np.ndarray, float | None]:
    k_cache = B.canary_k_cache(layout, s.tables.num_pages, s.tables.entries_per_page,
                               page_pad_bytes=16 if layout not in CACHE_DTYPES else 0)
    return k_cache, 0.037 if layout == "fp8_per_tensor" else None


def _owners(**arrays) -> dict:
    return {name: _twin(array, CACHE_DTYPES.get(arrays.get("layout")) if name == "k_cache" else None)
            for name, array in arrays.items() if array is not None and name != "layout"}


# ---- signatures ------------------------------------------------------------------------------------------------
def test_signatures_are_vllms_keyword_for_keyword():
    for name, expected in VLLM_SIGNATURES.items():
        parameters = inspect.signature(getattr(vllm_v41, name)).parameters.values()
        assert [(p.name, p.default) for p in parameters] == expected, name


# ---- vLLM's ring metadata as SPEC §13.4's ---------------------------------------------------------------------
@pytest.mark.parametrize("requests, num_speculative", [(MIXED, 0), ([Request(3, 40), Request(0, 0), Request(8, 3)], 7)])
def test_ring_metadata_is_the_batch_builders(requests, num_speculative):
    """The block table and the tail saves derived from vLLM's ring slots are those the batch builder
    makes from the block table (a chunk longer than the ring saves only its last C tokens: on a GPU
    two tokens naming one slot would race, which the interpreter's program order hides)."""
    s = _build(requests, ratio=2, seed=9, num_speculative=num_speculative)
    st, capacity = s.step, s.capacity
    slots, qsl = _tensor(st.slot_mapping), _tensor(st.query_start_loc)
    saves = vllm_v41._tail_saves(slots, qsl, _tensor(st.token_to_req), capacity)
    assert np.array_equal(saves.cpu().numpy(), st.save_slot_mapping)
    assert (st.save_slot_mapping == -1).sum() > (st.slot_mapping == -1).sum()  # some tokens are not saved
    table = vllm_v41._ring_block_table(slots, qsl, capacity).cpu().numpy()
    nonempty = np.diff(st.query_start_loc) > 0
    assert np.array_equal(table[nonempty], s.tables.block_table[nonempty])


# ---- fused_save_compress_norm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, requests, num_speculative", [
    (1, MIXED, 0),
    (2, MIXED, 0),
    (2, V.verify_requests([7, 10, 4], 3), 3),  # verify groups of 4 tokens, C = 8
    (2, [Request(3, 20), Request(14, 1)], 7),  # C = 16: a chunk longer than the ring, a decode token
])
def test_fused_save_compress_norm_writes_the_specs_latent_and_ring(ratio, requests, num_speculative):
    s = _build(requests, ratio=ratio, seed=ratio + num_speculative, num_speculative=num_speculative)
    expected = _spec_compress(s)
    latent_owner, latent = _twin(s.latent)
    state_owner, state = _twin(s.state_cache)
    _vllm_compress(s, latent, state)
    _assert_written("latent", Buffer.of(s.latent).owner, expected["latent"])
    _assert_identical("latent", expected["latent"], latent_owner.cpu().numpy())
    if ratio == 2:
        _assert_written("state_cache", Buffer.of(s.state_cache).owner, expected["state_cache"])
        _assert_identical("state_cache", expected["state_cache"], state_owner.cpu().numpy())


def test_fused_save_compress_norm_takes_a_bf16_kv_score():
    """A bf16 ``kv_score`` (vLLM asserts fp32; §14.2 takes bf16 too): the spec's bytes on the same bf16 values."""
    s = _build(MIXED, ratio=2, seed=5)
    s.kv_score = V.bf16_patterns(s.kv_score)
    expected = _spec_compress(s)
    latent_owner, latent = _twin(s.latent)
    state_owner, state = _twin(s.state_cache)
    _vllm_compress(s, latent, state)
    _assert_identical("latent", expected["latent"], latent_owner.cpu().numpy())
    _assert_identical("state_cache", expected["state_cache"], state_owner.cpu().numpy())


@pytest.mark.parametrize("ratio", [1, 2])
def test_a_step_of_padding_writes_nothing(ratio):
    """A CUDA-graph step with no request: every slot -1, ``query_start_loc = [0]``."""
    state = torch.ones((2, 8, 1024), device=DEVICE) if ratio == 2 else None
    latent = torch.zeros((4, 512), dtype=torch.bfloat16, device=DEVICE)
    none = torch.full((4,), -1, dtype=torch.int64, device=DEVICE)
    vllm_v41.fused_save_compress_norm(
        torch.ones((4, 512 * ratio), device=DEVICE), torch.arange(4, device=DEVICE), state, none,
        torch.zeros(1, dtype=torch.int32, device=DEVICE), torch.zeros(4, dtype=torch.int32, device=DEVICE),
        torch.ones(512, device=DEVICE), EPS, ratio, latent)
    assert not latent.any() and (state is None or bool((state == 1).all()))


# ---- rope_quant_insert and the index key --------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("layout", RECORDS)
def test_rope_quant_insert_writes_the_specs_records(ratio, layout):
    s = _build([Request(3, 1), Request(5, 4), Request(0, 2)], ratio=ratio, seed=20 + RECORDS.index(layout), entries_per_page=2)
    latent_np = V.latent_buffer(s.num_tokens + GRAPH_ROWS, row_pad=0)
    latent_np[...] = V.bf16_patterns(np.random.default_rng(3).standard_normal(latent_np.shape))
    k_cache, fp8_scale = _cache(s, layout)
    k_owner_np, k_view = _copy(k_cache)
    spec.v41_rope_quant_store(latent_np[:s.num_tokens], s.step.positions, s.step.kv_slot_mapping, s.cos_sin, k_view,
                              compress_ratio=ratio, layout=layout, fp8_scale=fp8_scale)
    k_owner, k_tensor = _twin(k_cache, CACHE_DTYPES.get(layout))
    scale = torch.tensor([fp8_scale], dtype=torch.float32, device=DEVICE) if fp8_scale else None
    _vllm_insert(s, _twin(latent_np)[1], k_tensor, scale)
    _assert_written("k_cache", Buffer.of(k_cache).owner, k_owner_np)
    _assert_identical("k_cache", k_owner_np, k_owner.cpu().numpy())


@pytest.mark.parametrize("ratio, use_fp4_cache", [(1, True), (2, True), (1, False), (2, False)])
def test_indexer_k_norm_rope_store_writes_the_specs_keys(ratio, use_fp4_cache):
    layout = "indexer_mxfp4" if use_fp4_cache else "indexer_fp8"
    s = _build(MIXED, ratio=ratio, seed=30 + ratio)
    rng = np.random.default_rng(4)
    k_pre = V.k_pre(s.num_tokens + GRAPH_ROWS, rng)
    weight = B.random_norm_weight(rng, bf16=True, head_dim=128)
    k_cache = B.canary_k_cache(layout, s.tables.num_pages, s.tables.entries_per_page, page_pad_bytes=16)
    k_owner_np, k_view = _copy(k_cache)
    spec.v41_index_key_store(k_pre[:s.num_tokens], s.step.positions, s.step.kv_slot_mapping, weight, EPS, s.cos_sin, k_view,
                             compress_ratio=ratio, layout=layout)
    k_owner, k_tensor = _twin(k_cache)
    vllm_v41.indexer_k_norm_rope_store(_twin(k_pre)[1], _tensor(s.step.positions, GRAPH_ROWS), _table(s.cos_sin),
                                       _weight(weight), EPS, k_tensor, _tensor(s.step.kv_slot_mapping), ratio, use_fp4_cache)
    _assert_written("k_cache", Buffer.of(k_cache).owner, k_owner_np)
    _assert_identical("k_cache", k_owner_np, k_owner.cpu().numpy())


# ---- the pair and the fused entry ---------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, layout", [(1, "flashmla_fp8"), (2, "bf16"), (1, "fp8_per_tensor"), (2, "v41_mxfp8"),
                                           (2, "v41_nvfp4")])
def test_pair_and_fused_entry_write_the_specs_bytes(ratio, layout):
    """vLLM's two calls and the fused entry each give the spec's combined call's bytes."""
    s = _build(MIXED, ratio=ratio, seed=40 + RECORDS.index(layout), entries_per_page=2)
    k_cache, fp8_scale = _cache(s, layout)
    expected = _spec_combined(s, k_cache, layout, fp8_scale)
    for name in expected:
        if name != "state_cache" or ratio == 2:
            _assert_written(name, Buffer.of({"latent": s.latent, "state_cache": s.state_cache, "k_cache": k_cache}[name]).owner,
                            expected[name])
    for entry in ("pair", "fused"):
        owners = _owners(latent=s.latent, state_cache=s.state_cache, k_cache=k_cache, layout=layout)
        latent, state, cache = (owners[n][1] if n in owners else None for n in ("latent", "state_cache", "k_cache"))
        if entry == "pair":
            _vllm_compress(s, latent, state)
            _vllm_insert(s, latent, cache, fp8_scale)
        else:
            st = s.step
            vllm_v41.fused_save_compress_norm_rope_quant_insert(
                _twin(s.kv_score)[1], _tensor(st.positions, GRAPH_ROWS), state,
                _tensor(st.slot_mapping if ratio == 2 else st.kv_slot_mapping), _tensor(st.query_start_loc),
                _tensor(st.token_to_req, GRAPH_ROWS), _weight(s.weight), EPS, ratio, _table(s.cos_sin), cache,
                _tensor(st.kv_slot_mapping, GRAPH_ROWS, 0), latent_out=latent, fp8_scale=fp8_scale)
        for name, (owner, _) in owners.items():
            _assert_identical(f"{entry}: {name}", expected[name], owner.cpu().numpy())


def test_fused_entry_without_a_latent_writes_the_same_cache_and_ring():
    s = _build(MIXED, ratio=2, seed=50)
    k_cache, _ = _cache(s, "v41_nvfp4")
    expected = _spec_combined(s, k_cache, "v41_nvfp4", None, latent=False)
    owners = _owners(state_cache=s.state_cache, k_cache=k_cache)
    st = s.step
    vllm_v41.fused_save_compress_norm_rope_quant_insert(
        _twin(s.kv_score)[1], _tensor(st.positions), owners["state_cache"][1], _tensor(st.slot_mapping),
        _tensor(st.query_start_loc), _tensor(st.token_to_req), _weight(s.weight), EPS, 2, _table(s.cos_sin),
        owners["k_cache"][1], _tensor(st.kv_slot_mapping))
    for name in ("state_cache", "k_cache"):
        _assert_identical(name, expected[name], owners[name][0].cpu().numpy())


# ---- prefill context parallelism: prev_rows and save_ring_rows -------------------------------------------------
def test_prev_rows_give_the_latent_of_the_unsplit_chunk():
    """Request 0's chunk (positions 0..12) split across two ranks after position 6: the second rank's
    chunk starts at the odd position 7, whose group closes with row 6 gathered from the first rank
    (``prev_rows``); request 1 decodes at an odd position from the ring (``prev_row_indices = -1``).
    The second rank's latents are those of the spec on the unsplit step; its ring is untouched but
    for row 6 of request 0's block, which holds the gathered row (no chunk tail is saved)."""
    whole = _build([Request(0, 13), Request(9, 1)], ratio=2, seed=60)
    expected = _spec_compress(whole)
    split = 7  # the second rank's tokens: 7..12 of request 0, then request 1's
    st = whole.step
    rank = slice(split, st.num_tokens)
    kv_score = torch.from_numpy(np.ascontiguousarray(whole.kv_score[rank])).to(DEVICE)
    gathered = np.stack([whole.kv_score[3], whole.kv_score[split - 1], whole.kv_score[5]])  # row 1 is position 6's
    latent = torch.zeros((kv_score.shape[0], 512), dtype=torch.bfloat16, device=DEVICE)
    state_owner, state = _twin(whole.state_cache)
    qsl = st.query_start_loc - np.array([0, split, split], dtype=np.int32)
    vllm_v41.fused_save_compress_norm(
        kv_score, _tensor(st.positions[rank]), state, _tensor(st.slot_mapping[rank]), _tensor(qsl),
        _tensor(st.token_to_req[rank]), _weight(whole.weight), EPS, 2, latent,
        prev_rows=torch.from_numpy(gathered).to(DEVICE), prev_row_indices=_tensor(np.array([1, -1], dtype=np.int64)))
    want = Buffer.of(whole.latent).view_of(expected["latent"])[rank]
    active = st.kv_slot_mapping[rank] >= 0
    assert active.sum() == 4  # positions 7, 9, 11 and request 1's 9
    got = latent.view(torch.int16).cpu().numpy().view(np.uint16)
    assert np.array_equal(got[active], want[active])
    ring = whole.state_cache.copy()
    block = whole.tables.block_table[0, 0]
    ring[block, (split - 1) % whole.capacity] = whole.kv_score[split - 1]
    assert np.array_equal(Buffer.of(whole.state_cache).view_of(state_owner.cpu().numpy()), ring)


def test_save_ring_rows_stores_each_row_at_its_slot():
    rng = np.random.default_rng(7)
    capacity, blocks = 8, 5
    state = V.state_cache(blocks, capacity, rng, row_pad=16)
    rows = rng.standard_normal((4, 1024)).astype(np.float32)
    slots = np.array([2 * capacity + 3, -1, 4 * capacity, 0 * capacity + 7], dtype=np.int64)
    expected = state.copy()
    for row, slot in zip(rows, slots):
        if slot >= 0:
            expected[slot // capacity, slot % capacity] = row
    assert not np.array_equal(expected, state)
    owner, state_t = _twin(state)
    vllm_v41.save_ring_rows(torch.from_numpy(rows).to(DEVICE), _tensor(slots), state_t)
    after = owner.cpu().numpy()
    assert np.array_equal(Buffer.of(state).view_of(after), expected)
    outside = np.ones_like(after)  # the bytes outside the view: row padding and alignment slack
    Buffer.of(state).view_of(outside)[...] = 0
    assert np.array_equal(after[outside == 1], Buffer.of(state).owner[outside == 1])


# ---- errors: named, and nothing written ---------------------------------------------------------------------------
def _compress_kwargs(s: Step, **changes) -> dict:
    st = s.step
    kwargs = dict(
        kv_score=torch.from_numpy(s.kv_score.copy()), positions=torch.from_numpy(st.positions),
        state_cache=torch.from_numpy(s.state_cache.copy()), slot_mapping=torch.from_numpy(st.slot_mapping),
        query_start_loc=torch.from_numpy(st.query_start_loc), token_to_req_indices=torch.from_numpy(st.token_to_req),
        rms_norm_weight=torch.from_numpy(s.weight.view(np.int16)).view(torch.bfloat16), rms_norm_eps=EPS,
        compress_ratio=2, latent_out=torch.zeros((s.kv_score.shape[0], 512), dtype=torch.bfloat16))
    kwargs.update(changes)
    return kwargs


@pytest.mark.parametrize("changes, argument", [
    (dict(compress_ratio=4), "compress_ratio"),
    (dict(slot_mapping=torch.zeros(3, dtype=torch.int32)), "slot_mapping"),
    (dict(kv_score=torch.zeros((40, 512))), "kv_score"),
    (dict(latent_out=torch.zeros((2, 512), dtype=torch.bfloat16)), "latent_out"),
    (dict(query_start_loc=None), "query_start_loc"),
    (dict(token_to_req_indices=None), "token_to_req_indices"),
    (dict(state_cache=torch.zeros((4, 8, 512))), "state_cache"),
    (dict(prev_row_indices=torch.zeros(4, dtype=torch.int64)), "prev_row_indices"),
    (dict(prev_rows=torch.zeros((2, 512)), prev_row_indices=torch.zeros(4, dtype=torch.int64)), "prev_rows"),
    (dict(prev_rows=torch.zeros((2, 1024)), prev_row_indices=torch.zeros(1, dtype=torch.int64)), "prev_row_indices"),
    # the spec's checks (SPEC §14.8) before the save that prev_rows brings
    (dict(rms_norm_weight=torch.ones(256), prev_rows=torch.zeros((2, 1024)),
          prev_row_indices=torch.ones(4, dtype=torch.int64)), "rms_norm_weight"),
    (dict(rms_norm_weight=torch.ones(256)), "rms_norm_weight"),
])
def test_fused_save_compress_norm_refuses_before_writing(changes, argument):
    s = _build(MIXED, ratio=2, seed=70)
    kwargs = _compress_kwargs(s, **changes)
    before = {name: kwargs[name].clone() for name in ("state_cache", "latent_out")}
    with pytest.raises(ValueError, match=argument):
        vllm_v41.fused_save_compress_norm(**kwargs)
    for name, tensor in before.items():
        assert torch.equal(kwargs[name], tensor), name


def test_ratio_1_refuses_a_state_and_prev_rows():
    s = _build(MIXED, ratio=1, seed=71)
    base = dict(kv_score=torch.from_numpy(s.kv_score), positions=torch.from_numpy(s.step.positions),
                slot_mapping=torch.from_numpy(s.step.kv_slot_mapping), query_start_loc=None, token_to_req_indices=None,
                rms_norm_weight=torch.ones(512), rms_norm_eps=EPS, compress_ratio=1,
                latent_out=torch.zeros((s.kv_score.shape[0], 512), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="state_cache"):
        vllm_v41.fused_save_compress_norm(**base, state_cache=torch.zeros((2, 8, 1024)))
    with pytest.raises(ValueError, match="prev_rows"):
        vllm_v41.fused_save_compress_norm(**base, state_cache=None, prev_rows=torch.zeros((1, 1024)),
                                          prev_row_indices=torch.zeros(1, dtype=torch.int64))
    assert not base["latent_out"].any()


@pytest.mark.parametrize("cache, fp8_scale, argument", [
    (torch.zeros((2, 4, 576), dtype=torch.uint8), None, "kv_cache"),
    (torch.zeros((2, 4, 512), dtype=torch.float16), None, "kv_cache"),
    (torch.zeros((2, 4, 512), dtype=torch.uint8).view(torch.float8_e4m3fn), None, "fp8_scale"),
    (torch.zeros((2, 4, 512), dtype=torch.uint8).view(torch.float8_e4m3fn), torch.ones(2), "fp8_scale"),
    (torch.zeros((2, 4, 584), dtype=torch.uint8), None, "latent"),
])
def test_rope_quant_insert_refuses_before_writing(cache, fp8_scale, argument):
    slots = torch.tensor([0, -1, 3], dtype=torch.int64)
    latent = torch.zeros((2 if argument == "latent" else 3, 512), dtype=torch.bfloat16)
    before = cache.clone()
    with pytest.raises(ValueError, match=argument):
        vllm_v41.rope_quant_insert(latent, torch.arange(3), torch.zeros((4, 64)), cache, slots, 1, fp8_scale=fp8_scale)
    assert torch.equal(cache.view(torch.uint8), before.view(torch.uint8))


def test_indexer_k_norm_rope_store_refuses_before_writing():
    cache = torch.zeros((2, 4, 68), dtype=torch.uint8)
    slots = torch.tensor([1, 3], dtype=torch.int64)
    cases = [(dict(k_pre=torch.zeros((2, 512), dtype=torch.bfloat16)), "k_pre"),
             (dict(compress_ratio=4), "compress_ratio"),
             (dict(use_fp4_cache=False), "k_cache")]  # a 68-byte cache is indexer_mxfp4's
    for changes, argument in cases:
        kwargs = dict(k_pre=torch.zeros((2, 128), dtype=torch.bfloat16), positions=torch.tensor([1, 3]),
                      cos_sin_cache=torch.zeros((4, 64)), rms_norm_weight=torch.ones(128), rms_norm_eps=EPS, k_cache=cache,
                      kv_slot_mapping=slots, compress_ratio=2, use_fp4_cache=True)
        kwargs.update(changes)
        with pytest.raises(ValueError, match=argument):
            vllm_v41.indexer_k_norm_rope_store(**kwargs)
    assert not cache.any()


# ---- torch.compile(fullgraph=True) ----------------------------------------------------------------------------------
def _traced(function, *args, **kwargs) -> list[str]:
    """The project's ops in the one graph Dynamo traces from ``function`` (no graph break)."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(function)(*args, **kwargs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    return [str(n.target).split(".")[1] for n in explained.graphs[0].graph.nodes
            if n.op == "call_function" and str(n.target).startswith("dsv4_compressor.")]


def pair(compress: tuple, insert: tuple, fp8_scale) -> None:
    """vLLM's two calls of a layer step (``compress``: ``fused_save_compress_norm``'s first nine
    arguments; ``insert``: ``(cos_sin_cache, kv_cache, kv_slot_mapping, latent)``)."""
    cos_sin, cache, kv_slots, latent = insert
    vllm_v41.fused_save_compress_norm(*compress, latent)
    vllm_v41.rope_quant_insert(latent, compress[1], cos_sin, cache, kv_slots, compress[8], fp8_scale=fp8_scale)


def fused(compress: tuple, insert: tuple, fp8_scale) -> None:
    """The fused entry on the same arguments."""
    cos_sin, cache, kv_slots, latent = insert
    vllm_v41.fused_save_compress_norm_rope_quant_insert(*compress, cos_sin, cache, kv_slots, latent_out=latent,
                                                        fp8_scale=fp8_scale)


@pytest.mark.parametrize("ratio, layout", [(2, "v41_nvfp4"), (1, "fp8_per_tensor")])
def test_the_pair_and_the_fused_entry_trace_and_write_the_specs_bytes(ratio, layout):
    """A fullgraph-compiled layer step calling vLLM's pair, then one calling the fused entry: each
    traces with no graph break (ratio 2's ring metadata derived by torch ops in the graph), one op
    per call, and writes the spec's combined call's bytes. ``fp8_scale`` is a Python float (a
    tensor's ``.item()`` cannot reach the op's float argument under Dynamo)."""
    s = _build(MIXED, ratio=ratio, seed=90 + ratio, entries_per_page=2)
    k_cache, fp8_scale = _cache(s, layout)
    expected = _spec_combined(s, k_cache, layout, fp8_scale)
    st = s.step

    def arguments():
        """Fresh buffers: (owners, compress arguments, insert arguments)."""
        owners = _owners(latent=s.latent, state_cache=s.state_cache, k_cache=k_cache, layout=layout)
        compress = (_twin(s.kv_score)[1], _tensor(st.positions, GRAPH_ROWS, 10**6),
                    owners["state_cache"][1] if ratio == 2 else None,
                    _tensor(st.slot_mapping if ratio == 2 else st.kv_slot_mapping), _tensor(st.query_start_loc),
                    _tensor(st.token_to_req, GRAPH_ROWS), _weight(s.weight), EPS, ratio)
        return owners, compress, (_table(s.cos_sin), owners["k_cache"][1], _tensor(st.kv_slot_mapping),
                                  owners["latent"][1])

    ops = {pair: ["triton_v41_compress_norm", "triton_v41_rope_quant_store"],
           fused: ["triton_v41_compress_norm_rope_store"]}
    for entry, entry_ops in ops.items():
        assert _traced(entry, *arguments()[1:], fp8_scale) == entry_ops
        owners, compress, insert = arguments()
        torch.compile(entry, fullgraph=True, backend="aot_eager")(compress, insert, fp8_scale)
        for name, (owner, _) in owners.items():
            _assert_identical(f"{entry.__name__}: {name}", expected[name], owner.cpu().numpy())


def test_the_index_key_and_the_ring_save_trace():
    s = _build(MIXED, ratio=2, seed=95)
    rng = np.random.default_rng(5)
    k_pre, weight = V.k_pre(s.num_tokens + GRAPH_ROWS, rng), B.random_norm_weight(rng, bf16=True, head_dim=128)
    k_cache = B.canary_k_cache("indexer_mxfp4", s.tables.num_pages, s.tables.entries_per_page, page_pad_bytes=16)
    k_owner_np, k_view = _copy(k_cache)
    spec.v41_index_key_store(k_pre[:s.num_tokens], s.step.positions, s.step.kv_slot_mapping, weight, EPS, s.cos_sin,
                             k_view, compress_ratio=2, layout="indexer_mxfp4")
    arguments = (_twin(k_pre)[1], _tensor(s.step.positions, GRAPH_ROWS), _table(s.cos_sin), _weight(weight), EPS)
    assert _traced(vllm_v41.indexer_k_norm_rope_store, *arguments, _twin(k_cache)[1], _tensor(s.step.kv_slot_mapping),
                   2, True) == ["triton_v41_index_key_store"]
    k_owner, k_tensor = _twin(k_cache)
    torch.compile(vllm_v41.indexer_k_norm_rope_store, fullgraph=True, backend="aot_eager")(
        *arguments, k_tensor, _tensor(s.step.kv_slot_mapping), 2, True)
    _assert_written("k_cache", Buffer.of(k_cache).owner, k_owner_np)
    _assert_identical("k_cache", k_owner_np, k_owner.cpu().numpy())

    rows = torch.from_numpy(rng.standard_normal((3, 1024)).astype(np.float32))
    state = torch.zeros((4, 8, 1024))
    slots = torch.tensor([13, -1, 30])
    assert _traced(vllm_v41.save_ring_rows, rows, slots, state) == ["triton_v41_compress_norm"]
    state.zero_()
    torch.compile(vllm_v41.save_ring_rows, fullgraph=True, backend="aot_eager")(rows, slots, state)
    assert torch.equal(state[1, 5], rows[0]) and torch.equal(state[3, 6], rows[2]) and int((state != 0).sum()) == 2048


def test_what_does_not_trace_is_what_the_docs_say():
    """A tensor ``fp8_scale`` (read with ``.item()``, which the op's float argument cannot take under
    Dynamo) fails a fullgraph compile; ``prev_rows`` breaks the graph at the compress's host checks,
    made before the save writes anything."""
    s = _build([Request(3, 1), Request(0, 2)], ratio=2, seed=96, entries_per_page=2)
    k_cache, fp8_scale = _cache(s, "fp8_per_tensor")
    latent = torch.zeros((s.num_tokens, 512), dtype=torch.bfloat16, device=DEVICE)
    st = s.step
    insert = (latent, _tensor(st.positions), _table(s.cos_sin), _twin(k_cache, "float8_e4m3fn")[1],
              _tensor(st.kv_slot_mapping), 2)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="fp8_scale"):
        torch.compile(vllm_v41.rope_quant_insert, fullgraph=True, backend="eager")(
            *insert, fp8_scale=torch.tensor([fp8_scale], device=DEVICE))
    compress = (_twin(s.kv_score)[1], _tensor(st.positions), _twin(s.state_cache)[1], _tensor(st.slot_mapping),
                _tensor(st.query_start_loc), _tensor(st.token_to_req), _weight(s.weight), EPS, 2, latent)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(vllm_v41.fused_save_compress_norm)(
        *compress, prev_rows=torch.zeros((1, 1024), device=DEVICE),
        prev_row_indices=_tensor(np.array([0, -1], dtype=np.int64)))
    assert explained.graph_break_count > 0
    assert all("validation.py" in reason.user_stack[-1].filename for reason in explained.break_reasons)


# ---- GPU: engine-like sizes --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [1, 2])
def test_pair_on_the_gpu(ratio):
    requests = [Request(0, 300), Request(77, 120), Request(1001, 1), Request(64, 4)]
    s = _build(requests, ratio=ratio, seed=80 + ratio, entries_per_page=64, num_padding=13)
    k_cache, _ = _cache(s, "v41_mxfp8")
    expected = _spec_combined(s, k_cache, "v41_mxfp8", None)
    owners = _owners(latent=s.latent, state_cache=s.state_cache, k_cache=k_cache)
    latent, state = owners["latent"][1], owners.get("state_cache", (None, None))[1]
    _vllm_compress(s, latent, state)
    _vllm_insert(s, latent, owners["k_cache"][1], None)
    torch.cuda.synchronize()
    for name, (owner, _) in owners.items():
        _assert_identical(name, expected[name], owner.cpu().numpy())
