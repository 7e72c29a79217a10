"""Public Triton entry points: SPEC §9 validation on the host, then exactly one launch.

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

import torch

from .. import custom_ops
from ..plan_cache import PlanCache
from ..frontend import (flashmla_page_view, layout_key, validate_compress_norm_rope_store,
                        validate_save_partial_states)
from ...spec.constants import HEAD_DIMS, INDEXER_HEAD_DIM
from .config import FusedConfig, SaveConfig, fused_config, indexer_config, save_config
from .fused import compress_norm_rope_store_kernel, kernel_constants
from .launch import Launcher
from .save_states import save_partial_states_kernel


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
    ape: torch.Tensor,  # fp32 [r, SW]
    positions: torch.Tensor,  # int64 [T]
    slot_mapping: torch.Tensor,  # int64 [T], -1 = padding
    state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW], written in place
    block_size: int,  # bs
    *,
    debug: bool = False,
    config: SaveConfig | None = None,
) -> None:
    """SPEC §4: write each saved token's state row (kv copied, score + ape[p mod r]); any head width
    (512, or the indexer's 128: SW = 256 for C4, 128 for C128). Under ``torch.compile``: the custom
    op ``triton_save_partial_states`` (``config`` must be None)."""
    if _compiling():
        return _traced_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, config)
    key = None if debug else ("save", layout_key(kv_score), layout_key(ape), layout_key(positions),
                              layout_key(slot_mapping), layout_key(state_cache), block_size, type(block_size), config)
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: validate (and reject) it the long way
        key = plan = None
    if plan is None:
        plan = _PLANS.put(key, _save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, config))
    if plan is not None:
        launch, strides = plan
        launch(kv_score, strides[0], ape, strides[1], positions, slot_mapping, state_cache, strides[2], strides[3],
               strides[4])


_PLANS = PlanCache()


def _traced_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, config) -> None:
    """``save_partial_states`` as ``torch.compile`` traces it: one custom op (default launch shapes)."""
    custom_ops.refuse("config", config, None, "triton_save_partial_states")
    custom_ops.op("triton", "save_partial_states")(kv_score, ape, positions, slot_mapping, state_cache, block_size,
                                                   debug)


def _save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, config) -> tuple | None:
    """(launcher, stride arguments) of a validated ``save_partial_states`` call (None: no tokens)."""
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS)
    _check_device("state_cache", state_cache)
    knobs = save_config(config)
    row_width = call.config.state_row_width
    block, num_warps = knobs.launch_shape(call.config.state_width)
    strides = (kv_score.stride(0), ape.stride(0), state_cache.stride(0) // 4, state_cache.stride(1) // 4, call.block_size)
    constants = dict(RATIO=call.config.ratio, STATE_WIDTH=call.config.state_width, BLOCK=block,
                     num_warps=num_warps, enable_fp_fusion=False)
    if call.num_tokens == 0:
        return None
    return Launcher(save_partial_states_kernel, (call.num_tokens, row_width // block), constants), strides


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
    state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW]
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
    debug: bool = False,
    config: FusedConfig | None = None,
) -> None:
    """SPEC §5-§7 in one launch: pool, RMSNorm, RoPE, quantize and store each active token's entry.

    The head width follows from the state width: 512, or the indexer's 128 (SPEC §12, layouts
    ``indexer_fp8`` / ``indexer_mxfp4``, ``hadamard`` optional). Under ``torch.compile``: the
    custom op ``triton_compress_norm_rope_store`` (``config`` must be None).
    """
    if _compiling():
        return _traced_compress(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping,
                                compress_ratio, layout, fp8_scale, hadamard, debug, config)
    key = None if debug else (
        layout_key(state_cache), layout_key(token_to_req_indices), layout_key(positions), layout_key(slot_mapping),
        layout_key(block_table), layout_key(rms_norm_weight), layout_key(cos_sin_cache), layout_key(k_cache),
        layout_key(kv_slot_mapping), block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, config,
        type(block_size), type(rms_norm_eps), type(compress_ratio), type(fp8_scale), type(hadamard))
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: validate (and reject) it the long way
        key = plan = None
    if plan is None:
        plan = _PLANS.put(key, _compress_plan(
            state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
            rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, hadamard, debug,
            config))
    if plan is None:  # no tokens
        return
    launch, scalars, weight_bf16 = plan
    weight = rms_norm_weight.view(torch.int16) if weight_bf16 else rms_norm_weight
    cache_u8, cache_i16 = _cache_views(k_cache, layout)
    state_s0, state_s1, table_s0, eps, cos_s0, page_stride, entry_stride, entries, scale = scalars
    launch(state_cache, state_s0, state_s1, (token_to_req_indices, positions, slot_mapping, kv_slot_mapping),
           block_table, table_s0, weight, eps, cos_sin_cache, cos_s0, cache_u8, cache_i16, page_stride, entry_stride,
           entries, scale)


def _traced_compress(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                     rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout,
                     fp8_scale, hadamard, debug, config) -> None:
    """``compress_norm_rope_store`` as ``torch.compile`` traces it: one custom op (default launch
    configuration)."""
    custom_ops.refuse("config", config, None, "triton_compress_norm_rope_store")
    custom_ops.op("triton", "compress_norm_rope_store")(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
        rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, debug,
        hadamard=hadamard)


def _compress_plan(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
                   rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, hadamard,
                   debug, config) -> tuple | None:
    """(launcher, scalar arguments, bf16 weight) of a validated call (None: no tokens); the
    indexer's head (SPEC §12) passes None for the arguments of the 512-wide layouts alone."""
    call = validate_compress_norm_rope_store(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
        rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
        fp8_scale=fp8_scale, hadamard=hadamard, debug=debug, head_dims=HEAD_DIMS,
    )
    _check_device("state_cache", state_cache)
    pooling, store = call.pooling, call.store
    head_dim, ratio = pooling.config.head_dim, pooling.config.ratio
    if head_dim == INDEXER_HEAD_DIM:
        knobs, scale = indexer_config(ratio, config, pooling.num_tokens), None
    else:
        knobs, scale = fused_config(ratio, config), float(store.fp8_scale) if store.fp8_scale is not None else 1.0
    weight_bf16 = rms_norm_weight.dtype == torch.bfloat16
    page_stride, entry_stride = _cache_strides(_cache_views(k_cache, store.layout)[0], store.layout)
    scalars = (state_cache.stride(0) // 4, state_cache.stride(1) // 4, block_table.stride(0), float(store.eps),
               cos_sin_cache.stride(0), page_stride, entry_stride, store.entries_per_page, scale)
    constants = dict(
        **kernel_constants(head_dim, ratio, pooling.block_size, store.layout, store.hadamard, weight_bf16, knobs,
                           knobs.plan(pooling.config.window)),
        **knobs.launch_options(), enable_fp_fusion=False,
    )
    if pooling.num_tokens == 0:
        return None
    return Launcher(compress_norm_rope_store_kernel, (pooling.num_tokens,), constants), scalars, weight_bf16


def warm_up(*, compress_ratio: int, block_size: int, layout: str = "flashmla_fp8", entries_per_page: int,
            weight_dtype: torch.dtype = torch.bfloat16, device="cuda", fp8_scale: float | None = None,
            hadamard: bool = False, config: FusedConfig | None = None, save: bool = True,
            save_config: SaveConfig | None = None) -> None:
    """Compile a layer's kernels before CUDA-graph capture: one launch of each on a small dummy
    step whose only token is padding (nothing is written).

    The configuration: ``compress_ratio``, ``block_size``, ``layout`` (the indexer layouts of
    SPEC §12 too, with ``hadamard``), ``entries_per_page`` (``k_cache.shape[1]``),
    ``weight_dtype``, ``device``, ``fp8_scale`` (``fp8_per_tensor``) and the launch
    configurations. Triton also specializes on whether integer arguments (strides) are
    multiples of 16 and on 16-byte pointer alignment; the dummy tensors are contiguous, like a
    freshly allocated cache, so a layer whose caches have other strides compiles once more at
    its first call. The token count is not compiled in (the grid is ``T`` programs).
    """
    from ...spec.constants import HEAD_DIM, ratio_config
    from ...spec.entry_layout import PAGED_LAYOUTS

    device = torch.device(device)
    start = time.perf_counter()
    paged = PAGED_LAYOUTS.get(layout) if isinstance(layout, str) else None  # flashmla_fp8 and the indexer's
    head_dim = paged.head_dim if paged is not None else HEAD_DIM
    width = ratio_config(compress_ratio, head_dim).state_row_width
    state = torch.zeros((1, block_size, width), dtype=torch.float32, device=device)
    if paged is not None:
        k_cache = torch.zeros((1, entries_per_page, paged.entry_bytes), dtype=torch.uint8, device=device)
    else:
        dtype = torch.bfloat16 if layout == "bf16" else torch.float8_e4m3fn
        k_cache = torch.zeros((1, entries_per_page, HEAD_DIM), dtype=torch.uint8, device=device).view(dtype)
    padding = torch.full((1,), -1, dtype=torch.int64, device=device)
    positions = torch.zeros(1, dtype=torch.int64, device=device)
    compress_norm_rope_store(
        state, torch.zeros(1, dtype=torch.int32, device=device), positions, padding,
        torch.zeros((1, 16), dtype=torch.int32, device=device), block_size,
        torch.ones(head_dim, dtype=weight_dtype, device=device), 1e-6,
        torch.zeros((1, 64), dtype=torch.float32, device=device), k_cache, padding, compress_ratio=compress_ratio,
        layout=layout, fp8_scale=fp8_scale, hadamard=hadamard, config=config)
    if save:
        save_partial_states(torch.zeros((1, width), dtype=torch.float32, device=device),
                            torch.zeros((compress_ratio, width // 2), dtype=torch.float32, device=device), positions,
                            padding, state, block_size, config=save_config)
    log.info("triton warm_up: C%d bs=%d %s%s B=%d in %.1f s", compress_ratio, block_size, layout,
             " hadamard" if hadamard else "", entries_per_page, time.perf_counter() - start)
