"""SPEC §14.8 through the Triton V4.1 operations: every bad call raises ``ValueError`` naming the
argument, what was expected and what was given, before anything is launched (the latent, the
state and the cache compared byte for byte, padding included); the messages are the spec's.
The cases are ``spec/tests/test_v41_errors.py``'s, with torch tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.impl import triton as T
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.tests.spec_test_helpers import V41_DEBUG_CASES, with_entry

from v41_scenarios import DEVICE, build_case, index_key_arguments, torch_arguments

COMPRESS_ONLY = ("cos_sin_cache", "k_cache", "layout", "fp8_scale")
STORE_ARGS = ("latent", "positions", "kv_slot_mapping", "cos_sin_cache", "k_cache", "compress_ratio", "layout", "fp8_scale")


def _aligned(shape, dtype, offset_bytes: int = 0) -> torch.Tensor:
    """A tensor of ``shape`` whose base is 64-byte aligned plus ``offset_bytes``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = int(np.prod(shape)) * itemsize
    raw = torch.zeros(nbytes + 128, dtype=torch.uint8, device=DEVICE)
    start = (-raw.data_ptr()) % 64 + offset_bytes
    return raw[start:start + nbytes].view(dtype).view(shape)


def _strided_cache(entries: int, entry: int, page_stride: int, entry_stride: int | None = None, num_pages: int = 4):
    flat = torch.full((num_pages * max(page_stride, entries * entry) + 64,), 0xA5, dtype=torch.uint8, device=DEVICE)
    return torch.as_strided(flat, (num_pages, entries, entry), (page_stride, entry_stride or entry, 1))


def _zeros(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


def v41_call(ratio: int, layout: str = "v41_nvfp4") -> tuple[dict, dict]:
    """Valid torch keyword arguments of ``v41_compress_norm_rope_store`` (T = 5, one padding token;
    ratio 1 with its state arguments None) and the allocations of the written buffers."""
    case = build_case([Request(3, 1), Request(0, 3)], ratio=ratio, seed=ratio, layout=layout, entries_per_page=2)
    arguments = case.compress_arguments(case.latent)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=layout)
    return torch_arguments(arguments)


# (ratio, changes, argument): each breaks one §14.8 / §9 rule of the combined call
COMBINED_CASES = [
    (1, lambda: dict(compress_ratio=4), "compress_ratio"),
    (2, lambda: dict(compress_ratio=True), "compress_ratio"),
    (1, lambda: dict(ape=_zeros(1, 512)), "ape"),
    (2, lambda: dict(ape=_zeros(2, 512)), "ape"),
    (1, lambda: dict(score=_zeros(5, 512)), "score"),
    (2, lambda: dict(score=None), "score"),
    (2, lambda: dict(state_cache=None), "state_cache"),
    (1, lambda: dict(kv=_zeros(5, 512, dtype=torch.float64)), "kv"),
    (1, lambda: dict(kv=np.zeros((5, 512), np.float32)), "kv"),  # not a torch tensor
    (1, lambda: dict(kv=_zeros(5, 448)), "kv"),
    (1, lambda: dict(kv=_zeros(4, 512)), "kv"),
    (1, lambda: dict(kv=_zeros(5, 1024)[:, ::2]), "kv"),
    (2, lambda: dict(score=_zeros(5, 512, dtype=torch.float16)), "score"),
    (2, lambda: dict(score=_aligned((5, 512), torch.float32, 4)), "score"),
    (1, lambda: dict(latent=_zeros(5, 512)), "latent"),
    (1, lambda: dict(latent=_zeros(5, 1024, dtype=torch.bfloat16)[:, ::2]), "latent"),
    (1, lambda: dict(latent=_aligned((5, 516), torch.bfloat16)[:, :512]), "latent"),  # row stride 1032 bytes
    (1, lambda: dict(latent=_aligned((5, 512), torch.bfloat16, 2)), "latent"),
    (1, lambda: dict(latent=_zeros(6, 512, dtype=torch.bfloat16)), "latent"),
    (1, lambda: dict(layout="indexer_fp8"), "layout"),
    (1, lambda: dict(layout="fp8"), "layout"),
    (1, lambda: dict(k_cache=_strided_cache(2, 584, 1168)), "k_cache"),  # a flashmla_fp8 cache for v41_nvfp4
    (1, lambda: dict(k_cache=_strided_cache(2, 288, 560)), "k_cache"),  # page stride < B*E
    (1, lambda: dict(k_cache=_strided_cache(2, 288, 584)), "k_cache"),  # page stride not a multiple of 16
    (1, lambda: dict(k_cache=_strided_cache(2, 288, 1152, entry_stride=576)), "k_cache"),  # entry stride != E
    (1, lambda: dict(k_cache=_strided_cache(2, 288, 576).view(torch.int8)), "k_cache"),  # dtype
    (1, lambda: dict(fp8_scale=1.0), "fp8_scale"),
    (1, lambda: dict(rms_norm_eps=0.0), "rms_norm_eps"),
    (1, lambda: dict(rms_norm_weight=torch.ones(128, device=DEVICE)), "rms_norm_weight"),
    (1, lambda: dict(rms_norm_weight=torch.ones(512, dtype=torch.float16, device=DEVICE)), "rms_norm_weight"),
    (1, lambda: dict(positions=_zeros(5, dtype=torch.int32)), "positions"),
    (1, lambda: dict(kv_slot_mapping=_zeros(4, dtype=torch.int64)), "kv_slot_mapping"),
    (1, lambda: dict(cos_sin_cache=_zeros(16, 32)), "cos_sin_cache"),
    (2, lambda: dict(ring_capacity=1), "ring_capacity"),
    (2, lambda: dict(ring_capacity=6), "ring_capacity"),  # not a multiple of bs = 4
    (2, lambda: dict(bs=3), "state_cache"),
    (2, lambda: dict(token_to_req=_zeros(5, dtype=torch.int64)), "token_to_req"),
    (2, lambda: dict(save_slot_mapping=_zeros(4, dtype=torch.int64)), "save_slot_mapping"),
    (2, lambda: dict(slot_mapping=None), "slot_mapping"),
    (2, lambda: dict(query_start_loc=_zeros(3, dtype=torch.int64)), "query_start_loc"),
    (2, lambda: dict(query_start_loc=_zeros(4, dtype=torch.int32)), "query_start_loc"),  # 3 requests, 2 block-table rows
    (2, lambda: dict(block_table=_zeros(2, 4, dtype=torch.int64)), "block_table"),
    (2, lambda: dict(state_cache=_zeros(6, 4, 1024, dtype=torch.float64)), "state_cache"),
    (2, lambda: dict(state_cache=_zeros(6, 4, 2048)), "state_cache"),
    (2, lambda: dict(state_cache=_zeros(6, 4, 1028, dtype=torch.bfloat16)[:, :, :1024]), "state_cache"),  # rows of 1028 bf16
    (2, lambda: dict(bs=0), "bs"),
]


def _raises_and_writes_nothing(function, arguments: dict, owners: dict, argument: str) -> str:
    before = {name: owner.clone() for name, owner in owners.items()}
    with pytest.raises(ValueError, match=rf"^{argument}: expected ") as error:
        function(**arguments)
    for name, owner in owners.items():
        assert torch.equal(owner, before[name]), f"{argument}: {name} changed before the error"
    return str(error.value)


def _case_id(case) -> str:
    return case if isinstance(case, str) else None


@pytest.mark.parametrize("ratio, changes, argument", COMBINED_CASES, ids=_case_id)
def test_the_combined_call_checks_everything_before_launching(ratio, changes, argument):
    arguments, owners = v41_call(ratio)
    _raises_and_writes_nothing(T.v41_compress_norm_rope_store, {**arguments, **changes()}, owners, argument)


@pytest.mark.parametrize("ratio, changes, argument",
                         [c for c in COMBINED_CASES if not set(c[1]()) & set(COMPRESS_ONLY)], ids=_case_id)
def test_v41_compress_norm_checks_the_same(ratio, changes, argument):
    arguments, owners = v41_call(ratio)
    arguments = {k: v for k, v in {**arguments, **changes()}.items() if k not in COMPRESS_ONLY}
    _raises_and_writes_nothing(T.v41_compress_norm, arguments, owners, argument)


def test_messages_are_the_specs():
    """The same call rejected by the spec (NumPy) and by Triton (torch): the same message."""
    arguments, owners = v41_call(1)
    message = _raises_and_writes_nothing(T.v41_compress_norm_rope_store, {**arguments, "compress_ratio": 4}, owners,
                                         "compress_ratio")
    assert message == "compress_ratio: expected one of (1, 2) (DeepSeek-V4.1's compressors), got 4"
    message = _raises_and_writes_nothing(T.v41_compress_norm_rope_store, {**arguments, "score": _zeros(5, 512)}, owners,
                                         "score")
    assert message == "score: expected None for compress_ratio 1 (ratio 1 compresses kv alone: no score, no state), got an array"
    case = build_case([Request(3, 1)], ratio=2, seed=1, layout="v41_nvfp4", entries_per_page=2)
    latent = np.zeros((2, 516), np.uint16)[:, :512]
    with pytest.raises(ValueError) as spec_error:
        spec.v41_rope_quant_store(latent, case.step.positions, case.step.kv_slot_mapping, case.cos_sin, case.k_cache,
                                  compress_ratio=2, layout="v41_nvfp4")
    torch_latent = torch.zeros((2, 516), dtype=torch.bfloat16, device=DEVICE)[:, :512]
    arguments, _ = torch_arguments(dict(positions=case.step.positions, kv_slot_mapping=case.step.kv_slot_mapping,
                                        cos_sin_cache=case.cos_sin, k_cache=case.k_cache))
    with pytest.raises(ValueError) as triton_error:
        T.v41_rope_quant_store(torch_latent, **arguments, compress_ratio=2, layout="v41_nvfp4")
    assert str(spec_error.value) == str(triton_error.value)
    assert str(triton_error.value) == "latent: expected a row stride that is a multiple of 16 bytes, got strides [516, 1]"


@pytest.mark.parametrize("operation", ["v41_compress_norm", "v41_compress_norm_rope_store"])
def test_a_cached_plan_does_not_admit_a_bool_ratio(operation):
    """``True == 1`` and hashes alike: after a valid call, the same layout with ``compress_ratio=True``
    must still be refused (the plan key holds the argument's type)."""
    arguments, owners = v41_call(1)
    if operation == "v41_compress_norm":
        arguments = {k: v for k, v in arguments.items() if k not in COMPRESS_ONLY}
    getattr(T, operation)(**arguments)
    _raises_and_writes_nothing(getattr(T, operation), {**arguments, "compress_ratio": True}, owners, "compress_ratio")


def test_v41_compress_norm_needs_a_latent():
    arguments, owners = v41_call(1)
    arguments = {k: v for k, v in arguments.items() if k not in COMPRESS_ONLY}
    _raises_and_writes_nothing(T.v41_compress_norm, {**arguments, "latent": None}, owners, "latent")


def _same_outputs(arguments: dict, reference: dict) -> None:
    """The written buffers of two calls built alike hold the same values (their allocations may sit
    at other offsets from a 64-byte boundary, so views are compared, not allocations)."""
    for name in ("latent", "state_cache", "k_cache"):
        if isinstance(arguments.get(name), torch.Tensor):
            assert torch.equal(arguments[name].view(torch.uint8), reference[name].view(torch.uint8)), name


def test_ratio1_does_not_read_the_state_arguments():
    arguments, _ = v41_call(1)
    T.v41_compress_norm_rope_store(**{**arguments, "token_to_req": "anything", "bs": -3, "ring_capacity": 7,
                                      "block_table": torch.zeros(1)})
    reference, _ = v41_call(1)
    T.v41_compress_norm_rope_store(**reference)
    _same_outputs(arguments, reference)


@pytest.mark.parametrize("changes, argument", [
    (lambda: dict(compress_ratio=128), "compress_ratio"),
    (lambda: dict(layout="indexer_mxfp4"), "layout"),
    (lambda: dict(latent=None), "latent"),
    (lambda: dict(latent=_zeros(5, 512)), "latent"),
    (lambda: dict(layout="fp8_per_tensor", k_cache=_zeros(4, 2, 512, dtype=torch.float8_e4m3fn)), "fp8_scale"),
    (lambda: dict(layout="bf16", k_cache=_zeros(4, 2, 512, dtype=torch.float8_e4m3fn)), "k_cache"),
    (lambda: dict(layout="v41_mxfp8"), "k_cache"),  # a 288-byte cache for the 528-byte record
    (lambda: dict(kv_slot_mapping=_zeros(5, dtype=torch.int32)), "kv_slot_mapping"),
    (lambda: dict(cos_sin_cache=_zeros(16, 64, dtype=torch.float64)), "cos_sin_cache"),
])
def test_v41_rope_quant_store_errors(changes, argument):
    arguments, owners = v41_call(1)
    arguments = {k: v for k, v in {**arguments, **changes()}.items() if k in STORE_ARGS}
    _raises_and_writes_nothing(T.v41_rope_quant_store, arguments, {"k_cache": owners["k_cache"]}, argument)


def _index_key_call(layout="indexer_mxfp4") -> tuple[dict, dict]:
    case = build_case([Request(0, 5)], ratio=1, seed=0, layout=None, num_padding=0, entries_per_page=2)
    return torch_arguments(index_key_arguments(case, layout))


@pytest.mark.parametrize("changes, argument", [
    (lambda: dict(compress_ratio=4), "compress_ratio"),
    (lambda: dict(layout="v41_nvfp4"), "layout"),
    (lambda: dict(layout="flashmla_fp8"), "layout"),
    (lambda: dict(k_pre=_zeros(5, 128)), "k_pre"),
    (lambda: dict(k_pre=_zeros(5, 512, dtype=torch.bfloat16)), "k_pre"),
    (lambda: dict(k_pre=_zeros(4, 128, dtype=torch.bfloat16)), "k_pre"),
    (lambda: dict(rms_norm_weight=torch.ones(512, device=DEVICE)), "rms_norm_weight"),
    (lambda: dict(rms_norm_eps=float("inf")), "rms_norm_eps"),
    (lambda: dict(layout="indexer_fp8"), "k_cache"),  # a 68-byte cache for the 132-byte record
    (lambda: dict(k_cache=_strided_cache(2, 68, 120)), "k_cache"),
])
def test_v41_index_key_store_errors(changes, argument):
    arguments, owners = _index_key_call()
    _raises_and_writes_nothing(T.v41_index_key_store, {**arguments, **changes()}, owners, argument)


# ---- debug=True: values against the buffers, checked on the host before the launch -----------------------------------
@pytest.mark.parametrize("ratio, change, message", V41_DEBUG_CASES)
def test_debug_checks_values_before_launching(ratio, change, message):
    arguments, owners = v41_call(ratio)
    arguments = with_entry(arguments, *change)
    if message is None:
        T.v41_compress_norm_rope_store(**arguments, debug=True)
        return
    before = {name: owner.clone() for name, owner in owners.items()}
    with pytest.raises(ValueError, match=f"^debug check: .*{message}"):
        T.v41_compress_norm_rope_store(**arguments, debug=True)
    for name, owner in owners.items():
        assert torch.equal(owner, before[name]), name


def test_debug_checks_of_the_store_and_the_index_key():
    arguments, _ = v41_call(1)
    store = {k: v for k, v in with_entry(arguments, "kv_slot_mapping", 3, 1).items() if k in STORE_ARGS}
    with pytest.raises(ValueError, match="^debug check: compressed-cache slot 1 is written by more than one token"):
        T.v41_rope_quant_store(**store, debug=True)
    key, _ = _index_key_call()
    num_entries = key["k_cache"].shape[0] * key["k_cache"].shape[1]
    with pytest.raises(ValueError, match="^debug check: kv_slot_mapping"):
        T.v41_index_key_store(**with_entry(key, "kv_slot_mapping", 4, num_entries), debug=True)


def test_debug_mode_writes_the_same_bytes():
    arguments, owners = v41_call(2)
    T.v41_compress_norm_rope_store(**arguments, debug=True)
    reference, _ = v41_call(2)
    T.v41_compress_norm_rope_store(**reference)
    assert np.any(owners["k_cache"].cpu().numpy() != B.CANARY_BYTE)
    _same_outputs(arguments, reference)
