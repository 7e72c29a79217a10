"""Public Triton entry points: SPEC §9 validation on the host, then the launches (one for a save and a
C4 compress; C128's split path two; a step call its compress's, then the save's).

Both functions take torch tensors (CUDA tensors; CPU tensors when ``TRITON_INTERPRET=1`` was set
before import) and write in place. Validation runs first and raises ``ValueError`` before any
memory is touched. Kernels are launched with ``enable_fp_fusion=False`` (SPEC §2: no FMA).

The first call with a given argument layout (dtypes, shapes, strides, devices, base
alignment, scalars, config) validates and builds a *launch plan*: the grid, the stride
arguments and the compile-time constants. Later calls with the same layout pay a key of
tensor metadata, a dictionary lookup and the compiled kernel's launch (:mod:`.launch`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import NamedTuple

import torch

from .. import custom_ops
from ..frontend import (flashmla_page_view, layout_key, validate_compress_and_save, validate_compress_norm_rope_store,
                        validate_save_partial_states)
from ..plan_cache import PlanCache
from ...spec.constants import HEAD_DIMS, INDEXER_HEAD_DIM
from ...spec.validation import STATE_CACHE_DTYPES
from .config import FusedConfig, SaveConfig, SplitConfig, compress_config, save_config
from .fused import compress_norm_rope_store_kernel, kernel_constants
from .launch import Launcher
from .rows import row_format
from .save_states import save_partial_states_kernel
from .split_launch import SplitLaunch, split_constants


log = logging.getLogger("dsv4_compressor")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


#: Devices whose tensors the kernels accept: CPU tensors under the Triton interpreter, else CUDA.
SUPPORTED_DEVICES: tuple[str, ...] = ("cpu",) if _interpreting() else ("cuda",)
_compiling = torch.compiler.is_compiling  # True while torch.compile traces: the calls take their custom op


def _check_device(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type not in SUPPORTED_DEVICES:
        mode = "TRITON_INTERPRET=1 (interpreter)" if SUPPORTED_DEVICES == ("cpu",) else "compiled Triton"
        raise ValueError(f"{name}: expected a tensor on {' or '.join(SUPPORTED_DEVICES)} for {mode}, got {tensor.device}")


def save_partial_states(
    kv_score: torch.Tensor,  # fp32 [T, 2*SW]: kv then score (score without ape)
    ape: torch.Tensor | None,  # fp32 [r, SW]; unused (may be None) with ape_at="compress"
    positions: torch.Tensor,  # int64 [T]
    slot_mapping: torch.Tensor,  # int64 [T], -1 = padding
    state_cache: torch.Tensor,  # fp32 or bf16 (SPEC §13.1) [num_state_blocks, bs, 2*SW], written in place
    block_size: int,  # bs
    *,
    ape_at: str = "save",  # SPEC §13.2: "save" adds ape here, "compress" stores the raw score
    ring_capacity: int | None = None,  # SPEC §13.3: checked only; slot_mapping already names ring slots
    debug: bool = False,
    config: SaveConfig | None = None,
) -> None:
    """SPEC §4 (with §13.1-§13.3): write each saved token's state row (kv copied, the score with
    ``ape[p mod r]`` added or raw per ``ape_at``; a bf16 state rounds each value once to bf16); any
    head width (512, or the indexer's 128: SW = 256 for C4, 128 for C128). Under ``torch.compile``:
    the custom op ``triton_save_partial_states`` (``config`` must be None)."""
    if _compiling():
        return _traced_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, ape_at, ring_capacity,
                            debug, config)
    key = None if debug else ("save", layout_key(kv_score), layout_key(ape), layout_key(positions),
                              layout_key(slot_mapping), layout_key(state_cache), block_size, type(block_size), ape_at,
                              type(ape_at), ring_capacity, type(ring_capacity), config)
    key, plan = _PLANS.find_key(key)  # (None, None): unhashable, validated (and rejected) the long way
    if plan is None:
        plan = _PLANS.put(key, _save_plan((kv_score, ape, positions, slot_mapping, state_cache), block_size, ape_at,
                                          ring_capacity, debug, config))
    if plan is not None:
        launch, strides, state_bf16, add_ape = plan
        state = state_cache.view(torch.int16) if state_bf16 else state_cache
        launch(kv_score, strides[0], ape if add_ape else None, strides[1], positions, slot_mapping, state, strides[2],
               strides[3], strides[4], None)


_PLANS = PlanCache()


def _traced_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, ape_at, ring_capacity, debug,
                 config) -> None:
    """``save_partial_states`` as ``torch.compile`` traces it: one custom op (default launch shapes)."""
    custom_ops.refuse("config", config, None, "triton_save_partial_states")
    custom_ops.op("triton", "save_partial_states")(kv_score, ape, positions, slot_mapping, state_cache, block_size,
                                                   debug, ape_at, ring_capacity)
_STATE_DTYPES = STATE_CACHE_DTYPES  # SPEC §13.1: the kernels read and write fp32 and bf16 states


def _state_strides(state_cache: torch.Tensor) -> tuple[int, int]:
    """``state_cache``'s block and row strides in 16-byte units (4 fp32 or 8 bf16 elements; SPEC §3
    and §13.1 make them multiples of that wherever they matter)."""
    elements = 16 // state_cache.element_size()
    return state_cache.stride(0) // elements, state_cache.stride(1) // elements


def _save_launcher(call, config, num_tokens: int, add_ape: bool) -> Launcher:
    """The save kernel's launcher for a validated call (``call.config``, ``call.state_format``)."""
    block, num_warps = save_config(config).launch_shape(call.config.state_width)
    constants = dict(RATIO=call.config.ratio, STATE_WIDTH=call.config.state_width, BLOCK=block,
                     STATE_BF16=call.state_format.dtype == "bf16", ADD_APE=add_ape, num_warps=num_warps,
                     enable_fp_fusion=False)
    return Launcher(save_partial_states_kernel, (num_tokens, call.config.state_row_width // block), constants)


def _save_plan(tensors, block_size, ape_at, ring_capacity, debug, config) -> tuple | None:
    """(launcher, stride arguments, bf16 state, ape added) of a validated ``save_partial_states``
    call (None: no tokens); ``tensors``: ``(kv_score, ape, positions, slot_mapping, state_cache)``."""
    kv_score, ape, positions, slot_mapping, state_cache = tensors
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS, ape_at=ape_at, ring_capacity=ring_capacity,
                                        state_dtypes=_STATE_DTYPES)
    _check_device("state_cache", state_cache)
    add_ape = call.state_format.ape_at == "save"
    strides = (kv_score.stride(0), ape.stride(0) if add_ape else None, *_state_strides(state_cache), call.block_size)
    if call.num_tokens == 0:
        return None
    launch = _save_launcher(call, config, call.num_tokens, add_ape)
    return launch, strides, call.state_format.dtype == "bf16", add_ape


def _cache_views(k_cache: torch.Tensor, layout: str):
    """(uint8 view, int16 view) of ``k_cache`` for the kernel, per call; the indexer's layouts
    (page bytes) have no int16 view (None)."""
    if layout == "flashmla_fp8":
        pages = flashmla_page_view(k_cache)  # uint8 [num_pages, B*584], strides (page_stride, 1)
        return pages, pages.view(torch.int16)
    if layout == "bf16":
        values = k_cache.view(torch.int16)
        return values, values
    if layout == "fp8_per_tensor":
        codes = k_cache.view(torch.uint8)
        return codes, codes
    return flashmla_page_view(k_cache), None  # the indexer's: uint8 [num_pages, B*E]


def _cache_strides(cache_u8: torch.Tensor, layout: str) -> tuple:
    """(page stride, entry stride) kernel arguments of the views of :func:`_cache_views`: the page
    layouts address ``page * page_stride + byte`` (entry stride unused: 0 for flashmla_fp8, None
    for the indexer's); bf16 / fp8_per_tensor index ``[page, entry, channel]`` in elements."""
    if layout == "flashmla_fp8":
        return cache_u8.stride(0), 0
    if layout in ("bf16", "fp8_per_tensor"):  # the int16 view of bf16 has bf16's element strides
        return cache_u8.stride(0), cache_u8.stride(1)
    return cache_u8.stride(0), None


def compress_norm_rope_store(
    state_cache: torch.Tensor,  # fp32 or bf16 (SPEC §13.1) [num_state_blocks, bs, 2*SW]
    token_to_req_indices: torch.Tensor,  # int32 [T]
    positions: torch.Tensor,  # int64 [T]
    slot_mapping: torch.Tensor,  # int64 [T], -1 = padding
    block_table: torch.Tensor,  # int32 [num_reqs, max_blocks]
    block_size: int,  # bs
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [H], H = 512 or 128
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    k_cache: torch.Tensor,  # flashmla_fp8: uint8 [pages, B, 584]; bf16: bf16 [pages, B, 512]; fp8_per_tensor: float8_e4m3fn [pages, B, 512]; indexer_fp8 / indexer_mxfp4: uint8 [pages, B, 132 / 68]
    kv_slot_mapping: torch.Tensor,  # int64 [T], -1 = no entry
    *,
    compress_ratio: int,
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    hadamard: bool = False,
    ape: torch.Tensor | None = None,  # fp32 [r, SW]: needed with ape_at="compress" (SPEC §13.2)
    ape_at: str = "save",  # "save": the state's scores include ape; "compress": pooling adds it
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    debug: bool = False,
    config: FusedConfig | SplitConfig | None = None,
) -> None:
    """SPEC §5-§7: pool, RMSNorm, RoPE, quantize and store each active token's entry; C4 in one
    launch, C128 on the split path (a pool and a store launch; ``config`` a :class:`SplitConfig`, or
    a :class:`FusedConfig` for the fused kernel's one launch).

    The head width follows from the state width: 512, or the indexer's 128 (SPEC §12, layouts
    ``indexer_fp8`` / ``indexer_mxfp4``, ``hadamard`` optional). SPEC §13: a bf16 state (the
    tensor's dtype), ``ape`` added at pooling (``ape_at="compress"``), a ring of
    ``ring_capacity`` rows per request. Under ``torch.compile``: the custom op
    ``triton_compress_norm_rope_store`` (``config`` must be None).
    """
    if _compiling():
        return _traced_compress((state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                 rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio,
                                 layout, fp8_scale, debug, hadamard, ape, ape_at, ring_capacity), config)
    key = None if debug else (
        layout_key(state_cache), layout_key(token_to_req_indices), layout_key(positions), layout_key(slot_mapping),
        layout_key(block_table), layout_key(rms_norm_weight), layout_key(cos_sin_cache), layout_key(k_cache),
        layout_key(kv_slot_mapping), block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, config,
        type(block_size), type(rms_norm_eps), type(compress_ratio), type(fp8_scale), type(hadamard),
        layout_key(ape), ape_at, type(ape_at), ring_capacity, type(ring_capacity))
    key, plan = _PLANS.find_key(key)  # (None, None): unhashable, validated (and rejected) the long way
    if plan is None:
        tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight, cos_sin_cache,
                   k_cache, kv_slot_mapping, ape)
        options = _Options(block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, ape_at, ring_capacity,
                           debug, config)
        plan = _PLANS.put(key, _compress_plan(tensors, options))
    if plan is None:  # no tokens
        return
    launch, scalars, weight_bf16, state_bf16, ape_stride = plan
    weight = rms_norm_weight.view(torch.int16) if weight_bf16 else rms_norm_weight
    state = state_cache.view(torch.int16) if state_bf16 else state_cache
    cache_u8, cache_i16 = _cache_views(k_cache, layout)
    state_s0, state_s1, table_s0, eps, cos_s0, page_stride, entry_stride, entries, scale = scalars
    launch(state, state_s0, state_s1, (token_to_req_indices, positions, slot_mapping, kv_slot_mapping),
           block_table, table_s0, weight, eps, cos_sin_cache, cos_s0, cache_u8, cache_i16, page_stride, entry_stride,
           entries, scale, None if ape_stride is None else (ape, ape_stride), None)


def _traced_compress(arguments: tuple, config) -> None:
    """``compress_norm_rope_store`` as ``torch.compile`` traces it: one custom op on ``arguments``
    (in its schema's order), with the default launch configuration."""
    custom_ops.refuse("config", config, None, "triton_compress_norm_rope_store")
    custom_ops.op("triton", "compress_norm_rope_store")(*arguments)


class _Options(NamedTuple):
    """The scalar arguments of a compress call (or a step's) that its plan depends on."""

    block_size: int
    rms_norm_eps: float
    compress_ratio: int
    layout: str
    fp8_scale: float | None
    hadamard: bool
    ape_at: str
    ring_capacity: int | None
    debug: bool
    config: FusedConfig | SplitConfig | None


def _compress_launcher(pooling, store, weight_bf16: bool, chunk: bool, config, device: torch.device):
    """The compress launch of validated pooling and store checks, called with the fused kernel's
    runtime arguments: the fused kernel's :class:`.launch.Launcher` (C4, or a :class:`FusedConfig`), or
    C128's :class:`.split_launch.SplitLaunch` (:func:`.config.compress_config`). SPEC §13's options come
    from ``pooling.state_format``; ``chunk``: §13.4's rows from the call's inputs."""
    head_dim, ratio = pooling.config.head_dim, pooling.config.ratio
    knobs = compress_config(ratio, head_dim, config, pooling.num_tokens)
    state_format = pooling.state_format
    rows = row_format(state_format.dtype == "bf16", state_format.ape_at, state_format.ring_capacity, chunk)
    if isinstance(knobs, SplitConfig):
        constants = split_constants(head_dim, pooling.block_size, (store.layout, store.hadamard, weight_bf16), rows,
                                    knobs)
        return SplitLaunch(pooling.num_tokens, head_dim, knobs, constants, device)
    constants = dict(
        **kernel_constants(head_dim, ratio, pooling.block_size, store.layout, store.hadamard, weight_bf16, knobs,
                           knobs.plan(pooling.config.window), rows),
        **knobs.launch_options(), enable_fp_fusion=False,
    )
    return Launcher(compress_norm_rope_store_kernel, (pooling.num_tokens,), constants)


def _fused_scalars(pooling, store, tensors) -> tuple:
    """The fused kernel's stride and scalar arguments: ``tensors`` = ``(state_cache, block_table,
    cos_sin_cache, k_cache)``; the indexer's head (SPEC §12) passes None for the fp8 scale."""
    state_cache, block_table, cos_sin_cache, k_cache = tensors
    indexer = pooling.config.head_dim == INDEXER_HEAD_DIM
    scale = None if indexer else (float(store.fp8_scale) if store.fp8_scale is not None else 1.0)
    page_stride, entry_stride = _cache_strides(_cache_views(k_cache, store.layout)[0], store.layout)
    return (*_state_strides(state_cache), block_table.stride(0), float(store.eps), cos_sin_cache.stride(0), page_stride,
            entry_stride, store.entries_per_page, scale)


def _compress_plan(tensors, options: _Options) -> tuple | None:
    """(launcher, scalar arguments, bf16 weight, bf16 state, ape row stride or None) of a validated
    call (None: no tokens). ``tensors``: ``compress_norm_rope_store``'s tensors in signature order,
    then ``ape``."""
    (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight, cos_sin_cache, k_cache,
     kv_slot_mapping, ape) = tensors
    call = validate_compress_norm_rope_store(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, options.block_size, rms_norm_weight,
        options.rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=options.compress_ratio,
        layout=options.layout, fp8_scale=options.fp8_scale, hadamard=options.hadamard, debug=options.debug,
        head_dims=HEAD_DIMS, ape=ape, ape_at=options.ape_at, ring_capacity=options.ring_capacity,
        state_dtypes=_STATE_DTYPES,
    )
    _check_device("state_cache", state_cache)
    pooling, store = call.pooling, call.store
    weight_bf16 = rms_norm_weight.dtype == torch.bfloat16
    scalars = _fused_scalars(pooling, store, (state_cache, block_table, cos_sin_cache, k_cache))
    ape_stride = ape.stride(0) if pooling.state_format.ape_at == "compress" else None
    launch = _compress_launcher(pooling, store, weight_bf16, False, options.config, state_cache.device)
    if pooling.num_tokens == 0:
        return None
    return launch, scalars, weight_bf16, pooling.state_format.dtype == "bf16", ape_stride


def compress_and_save(
    kv: torch.Tensor,  # fp32 [T, SW]: this call's kv projections (any row stride, 16-byte aligned rows)
    score: torch.Tensor,  # fp32 [T, SW]: this call's raw scores (no ape)
    ape: torch.Tensor,  # fp32 [r, SW]: added at the save or at the compress (ape_at)
    positions: torch.Tensor,  # int64 [T]
    token_to_req: torch.Tensor,  # int32 [T]: request (block_table row) of each token
    query_start_loc: torch.Tensor,  # int32 [num_reqs + 1]: first token of each request's chunk
    slot_mapping: torch.Tensor,  # int64 [T]: state slot, -1 = padding (the activity rule reads it)
    save_slot_mapping: torch.Tensor,  # int64 [T]: slot the save writes, -1 = not saved (a ring: the tail)
    block_table: torch.Tensor,  # int32 [num_reqs', max_blocks], num_reqs' >= num_reqs
    bs: int,  # rows per state block
    state_cache: torch.Tensor,  # fp32 or bf16 [num_state_blocks, bs, 2*SW], written in place
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [H], H = 512 or 128
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    k_cache: torch.Tensor,  # the layout's cache, as in compress_norm_rope_store; written in place
    kv_slot_mapping: torch.Tensor,  # int64 [T]: compressed-cache slot, -1 = none
    *,
    compress_ratio: int,  # 4 (C4) or 128 (C128)
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    ape_at: str = "save",  # SPEC §13.2
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    hadamard: bool = False,  # SPEC §12's rotation; indexer layouts only
    debug: bool = False,
    config: FusedConfig | SplitConfig | None = None,
    save_config: SaveConfig | None = None,
) -> None:
    """SPEC §13.4 on one stream (the compress's launches, then the save's): compress every active
    token, its window's rows at or after its chunk's start read from ``kv`` / ``score`` (as the save
    would store them and pooling read them back) and earlier rows from the state; then save the
    tokens with ``save_slot_mapping >= 0``. Nothing is launched if validation fails. Under ``torch.compile``:
    the custom op ``triton_compress_and_save`` (``config`` and ``save_config`` must be None)."""
    if _compiling():
        return _traced_step((kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping,
                             block_table, bs, state_cache, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache,
                             kv_slot_mapping, compress_ratio, layout, fp8_scale, ape_at, ring_capacity, hadamard,
                             debug), config, save_config)
    key = None if debug else (
        "step", layout_key(kv), layout_key(score), layout_key(ape), layout_key(positions), layout_key(token_to_req),
        layout_key(query_start_loc), layout_key(slot_mapping), layout_key(save_slot_mapping), layout_key(block_table),
        layout_key(state_cache), layout_key(rms_norm_weight), layout_key(cos_sin_cache), layout_key(k_cache),
        layout_key(kv_slot_mapping), bs, rms_norm_eps, compress_ratio, layout, fp8_scale, ape_at, ring_capacity, hadamard,
        config, save_config, type(bs), type(rms_norm_eps), type(compress_ratio), type(fp8_scale), type(ape_at),
        type(ring_capacity), type(hadamard))
    key, plan = _PLANS.find_key(key)  # (None, None): unhashable, validated (and rejected) the long way
    if plan is None:
        tensors = (kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table,
                   state_cache, rms_norm_weight, cos_sin_cache, k_cache, kv_slot_mapping)
        options = _Options(bs, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, ape_at, ring_capacity, debug,
                           config)
        plan = _PLANS.put(key, _step_plan(tensors, options, save_config))
    if plan is None:  # no tokens
        return
    compress, save, scalars, weight_bf16, state_bf16, strides = plan
    weight = rms_norm_weight.view(torch.int16) if weight_bf16 else rms_norm_weight
    state = state_cache.view(torch.int16) if state_bf16 else state_cache
    cache_u8, cache_i16 = _cache_views(k_cache, layout)
    state_s0, state_s1, table_s0, eps, cos_s0, page_stride, entry_stride, entries, scale = scalars
    kv_s0, kv_s16b, score_s0, score_s16b, ape_s0, add_ape = strides
    compress(state, state_s0, state_s1, (token_to_req, positions, slot_mapping, kv_slot_mapping), block_table, table_s0,
             weight, eps, cos_sin_cache, cos_s0, cache_u8, cache_i16, page_stride, entry_stride, entries, scale,
             (ape, ape_s0), (kv, kv_s16b, score, score_s16b, query_start_loc))
    save(kv, kv_s0, ape if add_ape else None, ape_s0 if add_ape else None, positions, save_slot_mapping, state, state_s0,
         state_s1, bs, (score, score_s0))


def _traced_step(arguments: tuple, config, save_knobs) -> None:
    """``compress_and_save`` as ``torch.compile`` traces it: one custom op on ``arguments`` (in its
    schema's order), with the default launch configurations."""
    custom_ops.refuse("config", config, None, "triton_compress_and_save")
    custom_ops.refuse("save_config", save_knobs, None, "triton_compress_and_save")
    custom_ops.op("triton", "compress_and_save")(*arguments)


def _step_plan(tensors, options: _Options, save_knobs: SaveConfig | None) -> tuple | None:
    """(compress launcher, save launcher, the fused kernel's scalars, bf16 weight, bf16 state, (kv and
    score row strides, each also in 16-byte units, ape's row stride, ape added at the save)) of a
    validated ``compress_and_save`` call (None: no tokens); ``tensors`` in its signature order,
    without ``bs``."""
    (kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, state_cache,
     rms_norm_weight, cos_sin_cache, k_cache, kv_slot_mapping) = tensors
    call = validate_compress_and_save(
        kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table,
        options.block_size, state_cache, rms_norm_weight, options.rms_norm_eps, cos_sin_cache, k_cache,
        kv_slot_mapping, compress_ratio=options.compress_ratio, layout=options.layout, fp8_scale=options.fp8_scale,
        ape_at=options.ape_at, ring_capacity=options.ring_capacity, hadamard=options.hadamard, debug=options.debug,
        head_dims=HEAD_DIMS, state_dtypes=_STATE_DTYPES,
    )
    _check_device("state_cache", state_cache)
    pooling, store = call.pooling, call.store
    weight_bf16 = rms_norm_weight.dtype == torch.bfloat16
    scalars = _fused_scalars(pooling, store, (state_cache, block_table, cos_sin_cache, k_cache))
    add_ape = pooling.state_format.ape_at == "save"
    compress = _compress_launcher(pooling, store, weight_bf16, True, options.config, state_cache.device)
    save = _save_launcher(pooling, save_knobs, pooling.num_tokens, add_ape)
    if pooling.num_tokens == 0:
        return None
    # row strides of kv and score (elements, and 16-byte units: SPEC §9 makes them multiples of 4 where T > 1)
    strides = (kv.stride(0), kv.stride(0) // 4, score.stride(0), score.stride(0) // 4, ape.stride(0), add_ape)
    return compress, save, scalars, weight_bf16, pooling.state_format.dtype == "bf16", strides


def warm_up(*, compress_ratio: int, block_size: int, layout: str = "flashmla_fp8", entries_per_page: int,
            weight_dtype: torch.dtype = torch.bfloat16, device="cuda", fp8_scale: float | None = None,
            hadamard: bool = False, config: FusedConfig | SplitConfig | None = None, save: bool = True,
            save_config: SaveConfig | None = None, state_dtype: torch.dtype = torch.float32, ape_at: str = "save",
            ring_capacity: int | None = None, step: bool = False) -> None:
    """Compile a layer's kernels before CUDA-graph capture: one launch of each on a small dummy
    step whose only token is padding (nothing is written).

    The configuration: ``compress_ratio``, ``block_size``, ``layout`` (the indexer layouts of
    SPEC §12 too, with ``hadamard``), ``entries_per_page`` (``k_cache.shape[1]``),
    ``weight_dtype``, ``device``, ``fp8_scale`` (``fp8_per_tensor``), the launch configurations
    and SPEC §13's state options: ``state_dtype`` (``torch.float32`` or ``torch.bfloat16``),
    ``ape_at``, ``ring_capacity``; ``step`` compiles ``compress_and_save``'s kernels (instead of
    ``compress_norm_rope_store``'s and, with ``save``, ``save_partial_states``'). Triton also
    specializes on whether integer arguments (strides) are multiples of 16 and on 16-byte pointer
    alignment; the dummy tensors are contiguous, like a freshly allocated cache, so a layer whose
    caches or projections have other strides compiles once more at its first call. The token
    count is not compiled in (the grid follows ``T``; the split path's ``T`` and runs are
    arguments its kernels do not specialize on).
    """
    from ...spec.constants import HEAD_DIM, ratio_config
    from ...spec.entry_layout import PAGED_LAYOUTS

    device = torch.device(device)
    start = time.perf_counter()
    paged = PAGED_LAYOUTS.get(layout) if isinstance(layout, str) else None  # flashmla_fp8 and the indexer's
    head_dim = paged.head_dim if paged is not None else HEAD_DIM
    ratio = ratio_config(compress_ratio, head_dim)
    width = ratio.state_row_width
    state = torch.zeros((1, block_size, width), dtype=state_dtype, device=device)
    if paged is not None:
        k_cache = torch.zeros((1, entries_per_page, paged.entry_bytes), dtype=torch.uint8, device=device)
    else:
        dtype = torch.bfloat16 if layout == "bf16" else torch.float8_e4m3fn
        k_cache = torch.zeros((1, entries_per_page, HEAD_DIM), dtype=torch.uint8, device=device).view(dtype)
    padding = torch.full((1,), -1, dtype=torch.int64, device=device)
    positions = torch.zeros(1, dtype=torch.int64, device=device)
    requests = torch.zeros(1, dtype=torch.int32, device=device)
    columns = max(16, -(-(ring_capacity or 0) // block_size)) if isinstance(ring_capacity, int) else 16
    block_table = torch.zeros((1, columns), dtype=torch.int32, device=device)
    weight = torch.ones(head_dim, dtype=weight_dtype, device=device)
    cos_sin = torch.zeros((1, 64), dtype=torch.float32, device=device)
    ape = torch.zeros((compress_ratio, ratio.state_width), dtype=torch.float32, device=device)
    projections = torch.zeros((1, width), dtype=torch.float32, device=device)
    if step:
        compress_and_save(
            projections[:, :width // 2], projections[:, width // 2:], ape, positions, requests,
            torch.zeros(1, dtype=torch.int32, device=device), padding, padding, block_table, block_size, state, weight,
            1e-6, cos_sin, k_cache, padding, compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale,
            ape_at=ape_at, ring_capacity=ring_capacity, hadamard=hadamard, config=config, save_config=save_config)
    else:
        compress_norm_rope_store(
            state, requests, positions, padding, block_table, block_size, weight, 1e-6, cos_sin, k_cache, padding,
            compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale, hadamard=hadamard,
            ape=ape if ape_at == "compress" else None, ape_at=ape_at, ring_capacity=ring_capacity, config=config)
        if save:
            save_partial_states(projections, ape if ape_at == "save" else None, positions, padding, state, block_size,
                                ape_at=ape_at, ring_capacity=ring_capacity, config=save_config)
    log.info("triton warm_up: C%d bs=%d %s%s B=%d state %s ape_at=%s ring=%s%s in %.1f s", compress_ratio, block_size,
             layout, " hadamard" if hadamard else "", entries_per_page, state_dtype, ape_at, ring_capacity,
             " step" if step else "", time.perf_counter() - start)
