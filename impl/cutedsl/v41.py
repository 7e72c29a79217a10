"""Public CuTe DSL entry points of DeepSeek-V4.1's compressors (SPEC §14.7): SPEC §14.8 validation
on the host, then exactly one launch.

- :func:`v41_compress_norm`: §14.3 (ratio 2 saves its rows after the compress, in the same launch);
- :func:`v41_rope_quant_store`: §14.4-§14.5 from the latent;
- :func:`v41_compress_norm_rope_store`: both in one launch (``latent`` may be ``None``);
- :func:`v41_index_key_store`: §14.6;
- :func:`v41_warm_up`: compile a layer's kernels before CUDA-graph capture (no launch).

Arguments are those of ``spec.v41_operator`` in the same order, with the signatures of the
Triton family's (``impl/triton/v41.py``), as CUDA torch tensors (bf16 as ``torch.bfloat16``,
``fp8_per_tensor``'s cache as ``torch.float8_e4m3fn``); buffers are written in place. Two
keywords more, as the V4 operations of this family have: ``pdl`` (programmatic dependent
launch, :mod:`.stages.dependent_launch`) and ``shapes`` (the thread mappings,
:class:`.host.v41_paths.V41Shapes`; the bytes do not depend on them).

As in :mod:`.api`, the first call with an argument layout validates it (the shared front end,
:mod:`dsv4_compressor.impl.v41_frontend`, raising ``ValueError`` before anything is compiled or
launched), builds the static configuration of the operation's kernel (:mod:`.host.v41_paths`),
compiles it (:mod:`.host.compile_cache`, once per configuration) and keeps the plan; later calls
with the same layout look the plan up and call the kernel's TVM-FFI function. ``debug=True``
always validates, and checks the caller's contract on the host. While ``torch.compile`` traces,
each operation is its custom op ``torch.ops.dsv4_compressor.cutedsl_v41_*`` (:mod:`.v41_ops`;
``pdl`` passed through, ``shapes`` the default), one graph node and no graph break. These kernels have been
compiled and PTX-checked for sm_90a but have not run on a GPU yet.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import custom_ops
from ..frontend import layout_key
from ..plan_cache import PlanCache
from ..v41_frontend import (
    V41StateArguments, v41_compress_key, validate_v41_compress_norm, validate_v41_compress_norm_rope_store,
    validate_v41_index_key_store, validate_v41_rope_quant_store,
)
from .host import buffers, plans
from .host.v41_paths import DEFAULT_V41_SHAPES, V41_PATHS, V41Request, V41Shapes, record_store_align

log = logging.getLogger("dsv4_compressor")

_PLANS = PlanCache()
BF16 = torch.bfloat16
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
# Under torch.compile each operation is its custom op (.v41_ops), which takes ``pdl`` but not
# ``shapes``: the thread mappings must be the default then (refused by name otherwise).
_FAMILY_OPTIONS = (("shapes", DEFAULT_V41_SHAPES, "the default thread mappings (DEFAULT_V41_SHAPES)"),)


@dataclass(frozen=True)
class V41Plan:
    """A validated call's kernel: its configuration, TVM-FFI function and trailing scalars."""

    config: object  # the kernel's static configuration (.v41_config)
    function: object  # the compiled kernel's TVM-FFI function
    scalars: tuple  # the launch's trailing scalars
    restride: bool = False  # a per-token array (or the block table) of extent 1 needs its unit stride restored


def _compile(kernel: str, request: V41Request):
    """``(config, compiled kernel, its TVM-FFI function)`` of a path for a request."""
    config = V41_PATHS[kernel].configs(request)
    compiled = plans.kernels().compile_kernel(kernel, config)
    return config, compiled, buffers.ffi_function(compiled)


def _unit(tensor):
    """A per-token array (or a 2-D table) with the unit last stride TVM-FFI expects (the same elements)."""
    if tensor is None or tensor.stride(-1) == 1:
        return tensor
    return buffers.unit_stride_1d(tensor) if tensor.dim() == 1 else buffers.unit_last_stride(tensor)


def _needs_restride(*tensors) -> bool:
    return any(t is not None and t.stride(-1) != 1 for t in tensors)


def _fp8_inv(fp8_scale) -> float:
    """``div(1, fp8_scale)`` in binary32 (``fp8_per_tensor``; 1.0 where unused)."""
    return 1.0 if fp8_scale is None else float(np.float32(1.0) / np.float32(fp8_scale))


def _record_align(layout: str, k_cache: torch.Tensor) -> int:
    return record_store_align(layout, k_cache.data_ptr(), tuple(k_cache.shape), tuple(k_cache.stride()),
                              k_cache.element_size())


def _compress_request(check, kv, score, state: V41StateArguments, rms_norm_weight, latent, store, k_cache,
                      shapes: V41Shapes, pdl: bool) -> V41Request:
    """The compress kernel's request from a validated call (``store``: the validated store, or None)."""
    ratio2 = check.call.config.ratio == 2
    layout = None if store is None else store.layout
    return V41Request(
        ratio=check.call.config.ratio, layout=layout, entries_per_page=1 if store is None else store.entries_per_page,
        store_align=16 if store is None else _record_align(layout, k_cache), kv_dtype=_DTYPE_NAMES[kv.dtype],
        score_dtype=_DTYPE_NAMES[score.dtype] if ratio2 else None,
        state_dtype=_DTYPE_NAMES[state.state_cache.dtype] if ratio2 else None,
        block_size=check.state.block_size if ratio2 else None,
        ring=ratio2 and check.state.state_format.ring_capacity is not None,
        weight_dtype=_DTYPE_NAMES[rms_norm_weight.dtype], latent=latent is not None, shapes=shapes, pdl=pdl)


def _check_choices(shapes, pdl) -> None:
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {pdl!r}")
    if not isinstance(shapes, V41Shapes):
        raise ValueError(f"shapes: expected a V41Shapes, got {type(shapes).__name__}")


def _compress_plan(check, kv, score, positions, state: V41StateArguments, rms_norm_weight, kv_slot_mapping, latent,
                   store, k_cache, shapes, pdl) -> V41Plan | None:
    """The plan of a validated compress (``store`` None: ``v41_compress_norm``)."""
    buffers.require_cuda("kv", kv)
    if check.call.num_tokens == 0:
        return None
    request = _compress_request(check, kv, score, state, rms_norm_weight, latent, store, k_cache, shapes, pdl)
    config, _, function = _compile("v41_compress", request)
    ring_capacity = int(check.state.state_format.ring_capacity or 0) if check.state is not None else 0
    scalars = (float(check.call.eps), _fp8_inv(None if store is None else store.fp8_scale), ring_capacity)
    per_token = (positions, kv_slot_mapping)
    if check.state is not None:
        per_token += (state.token_to_req, state.slot_mapping, state.save_slot_mapping, state.query_start_loc,
                      state.block_table)
    log.debug("cutedsl: %s T=%d -> %s", "v41_compress_norm" if store is None else "v41_compress_norm_rope_store",
              check.call.num_tokens, config.tag)
    return V41Plan(config, function, scalars, _needs_restride(*per_token))


def _store_plan(kernel: str, call, positions, kv_slot_mapping, scalars: tuple, **request) -> V41Plan | None:
    """The plan of a validated ``v41_rope_quant_store`` or ``v41_index_key_store`` (``kernel``:
    ``v41_store`` or ``v41_index_key``; None: no tokens): the spec's ``call`` gives the ratio, the
    layout and ``B``, ``request`` the kernel's other options, ``scalars`` the launch's trailing ones."""
    if call.num_tokens == 0:
        return None
    request = V41Request(ratio=call.config.ratio, layout=call.layout, entries_per_page=call.entries_per_page, **request)
    config, _, function = _compile(kernel, request)
    return V41Plan(config, function, scalars, _needs_restride(positions, kv_slot_mapping))


def _launch_compress(plan: V41Plan, kv, score, positions, state: V41StateArguments, rms_norm_weight, kv_slot_mapping,
                     latent, store: tuple | None) -> None:
    """The compress kernel's launch on the call's tensors (``store``: ``(cos_sin_cache, k_cache)``)."""
    group = None
    if plan.config.ratio == 2:
        group = (state.token_to_req, state.slot_mapping, state.save_slot_mapping, state.query_start_loc,
                 state.state_cache, state.block_table)
    if plan.restride:
        positions, kv_slot_mapping = _unit(positions), _unit(kv_slot_mapping)
        if group is not None:
            group = (*(_unit(t) for t in group[:4]), group[4], _unit(group[5]))
    arguments = V41_PATHS["v41_compress"].arguments(kv, score if plan.config.ratio == 2 else None, positions,
                                                    kv_slot_mapping, group, rms_norm_weight, latent, store,
                                                    plan.scalars)
    plan.function(*arguments)


# ---- the four operations -------------------------------------------------------------------------
@custom_ops.traced_as_op("cutedsl", "v41_compress_norm", _FAMILY_OPTIONS)
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
    pdl: bool = True,
    shapes: V41Shapes = DEFAULT_V41_SHAPES,
) -> None:
    """SPEC §14.3 in one launch: ``latent[t] = bf16(RMSNorm(bf16(x)))`` for every active token;
    ratio 2 then saves every token with ``save_slot_mapping >= 0``. Ratio 1 reads none of the
    state arguments but ``state_cache`` (which must be ``None``)."""
    state = V41StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs, state_cache,
                              ring_capacity)
    key = None if debug or ape is not None else v41_compress_key(
        kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent,
        ("compress_norm", compress_ratio, type(compress_ratio), pdl, shapes))

    def build():
        _check_choices(shapes, pdl)
        check = validate_v41_compress_norm(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping,
                                           latent, compress_ratio=compress_ratio, ape=ape, debug=debug)
        return _compress_plan(check, kv, score, positions, state, rms_norm_weight, kv_slot_mapping, latent, None, None,
                              shapes, pdl)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        _launch_compress(plan, kv, score, positions, state, rms_norm_weight, kv_slot_mapping, latent, None)


@custom_ops.traced_as_op("cutedsl", "v41_rope_quant_store", _FAMILY_OPTIONS)
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
    pdl: bool = True,
    shapes: V41Shapes = DEFAULT_V41_SHAPES,
) -> None:
    """SPEC §14.4-§14.5 in one launch: for every token with ``kv_slot_mapping >= 0`` at a boundary
    position, rotate its latent row and store the record of ``z`` at its slot."""
    key = None if debug else (*(layout_key(t) for t in (latent, positions, kv_slot_mapping, cos_sin_cache, k_cache)),
                              compress_ratio, layout, fp8_scale, type(compress_ratio), type(fp8_scale), pdl, shapes,
                              "rope_quant_store")

    def build():
        _check_choices(shapes, pdl)
        call = validate_v41_rope_quant_store(latent, positions, kv_slot_mapping, cos_sin_cache, k_cache,
                                             compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale, debug=debug)
        buffers.require_cuda("latent", latent)
        return _store_plan("v41_store", call, positions, kv_slot_mapping, (_fp8_inv(call.fp8_scale),),
                           store_align=_record_align(call.layout, k_cache), shapes=shapes, pdl=pdl)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        if plan.restride:
            positions, kv_slot_mapping = _unit(positions), _unit(kv_slot_mapping)
        plan.function(*V41_PATHS["v41_store"].arguments(latent, positions, kv_slot_mapping, cos_sin_cache, k_cache,
                                                         plan.scalars))


@custom_ops.traced_as_op("cutedsl", "v41_compress_norm_rope_store", _FAMILY_OPTIONS)
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
    pdl: bool = True,
    shapes: V41Shapes = DEFAULT_V41_SHAPES,
) -> None:
    """:func:`v41_compress_norm` then :func:`v41_rope_quant_store` in ONE launch (pool, norm, bf16
    latent, RoPE, record; ratio 2's save last), every check made before it. Each token active in
    §14.3's sense writes its latent row (when ``latent`` is given) and its record."""
    state = V41StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs, state_cache,
                              ring_capacity)
    key = None if debug or ape is not None else v41_compress_key(
        kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent,
        ("compress_norm_rope_store", compress_ratio, layout, fp8_scale, layout_key(cos_sin_cache), layout_key(k_cache),
         type(compress_ratio), type(fp8_scale), pdl, shapes))

    def build():
        _check_choices(shapes, pdl)
        check = validate_v41_compress_norm_rope_store(
            kv, score, positions, state, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, latent,
            compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale, ape=ape, debug=debug)
        return _compress_plan(check.compress, kv, score, positions, state, rms_norm_weight, kv_slot_mapping, latent,
                              check.store, k_cache, shapes, pdl)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        _launch_compress(plan, kv, score, positions, state, rms_norm_weight, kv_slot_mapping, latent,
                         (cos_sin_cache, k_cache))


@custom_ops.traced_as_op("cutedsl", "v41_index_key_store", _FAMILY_OPTIONS)
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
    pdl: bool = True,
    shapes: V41Shapes = DEFAULT_V41_SHAPES,
) -> None:
    """SPEC §14.6 in one launch: for every token with ``kv_slot_mapping >= 0`` at a boundary
    position, norm ``k_pre`` into bf16, rotate channels 64..127 (bf16 outputs, no Hadamard
    rotation) and store §12's record."""
    key = None if debug else (*(layout_key(t) for t in (k_pre, positions, kv_slot_mapping, rms_norm_weight, cos_sin_cache,
                                                        k_cache)),
                              rms_norm_eps, compress_ratio, layout, type(rms_norm_eps), type(compress_ratio), pdl, shapes,
                              "index_key_store")

    def build():
        _check_choices(shapes, pdl)
        call = validate_v41_index_key_store(k_pre, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps,
                                            cos_sin_cache, k_cache, compress_ratio=compress_ratio, layout=layout,
                                            debug=debug)
        buffers.require_cuda("k_pre", k_pre)
        return _store_plan("v41_index_key", call, positions, kv_slot_mapping, (float(call.eps),),
                           weight_dtype=_DTYPE_NAMES[rms_norm_weight.dtype], shapes=shapes, pdl=pdl)

    plan = _PLANS.lookup(key, build)
    if plan is not None:
        if plan.restride:
            positions, kv_slot_mapping = _unit(positions), _unit(kv_slot_mapping)
        plan.function(*V41_PATHS["v41_index_key"].arguments(k_pre, positions, kv_slot_mapping, rms_norm_weight,
                                                             cos_sin_cache, k_cache, plan.scalars))


# ---- warm-up ----------------------------------------------------------------------------------------
def _dtype_name(name: str, dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"{name}: expected torch.float32 or torch.bfloat16, got {dtype!r}")
    return _DTYPE_NAMES[dtype]


def v41_warm_up(*, compress_ratio: int, layout: str | None, entries_per_page: int, block_size: int | None = None,
                ring_capacity: int | None = None, kv_dtype: torch.dtype = BF16, state_dtype: torch.dtype = torch.float32,
                weight_dtype: torch.dtype = BF16, latent: bool = True, split: bool = False,
                index_key_layout: str | None = None, index_weight_dtype: torch.dtype = BF16, device="cuda",
                fp8_scale: float | None = None, store_align: int | None = None, pdl: bool = True,
                shapes: V41Shapes = DEFAULT_V41_SHAPES) -> list:
    """Compile a V4.1 layer's kernels before CUDA-graph capture (compiles only: nothing is launched).

    The arguments are the Triton family's ``v41_warm_up``'s: ``layout``: the record (None: only
    :func:`v41_compress_norm`); ``split``: the layer calls :func:`v41_compress_norm` and
    :func:`v41_rope_quant_store` (else the combined call, with a latent when ``latent``);
    ``index_key_layout``: also :func:`v41_index_key_store`. Ratio 2 takes ``block_size`` (default
    8), ``ring_capacity`` and ``state_dtype``; ``kv_dtype`` is the dtype of ``kv`` and ``score``.
    ``device`` and ``fp8_scale`` change no kernel (accepted for the same calls as Triton's);
    ``store_align``: for the ``bf16`` / ``fp8_per_tensor`` rows, the byte alignment of the
    cache's rows (default the aligned one: 8 for bf16, 4 for fp8_per_tensor). Returns the static
    configurations compiled."""
    start = time.perf_counter()
    if isinstance(compress_ratio, bool) or compress_ratio not in (1, 2):
        raise ValueError(f"compress_ratio: expected 1 or 2, got {compress_ratio!r}")
    _check_choices(shapes, pdl)
    ratio2 = compress_ratio == 2
    common = dict(ratio=compress_ratio, entries_per_page=entries_per_page, shapes=shapes, pdl=pdl)
    compress = dict(kv_dtype=_dtype_name("kv_dtype", kv_dtype), weight_dtype=_dtype_name("weight_dtype", weight_dtype),
                    score_dtype=_dtype_name("kv_dtype", kv_dtype) if ratio2 else None,
                    state_dtype=_dtype_name("state_dtype", state_dtype) if ratio2 else None,
                    block_size=(block_size or 8) if ratio2 else None, ring=ratio2 and ring_capacity is not None)
    wanted = []
    if layout is None or split:
        wanted.append(("v41_compress", V41Request(layout=None, latent=True, **compress, **common)))
    if layout is not None and split:
        wanted.append(("v41_store", V41Request(layout=layout, store_align=store_align, **common)))
    elif layout is not None:
        wanted.append(("v41_compress", V41Request(layout=layout, store_align=store_align, latent=latent, **compress,
                                                  **common)))
    if index_key_layout is not None:
        wanted.append(("v41_index_key", V41Request(layout=index_key_layout,
                                                   weight_dtype=_dtype_name("index_weight_dtype", index_weight_dtype),
                                                   **common)))
    configs = [_compile(kernel, request)[0] for kernel, request in wanted]
    log.info("cutedsl v41_warm_up: ratio %d %s%s B=%d in %.1f s", compress_ratio, layout, " split" if split else "",
             entries_per_page, time.perf_counter() - start)
    return configs


__all__ = ["V41Plan", "V41Shapes", "v41_compress_norm", "v41_compress_norm_rope_store", "v41_index_key_store",
           "v41_rope_quant_store", "v41_warm_up"]
