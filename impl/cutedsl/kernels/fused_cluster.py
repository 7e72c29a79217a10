"""C128 in one launch: a thread-block cluster per token, one CTA per channel tile.

Why a cluster: the split path pays a second launch and an fp32 round trip of ``x`` through
global memory only because RMSNorm needs the sum of squares over all 512 channels while
the pooling is spread over several CTAs. Here the CTAs of a token form a cluster and
combine that one number through distributed shared memory (DSMEM), so pooling, norm,
RoPE, quantization and the store finish in one kernel.

Two cluster shapes (``pool.tile``): 8 CTAs of 64 channels, or 16 CTAs of 32 channels (a
non-portable cluster size). Per CTA (rank ``g`` = tile ``g``, ``warps`` warps): pool the
tile exactly as the split path's compress kernel (:class:`.pooling_c128.C128TilePooling`;
Block8 or generic lookups); warp 0 ends up with ``x`` for ``tile/32`` consecutive channels
per lane. Then (steps 3 and 4 are the finishing stage, :class:`..stages.postprocess.TileFinish`):

1. tile partial ``ss_g`` = SPEC's tree over the tile's channels (per-lane tree, xor
   butterfly 1..16: lanes hold consecutive aligned chunks);
2. lanes ``0..C-1`` of warp 0 write ``ss_g`` into slot ``g`` of CTA ``l``'s shared array
   (``mapa`` + ``st.shared::cluster``); with 16 CTAs a NoPE CTA also writes its 32 ``x``
   values to the other half of its quantization block (rank ``g ^ 1``). The cluster
   barrier (arrive = release, wait = acquire) publishes everything
   (:class:`..stages.cluster_smem.TileSumExchange`, shared with the pipelined kernel);
3. every CTA computes ``ss = tree(ss_0..ss_{C-1})``: SPEC's tree over 512 channels is the
   tree over the tile trees, so all CTAs get the identical, exact ``ss``;
4. ``rr``, ``y = mul(mul(x, rr), w)`` for the tile. 8 CTAs: tiles 0..6 are exactly
   quantization blocks 0..6 (own amax over 32 lanes x 2, own scale byte); tile 7 is the
   RoPE part (lane ``l`` rotates pair ``l``). 16 CTAs: tiles ``2b, 2b+1`` both compute
   block ``b``'s amax over their own and the received half (max is exact in any order) and
   store their 32 codes, the even one the scale byte; tiles 14, 15 are RoPE, a pair in two
   adjacent lanes (one shuffle). The first RoPE tile writes the pad byte.

A first, relaxed cluster arrive at kernel start and its wait right before the remote
stores guarantee every CTA of the cluster is running before its shared memory is
written; no CTA touches remote memory after the second barrier, so CTAs exit freely.
Activity (SPEC §5) is per token, hence uniform over the cluster: inactive clusters skip
everything, barriers included.

Performance notes (timings: ``bench/RESULTS.md``): the norm weights, the cos/sin pair and
the entry addresses are fetched before the pooling, so the tail after the cluster barrier
touches no global memory but the stores; with the kv rows staged in shared memory
(``kv_in_smem``, the default here) 8-CTA clusters need 64 registers, so 4 CTAs fit an SM
(kv in registers streams much worse). 16 CTAs per token halve each SM's share of the exact
arithmetic (~25 separately rounded operations per ``exp2s``): faster for a few tokens, but
they stream worse, so dispatch switches to 8 CTAs above 4 tokens. Requesting the kv rows
only after the window max (``kv_after_max``, the default) lets a wave's scores arrive first.
A cluster must fit inside one GPC: only 62 eight-CTA clusters run at once on the H200
(Nsight Compute), so from 32 tokens on the cluster-free :mod:`.fused_handoff` is faster
and dispatch uses clusters only up to 16 tokens.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..stages.activity import token_activity
from ..stages.cluster_smem import TileSumExchange
from ..config import FusedClusterConfig
from .entry import fused_entry
from ..stages.pooling_c128 import RATIO, C128TilePooling
from ..stages.postprocess import TileFinish
from ..stages.token_window import TokenWindow


class FusedClusterKernel:
    """Grid ``C * T`` (1-D), cluster ``(C, 1, 1)`` with ``C = 512 / tile`` (8 or 16 CTAs),
    ``32 * warps`` threads per CTA."""

    def __init__(self, config: FusedClusterConfig):
        self.config = config
        self.pooling = C128TilePooling(config.pool)
        self.finishing = TileFinish(config.entry, RATIO, config.pool.tile)
        self.cluster = self.pooling.num_tiles  # CTAs per token
        self.exchange = TileSumExchange(self.cluster, self.finishing.sends_partner_x)

    __call__ = fused_entry  # the host entry (:mod:`.entry`): the nine tensors, then launch()'s arguments

    def launch(self, tables: tuple, num_tokens, eps: Float32, fp8_inv: Float32, stream: cuda.CUstream):
        """``C * T`` CTAs in clusters of ``C``, ``32 * warps`` threads each, on ``stream``; ``eps`` is
        rms_norm_eps as binary32, ``fp8_inv`` ``div(1, fp8_scale)`` (fp8_per_tensor only)."""
        self.kernel(*tables, eps, fp8_inv).launch(
            grid=(self.cluster * num_tokens, 1, 1), block=(self.pooling.threads, 1, 1), cluster=(self.cluster, 1, 1),
            stream=stream, use_pdl=self.pooling.pool.pdl,
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32):
        self.pooling.wait_at_start()
        cta, _, _ = cute.arch.block_idx()
        tile, tok = self.pooling.tile_and_token(cta)  # tile == rank in the cluster (CTAs C*t .. C*t + C-1)
        smem = SmemAllocator()
        sMax, sNum, sDen, sKv = self.pooling.allocate_smem(smem)
        sTileSums = smem.allocate_tensor(Float32, cute.make_layout(self.cluster), byte_alignment=16)
        sPartnerX = smem.allocate_tensor(Float32, cute.make_layout(32), byte_alignment=16)  # tile 32 only
        position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
        req = mTokenReq[tok]  # loaded with the activity metadata, not after it
        if active:
            cute.arch.cluster_arrive_relaxed()  # "this CTA runs"; waited on before remote stores
            lane = cute.arch.lane_idx()
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            # everything the finishing stage reads from memory, fetched before the pooling
            w, w_partner, cos, sin, data, scales = self.finishing.inputs(mWeight, mCosSin, mCache, position, kv_slot,
                                                                         tile, lane)
            x = cute.make_rmem_tensor((self.finishing.lane_channels,), Float32)
            x.fill(0.0)
            self.pooling.pool_tile(TokenWindow(mState, mBlockTable, req, position), tile, (sMax, sNum, sDen), sKv, x)
            tile_sum = self.finishing.tile_sum(x)  # meaningful in warp 0
            cute.arch.cluster_wait()  # every CTA of the cluster runs
            self.exchange.exchange(tile_sum, x, sTileSums, sPartnerX, tile, lane, warp)
            if warp == 0:
                self.finishing.finish(x, w, w_partner, sTileSums, sPartnerX, cos, sin, lane, tile, data, scales, eps,
                                      fp8_inv)
