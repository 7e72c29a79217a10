"""The C4 kernels: the fused one (pool, RMSNorm, RoPE, quantize, store) and the pooling-only one.

Both pool with :class:`..stages.pooling_c4.C4Window` (a token group of 128 threads, 4
channels a thread, the 8 window rows in registers); the fused kernel finishes with
:class:`..stages.postprocess.GroupFinish`. A CTA holds ``tokens_per_cta`` token groups, each
synchronizing on its own named barrier, so a group of an inactive token simply skips.

A configuration with a SPEC §13 state format (``config.state`` not the default) takes two more
launch arguments after the stream: ``ape`` (fp32 ``[4, 1024]``, or ``None`` with ``ape_at="save"``)
and ``ring_capacity`` (``C``; any value for a paged state). The default format's kernels take
neither, so they compile as before. With ``rows_from_inputs`` (SPEC §13.4) three more follow:
``kv`` and ``score`` (fp32 ``[T, 1024]``, 16-byte aligned rows) and ``query_start_loc`` (int32
``[num_reqs + 1]``), and ``ape`` is always given.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..config import C4Config
from .entry import pooling_entry
from ..stages.activity import group_token
from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.memory import element_address, store_fragment
from ..stages.pooling_c4 import RATIO, C4Window
from ..stages.postprocess import GroupFinish


class C4PoolKernel:
    """C4 pooling only: writes the fp32 compressed vector of active tokens to ``mOut``."""

    def __init__(self, config: C4Config):
        self.config = config
        self.pdl = config.pdl
        self.tokens_per_cta = config.tokens_per_cta
        self.threads = C4Window.group_threads * self.tokens_per_cta
        self.window = C4Window(config)

    __call__ = pooling_entry  # the host entry (:mod:`.entry`), launched by launch()

    def launch(self, arguments: tuple, num_tokens, stream):
        """``ceil(T / tokens_per_cta)`` CTAs of ``threads`` threads (the entry's arguments in
        :meth:`kernel`'s order)."""
        grid = (num_tokens + self.tokens_per_cta - 1) // self.tokens_per_cta
        self.kernel(*arguments).launch(grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mKvSlot: cute.Tensor, mOut: cute.Tensor, mApe: cute.Tensor,
               ring_capacity, mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor):
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        t, tok = group_token(C4Window.group_threads, self.tokens_per_cta)

        def store(x, position, kv_slot):
            store_fragment(x, element_address(mOut, tok, t * C4Window.vec), 16)

        self.window.pool_token((mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot),
                               (mApe, ring_capacity, mKv, mScore, mQsl), tok, t, store)


class C4FusedKernel:
    """C4 in one launch: pool, RMSNorm, RoPE, quantize and store each active token's entry."""

    def __init__(self, config: C4Config):
        if config.entry is None:
            raise ValueError("C4FusedKernel: expected a C4Config with an entry format, got entry=None")
        self.config = config
        self.pdl = config.pdl
        self.tokens_per_cta = config.tokens_per_cta
        self.threads = C4Window.group_threads * self.tokens_per_cta
        self.window = C4Window(config)
        self.finishing = GroupFinish(config.entry, RATIO, config.tokens_per_cta)

    @cute.jit
    def __call__(
        self,
        mState: cute.Tensor,  # fp32 (or bf16: config.state) [num_blocks, bs, 2048]
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
        stream: cuda.CUstream,
        mApe: cute.Tensor = None,  # SPEC §13.2: fp32 [4, 1024] (ape_at="compress"), else None
        ring_capacity=None,  # Int32 C (SPEC §13.3), a non-default state format only
        mKv: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, 1024], else None
        mScore: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, 1024], else None
        mQsl: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): int32 [num_reqs + 1], else None
    ):
        num_tokens = mPos.shape[0]
        grid = (num_tokens + self.tokens_per_cta - 1) // self.tokens_per_cta
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, fp8_inv, mApe,
                    ring_capacity, mKv, mScore, mQsl).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32, mApe: cute.Tensor, ring_capacity,
               mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor):
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        group, t, tok, sPartial = self.finishing.token_group(SmemAllocator())

        def finish(x, position, kv_slot):
            self.finishing.finish(x, t, sPartial[group, None], group + 1, mWeight, mCosSin, mCache, position, kv_slot,
                                  eps, fp8_inv)

        self.window.pool_token((mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot),
                               (mApe, ring_capacity, mKv, mScore, mQsl), tok, t, finish)
