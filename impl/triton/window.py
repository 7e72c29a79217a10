"""SPEC §5 in Triton device code, before the pooling: a token's activity and the state rows of
its window.

:func:`token_activity` loads a token's metadata and applies SPEC §5's activity rule;
:func:`window_row_offsets` resolves the W window rows of an active token once (position,
validity, ``block_table`` entry, int64 element offset of the row's kv half) for the channel
tiles of :mod:`.pooling`.
"""


import triton
import triton.language as tl

from .pooling import window_row_of


@triton.jit
def token_activity(token, tokens, RATIO: tl.constexpr):
    """SPEC §5's activity rule for ``token``: ``(position, request (int64), kv_slot, active)``.

    ``tokens``: the per-token metadata, ``(token_to_req_indices int32 [T], positions int64 [T],
    slot_mapping int64 [T], kv_slot_mapping int64 [T])``. The request index is loaded with the
    other metadata: one round trip less before the block table."""
    token_to_req_ptr, positions_ptr, slot_mapping_ptr, kv_slot_mapping_ptr = tokens
    slot = tl.load(slot_mapping_ptr + token)
    kv_slot = tl.load(kv_slot_mapping_ptr + token)
    position = tl.load(positions_ptr + token)
    request = tl.load(token_to_req_ptr + token).to(tl.int64)
    active = (slot >= 0) & ((position + 1) % RATIO == 0) & (kv_slot >= 0)
    return position, request, kv_slot, active


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
