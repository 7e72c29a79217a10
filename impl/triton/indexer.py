"""The indexer's fused ``compress_norm_rope_store`` kernel (SPEC §12): one launch, one program
per token, the same pooling stages as the 512-wide kernel on a 128-wide head.

An active token's program resolves its W window rows (:func:`.fused.window_row_offsets`), pools
the 128 channels in ``128 / BLOCK_C`` tiles of ``[W, BLOCK_C]`` (:func:`.pooling.pool_channel_tile`),
then normalizes, rotates (RoPE, optionally Hadamard), quantizes and stores the entry
(:mod:`.indexer_postprocess`). Inactive tokens return at once and write nothing.
"""


import triton
import triton.language as tl

from .fused import window_row_offsets
from .indexer_postprocess import (
    ROW_W, ROWS, hadamard_rotate, indexer_rms_norm, indexer_rope, load_indexer_norm_weight, store_indexer_entry,
)
from .pooling import pool_channel_tile


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
    OVERLAP: tl.constexpr = 2 if RATIO == 4 else 1
    STATE_WIDTH: tl.constexpr = OVERLAP * HEAD
    W: tl.constexpr = OVERLAP * RATIO
    NUM_TILES: tl.constexpr = HEAD // BLOCK_C

    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    kv_slot = tl.load(kv_slot_mapping_ptr + token)
    position = tl.load(positions_ptr + token)
    request = tl.load(token_to_req_ptr + token).to(tl.int64)
    active = (slot >= 0) & ((position + 1) % RATIO == 0) & (kv_slot >= 0)
    if active:
        kv_row_offsets, row_valid = window_row_offsets(
            state_block_stride4, state_row_stride4, block_table_ptr, block_table_stride, request, position,
            RATIO, W, BLOCK_SIZE, HEAD, LANE_BITS, WARP_BITS, REG_BITS)
        tile_index = tl.arange(0, NUM_TILES)[:, None]
        pooled = tl.zeros((NUM_TILES, BLOCK_C), tl.float32)
        if UNROLL_TILES:
            for tile in tl.static_range(NUM_TILES):
                x_tile = pool_channel_tile(state_ptr, kv_row_offsets, row_valid, tile * BLOCK_C, STATE_WIDTH, W, BLOCK_C,
                                           OVERLAP == 2, LANE_BITS, WARP_BITS, REG_BITS)
                pooled = tl.where(tile_index == tile, x_tile[None, :], pooled)
        else:
            for tile in tl.range(0, NUM_TILES):
                x_tile = pool_channel_tile(state_ptr, kv_row_offsets, row_valid, tile * BLOCK_C, STATE_WIDTH, W, BLOCK_C,
                                           OVERLAP == 2, LANE_BITS, WARP_BITS, REG_BITS)
                pooled = tl.where(tile_index == tile, x_tile[None, :], pooled)

        x4 = tl.reshape(pooled, (ROWS, ROW_W))
        y4 = indexer_rms_norm(x4, load_indexer_norm_weight(weight_ptr, WEIGHT_BF16), eps)
        rope_row = (position // RATIO) * RATIO
        z4 = indexer_rope(y4, cos_sin_ptr + rope_row * cos_sin_stride)
        if HADAMARD:
            z4 = hadamard_rotate(z4)
        store_indexer_entry(z4, cache_ptr, kv_slot, entries_per_page, cache_page_stride, LAYOUT)
