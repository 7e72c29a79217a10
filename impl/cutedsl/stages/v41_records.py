"""SPEC §14.4-§14.5 in CuTe DSL device code: RoPE on the bf16 latent and the record of the rotated
entry ``z`` in each of the five layouts of ``v41_rope_quant_store``.

Thread ``t`` of a token's 128 holds channels ``4t..4t+3`` of the latent ``l`` (fp32 values that
are bf16). Threads 112..127 hold channels 448..511, the RoPE pairs ``j = 2(t - 112)`` and
``2(t - 112) + 1``: ``z`` is their rotation (SPEC §6's products, :func:`.postprocess.rotate_pair`)
rounded to bf16; threads 0..111 keep ``l`` bit for bit (``-0`` stays ``-0``).

- ``flashmla_fp8``, ``bf16``, ``fp8_per_tensor``: V4's stores (:mod:`.postprocess`) fed ``z``:
  its values are bf16 already, so their ``bf16`` roundings change nothing;
- ``v41_mxfp8`` (E = 528): sixteen blocks of 32 channels (8 threads each): ``amax`` over the
  block (xor butterfly 1..4), the UE8M0 byte (amax floor, 448), ``e4m3(mul(z, 2^-k))``; the
  thread stores its 4 codes, the block's first thread the scale byte at ``512 + g``;
- ``v41_nvfp4`` (E = 288): thirty-two tiles of 16 channels (4 threads each):
  ``a = max(amax, 6 * 2^-9)``, ``sigma = e4m3(div(a, 6))`` (``div.rn``; RNE ``cvt`` with
  saturation), ``code = e2m1(div(z, sigma))`` (a true division: a rounded reciprocal changes
  codes); the thread stores its two bytes of code pairs, the tile's first thread the E4M3 byte
  of ``sigma`` at ``256 + g``.

The two V4.1 records are interleaved: entry ``o`` of a page is the ``E`` bytes at
``page * stride0 + o * E``, its data then its scales (pages 16-byte aligned, ``E`` a multiple of
16). Every thread of the group calls :meth:`RecordStore.store` (the block maxima are shuffles).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32

from ....spec.constants import E2M1_MAX, MXFP8_BLOCK, NOPE_DIM, NVFP4_AMAX_FLOOR, NVFP4_TILE, QUANT_BLOCK
from .exact_math import (abs_max_fragment, bf16_round_fragment, butterfly_max, e2m1_code, fdiv, fmax, to_e4m3_fragment)
from .indexer_entry import select_fragment
from .memory import store_fragment, store_scalar
from .postprocess import (encode_block, entry_addresses, quantize_block, rotate_pairs, store_channels,
                          store_pad_byte, store_scale_byte)
from .v41_rows import VEC

ROPE_FIRST_THREAD = NOPE_DIM // VEC  # 112
FLASHMLA_BLOCK_THREADS = QUANT_BLOCK // VEC  # 16 threads per 64-channel block
MXFP8_BLOCK_THREADS = MXFP8_BLOCK // VEC  # 8 threads per 32-channel block
NVFP4_TILE_THREADS = NVFP4_TILE // VEC  # 4 threads per 16-channel tile
MXFP8_DATA_BYTES = 512  # then 16 scale bytes
NVFP4_DATA_BYTES = 256  # then 32 scale bytes


def rotate_latent(l: cute.Tensor, t, cos: cute.Tensor, sin: cute.Tensor) -> cute.Tensor:
    """SPEC §14.4: thread ``t``'s channels of ``z`` (fp32 ``(4,)``, bf16 values): ``bf16`` of the
    rotated pairs on threads 112..127 (``cos``, ``sin``: fp32 ``(2,)`` of its pairs), ``l`` itself
    on the others."""
    return select_fragment(t >= ROPE_FIRST_THREAD, bf16_round_fragment(rotate_pairs(l, VEC, cos, sin)), l, VEC)


def interleaved_record(mCache: cute.Tensor, slot, entries_per_page: int, entry_bytes: int):
    """Byte address of the interleaved record of ``slot``: ``page * stride0 + o * E``."""
    page = slot // Int64(entries_per_page)
    offset = slot - page * Int64(entries_per_page)
    return mCache.iterator.toint() + page * Int64(mCache.stride[0]) + offset * entry_bytes


def nvfp4_sigma(amax):
    """``(sigma as an E4M3 fragment (1,), sigma as fp32)``: ``e4m3(div(max(amax, 6 * 2^-9), 6))``
    (a positive E4M3 value, at least ``2^-9``, saturating to 448) and its exact binary32 value."""
    quotient = cute.make_rmem_tensor((1,), Float32)
    quotient[0] = fdiv(fmax(amax, Float32(NVFP4_AMAX_FLOOR)), Float32(E2M1_MAX))
    code = to_e4m3_fragment(quotient)
    value = cute.make_rmem_tensor((1,), Float32)
    value.store(code.load().to(Float32))  # exact: every E4M3 value is a binary32
    return code, value[0]


class RecordStore:
    """The store of one record format (a :class:`..v41_config.V41RecordFormat`, fixed per compile)."""

    def __init__(self, record):
        self.record = record

    @cute.jit
    def store_v4_record(self, z: cute.Tensor, t: Int32, mCache: cute.Tensor, slot: Int64, fp8_inv: Float32):
        """SPEC §7's records of ``z``: ``flashmla_fp8`` quantizes the NoPE blocks of ``z`` (16
        threads a block) and stores the RoPE values of ``z`` as bf16; ``bf16`` stores ``z``;
        ``fp8_per_tensor`` ``e4m3(mul(z, inv))`` (neither of those two tells NoPE from RoPE)."""
        fmt = self.record.v4_entry
        first = t * VEC
        data, scales = entry_addresses(fmt, mCache, slot)
        if cutlass.const_expr(fmt.layout == "flashmla_fp8"):
            codes, scale_byte = quantize_block(z, VEC, FLASHMLA_BLOCK_THREADS)  # every thread: shuffles
            if t < ROPE_FIRST_THREAD:
                store_channels(fmt, data, codes, first, VEC, fp8_inv, rope=False)
                if t % FLASHMLA_BLOCK_THREADS == 0:
                    store_scale_byte(scales, t // FLASHMLA_BLOCK_THREADS, scale_byte)
            else:
                store_channels(fmt, data, z, first, VEC, fp8_inv, rope=True)
                if t == ROPE_FIRST_THREAD:
                    store_pad_byte(scales)
        else:
            store_channels(fmt, data, z, first, VEC, fp8_inv, rope=False)

    @cute.jit
    def store_mxfp8(self, z: cute.Tensor, t: Int32, record_address: Int64):
        """``v41_mxfp8`` at ``record_address``: block ``t // 8``'s amax and UE8M0 byte, the thread's
        4 E4M3 codes at ``4t``, the scale byte at ``512 + t // 8`` (the block's first thread)."""
        amax = butterfly_max(abs_max_fragment(z, VEC), 1, MXFP8_BLOCK_THREADS // 2)
        codes, scale_byte = encode_block(z, VEC, amax)
        store_fragment(codes, record_address + Int64(t * VEC), VEC)
        if t % MXFP8_BLOCK_THREADS == 0:
            store_scalar(Uint8, record_address + Int64(MXFP8_DATA_BYTES + t // MXFP8_BLOCK_THREADS),
                         scale_byte.to(Uint8))

    @cute.jit
    def store_nvfp4(self, z: cute.Tensor, t: Int32, record_address: Int64):
        """``v41_nvfp4`` at ``record_address``: tile ``t // 4``'s ``sigma``, the thread's codes
        ``e2m1(div(z, sigma))`` packed two a byte (``code[2j] | code[2j+1] << 4``: channel ``4t+i``
        at bit ``4i`` of the thread's little-endian 16 bits at byte ``2t``), the E4M3 byte of
        ``sigma`` at ``256 + t // 4`` (the tile's first thread)."""
        amax = butterfly_max(abs_max_fragment(z, VEC), 1, NVFP4_TILE_THREADS // 2)
        sigma_code, sigma = nvfp4_sigma(amax)
        packed = e2m1_code(fdiv(z[0], sigma))
        for i in cutlass.range_constexpr(1, VEC):
            packed = packed | (e2m1_code(fdiv(z[i], sigma)) << Uint32(4 * i))
        store_scalar(Uint16, record_address + Int64(t * 2), packed.to(Uint16))
        if t % NVFP4_TILE_THREADS == 0:
            store_fragment(sigma_code, record_address + Int64(NVFP4_DATA_BYTES + t // NVFP4_TILE_THREADS), 1)

    @cute.jit
    def store(self, z: cute.Tensor, t: Int32, mCache: cute.Tensor, slot: Int64, fp8_inv: Float32):
        """SPEC §14.5: thread ``t``'s part of the record of ``z`` at ``slot``; nothing else is
        touched. ``mCache``: uint8 ``[num_pages, B, E]`` (the record layouts), bf16 or
        float8_e4m3fn ``[num_pages, B, 512]``. Every thread of the token's group calls it."""
        record = self.record
        if cutlass.const_expr(record.is_v4_record):
            self.store_v4_record(z, t, mCache, slot, fp8_inv)
        else:
            address = interleaved_record(mCache, slot, record.entries_per_page, record.entry.entry_bytes)
            if cutlass.const_expr(record.layout == "v41_mxfp8"):
                self.store_mxfp8(z, t, address)
            else:
                self.store_nvfp4(z, t, address)


__all__ = ["ROPE_FIRST_THREAD", "RecordStore", "interleaved_record", "nvfp4_sigma", "rotate_latent"]
