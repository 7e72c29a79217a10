"""SPEC §14.8: every V4.1 entry point raises ``ValueError`` naming the argument, what it expected
and what it got, before anything is written (latent, state and cache compared byte for byte)."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request
from spec_test_helpers import V41_DEBUG_CASES, with_entry

F32 = np.float32


def _aligned(shape, dtype, offset_bytes: int = 0) -> np.ndarray:
    """An array of ``shape`` whose base is 64-byte aligned plus ``offset_bytes``."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(nbytes + 128, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 64 + offset_bytes
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _strided_cache(entries: int, entry: int, page_stride: int, entry_stride: int | None = None, num_pages: int = 4):
    flat = np.full(num_pages * max(page_stride, entries * entry) + 64, 0xA5, np.uint8)
    return np.lib.stride_tricks.as_strided(flat, (num_pages, entries, entry), (page_stride, entry_stride or entry, 1))


def v41_call(ratio: int, layout: str = "v41_nvfp4", ring: bool = False) -> dict:
    """Valid keyword arguments of ``v41_compress_norm_rope_store`` (ratio 1 with its state arguments None)."""
    rng = np.random.default_rng(ratio)
    requests = [Request(3, 1), Request(0, 3)]  # T = 5 with the padding token
    state = V.vllm_ring() if ring else V.paged(4)
    tables = V.v41_tables([4, 3], compress_ratio=ratio, state=state, entries_per_page=2, rng=rng)
    step = V.v41_step(tables, requests, num_padding=1)
    kv, score = V.projections(step.num_tokens, rng)
    call = dict(kv=kv, score=score, positions=step.positions, token_to_req=step.token_to_req,
                query_start_loc=step.query_start_loc, slot_mapping=step.slot_mapping,
                save_slot_mapping=step.save_slot_mapping, block_table=tables.block_table, bs=state.block_size,
                state_cache=V.state_cache(tables.num_state_blocks, state.block_size, rng),
                rms_norm_weight=np.ones(512, F32), rms_norm_eps=1e-6, cos_sin_cache=B.rope_cos_sin_cache(16),
                k_cache=B.canary_k_cache(layout, tables.num_pages, 2), kv_slot_mapping=step.kv_slot_mapping,
                latent=V.latent_buffer(step.num_tokens), compress_ratio=ratio, layout=layout,
                ring_capacity=state.ring_capacity)
    if ratio == 1:
        call.update(score=None, token_to_req=None, query_start_loc=None, slot_mapping=None, save_slot_mapping=None,
                    block_table=None, bs=None, state_cache=None, ring_capacity=None)
    return call


COMPRESS_ONLY = ("cos_sin_cache", "k_cache", "layout", "fp8_scale")
STORE_ARGS = ("latent", "positions", "kv_slot_mapping", "cos_sin_cache", "k_cache", "compress_ratio", "layout", "fp8_scale")


def _buffers(call: dict) -> list[np.ndarray]:
    return [call[name] for name in ("latent", "state_cache", "k_cache") if isinstance(call.get(name), np.ndarray)]


def _raises_and_writes_nothing(function, call: dict, argument: str) -> str:
    snapshots = [(b, b.copy()) for b in _buffers(call)]
    with pytest.raises(ValueError, match=rf"^{argument}: expected ") as error:
        function(**call)
    for buffer, before in snapshots:
        assert np.array_equal(buffer, before, equal_nan=True), f"{argument}: a buffer changed before the error"
    return str(error.value)


# (ratio, changes, argument): each breaks one §14.8 / §9 rule of the combined call
COMBINED_CASES = [
    (1, dict(compress_ratio=4), "compress_ratio"),
    (2, dict(compress_ratio=True), "compress_ratio"),
    (1, dict(ape=np.zeros((1, 512), F32)), "ape"),
    (2, dict(ape=np.zeros((2, 512), F32)), "ape"),
    (1, dict(score=np.zeros((5, 512), F32)), "score"),
    (2, dict(score=None), "score"),
    (2, dict(state_cache=None), "state_cache"),
    (1, dict(kv=np.zeros((5, 512), np.float64)), "kv"),
    (1, dict(kv=np.zeros((5, 448), F32)), "kv"),
    (1, dict(kv=np.zeros((4, 512), F32)), "kv"),
    (1, dict(kv=np.zeros((5, 1024), F32)[:, ::2]), "kv"),
    (2, dict(score=np.zeros((5, 512), np.float16)), "score"),
    (2, dict(score=_aligned((5, 512), F32, 4)), "score"),
    (1, dict(latent=np.zeros((5, 512), F32)), "latent"),
    (1, dict(latent=np.zeros((5, 1024), np.uint16)[:, ::2]), "latent"),
    (1, dict(latent=_aligned((5, 516), np.uint16)[:, :512]), "latent"),  # row stride 1032 bytes
    (1, dict(latent=_aligned((5, 512), np.uint16, 2)), "latent"),
    (1, dict(latent=np.zeros((6, 512), np.uint16)), "latent"),
    (1, dict(layout="indexer_fp8"), "layout"),
    (1, dict(layout="fp8"), "layout"),
    (1, dict(k_cache=_strided_cache(2, 584, 1168)), "k_cache"),  # a flashmla_fp8 cache for v41_nvfp4
    (1, dict(k_cache=_strided_cache(2, 288, 560)), "k_cache"),  # page stride < B*E
    (1, dict(k_cache=_strided_cache(2, 288, 584)), "k_cache"),  # page stride not a multiple of 16
    (1, dict(k_cache=_strided_cache(2, 288, 1152, entry_stride=576)), "k_cache"),  # entry stride != E
    (1, dict(fp8_scale=1.0), "fp8_scale"),
    (1, dict(rms_norm_eps=0.0), "rms_norm_eps"),
    (1, dict(rms_norm_weight=np.ones(128, F32)), "rms_norm_weight"),
    (1, dict(positions=np.zeros(5, np.int32)), "positions"),
    (1, dict(kv_slot_mapping=np.zeros(4, np.int64)), "kv_slot_mapping"),
    (1, dict(cos_sin_cache=np.zeros((16, 32), F32)), "cos_sin_cache"),
    (2, dict(ring_capacity=1), "ring_capacity"),
    (2, dict(ring_capacity=6), "ring_capacity"),  # not a multiple of bs = 4
    (2, dict(bs=3), "state_cache"),
    (2, dict(token_to_req=np.zeros(5, np.int64)), "token_to_req"),
    (2, dict(save_slot_mapping=np.zeros(4, np.int64)), "save_slot_mapping"),
    (2, dict(slot_mapping=None), "slot_mapping"),
    (2, dict(query_start_loc=np.zeros(3, np.int64)), "query_start_loc"),
    (2, dict(query_start_loc=np.zeros(4, np.int32)), "query_start_loc"),  # 3 requests, 2 block-table rows
    (2, dict(block_table=np.zeros((2, 4), np.int64)), "block_table"),
    (2, dict(state_cache=np.zeros((6, 4, 1024), np.float64)), "state_cache"),
    (2, dict(state_cache=np.zeros((6, 4, 2048), F32)), "state_cache"),
    (2, dict(state_cache=np.zeros((6, 4, 1028), np.uint16)[:, :, :1024]), "state_cache"),  # rows of 1028 bf16: 8 is the multiple
    (2, dict(bs=0), "bs"),
]


@pytest.mark.parametrize("ratio, changes, argument", COMBINED_CASES, ids=lambda c: str(c) if isinstance(c, str) else None)
def test_the_combined_call_checks_everything_before_writing(ratio, changes, argument):
    call = {**v41_call(ratio), **changes}
    _raises_and_writes_nothing(spec.v41_compress_norm_rope_store, call, argument)


@pytest.mark.parametrize("ratio, changes, argument",
                         [c for c in COMBINED_CASES if not set(c[1]) & set(COMPRESS_ONLY)],
                         ids=lambda c: str(c) if isinstance(c, str) else None)
def test_v41_compress_norm_checks_the_same(ratio, changes, argument):
    call = {k: v for k, v in {**v41_call(ratio), **changes}.items() if k not in COMPRESS_ONLY}
    _raises_and_writes_nothing(spec.v41_compress_norm, call, argument)


def test_v41_compress_norm_needs_a_latent():
    call = {k: v for k, v in v41_call(1).items() if k not in COMPRESS_ONLY}
    _raises_and_writes_nothing(spec.v41_compress_norm, {**call, "latent": None}, "latent")


@pytest.mark.parametrize("changes, argument", [
    (dict(compress_ratio=128), "compress_ratio"),
    (dict(layout="indexer_mxfp4"), "layout"),
    (dict(latent=None), "latent"),
    (dict(latent=np.zeros((5, 512), F32)), "latent"),
    (dict(layout="fp8_per_tensor", k_cache=B.canary_k_cache("fp8_per_tensor", 4, 2)), "fp8_scale"),
    (dict(layout="bf16", k_cache=B.canary_k_cache("fp8_per_tensor", 4, 2)), "k_cache"),
    (dict(layout="v41_mxfp8"), "k_cache"),  # a 288-byte cache for the 528-byte record
    (dict(kv_slot_mapping=np.zeros(5, np.int32)), "kv_slot_mapping"),
])
def test_v41_rope_quant_store_errors(changes, argument):
    call = {k: v for k, v in {**v41_call(1), **changes}.items() if k in STORE_ARGS}
    _raises_and_writes_nothing(spec.v41_rope_quant_store, call, argument)


def _index_key_call(layout="indexer_mxfp4") -> dict:
    rng = np.random.default_rng(0)
    return dict(k_pre=V.k_pre(5, rng), positions=np.arange(5, dtype=np.int64), kv_slot_mapping=np.arange(5, dtype=np.int64),
                rms_norm_weight=np.ones(128, F32), rms_norm_eps=1e-6, cos_sin_cache=B.rope_cos_sin_cache(8),
                k_cache=B.canary_k_cache(layout, 3, 2), compress_ratio=1, layout=layout)


@pytest.mark.parametrize("changes, argument", [
    (dict(compress_ratio=4), "compress_ratio"),
    (dict(layout="v41_nvfp4"), "layout"),
    (dict(layout="flashmla_fp8"), "layout"),
    (dict(k_pre=np.zeros((5, 128), F32)), "k_pre"),
    (dict(k_pre=np.zeros((5, 512), np.uint16)), "k_pre"),
    (dict(k_pre=np.zeros((4, 128), np.uint16)), "k_pre"),
    (dict(rms_norm_weight=np.ones(512, F32)), "rms_norm_weight"),
    (dict(rms_norm_eps=float("inf")), "rms_norm_eps"),
    (dict(layout="indexer_fp8"), "k_cache"),  # a 68-byte cache for the 132-byte record
    (dict(k_cache=_strided_cache(2, 68, 120)), "k_cache"),
])
def test_v41_index_key_store_errors(changes, argument):
    _raises_and_writes_nothing(spec.v41_index_key_store, {**_index_key_call(), **changes}, argument)


def test_messages_name_what_was_expected_and_what_was_given():
    message = _raises_and_writes_nothing(spec.v41_compress_norm_rope_store, {**v41_call(1), "compress_ratio": 4}, "compress_ratio")
    assert message == "compress_ratio: expected one of (1, 2) (DeepSeek-V4.1's compressors), got 4"
    message = _raises_and_writes_nothing(spec.v41_compress_norm_rope_store, {**v41_call(1), "score": np.zeros((5, 512), F32)}, "score")
    assert message == "score: expected None for compress_ratio 1 (ratio 1 compresses kv alone: no score, no state), got an array"
    message = _raises_and_writes_nothing(spec.v41_compress_norm_rope_store, {**v41_call(1), "layout": "indexer_fp8"}, "layout")
    assert message.startswith("layout: expected one of 'flashmla_fp8', 'bf16', 'fp8_per_tensor', 'v41_mxfp8', 'v41_nvfp4'")


def test_ratio1_does_not_read_the_state_arguments():
    """For ratio 1 the state arguments other than ``score`` and ``state_cache`` are not read."""
    call = v41_call(1)
    reference = {**call, "latent": V.latent_buffer(5), "k_cache": B.canary_k_cache("v41_nvfp4", call["k_cache"].shape[0], 2)}
    spec.v41_compress_norm_rope_store(**reference)
    other = {**call, "token_to_req": "anything", "bs": -3, "block_table": np.zeros(1), "ring_capacity": 7,
             "latent": V.latent_buffer(5), "k_cache": B.canary_k_cache("v41_nvfp4", call["k_cache"].shape[0], 2)}
    spec.v41_compress_norm_rope_store(**other)
    assert np.array_equal(reference["latent"], other["latent"]) and np.array_equal(reference["k_cache"], other["k_cache"])


def test_a_ring_needs_its_blocks_in_the_block_table():
    call = v41_call(2, ring=True)
    _raises_and_writes_nothing(spec.v41_compress_norm_rope_store, {**call, "block_table": call["block_table"][:, :0]},
                               "block_table")
    _raises_and_writes_nothing(spec.v41_compress_norm_rope_store, {**call, "ring_capacity": 4}, "ring_capacity")


# ---- debug=True: values against the buffers -----------------------------------------------------------
def _debug_case(ratio: int, ring: bool = False):
    call = v41_call(ratio, ring=ring)
    call["kv_slot_mapping"] = call["kv_slot_mapping"].copy()
    return call


@pytest.mark.parametrize("ratio, change, message", V41_DEBUG_CASES)
def test_debug_checks_values_before_writing(ratio, change, message):
    call = with_entry(_debug_case(ratio), *change)
    if message is None:
        spec.v41_compress_norm_rope_store(**call, debug=True)
        return
    snapshots = [(b, b.copy()) for b in _buffers(call)]
    with pytest.raises(ValueError, match=f"^debug check: .*{message}"):
        spec.v41_compress_norm_rope_store(**call, debug=True)
    for buffer, before in snapshots:
        assert np.array_equal(buffer, before, equal_nan=True)


def test_debug_checks_of_the_store_and_the_index_key():
    call = {k: v for k, v in with_entry(_debug_case(1), "kv_slot_mapping", 3, 1).items() if k in STORE_ARGS}
    with pytest.raises(ValueError, match="^debug check: compressed-cache slot 1 is written by more than one token"):
        spec.v41_rope_quant_store(**call, debug=True)
    key = _index_key_call()
    with pytest.raises(ValueError, match="^debug check: kv_slot_mapping"):
        spec.v41_index_key_store(**with_entry(key, "kv_slot_mapping", 4, 6), debug=True)  # 3 pages of 2 entries
