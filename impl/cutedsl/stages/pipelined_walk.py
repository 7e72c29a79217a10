"""The walk of the persistent C128 kernel (:mod:`..kernels.fused_pipelined`): a CTA's run of
tokens, its active ones found by ballot, and their rows staged in shared memory ahead of the
pooling.

A persistent grid of ``G`` 8-CTA clusters gives cluster ``k`` the contiguous run of tokens
``k * ceil(T / G) ..``. Every CTA of a cluster walks the run on its own and finds the same
active tokens in the same order (no shared memory, no barrier):

1. lane ``j`` of every warp reads token ``32b + j`` of batch ``b`` of the run (position, slots,
   request; coalesced), and a ballot gives the batch's active tokens (SPEC §5). The next active
   token's metadata comes from its lane by shuffle. Once a batch is used up, the activity of the
   next ``PROBE`` batches is read at once (one round trip for 256 tokens) and the first of them
   with an active token is loaded.
2. staging: each thread copies its own 8 rows x 4 channels of a token's scores or kv into shared
   memory with ``cp.async`` (one commit group each) and reads back only its own slots, so the
   stages need no CTA barrier. Where each row's 16 bytes are (the state, paged or a ring, or the
   step's chunk) and what a score needs once read back (``ape``) is :mod:`.staged_rows`' part.
"""

from __future__ import annotations

from functools import partial

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .activity import ballot_run, lowest_set_bit, run_end
from .dependent_launch import wait_for_prerequisite_grids
from .pooling_c128 import RATIO, C128TilePooling, copy_row_async, read_staged_rows
from .staged_rows import StagedRows

BATCH = 32  # tokens whose metadata one warp reads at once (a ballot)
PROBE = 8  # batches whose activity is read at once once a batch is used up
KV, SCORE = 0, 1  # a row's two halves (the index of its input tensor in a chunk's (kv, score))


def run_bounds(num_tokens: Int32, clusters: Int32, cluster: Int32):
    """``(first, end)``: cluster ``cluster``'s contiguous run of the ``num_tokens`` tokens
    (``ceil(T / G)`` each, the last ones shorter or empty)."""
    share = (num_tokens + clusters - 1) // clusters
    first = cluster * share
    return first, run_end(first, share, num_tokens)


class RunWalk:
    """The walk and the staging of one CTA of a persistent C128 kernel (the pooling map of
    :class:`.pooling_c128.C128TilePooling`). ``walk`` is the tuple ``(mPos, mSlot, mKvSlot,
    mTokenReq, first, end)``."""

    def __init__(self, pooling: C128TilePooling):
        self.pooling = pooling
        self.rows = StagedRows(pooling.state, pooling.block_size, pooling.rows_per_lane, pooling.rows_per_lookup)

    @cute.jit
    def begin(self, metadata: tuple, clusters: Int32, cluster: Int32):
        """Cluster ``cluster``'s walk and its first active token: ``(walk, found, position, kv_slot,
        req, index, batch, mask, lane metadata)`` (``metadata``: ``(mPos, mSlot, mKvSlot, mTokenReq)``)."""
        mPos, mSlot, mKvSlot, mTokenReq = metadata
        first, end = run_bounds(Int32(mPos.shape[0]), clusters, cluster)  # a contiguous run (coalesced metadata)
        walk = (mPos, mSlot, mKvSlot, mTokenReq, first, end)
        mask, lane_pos, lane_kv_slot, lane_req = self.load_batch(walk, Int32(0))
        return (walk, *self.next_active(walk, Int32(0), mask, lane_pos, lane_kv_slot, lane_req))

    def lane_rows(self, sources: tuple, token: tuple) -> tuple:
        """Where this lane's rows of a token's window are (``token``: its ``(req, position, index)``):
        :meth:`.staged_rows.StagedRows.lane_rows` from the lane's first row (``sources``: the kernel's
        ``(mState, mBlockTable, ring_capacity, chunk)``)."""
        req, position, index = token
        window_start, first_row = self.pooling.lane_window(position, cute.arch.lane_idx())
        return self.rows.lane_rows(sources, req, (position, index), window_start + first_row)

    @cute.jit
    def stage_first(self, sources: tuple, stages: tuple, tidx: Int32, lane_bytes: tuple, first: tuple,
                    wait_after_metadata: bool):
        """The first active token's rows into ``stages`` (``(sScore, sKv)``): scores, then kv (two
        commit groups), if ``first = (found, req, position, index)`` found one; returns the lane's first chunk
        row of that token (:meth:`lane_rows`). ``wait_after_metadata``: the grid dependency is waited on
        here, after the metadata reads (early metadata)."""
        sScore, sKv = stages
        found, req, position, index = first
        chunk_from = Int32(self.pooling.rows_per_lane)
        if found:
            rows = self.lane_rows(sources, (req, position, index))
            wait_for_prerequisite_grids(wait_after_metadata)  # metadata read: now the state and the inputs
            self.stage_rows(sources, rows, SCORE, sScore, (tidx, lane_bytes), found)
            self.stage_rows(sources, rows, KV, sKv, (tidx, lane_bytes), found)
            chunk_from = rows[2]
        return chunk_from

    @cute.jit
    def load_batch(self, walk: tuple, batch: Int32):
        """``(mask, position, kv_slot, req)`` of batch ``batch`` (:func:`.activity.ballot_run`): bit ``j``
        of the ballot is set iff lane ``j``'s token ``first + 32 batch + j`` exists in the run and is
        active (SPEC §5); the lane keeps its token's metadata."""
        mPos, mSlot, mKvSlot, mTokenReq, first, end = walk
        return ballot_run(mKvSlot, first + batch * BATCH, end, (mPos, mSlot, RATIO), mTokenReq)

    @cute.jit
    def probe_batches(self, walk: tuple, batch: Int32):
        """Index ``k < PROBE`` of the first of batches ``batch + 1 .. batch + PROBE`` with an active
        token (``PROBE`` if none): their activity is read at once, one round trip for them all."""
        mPos, mSlot, mKvSlot, _, first, end = walk
        masks = [ballot_run(mKvSlot, first + (batch + 1 + k) * BATCH, end, (mPos, mSlot, RATIO))[0]
                 for k in range(PROBE)]  # unrolled at trace time
        first_active = Int32(PROBE)
        for k in cutlass.range_constexpr(PROBE - 1, -1, -1):  # the lowest non-empty batch wins
            first_active = Int32(cutlass.select_(masks[k] != Int32(0), Int32(k), first_active))
        return first_active

    @cute.jit
    def next_active(self, walk: tuple, batch: Int32, mask: Int32, lane_pos: Int64, lane_kv_slot: Int64,
                    lane_req: Int32):
        """The run's next active token after those already taken from ``mask``: ``(found, position,
        kv_slot, req, index)`` (``index``: the token's own) and the walk's new ``(batch, mask, lane
        metadata)``. Once a batch
        is used up, the next ``PROBE`` batches are probed at once and the first with an active token
        is loaded; ``found`` is false past the last batch."""
        first, end = walk[4], walk[5]
        while (mask == Int32(0)) & (first + (batch + 1) * BATCH < end):
            skip = self.probe_batches(walk, batch)
            if skip < Int32(PROBE):
                batch = batch + Int32(1) + skip
                mask, lane_pos, lane_kv_slot, lane_req = self.load_batch(walk, batch)
            else:
                batch = batch + Int32(PROBE)
        found = mask != Int32(0)
        j = Int32(cutlass.select_(found, lowest_set_bit(mask), Int32(0)))
        mask = mask & (mask - Int32(1))
        position = cute.arch.shuffle_sync(lane_pos, j)
        kv_slot = cute.arch.shuffle_sync(lane_kv_slot, j)
        req = cute.arch.shuffle_sync(lane_req, j)
        index = Int32(0)  # read only by the step's chunk rows: a constant elsewhere, carried by no loop
        if cutlass.const_expr(self.pooling.state.rows_from_inputs):
            index = first + batch * BATCH + j
        return found, position, kv_slot, req, index, batch, mask, lane_pos, lane_kv_slot, lane_req

    @cute.jit
    def stage_rows(self, sources: tuple, rows: tuple, source: int, sStage: cute.Tensor, thread: tuple,
                   enabled) -> None:
        """``cp.async`` of this thread's 4 channels of each of its rows (``rows``: :meth:`lane_rows`) into
        its own slots of ``sStage`` (if ``enabled``), then one commit group (empty if not): the rows'
        ``kv`` (``source`` :data:`KV`) or scores (:data:`SCORE`). ``thread``: ``(tidx, (kv_byte,
        score_byte))``, the thread and its channels' offsets in a state row."""
        tidx, lane_bytes = thread
        channel = self.pooling.byte_channel(lane_bytes[KV])
        if enabled:
            for i in cutlass.range_constexpr(self.pooling.rows_per_lane):
                address = self.rows.staged_address(sources, rows, i, lane_bytes[source], source, channel)
                copy_row_async(address, sStage[i, tidx, None])
        cute.arch.cp_async_commit_group()

    def staged_kv(self, sKv: cute.Tensor, tidx: Int32) -> list:
        """This thread's kv rows of the current token, once its kv group has landed (the next
        token's score group may still be in flight)."""
        cute.arch.cp_async_wait_group(1)
        return read_staged_rows(sKv, tidx, self.pooling.row_fragments())

    @cute.jit
    def pool_staged(
        self,
        sources: tuple,  # (mState, mBlockTable, ring_capacity, chunk): StagedRows' sources
        mApe: cute.Tensor,  # fp32 [128, 512] where a read-back score takes ape, else None
        stages: tuple,  # (sScore, sKv, sMax, sNum, sDen): the staged rows and the pooling's partials
        thread: tuple,  # (tidx, (kv_byte, score_byte)): the thread and its channels in a state row
        current: tuple,  # (req, position, index, chunk_from) of the token being pooled, its rows staged
        upcoming: tuple,  # (found, req, position, index) of the next active token
    ):
        """Pool the current token from its staged rows (SPEC §5, as every C128 kernel) and stage
        the next one's meanwhile: its scores once this token's window max is known (the score stage
        is read), its kv once this token's products are formed. Returns ``(x, chunk_from)``: ``x``
        fp32 ``(2,)``, meaningful in warp 0, and the next token's first chunk row."""
        sScore, sKv, sMax, sNum, sDen = stages
        tidx, lane_bytes = thread
        req, position, index, chunk_from = current
        found_next, req_next, position_next, index_next = upcoming
        # the next token's rows (this token's again when there is none: valid addresses)
        rows_next = self.lane_rows(sources, (Int32(cutlass.select_(found_next, req_next, req)),
                                             Int64(cutlass.select_(found_next, position_next, position)),
                                             Int32(cutlass.select_(found_next, index_next, index))))
        _, first_row = self.pooling.lane_window(position, cute.arch.lane_idx())
        ape = self.rows.ape_rows(mApe, first_row, self.pooling.byte_channel(lane_bytes[KV]))  # issued before the wait
        cute.arch.cp_async_wait_group(1)  # this token's scores (its kv may still be in flight)
        sc = read_staged_rows(sScore, tidx, self.pooling.row_fragments())
        self.rows.fix_scores(sc, ape, chunk_from)
        x = cute.make_rmem_tensor((self.pooling.tile // 32,), Float32)
        x.fill(0.0)
        self.pooling.reduce_rows(
            sc, partial(self.staged_kv, sKv, tidx), sMax, sNum, sDen, x,
            after_max=partial(self.stage_rows, sources, rows_next, SCORE, sScore, thread, found_next),
            after_products=partial(self.stage_rows, sources, rows_next, KV, sKv, thread, found_next),
        )
        return x, rows_next[2]


__all__ = ["BATCH", "PROBE", "RunWalk", "run_bounds"]
