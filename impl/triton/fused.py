"""The fused ``compress_norm_rope_store`` kernel: one launch, one program per token.

Each program checks SPEC §5's activity rule and returns at once for inactive tokens (they
write nothing). An active token's program

1. resolves its W window rows once: position, validity, ``block_table`` entry and the int64
   element offset of the row's kv half (C4: rows 0..3 read channels 0..511 of kv and score,
   rows 4..7 channels 512..1023);
2. pools the 512 channels in ``512 / BLOCK_C`` channel tiles of ``[W, BLOCK_C]``
   (:func:`pool_channel_tile`), collecting the pooled tiles in a ``[512/BLOCK_C, BLOCK_C]``
   register tensor (``tl.where`` per tile: the RMSNorm needs all 512 channels before anything
   can be stored, and a single launch cannot hand them to another program);
3. normalizes, rotates, quantizes and stores the entry (:mod:`.postprocess`).

C4 defaults to two ``[8, 256]`` tiles, C128 to a runtime loop over eight ``[128, 64]`` tiles
(:mod:`.config`).

Argument shapes and dtypes are documented on the kernel; all offsets are int64.
"""


import triton
import triton.language as tl

from .pooling import pool_channel_tile, window_row_of
from .postprocess import (BLOCK_W, BLOCKS, INV_HEAD_DIM, LOG2_HEAD_DIM, load_norm_weight, rms_norm, rope_rotate,
                          store_entry)


@triton.jit
def window_row_offsets(state_block_stride4, state_row_stride4, block_table_ptr, block_table_stride, request, position,
                       RATIO: tl.constexpr, W: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD: tl.constexpr,
                       LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """int64 ``[W]`` element offsets of each tensor row's kv half, and int1 ``[W]`` validity.

    Tensor row ``i`` holds window row ``w = window_row_of(i)`` at position ``p - W + 1 + w``;
    its state row is ``state[block_table[request, pos // bs], pos % bs]``; half ``w // r``.
    Strides arrive divided by 4 so the compiler knows every row starts on 16 bytes.
    """
    window_row = window_row_of(tl.arange(0, W), LANE_BITS, WARP_BITS, REG_BITS)
    row_position = position - (W - 1) + window_row
    valid = row_position >= 0
    safe_position = tl.where(valid, row_position, 0)
    block = tl.load(block_table_ptr + (request * block_table_stride + safe_position // BLOCK_SIZE), mask=valid, other=0)
    row_in_block = safe_position % BLOCK_SIZE
    offsets4 = block.to(tl.int64) * state_block_stride4 + row_in_block * state_row_stride4
    half = window_row // RATIO  # C4: 0 for rows 0..3, 1 for rows 4..7; C128: always 0
    return offsets4 * 4 + half * HEAD, valid


@triton.jit
def token_activity(token, positions_ptr, slot_mapping_ptr, kv_slot_mapping_ptr, token_to_req_ptr, RATIO: tl.constexpr):
    """SPEC §5's activity rule for ``token``: ``(position, request (int64), kv_slot, active)``.
    The request index is loaded with the other metadata: one round trip less before the block table."""
    slot = tl.load(slot_mapping_ptr + token)
    kv_slot = tl.load(kv_slot_mapping_ptr + token)
    position = tl.load(positions_ptr + token)
    request = tl.load(token_to_req_ptr + token).to(tl.int64)
    active = (slot >= 0) & ((position + 1) % RATIO == 0) & (kv_slot >= 0)
    return position, request, kv_slot, active


@triton.jit
def pool_window_tiles(state_ptr, kv_row_offsets, row_valid, complete, HEAD: tl.constexpr, RATIO: tl.constexpr,
                      BLOCK_C: tl.constexpr, UNROLL_TILES: tl.constexpr, TILE_STAGES: tl.constexpr,
                      LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """SPEC §5's pooled vector of one token, fp32 ``[HEAD / BLOCK_C, BLOCK_C]`` (row-major = channel
    order), from its window rows (:func:`window_row_offsets`), one ``[W, BLOCK_C]`` channel tile at a
    time (:func:`.pooling.pool_channel_tile`). ``complete`` (int1): every window row is valid; a
    C4 window that is not (the first of a request, ``p = 3``) takes the masked pooling, every
    other window the same arithmetic without the masks (equal results on valid rows)."""
    if RATIO == 4:
        if complete:
            pooled = pool_tiles(state_ptr, kv_row_offsets, row_valid, HEAD, RATIO, BLOCK_C, False, UNROLL_TILES,
                                TILE_STAGES, LANE_BITS, WARP_BITS, REG_BITS)
        else:
            pooled = pool_tiles(state_ptr, kv_row_offsets, row_valid, HEAD, RATIO, BLOCK_C, True, UNROLL_TILES,
                                TILE_STAGES, LANE_BITS, WARP_BITS, REG_BITS)
    else:  # a C128 window is never incomplete
        pooled = pool_tiles(state_ptr, kv_row_offsets, row_valid, HEAD, RATIO, BLOCK_C, False, UNROLL_TILES,
                            TILE_STAGES, LANE_BITS, WARP_BITS, REG_BITS)
    return pooled


@triton.jit
def pool_tiles(state_ptr, kv_row_offsets, row_valid, HEAD: tl.constexpr, RATIO: tl.constexpr, BLOCK_C: tl.constexpr,
               MAY_HAVE_INVALID_ROWS: tl.constexpr, UNROLL_TILES: tl.constexpr, TILE_STAGES: tl.constexpr,
               LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """The tiles of :func:`pool_window_tiles`: a static unrolled loop, or a runtime loop with
    ``TILE_STAGES`` software-pipelining stages (None: Triton's default)."""
    OVERLAP: tl.constexpr = 2 if RATIO == 4 else 1
    STATE_WIDTH: tl.constexpr = OVERLAP * HEAD
    W: tl.constexpr = OVERLAP * RATIO
    NUM_TILES: tl.constexpr = HEAD // BLOCK_C
    tile_index = tl.arange(0, NUM_TILES)[:, None]
    pooled = tl.zeros((NUM_TILES, BLOCK_C), tl.float32)
    if UNROLL_TILES:
        for tile in tl.static_range(NUM_TILES):
            x_tile = pool_channel_tile(state_ptr, kv_row_offsets, row_valid, tile * BLOCK_C, STATE_WIDTH, W, BLOCK_C,
                                       MAY_HAVE_INVALID_ROWS, LANE_BITS, WARP_BITS, REG_BITS)
            pooled = tl.where(tile_index == tile, x_tile[None, :], pooled)
    else:
        for tile in tl.range(0, NUM_TILES, num_stages=TILE_STAGES):
            x_tile = pool_channel_tile(state_ptr, kv_row_offsets, row_valid, tile * BLOCK_C, STATE_WIDTH, W, BLOCK_C,
                                       MAY_HAVE_INVALID_ROWS, LANE_BITS, WARP_BITS, REG_BITS)
            pooled = tl.where(tile_index == tile, x_tile[None, :], pooled)
    return pooled


@triton.jit
def compress_norm_rope_store_kernel(
    state_ptr,  # fp32 [num_state_blocks, bs, 2*SW], strides (4*state_block_stride4, 4*state_row_stride4, 1)
    state_block_stride4,  # state_cache.stride(0) // 4
    state_row_stride4,  # state_cache.stride(1) // 4
    token_to_req_ptr,  # int32 [T]
    positions_ptr,  # int64 [T]
    slot_mapping_ptr,  # int64 [T]
    block_table_ptr,  # int32 [num_reqs, max_blocks], row stride block_table_stride
    block_table_stride,
    weight_ptr,  # fp32 [512], or int16 [512] of bf16 patterns when WEIGHT_BF16
    eps,  # fp32
    cos_sin_ptr,  # fp32 [max_pos, 64], row stride cos_sin_stride
    cos_sin_stride,
    cache_u8_ptr,  # uint8 view of k_cache (flashmla page bytes / fp8 bytes); unused for bf16
    cache_i16_ptr,  # int16 view of k_cache (flashmla page bytes as int16 / bf16 values); unused for fp8_per_tensor
    cache_page_stride,  # flashmla: page stride in bytes; bf16/fp8: k_cache.stride(0)
    cache_entry_stride,  # bf16/fp8: k_cache.stride(1); flashmla: unused
    entries_per_page,  # B
    kv_slot_mapping_ptr,  # int64 [T]
    fp8_scale,  # fp32 (fp8_per_tensor only)
    RATIO: tl.constexpr,  # 4 or 128
    BLOCK_SIZE: tl.constexpr,  # bs, rows per state block
    LAYOUT: tl.constexpr,  # 0 flashmla_fp8, 1 bf16, 2 fp8_per_tensor
    WEIGHT_BF16: tl.constexpr,
    BLOCK_C: tl.constexpr,  # channels per pooled tile (divides 512)
    UNROLL_TILES: tl.constexpr,  # static unrolled tile loop (True) or a runtime loop (False)
    TILE_STAGES: tl.constexpr,  # software-pipelining stages of the runtime tile loop
    LANE_BITS: tl.constexpr,
    WARP_BITS: tl.constexpr,
    REG_BITS: tl.constexpr,
):
    HEAD: tl.constexpr = 512
    token = tl.program_id(0)
    position, request, kv_slot, active = token_activity(token, positions_ptr, slot_mapping_ptr, kv_slot_mapping_ptr,
                                                        token_to_req_ptr, RATIO)
    if active:
        W: tl.constexpr = (2 if RATIO == 4 else 1) * RATIO
        kv_row_offsets, row_valid = window_row_offsets(
            state_block_stride4, state_row_stride4, block_table_ptr, block_table_stride, request, position,
            RATIO, W, BLOCK_SIZE, HEAD, LANE_BITS, WARP_BITS, REG_BITS)
        pooled = pool_window_tiles(state_ptr, kv_row_offsets, row_valid, position >= W - 1, HEAD, RATIO, BLOCK_C,
                                   UNROLL_TILES, TILE_STAGES, LANE_BITS, WARP_BITS, REG_BITS)
        x8 = tl.reshape(pooled, (BLOCKS, BLOCK_W))
        y8 = rms_norm(x8, load_norm_weight(weight_ptr, BLOCKS, BLOCK_W, WEIGHT_BF16), eps, HEAD, LOG2_HEAD_DIM,
                      INV_HEAD_DIM)
        rope_row = (position // RATIO) * RATIO
        rope8 = rope_rotate(y8, cos_sin_ptr + rope_row * cos_sin_stride)
        store_entry(y8, rope8, cache_u8_ptr, cache_i16_ptr, kv_slot, entries_per_page, cache_page_stride,
                    cache_entry_stride, fp8_scale, LAYOUT)
