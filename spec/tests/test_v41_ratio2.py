"""SPEC §14.3 at ratio 2: the softmax-then-sum against float64, by hand on scores that decide the
weights, the save-then-compress identity, and multi-step runs (prefill chunks longer than the
ring, decode, verify steps with rejected drafts, padding) whose latents are checked against rows
looked up by hand from the run's history, for a paged state, the reference's ring of 2 and
vLLM's ring, with fp32 and bf16 states and inputs."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4_compressor import spec
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.formats import bf16, bf16_to_f32
from dsv4_compressor.spec.rows import window_rows
from dsv4_compressor.spec.state import save_rows
from dsv4_compressor.spec.state_format import StateFormat
from dsv4_compressor.spec.v41_compress import StateArguments, latent_of, pooled_ratio2, softmax_then_sum
import v41_float64 as F

F32 = np.float32
EPS = 1e-6
CANARY16 = B.CANARY_BYTE * 0x0101


def _f32(values: np.ndarray) -> np.ndarray:
    return bf16_to_f32(values) if values.dtype == np.uint16 else values


def _weight32(weight: np.ndarray) -> np.ndarray:
    return bf16_to_f32(weight) if weight.dtype == np.uint16 else weight


@dataclass
class Ratio2Step:
    """One ratio-2 call's arguments (state layout ``layout``), built by :func:`ratio2_step`."""

    tables: V.V41Tables
    step: V.V41Step
    kv: np.ndarray
    score: np.ndarray
    state_cache: np.ndarray
    weight: np.ndarray

    def arguments(self, latent: np.ndarray) -> dict:
        s, t = self.step, self.tables
        return dict(kv=self.kv, score=self.score, positions=s.positions, token_to_req=s.token_to_req,
                    query_start_loc=s.query_start_loc, slot_mapping=s.slot_mapping, save_slot_mapping=s.save_slot_mapping,
                    block_table=t.block_table, bs=t.state.block_size, state_cache=self.state_cache,
                    rms_norm_weight=self.weight, rms_norm_eps=EPS, kv_slot_mapping=s.kv_slot_mapping, latent=latent,
                    compress_ratio=2, ring_capacity=t.state.ring_capacity)


def ratio2_step(seed: int, layout: V.StateLayout, *, bf16_state=False, bf16_inputs=False, requests=None,
                unslotted: float = 0.1) -> Ratio2Step:
    rng = np.random.default_rng(seed)
    # decode tokens at odd positions (their row p - 1 from the state) and one at an even one; chunks from 0 and from 9
    requests = requests or [Request(2 * int(rng.integers(0, 20)) + 1 - (i == 3), 1) for i in range(4)] + [
        Request(0, 7), Request(9, 6)]
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=2, state=layout,
                          entries_per_page=4, rng=rng)
    step = V.v41_step(tables, requests, rng=rng, num_padding=2, drop_entry_fraction=0.1, unslotted_fraction=unslotted)
    kv, score = V.projections(step.num_tokens, rng, bf16=bf16_inputs)
    state = V.state_cache(tables.num_state_blocks, layout.block_size, rng, bf16=bf16_state, row_pad=16)
    return Ratio2Step(tables, step, kv, score, state, B.random_norm_weight(rng, bf16=bool(seed % 2)))


# ---- the pooling, stage by stage ----------------------------------------------------------------------
def _rows_by_hand(case: Ratio2Step, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two rows (kv, score as float64 [n, 2, 512]) of each token, looked up from SPEC §14.3's
    text: in the chunk (q >= P0) from kv/score through R, else the state row at q (paged) or q mod C."""
    s, t = case.step, case.tables
    bf16_state = case.state_cache.dtype == np.uint16
    kv_rows, score_rows = np.zeros((tokens.size, 2, 512)), np.zeros((tokens.size, 2, 512))
    for n, token in enumerate(tokens):
        req, p = int(s.token_to_req[token]), int(s.positions[token])
        first = int(s.query_start_loc[req])
        p0 = int(s.positions[first])
        for i, q in enumerate((p - 1, p)):
            if q >= p0:
                u = first + (q - p0)
                pair = [_f32(case.kv[u]), _f32(case.score[u])]
                pair = [bf16(v) if bf16_state else v for v in pair]
            else:
                index = q if t.state.ring_capacity is None else q % t.state.ring_capacity
                row = case.state_cache[t.block_table[req, index // t.state.block_size], index % t.state.block_size]
                row = _f32(row)
                pair = [row[:512], row[512:]]
            kv_rows[n, i], score_rows[n, i] = pair
    return kv_rows, score_rows


LAYOUTS = {"paged4": V.paged(4), "paged2": V.paged(2), "reference_ring": V.reference_ring(), "vllm_ring": V.vllm_ring(3)}


@pytest.mark.parametrize("bf16_state, bf16_inputs", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pooled_vector_is_the_float64_softmax_of_the_right_rows(layout, bf16_state, bf16_inputs):
    case = ratio2_step(11, LAYOUTS[layout], bf16_state=bf16_state, bf16_inputs=bf16_inputs)
    s = case.step
    tokens = np.flatnonzero((s.kv_slot_mapping >= 0) & (s.slot_mapping >= 0) & (s.positions % 2 == 1))
    assert tokens.size >= 4
    state = StateArguments(s.token_to_req, s.query_start_loc, s.slot_mapping, s.save_slot_mapping, case.tables.block_table,
                           case.tables.state.block_size, case.state_cache, case.tables.state.ring_capacity)
    state_format = StateFormat.of(case.state_cache, "compress", case.tables.state.ring_capacity)
    x = pooled_ratio2(_f32(case.kv), _f32(case.score), s.positions, tokens, state, state_format)
    kv_rows, score_rows = _rows_by_hand(case, tokens)
    ideal = F.softmax_then_sum(kv_rows, score_rows)
    spread = np.abs(kv_rows).max(axis=1)  # the sum's condition: |x| may cancel, the rows' magnitudes do not
    assert np.all(np.abs(x.astype(np.float64) - ideal) <= 2.0**-21 * spread)
    near = F.near_bf16_tie(ideal, 2.0**-19) | (spread > 2.0**4 * np.abs(ideal))
    assert np.array_equal(bf16(x).astype(np.float64)[~near], F.bf16_round(ideal)[~near])


def test_softmax_then_sum_by_hand():
    """Equal scores weigh 1/2 each; a score 1000 lower weighs exactly 0 (exp2s underflows), so
    ``x`` is the other row bit for bit; the weights are normalized before the sum."""
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((3, 2, 512)).astype(F32)
    score = np.zeros((3, 2, 512), F32)
    score[1, 0] = -1000.0
    score[2, 1] = -1000.0
    x = softmax_then_sum(kv, score)
    assert np.array_equal(x[0], (kv[0, 0] * F32(0.5) + kv[0, 1] * F32(0.5)).astype(F32))
    assert np.array_equal(x[1], kv[1, 1]) and np.array_equal(x[2], kv[2, 0])
    # normalized first: den = 1 + e with e = exp2s(-L) (about 1/e); the weights are e_i / den, then the sum
    score[0, 0] = -1.0
    e = np.float64(F32(np.exp(-1.0)))
    x = softmax_then_sum(kv, score).astype(np.float64)
    ideal = (kv[0, 0] * e + kv[0, 1]) / (1 + e)
    assert np.all(np.abs(x[0] - ideal) <= 2.0**-21 * (np.abs(kv[0, 0]) + np.abs(kv[0, 1])))


def test_a_dominant_score_makes_ratio2_the_ratio1_latent_of_that_row():
    """Through the public operations: with ``score[p-1]`` 1000 below ``score[p]`` in every
    channel, each entry is ratio 1's latent of ``kv[p]``."""
    case = ratio2_step(3, V.vllm_ring(), requests=[Request(0, 10), Request(4, 6)])
    s = case.step
    case.score[:] = np.where((s.positions % 2 == 0)[:, None], F32(-1000.0), F32(0.0))
    latent2 = V.latent_buffer(s.num_tokens)
    spec.v41_compress_norm(**case.arguments(latent2))
    latent1 = V.latent_buffer(s.num_tokens)
    spec.v41_compress_norm(case.kv, None, s.positions, None, None, None, None, None, None, None, case.weight, EPS,
                           s.kv_slot_mapping, latent1, compress_ratio=1)
    active = (s.kv_slot_mapping >= 0) & (s.slot_mapping >= 0) & (s.positions % 2 == 1)
    assert active.sum() >= 4
    assert np.array_equal(latent2[active], latent1[active])
    assert np.all(latent2[~active] == CANARY16)


@pytest.mark.parametrize("bf16_state", [False, True])
@pytest.mark.parametrize("bf16_inputs", [False, True])
def test_the_latent_is_bf16_of_the_norm_of_bf16_x(bf16_state, bf16_inputs):
    case = ratio2_step(5, V.paged(4), bf16_state=bf16_state, bf16_inputs=bf16_inputs)
    before_save = replace(case, state_cache=case.state_cache.copy())
    s = case.step
    latent = V.latent_buffer(s.num_tokens)
    spec.v41_compress_norm(**case.arguments(latent))
    active = (s.kv_slot_mapping >= 0) & (s.slot_mapping >= 0) & (s.positions % 2 == 1)
    kv_rows, score_rows = _rows_by_hand(before_save, np.flatnonzero(active))
    ideal = F.rms_norm(F.bf16_round(F.softmax_then_sum(kv_rows, score_rows)), F.bits_value(case.weight)
                       if case.weight.dtype == np.uint16 else case.weight.astype(np.float64), float(F32(EPS)))
    got = F.bits_value(latent[active])
    assert np.all(np.abs(got - ideal) <= F.bf16_ulp(ideal))  # one bf16 step: the ties of x' and of y
    assert np.mean(got == F.bf16_round(ideal)) > 0.99
    assert np.all(latent[~active] == CANARY16)


# ---- the save ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bf16_state", [False, True])
def test_saving_every_token_equals_a_save_then_a_compress_from_the_state(bf16_state):
    """SPEC §14.3: with ``save_slot_mapping = slot_mapping`` the bytes equal a save (no ape)
    followed by the compress reading every row from the state."""
    case = ratio2_step(8, V.paged(4), bf16_state=bf16_state, requests=[Request(0, 9), Request(5, 6), Request(30, 1)])
    case.step = s = replace(case.step, save_slot_mapping=case.step.slot_mapping.copy())
    state_before = case.state_cache.copy()
    latent = V.latent_buffer(s.num_tokens)
    spec.v41_compress_norm(**case.arguments(latent))
    # by hand: the save first, then every row from the state (no chunk)
    state = state_before.copy()
    state_format = StateFormat.of(state, "compress", None)
    bs = case.tables.state.block_size
    save_rows(_f32(case.kv), _f32(case.score), None, s.positions, s.slot_mapping, state, bs, state_format)
    assert np.array_equal(case.state_cache, state)
    active = np.flatnonzero((s.kv_slot_mapping >= 0) & (s.slot_mapping >= 0) & (s.positions % 2 == 1))
    window = s.positions[active, None] - 1 + np.arange(2)
    rows = window_rows(window, s.token_to_req[active], state_format, state, case.tables.block_table, bs)
    assert not rows.from_chunk.any()
    assert np.array_equal(latent[active], latent_of(softmax_then_sum(rows.kv, rows.score), _weight32(case.weight), F32(EPS)))


def test_the_save_stores_kv_and_the_raw_score_rounded_once_for_a_bf16_state():
    case = ratio2_step(9, V.vllm_ring(), bf16_state=True, requests=[Request(0, 12)])
    s = case.step
    before = case.state_cache.copy()
    spec.v41_compress_norm(**case.arguments(V.latent_buffer(s.num_tokens)))
    saved = np.flatnonzero(s.save_slot_mapping >= 0)
    assert saved.tolist() == list(range(4, 12))  # the tail: a ring of 8 keeps the chunk's last 8 tokens
    blocks, offsets = s.save_slot_mapping[saved] // 8, s.save_slot_mapping[saved] % 8
    rows = case.state_cache[blocks, offsets]
    assert np.array_equal(rows[:, :512], V.bf16_patterns(case.kv[saved]))
    assert np.array_equal(rows[:, 512:], V.bf16_patterns(case.score[saved]))
    untouched = np.ones(case.state_cache.shape[:2], bool)
    untouched[blocks, offsets] = False
    assert np.array_equal(case.state_cache[untouched], before[untouched])


# ---- multi-step runs: paged and the rings agree with rows looked up by hand ----------------------------
@dataclass(frozen=True)
class Run:
    """A plan of steps for three requests: each step gives every request a kind and a size."""

    steps: tuple[tuple[tuple[str, int, int], ...], ...]  # (kind, tokens, accepted drafts) per request per step


@st.composite
def runs(draw, *, drafts: int):
    steps = []
    for index in range(draw(st.integers(2, 5))):
        plan = []
        for _ in range(3):
            if index == 0:
                kind = "prefill"
            else:
                kind = draw(st.sampled_from(["decode", "prefill", "verify"] if drafts else ["decode", "prefill"]))
            tokens = {"decode": 1, "prefill": draw(st.integers(1, 13)), "verify": drafts + 1}[kind]
            plan.append((kind, tokens, draw(st.integers(0, drafts)) if kind == "verify" else 0))
        steps.append(tuple(plan))
    return Run(tuple(steps))


def _run(run: Run, layout: V.StateLayout, *, bf16_state: bool, bf16_inputs: bool, seed: int):
    """Runs the plan with ``v41_compress_norm_rope_store``; checks every step's latents against
    rows looked up by hand from the accepted history; returns the final ``k_cache``."""
    rng = np.random.default_rng(seed)  # the projections: the same for every state layout
    lengths = [0, 0, 0]
    plans = []
    for plan in run.steps:  # the context of each request at each step
        plans.append([(lengths[i], tokens) for i, (_, tokens, _) in enumerate(plan)])
        lengths = [V.after_verify(V.verify_requests([c], tokens - 1), [accepted])[0] if kind == "verify" else c + tokens
                   for c, (kind, tokens, accepted) in zip(lengths, plan)]
    reach = [max(c + n for steps in plans for c, n in [steps[i]]) for i in range(3)]
    tables = V.v41_tables(reach, compress_ratio=2, state=layout, entries_per_page=4, rng=np.random.default_rng(seed + 1))
    state = V.state_cache(tables.num_state_blocks, layout.block_size, np.random.default_rng(seed + 3), bf16=bf16_state)
    k_cache = B.canary_k_cache("v41_nvfp4", tables.num_pages, 4)
    weight = B.random_norm_weight(np.random.default_rng(seed + 2), bf16=True)
    cos_sin = B.rope_cos_sin_cache(max(reach) + 2)
    history: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (request, position) -> the last saved row
    for plan in plans:
        step = V.v41_step(tables, [Request(c, n) for c, n in plan], num_padding=1)
        kv, score = V.projections(step.num_tokens, rng, bf16=bf16_inputs)
        latent = V.latent_buffer(step.num_tokens)
        spec.v41_compress_norm_rope_store(
            kv, score, step.positions, step.token_to_req, step.query_start_loc, step.slot_mapping, step.save_slot_mapping,
            tables.block_table, layout.block_size, state, weight, EPS, cos_sin, k_cache, step.kv_slot_mapping, latent,
            compress_ratio=2, layout="v41_nvfp4", ring_capacity=layout.ring_capacity)
        stored = [bf16(_f32(kv)), bf16(_f32(score))] if bf16_state else [_f32(kv), _f32(score)]
        active = np.flatnonzero((step.kv_slot_mapping >= 0) & (step.positions % 2 == 1))
        kv_rows, score_rows = np.zeros((active.size, 2, 512), F32), np.zeros((active.size, 2, 512), F32)
        for n, t in enumerate(active):
            req, p = int(step.token_to_req[t]), int(step.positions[t])
            first = int(step.query_start_loc[req])
            earlier = (stored[0][t - 1], stored[1][t - 1]) if t > first else history[(req, p - 1)]
            kv_rows[n], score_rows[n] = np.stack([earlier[0], stored[0][t]]), np.stack([earlier[1], stored[1][t]])
        want = latent_of(softmax_then_sum(kv_rows, score_rows), bf16_to_f32(weight), F32(EPS))
        assert np.array_equal(latent[active], want)
        for t in range(int(step.query_start_loc[-1])):
            history[(int(step.token_to_req[t]), int(step.positions[t]))] = (stored[0][t], stored[1][t])
    return k_cache


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(drafts=0), st.booleans(), st.booleans())
def test_prefill_and_decode_runs_on_a_paged_state_and_both_rings(run, bf16_state, bf16_inputs):
    caches = [_run(run, layout, bf16_state=bf16_state, bf16_inputs=bf16_inputs, seed=7)
              for layout in (V.paged(4), V.reference_ring(), V.vllm_ring())]
    assert all(np.array_equal(caches[0], other) for other in caches[1:])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(drafts=3), st.booleans())
def test_verify_runs_with_rejected_drafts_on_a_paged_state_and_vllms_ring(run, bf16_state):
    caches = [_run(run, layout, bf16_state=bf16_state, bf16_inputs=False, seed=9) for layout in (V.paged(8), V.vllm_ring(3))]
    assert np.array_equal(caches[0], caches[1])


def test_the_reference_ring_loses_the_row_of_a_second_rejected_draft():
    """A ring of C = 2 survives one rejected draft (C - W + 1): after two, the row the next step
    needs was overwritten, which the paged state keeps."""
    run = Run(((("prefill", 4, 0),) * 3, (("verify", 3, 0),) * 3, (("decode", 1, 0),) * 3))  # position 5 reads 4
    _run(run, V.paged(4), bf16_state=False, bf16_inputs=False, seed=1)
    with pytest.raises(AssertionError):
        _run(run, V.reference_ring(), bf16_state=False, bf16_inputs=False, seed=1)


# ---- the combined call ------------------------------------------------------------------------------------
STORE_LAYOUTS = ["flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4"]


def _compress_arguments(case: Ratio2Step, ratio: int, latent) -> dict:
    arguments = case.arguments(latent)
    if ratio == 1:
        arguments.update(score=None, token_to_req=None, query_start_loc=None, slot_mapping=None, save_slot_mapping=None,
                         block_table=None, bs=None, state_cache=None, ring_capacity=None, compress_ratio=1)
    return arguments


@pytest.mark.parametrize("layout", STORE_LAYOUTS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_the_combined_call_is_the_two_calls_and_latent_none_writes_the_same_cache(ratio, layout):
    fresh = lambda: ratio2_step(4, V.vllm_ring(), requests=[Request(0, 11), Request(7, 1), Request(20, 3)],  # noqa: E731
                                unslotted=0.0)  # every token that stores is active: the two calls write the same
    scale = 0.25 if layout == "fp8_per_tensor" else None
    results = []
    for how in ("two calls", "combined", "latent None"):
        case = fresh()
        k_cache = B.canary_k_cache(layout, case.tables.num_pages, 4, page_pad_bytes=16)
        latent = V.latent_buffer(case.step.num_tokens)
        cos_sin = B.rope_cos_sin_cache(32)
        arguments = _compress_arguments(case, ratio, latent)
        if how == "two calls":
            spec.v41_compress_norm(**arguments)
            spec.v41_rope_quant_store(latent, case.step.positions, case.step.kv_slot_mapping, cos_sin, k_cache,
                                      compress_ratio=ratio, layout=layout, fp8_scale=scale)
        else:
            if how == "latent None":
                arguments["latent"] = None
            spec.v41_compress_norm_rope_store(**arguments, cos_sin_cache=cos_sin, k_cache=k_cache, layout=layout,
                                              fp8_scale=scale)
        results.append((k_cache, latent, case.state_cache))
    (k1, l1, s1), (k2, l2, s2), (k3, l3, s3) = results
    assert np.array_equal(k1, k2) and np.array_equal(k1, k3)
    assert np.array_equal(l1, l2) and np.all(l3 == CANARY16)
    assert np.array_equal(s1, s2) and np.array_equal(s1, s3)
    assert not np.all(l1 == CANARY16)


def test_a_ratio2_boundary_token_without_a_state_slot_writes_nothing_in_the_combined_call():
    case = ratio2_step(4, V.paged(4), requests=[Request(0, 6)])
    slots = case.step.slot_mapping.copy()
    slots[3] = -1  # position 3: a boundary token with a cache slot, inactive without a state slot
    case.step = replace(case.step, slot_mapping=slots)
    assert case.step.kv_slot_mapping[3] >= 0
    k_cache = B.canary_k_cache("v41_nvfp4", case.tables.num_pages, 4)
    latent = V.latent_buffer(case.step.num_tokens)
    spec.v41_compress_norm_rope_store(**case.arguments(latent), cos_sin_cache=B.rope_cos_sin_cache(8), k_cache=k_cache,
                                      layout="v41_nvfp4")
    slot = int(case.step.kv_slot_mapping[3])
    assert np.all(k_cache[slot // 4, slot % 4] == B.CANARY_BYTE) and np.all(latent[3] == CANARY16)
    written = [int(case.step.kv_slot_mapping[t]) for t in (1, 5)]
    assert all(not np.all(k_cache[w // 4, w % 4] == B.CANARY_BYTE) for w in written)
