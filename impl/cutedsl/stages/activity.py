"""Device code of SPEC §5's token activity: which tokens write an entry.

A token is active iff its state is saved, its position ends a window of ``ratio`` and it
has a cache slot. Kernels read a token's metadata with :func:`token_activity`; the pipelined
C128 kernel lets lane ``j`` read token ``j`` of a batch, ballots the active ones and walks
the set bits in order (:func:`lowest_set_bit`).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64


def token_activity(mPos: cute.Tensor, mSlot: cute.Tensor, mKvSlot: cute.Tensor, tok, ratio: int):
    """SPEC §5, which tokens write an entry: ``(p, kv_slot, active)``, active iff the token's
    state is saved, ``p`` ends a window of ``ratio`` and it has a cache slot."""
    position = mPos[tok]
    kv_slot = mKvSlot[tok]
    active = (mSlot[tok] >= Int64(0)) & (kv_slot >= Int64(0)) & ((position + 1) % ratio == Int64(0))
    return position, kv_slot, active


def group_token(group_threads: int, tokens_per_cta: int):
    """``(t, tok)`` of this thread when a CTA holds ``tokens_per_cta`` consecutive tokens, a group of
    ``group_threads`` threads each: its index in its token group and the group's token."""
    tidx, _, _ = cute.arch.thread_idx()
    cta, _, _ = cute.arch.block_idx()
    return tidx % group_threads, cta * tokens_per_cta + tidx // group_threads


def lowest_set_bit(mask):
    """Index of the lowest set bit of a non-zero 32-bit mask: ``popc((m & -m) - 1)``."""
    return cute.arch.popc((mask & (Int32(0) - mask)) - Int32(1))


__all__ = ["group_token", "lowest_set_bit", "token_activity"]
