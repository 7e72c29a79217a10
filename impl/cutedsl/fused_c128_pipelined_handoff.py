"""C128 in one launch on a persistent grid of independent CTAs: the pipelined walk, handed off.

Why not clusters: an 8-CTA cluster lives in one GPC, and at 3 CTAs per SM the H200's GPCs hold
45 of them, 360 CTAs where the SMs have 396 slots: about a tenth of the SMs sit idle through a
dense step (Nsight Compute: SM active cycles 91% of the pipelined cluster kernel's elapsed
cycles, 99.7% of the split path's). Here a team of 8 CTAs is 8 ordinary CTAs, so the grid
fills every slot: ``G`` teams of 8, ``G = ctas_per_sm * SMs // 8`` (never more than ``T``).

Per CTA (tile ``g = cta % 8`` of team ``cta // 8``, 8 warps): the walk, staging and pooling of
the pipelined cluster kernel (:mod:`.pipelined_walk`: the team's contiguous run of tokens, the
active ones by ballot, the next active token's rows in flight by ``cp.async`` while the current
one is pooled); then, instead of a cluster barrier, the hand-off of :mod:`.handoff_stage`: the
tile's ``x`` goes to the token's scratch row, a per-token counter finds the token's last tile,
and that CTA finishes the entry with all its warps (its next token's rows keep streaming
meanwhile) and zeroes the counter. No CTA ever waits for another, so the tiles of a team need
not be resident together. Timings: ``bench/RESULTS.md``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from .config import PipelinedConfig
from .dependent_launch import wait_for_prerequisite_grids
from .handoff_stage import ScratchHandoff
from .pipelined_walk import RunWalk
from .pooling_c128 import RATIO, C128TilePooling
from .postprocess import TileFinish

SMEM_CARVEOUT_PERCENT = 100  # room for 3 x ~70 KiB


class C128PipelinedHandoffKernel:
    """Grid ``8 * G`` (1-D; CTAs ``8k .. 8k+7`` are team ``k``, the tiles), no cluster, 256 threads."""

    def __init__(self, config: PipelinedConfig):
        self.config = config
        self.pool = config.pool
        self.pdl = config.pool.pdl
        self.pooling = C128TilePooling(config.pool)
        self.walk = RunWalk(self.pooling)
        self.finishing = TileFinish(config.entry, RATIO, config.pool.tile)
        self.tiles = self.pooling.num_tiles  # CTAs per team (8)
        self.handoff = ScratchHandoff(self.finishing, self.tiles, self.pooling.tile)

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
        teams: Int32,  # G, 1 <= G <= T
        stream: cuda.CUstream,
    ):
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, mX, mCounters, eps,
                    fp8_inv, teams).launch(grid=(self.tiles * teams, 1, 1), block=(self.pooling.threads, 1, 1),
                                           stream=stream, use_pdl=self.pdl, min_blocks_per_mp=self.config.ctas_per_sm,
                                           preferred_smem_carveout=SMEM_CARVEOUT_PERCENT)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, mX: cute.Tensor, mCounters: cute.Tensor, eps: Float32, fp8_inv: Float32,
               teams: Int32):
        wait_for_prerequisite_grids(self.pdl and not self.pool.early_metadata)  # first (else before the rows)
        cta, _, _ = cute.arch.block_idx()
        tile, team = self.pooling.tile_and_token(cta)  # the tile, and the team
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        smem = SmemAllocator()
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(smem)
        sScore = smem.allocate_tensor(Float32, sKv.layout, byte_alignment=16)  # [rows_per_lane, threads, 4]
        sSums, sArrivals = self.handoff.allocate_smem(smem)
        tables = (mX, mCounters, mWeight, mCosSin, mCache)

        lane_bytes = self.pooling.channel_bytes(tile, lane)
        walk, found, token, position, kv_slot, req, batch, mask, lane_pos, lane_kv_slot, lane_req = self.walk.begin(
            (mPos, mSlot, mKvSlot, mTokenReq), teams, team, lane)
        self.walk.stage_first(mState, mBlockTable, (sScore, sKv), tidx, lane_bytes, (found, req, position),
                              self.pdl and self.pool.early_metadata)
        while found:
            found_next, token_next, position_next, kv_slot_next, req_next, batch, mask, lane_pos, lane_kv_slot, \
                lane_req = self.walk.next_active(walk, batch, mask, lane_pos, lane_kv_slot, lane_req)
            x = self.walk.pool_staged(mState, mBlockTable, (sScore, sKv, sMax, sNum, sDen), tidx, lane_bytes,
                                      (req, position), (found_next, req_next, position_next))
            self.handoff.hand_off(tables, x, token, position, kv_slot, tile, sSums, sArrivals, eps, fp8_inv)
            found, token, position, kv_slot, req = found_next, token_next, position_next, kv_slot_next, req_next


__all__ = ["C128PipelinedHandoffKernel"]
