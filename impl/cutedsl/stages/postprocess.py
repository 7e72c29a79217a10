"""Device code of SPEC §6-§7, the finishing stage: RMSNorm, RoPE, quantization and the cache store.

Every CuTe DSL kernel that writes an entry calls this module, in one of two thread mappings:

- :class:`GroupFinish`, 128 threads x 4 channels per token (C4 fused kernel, C128 store
  kernel). Thread ``t`` holds channels ``4t..4t+3``; threads 0..111 are NoPE (quantization
  block ``t // 16``, 16 lanes per block), 112..127 RoPE (pairs ``2(t-112)`` and
  ``2(t-112)+1``).
- :class:`TileFinish`, one warp x ``tile/32`` channels per channel tile (the C128 cluster
  kernel: warp 0 of each CTA; the handoff kernel: warp ``w`` of the token's last CTA takes
  tile ``w``). Tile 64: a tile is one quantization block (own amax) or the RoPE part; tile
  32: the two tiles of a block exchange ``x`` and both compute the block's amax.

Both are built from the same pieces (:func:`quantize_block` and :func:`encode_block`,
:func:`rotate_pair`, :func:`rope_row`,
:func:`entry_addresses`) and store through one layout switch, :func:`store_channels`; the
scale byte and the pad byte of ``flashmla_fp8`` are written by one lane the mapping picks.

Exactness: the sum of squares is SPEC's tree over the 512 channels (per-thread tree of
consecutive channels, xor-butterfly over lanes holding consecutive chunks, tree over warp
(or tile) partials in order); ``rr = div(1, sqrt(add(mul(ss, 2^-9), eps)))`` and
``y = mul(mul(x, rr), w)`` are separately rounded; block ``amax`` is an exact max (the
butterfly order does not matter for max); the UE8M0 byte uses the amax floor; scaling by
``2^-k`` is one ``mul.rn`` (exact except far below E4M3's resolution, where both roundings
give the same signed zero); E4M3 and bf16 conversions are the RNE hardware ``cvt``s.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8

from ..config import DATA_RECORD_BYTES, HEAD_DIM, NOPE_DIM, QUANT_BLOCK, SCALE_RECORD_BYTES, EntryFormat
from .exact_math import (
    INV_HEAD_DIM,
    abs_max_fragment,
    bf16_round_fragment,
    butterfly_max,
    butterfly_sum,
    fadd,
    fdiv,
    fmul,
    fsqrt,
    fsub,
    pow2_neg_k,
    to_bf16_fragment,
    to_e4m3_fragment,
    tree_sum,
    ue8m0_scale_byte,
)
from .memory import element_address, load_fragment, load_if, load_scalar, store_fragment, store_scalar


# ---- pieces (plain tracing helpers, no dynamic control flow) ---------------------------
def sum_of_squares(x: cute.Tensor, n: int):
    """``tree(mul(x[i], x[i]))`` over a thread's ``n`` consecutive channels."""
    return tree_sum([fmul(x[i], x[i]) for i in range(n)])


def rms_scale(ss, eps, inv_width: float = INV_HEAD_DIM):
    """``rr = div(1, sqrt(add(mul(ss, inv_width), eps)))``; ``inv_width`` the exact reciprocal
    of the head width (``2^-9``; the indexer's ``2^-7``)."""
    return fdiv(Float32(1.0), fsqrt(fadd(fmul(ss, Float32(inv_width)), eps)))


def load_weight(mWeight: cute.Tensor, first_channel, n: int) -> cute.Tensor:
    """``n`` norm weights as fp32 (bf16 converts exactly). Scalar loads: SPEC does not
    promise the weight's alignment, and 512 weights per token are L1-resident anyway."""
    dtype = mWeight.element_type
    address = mWeight.iterator.toint() + Int64(first_channel) * (dtype.width // 8)
    raw = load_fragment(dtype, address, n, dtype.width // 8)
    if cutlass.const_expr(dtype is Float32):
        return raw
    w = cute.make_rmem_tensor((n,), Float32)
    w.store(raw.load().to(Float32))
    return w


def normalize(x: cute.Tensor, rr, w: cute.Tensor, n: int) -> cute.Tensor:
    """``y = mul(mul(x, rr), w)``."""
    y = cute.make_rmem_tensor((n,), Float32)
    for i in range(n):
        y[i] = fmul(fmul(x[i], rr), w[i])
    return y


def quantize_block(y: cute.Tensor, n: int, lanes_per_block: int):
    """NoPE block quantization for one lane's ``n`` values of a 64-channel block held by
    ``lanes_per_block`` aligned lanes: ``(e4m3 codes, scale byte)``.

    Every lane of the warp must execute it (the amax butterfly shuffles).
    """
    q = bf16_round_fragment(y)
    return encode_block(q, n, butterfly_max(abs_max_fragment(q, n), 1, lanes_per_block // 2))


def encode_block(q: cute.Tensor, n: int, amax):
    """SPEC §6's block encoding of ``n`` bf16 values ``q`` (fp32 fragment) of a block whose
    amax is ``amax``: the UE8M0 scale byte (amax floor), then ``e4m3(q · 2^-k)`` (one exact
    ``mul.rn``): ``(e4m3 codes, scale byte)``."""
    scale_byte = ue8m0_scale_byte(amax)
    inv = pow2_neg_k(scale_byte)
    scaled = cute.make_rmem_tensor((n,), Float32)
    for i in range(n):
        scaled[i] = fmul(q[i], inv)
    return to_e4m3_fragment(scaled), scale_byte


def rope_row(position, ratio: int):
    """The ``cos_sin_cache`` row of a token's entry: its group's first position ``(p // r) * r``
    (SPEC §6; also the first row of a C128 window and the group a C4 window ends with)."""
    return (position // ratio) * ratio


def load_cos_sin(mCosSin: cute.Tensor, cos_sin_row, first_pair, pairs: int, wanted=None):
    """``(cos, sin)`` fragments of ``pairs`` consecutive RoPE pairs from row ``cos_sin_row``; with
    ``wanted`` (a Boolean) read only where it holds, by predicated loads (:func:`.memory.load_if`:
    no branch, so they issue with the loads around them), undefined elsewhere."""
    half = mCosSin.shape[1] // 2
    cos = cute.make_rmem_tensor((pairs,), Float32)
    sin = cute.make_rmem_tensor((pairs,), Float32)
    for k in range(pairs):
        if cutlass.const_expr(wanted is None):
            cos[k] = load_scalar(mCosSin, cos_sin_row, first_pair + k)
            sin[k] = load_scalar(mCosSin, cos_sin_row, first_pair + k + half)
        else:
            cos[k] = load_if(Float32, element_address(mCosSin, cos_sin_row, first_pair + k), 1, wanted)[0]
            sin[k] = load_if(Float32, element_address(mCosSin, cos_sin_row, first_pair + k + half), 1, wanted)[0]
    return cos, sin


def rotate_pair(a, b, co, si) -> tuple:
    """SPEC §6's RoPE of one pair: ``o0 = sub(mul(a, co), mul(b, si))``,
    ``o1 = add(mul(a, si), mul(b, co))`` (unrounded fp32 ``a``, ``b``)."""
    return fsub(fmul(a, co), fmul(b, si)), fadd(fmul(a, si), fmul(b, co))


def rotate_pairs(y: cute.Tensor, n: int, cos: cute.Tensor, sin: cute.Tensor) -> cute.Tensor:
    """RoPE of ``n/2`` interleaved pairs ``(a, b) = (y[2k], y[2k+1])`` (:func:`rotate_pair`)."""
    out = cute.make_rmem_tensor((n,), Float32)
    for k in range(n // 2):
        out[2 * k], out[2 * k + 1] = rotate_pair(y[2 * k], y[2 * k + 1], cos[k], sin[k])
    return out


def scale_fragment(z: cute.Tensor, n: int, factor) -> cute.Tensor:
    """``mul(z[i], factor)`` (fp8_per_tensor: ``factor = div(1, fp8_scale)``)."""
    out = cute.make_rmem_tensor((n,), Float32)
    for i in range(n):
        out[i] = fmul(z[i], factor)
    return out


def entry_addresses(fmt: EntryFormat, mCache: cute.Tensor, slot):
    """Byte addresses ``(data, scales)`` of the entry for ``slot`` (SPEC §7).

    ``flashmla_fp8``: the page is ``k_cache[page]`` (page stride in bytes), the data record
    ``page*stride0 + o*576`` and the scale record ``page*stride0 + B*576 + o*8``.
    ``bf16``/``fp8_per_tensor``: element ``page*stride0 + o*stride1`` (``scales`` unused).
    """
    B = fmt.entries_per_page
    page = slot // Int64(B)
    offset = slot - page * Int64(B)
    base = mCache.iterator.toint()
    if fmt.layout == "flashmla_fp8":
        page_base = base + page * Int64(mCache.stride[0])
        data = page_base + offset * DATA_RECORD_BYTES
        return data, page_base + (B * DATA_RECORD_BYTES) + offset * SCALE_RECORD_BYTES
    elements = page * Int64(mCache.stride[0]) + offset * Int64(mCache.stride[1])
    data = base + elements * fmt.cache_elem_bytes
    return data, data


# flashmla_fp8 ----------------------------------------------------------------------------
def store_fp8_nope(data, codes: cute.Tensor, first_channel, n: int) -> None:
    """E4M3 bytes of channels ``first_channel..+n`` (NoPE) of a data record."""
    store_fragment(codes, data + Int64(first_channel), n)


def store_rope_bf16(data, rotated: cute.Tensor, first_channel, n: int) -> None:
    """The 64 RoPE values follow the 448 E4M3 bytes as little-endian bf16."""
    byte = NOPE_DIM + 2 * (Int64(first_channel) - NOPE_DIM)
    store_fragment(to_bf16_fragment(rotated), data + byte, 2 * n)


def store_scale_byte(scales, block, scale_byte) -> None:
    """UE8M0 byte of quantization block ``block`` (0..6)."""
    store_scalar(Uint8, scales + Int64(block), scale_byte.to(Uint8))


def store_pad_byte(scales) -> None:
    """Byte 7 of the scale record is 0."""
    store_scalar(Uint8, scales + (SCALE_RECORD_BYTES - 1), Uint8(0))


# bf16 / fp8_per_tensor ---------------------------------------------------------------------
def store_bf16(fmt: EntryFormat, data, values: cute.Tensor, first_channel, n: int) -> None:
    """``bf16`` layout: RNE bf16 of ``values`` at channels ``first_channel..+n``."""
    align = min(2 * n, fmt.store_align)
    store_fragment(to_bf16_fragment(values), data + Int64(first_channel) * 2, align)


def store_fp8_scaled(fmt: EntryFormat, data, z: cute.Tensor, first_channel, n: int, inv_scale) -> None:
    """``fp8_per_tensor``: ``e4m3(mul(z, inv))`` of the bf16-valued ``z``."""
    align = min(n, fmt.store_align)
    store_fragment(to_e4m3_fragment(scale_fragment(z, n, inv_scale)), data + Int64(first_channel), align)


# ---- the layout switch ---------------------------------------------------------------------
def store_channels(fmt: EntryFormat, data, values: cute.Tensor, first_channel, n: int, fp8_inv, rope: bool) -> None:
    """SPEC §7: channels ``first_channel..+n`` of an entry in ``fmt``'s layout.

    ``flashmla_fp8``: NoPE ``values`` are the E4M3 codes of the caller's block quantization,
    RoPE ``values`` (rotated) go as bf16 after the 448 NoPE bytes; ``bf16``: the RNE bf16 of
    ``values``; ``fp8_per_tensor``: ``e4m3(mul(bf16(values), fp8_inv))``. ``rope`` matters
    to ``flashmla_fp8`` only.
    """
    if fmt.layout == "flashmla_fp8":
        if rope:
            store_rope_bf16(data, values, first_channel, n)
        else:
            store_fp8_nope(data, values, first_channel, n)
    elif fmt.layout == "bf16":
        store_bf16(fmt, data, values, first_channel, n)
    else:
        store_fp8_scaled(fmt, data, bf16_round_fragment(values), first_channel, n, fp8_inv)


# ---- 128 threads x 4 channels per token ---------------------------------------------------
class GroupFinish:
    """The finishing stage of kernels whose token groups are 128 threads x 4 channels
    (``tokens_per_cta`` groups per CTA, each with its own named barrier)."""

    group_threads = 128
    vec = 4
    rope_first_thread = NOPE_DIM // 4  # 112
    lanes_per_block = QUANT_BLOCK // 4  # 16

    def __init__(self, entry: EntryFormat, ratio: int, tokens_per_cta: int):
        self.entry = entry
        self.ratio = ratio
        self.tokens_per_cta = tokens_per_cta

    def token_group(self, smem):
        """This thread's ``(group, t, tok, sPartial)``: token group of the CTA, thread index in
        it (0..127), token index (``tokens_per_cta`` consecutive tokens per CTA) and the
        groups' shared partial sums of squares, fp32 ``[tokens_per_cta, 4]`` (one per warp)."""
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        group = tidx // self.group_threads
        t = tidx % self.group_threads
        tok = cta * self.tokens_per_cta + group
        layout = cute.make_layout((self.tokens_per_cta, 4), stride=(4, 1))
        return group, t, tok, smem.allocate_tensor(Float32, layout, byte_alignment=16)

    @cute.jit
    def finish(
        self,
        x: cute.Tensor,  # fp32 (4,): channels 4t..4t+3 of the compressed vector
        t: Int32,  # thread index in the token group, 0..127
        sPartial: cute.Tensor,  # fp32 smem (4,): this group's per-warp sums of squares
        barrier_id: Int32,  # named barrier of this 128-thread group
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # k_cache (layout per self.entry)
        position: Int64,  # the token's position p
        slot: Int64,  # kv_slot_mapping[t] >= 0
        eps: Float32,
        fp8_inv: Float32,  # div(1, fp8_scale) (fp8_per_tensor only)
    ):
        """The token's entry, by the 128 threads of its group."""
        lane = t % 32
        warp = t // 32
        first = t * self.vec
        # issued before the barrier, so their latency hides behind the reduction
        w = load_weight(mWeight, first, self.vec)
        first_pair = Int32(cutlass.select_(t >= self.rope_first_thread, (t - self.rope_first_thread) * (self.vec // 2), 0))
        cos, sin = load_cos_sin(mCosSin, rope_row(position, self.ratio), first_pair, self.vec // 2)
        # ss: per-thread tree (4 channels) -> butterfly (128 channels) -> tree of 4 warps
        sq = butterfly_sum(sum_of_squares(x, self.vec), 1, 16)
        if lane == 0:
            sPartial[warp] = sq
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=self.group_threads)
        ss = tree_sum([sPartial[0], sPartial[1], sPartial[2], sPartial[3]])
        rr = rms_scale(ss, eps)
        y = normalize(x, rr, w, self.vec)
        data, scales = entry_addresses(self.entry, mCache, slot)
        if cutlass.const_expr(self.entry.layout == "flashmla_fp8"):
            codes, scale_byte = quantize_block(y, self.vec, self.lanes_per_block)
            if t < self.rope_first_thread:
                store_channels(self.entry, data, codes, first, self.vec, fp8_inv, rope=False)
                if lane % self.lanes_per_block == 0:
                    store_scale_byte(scales, t // self.lanes_per_block, scale_byte)
            else:
                store_channels(self.entry, data, rotate_pairs(y, self.vec, cos, sin), first, self.vec, fp8_inv,
                               rope=True)
                if t == self.rope_first_thread:
                    store_pad_byte(scales)
        else:
            if t < self.rope_first_thread:
                store_channels(self.entry, data, y, first, self.vec, fp8_inv, rope=False)
            else:
                store_channels(self.entry, data, rotate_pairs(y, self.vec, cos, sin), first, self.vec, fp8_inv,
                               rope=True)


# ---- one warp x tile/32 channels per channel tile -------------------------------------------
class TileFinish:
    """The finishing stage of a token spread over channel tiles of ``tile`` channels (64: a
    tile per quantization block, 2 channels per lane; 32: two tiles per block, 1 channel per
    lane), one warp per tile. The caller gathers every tile's sum of squares (and, tile 32
    with ``flashmla_fp8``, the ``x`` of the block's other half) into shared memory."""

    def __init__(self, entry: EntryFormat, ratio: int, tile: int):
        self.entry = entry
        self.ratio = ratio
        self.tile = tile
        self.num_tiles = HEAD_DIM // tile  # tiles per token: 8 or 16
        self.lane_channels = tile // 32  # channels per lane: 2 (tile 64) or 1 (tile 32)
        self.tiles_per_block = QUANT_BLOCK // tile  # 1 or 2 tiles per quantization block
        self.rope_tile = NOPE_DIM // tile  # first RoPE tile: 7 or 14
        # tile 32, flashmla_fp8: the two tiles of a quantization block swap x for the block's amax
        self.sends_partner_x = self.tiles_per_block == 2 and entry.layout == "flashmla_fp8"

    @cute.jit
    def inputs(
        self,
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # k_cache (layout per self.entry)
        position: Int64,  # the token's position p
        slot: Int64,  # its kv slot
        tile: Int32,
        lane: Int32,
    ):
        """Everything the finishing stage reads from memory, to be fetched early:
        ``(w, w_partner, cos, sin, data, scales)``, the norm weights of this lane's channels
        (fp32 (n,)), those of the same lane in the block's other half (tile 32, flashmla_fp8;
        else ``w`` again), the cos and sin of the lane's RoPE pair (fp32 (1,)) and the entry's
        byte addresses."""
        n = self.lane_channels
        first = tile * self.tile + lane * n
        partner_first = (tile ^ 1) * self.tile + lane * n
        w = load_weight(mWeight, first, n)
        w_partner = w
        if cutlass.const_expr(self.sends_partner_x):
            w_partner = load_weight(mWeight, partner_first, n)
        pair = Int32(cutlass.select_(first >= NOPE_DIM, (first - NOPE_DIM) // 2, 0))
        cos, sin = load_cos_sin(mCosSin, rope_row(position, self.ratio), pair, 1)
        data, scales = entry_addresses(self.entry, mCache, slot)
        return w, w_partner, cos, sin, data, scales

    def tile_sum(self, x: cute.Tensor):
        """This tile's partial sum of squares, SPEC's tree over its channels (per-lane tree, xor
        butterfly 1..16: the lanes hold consecutive aligned chunks); meaningful in the warp
        that holds ``x``."""
        return butterfly_sum(sum_of_squares(x, self.lane_channels), 1, 16)

    @cute.jit
    def finish(
        self,
        x: cute.Tensor,  # fp32 (n,): this lane's channels of the compressed vector
        w: cute.Tensor,  # fp32 (n,): their norm weights
        w_partner: cute.Tensor,  # fp32 (n,): weights of the block's other half (tile 32)
        sTileSums: cute.Tensor,  # fp32 smem (num_tiles,): every tile's sum of squares
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
        """``ss`` as SPEC's tree over the tile trees, ``rr``, then this tile's part of the entry."""
        ss = tree_sum([sTileSums[g] for g in range(self.num_tiles)])
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
        """Tile 64: a tile is one quantization block (own amax) or the RoPE part."""
        n = self.lane_channels
        y = normalize(x, rr, w, n)
        first = tile * QUANT_BLOCK + lane * n
        if cutlass.const_expr(self.entry.layout == "flashmla_fp8"):
            if tile < self.rope_tile:
                codes, scale_byte = quantize_block(y, n, 32)
                store_channels(self.entry, data, codes, first, n, fp8_inv, rope=False)
                if lane == 0:
                    store_scale_byte(scales, tile, scale_byte)
            else:
                store_channels(self.entry, data, rotate_pairs(y, n, cos, sin), first, n, fp8_inv, rope=True)
                if lane == 0:
                    store_pad_byte(scales)
        else:
            if tile < self.rope_tile:
                store_channels(self.entry, data, y, first, n, fp8_inv, rope=False)
            else:
                store_channels(self.entry, data, rotate_pairs(y, n, cos, sin), first, n, fp8_inv, rope=True)

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
        """Tile 32: a lane holds one channel. A quantization block spans tiles ``2g, 2g+1``:
        each has the other's ``x`` (``sPartnerX``), so both compute the block's exact amax
        (max over both halves, any order). A RoPE pair ``(448 + 2j, 449 + 2j)`` sits in lanes
        ``2j', 2j'+1``: one shuffle."""
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
                codes, scale_byte = encode_block(q, 1, butterfly_max(lane_amax, 1, 16))  # the two halves' amax
                store_channels(self.entry, data, codes, channel, 1, fp8_inv, rope=False)
                if lane == 0:
                    if tile % 2 == 0:
                        store_scale_byte(scales, tile // 2, scale_byte)
            else:
                store_channels(self.entry, data, y, channel, 1, fp8_inv, rope=False)
        else:
            other = cute.arch.shuffle_sync_bfly(y[0], offset=1)
            even = lane % 2 == 0
            a = Float32(cutlass.select_(even, y[0], other))
            b = Float32(cutlass.select_(even, other, y[0]))
            o0, o1 = rotate_pair(a, b, cos[0], sin[0])
            rotated = cute.make_rmem_tensor((1,), Float32)
            rotated[0] = Float32(cutlass.select_(even, o0, o1))
            store_channels(self.entry, data, rotated, channel, 1, fp8_inv, rope=True)
            if cutlass.const_expr(self.entry.layout == "flashmla_fp8"):
                if lane == 0:
                    if tile == self.rope_tile:
                        store_pad_byte(scales)


__all__ = ["GroupFinish", "TileFinish", "encode_block", "entry_addresses", "load_cos_sin", "load_weight", "normalize",
           "quantize_block", "rms_scale", "rope_row", "rotate_pair", "rotate_pairs", "store_channels", "sum_of_squares"]
