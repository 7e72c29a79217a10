"""DeepSeek-V4.1's ``v41_rope_quant_store`` kernel (SPEC §14.4-§14.5): the record of each storing
token's latent row.

A group of 128 threads per token (4 channels a thread), ``tokens_per_cta`` groups per CTA. A
token stores iff ``kv_slot_mapping >= 0`` and its position closes a group of ``r`` (SPEC §14.7:
the state slot plays no part here); it reads its latent row (bf16, exact), rotates channels
448..511 at ``cp = (p // r) * r`` with bf16 outputs (:func:`..stages.v41_records.rotate_latent`)
and writes the record of ``z`` (:class:`..stages.v41_records.RecordStore`). Nothing synchronizes
across warps: a record's blocks lie inside one warp.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.postprocess import load_cos_sin, rope_row
from ..stages.v41_latent import GROUP_THREADS, load_latent
from ..stages.v41_records import ROPE_FIRST_THREAD, RecordStore, rotate_latent
from ..stages.v41_rows import VEC
from ..v41_config import V41StoreConfig


class V41StoreKernel:
    """Grid ``ceil(T / tokens_per_cta)``, ``128 * tokens_per_cta`` threads."""

    def __init__(self, config: V41StoreConfig):
        self.config = config
        self.tokens_per_cta = config.tokens_per_cta
        self.threads = GROUP_THREADS * config.tokens_per_cta
        self.records = RecordStore(config.record)

    @cute.jit
    def __call__(
        self,
        mLatent: cute.Tensor,  # bf16 [T, 512], rows 16-byte aligned
        mPos: cute.Tensor,  # int64 [T]
        mKvSlot: cute.Tensor,  # int64 [T]: compressed-cache slot, -1 = none
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # the record's k_cache, written
        fp8_inv: Float32,  # div(1, fp8_scale) (fp8_per_tensor; any value otherwise)
        stream: cuda.CUstream,
    ):
        num_tokens = mPos.shape[0]
        grid = (num_tokens + self.tokens_per_cta - 1) // self.tokens_per_cta
        self.kernel(mLatent, mPos, mKvSlot, mCosSin, mCache, fp8_inv).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.config.pdl)

    @cute.kernel
    def kernel(self, mLatent: cute.Tensor, mPos: cute.Tensor, mKvSlot: cute.Tensor, mCosSin: cute.Tensor,
               mCache: cute.Tensor, fp8_inv: Float32):
        wait_for_prerequisite_grids(self.config.pdl)  # first: before any global access
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        t = tidx % GROUP_THREADS
        tok = cta * self.tokens_per_cta + tidx // GROUP_THREADS
        if tok < mPos.shape[0]:
            position = mPos[tok]
            kv_slot = mKvSlot[tok]
            if (kv_slot >= Int64(0)) & ((position + 1) % self.config.ratio == Int64(0)):
                latent = load_latent(mLatent, Int64(tok), t)
                first_pair = Int32(cutlass.select_(t >= ROPE_FIRST_THREAD, (t - ROPE_FIRST_THREAD) * (VEC // 2), 0))
                cos, sin = load_cos_sin(mCosSin, rope_row(position, self.config.ratio), first_pair, VEC // 2)
                self.records.store(rotate_latent(latent, t, cos, sin), t, mCache, kv_slot, fp8_inv)


__all__ = ["V41StoreKernel"]
