"""Device code of SPEC §12's finishing stage: one warp turns a 128-wide ``x`` into a cache entry.

Mapping: lane ``l`` holds channels ``4l..4l+3`` (consecutive aligned 4-channel chunks), so

- the sum of squares is SPEC's tree over the 128 channels: the lane's 4-leaf tree, then the
  xor-butterfly with offsets 1..16 (:func:`.exact_math.butterfly_sum`);
  ``rr = div(1, sqrt(add(mul(ss, 2^-7), eps)))``, ``y = mul(mul(x, rr), w)``;
- RoPE: lanes 16..31 hold channels 64..127, pairs ``j = 2(l-16)`` and ``2(l-16)+1``;
  ``z = y`` on lanes 0..15 and the rotated (unrounded) pairs on lanes 16..31;
- Hadamard (optional): spans 64..4 pair lane ``l`` with lane ``l ^ (S/4)`` at the same
  register (one shuffle: the lower lane keeps ``add(z[i], z[i+S])``, the upper one
  ``sub(z[i], z[i+S])`` as ``add(z[i], -z[i+S])``, which rounds identically); spans 2 and 1
  pair registers of one lane; then ``mul`` by ``0x3DB504F3``;
- ``q = bf16(z)``; ``indexer_fp8``: the amax over all 32 lanes (butterfly 1..16), the §2
  exponent (amax floor, 448), ``e4m3(mul(q, 2^-k))`` (the scaling is exact except far below
  E4M3's resolution, where any rounding gives the same signed zero; RNE ``cvt``); the lane
  stores its 4 bytes (the warp writes the 128-byte data record in one coalesced request)
  and lane 0 the fp32 scale ``2^k``; ``indexer_mxfp4``: the amax over the block's 8 lanes
  (butterfly 1..4), :func:`.exact_math.e2m1_scale_byte`, ``e2m1(mul(q, 2^-k))`` by exact
  comparisons (:func:`.exact_math.e2m1_code`); the lane stores its two bytes of code pairs
  and lanes 0, 8, 16, 24 the block's scale byte.

Every lane of the warp must call :meth:`WarpFinish.finish` (shuffles), with the same token.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32

from ....spec.constants import HADAMARD_SCALE
from .postprocess import load_cos_sin, load_weight, normalize, rms_scale, rope_row, rotate_pairs, sum_of_squares
from .exact_math import (
    abs_max_fragment,
    bf16_round_fragment,
    butterfly_max,
    butterfly_sum,
    e2m1_code,
    e2m1_scale_byte,
    fadd,
    fmul,
    pow2_neg_k,
    to_e4m3_fragment,
    ue8m0_scale_byte,
)
from ..config import INDEXER_HEAD_DIM, INDEXER_ROPE_FIRST, IndexerConfig
from .memory import store_fragment, store_scalar

VEC = 4  # channels per lane
ROPE_FIRST_LANE = INDEXER_ROPE_FIRST // VEC  # 16
INV_INDEXER_HEAD_DIM = 2.0**-7  # 1/128, exact
HADAMARD_SCALE_F32 = float(HADAMARD_SCALE)  # h = 128^-1/2 as binary32, 0x3DB504F3 (exact)
MXFP4_BLOCK_LANES = 32 // VEC  # 8 lanes per 32-channel block


def select_fragment(condition, a: cute.Tensor, b: cute.Tensor, n: int) -> cute.Tensor:
    """Element-wise ``a if condition else b`` (a lane-dependent choice, no branch)."""
    out = cute.make_rmem_tensor((n,), Float32)
    for i in range(n):
        out[i] = cutlass.select_(condition, a[i], b[i])
    return out


def hadamard_rotation(z: cute.Tensor, lane) -> cute.Tensor:
    """SPEC §12's seven butterfly stages (spans 64..1, in that order) and the scaling by
    ``h``, on the 128 channels held 4 per lane."""
    out = cute.make_rmem_tensor((VEC,), Float32)
    for i in range(VEC):
        out[i] = z[i]
    for span in (64, 32, 16, 8, 4):  # partner lane l ^ (span / 4), same register
        offset = span // VEC
        upper = (lane & Int32(offset)) != Int32(0)  # this lane holds z[i + span]
        for i in range(VEC):
            mine = out[i]
            other = cute.arch.shuffle_sync_bfly(mine, offset=offset)
            low = cutlass.select_(upper, other, mine)  # z[i]
            high = cutlass.select_(upper, -mine, other)  # lower lane: z[i + S]; upper lane: -z[i + S]
            out[i] = fadd(low, high)
    for span in (2, 1):  # within the lane's 4 channels
        pairs = [(0, 2), (1, 3)] if span == 2 else [(0, 1), (2, 3)]
        for a, b in pairs:
            lo, hi = out[a], out[b]
            out[a] = fadd(lo, hi)
            out[b] = fadd(lo, -hi)
    for i in range(VEC):
        out[i] = fmul(out[i], Float32(HADAMARD_SCALE_F32))
    return out


def indexer_entry_addresses(config: IndexerConfig, mCache: cute.Tensor, slot):
    """Byte addresses ``(data record, scale record)`` of ``slot``'s entry: page ``slot // B``
    (page stride in bytes), data at ``o * data_bytes``, scales at ``B * data_bytes + o * 4``."""
    B = config.entries_per_page
    page = slot // Int64(B)
    offset = slot - page * Int64(B)
    page_base = mCache.iterator.toint() + page * Int64(mCache.stride[0])
    data = page_base + offset * config.data_record_bytes
    scales = page_base + (B * config.data_record_bytes) + offset * 4
    return data, scales


class WarpFinish:
    """The finishing stage of a token held by one warp, 4 channels a lane (both indexer kernels)."""

    def __init__(self, config: IndexerConfig):
        self.config = config

    @cute.jit
    def store_fp8_record(self, data: Int64, scales: Int64, q: cute.Tensor, lane: Int32):
        """``indexer_fp8``: one 128-channel block, E4M3 bytes and the fp32 scale ``2^k``."""
        amax = butterfly_max(abs_max_fragment(q, VEC), 1, 16)
        scale_byte = ue8m0_scale_byte(amax)  # 127 + k, 105..247
        inv = pow2_neg_k(scale_byte)
        scaled = cute.make_rmem_tensor((VEC,), Float32)
        for i in cutlass.range_constexpr(VEC):
            scaled[i] = fmul(q[i], inv)
        store_fragment(to_e4m3_fragment(scaled), data + Int64(lane * VEC), VEC)
        if lane == 0:
            store_scalar(Uint32, scales, scale_byte << Uint32(23))  # the binary32 2^k, little-endian

    @cute.jit
    def store_mxfp4_record(self, data: Int64, scales: Int64, q: cute.Tensor, lane: Int32):
        """``indexer_mxfp4``: four 32-channel blocks (8 lanes each), E2M1 code pairs and UE8M0 bytes."""
        amax = butterfly_max(abs_max_fragment(q, VEC), 1, MXFP4_BLOCK_LANES // 2)
        scale_byte = e2m1_scale_byte(amax)  # 127 + k, 1..253
        inv = pow2_neg_k(scale_byte)  # 2^-k, normal for k in [-126, 126]
        # byte j = code[2j] | code[2j+1] << 4, so channel 4l+i sits at bit 4i of the lane's 16 bits
        packed = e2m1_code(fmul(q[0], inv))
        for i in cutlass.range_constexpr(1, VEC):
            packed = packed | (e2m1_code(fmul(q[i], inv)) << Uint32(4 * i))
        store_scalar(Uint16, data + Int64(lane * 2), packed.to(Uint16))
        if lane % MXFP4_BLOCK_LANES == 0:
            store_scalar(Uint8, scales + Int64(lane // MXFP4_BLOCK_LANES), scale_byte.to(Uint8))

    def inputs(self, mWeight: cute.Tensor, mCosSin: cute.Tensor, lane, position, wanted=None):
        """The lane's 4 norm weights and its 2 RoPE pairs' ``(cos, sin)`` (fp32 fragments), loaded
        before the pooling so that their latency hides behind the state rows' (ptxas sinks
        these loads to their use, after the pooling).

        ``mWeight``: fp32 or bf16 ``[128]``; ``mCosSin``: fp32 ``[max_pos, 64]``, row ``(p // r) * r``.
        Lanes 0..15 (no RoPE) read pair 0's, unused. ``wanted`` (a Boolean): the RoPE pairs are read
        only where it holds (predicated, :func:`.postprocess.load_cos_sin`), undefined elsewhere."""
        ratio = self.config.ratio
        w = load_weight(mWeight, lane * VEC, VEC)
        first_pair = Int32(cutlass.select_(lane >= ROPE_FIRST_LANE, (lane - ROPE_FIRST_LANE) * (VEC // 2), 0))
        cos, sin = load_cos_sin(mCosSin, rope_row(position, ratio), first_pair, VEC // 2, wanted)
        return w, cos, sin

    @cute.jit
    def finish(
        self,
        x: cute.Tensor,  # fp32 (4,): channels 4*lane..4*lane+3 of the compressed vector
        lane: Int32,  # lane index, 0..31
        w: cute.Tensor,  # fp32 (4,): norm weights of those channels
        cos: cute.Tensor,  # fp32 (2,): cos of the lane's RoPE pairs (lanes 16..31)
        sin: cute.Tensor,  # fp32 (2,): sin of them
        mCache: cute.Tensor,  # uint8 [num_pages, B, E]
        slot: Int64,  # kv_slot_mapping[t] >= 0
        eps: Float32,  # rms_norm_eps as binary32
    ):
        """SPEC §12: norm, RoPE, optional Hadamard rotation, quantization and the store of one
        entry, by the 32 lanes of one warp (see the module docstring)."""
        config = self.config
        ss = butterfly_sum(sum_of_squares(x, VEC), 1, 16)
        y = normalize(x, rms_scale(ss, eps, INV_INDEXER_HEAD_DIM), w, VEC)
        z = select_fragment(lane >= ROPE_FIRST_LANE, rotate_pairs(y, VEC, cos, sin), y, VEC)
        if cutlass.const_expr(config.hadamard):
            z = hadamard_rotation(z, lane)
        q = bf16_round_fragment(z)
        data, scales = indexer_entry_addresses(config, mCache, slot)
        if cutlass.const_expr(config.layout == "indexer_fp8"):
            self.store_fp8_record(data, scales, q, lane)
        else:
            self.store_mxfp4_record(data, scales, q, lane)


__all__ = ["WarpFinish", "hadamard_rotation", "indexer_entry_addresses", "INDEXER_HEAD_DIM",
           "HADAMARD_SCALE_F32"]
