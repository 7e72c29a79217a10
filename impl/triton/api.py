"""Public Triton entry points: SPEC §9 validation on the host, then exactly one launch.

Both functions take torch tensors (CUDA tensors; CPU tensors when ``TRITON_INTERPRET=1`` was set
before import) and write in place. Validation runs first and raises ``ValueError`` before any
memory is touched. Kernels are launched with ``enable_fp_fusion=False`` (SPEC §2: no FMA).
"""

from __future__ import annotations

import os

import torch

from ..frontend import flashmla_page_view, validate_compress_norm_rope_store, validate_save_partial_states
from ...spec.constants import HEAD_DIMS, INDEXER_HEAD_DIM
from .config import FusedConfig, SaveConfig, fused_config, indexer_config, save_config
from .fused import compress_norm_rope_store_kernel
from .indexer import indexer_compress_norm_rope_store_kernel
from .indexer_postprocess import INDEXER_LAYOUT_CODES
from .postprocess import LAYOUT_CODES
from .save_states import save_partial_states_kernel


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


#: Devices whose tensors the kernels accept: CPU tensors under the Triton interpreter, else CUDA.
SUPPORTED_DEVICES: tuple[str, ...] = ("cpu",) if _interpreting() else ("cuda",)


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
    (512, or the indexer's 128: SW = 256 for C4, 128 for C128)."""
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS)
    _check_device("state_cache", state_cache)
    knobs = save_config(config)
    if call.num_tokens == 0:
        return
    row_width = call.config.state_row_width
    block = min(knobs.block, call.config.state_width)  # a chunk is all kv or all score
    # a block capped at the indexer's SW keeps 4 floats (one 128-bit access) per thread
    num_warps = knobs.num_warps if block == knobs.block else max(1, min(knobs.num_warps, block // 128))
    save_partial_states_kernel[(call.num_tokens, row_width // block)](
        kv_score, kv_score.stride(0), ape, ape.stride(0), positions, slot_mapping,
        state_cache, state_cache.stride(0) // 4, state_cache.stride(1) // 4, call.block_size,
        RATIO=call.config.ratio, STATE_WIDTH=call.config.state_width, BLOCK=block,
        num_warps=num_warps, enable_fp_fusion=False,
    )


def _cache_views(k_cache: torch.Tensor, layout: str):
    """(uint8 view, int16 view, page stride, entry stride) of ``k_cache`` for the kernel."""
    if layout == "flashmla_fp8":
        pages = flashmla_page_view(k_cache)  # uint8 [num_pages, B*584], strides (page_stride, 1)
        return pages, pages.view(torch.int16), pages.stride(0), 0
    if layout == "bf16":
        values = k_cache.view(torch.int16)
        return values, values, values.stride(0), values.stride(1)
    codes = k_cache.view(torch.uint8)
    return codes, codes, codes.stride(0), codes.stride(1)


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
    ``indexer_fp8`` / ``indexer_mxfp4``, ``hadamard`` optional).
    """
    call = validate_compress_norm_rope_store(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
        rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
        fp8_scale=fp8_scale, hadamard=hadamard, debug=debug, head_dims=HEAD_DIMS,
    )
    _check_device("state_cache", state_cache)
    pooling, store = call.pooling, call.store
    if pooling.config.head_dim == INDEXER_HEAD_DIM:
        _launch_indexer(call, state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                        cos_sin_cache, k_cache, kv_slot_mapping, config)
        return
    knobs = fused_config(pooling.config.ratio, config)
    plan = knobs.plan(pooling.config.window)
    if pooling.num_tokens == 0:
        return
    weight_bf16 = rms_norm_weight.dtype == torch.bfloat16
    weight = rms_norm_weight.view(torch.int16) if weight_bf16 else rms_norm_weight
    cache_u8, cache_i16, page_stride, entry_stride = _cache_views(k_cache, store.layout)
    compress_norm_rope_store_kernel[(pooling.num_tokens,)](
        state_cache, state_cache.stride(0) // 4, state_cache.stride(1) // 4,
        token_to_req_indices, positions, slot_mapping, block_table, block_table.stride(0),
        weight, float(store.eps), cos_sin_cache, cos_sin_cache.stride(0),
        cache_u8, cache_i16, page_stride, entry_stride, store.entries_per_page,
        kv_slot_mapping, float(store.fp8_scale) if store.fp8_scale is not None else 1.0,
        RATIO=pooling.config.ratio, BLOCK_SIZE=pooling.block_size, LAYOUT=LAYOUT_CODES[store.layout],
        WEIGHT_BF16=weight_bf16, BLOCK_C=knobs.block_c, UNROLL_TILES=knobs.unroll_tiles,
        TILE_STAGES=knobs.tile_stages, LANE_BITS=plan.lane_bits, WARP_BITS=plan.warp_bits, REG_BITS=plan.reg_bits,
        num_warps=knobs.num_warps, enable_fp_fusion=False,
    )


def _launch_indexer(call, state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                    cos_sin_cache, k_cache, kv_slot_mapping, config: FusedConfig | None) -> None:
    """SPEC §12: the indexer kernel for a validated call (arguments as in :func:`compress_norm_rope_store`)."""
    pooling, store = call.pooling, call.store
    knobs = indexer_config(pooling.config.ratio, config)
    plan = knobs.plan(pooling.config.window)
    if pooling.num_tokens == 0:
        return
    weight_bf16 = rms_norm_weight.dtype == torch.bfloat16
    weight = rms_norm_weight.view(torch.int16) if weight_bf16 else rms_norm_weight
    pages = flashmla_page_view(k_cache)  # uint8 [num_pages, B*E], strides (page_stride, 1)
    indexer_compress_norm_rope_store_kernel[(pooling.num_tokens,)](
        state_cache, state_cache.stride(0) // 4, state_cache.stride(1) // 4,
        token_to_req_indices, positions, slot_mapping, block_table, block_table.stride(0),
        weight, float(store.eps), cos_sin_cache, cos_sin_cache.stride(0),
        pages, pages.stride(0), store.entries_per_page, kv_slot_mapping,
        RATIO=pooling.config.ratio, BLOCK_SIZE=pooling.block_size, LAYOUT=INDEXER_LAYOUT_CODES[store.layout],
        HADAMARD=store.hadamard, WEIGHT_BF16=weight_bf16, BLOCK_C=knobs.block_c, UNROLL_TILES=knobs.unroll_tiles,
        LANE_BITS=plan.lane_bits, WARP_BITS=plan.warp_bits, REG_BITS=plan.reg_bits,
        num_warps=knobs.num_warps, enable_fp_fusion=False,
    )
