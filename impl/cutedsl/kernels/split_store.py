"""C128 split path, store kernel: the compressed vector ``x`` -> RMSNorm, RoPE, quantization, store.

One 128-thread group per token (``tokens_per_cta`` groups per CTA, each with its own named
barrier); thread ``t`` loads ``x[4t..4t+3]`` with one 128-bit load and runs the finishing
stage of that mapping (:class:`..stages.postprocess.GroupFinish`, SPEC §6-§7). ``B`` (entries per page) is a
compile-time constant, so ``slot // B`` and ``slot % B`` are shifts or multiply-highs.
Tokens that are not active (SPEC §5) write nothing; their scratch rows are never read.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..stages.activity import ballot_run, run_end, take_lowest, token_activity
from ..config import SplitStoreConfig
from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.memory import element_address, load_fragment
from ..stages.postprocess import GroupFinish

RATIO = 128


class SplitStoreKernel:
    """Grid ``ceil(T / tokens_per_cta)``, ``128 * tokens_per_cta`` threads; with ``token_run`` above 1,
    ``ceil(T / token_run)`` CTAs of one group, each finishing the active tokens of its run of
    ``token_run`` consecutive tokens (one ballot finds them) one after the other."""

    def __init__(self, config: SplitStoreConfig):
        self.config = config
        self.pdl = config.pdl
        self.tokens_per_cta = config.tokens_per_cta
        self.token_run = config.token_run
        self.finishing = GroupFinish(config.entry, RATIO, config.tokens_per_cta)
        self.threads = GroupFinish.group_threads * self.tokens_per_cta

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # fp32 [S >= T, 512]: x of active tokens (compress kernel output)
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]
        mKvSlot: cute.Tensor,  # int64 [T]
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # flashmla_fp8: uint8 [P, B, 584]; bf16: bf16 [P, B, 512]; fp8: e4m3 [P, B, 512]
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale), fp8_per_tensor only
        stream: cuda.CUstream,
    ):
        num_tokens = mPos.shape[0]
        per_cta = self.tokens_per_cta * self.token_run
        grid = (num_tokens + per_cta - 1) // per_cta
        self.kernel(mX, mPos, mSlot, mKvSlot, mWeight, mCosSin, mCache, eps, fp8_inv).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor, mKvSlot: cute.Tensor,
               mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor, eps: Float32, fp8_inv: Float32):
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        group, t, tok, sPartial = self.finishing.token_group(SmemAllocator())
        outputs = (mWeight, mCosSin, mCache)
        if cutlass.const_expr(self.token_run == 1):
            if tok < mPos.shape[0]:
                position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
                if active:
                    self.finish_token(mX, tok, position, kv_slot, t, sPartial, group, outputs, eps, fp8_inv)
        else:
            first = tok * self.token_run  # one group per CTA: tok is the CTA index
            end = run_end(first, self.token_run, mPos.shape[0])
            mask, lane_pos, lane_kv_slot, lane_req = ballot_run(mKvSlot, first, end, (mPos, mSlot, RATIO))
            while mask != Int32(0):
                active_tok, position, kv_slot, _, mask = take_lowest(mask, first, lane_pos, lane_kv_slot, lane_req)
                self.finish_token(mX, active_tok, position, kv_slot, t, sPartial, group, outputs, eps, fp8_inv)
                # every warp has read this token's partial sums before any writes the next token's
                cute.arch.barrier(barrier_id=group + 1, number_of_threads=GroupFinish.group_threads)

    @cute.jit
    def finish_token(
        self,
        mX: cute.Tensor,  # fp32 [S >= T, 512]: x of active tokens
        tok,  # an active token
        position: Int64,
        kv_slot: Int64,  # >= 0
        t: Int32,  # thread index in the token group
        sPartial: cute.Tensor,  # fp32 smem [tokens_per_cta, 4]: each group's per-warp sums of squares
        group: Int32,  # this thread's token group (its named barrier is group + 1)
        outputs: tuple,  # (mWeight fp32 or bf16 [512], mCosSin fp32 [max_pos, 64], mCache: the layout's k_cache)
        eps: Float32,
        fp8_inv: Float32,
    ):
        """SPEC §6-§7 for token ``tok`` from its ``x`` row: every thread of the group calls it."""
        mWeight, mCosSin, mCache = outputs
        x = load_fragment(Float32, element_address(mX, tok, t * GroupFinish.vec), GroupFinish.vec, 16)
        self.finishing.finish(x, t, sPartial[group, None], group + 1, mWeight, mCosSin, mCache, position, kv_slot, eps,
                              fp8_inv)
