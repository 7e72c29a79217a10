"""The vLLM adapters, called the way vLLM's DeepSeek V4 compressor layer calls its own kernels.

Each case builds one engine step with :mod:`dsv4_compressor.spec.batch` (shuffled block tables,
padding tokens, padded FlashMLA pages), runs the NumPy spec on one copy of the buffers and the
adapter (``kv_score.split``, ``save_partial_states``, then ``compress_norm_rope_store_*`` with a
metadata object) on a torch copy, and compares every byte of the state cache and the
compressed cache. Triton runs under its interpreter on CPU; the CuTe DSL cases need a GPU.
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
from dsv4_compressor.integrations import vllm
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CACHE_DTYPE = {"flashmla_fp8": "uint8", "bf16": "bfloat16", "fp8_per_tensor": "float8_e4m3fn"}

# vLLM's parameter names, in order (its compressor layer passes them by keyword).
VLLM_SAVE = ["kv", "score", "ape", "positions", "state_cache", "slot_mapping", "block_size", "state_width",
             "compress_ratio", "pdl_kwargs"]
VLLM_COMPRESS = ["state_cache", "num_actual", "token_to_req_indices", "positions", "slot_mapping", "block_table",
                 "block_size", "state_width", "cos_sin_cache", "kv_cache", "k_cache_metadata", "pdl_kwargs", "head_dim",
                 "rope_head_dim", "compress_ratio", "overlap", "use_fp4_cache", "rms_norm_weight", "rms_norm_eps",
                 "quant_block", "token_stride", "scale_dim"]
VLLM_CUTEDSL_EXTRA = ["store_full_kv", "store_full_fp8", "fp8_scale"]


@dataclass
class Step:
    """One step's NumPy inputs (the spec's view) and the layout of its compressed cache."""

    batch: spec_batch.Batch
    kv_score: np.ndarray  # float32 [T, 2*SW]
    ape: np.ndarray  # float32 [r, SW]
    state_cache: np.ndarray  # float32 [blocks, bs, 2*SW]
    weight: np.ndarray  # float32 [512] or uint16 bf16 patterns
    cos_sin: np.ndarray  # float32 [max_pos, 64]
    k_cache: np.ndarray
    layout: str
    fp8_scale: float | None = None


def _step(ratio: int, *, layout: str = "flashmla_fp8", bf16_weight: bool = False, seed: int = 0) -> Step:
    rng = np.random.default_rng(seed)
    if ratio == 4:
        requests = [Request(11, 1), Request(34, 2), Request(6, 7), Request(17, 1)]
    else:
        requests = [Request(127, 1), Request(200, 1), Request(254, 2)]
    batch = spec_batch.build_batch(requests, compress_ratio=ratio, block_size=4 if ratio == 4 else 8,
                                   entries_per_page=2, rng=rng, num_padding=2)
    state = spec_batch.random_state_cache(batch.num_state_blocks, batch.block_size, ratio, rng)
    return Step(
        batch=batch, kv_score=spec_batch.random_kv_score(batch.num_tokens, ratio, rng), ape=spec_batch.random_ape(ratio, rng),
        state_cache=state, weight=spec_batch.random_norm_weight(rng, bf16=bf16_weight),
        cos_sin=spec_batch.rope_cos_sin_cache(int(batch.positions.max()) + ratio + 1),
        k_cache=spec_batch.canary_k_cache(layout, batch.num_pages, 2), layout=layout,
        fp8_scale=0.05 if layout == "fp8_per_tensor" else None,
    )


def _expected(step: Step) -> tuple[np.ndarray, np.ndarray]:
    """The whole allocations behind state_cache and k_cache after the spec's two operations."""
    b = step.batch
    state_owner, state = Buffer.of(step.state_cache).numpy_copy()
    k_owner, k_cache = Buffer.of(step.k_cache).numpy_copy()
    spec.save_partial_states(step.kv_score, step.ape, b.positions, b.slot_mapping, state, b.block_size)
    spec.compress_norm_rope_store(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                                  step.weight, 1e-6, step.cos_sin, k_cache, b.kv_slot_mapping, compress_ratio=b.compress_ratio,
                                  layout=step.layout, fp8_scale=step.fp8_scale)
    return state_owner.view(np.uint8), k_owner.view(np.uint8)


def _tensor(array: np.ndarray, logical: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return Buffer.of(array, logical).torch_copy(DEVICE)


def _run_like_vllm(step: Step, save, compress, *, pad_per_token: int = 0, split: bool = True, **extra) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's compressor forward: split kv_score, save, then compress with a metadata object.

    ``pad_per_token`` lengthens positions, token_to_req_indices and the compressed slot mapping
    beyond ``num_actual`` (buffers sized for a CUDA graph), with garbage that must be ignored.
    """
    b, ratio = step.batch, step.batch.compress_ratio
    state_width = step.state_cache.shape[-1] // 2

    def per_token(values: np.ndarray, fill: int) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([values, np.full(pad_per_token, fill, values.dtype)])).to(DEVICE)

    kv_score = torch.from_numpy(step.kv_score).to(DEVICE)
    if split:
        kv, score = kv_score.split([state_width, state_width], dim=-1)
    else:  # two separate allocations
        kv, score = kv_score[:, :state_width].clone(), kv_score[:, state_width:].clone()
    state_owner, state_cache = _tensor(step.state_cache)
    k_owner, kv_cache = _tensor(step.k_cache, CACHE_DTYPE[step.layout])
    slot_mapping = torch.from_numpy(b.slot_mapping).to(DEVICE)
    positions = per_token(b.positions, 10**6)
    pdl_kwargs = {"launch_pdl": False}
    save(kv=kv, score=score, ape=torch.from_numpy(step.ape).to(DEVICE), positions=positions, state_cache=state_cache,
         slot_mapping=slot_mapping, block_size=b.block_size, state_width=state_width, compress_ratio=ratio,
         pdl_kwargs=pdl_kwargs)
    _, weight = _tensor(step.weight)  # uint16 patterns become bfloat16
    compress(
        state_cache=state_cache, num_actual=slot_mapping.shape[0], token_to_req_indices=per_token(b.token_to_req_indices, 10**6),
        positions=positions, slot_mapping=slot_mapping, block_table=torch.from_numpy(b.block_table.clip(min=0)).to(DEVICE),
        block_size=b.block_size, state_width=state_width, cos_sin_cache=torch.from_numpy(step.cos_sin).to(DEVICE),
        kv_cache=kv_cache, k_cache_metadata=SimpleNamespace(slot_mapping=per_token(b.kv_slot_mapping, 0)),
        pdl_kwargs=pdl_kwargs, head_dim=512, rope_head_dim=64, compress_ratio=ratio, overlap=ratio == 4,
        use_fp4_cache=False, rms_norm_weight=weight, rms_norm_eps=1e-6, quant_block=64, token_stride=576, scale_dim=8,
        **extra,
    )
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return state_owner.cpu().numpy(), k_owner.cpu().numpy()


def _assert_same_bytes(expected: tuple[np.ndarray, np.ndarray], actual: tuple[np.ndarray, np.ndarray]) -> None:
    for name, want, got in zip(("state_cache", "k_cache"), expected, actual):
        differ = np.flatnonzero(want != got)
        assert differ.size == 0, f"{name}: {differ.size} bytes differ, the first at byte {differ[0]}"


# ---- the signatures ------------------------------------------------------------------------------
def test_signatures_are_vllms_keyword_for_keyword():
    for function in (vllm.save_partial_states, vllm.save_partial_states_cutedsl):
        assert list(inspect.signature(function).parameters) == VLLM_SAVE
    assert list(inspect.signature(vllm.compress_norm_rope_store_triton).parameters) == VLLM_COMPRESS
    assert list(inspect.signature(vllm.compress_norm_rope_store_cutedsl).parameters) == VLLM_COMPRESS + VLLM_CUTEDSL_EXTRA


# ---- Triton (interpreter on CPU) -----------------------------------------------------------------
@pytest.mark.parametrize("ratio, bf16_weight", [(4, False), (4, True), (128, True)])
def test_triton_adapters_write_the_specs_bytes(ratio, bf16_weight):
    step = _step(ratio, bf16_weight=bf16_weight, seed=ratio + bf16_weight)
    assert step.batch.active.any() and not step.batch.active.all()
    actual = _run_like_vllm(step, vllm.save_partial_states, vllm.compress_norm_rope_store_triton, pad_per_token=3)
    _assert_same_bytes(_expected(step), actual)


def test_kv_and_score_from_separate_allocations_give_the_same_bytes():
    step = _step(4, seed=7)
    actual = _run_like_vllm(step, vllm.save_partial_states, vllm.compress_norm_rope_store_triton, split=False)
    _assert_same_bytes(_expected(step), actual)


def test_split_halves_are_viewed_not_copied():
    kv_score = torch.arange(6 * 8, dtype=torch.float32).reshape(6, 8)
    kv, score = kv_score.split([4, 4], dim=-1)
    joined = vllm._kv_score(kv, score, 4)
    assert joined.data_ptr() == kv_score.data_ptr() and torch.equal(joined, kv_score)
    widened = vllm._kv_score(kv.bfloat16(), score.bfloat16(), 4)  # bf16 is widened exactly
    assert widened.dtype == torch.float32 and torch.equal(widened, kv_score)


def test_halves_past_the_end_of_kvs_storage_are_copied():
    # score sits right after kv in every row, but kv's storage ends before score's last row: the
    # view over kv's storage would run out of it, so the halves are joined by a copy
    rows = torch.arange(4 * 8, dtype=torch.float32)
    short = rows.untyped_storage()[0:(8 + 4) * 4]  # rows 0 and 1's kv, not row 1's score
    kv = torch.empty(0).set_(short, 0, (2, 4), (8, 1))
    score = rows.view(4, 8)[:2, 4:]
    joined = vllm._kv_score(kv, score, 4)
    assert joined.data_ptr() != kv.data_ptr() and torch.equal(joined, rows.view(4, 8)[:2])


def _compress_kwargs(step: Step, **changes) -> dict:
    b = step.batch
    state_width = step.state_cache.shape[-1] // 2
    kwargs = dict(
        state_cache=torch.from_numpy(step.state_cache.copy()), num_actual=b.num_tokens,
        token_to_req_indices=torch.from_numpy(b.token_to_req_indices), positions=torch.from_numpy(b.positions),
        slot_mapping=torch.from_numpy(b.slot_mapping), block_table=torch.from_numpy(b.block_table.clip(min=0)),
        block_size=b.block_size, state_width=state_width, cos_sin_cache=torch.from_numpy(step.cos_sin),
        kv_cache=torch.from_numpy(step.k_cache.copy()), k_cache_metadata=SimpleNamespace(slot_mapping=torch.from_numpy(b.kv_slot_mapping)),
        pdl_kwargs={}, head_dim=512, rope_head_dim=64, compress_ratio=b.compress_ratio, overlap=b.compress_ratio == 4,
        use_fp4_cache=False, rms_norm_weight=torch.from_numpy(step.weight), rms_norm_eps=1e-6, quant_block=64,
        token_stride=576, scale_dim=8,
    )
    kwargs.update(changes)
    return kwargs


@pytest.mark.parametrize("changes, argument", [
    (dict(head_dim=128), "head_dim"),
    (dict(use_fp4_cache=True), "use_fp4_cache"),
    (dict(rope_head_dim=32), "rope_head_dim"),
    (dict(token_stride=512), "token_stride"),
    (dict(scale_dim=4), "scale_dim"),
    (dict(quant_block=128), "quant_block"),
    (dict(overlap=False), "overlap"),
    (dict(state_width=512), "state_width"),
    (dict(compress_ratio=8), "compress_ratio"),
    (dict(num_actual=10**4), "num_actual"),
    (dict(k_cache_metadata=object()), "k_cache_metadata"),
])
def test_parameters_the_project_fixes_are_checked_before_anything_is_written(changes, argument):
    step = _step(4, seed=3)
    kwargs = _compress_kwargs(step, **changes)
    before = kwargs["kv_cache"].clone()
    with pytest.raises(ValueError, match=argument):
        vllm.compress_norm_rope_store_triton(**kwargs)
    assert torch.equal(kwargs["kv_cache"], before)


def test_save_checks_kv_and_score():
    step = _step(4, seed=4)
    b = step.batch
    kv_score = torch.from_numpy(step.kv_score)
    state = torch.from_numpy(step.state_cache.copy())
    base = dict(ape=torch.from_numpy(step.ape), positions=torch.from_numpy(b.positions), state_cache=state,
                slot_mapping=torch.from_numpy(b.slot_mapping), block_size=b.block_size, state_width=1024, compress_ratio=4)
    with pytest.raises(ValueError, match="score"):
        vllm.save_partial_states(kv=kv_score[:, :1024], score=kv_score[:, :512], **base)
    with pytest.raises(ValueError, match="kv"):
        vllm.save_partial_states(kv=kv_score[:, :1024].double(), score=kv_score[:, 1024:].double(), **base)
    with pytest.raises(ValueError, match="state_width"):
        vllm.save_partial_states(kv=kv_score[:, :1024], score=kv_score[:, 1024:], **{**base, "state_width": 512})
    assert torch.equal(state, torch.from_numpy(step.state_cache))


# ---- CuTe DSL (GPU) ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("ratio, layout, bf16_weight", [
    (4, "flashmla_fp8", False), (4, "flashmla_fp8", True), (128, "flashmla_fp8", True),
    (4, "bf16", False), (128, "fp8_per_tensor", True),
])
def test_cutedsl_adapters_write_the_specs_bytes(ratio, layout, bf16_weight):
    step = _step(ratio, layout=layout, bf16_weight=bf16_weight, seed=10 + ratio)
    extra = dict(store_full_kv=layout != "flashmla_fp8", store_full_fp8=layout == "fp8_per_tensor",
                 fp8_scale=torch.tensor([step.fp8_scale], device=DEVICE) if step.fp8_scale else None)
    actual = _run_like_vllm(step, vllm.save_partial_states_cutedsl, vllm.compress_norm_rope_store_cutedsl,
                            pad_per_token=5, **extra)
    _assert_same_bytes(_expected(step), actual)


@pytest.mark.gpu
def test_triton_adapters_on_the_gpu():
    step = _step(128, bf16_weight=True, seed=21)
    actual = _run_like_vllm(step, vllm.save_partial_states, vllm.compress_norm_rope_store_triton, pad_per_token=2)
    _assert_same_bytes(_expected(step), actual)
