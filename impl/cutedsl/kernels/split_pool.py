"""The C128 split path's compress kernel: pools one channel tile of one token per CTA into ``x``.

It is the C128 kernel that takes SPEC §13's state formats (``pool.state``; then ``ape`` and
``ring_capacity`` follow the stream; with ``rows_from_inputs``, SPEC §13.4's step, ``ape`` always and
then ``kv``, ``score`` (fp32 ``[T, 512]``) and ``query_start_loc`` (int32 ``[num_reqs + 1]``)). Block8 and generic share the code
(:class:`..stages.pooling_c128.C128TilePooling`); they
differ only in how many rows one block-table lookup serves. The split path's store kernel
(:mod:`.split_store`) finishes the entries from ``x``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..config import C128PoolConfig
from ..stages.activity import token_activity
from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.memory import element_address, store_fragment
from ..stages.pooling_c128 import RATIO, C128TilePooling
from ..stages.step_rows import chunk_of


class SplitPoolKernel:
    """C128 split path, compress kernel: grid ``(512 / tile) * T``; writes ``x`` of active tokens.

    ``x`` rows are exactly SPEC §5's bits, so the store kernel can finish them separately.
    """

    def __init__(self, pool: C128PoolConfig):
        self.pool = pool
        self.pdl = pool.pdl
        self.pooling = C128TilePooling(pool)

    @cute.jit
    def __call__(
        self,
        mState: cute.Tensor,  # fp32 or bf16 (pool.state) [num_blocks, bs, 1024]
        mTokenReq: cute.Tensor,  # int32 [T]
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        mKvSlot: cute.Tensor,  # int64 [T]
        mOut: cute.Tensor,  # fp32 [S >= T, 512] scratch, rows 16-byte aligned
        stream: cuda.CUstream,
        mApe: cute.Tensor = None,  # SPEC §13.2: fp32 [128, 512] (ape_at="compress"), else None
        ring_capacity=None,  # Int32 C (SPEC §13.3), a non-default state format only
        mKv: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, 512], else None
        mScore: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, 512], else None
        mQsl: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): int32 [num_reqs + 1], else None
    ):
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot, mOut, mApe, ring_capacity, mKv, mScore,
                    mQsl).launch(
            grid=(self.pooling.num_tiles * mPos.shape[0], 1, 1), block=(self.pooling.threads, 1, 1), stream=stream,
            use_pdl=self.pdl
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mKvSlot: cute.Tensor, mOut: cute.Tensor, mApe: cute.Tensor,
               ring_capacity, mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor):
        wait_for_prerequisite_grids(self.pdl and not self.pool.early_metadata)  # first (else in pool_tile)
        cta, _, _ = cute.arch.block_idx()
        tile, tok = self.pooling.tile_and_token(cta)
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(SmemAllocator())
        position, _, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
        req = mTokenReq[tok]  # loaded with the activity metadata, not after it
        if active:
            x = cute.make_rmem_tensor((self.pooling.final_channels,), Float32)
            chunk = chunk_of(mKv, mScore, mQsl, mPos, req, self.pool.state)
            self.pooling.pool_tile(mState, mBlockTable, req, position, tile, sMax, sNum, sDen, sKv, x, mApe,
                                   ring_capacity, chunk)
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp == 0:
                channel = tile * self.pooling.tile + cute.arch.lane_idx() * self.pooling.final_channels
                store_fragment(x, element_address(mOut, tok, channel), 4 * self.pooling.final_channels)
