"""C128 in one launch without clusters: the last CTA of a token finishes it.

Why not a cluster: an 8-CTA cluster must be placed whole inside one GPC, so on the H200
only 62 of them fit at once (Nsight Compute, "Max Active Clusters", 4 CTAs per SM) where
528 CTA slots would hold 66. At 64 tokens two clusters then run in a second wave alone,
and 128 tokens take three waves instead of two. Here
the 8 CTAs of a token are ordinary, independent CTAs: any free slot takes any of them.

Per CTA (tile ``g`` of token ``t``, 8 warps): pool the 64-channel tile exactly as the split
path's compress kernel (:class:`.pooling_c128.C128TilePooling`); warp 0 stores its ``x``
(2 channels per lane) into row ``t`` of the fp32 scratch (``workspace``), each of its
threads makes the stores visible GPU-wide (``fence.acq_rel.gpu``), and after a CTA barrier
thread 0 adds one to the token's counter (``atom.add.acq_rel.gpu``). The CTA that sees
``7`` is the token's last: every tile's ``x`` is in the scratch. It fences (acquire) and
finishes the token like the cluster kernel, warp ``w`` taking block ``w`` (NoPE blocks
0..6, RoPE 7) with its lanes' 2 channels, read back through L2 (``ld.global.cg``: another
CTA on this SM may have cached an older row in L1):

1. warp ``w``'s tile partial ``ss_w`` = SPEC's tree over the block (per-lane pair, xor
   butterfly 1..16), through shared memory to every warp;
2. ``ss = tree(ss_0..ss_7)`` (the tree over 512 channels is the tree over these 8), ``rr``;
3. the finishing stage of the cluster kernel, :class:`.postprocess.TileFinish`, with tile ``w``.

It then resets the counter to 0, so the counters are all zero between calls (and a CUDA
graph replays from zero). Activity is per token: inactive tokens touch nothing. The
scratch row holds exactly SPEC §5's ``x`` (what the split path stores), so the result does
not depend on which CTA comes last.

A CTA per token and tile suits a few tokens (up to 64 in ``auto``); past that, 8 CTAs per
inactive token, each waiting for a metadata load, dominate a serving step, and
:mod:`.fused_c128_pipelined` takes over. Timings: ``bench/RESULTS.md``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from .activity import token_activity
from .config import HANDOFF_CTAS_PER_SM, HandoffConfig
from .dependent_launch import wait_for_prerequisite_grids
from .memory import GMEM, element_address, load_pair_from_l2, store_fragment, store_scalar
from .pooling_c128 import RATIO, C128TilePooling
from .postprocess import TileFinish


SMEM_CARVEOUT_PERCENT = 100  # room for 4 x ~41 KiB (and no device query at compile time)


class C128HandoffKernel:
    """Grid ``8 * T`` (1-D; CTAs ``8t .. 8t+7`` are the 8 tiles of token ``t``), 256 threads, no
    cluster."""

    def __init__(self, config: HandoffConfig):
        self.config = config
        self.pool = config.pool
        self.pdl = config.pool.pdl
        self.pooling = C128TilePooling(config.pool)
        self.finishing = TileFinish(config.entry, RATIO, config.pool.tile)
        self.tiles = self.pooling.num_tiles  # CTAs per token (8)

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
        mX: cute.Tensor,  # fp32 [S >= T, 512] scratch, rows 16-byte aligned
        mCounters: cute.Tensor,  # int32 [C >= T], all zero on entry (and on exit)
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale), fp8_per_tensor only
        stream: cuda.CUstream,
    ):
        # .minnctapersm 4 caps registers at 64, so that 4 CTAs (32 warps) share an SM
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, mX, mCounters, eps,
                    fp8_inv).launch(grid=(self.tiles * mPos.shape[0], 1, 1), block=(self.pooling.threads, 1, 1),
                                    stream=stream, use_pdl=self.pdl, min_blocks_per_mp=HANDOFF_CTAS_PER_SM,
                                    preferred_smem_carveout=SMEM_CARVEOUT_PERCENT)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, mX: cute.Tensor, mCounters: cute.Tensor, eps: Float32, fp8_inv: Float32):
        wait_for_prerequisite_grids(self.pdl and not self.pool.early_metadata)  # first (else in pool_tile)
        cta, _, _ = cute.arch.block_idx()
        tile, tok = self.pooling.tile_and_token(cta)  # CTAs 8t .. 8t+7: the tiles of token t
        smem = SmemAllocator()
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(smem)
        sTileSums = smem.allocate_tensor(Float32, cute.make_layout(self.tiles), byte_alignment=16)
        sArrivals = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
        req = mTokenReq[tok]  # loaded with the activity metadata, not after it
        if active:
            self.pool_and_hand_off(mState, mBlockTable, mWeight, mCosSin, mCache, mX, mCounters, eps, fp8_inv, tok,
                                   position, req, kv_slot, tile, sMax, sNum, sDen, sKv, sTileSums, sArrivals)

    @cute.jit
    def pool_and_hand_off(
        self,
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 1024]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # the k_cache (see __call__)
        mX: cute.Tensor,  # fp32 [S >= T, 512] scratch
        mCounters: cute.Tensor,  # int32 [C >= T] arrival counters
        eps: Float32,
        fp8_inv: Float32,
        tok: Int32,  # an active token
        position: Int64,  # its position
        req: Int32,  # its block_table row
        kv_slot: Int64,  # its compressed-cache slot
        tile: Int32,  # this CTA's 64-channel tile
        sMax: cute.Tensor,  # fp32 smem [8, 64] per-warp partials
        sNum: cute.Tensor,  # fp32 smem [8, 64]
        sDen: cute.Tensor,  # fp32 smem [8, 64]
        sKv: cute.Tensor,  # fp32 smem [8, 256, 4] this thread's kv rows
        sTileSums: cute.Tensor,  # fp32 smem (8,)
        sArrivals: cute.Tensor,  # int32 smem (1,): the counter value thread 0 found
    ):
        """Pool tile ``tile`` of ``tok`` into the scratch and count it; the token's last tile
        finishes the entry and zeroes the counter."""
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        n = self.finishing.lane_channels  # 2
        x = cute.make_rmem_tensor((n,), Float32)
        x.fill(0.0)
        self.pooling.pool_tile(mState, mBlockTable, req, position, tile, sMax, sNum, sDen, sKv, x)
        if warp == 0:
            store_fragment(x, element_address(mX, tok, tile * self.pooling.tile + lane * n), 4 * n)
            cute.arch.fence_acq_rel_gpu()  # this thread's x stores before the arrival below
        cute.arch.sync_threads()
        counter = cute.make_ptr(Int32, element_address(mCounters, tok), GMEM, assumed_align=4)
        if tidx == 0:
            sArrivals[0] = cute.arch.atomic_add(counter, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.sync_threads()
        if sArrivals[0] == self.tiles - 1:  # the token's last tile: every x is in the scratch
            cute.arch.fence_acq_rel_gpu()
            self.finish_from_scratch(mX, mWeight, mCosSin, mCache, sTileSums, tok, position, kv_slot, warp, lane,
                                     eps, fp8_inv)
            if tidx == 0:
                store_scalar(Int32, counter.toint(), Int32(0))  # zero again for the next call

    @cute.jit
    def finish_from_scratch(
        self,
        mX: cute.Tensor,  # fp32 [S >= T, 512] scratch holding the token's x
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # the k_cache (see __call__)
        sTileSums: cute.Tensor,  # fp32 smem (8,): the blocks' sums of squares
        tok: Int32,
        position: Int64,
        kv_slot: Int64,
        warp: Int32,  # the block this warp finishes (0..6 NoPE, 7 RoPE)
        lane: Int32,
        eps: Float32,
        fp8_inv: Float32,
    ):
        """Every warp of the last CTA: block ``warp`` of the token's entry."""
        w, _, cos, sin, data, scales = self.finishing.inputs(mWeight, mCosSin, mCache, position, kv_slot, warp, lane)
        x = load_pair_from_l2(element_address(mX, tok, warp * self.pooling.tile + lane * self.finishing.lane_channels))
        block_sum = self.finishing.tile_sum(x)
        if lane == 0:
            sTileSums[warp] = block_sum
        cute.arch.sync_threads()
        self.finishing.finish(x, w, w, sTileSums, None, cos, sin, lane, warp, data, scales, eps, fp8_inv)


__all__ = ["C128HandoffKernel"]
