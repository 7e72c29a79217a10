"""The hand-off of a C128 token between independent CTAs: the last tile finishes the entry.

The stage of :mod:`..kernels.fused_handoff`, whose 8 tiles of a token are 8 independent CTAs
rather than a cluster. Each CTA, once warp 0 holds its tile's ``x`` (2 channels per lane):

1. warp 0 stores ``x`` into row ``t`` of the fp32 scratch and each of its threads makes its
   stores visible GPU-wide (``fence.acq_rel.gpu``); a CTA barrier;
2. thread 0 adds one to the token's counter (``atom.add.acq_rel.gpu``) and shares the old
   value through shared memory; a CTA barrier;
3. the CTA that finds ``7`` is the token's last, with every tile's ``x`` in the scratch. It
   fences (acquire) and finishes the token, warp ``w`` taking block ``w`` (NoPE blocks 0..6,
   RoPE 7) with its lanes' 2 channels, read back through L2 (``ld.global.cg``: another CTA on
   this SM may have cached an older row in L1): the blocks' sums of squares through shared
   memory (SPEC's tree over 512 channels is the tree over the 8 block trees), then
   :class:`.postprocess.TileFinish`. It zeroes the counter again, so the counters are all zero
   between calls (a CUDA graph replays from zero).

The scratch row holds exactly SPEC §5's ``x``, so the entry does not depend on which CTA comes
last. Nobody waits for anybody: the tiles of a token need not run at the same time.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .memory import GMEM, element_address, load_pair_from_l2, store_fragment, store_scalar
from .postprocess import TileFinish


class ScratchHandoff:
    """The hand-off stage of 8 independent 64-channel tiles of 8 warps each."""

    def __init__(self, finishing: TileFinish, tiles: int, tile: int):
        self.finishing = finishing
        self.tiles = tiles  # CTAs per token (8)
        self.tile = tile  # channels per CTA (64)

    def allocate_smem(self, smem):
        """The blocks' sums of squares, fp32 ``(8,)``, and the counter value thread 0 found, int32 ``(1,)``."""
        sums = smem.allocate_tensor(Float32, cute.make_layout(self.tiles), byte_alignment=16)
        arrivals = smem.allocate_tensor(Int32, cute.make_layout(1), byte_alignment=4)
        return sums, arrivals

    @cute.jit
    def hand_off(
        self,
        tables: tuple,  # (mX, mCounters, mWeight, mCosSin, mCache): scratch, counters, the layer's tensors
        x: cute.Tensor,  # fp32 (2,): this tile's x, valid in warp 0
        tok: Int32,  # the token
        position: Int64,  # its position
        kv_slot: Int64,  # its compressed-cache slot
        tile: Int32,  # this CTA's 64-channel tile
        sSums: cute.Tensor,  # fp32 smem (8,)
        sArrivals: cute.Tensor,  # int32 smem (1,)
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale), fp8_per_tensor only
    ):
        """Steps 1-3 of the module docstring, by every thread of the CTA."""
        mX, mCounters, _, _, _ = tables
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        n = self.finishing.lane_channels  # 2
        if warp == 0:
            store_fragment(x, element_address(mX, tok, tile * self.tile + lane * n), 4 * n)
            cute.arch.fence_acq_rel_gpu()  # this thread's x stores before the arrival below
        cute.arch.sync_threads()
        counter = cute.make_ptr(Int32, element_address(mCounters, tok), GMEM, assumed_align=4)
        if tidx == 0:
            sArrivals[0] = cute.arch.atomic_add(counter, Int32(1), sem="acq_rel", scope="gpu")
        cute.arch.sync_threads()
        if sArrivals[0] == self.tiles - 1:  # the token's last tile: every x is in the scratch
            cute.arch.fence_acq_rel_gpu()
            self.finish_from_scratch(tables, sSums, tok, position, kv_slot, warp, lane, eps, fp8_inv)
            if tidx == 0:
                store_scalar(Int32, counter.toint(), Int32(0))  # zero again for the next call

    @cute.jit
    def finish_from_scratch(
        self,
        tables: tuple,  # (mX, mCounters, mWeight, mCosSin, mCache)
        sSums: cute.Tensor,  # fp32 smem (8,): the blocks' sums of squares
        tok: Int32,
        position: Int64,
        kv_slot: Int64,
        warp: Int32,  # the block this warp finishes (0..6 NoPE, 7 RoPE)
        lane: Int32,
        eps: Float32,
        fp8_inv: Float32,
    ):
        """Every warp of the last CTA: block ``warp`` of the token's entry."""
        mX, _, mWeight, mCosSin, mCache = tables
        w, _, cos, sin, data, scales = self.finishing.inputs(mWeight, mCosSin, mCache, position, kv_slot, warp, lane)
        x = load_pair_from_l2(element_address(mX, tok, warp * self.tile + lane * self.finishing.lane_channels))
        block_sum = self.finishing.tile_sum(x)
        if lane == 0:
            sSums[warp] = block_sum
        cute.arch.sync_threads()
        self.finishing.finish(x, w, w, sSums, None, cos, sin, lane, warp, data, scales, eps, fp8_inv)


__all__ = ["ScratchHandoff"]
