"""Public Triton entry points of DeepSeek-V4.1's compressors (SPEC §14.7): SPEC §14.8 validation on
the host, then exactly one launch.

- :func:`v41_compress_norm`: §14.3 (ratio 2 saves its rows after the compress, in the same launch);
- :func:`v41_rope_quant_store`: §14.4-§14.5 from the latent;
- :func:`v41_compress_norm_rope_store`: both in one launch (``latent`` may be ``None``);
- :func:`v41_index_key_store`: §14.6;
- :func:`v41_warm_up`: compile a layer's kernels before CUDA-graph capture.

Arguments are those of ``spec.v41_operator`` in the same order, as torch tensors (bf16 as
``torch.bfloat16``, ``fp8_per_tensor``'s cache as ``torch.float8_e4m3fn``), on CUDA, or on CPU
under ``TRITON_INTERPRET=1``; buffers are written in place. As in :mod:`.api`, the first call
with an argument layout validates it and builds a launch plan (grid, stride arguments,
constexprs); later calls with the same layout look the plan up and launch. While
``torch.compile`` traces, each operation is its custom op ``torch.ops.dsv4_compressor.triton_v41_*``
(:mod:`.v41_ops`), one graph node and no graph break.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from .. import custom_ops
from ..frontend import flashmla_page_view, layout_key
from ..plan_cache import PlanCache
from ..v41_frontend import (
    V41StateArguments, v41_compress_key, validate_v41_compress_norm, validate_v41_compress_norm_rope_store,
    validate_v41_index_key_store, validate_v41_rope_quant_store,
)
from .api import _check_device
from .launch import Launcher
from .v41_kernels import (
    CompressStatic, IndexKeyStatic, StoreStatic, v41_compress_kernel, v41_index_key_kernel, v41_rope_quant_store_kernel,
)

log = logging.getLogger("dsv4_compressor")

_PLANS = PlanCache()
BF16 = torch.bfloat16


# ---- argument groups: the kernels' tuples, from the call's tensors ------------------------------------
def _stride16(tensor: torch.Tensor, dim: int) -> int:
    """``tensor.stride(dim)`` in 16-byte units (validated to be whole units wherever the dimension
    has more than one index; 0 otherwise: only index 0 is addressed)."""
    if tensor.shape[dim] <= 1:
        return 0
    return tensor.stride(dim) * tensor.element_size() // 16


def _values(tensor: torch.Tensor) -> torch.Tensor:
    """The kernel's view of fp32 or bf16 data: bf16 as int16 bit patterns (exact under the interpreter too)."""
    return tensor.view(torch.int16) if tensor.dtype == BF16 else tensor


def _state_group(state: V41StateArguments) -> tuple:
    """:mod:`.v41_rows`' state group: the state, its strides, the block table, ``bs``, ``C`` (0: paged)."""
    cache, table = state.state_cache, state.block_table
    return (_values(cache), _stride16(cache, 0), _stride16(cache, 1), table, table.stride(0), int(state.bs),
            int(state.ring_capacity or 0))


def _cache_group(k_cache: torch.Tensor, layout: str, entries_per_page: int, fp8_scale) -> tuple:
    """:mod:`.v41_records`' cache group: uint8 and int16 views, page and entry strides, ``B``, ``fp8_scale``."""
    scale = 1.0 if fp8_scale is None else float(fp8_scale)
    if layout == "bf16":
        values = k_cache.view(torch.int16)
        return values, values, values.stride(0), values.stride(1), entries_per_page, scale
    if layout == "fp8_per_tensor":
        codes = k_cache.view(torch.uint8)
        return codes, codes, codes.stride(0), codes.stride(1), entries_per_page, scale
    pages = flashmla_page_view(k_cache)  # uint8 [num_pages, B*E], strides (page_stride, 1)
    i16 = pages.view(torch.int16) if layout == "flashmla_fp8" else pages  # the RoPE bf16 values of flashmla_fp8
    return pages, i16, pages.stride(0), 0, entries_per_page, scale


def _latent_group(latent: torch.Tensor | None):
    return None if latent is None else (latent.view(torch.int16), _stride16(latent, 0))


@dataclass(frozen=True)
class _Plan:
    """A validated call's launch: the launcher and what the argument groups need beyond the tensors."""

    launch: Launcher
    eps: float  # binary32 rms_norm_eps (0.0 where unused)
    entries_per_page: int  # B (0 where unused)
    fp8_scale: float | None


def _compress_static(check, kv, score, state: V41StateArguments, rms_norm_weight, latent, layout) -> CompressStatic:
    ratio2 = check.call.config.ratio == 2
    return CompressStatic(
        ratio=check.call.config.ratio, kv_bf16=kv.dtype == BF16, score_bf16=ratio2 and score.dtype == BF16,
        state_bf16=ratio2 and state.state_cache.dtype == BF16,
        ring=ratio2 and check.state.state_format.ring_capacity is not None, weight_bf16=rms_norm_weight.dtype == BF16,
        latent=latent is not None, layout=layout)


def _launch_compress(plan: _Plan, kv, score, positions, state: V41StateArguments, rms_norm_weight, kv_slot_mapping,
                     latent, rope, cache) -> None:
    """Build :func:`v41_compress_kernel`'s argument groups from the call's tensors and launch."""
    if score is None:  # ratio 1
        tokens, inputs, state_group = (positions, kv_slot_mapping), (_values(kv), _stride16(kv, 0)), None
    else:
        tokens = (positions, kv_slot_mapping, state.token_to_req, state.slot_mapping, state.save_slot_mapping,
                  state.query_start_loc)
        inputs = (_values(kv), _stride16(kv, 0), _values(score), _stride16(score, 0))
        state_group = _state_group(state)
    plan.launch(tokens, inputs, state_group, (_values(rms_norm_weight), plan.eps), _latent_group(latent), rope, cache)


# ---- the four operations -------------------------------------------------------------------------
@custom_ops.traced_as_op("triton", "v41_compress_norm")
def v41_compress_norm(
    kv: torch.Tensor,  # fp32 or bf16 [T, 512]: the wkv projection
    score: torch.Tensor | None,  # fp32 or bf16 [T, 512]: the raw wgate projection; None for ratio 1
    positions: torch.Tensor,  # int64 [T]
    token_to_req: torch.Tensor | None,  # int32 [T] (ratio 2)
    query_start_loc: torch.Tensor | None,  # int32 [num_reqs + 1] (ratio 2)
    slot_mapping: torch.Tensor | None,  # int64 [T]: state slot, -1 = padding (ratio 2)
    save_slot_mapping: torch.Tensor | None,  # int64 [T]: saved after the compress, -1 = not saved (ratio 2)
    block_table: torch.Tensor | None,  # int32 [num_reqs, max_blocks] (ratio 2)
    bs: int | None,  # rows per state block (ratio 2)
    state_cache: torch.Tensor | None,  # fp32 or bf16 [num_state_blocks, bs, 1024], written in place (ratio 2)
    rms_norm_weight: torch.Tensor,  # fp32 or bf16 [512]
    rms_norm_eps: float,
    kv_slot_mapping: torch.Tensor,  # int64 [T]: compressed-cache slot, -1 = none
    latent: torch.Tensor,  # bf16 [T, 512], written in place: the rows of active tokens
    *,
    compress_ratio: int,  # 1 or 2
    ring_capacity: int | None = None,  # ratio 2: None (paged) or C rows per request
    ape=None,  # must be None (SPEC §14.8)
    debug: bool = False,
) -> None:
    """SPEC §14.3 in one launch: ``latent[t] = bf16(RMSNorm(bf16(x)))`` for every active token;
    ratio 2 then saves every token with ``save_slot_mapping >= 0``. Ratio 1 reads none of the
    state arguments but ``state_cache`` (which must be ``None``)."""
    state = V41StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs, state_cache,
                              ring_capacity)
    key = None if debug or ape is not None else v41_compress_key(kv, score, positions, state, rms_norm_weight, rms_norm_eps,
                                                              kv_slot_mapping, latent, ("compress_norm", compress_ratio, type(compress_ratio)))

    def build():
        check = validate_v41_compress_norm(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping,
                                           latent, compress_ratio=compress_ratio, ape=ape, debug=debug)
        _check_device("kv", kv)
        if check.call.num_tokens == 0:
            return None
        static = _compress_static(check, kv, score, state, rms_norm_weight, latent, None)
        return _Plan(Launcher(v41_compress_kernel, (check.call.num_tokens,), static.constants()), float(check.call.eps), 0,
                     None)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        _launch_compress(plan, kv, score, positions, state, rms_norm_weight, kv_slot_mapping, latent, None, None)


@custom_ops.traced_as_op("triton", "v41_rope_quant_store")
def v41_rope_quant_store(
    latent: torch.Tensor,  # bf16 [T, 512]: read for the tokens that store
    positions: torch.Tensor,  # int64 [T]
    kv_slot_mapping: torch.Tensor,  # int64 [T]: compressed-cache slot, -1 = none
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    k_cache: torch.Tensor,  # flashmla_fp8: uint8 [pages, B, 584]; bf16: bf16 [pages, B, 512]; fp8_per_tensor: float8_e4m3fn [pages, B, 512]; v41_mxfp8: uint8 [pages, B, 528]; v41_nvfp4: uint8 [pages, B, 288]
    *,
    compress_ratio: int,  # 1 or 2
    layout: str,
    fp8_scale: float | None = None,  # fp8_per_tensor only
    debug: bool = False,
) -> None:
    """SPEC §14.4-§14.5 in one launch: for every token with ``kv_slot_mapping >= 0`` at a boundary
    position, rotate its latent row and store the record of ``z`` at its slot."""
    key = None if debug else (*(layout_key(t) for t in (latent, positions, kv_slot_mapping, cos_sin_cache, k_cache)),
                              compress_ratio, layout, fp8_scale, type(compress_ratio), type(fp8_scale), "rope_quant_store")

    def build():
        call = validate_v41_rope_quant_store(latent, positions, kv_slot_mapping, cos_sin_cache, k_cache,
                                             compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale, debug=debug)
        _check_device("latent", latent)
        if call.num_tokens == 0:
            return None
        static = StoreStatic(ratio=call.config.ratio, layout=call.layout)
        scale = None if call.fp8_scale is None else float(call.fp8_scale)
        return _Plan(Launcher(v41_rope_quant_store_kernel, (call.num_tokens,), static.constants()), 0.0,
                     call.entries_per_page, scale)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        plan.launch((positions, kv_slot_mapping), _latent_group(latent), (cos_sin_cache, cos_sin_cache.stride(0)),
                    _cache_group(k_cache, layout, plan.entries_per_page, plan.fp8_scale))


@custom_ops.traced_as_op("triton", "v41_compress_norm_rope_store")
def v41_compress_norm_rope_store(
    kv: torch.Tensor,  # fp32 or bf16 [T, 512]
    score: torch.Tensor | None,  # fp32 or bf16 [T, 512]; None for ratio 1
    positions: torch.Tensor,  # int64 [T]
    token_to_req: torch.Tensor | None,  # int32 [T] (ratio 2)
    query_start_loc: torch.Tensor | None,  # int32 [num_reqs + 1] (ratio 2)
    slot_mapping: torch.Tensor | None,  # int64 [T] (ratio 2)
    save_slot_mapping: torch.Tensor | None,  # int64 [T] (ratio 2)
    block_table: torch.Tensor | None,  # int32 [num_reqs, max_blocks] (ratio 2)
    bs: int | None,  # (ratio 2)
    state_cache: torch.Tensor | None,  # fp32 or bf16 [num_state_blocks, bs, 1024], written in place (ratio 2)
    rms_norm_weight: torch.Tensor,  # fp32 or bf16 [512]
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    k_cache: torch.Tensor,  # as for v41_rope_quant_store, written in place
    kv_slot_mapping: torch.Tensor,  # int64 [T]
    latent: torch.Tensor | None,  # bf16 [T, 512] written in place, or None (not written)
    *,
    compress_ratio: int,  # 1 or 2
    layout: str,
    ring_capacity: int | None = None,
    fp8_scale: float | None = None,
    ape=None,  # must be None (SPEC §14.8)
    debug: bool = False,
) -> None:
    """:func:`v41_compress_norm` then :func:`v41_rope_quant_store` in ONE launch (pool, norm, bf16
    latent, RoPE, record; ratio 2's save last), every check made before it. Each token active in
    §14.3's sense writes its latent row (when ``latent`` is given) and its record."""
    state = V41StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs, state_cache,
                              ring_capacity)
    key = None if debug or ape is not None else v41_compress_key(
        kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent,
        ("compress_norm_rope_store", compress_ratio, layout, fp8_scale, layout_key(cos_sin_cache), layout_key(k_cache),
         type(compress_ratio), type(fp8_scale)))

    def build():
        check = validate_v41_compress_norm_rope_store(
            kv, score, positions, state, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, latent,
            compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale, ape=ape, debug=debug)
        _check_device("kv", kv)
        call, store = check.compress.call, check.store
        if call.num_tokens == 0:
            return None
        static = _compress_static(check.compress, kv, score, state, rms_norm_weight, latent, store.layout)
        scale = None if store.fp8_scale is None else float(store.fp8_scale)
        return _Plan(Launcher(v41_compress_kernel, (call.num_tokens,), static.constants()), float(call.eps),
                     store.entries_per_page, scale)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        _launch_compress(plan, kv, score, positions, state, rms_norm_weight, kv_slot_mapping, latent,
                         (cos_sin_cache, cos_sin_cache.stride(0)),
                         _cache_group(k_cache, layout, plan.entries_per_page, plan.fp8_scale))


@custom_ops.traced_as_op("triton", "v41_index_key_store")
def v41_index_key_store(
    k_pre: torch.Tensor,  # bf16 [T, 128]: wk(latent)
    positions: torch.Tensor,  # int64 [T]
    kv_slot_mapping: torch.Tensor,  # int64 [T]: the slot in the indexer's cache, -1 = none
    rms_norm_weight: torch.Tensor,  # fp32 or bf16 [128]
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    k_cache: torch.Tensor,  # indexer_fp8: uint8 [pages, B, 132]; indexer_mxfp4: uint8 [pages, B, 68]; written in place
    *,
    compress_ratio: int,  # 1 or 2
    layout: str,  # indexer_fp8 or indexer_mxfp4
    debug: bool = False,
) -> None:
    """SPEC §14.6 in one launch: for every token with ``kv_slot_mapping >= 0`` at a boundary
    position, norm ``k_pre`` into bf16, rotate channels 64..127 (bf16 outputs, no Hadamard
    rotation) and store §12's record."""
    key = None if debug else (
        *(layout_key(t) for t in (k_pre, positions, kv_slot_mapping, rms_norm_weight, cos_sin_cache, k_cache)),
        rms_norm_eps, compress_ratio, layout, type(rms_norm_eps), type(compress_ratio), "index_key_store")

    def build():
        call = validate_v41_index_key_store(k_pre, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps,
                                            cos_sin_cache, k_cache, compress_ratio=compress_ratio, layout=layout,
                                            debug=debug)
        _check_device("k_pre", k_pre)
        if call.num_tokens == 0:
            return None
        static = IndexKeyStatic(ratio=call.config.ratio, layout=call.layout, weight_bf16=rms_norm_weight.dtype == BF16)
        return _Plan(Launcher(v41_index_key_kernel, (call.num_tokens,), static.constants()), float(call.eps),
                     call.entries_per_page, None)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        pages = flashmla_page_view(k_cache)
        plan.launch((positions, kv_slot_mapping), (k_pre.view(torch.int16), k_pre.stride(0)),
                    (_values(rms_norm_weight), plan.eps), (cos_sin_cache, cos_sin_cache.stride(0)),
                    (pages, pages.stride(0), plan.entries_per_page))


# ---- warm-up ----------------------------------------------------------------------------------------
def v41_warm_up(*, compress_ratio: int, layout: str | None, entries_per_page: int, block_size: int | None = None,
                ring_capacity: int | None = None, kv_dtype: torch.dtype = BF16, state_dtype: torch.dtype = torch.float32,
                weight_dtype: torch.dtype = BF16, latent: bool = True, split: bool = False,
                index_key_layout: str | None = None, index_weight_dtype: torch.dtype = BF16, device="cuda",
                fp8_scale: float | None = None) -> None:
    """Compile a V4.1 layer's kernels before CUDA-graph capture: one launch of each on a one-token
    step whose token is padding (nothing is written).

    ``layout``: the record (None: only :func:`v41_compress_norm`); ``split``: the layer calls
    :func:`v41_compress_norm` and :func:`v41_rope_quant_store` (else the combined call, with a
    latent when ``latent``); ``index_key_layout``: also :func:`v41_index_key_store`. Ratio 2 takes
    ``block_size`` (default 8), ``ring_capacity`` and ``state_dtype``; ``kv_dtype`` is the dtype of
    ``kv`` and ``score``. The dummy tensors are contiguous (Triton specializes on 16-byte
    alignment and strides divisible by 16): a layer whose tensors differ compiles once more.
    """
    from ...spec.entry_layout import RECORD_LAYOUTS

    device = torch.device(device)
    start = time.perf_counter()
    zeros = lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
    padding, positions = torch.full((1,), -1, dtype=torch.int64, device=device), zeros(1, torch.int64)
    bs = block_size or 8
    ratio2 = compress_ratio == 2
    state = dict(score=zeros((1, 512), kv_dtype) if ratio2 else None,
                 token_to_req=zeros(1, torch.int32) if ratio2 else None,
                 query_start_loc=zeros(2, torch.int32) if ratio2 else None, slot_mapping=padding if ratio2 else None,
                 save_slot_mapping=padding if ratio2 else None,
                 block_table=zeros((1, max(1, (ring_capacity or bs) // bs)), torch.int32) if ratio2 else None,
                 bs=bs if ratio2 else None, state_cache=zeros((1, bs, 1024), state_dtype) if ratio2 else None)
    kv, weight, cos_sin = zeros((1, 512), kv_dtype), torch.ones(512, dtype=weight_dtype, device=device), zeros((1, 64), torch.float32)
    latent_t = zeros((1, 512), BF16)

    def cache(name):
        if name in RECORD_LAYOUTS:
            return zeros((1, entries_per_page, RECORD_LAYOUTS[name].entry_bytes), torch.uint8)
        return zeros((1, entries_per_page, 512), torch.uint8).view(BF16 if name == "bf16" else torch.float8_e4m3fn)

    common = dict(compress_ratio=compress_ratio)
    if layout is None or split:
        v41_compress_norm(kv, positions=positions, rms_norm_weight=weight, rms_norm_eps=1e-6, kv_slot_mapping=padding,
                          latent=latent_t, ring_capacity=ring_capacity if ratio2 else None, **state, **common)
    if layout is not None and split:
        v41_rope_quant_store(latent_t, positions, padding, cos_sin, cache(layout), layout=layout, fp8_scale=fp8_scale,
                             **common)
    elif layout is not None:
        v41_compress_norm_rope_store(kv, positions=positions, rms_norm_weight=weight, rms_norm_eps=1e-6,
                                     cos_sin_cache=cos_sin, k_cache=cache(layout), kv_slot_mapping=padding,
                                     latent=latent_t if latent else None, layout=layout,
                                     ring_capacity=ring_capacity if ratio2 else None, fp8_scale=fp8_scale, **state,
                                     **common)
    if index_key_layout is not None:
        v41_index_key_store(zeros((1, 128), BF16), positions, padding, torch.ones(128, dtype=index_weight_dtype,
                                                                                  device=device),
                            1e-6, cos_sin, cache(index_key_layout), layout=index_key_layout, **common)
    log.info("triton v41_warm_up: ratio %d %s%s B=%d in %.1f s", compress_ratio, layout, " split" if split else "",
             entries_per_page, time.perf_counter() - start)
