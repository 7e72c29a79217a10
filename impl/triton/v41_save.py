"""SPEC §14.3's ratio-2 save, after the compress, inside the compress launch.

Every token with ``save_slot_mapping[t] >= 0`` stores ``R(kv[t])`` and ``R(score[t])`` at that
slot, and SPEC orders the saves after the compress: a row the compress reads from the state
must be read before a save overwrites it. Under SPEC §13.4's caller's contract only one row of a
request is read from the state: row ``P0 - 1`` of the chunk's first token ``first`` (at
``P0 = chunk_start``, when it is active: every later token finds both rows in the chunk). A ring
(or any slot choice) can give a saved token ``u`` of the same chunk that row's slot: in a chunk
of ``n >= C`` tokens, position ``P0 - 1 + k*C`` lands on the ring slot of ``P0 - 1``.

So one launch orders them with no grid-wide barrier:

- the program of token ``u != first`` saves its own row unless ``first`` is active and ``u``'s
  slot is the slot of row ``P0 - 1`` (:func:`defers_to_first`);
- the program of ``first``, after its compress, scans its chunk's ``save_slot_mapping`` for the
  tokens that deferred to it and saves them (:func:`save_deferred`), after a CTA barrier (the
  threads that read the row and the threads that store may differ).

Both sides evaluate the same predicate, so every saved row is stored exactly once. The
``tokens`` group of ratio 2: ``(positions, kv_slot_mapping, token_to_req, slot_mapping,
save_slot_mapping, query_start_loc)``: int64 ``[T]`` but ``token_to_req`` int32 ``[T]`` and
``query_start_loc`` int32 ``[num_reqs + 1]``.
"""


import triton
import triton.language as tl

from .v41_rows import save_row, state_slot

SCAN_BLOCK = tl.constexpr(1024)  # save_slot_mapping entries a chunk's first token checks per step


@triton.jit
def first_is_active(tokens, first, chunk_start):
    """SPEC §14.3's activity of the chunk's first token ``first`` (int64), at position ``chunk_start``."""
    _, kv_slots_ptr, _, slots_ptr, _, _ = tokens
    return (tl.load(kv_slots_ptr + first) >= 0) & (tl.load(slots_ptr + first) >= 0) & (chunk_start % 2 == 1)


@triton.jit
def defers_to_first(tokens, state, token, save_slot, request, first, chunk_start, RING: tl.constexpr):
    """Whether token ``token``'s save waits for the chunk's first token: ``token != first``,
    ``first`` is active (it reads row ``chunk_start - 1`` from the state) and ``save_slot`` is
    that row's slot."""
    defer = tl.full((), 0, tl.int1)
    if token != first:
        if first_is_active(tokens, first, chunk_start):
            read_slot, _, _ = state_slot(state, request, chunk_start - 1, RING)
            defer = save_slot == read_slot
    return defer


@triton.jit
def save_deferred(tokens, inputs, state, request, first, chunk_start, channels, KV_BF16: tl.constexpr,
                  SCORE_BF16: tl.constexpr, STATE_BF16: tl.constexpr, RING: tl.constexpr):
    """In the program of the active first token ``first`` of a chunk, after its compress: save every
    later token of the chunk whose slot is the slot of row ``chunk_start - 1`` (it deferred to
    this program, :func:`defers_to_first`); the contract allows one such token per chunk."""
    _, _, _, _, saves_ptr, query_start_loc_ptr = tokens
    read_slot, _, _ = state_slot(state, request, chunk_start - 1, RING)
    end = tl.load(query_start_loc_ptr + request + 1).to(tl.int64)
    for start in range(first + 1, end, SCAN_BLOCK):
        candidates = start + tl.arange(0, SCAN_BLOCK)
        saves = tl.load(saves_ptr + candidates, mask=candidates < end, other=-1)
        token = tl.max(tl.where(saves == read_slot, candidates, -1), axis=0)
        if token >= 0:
            tl.debug_barrier()  # every thread's read of the row is done before any thread stores
            save_row(inputs, state, token, read_slot, channels, KV_BF16, SCORE_BF16, STATE_BF16)
