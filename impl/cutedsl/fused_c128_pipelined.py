"""C128 in one launch on a persistent grid: clusters that walk the tokens with rows in flight.

Why: a grid of one cluster (or 8 CTAs) per token spends a CTA launch and a metadata round trip
on every inactive token, and in a serving step almost every C128 token is inactive (one in 128
closes a window). A grid of one token per CTA *chunk* skips them for a ballot bit, but a CTA
that pools its tokens one after the other leaves HBM idle while it computes. Here a fixed
number ``G`` of 8-CTA clusters (as many as the device holds at once, never more than ``T``;
the host asks the driver, :mod:`.occupancy`) each walk a contiguous run of ``ceil(T / G)``
tokens and overlap the next active token's reads with the current token's arithmetic.

Per CTA (rank ``g`` = 64-channel tile ``g``, 8 warps, the pooling map of
:class:`.pooling_c128.C128TilePooling`):

1. metadata: lane ``j`` of every warp reads token ``32b + j`` of batch ``b`` of the run
   (position, slots, request; coalesced), a ballot gives the batch's active tokens; every
   warp computes the same mask, so the CTAs of a cluster (and the warps of a CTA) agree on
   the order without shared memory. The next active token's metadata comes from its lane by
   shuffle. Once a batch is used up, the activity of the next 8 batches is read at once (one
   round trip for 256 tokens) and the first of them with an active token is loaded.
2. staging: each thread copies its own 8 rows x 4 channels of scores and of kv into shared
   memory with ``cp.async`` (two commit groups per token, scores first) and reads back only
   its own slots, so the stages need no CTA barrier.
3. per active token ``A`` with next active token ``B``: read ``B``'s block-table entries; wait
   for ``A``'s scores (``cp.async.wait_group 1``), pool ``A`` (SPEC §5, exactly as every C128
   kernel); once ``A``'s window max is known (its scores are consumed) ``B``'s scores are
   issued into the score stage, and once ``A``'s products ``u = kv * e`` are formed ``B``'s kv
   rows into the kv stage. So ``B``'s 64 KiB per CTA stream while ``A`` is reduced, normalized
   and stored.
4. finishing, as the cluster kernel: each CTA's tile sum of squares goes to every CTA of the
   cluster through DSMEM, one cluster barrier per token, then :class:`.postprocess.TileFinish`.
   The tile sums are double-buffered by token parity: a CTA writes buffer ``k % 2`` for token
   ``k`` only after the barrier of token ``k - 1``, which every CTA passes after reading
   buffer ``k % 2`` for token ``k - 2``.

A cluster arrive at kernel start, waited on once the first token's rows are in flight,
ensures every CTA runs before any remote store; after a
cluster's last barrier nobody touches another CTA's shared memory, so CTAs exit freely.
Correctness does not depend on the clusters being resident together (a late cluster just
walks its share late). Timings: ``bench/RESULTS.md``.
"""

from __future__ import annotations

from functools import partial

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from .activity import lowest_set_bit, token_activity
from .cluster_smem import store_to_peer_smem
from .config import PipelinedConfig
from .dependent_launch import wait_for_prerequisite_grids
from .pooling_c128 import RATIO, C128TilePooling, copy_row_async, read_staged_rows
from .postprocess import TileFinish

SMEM_CARVEOUT_PERCENT = 100  # room for 3 x ~70 KiB
BATCH = 32  # tokens whose metadata one warp reads at once (a ballot)
PROBE = 8  # batches whose activity is read at once once a batch is used up


class C128PipelinedKernel:
    """Grid ``8 * G`` (1-D; CTAs ``8c .. 8c+7`` are cluster ``c``, its ranks the tiles), cluster
    ``(8, 1, 1)``, 256 threads."""

    def __init__(self, config: PipelinedConfig):
        self.config = config
        self.pool = config.pool
        self.pdl = config.pool.pdl
        self.pooling = C128TilePooling(config.pool)
        self.finishing = TileFinish(config.entry, RATIO, config.pool.tile)
        self.tiles = self.pooling.num_tiles  # CTAs per cluster (8)
        self.threads = self.pooling.threads

    @property
    def smem_bytes(self) -> int:
        """Shared memory per CTA, as :meth:`kernel` allocates it (three ``[warps, 64]`` partials,
        the score and kv stages, two tile-sum buffers), plus 1 KiB for alignment."""
        pooling = self.pooling
        partials = 3 * pooling.warps * pooling.tile * 4
        stages = 2 * pooling.rows_per_lane * pooling.threads * pooling.vec * 4
        return partials + stages + 2 * self.tiles * 4 + 1024

    @cute.jit
    def __call__(
        self,
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 1024]
        mTokenReq: cute.Tensor,  # int32 [T]
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # flashmla_fp8: uint8 [P, B, 584]; bf16: bf16 [P, B, 512]; fp8: e4m3 [P, B, 512]
        mKvSlot: cute.Tensor,  # int64 [T]
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale), fp8_per_tensor only
        clusters: Int32,  # G, 1 <= G <= T
        stream: cuda.CUstream,
    ):
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, fp8_inv,
                    clusters).launch(grid=(self.tiles * clusters, 1, 1), block=(self.pooling.threads, 1, 1),
                                     cluster=(self.tiles, 1, 1), stream=stream, use_pdl=self.pdl,
                                     min_blocks_per_mp=self.config.ctas_per_sm,
                                     preferred_smem_carveout=SMEM_CARVEOUT_PERCENT)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32, clusters: Int32):
        wait_for_prerequisite_grids(self.pdl and not self.pool.early_metadata)  # first (else before the rows)
        cta, _, _ = cute.arch.block_idx()
        tile, cluster = self.pooling.tile_and_token(cta)  # rank in the cluster, and the cluster
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        smem = SmemAllocator()
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(smem)
        sScore = smem.allocate_tensor(Float32, sKv.layout, byte_alignment=16)  # [rows_per_lane, threads, 4]
        sTileSums = smem.allocate_tensor(Float32, cute.make_layout(2 * self.tiles), byte_alignment=16)  # 2 buffers
        cute.arch.cluster_arrive_relaxed()  # "this CTA runs"; waited on before the first remote store

        num_tokens = Int32(mPos.shape[0])
        kv_byte, score_byte = self.pooling.channel_bytes(tile, lane)
        share = (num_tokens + clusters - 1) // clusters  # the cluster's tokens: a contiguous run (coalesced metadata)
        first = cluster * share
        end = Int32(cutlass.select_(first + share < num_tokens, first + share, num_tokens))
        walk = (mPos, mSlot, mKvSlot, mTokenReq, first, end, lane)
        mask, lane_pos, lane_kv_slot, lane_req = self.load_batch(walk, Int32(0))
        found, position, kv_slot, req, batch, mask, lane_pos, lane_kv_slot, lane_req = self.next_active(
            walk, Int32(0), mask, lane_pos, lane_kv_slot, lane_req)
        if found:  # the first active token's rows: scores, then kv
            rows = self.pooling.lane_runs(mState, mBlockTable, req, position)
            wait_for_prerequisite_grids(self.pdl and self.pool.early_metadata)  # metadata read: now the state
            self.stage_rows(mState, rows, score_byte, sScore, tidx, found)
            self.stage_rows(mState, rows, kv_byte, sKv, tidx, found)
        cute.arch.cluster_wait()  # every CTA of the cluster runs (the first token's rows are in flight)

        parity = Int32(0)
        while found:
            found_next, position_next, kv_slot_next, req_next, batch, mask, lane_pos, lane_kv_slot, lane_req = \
                self.next_active(walk, batch, mask, lane_pos, lane_kv_slot, lane_req)
            w, _, cos, sin, data, scales = self.finishing.inputs(mWeight, mCosSin, mCache, position, kv_slot, tile, lane)
            # the next token's block-table entries (this token's again when there is none: valid addresses)
            rows_next = self.pooling.lane_runs(mState, mBlockTable, Int32(cutlass.select_(found_next, req_next, req)),
                                               Int64(cutlass.select_(found_next, position_next, position)))
            cute.arch.cp_async_wait_group(1)  # this token's scores (its kv may still be in flight)
            sc = read_staged_rows(sScore, tidx, [cute.make_rmem_tensor((self.pooling.vec,), Float32)
                                                 for _ in range(self.pooling.rows_per_lane)])
            x = cute.make_rmem_tensor((self.finishing.lane_channels,), Float32)
            x.fill(0.0)
            self.pooling.reduce_rows(
                sc, partial(self.staged_kv, sKv, tidx), sMax, sNum, sDen, x,
                after_max=partial(self.stage_rows, mState, rows_next, score_byte, sScore, tidx, found_next),
                after_products=partial(self.stage_rows, mState, rows_next, kv_byte, sKv, tidx, found_next),
            )
            tile_sum = self.finishing.tile_sum(x)  # meaningful in warp 0
            tile_sums = cute.make_tensor(sTileSums.iterator + parity * self.tiles, cute.make_layout(self.tiles))
            if warp == 0:
                if lane < self.tiles:
                    store_to_peer_smem(tile_sum, tile_sums.iterator + tile, lane)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            if warp == 0:
                self.finishing.finish(x, w, w, tile_sums, None, cos, sin, lane, tile, data, scales, eps, fp8_inv)
            found, position, kv_slot, req = found_next, position_next, kv_slot_next, req_next
            parity = parity ^ Int32(1)

    @cute.jit
    def lane_token(self, walk: tuple, batch: Int32):
        """``(token, valid)``: lane ``j``'s token ``first + 32 batch + j`` of batch ``batch`` of the
        cluster's run ``first .. end - 1``, valid below ``end`` (token 0 otherwise: a valid index even
        for the last clusters, whose run may be empty)."""
        first, end, lane = walk[4], walk[5], walk[6]
        token = first + batch * BATCH + lane
        valid = token < end
        return Int32(cutlass.select_(valid, token, Int32(0))), valid

    @cute.jit
    def load_batch(self, walk: tuple, batch: Int32):
        """``(mask, position, kv_slot, req)`` of batch ``batch``: bit ``j`` of the ballot is set
        iff lane ``j``'s token exists and is active (SPEC §5); the lane keeps its token's metadata."""
        mPos, mSlot, mKvSlot, mTokenReq = walk[0], walk[1], walk[2], walk[3]
        token, valid = self.lane_token(walk, batch)
        position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, token, RATIO)
        req = mTokenReq[token]  # issued with the other three, before the ballot waits for them
        return cute.arch.vote_ballot_sync(valid & active), position, kv_slot, req

    @cute.jit
    def probe_batches(self, walk: tuple, batch: Int32):
        """Index ``k < PROBE`` of the first of batches ``batch + 1 .. batch + PROBE`` with an active
        token (``PROBE`` if none): their activity is read at once, one round trip for them all."""
        mPos, mSlot, mKvSlot = walk[0], walk[1], walk[2]
        masks = []
        for k in cutlass.range_constexpr(PROBE):
            token, valid = self.lane_token(walk, batch + 1 + k)
            _, _, active = token_activity(mPos, mSlot, mKvSlot, token, RATIO)
            masks.append(cute.arch.vote_ballot_sync(valid & active))
        first_active = Int32(PROBE)
        for k in cutlass.range_constexpr(PROBE - 1, -1, -1):  # the lowest non-empty batch wins
            first_active = Int32(cutlass.select_(masks[k] != Int32(0), Int32(k), first_active))
        return first_active

    @cute.jit
    def next_active(self, walk: tuple, batch: Int32, mask: Int32, lane_pos: Int64, lane_kv_slot: Int64,
                    lane_req: Int32):
        """The cluster's next active token after those already taken from ``mask``: ``(found,
        position, kv_slot, req)`` and the walk's new ``(batch, mask, lane metadata)``. Once a batch
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
        return found, position, kv_slot, req, batch, mask, lane_pos, lane_kv_slot, lane_req

    @cute.jit
    def stage_rows(self, mState: cute.Tensor, runs: list, byte_offset, sStage: cute.Tensor, tidx: Int32,
                   enabled) -> None:
        """``cp.async`` of this thread's 4 channels at ``byte_offset`` of each of its rows (the
        lookup runs of :meth:`.C128TilePooling.lane_runs`) into its own slots of ``sStage`` (if
        ``enabled``), then one commit group (empty if not)."""
        run = self.pooling.rows_per_lookup
        row_stride_bytes = Int64(mState.stride[1]) * 4
        if enabled:
            for i in cutlass.range_constexpr(self.pooling.rows_per_lane):
                address = runs[i // run] + row_stride_bytes * (i % run) + byte_offset
                copy_row_async(address, sStage[i, tidx, None])
        cute.arch.cp_async_commit_group()

    def staged_kv(self, sKv: cute.Tensor, tidx: Int32) -> list:
        """This thread's kv rows of the current token, once its kv group has landed (the next
        token's score group may still be in flight)."""
        cute.arch.cp_async_wait_group(1)
        return read_staged_rows(sKv, tidx, [cute.make_rmem_tensor((self.pooling.vec,), Float32)
                                            for _ in range(self.pooling.rows_per_lane)])


__all__ = ["C128PipelinedKernel"]
