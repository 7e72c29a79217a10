"""The indexer's fused ``compress_norm_rope_store`` kernel (SPEC §12): one launch, one program
per token, the same pooling stages as the 512-wide kernel on a 128-wide head.

An active token's program resolves its W window rows (:func:`.fused.window_row_offsets`), pools
the 128 channels in ``128 / BLOCK_C`` tiles of ``[W, BLOCK_C]`` (:func:`.fused.pool_window_tiles`),
then normalizes (:func:`.postprocess.rms_norm` at width 128), rotates (RoPE, optionally Hadamard),
quantizes and stores the entry (:mod:`.indexer_postprocess`). Inactive tokens return at once and write nothing.
"""


import triton
import triton.language as tl

from .fused import pool_window_tiles, token_activity, window_row_offsets
from .indexer_postprocess import (
    INV_INDEXER_HEAD, LOG2_INDEXER_HEAD, ROW_W, ROWS, hadamard_rotate, indexer_rope, store_indexer_entry,
)
from .postprocess import load_norm_weight, rms_norm


@triton.jit
def indexer_compress_norm_rope_store_kernel(
    state_ptr,  # fp32 [num_state_blocks, bs, 2*SW] (SW = 256 for C4, 128 for C128), strides (4*s0_4, 4*s1_4, 1)
    state_block_stride4,  # state_cache.stride(0) // 4
    state_row_stride4,  # state_cache.stride(1) // 4
    token_to_req_ptr,  # int32 [T]
    positions_ptr,  # int64 [T]
    slot_mapping_ptr,  # int64 [T]
    block_table_ptr,  # int32 [num_reqs, max_blocks], row stride block_table_stride
    block_table_stride,
    weight_ptr,  # fp32 [128], or int16 [128] of bf16 patterns when WEIGHT_BF16
    eps,  # fp32
    cos_sin_ptr,  # fp32 [max_pos, 64], row stride cos_sin_stride
    cos_sin_stride,
    cache_ptr,  # uint8 page bytes of k_cache [num_pages, B, E], page stride cache_page_stride bytes
    cache_page_stride,
    entries_per_page,  # B
    kv_slot_mapping_ptr,  # int64 [T]
    RATIO: tl.constexpr,  # 4 or 128
    BLOCK_SIZE: tl.constexpr,  # bs, rows per state block
    LAYOUT: tl.constexpr,  # 0 indexer_fp8, 1 indexer_mxfp4
    HADAMARD: tl.constexpr,
    WEIGHT_BF16: tl.constexpr,
    BLOCK_C: tl.constexpr,  # channels per pooled tile (divides 128)
    UNROLL_TILES: tl.constexpr,  # static unrolled tile loop (True) or a runtime loop (False)
    LANE_BITS: tl.constexpr,
    WARP_BITS: tl.constexpr,
    REG_BITS: tl.constexpr,
):
    HEAD: tl.constexpr = 128
    token = tl.program_id(0)
    position, request, kv_slot, active = token_activity(token, positions_ptr, slot_mapping_ptr, kv_slot_mapping_ptr,
                                                        token_to_req_ptr, RATIO)
    if active:
        W: tl.constexpr = (2 if RATIO == 4 else 1) * RATIO
        kv_row_offsets, row_valid = window_row_offsets(
            state_block_stride4, state_row_stride4, block_table_ptr, block_table_stride, request, position,
            RATIO, W, BLOCK_SIZE, HEAD, LANE_BITS, WARP_BITS, REG_BITS)
        pooled = pool_window_tiles(state_ptr, kv_row_offsets, row_valid, position >= W - 1, HEAD, RATIO, BLOCK_C,
                                   UNROLL_TILES, None, LANE_BITS, WARP_BITS, REG_BITS)
        x4 = tl.reshape(pooled, (ROWS, ROW_W))
        y4 = rms_norm(x4, load_norm_weight(weight_ptr, ROWS, ROW_W, WEIGHT_BF16), eps, HEAD, LOG2_INDEXER_HEAD,
                      INV_INDEXER_HEAD)
        rope_row = (position // RATIO) * RATIO
        z4 = indexer_rope(y4, cos_sin_ptr + rope_row * cos_sin_stride)
        if HADAMARD:
            z4 = hadamard_rotate(z4)
        store_indexer_entry(z4, cache_ptr, kv_slot, entries_per_page, cache_page_stride, LAYOUT)
