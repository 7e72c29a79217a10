"""The public operations against a float64 ideal, bit-for-bit invariances and canaries."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.conformance.scenarios import C4, C128, StepRecipe, build_step, scenarios, _decode, _fixed
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec.constants import DATA_RECORD_BYTES
from dsv4_compressor.spec.formats import E4M3_MAGNITUDES, bf16_to_f32, e4m3_to_f32
from dsv4_compressor.spec.layouts import flashmla_page_bytes
from spec_test_helpers import ideal_entry, run_step, store

F32 = np.float32
IDEAL_SCENARIOS = ["c128_decode_boundary", "c4_first_window", "c4_chunked_prefill", "c128_bs4_b64",
                   "c4_bf16_weight", "huge_values", "spread_scores", "tiny_amax", "c4_padded_strides"]


def _entry_records(k_cache: np.ndarray, slot: int) -> tuple[np.ndarray, np.ndarray]:
    entries = k_cache.shape[1]
    pages = flashmla_page_bytes(k_cache)
    page, o = divmod(slot, entries)
    data = pages[page, o * DATA_RECORD_BYTES:(o + 1) * DATA_RECORD_BYTES]
    scales = pages[page, entries * DATA_RECORD_BYTES + o * 8: entries * DATA_RECORD_BYTES + o * 8 + 8]
    return data, scales


def _bf16_ulp(v: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, np.frexp(np.maximum(np.abs(v), 2.0**-126))[1] - 8)


@pytest.mark.parametrize("name", IDEAL_SCENARIOS)
def test_dequantized_entries_match_the_float64_ideal(name):
    """NoPE within one E4M3 step (at the block scale), RoPE within one bf16 ulp plus the
    binary32 rounding of the products (which matters when a*co and b*si nearly cancel)."""
    inputs = scenarios([name])[0].build()
    _, state, _, k_cache = run_step(inputs)
    b = inputs.batch
    for t in np.flatnonzero(b.active):
        y, rope = ideal_entry(state, inputs, t)
        data, scales = _entry_records(k_cache, int(b.kv_slot_mapping[t]))
        assert scales[7] == 0
        k = scales[:7].astype(np.int64) - 127
        scale = np.repeat(np.ldexp(1.0, k), 64)
        codes = data[:448]
        value = e4m3_to_f32(codes).astype(np.float64) * scale
        spacing = np.diff(E4M3_MAGNITUDES.astype(np.float64))[np.minimum(codes & 0x7F, 0x7D)] * scale
        assert np.all(np.abs(value - y[:448]) <= spacing), f"token {t}: NoPE off by more than one E4M3 step"
        amax = np.abs(y[:448]).reshape(7, 64).max(axis=1)
        ideal_k = np.ceil(np.log2(np.maximum(amax, 1e-4) / 448.0))
        near_boundary = np.abs(np.log2(np.maximum(amax, 1e-4) / 448.0) - np.round(np.log2(np.maximum(amax, 1e-4) / 448.0))) < 1e-2
        assert np.all((k == ideal_k) | near_boundary), f"token {t}: scale exponents {k} vs ideal {ideal_k}"
        stored = bf16_to_f32(data[448:].copy().view("<u2")).astype(np.float64)
        a, c = y[448::2], y[449::2]
        cs = inputs.cos_sin_cache[(int(b.positions[t]) // b.compress_ratio) * b.compress_ratio].astype(np.float64)
        products = np.repeat(np.abs(a * cs[:32]) + np.abs(c * cs[32:]), 2)
        bound = _bf16_ulp(rope) + products * 2.0**-20
        assert np.all(np.abs(stored - rope) <= bound), f"token {t}: RoPE off by more than one bf16 ulp"


@pytest.mark.parametrize("name", ["c4_layout_bf16", "c128_layout_bf16"])
def test_bf16_layout_matches_the_float64_ideal(name):
    inputs = scenarios([name])[0].build()
    _, state, _, k_cache = run_step(inputs)
    b = inputs.batch
    for t in np.flatnonzero(b.active):
        y, rope = ideal_entry(state, inputs, t)
        slot = int(b.kv_slot_mapping[t])
        stored = bf16_to_f32(k_cache[slot // b.entries_per_page, slot % b.entries_per_page]).astype(np.float64)
        assert np.all(np.abs(stored[:448] - y[:448]) <= _bf16_ulp(y[:448]))
        assert np.all(np.abs(stored[448:] - rope) <= _bf16_ulp(rope) + 2.0**-20 * np.abs(y[448:]).max())


# ---- invariances that must hold bit for bit ------------------------------------------------
def _k_bytes(inputs, batch=None, state=None):
    _, _, k_owner, _ = run_step(inputs, batch=batch, state=state)
    return k_owner


def _writes_the_step_bytes(inputs, calls) -> None:
    """``calls(state, k_cache)`` on fresh copies of the step's caches writes every byte the step's
    two calls write (:func:`run_step`)."""
    reference_state, _, reference_k, _ = run_step(inputs)
    state_owner, state = inputs.state_cache.numpy_copy()
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    calls(state, k_cache)
    assert np.array_equal(state_owner, reference_state)
    assert np.array_equal(k_owner, reference_k)


@pytest.mark.parametrize("name", ["c4_mixed_padding", "c128_chunked_prefill", "inactive_tokens"])
def test_reordering_the_tokens_changes_no_byte(name):
    inputs = scenarios([name])[0].build()
    b = inputs.batch
    order = np.random.default_rng(3).permutation(b.num_tokens)
    per_token = ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping")
    shuffled = B.Batch(**{**b.__dict__, **{n: getattr(b, n)[order] for n in per_token}})

    def shuffled_calls(state, k_cache):
        spec.save_partial_states(inputs.kv_score[order], inputs.ape, shuffled.positions, shuffled.slot_mapping, state,
                                 b.block_size)
        store(inputs, shuffled, state, k_cache)

    _writes_the_step_bytes(inputs, shuffled_calls)


@pytest.mark.parametrize("name", ["c4_mixed_padding", "c128_mixed_padding", "c4_chunked_prefill"])
def test_splitting_a_batch_into_two_calls_changes_no_byte(name):
    inputs = scenarios([name])[0].build()
    b = inputs.batch
    cut = b.num_tokens // 2

    def split_calls(state, k_cache):
        for part in (slice(0, cut), slice(cut, None)):
            spec.save_partial_states(inputs.kv_score[part], inputs.ape, b.positions[part], b.slot_mapping[part], state,
                                     b.block_size)
        for part in (slice(0, cut), slice(cut, None)):
            store(inputs, b, state, k_cache, part)

    _writes_the_step_bytes(inputs, split_calls)


@pytest.mark.parametrize("name", ["c4_decode_boundary", "c128_decode_boundary", "c4_bs16_b2"])
def test_moving_state_blocks_changes_no_cache_byte(name):
    inputs = scenarios([name])[0].build()
    _, state, reference_k, _ = run_step(inputs)
    moved_batch, moved_state = B.relocate_state_blocks(inputs.batch, state, np.random.default_rng(9))
    assert not np.array_equal(moved_batch.block_table, inputs.batch.block_table)
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    store(inputs, moved_batch, moved_state, k_cache)
    assert np.array_equal(k_owner, reference_k)


@pytest.mark.parametrize("ratio", [4, 128])
def test_padded_and_compact_strides_give_the_same_entries(ratio):
    recipe = dict(C4) if ratio == 4 else dict(C128)
    padded = build_step(StepRecipe(_decode(3, ratio), **recipe, row_pad=8, block_pad_rows=2, page_pad_bytes=64), np.random.default_rng(4))
    _, padded_state, _, padded_k = run_step(padded)
    compact_state = np.ascontiguousarray(padded.state_cache.numpy_copy()[1])
    compact_k = B.canary_k_cache("flashmla_fp8", padded.batch.num_pages, padded.batch.entries_per_page)
    b = padded.batch
    spec.save_partial_states(padded.kv_score, padded.ape, b.positions, b.slot_mapping, compact_state, b.block_size)
    spec.compress_norm_rope_store(compact_state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table,
                                  b.block_size, padded.rms_norm_weight, padded.rms_norm_eps, padded.cos_sin_cache,
                                  compact_k, b.kv_slot_mapping, compress_ratio=ratio)
    assert np.array_equal(padded_state.view(np.uint32), compact_state.view(np.uint32))
    assert np.array_equal(flashmla_page_bytes(padded_k), flashmla_page_bytes(compact_k))


# ---- what is never written ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["inactive_tokens", "non_boundary_slots", "c4_padded_strides", "c128_padded_strides", "c4_layout_fp8_per_tensor"])
def test_only_active_entries_and_saved_rows_are_written(name):
    inputs = scenarios([name])[0].build()
    b = inputs.batch
    state_owner, state, k_owner, _ = run_step(inputs)
    # state: exactly the saved rows changed (padding keeps its NaN canary bit pattern)
    initial_owner, initial_state = inputs.state_cache.numpy_copy()
    saved = b.slot_mapping[b.slot_mapping >= 0]
    initial_state[saved // b.block_size, saved % b.block_size] = state[saved // b.block_size, saved % b.block_size]
    assert np.array_equal(initial_owner, state_owner)
    # k_cache: every byte outside the active entries' records keeps the canary
    untouched_owner, untouched = inputs.k_cache.numpy_copy()
    slots = b.kv_slot_mapping[b.active]
    if inputs.layout == "flashmla_fp8":
        pages = flashmla_page_bytes(untouched)
        entries = b.entries_per_page
        for slot in slots:
            page, o = divmod(int(slot), entries)
            pages[page, o * DATA_RECORD_BYTES:(o + 1) * DATA_RECORD_BYTES] = 0
            pages[page, entries * DATA_RECORD_BYTES + o * 8: entries * DATA_RECORD_BYTES + o * 8 + 8] = 0
        written = untouched_owner == 0
    else:
        untouched[slots // b.entries_per_page, slots % b.entries_per_page] = 0
        written = untouched_owner == 0
    assert np.all(k_owner[~written] == B.CANARY_BYTE)


def test_a_batch_without_active_tokens_writes_nothing():
    inputs = build_step(StepRecipe(_fixed((0, 3), (5, 2)), **C4), np.random.default_rng(0))
    b = inputs.batch
    b.kv_slot_mapping[:] = -1
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    _, state = inputs.state_cache.numpy_copy()
    spec.compress_norm_rope_store(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                                  inputs.rms_norm_weight, 1e-6, inputs.cos_sin_cache, k_cache, b.kv_slot_mapping, compress_ratio=4)
    assert np.all(k_owner == inputs.k_cache.owner)
    assert np.isnan(spec.compress(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                                  b.kv_slot_mapping, compress_ratio=4)).all()


# ---- C4's first window -------------------------------------------------------------------------
def test_c4_first_window_pools_the_valid_rows_and_adds_positive_zeros():
    """At p = 3 only rows 4..7 (positions 0..3) exist; rows 0..3 add +0 to both trees, so an
    all -0 kv gives x = +0, while a later window of all -0 rows gives x = -0."""
    inputs = build_step(StepRecipe(_fixed((0, 8)), **C4), np.random.default_rng(0))
    b = inputs.batch
    _, state = inputs.state_cache.numpy_copy()
    blocks = b.block_table[0, :2]
    state[blocks, :, :1024] = F32(-0.0)  # kv of positions 0..7
    x = spec.compress(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                      b.kv_slot_mapping, compress_ratio=4)
    first, second = np.flatnonzero(b.positions == 3)[0], np.flatnonzero(b.positions == 7)[0]
    assert np.all(x[first].view(np.uint32) == 0x00000000)
    assert np.all(x[second].view(np.uint32) == 0x80000000)
    # with real values, p = 3 is the softmax pooling of positions 0..3's second halves only
    _, state = inputs.state_cache.numpy_copy()
    x = spec.compress(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                      b.kv_slot_mapping, compress_ratio=4)
    rows = state[b.block_table[0, 0], :4].astype(np.float64)
    kv, score = rows[:, 512:1024], rows[:, 1536:2048]
    weights = np.exp(score - score.max(axis=0))
    ideal = (kv * weights).sum(axis=0) / weights.sum(axis=0)
    assert np.allclose(x[first], ideal, rtol=1e-5, atol=1e-6)


# ---- debug mode ------------------------------------------------------------------------------------
def _call(inputs, **changes):
    b = inputs.batch
    args = dict(state_cache=inputs.state_cache.numpy_copy()[1], token_to_req_indices=b.token_to_req_indices,
                positions=b.positions, slot_mapping=b.slot_mapping, block_table=b.block_table, block_size=b.block_size,
                rms_norm_weight=inputs.rms_norm_weight, rms_norm_eps=1e-6, cos_sin_cache=inputs.cos_sin_cache,
                k_cache=inputs.k_cache.numpy_copy()[1], kv_slot_mapping=b.kv_slot_mapping)
    args.update(changes)
    kwargs = {"compress_ratio": b.compress_ratio, "debug": True}
    return args, kwargs


@pytest.mark.parametrize("breaks, message", [
    (lambda b: b.block_table.__setitem__((b.token_to_req_indices[0], b.positions[0] // b.block_size), 10_000), "block_table"),
    (lambda b: b.block_table.__setitem__((b.token_to_req_indices[0], b.positions[0] // b.block_size), -1), "block_table"),
    (lambda b: b.kv_slot_mapping.__setitem__(0, 10_000), "kv_slot_mapping"),
    (lambda b: b.kv_slot_mapping.__setitem__(1, b.kv_slot_mapping[0]), "written by more than one"),
    (lambda b: b.slot_mapping.__setitem__(0, 10**9), "slot_mapping"),
    (lambda b: b.token_to_req_indices.__setitem__(0, 99), "token_to_req_indices"),
])
def test_debug_mode_checks_values_against_the_buffers(breaks, message):
    inputs = build_step(StepRecipe(_decode(3, 4), **C4), np.random.default_rng(2))
    breaks(inputs.batch)
    args, kwargs = _call(inputs)
    k_before = args["k_cache"].copy()
    with pytest.raises(ValueError, match=message):
        spec.compress_norm_rope_store(**args, **kwargs)
    assert np.array_equal(args["k_cache"], k_before)


def test_debug_mode_checks_the_rope_table_and_saved_slots():
    inputs = build_step(StepRecipe(_decode(3, 4), **C4), np.random.default_rng(2))
    args, kwargs = _call(inputs, cos_sin_cache=inputs.cos_sin_cache[:2])
    with pytest.raises(ValueError, match="cos_sin_cache"):
        spec.compress_norm_rope_store(**args, **kwargs)
    b = inputs.batch
    slots = b.slot_mapping.copy()
    slots[1] = slots[0]
    with pytest.raises(ValueError, match="more than one token"):
        spec.save_partial_states(inputs.kv_score, inputs.ape, b.positions, slots, inputs.state_cache.numpy_copy()[1], b.block_size, debug=True)
