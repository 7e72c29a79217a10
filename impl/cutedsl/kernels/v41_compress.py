"""DeepSeek-V4.1's compress kernel (SPEC §14.3-§14.5): ``v41_compress_norm`` and
``v41_compress_norm_rope_store`` in one launch.

A group of 128 threads per token (4 channels a thread), ``tokens_per_cta`` groups per CTA, each
with its own named barrier (its id ``group + 1``) and its own shared memory, so the group of an
inactive token simply skips. For an active token (SPEC §14.3): the pooled vector (ratio 1:
``kv``; ratio 2: the rows at ``p - 1`` and ``p`` from the chunk or the state,
:class:`..stages.v41_latent.Ratio2Window`), the norm and the bf16 latent (written when the
launch has a latent), then, when it has a cache, RoPE at ``cp = (p // r) * r`` and the record
(:class:`..stages.v41_records.RecordStore`). Ratio 2 then saves the step's rows, after the
compress (:class:`..stages.v41_save.Ratio2Save`). Inactive tokens write nothing (a ratio-2
token may still save its row).

The launch's arguments are TVM-FFI's flat list (:meth:`V41CompressKernel.__call__`); an argument
the configuration does not read (ratio 1's state, a missing latent or cache) is ``None``.
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

from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.memory import load_scalar
from ..stages.postprocess import load_cos_sin, load_weight, rope_row
from ..stages.v41_latent import GROUP_THREADS, Ratio2Window, latent_of, pooled_ratio1, store_latent
from ..stages.v41_records import ROPE_FIRST_THREAD, RecordStore, rotate_latent
from ..stages.v41_rows import VEC, save_row
from ..stages.v41_save import Ratio2Save
from ..v41_config import V41CompressConfig

PARTIALS = 4  # per token group: one fp32 sum of squares (and one int32 scan result) per warp


class V41CompressKernel:
    """Grid ``ceil(T / tokens_per_cta)``, ``128 * tokens_per_cta`` threads."""

    def __init__(self, config: V41CompressConfig):
        self.config = config
        self.tokens_per_cta = config.tokens_per_cta
        self.threads = GROUP_THREADS * config.tokens_per_cta
        self.records = RecordStore(config.record) if config.record is not None else None
        if config.ratio == 2:
            self.window = Ratio2Window(config.block_size, config.ring)
            self.saves = Ratio2Save(config.block_size, config.ring)

    @cute.jit
    def __call__(
        self,
        mKv: cute.Tensor,  # fp32 or bf16 [T, 512]
        mScore: cute.Tensor,  # ratio 2: fp32 or bf16 [T, 512] (raw); ratio 1: None
        mPos: cute.Tensor,  # int64 [T]
        mKvSlot: cute.Tensor,  # int64 [T]: compressed-cache slot, -1 = none
        mTokenReq: cute.Tensor,  # ratio 2: int32 [T]; ratio 1: None
        mSlot: cute.Tensor,  # ratio 2: int64 [T] state slot, -1 = padding; ratio 1: None
        mSave: cute.Tensor,  # ratio 2: int64 [T] save_slot_mapping; ratio 1: None
        mQsl: cute.Tensor,  # ratio 2: int32 [num_reqs + 1] query_start_loc; ratio 1: None
        mState: cute.Tensor,  # ratio 2: fp32 or bf16 [num_state_blocks, bs, 1024], written; ratio 1: None
        mBlockTable: cute.Tensor,  # ratio 2: int32 [num_reqs, max_blocks]; ratio 1: None
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mLatent: cute.Tensor,  # bf16 [T, 512] written, or None
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64], or None (no record)
        mCache: cute.Tensor,  # the record's k_cache, written, or None
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale) (fp8_per_tensor; any value otherwise)
        ring_capacity: Int32,  # C (a ring; any value otherwise)
        stream: cuda.CUstream,
    ):
        num_tokens = mPos.shape[0]
        grid = (num_tokens + self.tokens_per_cta - 1) // self.tokens_per_cta
        self.kernel(mKv, mScore, mPos, mKvSlot, mTokenReq, mSlot, mSave, mQsl, mState, mBlockTable, mWeight, mLatent,
                    mCosSin, mCache, eps, fp8_inv, ring_capacity).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.config.pdl)

    @cute.jit
    def finish(
        self,
        x: cute.Tensor,  # fp32 (4,): thread t's channels of the pooled vector
        token: Int64,
        position: Int64,
        kv_slot: Int64,  # >= 0
        t: Int32,
        sPartial: cute.Tensor,  # fp32 smem (4,): the group's per-warp sums of squares
        barrier_id: Int32,
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mLatent: cute.Tensor,  # bf16 [T, 512], or None
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64], or None
        mCache: cute.Tensor,  # k_cache, or None
        eps: Float32,
        fp8_inv: Float32,
    ):
        """An active token's stages after the pooling: the latent, written when given, then RoPE
        and the record when the launch has a cache. Every thread of the group calls it."""
        w = load_weight(mWeight, t * VEC, VEC)
        latent = latent_of(x, w, t, sPartial, barrier_id, eps)
        if cutlass.const_expr(self.config.latent):
            store_latent(mLatent, token, t, latent)
        if cutlass.const_expr(self.records is not None):
            first_pair = Int32(cutlass.select_(t >= ROPE_FIRST_THREAD, (t - ROPE_FIRST_THREAD) * (VEC // 2), 0))
            cos, sin = load_cos_sin(mCosSin, rope_row(position, self.config.ratio), first_pair, VEC // 2)
            self.records.store(rotate_latent(latent, t, cos, sin), t, mCache, kv_slot, fp8_inv)

    @cute.kernel
    def kernel(self, mKv: cute.Tensor, mScore: cute.Tensor, mPos: cute.Tensor, mKvSlot: cute.Tensor,
               mTokenReq: cute.Tensor, mSlot: cute.Tensor, mSave: cute.Tensor, mQsl: cute.Tensor, mState: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mLatent: cute.Tensor, mCosSin: cute.Tensor,
               mCache: cute.Tensor, eps: Float32, fp8_inv: Float32, ring_capacity: Int32):
        wait_for_prerequisite_grids(self.config.pdl)  # first: before any global access
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        group = tidx // GROUP_THREADS
        t = tidx % GROUP_THREADS
        tok = cta * self.tokens_per_cta + group
        smem = SmemAllocator()
        layout = cute.make_layout((self.tokens_per_cta, PARTIALS), stride=(PARTIALS, 1))
        sPartial = smem.allocate_tensor(Float32, layout, byte_alignment=16)
        sFound = smem.allocate_tensor(Int32, layout, byte_alignment=16)
        barrier_id = group + 1
        if tok < mPos.shape[0]:
            token = Int64(tok)
            if cutlass.const_expr(self.config.ratio == 1):
                kv_slot = mKvSlot[tok]
                if kv_slot >= Int64(0):  # every position is a boundary
                    x = pooled_ratio1(mKv, token, t)
                    self.finish(x, token, mPos[tok], kv_slot, t, sPartial[group, None], barrier_id, mWeight, mLatent,
                                mCosSin, mCache, eps, fp8_inv)
            else:
                position = mPos[tok]
                kv_slot = mKvSlot[tok]
                save_slot = mSave[tok]
                active = (kv_slot >= Int64(0)) & (mSlot[tok] >= Int64(0)) & ((position + 1) % 2 == Int64(0))
                if active | (save_slot >= Int64(0)):  # token_to_req is read only for tokens that pool or save
                    request = Int64(mTokenReq[tok])
                    first = Int64(load_scalar(mQsl, request))
                    chunk_start = load_scalar(mPos, first)
                    if active:
                        x = self.window.pooled(mKv, mScore, mState, mBlockTable, token, position, request, first,
                                               chunk_start, ring_capacity, t)
                        self.finish(x, token, position, kv_slot, t, sPartial[group, None], barrier_id, mWeight,
                                    mLatent, mCosSin, mCache, eps, fp8_inv)
                    if save_slot >= Int64(0):
                        if self.saves.defers_to_first(mKvSlot, mSlot, mBlockTable, token, save_slot, request, first,
                                                      chunk_start, ring_capacity) == Int32(0):
                            save_row(mKv, mScore, mState, token, save_slot, self.config.block_size, t)
                    if active & (token == first):
                        self.saves.save_deferred(mKv, mScore, mSave, mQsl, mState, mBlockTable, request, first,
                                                 chunk_start, ring_capacity, t, sFound[group, None], barrier_id)


__all__ = ["V41CompressKernel"]
