"""SPEC §4 ``save_partial_states`` kernel (with §13.1/§13.2): one state row per token, kv copied,
``ape`` added to the score where the format adds it at the save.

Grid ``(T, 2*SW / BLOCK)``: program ``(t, chunk)`` writes ``BLOCK`` consecutive elements of token
``t``'s state row. ``BLOCK`` divides ``SW``, so a chunk is all kv (a copy) or all score
(``kv_score + ape[p mod r]``, one rounded fp32 add, or the raw score with ``ADD_APE`` off: SPEC
§13.2's ``ape_at = "compress"``) and the branch is uniform per program. A bf16 state
(``STATE_BF16``, SPEC §13.1) stores each value rounded once to bf16 (nearest, ties to even) by
integer arithmetic, exact under the interpreter too. Tokens with ``slot_mapping < 0`` return at
once; nothing else is written.

The projections come as one ``[T, 2*SW]`` array (``kv_score``, §4) or, in SPEC §13.4's step call,
as two ``[T, SW]`` views ``kv`` and ``score`` of any row strides (``score_rows``).
"""


import triton
import triton.language as tl

from .exact_math import bf16_rne_bits


@triton.jit
def save_partial_states_kernel(
    kv_score_ptr,  # fp32 [T, 2*SW] (kv then score), or kv fp32 [T, SW] when score_rows is given; row stride kv_score_stride
    kv_score_stride,
    ape_ptr,  # fp32 [r, SW], row stride ape_stride; None without ADD_APE
    ape_stride,  # None without ADD_APE
    positions_ptr,  # int64 [T]
    slot_mapping_ptr,  # int64 [T]: the state slot of each token, -1 = not saved
    state_ptr,  # fp32 [num_state_blocks, bs, 2*SW] (int16 bf16 patterns with STATE_BF16), strides below
    state_block_stride16b,  # state_cache.stride(0) in 16-byte units (// 4 fp32, // 8 bf16)
    state_row_stride16b,  # state_cache.stride(1) in 16-byte units
    block_size,  # bs
    score_rows,  # SPEC §13.4: (score_ptr fp32 [T, SW], score row stride); None: the score is kv_score[:, SW:]
    RATIO: tl.constexpr,
    STATE_WIDTH: tl.constexpr,  # SW
    BLOCK: tl.constexpr,  # elements per program; divides SW
    STATE_BF16: tl.constexpr,  # SPEC §13.1: store bf16(value)
    ADD_APE: tl.constexpr,  # SPEC §13.2: ape_at "save" adds ape[p mod r] to the score; "compress" stores it raw
):
    token = tl.program_id(0)
    chunk = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:
        block = slot // block_size
        row = slot - block * block_size
        columns = chunk * BLOCK + tl.arange(0, BLOCK)
        if score_rows is None:
            values = tl.load(kv_score_ptr + (token.to(tl.int64) * kv_score_stride + columns))
        else:
            score_ptr, score_stride = score_rows
            if chunk * BLOCK >= STATE_WIDTH:
                values = tl.load(score_ptr + (token.to(tl.int64) * score_stride + (columns - STATE_WIDTH)))
            else:
                values = tl.load(kv_score_ptr + (token.to(tl.int64) * kv_score_stride + columns))
        if ADD_APE:
            if chunk * BLOCK >= STATE_WIDTH:
                position = tl.load(positions_ptr + token)
                ape_row = position % RATIO
                values = values + tl.load(ape_ptr + (ape_row * ape_stride + (columns - STATE_WIDTH)))
        if STATE_BF16:
            destination = (block * state_block_stride16b + row * state_row_stride16b) * 8 + columns
            tl.store(state_ptr + destination, bf16_rne_bits(values).to(tl.uint16).to(tl.int16, bitcast=True))
        else:
            destination = (block * state_block_stride16b + row * state_row_stride16b) * 4 + columns
            tl.store(state_ptr + destination, values)
