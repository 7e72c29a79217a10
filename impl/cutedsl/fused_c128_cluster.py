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
per lane. Then:

1. tile partial ``ss_g`` = SPEC's tree over the tile's channels (per-lane tree, xor
   butterfly 1..16: lanes hold consecutive aligned chunks);
2. lanes ``0..C-1`` of warp 0 write ``ss_g`` into slot ``g`` of CTA ``l``'s shared array
   (``mapa`` + ``st.shared::cluster``); with 16 CTAs a NoPE CTA also writes its 32 ``x``
   values to the other half of its quantization block (rank ``g ^ 1``). The cluster
   barrier (arrive = release, wait = acquire) publishes everything;
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
(Nsight Compute), so from 32 tokens on the cluster-free :mod:`.fused_c128_handoff` is faster
and dispatch uses clusters only up to 16 tokens.
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

from .config import NOPE_DIM, QUANT_BLOCK, ClusterConfig
from .dependent_launch import wait_for_prerequisite_grids
from .entry import (
    entry_addresses,
    load_cos_sin,
    load_weight,
    normalize,
    quantize_block,
    rms_scale,
    rotate_pairs,
    store_bf16,
    store_fp8_nope,
    store_fp8_scaled,
    store_pad_byte,
    store_rope_bf16,
    store_scale_byte,
    sum_of_squares,
    token_activity,
)
from .exact_math import (
    bf16_round_fragment,
    butterfly_max,
    butterfly_sum,
    fadd,
    fmul,
    fsub,
    pow2_neg_k,
    to_e4m3_fragment,
    tree_sum,
    ue8m0_scale_byte,
)
from .pooling_c128 import C128TilePooling

ROPE_TILE_CHANNEL = NOPE_DIM  # first RoPE channel, 448


@dsl_user_op
def store_to_peer_smem(value, smem_ptr, peer_rank, *, loc=None, ip=None) -> None:
    """``*smem_ptr = value`` in the shared memory of CTA ``peer_rank`` of this cluster.

    ``mapa.shared::cluster`` maps the local shared address to the peer's window of the
    cluster's distributed shared memory; ``st.shared::cluster`` writes it. Visibility to
    the peer comes from the following ``barrier.cluster.arrive`` (release semantics) and
    the peer's ``barrier.cluster.wait`` (acquire).
    """
    llvm.inline_asm(
        None,
        [smem_ptr.toint(loc=loc, ip=ip).ir_value(), Int32(peer_rank).ir_value(loc=loc, ip=ip),
         Float32(value).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 remote_addr;\n\t"
        "mapa.shared::cluster.u32 remote_addr, $0, $1;\n\t"
        "st.shared::cluster.b32 [remote_addr], $2;\n\t}",
        "r,r,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


class C128ClusterKernel(C128TilePooling):
    """Grid ``C * T`` (1-D), cluster ``(C, 1, 1)`` with ``C = 512 / tile`` (8 or 16 CTAs),
    ``32 * warps`` threads per CTA."""

    def __init__(self, config: ClusterConfig):
        super().__init__(config.pool)
        self.config = config
        self.entry = config.entry
        self.cluster = self.num_tiles  # CTAs per token
        self.lane_channels = self.final_channels  # channels per lane of warp 0: 2 (tile 64) or 1 (tile 32)
        self.tiles_per_block = QUANT_BLOCK // self.tile  # 1 or 2 CTAs per quantization block
        self.rope_tile = NOPE_DIM // self.tile  # first RoPE tile: 7 or 14
        # tile 32, flashmla_fp8: the two CTAs of a quantization block swap x for the block's amax
        self.sends_partner_x = self.tiles_per_block == 2 and self.entry.layout == "flashmla_fp8"

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
        stream: cuda.CUstream,
    ):
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, fp8_inv).launch(
            grid=(self.cluster * mPos.shape[0], 1, 1), block=(self.threads, 1, 1), cluster=(self.cluster, 1, 1),
            stream=stream, use_pdl=self.pdl,
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32):
        wait_for_prerequisite_grids(self.pdl and not self.pool.early_metadata)  # first (else in pool_tile)
        cta, _, _ = cute.arch.block_idx()
        tile, tok = self.tile_and_token(cta)  # tile == rank in the cluster (CTAs C*t .. C*t + C-1)
        smem = SmemAllocator()
        sMax, sNum, sDen, sKv = self.allocate_smem(smem)
        sTileSums = smem.allocate_tensor(Float32, cute.make_layout(self.cluster), byte_alignment=16)
        sPartnerX = smem.allocate_tensor(Float32, cute.make_layout(32), byte_alignment=16)  # tile 32 only
        position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, self.ratio)
        req = mTokenReq[tok]  # loaded with the activity metadata, not after it
        if active:
            cute.arch.cluster_arrive_relaxed()  # "this CTA runs"; waited on before remote stores
            lane = cute.arch.lane_idx()
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            n = self.lane_channels
            # everything the finishing stage reads from memory, fetched before the pooling
            w, w_partner, pair = self.finish_inputs(mWeight, tile, lane)
            cos, sin = load_cos_sin(mCosSin, (position // self.ratio) * self.ratio, pair, 1)
            data, scales = entry_addresses(self.entry, mCache, kv_slot)
            x = cute.make_rmem_tensor((n,), Float32)
            x.fill(0.0)
            self.pool_tile(mState, mBlockTable, req, position, tile, sMax, sNum, sDen, sKv, x)
            tile_sum = butterfly_sum(sum_of_squares(x, n), 1, 16)  # meaningful in warp 0
            cute.arch.cluster_wait()
            if warp == 0:
                if lane < self.cluster:
                    store_to_peer_smem(tile_sum, sTileSums.iterator + tile, lane)
                if cutlass.const_expr(self.sends_partner_x):
                    store_to_peer_smem(x[0], sPartnerX.iterator + lane, tile ^ 1)  # for the block's amax
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            if warp == 0:
                self.finish_token(x, w, w_partner, sTileSums, sPartnerX, cos, sin, lane, tile, data, scales, eps,
                                  fp8_inv)

    @cute.jit
    def finish_inputs(self, mWeight: cute.Tensor, tile: Int32, lane: Int32):
        """Token-independent inputs of the finishing stage: ``(w, w_partner, pair)``, the norm
        weights of this lane's channels (fp32 (n,)), those of the same lane in the block's
        other half (tile 32, flashmla_fp8; else ``w`` again) and the lane's RoPE pair index."""
        n = self.lane_channels
        first = tile * self.tile + lane * n
        partner_first = (tile ^ 1) * self.tile + lane * n
        w = load_weight(mWeight, first, n)
        w_partner = w
        if cutlass.const_expr(self.sends_partner_x):
            w_partner = load_weight(mWeight, partner_first, n)
        pair = Int32(cutlass.select_(first >= ROPE_TILE_CHANNEL, (first - ROPE_TILE_CHANNEL) // 2, 0))
        return w, w_partner, pair

    @cute.jit
    def finish_token(
        self,
        x: cute.Tensor,  # fp32 (n,): this lane's channels of the compressed vector
        w: cute.Tensor,  # fp32 (n,): their norm weights
        w_partner: cute.Tensor,  # fp32 (n,): weights of the block's other half (tile 32)
        sTileSums: cute.Tensor,  # fp32 smem (C,): every tile's sum of squares, exchanged
        sPartnerX: cute.Tensor,  # fp32 smem (32,): x of the block's other half (tile 32, flashmla_fp8)
        cos: cute.Tensor,  # fp32 (1,): cos of the lane's RoPE pair
        sin: cute.Tensor,  # fp32 (1,): its sin
        lane: Int32,
        tile: Int32,
        data: Int64,  # byte address of the entry (data record)
        scales: Int64,  # byte address of the scale record (flashmla_fp8)
        eps: Float32,
        fp8_inv: Float32,
    ):
        """Warp 0, after the exchange: ``ss`` as SPEC's tree over the tile trees, ``rr``, then
        this tile's part of the entry."""
        ss = tree_sum([sTileSums[g] for g in range(self.cluster)])
        rr = rms_scale(ss, eps)
        if cutlass.const_expr(self.tiles_per_block == 1):
            self.finish_block(x, w, rr, cos, sin, lane, tile, data, scales, fp8_inv)
        else:
            self.finish_half_block(x, w, sPartnerX, w_partner, rr, cos, sin, lane, tile, data, scales, fp8_inv)

    @cute.jit
    def finish_block(
        self,
        x: cute.Tensor,  # fp32 (2,): channels 64*tile + 2*lane, +1
        w: cute.Tensor,  # fp32 (2,): their norm weights
        rr,  # Float32: div(1, sqrt(add(mul(ss, 2^-9), eps)))
        cos: cute.Tensor,  # fp32 (1,): cos of pair `lane` (used by tile 7)
        sin: cute.Tensor,  # fp32 (1,): sin of pair `lane`
        lane: Int32,
        tile: Int32,  # 0..6 NoPE quantization block, 7 RoPE
        data: Int64,  # byte address of the entry (data record)
        scales: Int64,  # byte address of the scale record (flashmla_fp8)
        fp8_inv: Float32,
    ):
        """Tile 64: a CTA is one quantization block (own amax) or the RoPE part."""
        n = self.lane_channels
        y = normalize(x, rr, w, n)
        first = tile * QUANT_BLOCK + lane * n
        if cutlass.const_expr(self.entry.layout == "flashmla_fp8"):
            if tile < self.rope_tile:
                codes, scale_byte = quantize_block(y, n, 32)
                store_fp8_nope(data, codes, first, n)
                if lane == 0:
                    store_scale_byte(scales, tile, scale_byte)
            else:
                store_rope_bf16(data, rotate_pairs(y, n, cos, sin), first, n)
                if lane == 0:
                    store_pad_byte(scales)
        elif cutlass.const_expr(self.entry.layout == "bf16"):
            if tile < self.rope_tile:
                store_bf16(self.entry, data, y, first, n)
            else:
                store_bf16(self.entry, data, rotate_pairs(y, n, cos, sin), first, n)
        else:
            if tile < self.rope_tile:
                store_fp8_scaled(self.entry, data, bf16_round_fragment(y), first, n, fp8_inv)
            else:
                rotated = rotate_pairs(y, n, cos, sin)
                store_fp8_scaled(self.entry, data, bf16_round_fragment(rotated), first, n, fp8_inv)

    @cute.jit
    def finish_half_block(
        self,
        x: cute.Tensor,  # fp32 (1,): channel 32*tile + lane
        w: cute.Tensor,  # fp32 (1,): its norm weight
        sPartnerX: cute.Tensor,  # fp32 smem (32,): x of the other half of the block (flashmla_fp8)
        w_partner: cute.Tensor,  # fp32 (1,): norm weight of channel 32*(tile^1) + lane
        rr,  # Float32
        cos: cute.Tensor,  # fp32 (1,): cos of pair (channel - 448) // 2 (tiles 14, 15)
        sin: cute.Tensor,  # fp32 (1,): its sin
        lane: Int32,
        tile: Int32,  # 0..13: half (tile % 2) of quantization block tile // 2; 14, 15: RoPE
        data: Int64,
        scales: Int64,
        fp8_inv: Float32,
    ):
        """Tile 32: a lane holds one channel. A quantization block spans CTAs ``2g, 2g+1``:
        each received the other's ``x`` over DSMEM with the sums of squares, so both compute
        the block's exact amax (max over both halves, any order) without another barrier.
        A RoPE pair ``(448 + 2j, 449 + 2j)`` sits in lanes ``2j', 2j'+1``: one shuffle."""
        y = normalize(x, rr, w, 1)
        channel = tile * self.tile + lane
        if tile < self.rope_tile:
            if cutlass.const_expr(self.entry.layout == "flashmla_fp8"):
                x_partner = cute.make_rmem_tensor((1,), Float32)
                x_partner[0] = sPartnerX[lane]
                y_partner = normalize(x_partner, rr, w_partner, 1)
                q = bf16_round_fragment(y)
                q_partner = bf16_round_fragment(y_partner)
                lane_amax = cute.arch.fmax(cute.math.absf(q[0]), cute.math.absf(q_partner[0]))
                scale_byte = ue8m0_scale_byte(butterfly_max(lane_amax, 1, 16))
                scaled = cute.make_rmem_tensor((1,), Float32)
                scaled[0] = fmul(q[0], pow2_neg_k(scale_byte))
                store_fp8_nope(data, to_e4m3_fragment(scaled), channel, 1)
                if lane == 0:
                    if tile % 2 == 0:
                        store_scale_byte(scales, tile // 2, scale_byte)
            elif cutlass.const_expr(self.entry.layout == "bf16"):
                store_bf16(self.entry, data, y, channel, 1)
            else:
                store_fp8_scaled(self.entry, data, bf16_round_fragment(y), channel, 1, fp8_inv)
        else:
            other = cute.arch.shuffle_sync_bfly(y[0], offset=1)
            even = lane % 2 == 0
            a = Float32(cutlass.select_(even, y[0], other))
            b = Float32(cutlass.select_(even, other, y[0]))
            rotated = cute.make_rmem_tensor((1,), Float32)
            rotated[0] = Float32(cutlass.select_(even, fsub(fmul(a, cos[0]), fmul(b, sin[0])),
                                                 fadd(fmul(a, sin[0]), fmul(b, cos[0]))))
            if cutlass.const_expr(self.entry.layout == "flashmla_fp8"):
                store_rope_bf16(data, rotated, channel, 1)
                if lane == 0:
                    if tile == self.rope_tile:
                        store_pad_byte(scales)
            elif cutlass.const_expr(self.entry.layout == "bf16"):
                store_bf16(self.entry, data, rotated, channel, 1)
            else:
                store_fp8_scaled(self.entry, data, bf16_round_fragment(rotated), channel, 1, fp8_inv)
