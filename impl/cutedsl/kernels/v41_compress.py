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
from ..stages.v41_rows import VEC, input_row, listed_slot, store_row
from ..stages.v41_save import Ratio2Save
from ..v41_config import V41CompressConfig

PARTIALS = 4  # per token group: one fp32 sum of squares (and one int32 scan result) per warp
SMEM_CARVEOUT_PERCENT = 0  # with ctas_per_sm: a few bytes of shared memory a CTA, the rest L1 (no device query)


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
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.config.pdl,
            **({} if self.config.ctas_per_sm is None else {"min_blocks_per_mp": self.config.ctas_per_sm,
                                                            "preferred_smem_carveout": SMEM_CARVEOUT_PERCENT}))

    def rope_inputs(
        self,
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64], or None (no record)
        position: Int64,
        t: Int32,
        wanted,  # Boolean: the token is active (its row cp exists)
    ):
        """``(cos, sin)`` (fp32 ``(2,)`` each) of thread ``t``'s RoPE pairs at row ``cp`` (threads
        below 112 read pair 0 and ignore it), read where ``wanted`` with the pooling's inputs,
        not after the latent's store; ``None`` without a record."""
        if cutlass.const_expr(self.records is None):
            return None, None
        first_pair = Int32(cutlass.select_(t >= ROPE_FIRST_THREAD, (t - ROPE_FIRST_THREAD) * (VEC // 2), 0))
        return load_cos_sin(mCosSin, rope_row(position, self.config.ratio), first_pair, VEC // 2, wanted)

    @cute.jit
    def store_outputs(
        self,
        latent: cute.Tensor,  # fp32 (4,): thread t's channels of the latent (bf16 values, latent_of)
        cos: cute.Tensor,  # fp32 (2,): thread t's RoPE cosines (:meth:`rope_inputs`)
        sin: cute.Tensor,  # fp32 (2,): and sines
        token: Int64,
        kv_slot: Int64,  # >= 0
        t: Int32,
        mLatent: cute.Tensor,  # bf16 [T, 512], or None
        mCache: cute.Tensor,  # k_cache, or None
        fp8_inv: Float32,
    ):
        """An active token's stages after its latent: the latent's store when the launch has one,
        then RoPE and the record when it has a cache. No loads: every input came with the pooling's.
        Every thread of the group calls it (the record's block maxima are shuffles)."""
        if cutlass.const_expr(self.config.latent):
            store_latent(mLatent, token, t, latent)
        if cutlass.const_expr(self.records is not None):
            self.records.store(rotate_latent(latent, t, cos, sin), t, mCache, kv_slot, fp8_inv)

    @cute.jit
    def ratio2(
        self,
        rows: tuple,  # (mKv, mScore): fp32 or bf16 [T, 512] each (the raw scores), and mState: fp32 or bf16
        #               [num_state_blocks, bs, 1024], written
        metadata: tuple,  # (mKvSlot int64 [T], mSlot int64 [T], mSave int64 [T], mQsl int32 [num_reqs + 1],
        #                   mBlockTable int32 [num_reqs, max_blocks])
        outputs: tuple,  # (mWeight fp32 or bf16 [512], mLatent bf16 [T, 512] or None, mCosSin fp32
        #                  [max_pos, 64] or None, mCache k_cache or None, eps, fp8_inv)
        facts: tuple,  # the token's (token, position, kv_slot, save_slot, request, active): request a valid row
        group: tuple,  # (t, sPartial fp32 smem (4,), sFound int32 smem (4,), barrier_id): the token's group
        ring_capacity: Int32,
    ):
        """A ratio-2 token that pools or saves, in two rounds of loads after the per-token round:
        what the token and the request name (the chunk's row ``p - 1`` and the token's own, the
        chunk's bounds, row ``p - 1``'s state lookup, the norm and RoPE inputs), then the state's row
        ``p - 1`` (a chunk's first token) with the saves' loads; then the compress and the ordered
        saves (:mod:`..stages.v41_save`). A round's guarded loads are predicated
        (:func:`..stages.memory.load_if`), so no branch splits a round."""
        mKv, mScore, mState = rows
        mKvSlot, mSlot, mSave, mQsl, mBlockTable = metadata
        mWeight, mLatent, mCosSin, mCache, eps, fp8_inv = outputs
        token, position, kv_slot, save_slot, request, active = facts
        t, sPartial, sFound, barrier_id = group
        chunk_kv, chunk_score = self.window.load_chunk_row_before(mKv, mScore, token, active, t)
        block, offset, listed = self.window.row_before(mBlockTable, request, position, active, ring_capacity)
        first = Int64(load_scalar(mQsl, request))
        end = Int64(load_scalar(mQsl, request + 1))
        kv, score = input_row(mKv, mScore, token, t)
        w = load_weight(mWeight, t * VEC, VEC)
        cos, sin = self.rope_inputs(mCosSin, position, t, active)
        chunk_start = position - (token - first)  # P0: a chunk's positions are consecutive (SPEC §13.4)

        state_kv, state_score = self.window.load_state_row_before(mState, (block, offset, listed),
                                                                  active & (token <= first), t)
        defer_inputs = self.saves.load_defer_inputs(mKvSlot, mSlot, mBlockTable, token, request, first, chunk_start,
                                                    ring_capacity, save_slot >= Int64(0))
        read_slot = listed_slot(block, offset, listed, self.config.block_size)  # row p - 1's (= P0 - 1's for first)
        deferred = active & (token == first) & (first + 1 < end)  # a later token of the chunk may defer to it
        found = Int32(-1)
        if deferred:
            found = self.saves.scan_deferred(mSave, first, end, read_slot, t)

        if active:
            x = self.window.pooled((chunk_kv, chunk_score, state_kv, state_score), kv, score, token > first,
                                   mState.element_type)
            latent = latent_of(x, w, t, sPartial, barrier_id, eps)
            self.store_outputs(latent, cos, sin, token, kv_slot, t, mLatent, mCache, fp8_inv)
        if save_slot >= Int64(0):
            if self.saves.defers_to_first(defer_inputs, save_slot, chunk_start) == Int32(0):
                store_row(mState, kv, score, save_slot, self.config.block_size, t)
        if deferred:
            self.saves.save_deferred(mKv, mScore, mState, found, read_slot, t, sFound, barrier_id)

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
            # the per-token round: every index is tok < T
            position = mPos[tok]
            kv_slot = mKvSlot[tok]
            if cutlass.const_expr(self.config.ratio == 1):
                # One round of loads: row tok exists whether the token stores or not, so every token
                # reads it and computes its latent; only the stores wait for kv_slot (every position
                # is a boundary). A branch before the latent would let ptxas sink the row's load into
                # it, after kv_slot's.
                stores = kv_slot >= Int64(0)
                x = pooled_ratio1(mKv, token, t)
                w = load_weight(mWeight, t * VEC, VEC)
                cos, sin = self.rope_inputs(mCosSin, position, t, stores)
                latent = latent_of(x, w, t, sPartial[group, None], barrier_id, eps)
                if stores:
                    self.store_outputs(latent, cos, sin, token, kv_slot, t, mLatent, mCache, fp8_inv)
            else:
                save_slot = mSave[tok]
                slot = mSlot[tok]
                request = Int64(mTokenReq[tok])
                active = (kv_slot >= Int64(0)) & (slot >= Int64(0)) & ((position + 1) % 2 == Int64(0))
                # a token of a chunk (padding has every slot -1), whose token_to_req is a request row;
                # testing that row here keeps its load in this round (ptxas sinks a load to its first use)
                if (active | (save_slot >= Int64(0))) & (request >= Int64(0)) & (request < Int64(mQsl.shape[0] - 1)):
                    self.ratio2((mKv, mScore, mState), (mKvSlot, mSlot, mSave, mQsl, mBlockTable),
                                (mWeight, mLatent, mCosSin, mCache, eps, fp8_inv),
                                (token, position, kv_slot, save_slot, request, active),
                                (t, sPartial[group, None], sFound[group, None], barrier_id), ring_capacity)


__all__ = ["V41CompressKernel"]
