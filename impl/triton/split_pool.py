"""The C128 split path's pool kernel: one program pools one channel tile of the active tokens of a
run of consecutive tokens into ``pooled``; the split path's store kernel (:mod:`.split_store`)
finishes the entries from it.

Grid ``(ceil(T / token_run), HEAD / BLOCK_C)``: program ``(k, t)`` reads the metadata of tokens
``k * token_run ..`` at once (:func:`.window.run_activity`), then pools channel tile ``t`` of each
active one in token order (:func:`.pooling.pool_channel_tile`, the fused kernel's tile, from the
same window rows, :func:`.window.window_rows`) and stores it to ``pooled[token, t * BLOCK_C ..]``.
A token's tiles are pooled by ``HEAD / BLOCK_C`` programs side by side instead of one after the
other in one program, and a run of inactive tokens costs one program, not one per token. Rows of
inactive tokens in ``pooled`` are not written.
"""


import triton
import triton.language as tl

from .pooling import pool_channel_tile
from .window import run_activity, take_next, token_activity, window_rows


@triton.jit(do_not_specialize=["num_tokens", "token_run"])  # one compiled kernel for every T and run
def split_pool_kernel(
    state_ptr,  # fp32 [num_state_blocks, bs, 2*SW] (int16 bf16 patterns with ROW_FORMAT.state_bf16)
    state_block_stride16b,  # state_cache.stride(0) in 16-byte units (// 4 fp32, // 8 bf16)
    state_row_stride16b,  # state_cache.stride(1) in 16-byte units
    tokens,  # token_to_req int32 [T], positions, slot_mapping, kv_slot_mapping int64 [T]
    num_tokens,  # T
    token_run,  # tokens a program walks, 1 .. MAX_RUN
    block_table_ptr,  # int32 [num_reqs, max_blocks], row stride block_table_stride
    block_table_stride,
    pooled_ptr,  # fp32 [T, HEAD] out: the active tokens' pooled vectors
    ape,  # SPEC §13.2/§13.4: (ape_ptr fp32 [r, SW], ape.stride(0)); None unless ape_at_compress or chunk
    chunk,  # SPEC §13.4: (kv_ptr fp32 [T, SW], kv row stride // 4, score_ptr fp32 [T, SW], score row stride // 4,
            # query_start_loc_ptr int32 [num_reqs + 1]); None unless ROW_FORMAT.chunk
    HEAD: tl.constexpr,  # 512, or the indexer's 128 (SPEC §12)
    RATIO: tl.constexpr,  # 128
    BLOCK_SIZE: tl.constexpr,  # bs, rows per state block
    ROW_FORMAT: tl.constexpr,  # SPEC §13's state format and row sources, a .rows.RowFormat
    BLOCK_C: tl.constexpr,  # channels per program (divides HEAD)
    MAX_RUN: tl.constexpr,  # the largest token_run (a power of two)
    LANE_BITS: tl.constexpr,
    WARP_BITS: tl.constexpr,
    REG_BITS: tl.constexpr,
):
    tl.static_assert(RATIO == 128)  # a C4 window is never split: its 8 rows are pooled in one program
    first = tl.program_id(0).to(tl.int64) * token_run
    tile = tl.program_id(1)
    active, count = run_activity(first, token_run, num_tokens, tokens, RATIO, MAX_RUN)
    channels = tile * BLOCK_C + tl.arange(0, BLOCK_C)
    for _ in range(count):
        offset, active = take_next(active, MAX_RUN)
        token = first + offset
        position, request, _, _ = token_activity(token, tokens, RATIO)
        rows = window_rows((state_ptr, state_block_stride16b, state_row_stride16b),
                           (block_table_ptr, block_table_stride), ape, chunk, tokens, request, position, RATIO,
                           BLOCK_SIZE, HEAD, ROW_FORMAT, LANE_BITS, WARP_BITS, REG_BITS)
        x = pool_channel_tile(rows, tile * BLOCK_C, HEAD, RATIO, BLOCK_C, False, ROW_FORMAT, LANE_BITS, WARP_BITS,
                              REG_BITS)
        tl.store(pooled_ptr + (token * HEAD + channels), x)
