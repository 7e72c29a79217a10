"""C128 in one launch without clusters: the last CTA of a token finishes it.

Why not a cluster: an 8-CTA cluster must be placed whole inside one GPC, so on the H200
only 62 of them fit at once (Nsight Compute, "Max Active Clusters", 4 CTAs per SM) where
528 CTA slots would hold 66. At 64 tokens two clusters then run in a second wave alone,
and 128 tokens take three waves instead of two. Here
the 8 CTAs of a token are ordinary, independent CTAs: any free slot takes any of them.

Per CTA (tile ``g`` of token ``t``, 8 warps): pool the 64-channel tile exactly as the split
path's compress kernel (:class:`.pooling_c128.C128TilePooling`), then hand it off through the
fp32 scratch (``workspace``) and a per-token arrival counter (:mod:`..stages.handoff_stage`): the
token's last CTA finishes the entry and zeroes the counter. Activity is per token: inactive
tokens touch nothing.

A CTA per token and tile suits a few tokens (up to 64 in ``auto``); past that, 8 CTAs per
inactive token, each waiting for a metadata load, dominate a serving step, and
:mod:`.fused_pipelined` takes over. Timings: ``bench/RESULTS.md``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..stages.activity import token_activity
from ..config import FUSED_HANDOFF_CTAS_PER_SM, FusedHandoffConfig
from .entry import fused_entry
from ..stages.handoff_stage import ScratchHandoff
from ..stages.pooling_c128 import RATIO, C128TilePooling
from ..stages.postprocess import TileFinish
from ..stages.token_window import TokenWindow


SMEM_CARVEOUT_PERCENT = 100  # room for 4 x ~41 KiB (and no device query at compile time)


class FusedHandoffKernel:
    """Grid ``8 * T`` (1-D; CTAs ``8t .. 8t+7`` are the 8 tiles of token ``t``), 256 threads, no
    cluster."""

    def __init__(self, config: FusedHandoffConfig):
        self.config = config
        self.pooling = C128TilePooling(config.pool)
        self.finishing = TileFinish(config.entry, RATIO, config.pool.tile)
        self.tiles = self.pooling.num_tiles  # CTAs per token (8)
        self.handoff = ScratchHandoff(self.finishing, self.tiles, self.pooling.tile)

    __call__ = fused_entry  # the host entry (:mod:`.entry`): the nine tensors, then launch()'s arguments

    def launch(self, tables: tuple, num_tokens, mX: cute.Tensor, mCounters: cute.Tensor, eps: Float32,
               fp8_inv: Float32, stream: cuda.CUstream):
        """``8 * T`` CTAs of 256 threads on ``stream``. ``mX``: the fp32 ``[S >= T, 512]`` scratch, rows
        16-byte aligned; ``mCounters``: int32 ``[C >= T]``, all zero on entry (and on exit); ``eps``:
        rms_norm_eps as binary32; ``fp8_inv``: ``div(1, fp8_scale)`` (fp8_per_tensor only)."""
        # .minnctapersm 4 caps registers at 64, so that 4 CTAs (32 warps) share an SM
        self.kernel(*tables, mX, mCounters, eps, fp8_inv).launch(
            grid=(self.tiles * num_tokens, 1, 1), block=(self.pooling.threads, 1, 1), stream=stream,
            use_pdl=self.pooling.pool.pdl, min_blocks_per_mp=FUSED_HANDOFF_CTAS_PER_SM,
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, mX: cute.Tensor, mCounters: cute.Tensor, eps: Float32, fp8_inv: Float32):
        self.pooling.wait_at_start()
        cta, _, _ = cute.arch.block_idx()
        tile, tok = self.pooling.tile_and_token(cta)  # CTAs 8t .. 8t+7: the tiles of token t
        smem = SmemAllocator()
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(smem)
        sSums, sArrivals = self.handoff.allocate_smem(smem)
        position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
        req = mTokenReq[tok]  # loaded with the activity metadata, not after it
        if active:
            self.pool_and_hand_off(mState, mBlockTable, (mX, mCounters, mWeight, mCosSin, mCache), eps, fp8_inv, tok,
                                   position, req, kv_slot, tile, (sMax, sNum, sDen, sKv, sSums, sArrivals))

    @cute.jit
    def pool_and_hand_off(
        self,
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 1024]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        tables: tuple,  # (mX, mCounters, mWeight, mCosSin, mCache): see launch
        eps: Float32,
        fp8_inv: Float32,
        tok: Int32,  # an active token
        position: Int64,  # its position
        req: Int32,  # its block_table row
        kv_slot: Int64,  # its compressed-cache slot
        tile: Int32,  # this CTA's 64-channel tile
        smem: tuple,  # (sMax, sNum, sDen, sKv, sSums, sArrivals): the pooling's and the hand-off's
    ):
        """Pool tile ``tile`` of ``tok``, then hand it off (:mod:`..stages.handoff_stage`): the token's
        last tile finishes the entry and zeroes the counter."""
        sMax, sNum, sDen, sKv, sSums, sArrivals = smem
        x = cute.make_rmem_tensor((self.finishing.lane_channels,), Float32)
        x.fill(0.0)
        self.pooling.pool_tile(TokenWindow(mState, mBlockTable, req, position), tile, (sMax, sNum, sDen), sKv, x)
        self.handoff.hand_off(tables, x, tok, position, kv_slot, tile, sSums, sArrivals, eps, fp8_inv)


__all__ = ["FusedHandoffKernel"]
