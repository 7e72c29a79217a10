"""The C128 split path's compress kernel: pools one channel tile of one token per CTA into ``x``.

It is the C128 kernel that takes SPEC §13's state formats (``pool.state``; then ``ape`` and
``ring_capacity`` follow the stream; with ``rows_from_inputs``, SPEC §13.4's step, ``ape`` always and
then ``kv``, ``score`` (fp32 ``[T, 512]``) and ``query_start_loc`` (int32 ``[num_reqs + 1]``)). Block8 and generic share the code
(:class:`..stages.pooling_c128.C128TilePooling`); they
differ only in how many rows one block-table lookup serves. The split path's store kernel
(:mod:`.split_store`) finishes the entries from ``x``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..config import C128PoolConfig
from .entry import pooling_entry
from ..stages.activity import ballot_run, run_end, take_lowest, token_activity
from ..stages.memory import element_address, store_fragment
from ..stages.pooling_c128 import RATIO, C128TilePooling
from ..stages.step_rows import chunk_of
from ..stages.token_window import TokenWindow


class SplitPoolKernel:
    """C128 split path, compress kernel: grid ``(512 / tile) * ceil(T / token_run)``; writes ``x`` of
    active tokens.

    ``x`` rows are exactly SPEC §5's bits, so the store kernel can finish them separately. With
    ``token_run`` above 1 a CTA takes its tile of ``token_run`` consecutive tokens: one ballot finds
    the run's active tokens (:func:`..stages.activity.ballot_run`) and the CTA pools them in order, so
    the many tokens of a step that close no window cost a lane's read, not a CTA each.
    """

    def __init__(self, pool: C128PoolConfig):
        self.pool = pool
        self.pooling = C128TilePooling(pool)
        self.token_run = pool.token_run

    __call__ = pooling_entry  # the host entry (:mod:`.entry`), launched by launch()

    def launch(self, arguments: tuple, num_tokens, stream):
        """``(512 / tile) * ceil(T / token_run)`` CTAs of ``32 * warps`` threads (the entry's arguments
        in :meth:`kernel`'s order)."""
        runs = (num_tokens + self.token_run - 1) // self.token_run
        self.kernel(*arguments).launch(grid=(self.pooling.num_tiles * runs, 1, 1),
                                       block=(self.pooling.threads, 1, 1), stream=stream, use_pdl=self.pooling.pool.pdl)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mKvSlot: cute.Tensor, mOut: cute.Tensor, mApe: cute.Tensor,
               ring_capacity, mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor):
        self.pooling.wait_at_start()
        cta, _, _ = cute.arch.block_idx()
        tile, run = self.pooling.tile_and_token(cta)
        scratch = self.pooling.allocate_smem(SmemAllocator())
        rows = (mState, mBlockTable, mApe, ring_capacity, (mKv, mScore, mQsl, mPos))
        if cutlass.const_expr(self.token_run == 1):
            position, _, active = token_activity(mPos, mSlot, mKvSlot, run, RATIO)
            req = mTokenReq[run]  # loaded with the activity metadata, not after it
            if active:
                self.pool_token(rows, run, req, position, tile, scratch, mOut)
        else:
            first = run * self.token_run
            end = run_end(first, self.token_run, mPos.shape[0])
            mask, lane_pos, lane_kv_slot, lane_req = ballot_run(mKvSlot, first, end, (mPos, mSlot, RATIO), mTokenReq)
            while mask != Int32(0):
                tok, position, _, req, mask = take_lowest(mask, first, lane_pos, lane_kv_slot, lane_req)
                self.pool_token(rows, tok, req, position, tile, scratch, mOut)

    @cute.jit
    def pool_token(
        self,
        rows: tuple,  # (mState, mBlockTable, mApe, ring_capacity, (mKv, mScore, mQsl, mPos)): the window's sources
        tok,  # Int32: an active token
        req: Int32,  # its block-table row
        position: Int64,  # its position
        tile: Int32,  # this CTA's channel tile
        scratch: tuple,  # C128TilePooling.allocate_smem's (sMax, sNum, sDen, sKv)
        mOut: cute.Tensor,  # fp32 [S >= T, 512]: x, written at row tok
    ):
        """SPEC §5 for one channel tile of token ``tok``: ``x`` into its scratch row (warp 0 holds it)."""
        mState, mBlockTable, mApe, ring_capacity, (mKv, mScore, mQsl, mPos) = rows
        sMax, sNum, sDen, sKv = scratch
        x = cute.make_rmem_tensor((self.pooling.final_channels,), Float32)
        chunk = chunk_of(mKv, mScore, mQsl, req, tok, position, self.pool.state)
        window = TokenWindow(mState, mBlockTable, req, position, mApe, ring_capacity, chunk)
        self.pooling.pool_tile(window, tile, (sMax, sNum, sDen), sKv, x)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            channel = tile * self.pooling.tile + cute.arch.lane_idx() * self.pooling.final_channels
            store_fragment(x, element_address(mOut, tok, channel), 4 * self.pooling.final_channels)
