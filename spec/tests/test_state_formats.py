"""SPEC §13: the state formats (bf16 state, ``ape_at``, ring addressing) and ``compress_and_save``,
each against an independent formulation: a float64 rounding, the default's bytes, a paged twin
of a ring, and §13.4's equivalence with save-then-compress."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec.arithmetic import add
from dsv4_compressor.spec.constants import ratio_config
from dsv4_compressor.spec.formats import bf16_bits, bf16_to_f32
from dsv4_compressor.spec.pooling import window_positions
from dsv4_compressor.spec.rows import ChunkInputs, window_rows
from dsv4_compressor.spec.state_format import PAGED_FP32, StateFormat

F32 = np.float32
STATE_BLOCK = {4: 4, 128: 8}
ENTRIES = {4: 8, 128: 2}


# ---- an independent bf16 rounding ---------------------------------------------------------------
def bf16_ideal(x: np.ndarray) -> np.ndarray:
    """Round binary32 values to bf16 in float64 arithmetic: the multiple of the value's bf16 spacing
    (8 significant bits; subnormal spacing 2^-133) nearest to it, ties to an even multiple."""
    v = np.asarray(x, dtype=F32).astype(np.float64)
    exponent = np.floor(np.log2(np.maximum(np.abs(v), 2.0**-149)))
    spacing = np.ldexp(1.0, (np.maximum(exponent, -126) - 7).astype(np.int64))
    return np.round(v / spacing) * spacing  # the quotient is exact; np.round ties to even


def _bf16_state(state: np.ndarray) -> np.ndarray:
    """A bf16 state (uint16 patterns, 16-byte aligned, padded like ``state``) with ``state``'s values rounded."""
    out = B.padded_view(state.shape, np.uint16, (0, 0, 8), np.uint16(0x7FC0))
    out[...] = bf16_bits(state)
    return out


# ---- one step ------------------------------------------------------------------------------------
@dataclass
class Step:
    """A step's metadata, buffers and projections (kv and raw score as two [T, SW] views)."""

    batch: B.Batch
    state: np.ndarray  # float32 or uint16 [blocks, bs, 2*SW]
    kv: np.ndarray  # float32 [T, SW]
    score: np.ndarray  # float32 [T, SW]
    ape: np.ndarray  # float32 [r, SW]
    weight: np.ndarray
    cos_sin: np.ndarray
    k_cache: np.ndarray
    layout: str = "flashmla_fp8"

    @property
    def kv_score(self) -> np.ndarray:
        return np.concatenate([self.kv, self.score], axis=1)


def make_step(ratio: int, requests, seed: int, *, head_dim: int = 512, layout: str = "flashmla_fp8",
              num_padding: int = 2, bf16: bool = False) -> Step:
    rng = np.random.default_rng(seed)
    bs, entries = STATE_BLOCK[ratio], ENTRIES[ratio]
    b = B.build_batch(requests, compress_ratio=ratio, block_size=bs, entries_per_page=entries, rng=rng,
                      num_padding=num_padding)
    state = B.random_state_cache(b.num_state_blocks, bs, ratio, rng, row_pad=8, head_dim=head_dim)
    projections = np.empty((b.num_tokens, ratio_config(ratio, head_dim).state_row_width + 4), F32)[:, :-4]  # padded rows
    projections[...] = B.random_kv_score(b.num_tokens, ratio, rng, head_dim=head_dim)
    width = projections.shape[1] // 2
    return Step(
        batch=b, state=_bf16_state(state) if bf16 else state, kv=projections[:, :width], score=projections[:, width:],
        ape=B.random_ape(ratio, rng, head_dim=head_dim), weight=B.random_norm_weight(rng, bf16=False, head_dim=head_dim),
        cos_sin=B.rope_cos_sin_cache(int(b.positions.max()) + 1), k_cache=B.canary_k_cache(layout, b.num_pages, entries),
        layout=layout,
    )


def with_history(step: Step, ape_at: str, seed: int = 99) -> Step:
    """``step`` with a state whose every row earlier steps saved with ``ape_at``."""
    state = Buffer.of(step.state)
    B.save_history(step.batch, state.view_of(state.owner), step.ape, np.random.default_rng(seed), ape_at=ape_at)
    return replace(step, state=state.view_of(state.owner))


def save_then_compress(step: Step, *, batch=None, state=None, ape_at="save", ring_capacity=None) -> tuple[Buffer, Buffer]:
    """SPEC §4 then §5-§7 on copies; returns (state allocation, k_cache allocation)."""
    b = batch or step.batch
    state_buffer, k_buffer = Buffer.of(step.state if state is None else state), Buffer.of(step.k_cache)
    state_view, k_view = state_buffer.view_of(state_buffer.owner), k_buffer.view_of(k_buffer.owner)
    spec.save_partial_states(step.kv_score, step.ape if ape_at == "save" else None, b.positions, b.slot_mapping, state_view,
                             b.block_size, ape_at=ape_at, ring_capacity=ring_capacity, debug=True)
    spec.compress_norm_rope_store(state_view, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                                  step.weight, 1e-6, step.cos_sin, k_view, b.kv_slot_mapping, compress_ratio=b.compress_ratio,
                                  layout=step.layout, ape=step.ape, ape_at=ape_at, ring_capacity=ring_capacity, debug=True)
    return state_buffer, k_buffer


def compress_and_save(step: Step, *, batch=None, state=None, ape_at="save", save_slot_mapping=None,
                      kv=None, score=None) -> tuple[Buffer, Buffer]:
    """SPEC §13.4 on copies; returns (state allocation, k_cache allocation)."""
    b = batch or step.batch
    state_buffer, k_buffer = Buffer.of(step.state if state is None else state), Buffer.of(step.k_cache)
    state_view, k_view = state_buffer.view_of(state_buffer.owner), k_buffer.view_of(k_buffer.owner)
    spec.compress_and_save(
        step.kv if kv is None else kv, step.score if score is None else score, step.ape, b.positions, b.token_to_req_indices,
        b.query_start_loc, b.slot_mapping, b.save_slot_mapping if save_slot_mapping is None else save_slot_mapping,
        b.block_table, b.block_size, state_view, step.weight, 1e-6, step.cos_sin, k_view, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=step.layout, fp8_scale=None, ape_at=ape_at, ring_capacity=b.ring_capacity,
        hadamard=False, debug=True)
    return state_buffer, k_buffer


def _mixed(ratio: int, long: int = 0) -> list[B.Request]:
    """Decode tokens (boundary and not), a first window, and prefill chunks, one of ``long`` tokens."""
    return [B.Request(3 * ratio - 1, 1), B.Request(5 * ratio - 2, 1), B.Request(0, ratio + 1),
            B.Request(2 * ratio + 1, 2 * ratio + 3)] + ([B.Request(ratio - 2, long)] if long else [])


# ---- the descriptor ------------------------------------------------------------------------------
def test_a_position_row_is_paged_or_in_the_ring():
    table = np.array([[7, 3, 9, 4], [1, 2, 5, 6]], np.int32)
    positions = np.array([0, 5, 13, 26], np.int64)
    paged = PAGED_FP32.row_of(table, np.array([1, 1, 0]), positions[:3], 4)
    assert [b.tolist() for b in paged] == [[1, 2, 4], [0, 1, 1]]
    ring = StateFormat(ring_capacity=8).row_of(table, np.array([1, 1, 0, 0]), positions, 4)
    assert [b.tolist() for b in ring] == [[1, 2, 3, 7], [0, 1, 1, 2]]  # 13 mod 8 = 5, 26 mod 8 = 2


def test_the_descriptor_takes_its_dtype_from_the_state_tensor():
    assert StateFormat.of(np.zeros((1, 4, 8), F32)) == PAGED_FP32
    assert StateFormat.of(np.zeros((1, 4, 8), np.uint16), "compress", 16) == StateFormat("bf16", "compress", 16)
    with pytest.raises(ValueError, match="state_cache"):
        StateFormat.of(np.zeros((1, 4, 8), np.float64))
    for bad in (dict(dtype="fp16"), dict(ape_at="pool"), dict(ring_capacity=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StateFormat(**bad)


def test_bf16_storage_rounds_once_to_nearest_even_and_reads_back_exactly():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 0x7F7F0000, size=200_000, dtype=np.uint32)
    ties = (rng.integers(0, 0x7F7F, size=20_000, dtype=np.uint32) << np.uint32(16)) | np.uint32(0x8000)
    x = np.concatenate([random_bits, ties, np.array([0, 1, 0x7FFF, 0x8000, 0x00018000, 0x7F7E8000], np.uint32)]).view(F32)
    x = np.concatenate([x, -x])
    fmt = StateFormat("bf16")
    stored = fmt.encode(x)
    assert stored.dtype == np.uint16
    assert np.array_equal(fmt.decode(stored).astype(np.float64), bf16_ideal(x))
    assert np.array_equal(np.signbit(fmt.decode(stored)), np.signbit(x))
    assert np.array_equal(fmt.encode(fmt.decode(stored)), stored)  # a bf16 value is stored as itself
    assert np.array_equal(PAGED_FP32.encode(x).view(np.uint32), x.view(np.uint32))


# ---- §13.1 and §13.2: the save -----------------------------------------------------------------
@pytest.mark.parametrize("ape_at", ["save", "compress"])
@pytest.mark.parametrize("ratio, head_dim", [(4, 512), (128, 512), (4, 128)])
def test_a_bf16_save_stores_each_element_rounded_once(ratio, head_dim, ape_at):
    step = make_step(ratio, _mixed(ratio), 1, head_dim=head_dim, bf16=True)
    b = step.batch
    state = Buffer.of(step.state)
    view = state.view_of(state.owner)
    spec.save_partial_states(step.kv_score, step.ape if ape_at == "save" else None, b.positions, b.slot_mapping, view,
                             b.block_size, ape_at=ape_at)
    saved = np.flatnonzero(b.slot_mapping >= 0)
    slots = b.slot_mapping[saved]
    rows = view[slots // b.block_size, slots % b.block_size]
    width = step.kv.shape[1]
    stored_score = add(step.score[saved], step.ape[b.positions[saved] % ratio]) if ape_at == "save" else step.score[saved]
    assert np.array_equal(bf16_to_f32(rows[:, :width]).astype(np.float64), bf16_ideal(step.kv[saved]))
    assert np.array_equal(bf16_to_f32(rows[:, width:]).astype(np.float64), bf16_ideal(stored_score))
    before = Buffer.of(step.state)
    before.view_of(before.owner)[slots // b.block_size, slots % b.block_size] = rows
    assert np.array_equal(before.owner, state.owner), "the save wrote outside the saved rows"


@pytest.mark.parametrize("ratio", [4, 128])
def test_ape_at_compress_with_an_fp32_state_gives_the_default_entries_but_other_state_bytes(ratio):
    step = make_step(ratio, _mixed(ratio), 2)
    default_state, default_k = save_then_compress(with_history(step, "save"))
    state, k = save_then_compress(with_history(step, "compress"), ape_at="compress")
    assert np.array_equal(k.owner, default_k.owner)
    assert not np.array_equal(state.owner, default_state.owner)
    b, width = step.batch, step.kv.shape[1]
    slots = b.slot_mapping[b.slot_mapping >= 0]
    rows = state.view_of(state.owner)[slots // b.block_size, slots % b.block_size]
    assert np.array_equal(rows[:, width:].view(np.uint32), step.score[b.slot_mapping >= 0].view(np.uint32))  # raw score


@pytest.mark.parametrize("ratio", [4, 128])
def test_a_bf16_state_pools_like_an_fp32_state_holding_what_pooling_reads(ratio):
    """bf16 state: x from the bf16 rows equals x from an fp32 state whose score already holds
    ``add(bf16(score), ape)`` (ape_at="compress") or ``bf16(add(score, ape))`` (ape_at="save");
    the two differ."""
    step = make_step(ratio, _mixed(ratio), 3, bf16=True)
    b = step.batch
    xs = {}
    for ape_at in ("save", "compress"):
        state, _ = save_then_compress(step, ape_at=ape_at)
        bf16_view = state.view_of(state.owner)
        fp32 = B.padded_view(bf16_view.shape, F32, (0, 0, 4), F32(np.nan))
        fp32[...] = bf16_to_f32(bf16_view)
        width = step.kv.shape[1]
        if ape_at == "compress":  # the independent form: every row's pooled score, added here
            table_pos = np.arange(b.block_table.shape[1] * b.block_size)
            for req in range(b.block_table.shape[0]):
                for p in table_pos:
                    block = b.block_table[req, p // b.block_size]
                    if block >= 0:
                        fp32[block, p % b.block_size, width:] = add(fp32[block, p % b.block_size, width:], step.ape[p % ratio])
        args = (b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size, b.kv_slot_mapping)
        x = spec.compress(bf16_view, *args, compress_ratio=ratio, ape=step.ape, ape_at=ape_at)
        assert np.array_equal(x.view(np.uint32), spec.compress(fp32, *args, compress_ratio=ratio).view(np.uint32))
        xs[ape_at] = x
    active = b.active
    assert not np.array_equal(xs["save"][active].view(np.uint32), xs["compress"][active].view(np.uint32))


# ---- §13.3: ring addressing ---------------------------------------------------------------------
def test_the_save_writes_the_same_bytes_with_a_ring_capacity():
    step = make_step(4, _mixed(4), 4)
    ringed, ring = B.as_ring(step.batch, step.state, 16, np.random.default_rng(0))
    buffers = []
    for capacity in (None, 16):
        buffer = Buffer.of(ring)
        spec.save_partial_states(step.kv_score, step.ape, ringed.positions, ringed.slot_mapping, buffer.view_of(buffer.owner),
                                 4, ring_capacity=capacity)
        buffers.append(buffer.owner)
    assert np.array_equal(*buffers)


@pytest.mark.parametrize("ratio, capacity", [(4, 8), (4, 12), (128, 128), (128, 136)])
def test_a_ring_that_holds_the_window_gives_the_paged_entries(ratio, capacity):
    """Decode tokens and chunks of at most C - W + 1 tokens: saved into the ring, then pooled from it."""
    w = ratio_config(ratio).window
    chunk = capacity - w + 1
    requests = [B.Request(3 * ratio - 1, 1), B.Request(5 * ratio - 2, 1), B.Request(3 * ratio - chunk, chunk),
                B.Request(7 * ratio - 1, 1)]
    step = make_step(ratio, requests, 5)
    _, paged_k = save_then_compress(step)
    ringed, ring = B.as_ring(step.batch, step.state, capacity, np.random.default_rng(1))
    _, ring_k = save_then_compress(step, batch=ringed, state=ring, ring_capacity=capacity)
    assert step.batch.num_active >= 3
    assert np.array_equal(ring_k.owner, paged_k.owner)


# ---- §13.4: compress_and_save ---------------------------------------------------------------------
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("ape_at", ["save", "compress"])
@pytest.mark.parametrize("ratio, head_dim, layout", [(4, 512, "flashmla_fp8"), (128, 512, "bf16"), (4, 128, "indexer_fp8")])
def test_compress_and_save_equals_save_then_compress_with_every_token_saved(ratio, head_dim, layout, ape_at, bf16):
    """SPEC §13.4's last sentence: paged addressing and save_slot_mapping = slot_mapping."""
    step = make_step(ratio, _mixed(ratio, long=3 * ratio + 2), 6, head_dim=head_dim, layout=layout, bf16=bf16)
    assert step.batch.num_active >= 4
    expected_state, expected_k = save_then_compress(step, ape_at=ape_at)
    state, k = compress_and_save(step, ape_at=ape_at)
    assert np.array_equal(state.owner, expected_state.owner)
    assert np.array_equal(k.owner, expected_k.owner)


def test_compress_and_save_reads_the_chunk_from_its_inputs_not_the_state():
    """Rows at or after a chunk's start come from kv/score: with every save disabled the state
    is never written, and the entries are still those of save-then-compress."""
    step = make_step(4, _mixed(4, long=9), 7)
    _, expected_k = save_then_compress(step)
    untouched = Buffer.of(step.state)
    state, k = compress_and_save(step, save_slot_mapping=np.full(step.batch.num_tokens, -1, np.int64))
    assert np.array_equal(k.owner, expected_k.owner)
    assert np.array_equal(state.owner, untouched.owner)


@st.composite
def step_recipes(draw):
    ratio = draw(st.sampled_from([4, 128]))
    head_dim = draw(st.sampled_from([512, 128])) if ratio == 4 else 512
    longest = 40 if ratio == 4 else 300
    requests = draw(st.lists(st.tuples(st.integers(0, 3 * ratio), st.integers(1, longest)), min_size=1, max_size=3))
    w = ratio_config(ratio).window
    capacity = w + STATE_BLOCK[ratio] * draw(st.integers(0, 3))
    return dict(ratio=ratio, head_dim=head_dim, requests=[B.Request(*r) for r in requests], capacity=capacity,
                bf16=draw(st.booleans()), ape_at=draw(st.sampled_from(["save", "compress"])), seed=draw(st.integers(0, 2**20)),
                layout="flashmla_fp8" if head_dim == 512 else draw(st.sampled_from(["indexer_fp8", "indexer_mxfp4"])))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_recipes())
def test_compress_and_save_is_save_then_compress_and_a_ring_gives_the_same_entries(recipe):
    """On any step of a state saved in its format: compress_and_save with every token saved
    equals save-then-compress (state and cache bytes), and the same step on a ring of C rows
    (tail saves; chunks of any length) writes the same cache bytes."""
    step = make_step(recipe["ratio"], recipe["requests"], recipe["seed"], head_dim=recipe["head_dim"], layout=recipe["layout"],
                     bf16=recipe["bf16"])
    step = with_history(step, recipe["ape_at"])
    expected_state, expected_k = save_then_compress(step, ape_at=recipe["ape_at"])
    state, k = compress_and_save(step, ape_at=recipe["ape_at"])
    assert np.array_equal(state.owner, expected_state.owner)
    assert np.array_equal(k.owner, expected_k.owner)
    ringed, ring = B.as_ring(step.batch, step.state, recipe["capacity"], np.random.default_rng(recipe["seed"]))
    _, ring_k = compress_and_save(step, batch=ringed, state=ring, ape_at=recipe["ape_at"])
    assert np.array_equal(ring_k.owner, expected_k.owner)


# ---- steps of an engine: a ring against a paged twin -------------------------------------------------
class TwoEngines:
    """Requests run step by step with ``compress_and_save`` on a paged state that saves every token
    and on a ring state of ``C`` rows per request that saves each chunk's tail; both start empty
    (every request at position 0) and get the same projections. A token's projections are its
    position's "true" ones, except for drafts (fresh values, as a rejected draft has)."""

    def __init__(self, ratio: int, capacity: int, num_reqs: int, max_pos: int, seed: int, *, bf16: bool = False,
                 ape_at: str = "save"):
        self.ratio, self.capacity, self.ape_at = ratio, capacity, ape_at
        self.rng = np.random.default_rng(seed)
        self.bs, self.entries = STATE_BLOCK[ratio], ENTRIES[ratio]
        config = ratio_config(ratio)
        self.width = config.state_width
        columns, ring_columns = max_pos // self.bs + 1, capacity // self.bs
        self.paged_table = self.rng.permutation(num_reqs * columns + 2)[:num_reqs * columns].reshape(num_reqs, columns).astype(np.int32)
        self.ring_table = self.rng.permutation(num_reqs * ring_columns + 2)[:num_reqs * ring_columns].reshape(num_reqs, ring_columns).astype(np.int32)
        pages = max_pos // ratio // self.entries + 1
        self.kv_table = self.rng.permutation(num_reqs * pages + 1)[:num_reqs * pages].reshape(num_reqs, pages).astype(np.int32)
        self.true = self.rng.standard_normal((num_reqs, max_pos, 2 * self.width)).astype(F32)
        self.ape = B.random_ape(ratio, self.rng)
        self.weight = B.random_norm_weight(self.rng, bf16=True)
        self.cos_sin = B.rope_cos_sin_cache(max_pos)
        self.states = {}
        for name, blocks in (("paged", num_reqs * columns + 2), ("ring", num_reqs * ring_columns + 2)):
            state = B.random_state_cache(blocks, self.bs, ratio, self.rng, row_pad=4)
            self.states[name] = Buffer.of(_bf16_state(state) if bf16 else state)
        k = Buffer.of(B.canary_k_cache("flashmla_fp8", self.kv_table.size + 1, self.entries))
        self.k = {"paged": k, "ring": replace(k, owner=k.owner.copy())}  # one layout: the allocations compare byte by byte

    def step(self, chunks: list[tuple[int, int, int, int]], num_padding: int = 2) -> int:
        """One call: ``(request, first position, tokens, drafts)`` per request, the last ``drafts``
        tokens with fresh projections. Returns the number of active tokens."""
        chunks = sorted(chunks)  # packed request by request: query_start_loc[req] is request req's first token
        req_index = np.concatenate([np.full(n, q, np.int32) for q, _, n, _ in chunks] + [np.zeros(num_padding, np.int32)])
        positions = np.concatenate([np.arange(p, p + n) for _, p, n, _ in chunks] + [np.zeros(num_padding)]).astype(np.int64)
        real = np.arange(positions.shape[0]) < positions.shape[0] - num_padding
        counts = np.zeros(self.paged_table.shape[0], np.int64)
        for q, _, n, _ in chunks:
            counts[q] = n
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        projections = np.zeros((positions.shape[0], 2 * self.width), F32)
        for q, p, n, drafts in chunks:
            first = starts[q]
            projections[first:first + n] = self.true[q, p:p + n]
            projections[first + n - drafts:first + n] = self.rng.standard_normal((drafts, 2 * self.width)).astype(F32)
        boundary = real & ((positions + 1) % self.ratio == 0)
        entry = positions // self.ratio
        kv_slots = np.where(boundary, self.kv_table[req_index, entry // self.entries].astype(np.int64) * self.entries
                            + entry % self.entries, -1)
        paged_slots = self.paged_table[req_index, positions // self.bs].astype(np.int64) * self.bs + positions % self.bs
        paged_slots = np.where(real, paged_slots, -1)
        ring_slots = np.where(real, B.ring_slots(self.ring_table, req_index, positions, self.capacity, self.bs), -1)
        kv, score = projections[:, :self.width], projections[:, self.width:]
        for name, table, slots, saves, capacity in (
            ("paged", self.paged_table, paged_slots, paged_slots, None),
            ("ring", self.ring_table, ring_slots, B.tail_saves(ring_slots, starts, self.capacity), self.capacity),
        ):
            state, k = self.states[name], self.k[name]
            spec.compress_and_save(kv, score, self.ape, positions, req_index, starts, slots, saves, table, self.bs,
                                   state.view_of(state.owner), self.weight, 1e-6, self.cos_sin, k.view_of(k.owner), kv_slots,
                                   compress_ratio=self.ratio, ape_at=self.ape_at, ring_capacity=capacity, debug=True)
        return int(np.count_nonzero(boundary))

    def same_entries(self) -> bool:
        return np.array_equal(self.k["paged"].owner, self.k["ring"].owner)


@pytest.mark.parametrize("bf16, ape_at", [(False, "save"), (True, "compress")])
@pytest.mark.parametrize("ratio, capacity", [(4, 8), (4, 12), (128, 136)])
def test_a_chunk_longer_than_the_ring_then_decode_steps_give_the_paged_entries(ratio, capacity, bf16, ape_at):
    """Chunked prefill longer than the ring (only its tail saved), more chunks, then decode
    steps whose windows reach back into the ring."""
    w = ratio_config(ratio).window
    engines = TwoEngines(ratio, capacity, 2, 3 * capacity + 4 * ratio, 11, bf16=bf16, ape_at=ape_at)
    first, second = 2 * capacity + 3, capacity + w - 2
    active = engines.step([(0, 0, first, 0), (1, 0, ratio - 1, 0)])
    assert engines.same_entries() and active >= 2
    active = engines.step([(1, ratio - 1, second, 0), (0, first, ratio, 0)])
    assert engines.same_entries() and active >= 2
    for n in range(ratio + 1):
        engines.step([(0, first + ratio + n, 1, 0), (1, ratio - 1 + second + n, 1, 0)])
        assert engines.same_entries()


@pytest.mark.parametrize("ratio, capacity", [(4, 8), (4, 12), (128, 136)])
def test_the_ring_survives_at_most_c_minus_w_plus_1_rejected_drafts(ratio, capacity):
    """A verify group of k+1 tokens with a boundary inside (every draft saved, all rejected),
    then the true token at the first rejected position, a boundary: with C - W + 1 rejected
    drafts its window is intact in the ring; with one more the ring has lost the window's
    oldest row and the entry differs from the paged twin's."""
    w = ratio_config(ratio).window
    survivable = capacity - w + 1
    restart = ratio * (-(-(capacity + w) // ratio) + 1) - 1  # a boundary: the position after the accepted tokens
    for rejected, survives in ((survivable, True), (survivable + 1, False)):
        engines = TwoEngines(ratio, capacity, 1, restart + capacity + 2 * ratio, 12)
        engines.step([(0, 0, restart - 1, 0)])
        engines.step([(0, restart - 1, rejected + 1, rejected)])  # the last accepted token and its drafts, all rejected
        assert engines.same_entries()
        assert engines.step([(0, restart, 1, 0)]) == 1  # the true token at the first rejected position
        assert engines.same_entries() == survives, f"{rejected} rejected drafts"


# ---- the row function, as another compressor would use it ------------------------------------------
def test_window_rows_without_ape_gives_the_raw_rows_from_the_state_and_the_chunk():
    """No ape: a chunk row is the stored value read back (R(kv), R(score)), a state row its
    decoded bits; the ring wraps; invalid rows are +0."""
    rng = np.random.default_rng(4)
    fmt = StateFormat("bf16", "compress", 8)
    table = np.array([[2, 0], [1, 3]], np.int32)
    state = bf16_bits(rng.standard_normal((4, 4, 4)).astype(F32))  # SW = 2
    kv, score = rng.standard_normal((5, 2)).astype(F32), rng.standard_normal((5, 2)).astype(F32)
    chunk = ChunkInputs(kv=kv, score=score, positions=np.array([10, 11, 12, 0, 1], np.int64),
                        query_start_loc=np.array([0, 3, 5], np.int32))
    window = np.array([[7, 8, 9, 10, 11], [-3, -2, -1, 0, 1]], np.int64)  # tokens at positions 11 and 1
    rows = window_rows(window, np.array([0, 1], np.int32), fmt, state, table, 4, chunk)
    assert rows.valid.tolist() == [[True] * 5, [False, False, False, True, True]]
    assert rows.from_chunk.tolist() == [[False, False, False, True, True], [False, False, False, True, True]]
    assert np.array_equal(rows.kv[0, 3], bf16_to_f32(bf16_bits(kv[0])))  # position 10: token 0
    assert np.array_equal(rows.score[0, 4], bf16_to_f32(bf16_bits(score[1])))  # raw: no ape
    assert np.array_equal(rows.score[1, 4], bf16_to_f32(bf16_bits(score[4])))
    assert np.array_equal(rows.kv[0, 0], bf16_to_f32(state[0, 3, :2]))  # position 7: ring slot 7 = block_table[0, 1], row 3
    assert np.array_equal(rows.score[0, 1], bf16_to_f32(state[2, 0, 2:]))  # position 8: ring slot 0
    assert np.all(rows.kv[1, :3] == 0) and np.all(rows.score[1, :3] == 0)
    paged = window_rows(window - 4, np.array([0, 1], np.int32), PAGED_FP32, bf16_to_f32(state), table, 4)
    assert not paged.from_chunk.any() and paged.valid.sum() == 5
    assert np.array_equal(paged.kv[0, 0], bf16_to_f32(state[2, 3, :2]))  # position 3: block_table[0, 0], row 3
    assert np.array_equal(paged.score[0, 4], bf16_to_f32(state[0, 3, 2:]))  # position 7: block_table[0, 1], row 3


def test_window_rows_add_ape_where_the_format_says():
    rng = np.random.default_rng(5)
    state = rng.standard_normal((2, 4, 4)).astype(F32)
    ape = rng.standard_normal((4, 2)).astype(F32)
    kv, score = rng.standard_normal((2, 2)).astype(F32), rng.standard_normal((2, 2)).astype(F32)
    chunk = ChunkInputs(kv=kv, score=score, positions=np.array([6, 7], np.int64), query_start_loc=np.array([0, 2], np.int32))
    window = np.array([[4, 5, 6, 7]], np.int64)
    table = np.array([[1, 0]], np.int32)
    for ape_at in ("save", "compress"):
        rows = window_rows(window, np.array([0]), StateFormat(ape_at=ape_at), state, table, 4, chunk, ape)
        from_state = state[0, :2, 2:] if ape_at == "save" else add(state[0, :2, 2:], ape[:2])
        assert np.array_equal(rows.score[0, :2], from_state)  # positions 4, 5: block_table[0, 1] = 0
        assert np.array_equal(rows.score[0, 2:], add(score, ape[2:]))  # positions 6, 7 from the chunk: the same add
