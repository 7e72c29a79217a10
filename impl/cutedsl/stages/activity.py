"""Device code of SPEC §5's token activity: which tokens write an entry.

A token is active iff its state is saved, its position ends a window of ``ratio`` and it
has a cache slot. Kernels read a token's metadata with :func:`token_activity`; the pipelined
C128 kernel lets lane ``j`` read token ``j`` of a batch, ballots the active ones and walks
the set bits in order (:func:`lowest_set_bit`). A kernel whose CTA takes a *run* of up to 32
consecutive tokens (``token_run``) does the same with :func:`ballot_run` and
:func:`take_lowest`: a step where few tokens close a window then costs a CTA per run, not
a CTA per token.
"""

from __future__ import annotations

import cutlass
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


@cute.jit
def ballot_run(
    mFlag: cute.Tensor,  # int64 [T]: kv_slot_mapping (with ``activity``) or a save's slot_mapping
    start,  # Int32: the token lane 0 reads
    end,  # Int32: one past the last token to read (at most T)
    activity=None,  # (mPos int64 [T], mSlot int64 [T], ratio): SPEC §5's activity; None: mFlag >= 0
    mTokenReq: cute.Tensor = None,  # int32 [T]: also read each lane's block-table row, or None
):
    """Lane ``j`` reads token ``start + j``'s metadata where it is below ``end`` (token 0 elsewhere: a
    valid index); returns ``(mask, position, flag, req)``: bit ``j`` of the ballot set iff lane ``j``'s
    token exists and is active, the lane's own values kept for :func:`take_lowest`. Every warp that
    calls it with the same bounds gets the same mask."""
    token = start + cute.arch.lane_idx()
    valid = token < end
    token = Int32(cutlass.select_(valid, token, Int32(0)))
    position = Int64(0)
    req = Int32(0)
    if cutlass.const_expr(activity is None):
        flag = mFlag[token]
        active = flag >= Int64(0)
    else:
        mPos, mSlot, ratio = activity
        position, flag, active = token_activity(mPos, mSlot, mFlag, token, ratio)
    if cutlass.const_expr(mTokenReq is not None):
        req = mTokenReq[token]  # issued with the others, before the ballot waits for them
    return cute.arch.vote_ballot_sync(valid & active), position, flag, req


def run_end(first, run, num_tokens):
    """One past the last token of the run of ``run`` tokens from ``first`` (Int32), at most ``num_tokens``."""
    return Int32(cutlass.select_(first + run < num_tokens, first + run, num_tokens))


@cute.jit
def take_lowest(mask, first, position, flag, req):
    """The lowest active token of a :func:`ballot_run` mask (non-zero): ``(token, position, flag,
    req, mask without it)``, the values shuffled from the lane that read them."""
    j = lowest_set_bit(mask)
    return (first + j, cute.arch.shuffle_sync(position, j), cute.arch.shuffle_sync(flag, j),
            cute.arch.shuffle_sync(req, j), mask & (mask - Int32(1)))


__all__ = ["ballot_run", "group_token", "lowest_set_bit", "run_end", "take_lowest", "token_activity"]
