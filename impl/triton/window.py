"""SPEC §5 (with §13's state formats) in Triton device code, before the pooling: a token's activity
and where each row of its window comes from.

:func:`token_activity` loads a token's metadata and applies SPEC §5's activity rule
(:func:`run_activity` for a run of tokens at once, taken in order with :func:`take_next`);
:func:`window_row_offsets` resolves the W window rows of an active token once (position,
validity, ``block_table`` entry, paged or in a ring, and the int64 element offset of the row's kv
half in the state) for the channel tiles of :mod:`.pooling`. In SPEC §13.4's step call,
:func:`chunk_rows` says which rows the call's own ``kv`` / ``score`` hold and where; where ``ape``
is added at pooling, :func:`ape_rows` gives each row's ``ape`` row.

:func:`window_rows` puts them together: what the pooling stage (:mod:`.pooling`) reads a token's
window from, for the fused kernel and the split path's pool kernel alike.

A window row's ``ape`` row is ``pos_i mod r = i mod r`` for every active token (``p + 1`` is a
multiple of ``r`` and ``W`` is ``r`` or ``2r``), so its offset needs no position.
"""


import triton
import triton.language as tl

from .pooling import window_row_of


@triton.jit
def is_active(slot, position, kv_slot, RATIO: tl.constexpr):
    """SPEC §5's activity rule on loaded metadata (scalars or vectors alike): a state slot, a
    boundary position (``p + 1`` a multiple of ``r``) and an entry slot."""
    return (slot >= 0) & ((position + 1) % RATIO == 0) & (kv_slot >= 0)


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
    return position, request, kv_slot, is_active(slot, position, kv_slot, RATIO)


@triton.jit
def run_activity(first, token_run, num_tokens, tokens, RATIO: tl.constexpr, MAX_RUN: tl.constexpr):
    """SPEC §5's activity rule for a run of ``token_run <= MAX_RUN`` consecutive tokens from ``first``
    (those at or past ``num_tokens`` are not in it), their metadata read at once (coalesced):
    ``(active int1 [MAX_RUN], count)``; take them in order with :func:`take_next`."""
    _, positions_ptr, slot_mapping_ptr, kv_slot_mapping_ptr = tokens
    offset = tl.arange(0, MAX_RUN)
    token = first + offset
    in_run = (offset < token_run) & (token < num_tokens)
    slot = tl.load(slot_mapping_ptr + token, mask=in_run, other=-1)
    kv_slot = tl.load(kv_slot_mapping_ptr + token, mask=in_run, other=-1)
    position = tl.load(positions_ptr + token, mask=in_run, other=0)
    active = in_run & is_active(slot, position, kv_slot, RATIO)
    return active, tl.sum(active.to(tl.int32), axis=0)


@triton.jit
def take_next(active, MAX_RUN: tl.constexpr):
    """``(offset, active without it)``: the lowest offset still set in ``active`` (int1 [MAX_RUN])."""
    offset = tl.arange(0, MAX_RUN)
    first = tl.min(tl.where(active, offset, MAX_RUN), axis=0)
    return first, active & (offset != first)


@triton.jit
def window_row_offsets(state_strides, block_table, request, position, chunk_first, RATIO: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr, HEAD: tl.constexpr, ROW_FORMAT: tl.constexpr,
                       LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """int64 ``[W]`` element offsets of each tensor row's kv half in the state, and int1 ``[W]`` validity.

    Tensor row ``i`` holds window row ``w = window_row_of(i)`` at position ``q = p - W + 1 + w``;
    its state row is ``state[block_table[request, q' // bs], q' % bs]`` with ``q' = q`` (paged) or
    ``q mod C`` (``ROW_FORMAT.ring_capacity = C``, SPEC §13.3); half ``w // r``. ``state_strides``:
    ``(block stride, row stride)`` in 16-byte units (4 fp32 or 8 bf16 elements), so the compiler
    knows every row starts on 16 bytes; ``block_table``: ``(block_table_ptr int32 [num_reqs,
    max_blocks], row stride)``. With ``ROW_FORMAT.chunk`` (SPEC §13.4) rows at positions
    ``>= chunk_first`` are the call's inputs': their block-table entries are not read (offset 0);
    otherwise ``chunk_first`` is not looked at.
    """
    W: tl.constexpr = (2 if RATIO == 4 else 1) * RATIO
    ELEMENTS_16B: tl.constexpr = 8 if ROW_FORMAT.state_bf16 else 4
    state_block_stride16b, state_row_stride16b = state_strides
    block_table_ptr, block_table_stride = block_table
    window_row = window_row_of(tl.arange(0, W), LANE_BITS, WARP_BITS, REG_BITS)
    row_position = position - (W - 1) + window_row
    valid = row_position >= 0
    in_state = valid
    if ROW_FORMAT.chunk:
        in_state = valid & (row_position < chunk_first)
    if ROW_FORMAT.ring_capacity > 0:
        # q mod C from one scalar remainder: p mod C - (W - 1) + w lies in [-(W - 1), C - 1] (W <= C)
        C: tl.constexpr = ROW_FORMAT.ring_capacity
        ring_row = (position % C) - (W - 1) + window_row
        safe_position = tl.where(in_state, tl.where(ring_row < 0, ring_row + C, ring_row), 0)
    else:
        safe_position = tl.where(in_state, row_position, 0)
    block = tl.load(block_table_ptr + (request * block_table_stride + safe_position // BLOCK_SIZE), mask=in_state, other=0)
    row_in_block = safe_position % BLOCK_SIZE
    offsets16b = block.to(tl.int64) * state_block_stride16b + row_in_block * state_row_stride16b
    half = window_row // RATIO  # C4: 0 for rows 0..3, 1 for rows 4..7; C128: always 0
    return offsets16b * ELEMENTS_16B + half * HEAD, valid


@triton.jit
def chunk_rows(chunk, tokens, request, position, RATIO: tl.constexpr, HEAD: tl.constexpr,
               LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """SPEC §13.4: which window rows the call's inputs hold, and their offsets there.

    ``chunk``: ``(kv_ptr fp32 [T, SW], kv_stride16b, score_ptr fp32 [T, SW], score_stride16b,
    query_start_loc_ptr int32 [num_reqs + 1])``, row strides in 16-byte units (4 floats);
    ``tokens``: the kernel's per-token tuple (``positions`` is its second array).
    Returns ``((kv_ptr, score_ptr, from_chunk int1 [W], kv_offsets int64 [W], score_offsets int64 [W]),
    first_position)``: tensor row ``j`` (window row ``window_row_of(j)``, position ``q``) is in the
    chunk when ``q >= P0``, token ``u = query_start_loc[req] + (q - P0)``; offsets address its half
    ``h = i // r`` (other rows point at token 0, never read).
    """
    kv_ptr, kv_stride16b, score_ptr, score_stride16b, query_start_loc_ptr = chunk
    positions_ptr = tokens[1]
    W: tl.constexpr = (2 if RATIO == 4 else 1) * RATIO
    first_token = tl.load(query_start_loc_ptr + request).to(tl.int64)
    first_position = tl.load(positions_ptr + first_token)
    window_row = window_row_of(tl.arange(0, W), LANE_BITS, WARP_BITS, REG_BITS)
    row_position = position - (W - 1) + window_row
    from_chunk = (row_position >= first_position) & (row_position >= 0)
    token = tl.where(from_chunk, first_token + (row_position - first_position), 0)
    half = (window_row // RATIO) * HEAD
    kv_offsets = token * kv_stride16b * 4 + half
    score_offsets = token * score_stride16b * 4 + half
    return (kv_ptr, score_ptr, from_chunk, kv_offsets, score_offsets), first_position


@triton.jit
def ape_rows(ape, RATIO: tl.constexpr, HEAD: tl.constexpr,
             LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """SPEC §13.2/§13.4: ``(ape_ptr, offsets int32 [W])``, the element offset of ``ape[i mod r, h*H]``
    for each tensor row (window row ``i``, half ``h = i // r``). ``ape``: ``(ape_ptr fp32 [r, SW],
    ape_stride)``."""
    ape_ptr, ape_stride = ape
    W: tl.constexpr = (2 if RATIO == 4 else 1) * RATIO
    window_row = window_row_of(tl.arange(0, W), LANE_BITS, WARP_BITS, REG_BITS)
    return ape_ptr, (window_row % RATIO) * ape_stride + (window_row // RATIO) * HEAD


@triton.jit
def window_rows(state, block_table, ape, chunk, tokens, request, position, RATIO: tl.constexpr,
                BLOCK_SIZE: tl.constexpr, HEAD: tl.constexpr, ROW_FORMAT: tl.constexpr,
                LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """The rows of an active token's window as :func:`.pooling.pool_channel_tile` takes them:
    ``(state_ptr, kv_row_offsets int64 [W], row_valid int1 [W], chunk rows, ape rows)``.

    ``state``: ``(state_ptr fp32 or int16 bf16 patterns [num_state_blocks, bs, 2*SW], block stride,
    row stride)``, strides in 16-byte units; ``block_table``: ``(block_table_ptr int32 [num_reqs,
    max_blocks], row stride)``; ``ape``: ``(ape_ptr fp32 [r, SW], row stride)`` or None, ``chunk``:
    :func:`chunk_rows`' tuple or None, as ``ROW_FORMAT`` has them (placeholders 0 in the result
    otherwise); ``tokens``: the kernel's per-token tuple."""
    state_ptr, state_block_stride16b, state_row_stride16b = state
    chunk_window = 0  # placeholders (Triton takes no None inside a tuple built here): the constexpr
    chunk_first = 0  # ROW_FORMAT says which of the row sources below exist
    if ROW_FORMAT.chunk:
        chunk_window, chunk_first = chunk_rows(chunk, tokens, request, position, RATIO, HEAD, LANE_BITS, WARP_BITS,
                                               REG_BITS)
    ape_window = 0
    if ROW_FORMAT.ape_at_compress or ROW_FORMAT.chunk:
        ape_window = ape_rows(ape, RATIO, HEAD, LANE_BITS, WARP_BITS, REG_BITS)
    kv_row_offsets, row_valid = window_row_offsets(
        (state_block_stride16b, state_row_stride16b), block_table, request, position, chunk_first, RATIO, BLOCK_SIZE,
        HEAD, ROW_FORMAT, LANE_BITS, WARP_BITS, REG_BITS)
    return state_ptr, kv_row_offsets, row_valid, chunk_window, ape_window
