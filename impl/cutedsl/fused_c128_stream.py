"""C128 in one launch on persistent clusters: each cluster streams its tokens through a
two-stage ``cp.async`` pipeline.

Why: in :mod:`.fused_c128_cluster` a CTA loads its whole 128-row tile, then computes, then
exits, and at 32-256 tokens all CTAs of a wave are in the same phase, so an SM's loads and
its exact (~25 rounded operations per ``exp2s``) arithmetic do not overlap. Here a grid of
``G`` clusters (about one wave) loops over the tokens, and while a CTA pools token ``k``
the rows of its next token are already in flight into the other shared-memory stage.

Work split: the tokens form chunks of ``chunk`` consecutive tokens (``chunk <= 32``);
cluster ``c`` takes chunks ``c, c + G, c + 2G, ...``. For a chunk, each warp reads the
activity metadata of its ``chunk`` tokens (one per lane) and ballots the active ones; the
CTAs then walk the set bits in order. Activity is per token, so every CTA of a cluster
walks the same tokens and exchanges the same number of times; inactive tokens cost nothing
but their metadata (a mixed step with few active tokens needs no CTA per token).

Pipeline (per thread; each thread copies and later reads back only its own rows, so the
stages need no CTA barrier): four ``cp.async`` groups are in flight at most: the current
token's scores and kv, the next token's scores and kv (empty groups when there is no next
token). ``wait_group(3)`` releases the current scores: pass 1 and the exps run while the
current kv (``wait_group(2)``) and the next token's rows land.

Per token, the pooling and the finishing stage are those of
:class:`.fused_c128_cluster.C128ClusterKernel` (tile 64: 8-CTA clusters, a CTA per
quantization block; tile 32: 16-CTA clusters, the block's other half over DSMEM). The
exchange differs: no cluster barrier per token (``barrier.cluster.arrive`` has release
semantics and waited for the next token's copies in flight; 1.3-1.5x slower). Warp 0 of
each CTA ``st.async``-es its tile's sum of squares (and, tile 32, its ``x``) into every
peer's slot, completing 4 transaction bytes each on the peer's mbarrier, and waits on its
own mbarrier for all of them. Slots and mbarriers alternate between two buffers by token
parity: a peer writes buffer ``b`` again only for the token after next, which it reaches
only after this CTA's contribution to the next token, sent after this CTA read ``b``.
Slower than the per-token grids on all-active decode sweeps, faster on steps with few active
tokens among many (timings: ``bench/RESULTS.md``).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from .dependent_launch import wait_for_prerequisite_grids
from .entry import active_token_mask, entry_addresses, load_cos_sin, lowest_set_bit, sum_of_squares
from .exact_math import butterfly_sum
from .fused_c128_cluster import C128ClusterKernel
from .pooling_c128 import RATIO, copy_row_async

STAGES = 2
MBARRIER_BYTES = 8


@dsl_user_op
def send_to_peer_smem(value, smem_ptr, mbarrier_ptr, peer_rank, *, loc=None, ip=None) -> None:
    """``st.async`` of one 32-bit ``value`` to ``smem_ptr`` in CTA ``peer_rank``'s shared
    memory, completing 4 transaction bytes on that CTA's mbarrier at ``mbarrier_ptr``.

    No fence: unlike ``barrier.cluster.arrive`` (release), it does not wait for this
    thread's outstanding ``cp.async`` copies of the next token.
    """
    llvm.inline_asm(
        None,
        [smem_ptr.toint(loc=loc, ip=ip).ir_value(), mbarrier_ptr.toint(loc=loc, ip=ip).ir_value(),
         Int32(peer_rank).ir_value(loc=loc, ip=ip), Float32(value).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 remote_addr, remote_bar;\n\t"
        "mapa.shared::cluster.u32 remote_addr, $0, $2;\n\t"
        "mapa.shared::cluster.u32 remote_bar, $1, $2;\n\t"
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [remote_addr], $3, [remote_bar];\n\t}",
        "r,r,r,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


class C128StreamKernel(C128ClusterKernel):
    """Grid ``C * G`` (1-D), cluster ``(C, 1, 1)``; cluster ``c`` streams chunks ``c + iG``;
    built from a :class:`.config.StreamConfig`."""

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
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale), fp8_per_tensor only
        num_clusters: Int32,  # G >= 1: clusters in the grid
        chunk: Int32,  # tokens per chunk, 1..32
        stream: cuda.CUstream,
    ):
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, fp8_inv,
                    num_clusters, chunk).launch(
            grid=(self.cluster * num_clusters, 1, 1), block=(self.threads, 1, 1), cluster=(self.cluster, 1, 1),
            stream=stream, use_pdl=self.pdl,
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32, num_clusters: Int32, chunk: Int32):
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        cta, _, _ = cute.arch.block_idx()
        tile = cta % self.cluster  # rank in the cluster
        cluster_id = cta // self.cluster
        tidx, _, _ = cute.arch.thread_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        num_tokens = Int32(mPos.shape[0])
        R, n = self.rows_per_lane, self.lane_channels

        smem = SmemAllocator()
        partials = cute.make_layout((self.warps, self.tile), stride=(self.tile, 1))
        sMax, sNum, sDen = [smem.allocate_tensor(Float32, partials, byte_alignment=16) for _ in range(3)]
        rows_layout = cute.make_layout((STAGES, R, self.threads, self.vec),
                                       stride=(R * self.threads * self.vec, self.threads * self.vec, self.vec, 1))
        sScore = smem.allocate_tensor(Float32, rows_layout, byte_alignment=16)
        sKv = smem.allocate_tensor(Float32, rows_layout, byte_alignment=16)
        sTileSums = smem.allocate_tensor(Float32, cute.make_layout((2, self.cluster), stride=(self.cluster, 1)),
                                         byte_alignment=16)
        sPartnerX = smem.allocate_tensor(Float32, cute.make_layout((2, 32), stride=(32, 1)), byte_alignment=16)
        sArrived = smem.allocate_array(Int64, 2)  # mbarriers of the two exchange buffers
        exchange_bytes = 4 * self.cluster + (4 * 32 if self.sends_partner_x else 0)  # received per token

        w, w_partner, pair = self.finish_inputs(mWeight, tile, lane)  # token-independent

        if tidx == 0:
            cute.arch.mbarrier_init(sArrived, 1)
            cute.arch.mbarrier_init(sArrived + 1, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive()  # every CTA runs, with its mbarriers set up, before any remote store
        cute.arch.cluster_wait()
        processed = Int32(0)  # tokens done by this CTA: exchange buffer processed % 2, phase (processed / 2) % 2

        parity = Int32(0)
        chunk_start = cluster_id * chunk
        while chunk_start < num_tokens:
            mask = active_token_mask(mPos, mSlot, mKvSlot, chunk_start, chunk, num_tokens, lane, RATIO)
            if mask != Int32(0):
                stage = Int32(0)
                token = chunk_start + lowest_set_bit(mask)
                self.issue_rows(mState, mTokenReq, mPos, mBlockTable, token, tile, stage, sScore, sKv, tidx)
                while mask != Int32(0):
                    rest = mask & (mask - Int32(1))  # the tokens after this one
                    if rest != Int32(0):
                        self.issue_rows(mState, mTokenReq, mPos, mBlockTable, chunk_start + lowest_set_bit(rest),
                                        tile, stage ^ Int32(1), sScore, sKv, tidx)
                    else:  # keep four groups in flight, so the waits below count the same
                        cute.arch.cp_async_commit_group()
                        cute.arch.cp_async_commit_group()
                    position = mPos[token]
                    cos, sin = load_cos_sin(mCosSin, (position // RATIO) * RATIO, pair, 1)
                    data, scales = entry_addresses(self.entry, mCache, mKvSlot[token])
                    x = cute.make_rmem_tensor((n,), Float32)
                    x.fill(0.0)
                    self.pool_staged(stage, sScore, sKv, sMax, sNum, sDen, x, tidx)
                    tile_sum = butterfly_sum(sum_of_squares(x, n), 1, 16)  # meaningful in warp 0
                    if warp == 0:
                        # each CTA's tile sum (and, tile 32, x to the block's other half) to its peers
                        if tidx == 0:
                            cute.arch.mbarrier_arrive_and_expect_tx(sArrived + parity, exchange_bytes)
                        if lane < self.cluster:
                            send_to_peer_smem(tile_sum, sTileSums.iterator + parity * self.cluster + tile,
                                              sArrived + parity, lane)
                        if cutlass.const_expr(self.sends_partner_x):
                            send_to_peer_smem(x[0], sPartnerX.iterator + parity * 32 + lane, sArrived + parity,
                                              tile ^ 1)
                        cute.arch.mbarrier_wait(sArrived + parity, (processed // 2) % 2)
                        self.finish_token(x, w, w_partner, sTileSums[parity, None], sPartnerX[parity, None], cos, sin,
                                          lane, tile, data, scales, eps, fp8_inv)
                    processed = processed + Int32(1)
                    parity = parity ^ Int32(1)
                    stage = stage ^ Int32(1)
                    mask = rest
                    if rest != Int32(0):
                        token = chunk_start + lowest_set_bit(rest)
            chunk_start = chunk_start + num_clusters * chunk
        cute.arch.cluster_arrive_relaxed()  # no CTA leaves while a peer may still write to it
        cute.arch.cluster_wait()

    @cute.jit
    def issue_rows(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mBlockTable: cute.Tensor,
                   token: Int32, tile: Int32, stage: Int32, sScore: cute.Tensor, sKv: cute.Tensor, tidx: Int32):
        """``cp.async`` this thread's rows of ``token`` into ``stage``: one group of scores,
        then one of kv."""
        rows, kv_byte, score_byte = self.row_addresses(mState, mBlockTable, mTokenReq[token], mPos[token], tile)
        for i in cutlass.range_constexpr(self.rows_per_lane):
            copy_row_async(rows[i] + score_byte, sScore[stage, i, tidx, None])
        cute.arch.cp_async_commit_group()
        for i in cutlass.range_constexpr(self.rows_per_lane):
            copy_row_async(rows[i] + kv_byte, sKv[stage, i, tidx, None])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def pool_staged(self, stage: Int32, sScore: cute.Tensor, sKv: cute.Tensor, sMax: cute.Tensor, sNum: cute.Tensor,
                    sDen: cute.Tensor, x: cute.Tensor, tidx: Int32):
        """SPEC §5 for the token in ``stage``; its groups are the oldest two in flight."""
        cute.arch.cp_async_wait_group(3)  # this token's scores
        sc = [cute.make_rmem_tensor((self.vec,), Float32) for _ in range(self.rows_per_lane)]
        for i in cutlass.range_constexpr(self.rows_per_lane):
            cute.autovec_copy(sScore[stage, i, tidx, None], sc[i])
        kv = [cute.make_rmem_tensor((self.vec,), Float32) for _ in range(self.rows_per_lane)]

        def kv_rows():
            cute.arch.cp_async_wait_group(2)  # this token's kv
            for i in cutlass.range_constexpr(self.rows_per_lane):
                cute.autovec_copy(sKv[stage, i, tidx, None], kv[i])
            return kv

        self.reduce_rows(sc, kv_rows, sMax, sNum, sDen, x)
