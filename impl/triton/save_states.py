"""SPEC §4 ``save_partial_states`` kernel: copy kv, add ``ape`` to the score, one state row per token.

Grid ``(T, 2*SW / BLOCK)``: program ``(t, chunk)`` writes ``BLOCK`` consecutive floats of token
``t``'s state row. ``BLOCK`` divides ``SW``, so a chunk is all kv (a copy) or all score
(``kv_score + ape[p mod r]``, one rounded fp32 add) and the branch is uniform per program.
Tokens with ``slot_mapping < 0`` return at once; nothing else is written.
"""


import triton
import triton.language as tl


@triton.jit
def save_partial_states_kernel(
    kv_score_ptr,  # fp32 [T, 2*SW], row stride kv_score_stride
    kv_score_stride,
    ape_ptr,  # fp32 [r, SW], row stride ape_stride
    ape_stride,
    positions_ptr,  # int64 [T]
    slot_mapping_ptr,  # int64 [T]
    state_ptr,  # fp32 [num_state_blocks, bs, 2*SW], strides (4*state_block_stride4, 4*state_row_stride4, 1)
    state_block_stride4,
    state_row_stride4,
    block_size,  # bs
    RATIO: tl.constexpr,
    STATE_WIDTH: tl.constexpr,  # SW
    BLOCK: tl.constexpr,  # floats per program; divides SW
):
    token = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:
        block = slot // block_size
        row = slot - block * block_size
        columns = chunk * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(kv_score_ptr + (token.to(tl.int64) * kv_score_stride + columns))
        if chunk * BLOCK >= STATE_WIDTH:
            position = tl.load(positions_ptr + token)
            ape_row = position % RATIO
            values = values + tl.load(ape_ptr + (ape_row * ape_stride + (columns - STATE_WIDTH)))
        destination = (block * state_block_stride4 + row * state_row_stride4) * 4 + columns
        tl.store(state_ptr + destination, values)
