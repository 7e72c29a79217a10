"""Device code of SPEC §6-§7: RMSNorm, NoPE quantization, RoPE and the cache store.

Two thread mappings use it:

- 128 threads x 4 channels per token (C4 fused kernel, C128 store kernel):
  :meth:`EntryWriter.write_entry_x4`. Thread ``t`` holds channels ``4t..4t+3``; threads
  0..111 are NoPE (quantization block ``t // 16``, 16 lanes per block), 112..127 RoPE
  (pairs ``2(t-112)`` and ``2(t-112)+1``).
- one warp x 2 channels per 64-channel tile (the C128 cluster kernel), built from the
  same pieces (:func:`quantize_block`, :func:`rotate_pairs`, :func:`entry_addresses`
  and the ``store_*`` functions).

Exactness: the sum of squares is SPEC's tree over the 512 channels (per-thread tree of
consecutive channels, xor-butterfly over lanes holding consecutive chunks, tree over warp
partials in warp order); ``rr = div(1, sqrt(add(mul(ss, 2^-9), eps)))`` and
``y = mul(mul(x, rr), w)`` are separately rounded; block ``amax`` is an exact max (the
butterfly order does not matter for max); the UE8M0 byte uses the amax floor; scaling by
``2^-k`` is one ``mul.rn`` (exact except far below E4M3's resolution, where both roundings
give the same signed zero); E4M3 and bf16 conversions are the RNE hardware ``cvt``s.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8

from .config import DATA_RECORD_BYTES, NOPE_DIM, QUANT_BLOCK, SCALE_RECORD_BYTES, EntryFormat
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
from .memory import load_fragment, load_scalar, store_fragment, store_scalar


# ---- pieces (plain tracing helpers, no dynamic control flow) ---------------------------
def token_activity(mPos: cute.Tensor, mSlot: cute.Tensor, mKvSlot: cute.Tensor, tok, ratio: int):
    """SPEC §5, which tokens write an entry: ``(p, kv_slot, active)``, active iff the token's
    state is saved, ``p`` ends a window of ``ratio`` and it has a cache slot."""
    position = mPos[tok]
    kv_slot = mKvSlot[tok]
    active = (mSlot[tok] >= Int64(0)) & (kv_slot >= Int64(0)) & ((position + 1) % ratio == Int64(0))
    return position, kv_slot, active


def chunk_lane_token(first, count, num_tokens, lane):
    """``(token, valid)``: lane ``j``'s token ``first + j`` of a chunk of ``count <= 32``
    tokens, valid below ``count`` and ``num_tokens`` (invalid lanes read token ``first``)."""
    token = first + lane
    valid = (lane < count) & (token < num_tokens)
    return Int32(cutlass.select_(valid, token, first)), valid


def active_token_mask(mPos: cute.Tensor, mSlot: cute.Tensor, mKvSlot: cute.Tensor, first, count, num_tokens,
                      lane, ratio: int):
    """Bit ``j`` set iff token ``first + j`` (``j < count <= 32``, below ``num_tokens``) is
    active (SPEC §5): lane ``j`` of the calling warp reads that token's metadata, then a
    ballot; every warp that calls it gets the same mask."""
    token, valid = chunk_lane_token(first, count, num_tokens, lane)
    _, _, active = token_activity(mPos, mSlot, mKvSlot, token, ratio)
    return cute.arch.vote_ballot_sync(valid & active)


def chunk_tokens(mPos: cute.Tensor, mSlot: cute.Tensor, mKvSlot: cute.Tensor, mTokenReq: cute.Tensor, first, count,
                 num_tokens, lane, ratio: int):
    """:func:`active_token_mask` that also returns lane ``j``'s ``(position, kv_slot, req)``
    of token ``first + j``, all four loaded at once (so a token's pooling needs no second
    metadata round trip)."""
    token, valid = chunk_lane_token(first, count, num_tokens, lane)
    position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, token, ratio)
    req = mTokenReq[token]  # issued with the other three, before the ballot waits for them
    return cute.arch.vote_ballot_sync(valid & active), position, kv_slot, req


def lowest_set_bit(mask):
    """Index of the lowest set bit of a non-zero 32-bit mask: ``popc((m & -m) - 1)``."""
    return cute.arch.popc((mask & (Int32(0) - mask)) - Int32(1))


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
    amax = butterfly_max(abs_max_fragment(q, n), 1, lanes_per_block // 2)
    scale_byte = ue8m0_scale_byte(amax)
    inv = pow2_neg_k(scale_byte)
    scaled = cute.make_rmem_tensor((n,), Float32)
    for i in range(n):
        scaled[i] = fmul(q[i], inv)
    return to_e4m3_fragment(scaled), scale_byte


def load_cos_sin(mCosSin: cute.Tensor, cos_sin_row, first_pair, pairs: int):
    """``(cos, sin)`` fragments of ``pairs`` consecutive RoPE pairs from row ``cos_sin_row``."""
    half = mCosSin.shape[1] // 2
    cos = cute.make_rmem_tensor((pairs,), Float32)
    sin = cute.make_rmem_tensor((pairs,), Float32)
    for k in range(pairs):
        cos[k] = load_scalar(mCosSin, cos_sin_row, first_pair + k)
        sin[k] = load_scalar(mCosSin, cos_sin_row, first_pair + k + half)
    return cos, sin


def rotate_pairs(y: cute.Tensor, n: int, cos: cute.Tensor, sin: cute.Tensor) -> cute.Tensor:
    """RoPE of ``n/2`` interleaved pairs ``(a, b) = (y[2k], y[2k+1])`` (unrounded fp32 ``y``):
    ``o0 = sub(mul(a, co), mul(b, si))``, ``o1 = add(mul(a, si), mul(b, co))``."""
    out = cute.make_rmem_tensor((n,), Float32)
    for k in range(n // 2):
        a, b = y[2 * k], y[2 * k + 1]
        out[2 * k] = fsub(fmul(a, cos[k]), fmul(b, sin[k]))
        out[2 * k + 1] = fadd(fmul(a, sin[k]), fmul(b, cos[k]))
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


# ---- 128 threads x 4 channels per token ---------------------------------------------------
class EntryWriter:
    """Mixin for kernels whose token groups are 128 threads x 4 channels.

    The subclass sets ``self.entry`` (an :class:`EntryFormat`) and ``self.ratio``.
    """

    group_threads = 128
    vec = 4
    rope_first_thread = NOPE_DIM // 4  # 112
    lanes_per_block = QUANT_BLOCK // 4  # 16

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
    def write_entry_x4(
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
        lane = t % 32
        warp = t // 32
        first = t * self.vec
        # issued before the barrier, so their latency hides behind the reduction
        w = load_weight(mWeight, first, self.vec)
        first_pair = Int32(cutlass.select_(t >= self.rope_first_thread, (t - self.rope_first_thread) * (self.vec // 2), 0))
        cos, sin = load_cos_sin(mCosSin, (position // self.ratio) * self.ratio, first_pair, self.vec // 2)
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
                store_fp8_nope(data, codes, first, self.vec)
                if lane % self.lanes_per_block == 0:
                    store_scale_byte(scales, t // self.lanes_per_block, scale_byte)
            else:
                store_rope_bf16(data, rotate_pairs(y, self.vec, cos, sin), first, self.vec)
                if t == self.rope_first_thread:
                    store_pad_byte(scales)
        elif cutlass.const_expr(self.entry.layout == "bf16"):
            if t < self.rope_first_thread:
                store_bf16(self.entry, data, y, first, self.vec)
            else:
                store_bf16(self.entry, data, rotate_pairs(y, self.vec, cos, sin), first, self.vec)
        else:
            if t < self.rope_first_thread:
                store_fp8_scaled(self.entry, data, bf16_round_fragment(y), first, self.vec, fp8_inv)
            else:
                rotated = rotate_pairs(y, self.vec, cos, sin)
                store_fp8_scaled(self.entry, data, bf16_round_fragment(rotated), first, self.vec, fp8_inv)
