"""SPEC §14.4-§14.6 against hand formulations: the NVFP4 scale over every bf16 amax, the records
byte by byte from float64 nearest-on-grid searches, RoPE on the latent (NoPE copied, signed
zeros kept), the records' placement in interleaved pages, and the index key."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec.arithmetic import div, mul
from dsv4_compressor.spec.entry_layout import V41_MXFP8, V41_NVFP4, EntryLayout
from dsv4_compressor.spec.formats import bf16_bits, e4m3_bits, e4m3_to_f32, nvfp4_scale_bits
from dsv4_compressor.spec.layouts import page_bytes, store_records
from dsv4_compressor.spec.v41_records import quantize_mxfp8, quantize_nvfp4, store_rotated_entries
from dsv4_compressor.spec.v41_rope import rotate_bf16
import v41_float64 as F

F32 = np.float32
EVERY_POSITIVE_BF16 = (np.arange(1, 0x7F80, dtype=np.uint32) << np.uint32(16)).view(F32)  # 2^-133 .. 3.39e38


def random_z(n: int, rng: np.random.Generator, *, zero_tile: bool = True) -> np.ndarray:
    """bf16 entries (float32 [n, 512]) of mixed magnitudes: tiles scaled from 2^-20 to 2^20, signed zeros, a zero tile."""
    scale = np.ldexp(1.0, rng.integers(-20, 21, size=(n, 32, 1)))
    z = (rng.standard_normal((n, 32, 16)) * scale).reshape(n, 512)
    z[rng.random(z.shape) < 0.02] = -0.0
    if zero_tile:
        z[:, 16:32] = 0.0
        z[:, 48:64] = -0.0
    return F.bits_value(bf16_bits(z.astype(F32))).astype(F32)


# ---- the NVFP4 scale ------------------------------------------------------------------------
def test_nvfp4_sigma_is_the_e4m3_nearest_to_a_sixth_for_every_bf16_amax():
    """Every positive finite bf16 amax (32,639 values) and zero: the spec's sigma (binary32
    ``div(a, 6)`` rounded to E4M3) equals the E4M3 value nearest to the real ``a / 6``."""
    amax = np.concatenate([[0.0], EVERY_POSITIVE_BF16]).astype(F32)
    assert np.array_equal(nvfp4_scale_bits(amax), F.nvfp4_sigma(amax.astype(np.float64)))
    assert nvfp4_scale_bits(np.array([0.0], F32))[0] == 0x01  # an all-zero tile: 2^-9
    assert nvfp4_scale_bits(np.array([3.0e38], F32))[0] == 0x7E  # saturates to 448


def test_mul_by_the_rounded_sixth_gives_the_same_sigma_for_every_bf16():
    """SPEC §14.5's remark: ``mul(a, fl(1/6))`` gives the ``sigma`` of ``div(a, 6)`` for every bf16 ``a``."""
    a = np.maximum(EVERY_POSITIVE_BF16, F32(6 * 2.0**-9))
    by_division = e4m3_bits(div(a, F32(6.0)))
    by_product = e4m3_bits(mul(a, F32(1.0 / 6.0)))
    assert np.array_equal(by_division, by_product)
    # the binary32 quotients themselves differ for some a: the equality is the E4M3 rounding's
    assert np.count_nonzero(div(a, F32(6.0)) != mul(a, F32(1.0 / 6.0))) > 0


# ---- the records, byte by byte ----------------------------------------------------------------
def test_nvfp4_records_are_the_float64_nearest_on_grid():
    z = random_z(64, np.random.default_rng(0))
    q = quantize_nvfp4(z)
    want = np.stack([F.nvfp4_record(row.astype(np.float64)) for row in z])
    assert np.array_equal(q.packed, want[:, :256])
    assert np.array_equal(q.scale_bytes, want[:, 256:])
    assert np.all(q.scale_bytes[:, 1] == 0x01) and np.all(q.packed[:, 8:16] == 0)  # the +0 tile
    assert np.all(q.scale_bytes[:, 3] == 0x01) and np.all(q.packed[:, 24:32] == 0x88)  # the -0 tile: signs kept


def test_nvfp4_ties_saturation_and_signs_by_hand():
    """One tile: amax 6 gives sigma 1 (0x38), so the codes are e2m1(z) itself."""
    z = np.zeros((1, 512), F32)
    z[0, :16] = [6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.0, 0.0, 1.0, -0.5, 4.0, 3.0]
    q = quantize_nvfp4(z)
    assert q.scale_bytes[0, 0] == 0x38 and e4m3_to_f32(np.uint8(0x38)) == 1.0
    codes = np.stack([q.packed[0, :8] & 0xF, q.packed[0, :8] >> 4], axis=1).reshape(16)
    # 6, -6, 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4, -5 -> -4, -0, 0, 1, -0.5, 4, 3
    assert codes.tolist() == [7, 15, 0, 2, 2, 4, 4, 6, 6, 14, 8, 0, 2, 9, 6, 5]
    # sigma rounded below a / 6 saturates the largest code: 6.1875 / 6 = 1.03 -> sigma 1, 6.1875 -> 6
    z[0, 16] = 6.1875
    q = quantize_nvfp4(z)
    assert q.scale_bytes[0, 1] == 0x38 and (q.packed[0, 8] & 0xF) == 7
    # and above it rounds: 6.5 / 6 = 1.083 -> sigma 1.125, 6.5 / 1.125 = 5.78 -> 6
    z[0, 16] = 6.5
    q = quantize_nvfp4(z)
    assert float(e4m3_to_f32(q.scale_bytes[0, 1])) == 1.125 and (q.packed[0, 8] & 0xF) == 7


def test_mxfp8_records_are_the_float64_nearest_on_grid_and_the_e4m3_path():
    z = random_z(64, np.random.default_rng(1))
    q = quantize_mxfp8(z)
    want = np.stack([F.mxfp8_record(row.astype(np.float64)) for row in z])
    assert np.array_equal(q.codes, want[:, :512]) and np.array_equal(q.scale_bytes, want[:, 512:])
    # the existing E4M3 path, block by block: e4m3(z * 2^-k) with k from the scale byte
    k = q.scale_bytes.astype(np.int64) - 127
    assert np.array_equal(q.codes, e4m3_bits(np.ldexp(z, -np.repeat(k, 32, axis=1).astype(np.int32))))


@pytest.mark.parametrize("layout", ["flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4"])
def test_each_record_of_z_at_its_bytes(layout):
    """Records of ``z`` written through ``store_rotated_entries``, read back at the byte offsets
    SPEC §7/§14.5 give, equal the hand formulation; every other byte keeps the canary."""
    rng = np.random.default_rng(2)
    entries, pages = 3, 4
    z = random_z(5, rng)
    z_bits = bf16_bits(z)
    slots = np.array([0, 4, 5, 11, 7], np.int64)
    k_cache = B.canary_k_cache(layout, pages, entries, page_pad_bytes=16)
    before = k_cache.copy()
    store_rotated_entries(k_cache, slots, z_bits, layout, F32(0.25) if layout == "fp8_per_tensor" else None)
    written = np.zeros(k_cache.shape[:2], bool)
    for t, slot in enumerate(slots):
        page, o = divmod(int(slot), entries)
        written[page, o] = True
        zt = z[t].astype(np.float64)
        if layout in ("v41_mxfp8", "v41_nvfp4"):
            record = F.mxfp8_record(zt) if layout == "v41_mxfp8" else F.nvfp4_record(zt)
            assert np.array_equal(k_cache[page, o], record)
        elif layout == "flashmla_fp8":
            data, scales = F.flashmla_fp8_entry(zt, z_bits[t])
            raw = page_bytes(k_cache, 584)[page]
            assert np.array_equal(raw[o * 576:(o + 1) * 576], data)
            assert np.array_equal(raw[entries * 576 + o * 8:entries * 576 + o * 8 + 8], scales)
        elif layout == "bf16":
            assert np.array_equal(k_cache[page, o], z_bits[t])  # z itself, signed zeros included
        else:
            inverse = np.float64(F32(1.0) / F32(0.25))
            assert np.array_equal(k_cache[page, o], F.e4m3_byte(zt * inverse))
    if layout != "flashmla_fp8":  # (its records are split across the page: checked above, and below for the rest)
        assert np.array_equal(k_cache[~written], before[~written])
    else:
        raw, old = page_bytes(k_cache, 584), page_bytes(before, 584)
        mask = np.zeros(raw.shape, bool)
        for slot in slots:
            page, o = divmod(int(slot), entries)
            mask[page, o * 576:(o + 1) * 576] = mask[page, entries * 576 + o * 8:entries * 576 + o * 8 + 8] = True
        assert np.array_equal(raw[~mask], old[~mask])


@pytest.mark.parametrize("layout, data_bytes, scale_bytes", [(V41_MXFP8, 512, 16), (V41_NVFP4, 256, 32)])
def test_interleaved_records_put_each_tokens_scales_after_its_own_data(layout, data_bytes, scale_bytes):
    assert (layout.entry_bytes, layout.interleaved) == (data_bytes + scale_bytes, True)
    entries = 3
    k_cache = B.canary_k_cache(layout.name, 2, entries)
    assert k_cache.strides[0] % 16 == 0 and k_cache.strides[0] >= entries * layout.entry_bytes
    data = np.full((1, data_bytes), 0x11, np.uint8)
    scales = np.full((1, scale_bytes), 0x22, np.uint8)
    store_records(k_cache, layout, np.array([4], np.int64), data, scales)  # page 1, entry 1
    flat = page_bytes(k_cache, layout.entry_bytes)[1]
    start = layout.entry_bytes  # o * E
    assert np.all(flat[start:start + data_bytes] == 0x11)
    assert np.all(flat[start + data_bytes:start + layout.entry_bytes] == 0x22)
    assert np.all(np.delete(flat, np.arange(start, start + layout.entry_bytes)) == B.CANARY_BYTE)
    split = EntryLayout("split", 512, "uint8", "paged", data_bytes, scale_bytes)  # the same records, split like SPEC §7/§12
    assert int(split.scale_offset(np.int64(1), entries)) == entries * data_bytes + scale_bytes


# ---- RoPE on the latent -----------------------------------------------------------------------
def test_rope_copies_the_nope_channels_and_rounds_each_rotated_value_once():
    rng = np.random.default_rng(3)
    latent = bf16_bits((rng.standard_normal((40, 512)) * 3).astype(F32))
    latent[:, :448][rng.random((40, 448)) < 0.05] = 0x8000  # -0 in NoPE: copied, never rotated to +0
    latent[:, 0:2] = [0x8000, 0xBF80]  # a = -0 beside b = -1: a (1, 0) rotation would give +0
    cos_sin = B.rope_cos_sin_cache(4096)[rng.integers(0, 4096, 40)]
    cos_sin[0] = np.concatenate([np.ones(32), np.zeros(32)]).astype(F32)  # the identity rotation
    z = rotate_bf16(latent, cos_sin)
    assert np.array_equal(z[:, :448], latent[:, :448])
    ideal = F.rope_pairs(F.bits_value(latent[:, 448:]), cos_sin)
    got = F.bits_value(z[:, 448:])
    a, b = F.bits_value(latent[:, 448::2]), F.bits_value(latent[:, 449::2])
    products = np.repeat(np.abs(a * cos_sin[:, :32]) + np.abs(b * cos_sin[:, 32:]), 2, axis=1)
    tie = F.near_bf16_tie(ideal, 2.0**-21) | (products > 64 * np.abs(ideal))  # binary32 rounding decides there
    assert np.array_equal(got[~tie], F.bf16_round(ideal)[~tie])
    assert np.all(np.abs(got - ideal) <= F.bf16_ulp(ideal) + products * 2.0**-22)
    assert np.all(z[:, 0] == 0x8000)
    identity = F32(1.0) * F32(-0.0) - F32(-1.0) * F32(0.0)  # what a (1, 0) rotation of the pair would store
    assert identity == 0 and not np.signbit(identity)
