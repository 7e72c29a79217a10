"""DeepSeek-V4.1's ``v41_index_key_store`` kernel (SPEC §14.6): the indexer key of each storing
token, from ``k_pre = wk(latent)``.

One warp per token, ``warps`` tokens per CTA; a token stores iff ``kv_slot_mapping >= 0`` (the
slot in the indexer's cache) and its position closes a group of ``r``. The warp norms
``k_pre`` into bf16, rotates channels 64..127 at ``cp = (p // r) * r`` with bf16 outputs
(:func:`..stages.v41_index_key.index_key_entry`) and writes §12's record of ``z`` with the
finishing warp's stores (:class:`..stages.indexer_entry.WarpFinish`). A warp's token is its
own: no barrier.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.indexer_entry import WarpFinish, indexer_entry_addresses
from ..stages.v41_index_key import index_key_entry, load_index_key_row
from ..v41_config import V41IndexKeyConfig


class V41IndexKeyKernel:
    """Grid ``ceil(T / warps)``, ``32 * warps`` threads."""

    def __init__(self, config: V41IndexKeyConfig):
        self.config = config
        self.finishing = WarpFinish(config)  # reads ratio, layout, B and the record sizes

    @cute.jit
    def __call__(
        self,
        mKPre: cute.Tensor,  # bf16 [T, 128], unit last stride, any row stride
        mPos: cute.Tensor,  # int64 [T]
        mKvSlot: cute.Tensor,  # int64 [T]: the slot in the indexer's cache, -1 = none
        mWeight: cute.Tensor,  # fp32 or bf16 [128]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # uint8 [num_pages, B, 132 (indexer_fp8) or 68 (indexer_mxfp4)], written
        eps: Float32,  # rms_norm_eps as binary32
        stream: cuda.CUstream,
    ):
        num_tokens = mPos.shape[0]
        warps = self.config.warps
        grid = (num_tokens + warps - 1) // warps
        self.kernel(mKPre, mPos, mKvSlot, mWeight, mCosSin, mCache, eps).launch(
            grid=(grid, 1, 1), block=(32 * warps, 1, 1), stream=stream, use_pdl=self.config.pdl)

    @cute.kernel
    def kernel(self, mKPre: cute.Tensor, mPos: cute.Tensor, mKvSlot: cute.Tensor, mWeight: cute.Tensor,
               mCosSin: cute.Tensor, mCache: cute.Tensor, eps: Float32):
        wait_for_prerequisite_grids(self.config.pdl)  # first: before any global access
        cta, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tok = cta * self.config.warps + warp
        if tok < mPos.shape[0]:
            position = mPos[tok]
            kv_slot = mKvSlot[tok]
            # One round of loads: row tok exists whether the token stores or not, so every token reads
            # it and computes its key; only the stores wait for the test (a branch before the key
            # would let ptxas sink the row's load into it, after kv_slot's and the position's).
            stores = (kv_slot >= Int64(0)) & ((position + 1) % self.config.ratio == Int64(0))
            x = load_index_key_row(mKPre, Int64(tok), lane)
            w, cos, sin = self.finishing.inputs(mWeight, mCosSin, lane, position, stores)
            z = index_key_entry(x, lane, w, cos, sin, eps)
            if stores:
                data, scales = indexer_entry_addresses(self.config, mCache, kv_slot)
                if cutlass.const_expr(self.config.layout == "indexer_fp8"):
                    self.finishing.store_fp8_record(data, scales, z, lane)
                else:
                    self.finishing.store_mxfp4_record(data, scales, z, lane)


__all__ = ["V41IndexKeyKernel"]
