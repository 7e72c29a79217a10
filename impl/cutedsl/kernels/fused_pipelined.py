"""C128 in one launch on a persistent grid: clusters that walk the tokens with rows in flight.

Why: a grid of one cluster (or 8 CTAs) per token spends a CTA launch and a metadata round trip
on every inactive token, and in a serving step almost every C128 token is inactive (one in 128
closes a window). A grid of one token per CTA *chunk* skips them for a ballot bit, but a CTA
that pools its tokens one after the other leaves HBM idle while it computes. Here a fixed
number ``G`` of 8-CTA clusters (as many as the device holds at once, never more than ``T``;
the host asks the driver, :mod:`..host.occupancy`) each walk a contiguous run of ``ceil(T / G)``
tokens and overlap the next active token's reads with the current token's arithmetic.

Per CTA (rank ``g`` = 64-channel tile ``g``, 8 warps, the pooling map of
:class:`.pooling_c128.C128TilePooling`):

1. the walk (:mod:`..stages.pipelined_walk`): every CTA of the cluster reads the run's metadata a batch
   of 32 tokens at a time and ballots the active ones, so all agree on the order without shared
   memory; each thread stages its own rows of a token in shared memory with ``cp.async``.
2. per active token ``A`` with next active token ``B``: read ``B``'s block-table entries; wait
   for ``A``'s scores (``cp.async.wait_group 1``), pool ``A`` (SPEC §5, exactly as every C128
   kernel); once ``A``'s window max is known (its scores are consumed) ``B``'s scores are
   issued into the score stage, and once ``A``'s products ``u = kv * e`` are formed ``B``'s kv
   rows into the kv stage. So ``B``'s 64 KiB per CTA stream while ``A`` is reduced, normalized
   and stored.
3. finishing, as the cluster kernel: each CTA's tile sum of squares goes to every CTA of the
   cluster through DSMEM, one cluster barrier per token, then :class:`..stages.postprocess.TileFinish`.
   The tile sums are double-buffered by token parity: a CTA writes buffer ``k % 2`` for token
   ``k`` only after the barrier of token ``k - 1``, which every CTA passes after reading
   buffer ``k % 2`` for token ``k - 2``.

SPEC §13's fp32 formats (``config.pool.state``) change only where a row's 16 bytes are staged
from and what a score needs once read back (:mod:`..stages.staged_rows`): a ring's rows at
``q mod C``, ``ape`` added at read-back with ``ape_at="compress"``, and, in the step call
``compress_and_save`` (``rows_from_inputs``), the rows at or after each request's chunk start
staged from this call's ``kv``/``score``. Their launch arguments follow the stream (``None`` for
SPEC §3's state, which traces to the kernel without them).

A cluster arrive at kernel start, waited on once the first token's rows are in flight,
ensures every CTA runs before any remote store; after a
cluster's last barrier nobody touches another CTA's shared memory, so CTAs exit freely.
Correctness does not depend on the clusters being resident together (a late cluster just
walks its share late). Timings: ``bench/RESULTS.md``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..stages.cluster_smem import TileSumExchange
from ..config import FusedPipelinedConfig
from ..stages.pipelined_walk import RunWalk
from ..stages.pooling_c128 import RATIO, C128TilePooling
from ..stages.postprocess import TileFinish

SMEM_CARVEOUT_PERCENT = 100  # room for 3 x ~70 KiB


class FusedPipelinedKernel:
    """Grid ``8 * G`` (1-D; CTAs ``8c .. 8c+7`` are cluster ``c``, its ranks the tiles), cluster
    ``(8, 1, 1)``, 256 threads."""

    def __init__(self, config: FusedPipelinedConfig):
        self.config = config
        self.pooling = C128TilePooling(config.pool)
        self.walk = RunWalk(self.pooling)
        self.finishing = TileFinish(config.entry, RATIO, config.pool.tile)
        self.tiles = self.pooling.num_tiles  # CTAs per cluster (8)
        self.exchange = TileSumExchange(self.tiles, self.finishing.sends_partner_x)
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
        mApe: cute.Tensor = None,  # SPEC §13.2: fp32 [128, 512] (ape_at="compress" or rows_from_inputs), else None
        ring_capacity=None,  # Int32 C (SPEC §13.3), a non-default state format only
        mKv: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, 512], else None
        mScore: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, 512], else None
        mQsl: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): int32 [num_reqs + 1], else None
    ):
        """``8 * G`` CTAs in clusters of 8, 256 threads each, on ``stream``, whatever ``T``."""
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, fp8_inv,
                    clusters, mApe, ring_capacity, mKv, mScore, mQsl).launch(
            grid=(self.tiles * clusters, 1, 1), block=(self.pooling.threads, 1, 1), cluster=(self.tiles, 1, 1),
            stream=stream, use_pdl=self.pooling.pool.pdl, min_blocks_per_mp=self.config.ctas_per_sm,
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32, clusters: Int32, mApe: cute.Tensor,
               ring_capacity, mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor):
        self.pooling.wait_at_start()
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

        sources = (mState, mBlockTable, ring_capacity, (mKv, mScore, mQsl))  # where the rows are
        thread = (tidx, self.pooling.channel_bytes(tile, lane))
        walk, found, position, kv_slot, req, index, batch, mask, lane_pos, lane_kv_slot, lane_req = self.walk.begin(
            (mPos, mSlot, mKvSlot, mTokenReq), clusters, cluster)
        chunk_from = self.walk.stage_first(sources, (sScore, sKv), tidx, thread[1], (found, req, position, index),
                                           self.pooling.pool.pdl and self.pooling.pool.early_metadata)
        cute.arch.cluster_wait()  # every CTA of the cluster runs (the first token's rows are in flight)

        parity = Int32(0)
        while found:
            found_next, position_next, kv_slot_next, req_next, index_next, batch, mask, lane_pos, lane_kv_slot, \
                lane_req = self.walk.next_active(walk, batch, mask, lane_pos, lane_kv_slot, lane_req)
            w, _, cos, sin, data, scales = self.finishing.inputs(mWeight, mCosSin, mCache, position, kv_slot, tile, lane)
            x, chunk_from_next = self.walk.pool_staged(sources, mApe, (sScore, sKv, sMax, sNum, sDen), thread,
                                                       (req, position, index, chunk_from),
                                                       (found_next, req_next, position_next, index_next))
            tile_sum = self.finishing.tile_sum(x)  # meaningful in warp 0
            tile_sums = cute.make_tensor(sTileSums.iterator + parity * self.tiles, cute.make_layout(self.tiles))
            self.exchange.exchange(tile_sum, x, tile_sums, None, tile, lane, warp)
            if warp == 0:
                self.finishing.finish(x, w, w, tile_sums, None, cos, sin, lane, tile, data, scales, eps, fp8_inv)
            found, position, kv_slot, req, index = found_next, position_next, kv_slot_next, req_next, index_next
            chunk_from = chunk_from_next
            parity = parity ^ Int32(1)


__all__ = ["FusedPipelinedKernel"]
