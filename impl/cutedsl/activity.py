"""Device code of SPEC §5's token activity: which tokens write an entry, one token or a chunk.

A token is active iff its state is saved, its position ends a window of ``ratio`` and it
has a cache slot. Kernels that take one token per CTA (or token group) read its metadata
with :func:`token_activity`; a CTA that takes a chunk of up to 32 consecutive tokens lets
lane ``j`` read token ``j``'s metadata and ballots the active ones (:func:`chunk_tokens`),
then walks the set bits in order (:func:`lowest_set_bit`).
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


def chunk_lane_token(first, count, num_tokens, lane):
    """``(token, valid)``: lane ``j``'s token ``first + j`` of a chunk of ``count <= 32``
    tokens, valid below ``count`` and ``num_tokens`` (invalid lanes read token ``first``)."""
    token = first + lane
    valid = (lane < count) & (token < num_tokens)
    return Int32(cutlass.select_(valid, token, first)), valid


def chunk_tokens(mPos: cute.Tensor, mSlot: cute.Tensor, mKvSlot: cute.Tensor, mTokenReq: cute.Tensor, first, count,
                 num_tokens, lane, ratio: int):
    """``(mask, position, kv_slot, req)``: bit ``j`` of ``mask`` set iff token ``first + j``
    (``j < count <= 32``, below ``num_tokens``) is active, and lane ``j``'s metadata of that
    token, all four loaded at once (so a token's pooling needs no second metadata round
    trip). Lane ``j`` of the calling warp reads token ``j``, then a ballot: every warp that
    calls it gets the same mask."""
    token, valid = chunk_lane_token(first, count, num_tokens, lane)
    position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, token, ratio)
    req = mTokenReq[token]  # issued with the other three, before the ballot waits for them
    return cute.arch.vote_ballot_sync(valid & active), position, kv_slot, req


def lowest_set_bit(mask):
    """Index of the lowest set bit of a non-zero 32-bit mask: ``popc((m & -m) - 1)``."""
    return cute.arch.popc((mask & (Int32(0) - mask)) - Int32(1))


__all__ = ["chunk_lane_token", "chunk_tokens", "lowest_set_bit", "token_activity"]
