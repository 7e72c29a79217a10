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
- the group of ``first`` scans its chunk's ``save_slot_mapping`` for the token that deferred to
  it (128 entries a step, one per thread, :meth:`Ratio2Save.scan_deferred`; none to scan in a
  chunk of one token) and, after its compress, saves it (the largest index found, over the
  group through shared memory, :meth:`Ratio2Save.save_deferred`). A thread saves the channels
  it read itself, after the group's barrier.

Both sides evaluate the same predicate, so every saved row is stored exactly once. Only the
stores are ordered: every load here reads an input the launch never writes (``kv``, ``score``,
the slot mappings, the block table), so the kernel issues them with the window rows' loads,
before the compress.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int32, Int64

from .memory import element_address, load_if
from .v41_rows import listed_slot, lookup_state_row, save_row

GROUP_THREADS = 128
GROUP_WARPS = GROUP_THREADS // 32


def first_is_active(first_kv_slot: Int64, first_slot: Int64, chunk_start: Int64):
    """SPEC §14.3's activity of the chunk's first token from its two slots, at position ``chunk_start``."""
    return (first_kv_slot >= Int64(0)) & (first_slot >= Int64(0)) & (chunk_start % 2 == Int64(1))


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
    """The ordered saves of a state of ``block_size`` rows a block, paged or a ring (``ring``).
    Their loads (:meth:`load_defer_inputs`, :meth:`scan_deferred`) read inputs only, so the kernel
    issues them before the compress; only the stores wait for it."""

    block_size: int
    ring: bool

    def load_defer_inputs(
        self,
        mKvSlot: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]: state slots (activity)
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        token: Int64,
        request: Int64,  # valid: the token's block-table row
        first: Int64,  # the chunk's first token
        chunk_start: Int64,  # P0
        ring_capacity: Int32,
        saves: Boolean,  # save_slot_mapping[token] >= 0
    ) -> tuple:
        """The loads of :meth:`defers_to_first`, all in one round (predicated,
        :func:`.memory.load_if`), where ``token`` saves and is not ``first``: ``first``'s kv slot
        and state slot, and row ``chunk_start - 1``'s lookup (where the table lists it: an active
        ``first`` implies it does)."""
        asks = saves & (token != first)
        first_kv_slot = load_if(Int64, element_address(mKvSlot, first), 1, asks)[0]
        first_slot = load_if(Int64, element_address(mSlot, first), 1, asks)[0]
        block, offset, listed = lookup_state_row(mBlockTable, request, chunk_start - 1, self.block_size, self.ring,
                                                 ring_capacity, asks)
        return asks, first_kv_slot, first_slot, block, offset, listed

    def defers_to_first(self, inputs: tuple, save_slot: Int64, chunk_start: Int64) -> Int32:
        """1 where the token's save waits for the chunk's first token (it is not ``first``,
        ``first`` is active and ``save_slot`` is the slot of row ``chunk_start - 1``), else 0.
        ``inputs``: :meth:`load_defer_inputs`."""
        asks, first_kv_slot, first_slot, block, offset, listed = inputs
        read_slot = listed_slot(block, offset, listed, self.block_size)
        waits = asks & first_is_active(first_kv_slot, first_slot, chunk_start) & (save_slot == read_slot)
        return Int32(cutlass.select_(waits, Int32(1), Int32(0)))

    @cute.jit
    def scan_deferred(
        self,
        mSave: cute.Tensor,  # int64 [T]: save_slot_mapping
        first: Int64,  # the active first token of the chunk (this group's token)
        end: Int64,  # query_start_loc[request + 1]: one past the chunk's last token
        read_slot: Int64,  # the slot of row chunk_start - 1, which the compress reads
        t: Int32,  # thread index in the group
    ) -> Int32:
        """Thread ``t``'s part of the search for the later token of the chunk whose slot is
        ``read_slot`` (it deferred to this group, :meth:`defers_to_first`): the largest such
        index among its candidates ``first + 1 + t + 128k``, or -1."""
        found = Int32(-1)
        for candidate in cutlass.range(Int32(first) + 1 + t, Int32(end), GROUP_THREADS):
            if mSave[candidate] == read_slot:
                found = candidate
        return found

    @cute.jit
    def save_deferred(
        self,
        mKv: cute.Tensor,  # fp32 or bf16 [T, 512]
        mScore: cute.Tensor,  # fp32 or bf16 [T, 512]
        mState: cute.Tensor,  # fp32 or bf16 [num_state_blocks, bs, 1024], written
        found: Int32,  # thread t's :meth:`scan_deferred`
        read_slot: Int64,  # the slot of row chunk_start - 1
        t: Int32,  # thread index in the group
        sFound: cute.Tensor,  # int32 smem (4,): the group's per-warp results
        barrier_id: Int32,  # the group's named barrier
    ):
        """In the group of the active first token of a chunk, after its compress: save the token
        the group's scan found (the contract allows one per chunk; the largest index over the
        group). Every thread of the group calls it."""
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
