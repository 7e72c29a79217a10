"""SPEC §9's checks of the §13 options: a ValueError naming the argument, what was expected and
what was given, and no byte of any buffer changed; and §13.4's debug checks."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.spec import batch as B

F32 = np.float32
T, SW = 10, 1024  # the valid call: C4 (W = 8), bs = 4, a ring of 16 rows, eight tokens and two of padding


def _aligned(shape, dtype, *, row_elements=None, offset_elements=0) -> np.ndarray:
    """A 64-byte aligned 2-D array whose rows are ``row_elements`` apart, ``offset_elements`` past the base."""
    dtype = np.dtype(dtype)
    row = row_elements or shape[1]
    flat = B.padded_view(((shape[0] + 1) * row + offset_elements,), dtype, (0,), 0)
    return np.lib.stride_tricks.as_strided(flat[offset_elements:], shape, (row * dtype.itemsize, dtype.itemsize))


def _valid() -> dict:
    rng = np.random.default_rng(0)
    requests = [B.Request(3, 5), B.Request(11, 1), B.Request(18, 2)]
    b = B.build_ring_batch(requests, compress_ratio=4, ring_capacity=16, block_size=4, entries_per_page=2, rng=rng,
                           num_padding=2)
    projections = _aligned((b.num_tokens, 2 * SW), F32)
    projections[...] = B.random_kv_score(b.num_tokens, 4, rng)
    return dict(
        kv=projections[:, :SW], score=projections[:, SW:], ape=B.random_ape(4, rng), positions=b.positions,
        token_to_req=b.token_to_req_indices, query_start_loc=b.query_start_loc, slot_mapping=b.slot_mapping,
        save_slot_mapping=b.save_slot_mapping, block_table=b.block_table, bs=4,
        state_cache=B.random_state_cache(b.num_state_blocks, 4, 4, rng), rms_norm_weight=np.ones(512, F32),
        rms_norm_eps=1e-6, cos_sin_cache=B.rope_cos_sin_cache(32), k_cache=B.canary_k_cache("flashmla_fp8", b.num_pages, 2),
        kv_slot_mapping=b.kv_slot_mapping, compress_ratio=4, ape_at="save", ring_capacity=16,
    )


def _bf16_state(state: np.ndarray, row_pad: int) -> np.ndarray:
    out = B.padded_view(state.shape, np.uint16, (0, 0, row_pad), np.uint16(0))
    out[...] = 0x3F80
    return out


STEP_CASES = [
    ("state_cache float64", dict(state_cache=lambda c: c["state_cache"].astype(np.float64)), "state_cache"),
    ("bf16 state rows 4 elements apart from 16 bytes", dict(state_cache=lambda c: _bf16_state(c["state_cache"], 4)), "state_cache"),
    ("ape_at unknown", dict(ape_at=lambda c: "pool"), "ape_at"),
    ("ape_at not a string", dict(ape_at=lambda c: 1), "ape_at"),
    ("ape missing", dict(ape=lambda c: None), "ape"),
    ("ape missing with ape_at compress", dict(ape=lambda c: None, ape_at=lambda c: "compress"), "ape"),
    ("ape float64", dict(ape=lambda c: c["ape"].astype(np.float64)), "ape"),
    ("ape of the other ratio", dict(ape=lambda c: np.zeros((128, SW), F32)), "ape"),
    ("ape half wide", dict(ape=lambda c: c["ape"][:, :512].copy()), "ape"),
    ("ring_capacity not a multiple of bs", dict(ring_capacity=lambda c: 18), "ring_capacity"),
    ("ring_capacity below W", dict(ring_capacity=lambda c: 4), "ring_capacity"),
    ("ring_capacity zero", dict(ring_capacity=lambda c: 0), "ring_capacity"),
    ("ring_capacity negative", dict(ring_capacity=lambda c: -16), "ring_capacity"),
    ("ring_capacity a bool", dict(ring_capacity=lambda c: True), "ring_capacity"),
    ("ring_capacity a float", dict(ring_capacity=lambda c: 16.0), "ring_capacity"),
    ("block table narrower than the ring", dict(ring_capacity=lambda c: 24), "block_table"),
    ("kv float64", dict(kv=lambda c: c["kv"].astype(np.float64)), "kv"),
    ("kv one row short", dict(kv=lambda c: c["kv"][:-1]), "kv"),
    ("kv of another width", dict(kv=lambda c: np.zeros((T, 2 * SW), F32)), "kv"),
    ("kv rows not 16-byte aligned", dict(kv=lambda c: _aligned((T, SW), F32, row_elements=SW + 2)), "kv"),
    ("kv base not 16-byte aligned", dict(kv=lambda c: _aligned((T, SW), F32, offset_elements=1)), "kv"),
    ("kv with a non-unit last stride", dict(kv=lambda c: np.zeros((T, 2 * SW), F32)[:, ::2]), "kv"),
    ("score of rank 1", dict(score=lambda c: c["score"][0]), "score"),
    ("score rows not 16-byte aligned", dict(score=lambda c: _aligned((T, SW), F32, row_elements=SW + 1)), "score"),
    ("query_start_loc int64", dict(query_start_loc=lambda c: c["query_start_loc"].astype(np.int64)), "query_start_loc"),
    ("query_start_loc of rank 2", dict(query_start_loc=lambda c: c["query_start_loc"][None]), "query_start_loc"),
    ("query_start_loc empty", dict(query_start_loc=lambda c: np.zeros(0, np.int32)), "query_start_loc"),
    ("more requests than block-table rows", dict(query_start_loc=lambda c: np.array([0, 5, 6, 8, 8], np.int32)), "query_start_loc"),
    ("save_slot_mapping int32", dict(save_slot_mapping=lambda c: c["save_slot_mapping"].astype(np.int32)), "save_slot_mapping"),
    ("save_slot_mapping one short", dict(save_slot_mapping=lambda c: c["save_slot_mapping"][:-1]), "save_slot_mapping"),
]


def _run_rejected(function, call: dict, argument: str) -> None:
    """``function(**call)`` raises a ValueError naming ``argument`` and writes nothing."""
    buffers = {name: Buffer.of(call[name]) for name in ("state_cache", "k_cache") if isinstance(call.get(name), np.ndarray)}
    views = {name: buffer.view_of(buffer.owner) for name, buffer in buffers.items()}
    before = {name: buffer.owner.copy() for name, buffer in buffers.items()}
    with pytest.raises(ValueError) as error:
        function(**{**call, **views})
    message = str(error.value)
    assert message.startswith(f"{argument}: expected "), message
    assert ", got " in message, message
    for name, buffer in buffers.items():
        assert np.array_equal(buffer.owner, before[name]), f"{name} changed"


def test_the_valid_call_writes():
    call = _valid()
    k = Buffer.of(call["k_cache"])
    spec.compress_and_save(**{**call, "k_cache": k.view_of(k.owner)}, debug=True)
    assert np.count_nonzero(k.owner != B.CANARY_BYTE) > 0


@pytest.mark.parametrize("name, changes, argument", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_compress_and_save_rejects(name, changes, argument):
    call = _valid()
    _run_rejected(spec.compress_and_save, {**call, **{key: make(call) for key, make in changes.items()}}, argument)


def _save_call(call: dict) -> dict:
    return dict(kv_score=np.concatenate([call["kv"], call["score"]], axis=1), ape=call["ape"], positions=call["positions"],
                slot_mapping=call["slot_mapping"], state_cache=call["state_cache"], block_size=4, ape_at="save",
                ring_capacity=16)


@pytest.mark.parametrize("changes, argument", [
    (dict(ape_at="compress "), "ape_at"),
    (dict(ape=None), "ape"),
    (dict(ape=np.zeros((4, 512), F32)), "ape"),
    (dict(ring_capacity=12.5), "ring_capacity"),
    (dict(ring_capacity=6), "ring_capacity"),
    (dict(ape_at="compress", kv_score=np.zeros((T, 1536), F32)), "kv_score"),
    (dict(ape_at="compress", state_cache=np.zeros((3, 4, 1024), F32)), "state_cache"),
], ids=["ape_at", "ape missing", "ape narrow", "ring float", "ring not a multiple", "kv_score width", "state width"])
def test_save_partial_states_rejects(changes, argument):
    _run_rejected(spec.save_partial_states, {**_save_call(_valid()), **changes}, argument)


def test_save_with_ape_at_compress_needs_no_ape():
    call = _save_call(_valid())
    state = Buffer.of(call["state_cache"])
    spec.save_partial_states(**{**call, "ape": None, "ape_at": "compress", "state_cache": state.view_of(state.owner)})
    rows = call["slot_mapping"][call["slot_mapping"] >= 0]
    stored = state.view_of(state.owner)[rows // 4, rows % 4, SW:]
    assert np.array_equal(stored, call["kv_score"][call["slot_mapping"] >= 0, SW:])


def _store_call(call: dict) -> dict:
    return dict(state_cache=call["state_cache"], token_to_req_indices=call["token_to_req"], positions=call["positions"],
                slot_mapping=call["slot_mapping"], block_table=call["block_table"], block_size=4,
                rms_norm_weight=call["rms_norm_weight"], rms_norm_eps=1e-6, cos_sin_cache=call["cos_sin_cache"],
                k_cache=call["k_cache"], kv_slot_mapping=call["kv_slot_mapping"], compress_ratio=4, ring_capacity=16)


@pytest.mark.parametrize("changes, argument", [
    (dict(ape_at="compress"), "ape"),
    (dict(ape_at="compress", ape=np.zeros((4, SW), np.float64)), "ape"),
    (dict(ape_at=None), "ape_at"),
    (dict(ring_capacity=20), "block_table"),
    (dict(ring_capacity=2), "ring_capacity"),
    (dict(state_cache=np.zeros((3, 4, 2048), np.float16)), "state_cache"),
], ids=["ape missing", "ape float64", "ape_at None", "narrow table", "ring below W", "state fp16"])
def test_compress_norm_rope_store_rejects(changes, argument):
    _run_rejected(spec.compress_norm_rope_store, {**_store_call(_valid()), **changes}, argument)


def test_the_messages_say_what_was_expected():
    call = _valid()
    cases = {
        "ape_at": (dict(ape_at="pool"), "ape_at: expected 'save' or 'compress', got 'pool'"),
        "ring": (dict(ring_capacity=6), "ring_capacity: expected None or a positive multiple of block_size 4 that is at least W = 8, got 6"),
        "table": (dict(ring_capacity=24), "block_table: expected shape[1] >= ring_capacity / block_size = 6 blocks (the ring), got shape [3, 4]"),
        "ape": (dict(ape=None), "ape: expected a float32 [4, 1024] ([compress_ratio, SW]) array (compress_and_save adds it to this call's scores), got None"),
        "qsl": (dict(query_start_loc=np.array([0, 5, 6, 8, 8], np.int32)),
                "query_start_loc: expected length num_reqs + 1 with 0 <= num_reqs <= block_table.shape[0] = 3, got 5"),
    }
    for changes, expected in cases.values():
        with pytest.raises(ValueError) as error:
            spec.compress_and_save(**{**call, **changes})
        assert str(error.value) == expected


# ---- §13.4's debug checks: the caller's contract -----------------------------------------------------
@pytest.mark.parametrize("field, change, message", [
    ("token_to_req", lambda a: np.where(np.arange(a.size) == 5, 2, a).astype(np.int32), "lies in request 1's chunk"),
    ("positions", lambda a: np.where(np.arange(a.size) == 2, a + 1, a), "consecutive"),
    ("save_slot_mapping", lambda a: np.where(np.arange(a.size) == a.size - 1, 3, a), "padding token"),
    ("query_start_loc", lambda a: np.array([0, 6, 5, 8], np.int32), "nondecreasing"),
])
def test_debug_checks_the_step_contract(field, change, message):
    call = _valid()
    call[field] = change(call[field])
    with pytest.raises(ValueError, match=message):
        spec.compress_and_save(**call, debug=True)
