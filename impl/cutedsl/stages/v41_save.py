"""SPEC §14.3's ratio-2 save, after the compress, inside the compress launch (CuTe DSL device code).

Every token with ``save_slot_mapping[t] >= 0`` stores ``R(kv[t])`` and ``R(score[t])`` at that
slot, and SPEC orders the saves after the compress: a row the compress reads from the state must
be read before a save overwrites it. Under SPEC §13.4's caller's contract only one row of a
request is read from the state: row ``P0 - 1`` of the chunk's first token ``first`` (at
``P0 = chunk_start``, when it is active: every later token finds both rows in the chunk). A ring
(or any slot choice) can give a saved token ``u`` of the same chunk that row's slot: in a chunk
of ``n >= C`` tokens, position ``P0 - 1 + k*C`` lands on the ring slot of ``P0 - 1``.

So one launch orders them with no grid-wide barrier (the Triton kernel's scheme,
``impl/triton/v41_save.py``):

- the token group of token ``u != first`` saves its own row unless ``first`` is active and
  ``u``'s slot is the slot of row ``P0 - 1`` (:meth:`Ratio2Save.defers_to_first`);
- the group of ``first``, after its compress, scans its chunk's ``save_slot_mapping`` for the
  token that deferred to it (128 entries a step, one per thread; the largest index found, over
  the group through shared memory) and saves it (:meth:`Ratio2Save.save_deferred`). A thread
  saves the channels it read itself, after the group's barrier.

Both sides evaluate the same predicate, so every saved row is stored exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from .memory import load_scalar
from .v41_rows import save_row, state_slot

GROUP_THREADS = 128
GROUP_WARPS = GROUP_THREADS // 32


def first_is_active(mKvSlot: cute.Tensor, mSlot: cute.Tensor, first, chunk_start):
    """SPEC §14.3's activity of the chunk's first token ``first`` (Int64) at position ``chunk_start``."""
    return ((load_scalar(mKvSlot, first) >= Int64(0)) & (load_scalar(mSlot, first) >= Int64(0))
            & (chunk_start % 2 == Int64(1)))


def butterfly_max_int(value):
    """Maximum of an Int32 over the 32 lanes of a warp (xor offsets 1..16; every lane calls it)."""
    offset = 1
    while offset <= 16:
        other = cute.arch.shuffle_sync_bfly(value, offset=offset)
        value = Int32(cutlass.select_(other > value, other, value))
        offset *= 2
    return value


@dataclass(frozen=True)
class Ratio2Save:
    """The ordered saves of a state of ``block_size`` rows a block, paged or a ring (``ring``)."""

    block_size: int
    ring: bool

    @cute.jit
    def defers_to_first(
        self,
        mKvSlot: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]: state slots (activity)
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        token: Int64,
        save_slot: Int64,  # save_slot_mapping[token] >= 0
        request: Int64,
        first: Int64,
        chunk_start: Int64,
        ring_capacity: Int32,
    ) -> Int32:
        """1 where token ``token``'s save waits for the chunk's first token (``token != first``,
        ``first`` is active and ``save_slot`` is the slot of row ``chunk_start - 1``), else 0."""
        defer = Int32(0)
        if token != first:
            if first_is_active(mKvSlot, mSlot, first, chunk_start):
                read_slot, _, _ = state_slot(mBlockTable, request, chunk_start - 1, self.block_size, self.ring,
                                             ring_capacity)
                defer = Int32(cutlass.select_(save_slot == read_slot, Int32(1), Int32(0)))
        return defer

    @cute.jit
    def save_deferred(
        self,
        mKv: cute.Tensor,  # fp32 or bf16 [T, 512]
        mScore: cute.Tensor,  # fp32 or bf16 [T, 512]
        mSave: cute.Tensor,  # int64 [T]: save_slot_mapping
        mQsl: cute.Tensor,  # int32 [num_reqs + 1]: query_start_loc
        mState: cute.Tensor,  # fp32 or bf16 [num_state_blocks, bs, 1024], written
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        request: Int64,
        first: Int64,  # the active first token of the chunk (this group's token)
        chunk_start: Int64,
        ring_capacity: Int32,
        t: Int32,  # thread index in the group
        sFound: cute.Tensor,  # int32 smem (4,): the group's per-warp results
        barrier_id: Int32,  # the group's named barrier
    ):
        """In the group of the active first token of a chunk, after its compress: save the later
        token of the chunk whose slot is the slot of row ``chunk_start - 1`` (it deferred to this
        group, :meth:`defers_to_first`; the contract allows one such token per chunk). Every
        thread of the group calls it."""
        read_slot, _, _ = state_slot(mBlockTable, request, chunk_start - 1, self.block_size, self.ring, ring_capacity)
        end = Int32(load_scalar(mQsl, request + 1))
        found = Int32(-1)
        for candidate in cutlass.range(Int32(first) + 1 + t, end, GROUP_THREADS):
            if mSave[candidate] == read_slot:
                found = candidate
        found = butterfly_max_int(found)
        if t % 32 == 0:
            sFound[t // 32] = found
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=GROUP_THREADS)
        token = sFound[0]
        for w in cutlass.range_constexpr(1, GROUP_WARPS):
            token = Int32(cutlass.select_(sFound[w] > token, sFound[w], token))
        if token >= 0:
            save_row(mKv, mScore, mState, Int64(token), read_slot, self.block_size, t)


__all__ = ["Ratio2Save", "butterfly_max_int", "first_is_active"]
