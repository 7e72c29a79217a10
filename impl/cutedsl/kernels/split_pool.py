"""The C128 split path's compress kernel: pools one channel tile of one token per CTA into ``x``.

It is the C128 kernel that takes SPEC §13's state formats (``pool.state``; then ``ape`` and
``ring_capacity`` follow the stream; with ``rows_from_inputs``, SPEC §13.4's step, ``ape`` always and
then ``kv``, ``score`` (fp32 ``[T, 512]``) and ``query_start_loc`` (int32 ``[num_reqs + 1]``)). Block8 and generic share the code
(:class:`..stages.pooling_c128.C128TilePooling`); they
differ only in how many rows one block-table lookup serves. The split path's store kernel
(:mod:`.split_store`) finishes the entries from ``x``.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..config import C128PoolConfig
from .entry import pooling_entry
from ..stages.activity import token_activity
from ..stages.memory import element_address, store_fragment
from ..stages.pooling_c128 import RATIO, C128TilePooling
from ..stages.step_rows import chunk_of
from ..stages.token_window import TokenWindow


class SplitPoolKernel:
    """C128 split path, compress kernel: grid ``(512 / tile) * T``; writes ``x`` of active tokens.

    ``x`` rows are exactly SPEC §5's bits, so the store kernel can finish them separately.
    """

    def __init__(self, pool: C128PoolConfig):
        self.pool = pool
        self.pooling = C128TilePooling(pool)

    __call__ = pooling_entry  # the host entry (:mod:`.entry`), launched by launch()

    def launch(self, arguments: tuple, num_tokens, stream):
        """``(512 / tile) * T`` CTAs of ``32 * warps`` threads (the entry's arguments in :meth:`kernel`'s
        order)."""
        self.kernel(*arguments).launch(grid=(self.pooling.num_tiles * num_tokens, 1, 1),
                                       block=(self.pooling.threads, 1, 1), stream=stream, use_pdl=self.pooling.pool.pdl)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mKvSlot: cute.Tensor, mOut: cute.Tensor, mApe: cute.Tensor,
               ring_capacity, mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor):
        self.pooling.wait_at_start()
        cta, _, _ = cute.arch.block_idx()
        tile, tok = self.pooling.tile_and_token(cta)
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(SmemAllocator())
        position, _, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
        req = mTokenReq[tok]  # loaded with the activity metadata, not after it
        if active:
            x = cute.make_rmem_tensor((self.pooling.final_channels,), Float32)
            chunk = chunk_of(mKv, mScore, mQsl, mPos, req, self.pool.state)
            window = TokenWindow(mState, mBlockTable, req, position, mApe, ring_capacity, chunk)
            self.pooling.pool_tile(window, tile, (sMax, sNum, sDen), sKv, x)
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp == 0:
                channel = tile * self.pooling.tile + cute.arch.lane_idx() * self.pooling.final_channels
                store_fragment(x, element_address(mOut, tok, channel), 4 * self.pooling.final_channels)
