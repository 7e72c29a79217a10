"""SPEC §14.3-§14.7 through the public operations: the latent and the index key against float64
hand formulations, the activity rules, the combined call against the two calls, ``latent=None``,
and canaries (nothing but the named rows and records is ever written)."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.entry_layout import V41_RECORD_LAYOUTS
from dsv4_compressor.spec.formats import bf16_to_f32
from dsv4_compressor.spec.layouts import flashmla_page_bytes
from dsv4_compressor.spec.v41_index_key import normalized_key
from dsv4_compressor.spec.v41_records import store_rotated_entries
from dsv4_compressor.spec.v41_index_key import index_key_entries
from dsv4_compressor.spec.v41_rope import rotate_bf16
import v41_float64 as F

F32 = np.float32
EPS = 1e-6
STORE_LAYOUTS = ["flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4"]
CANARY16 = B.CANARY_BYTE * 0x0101


def _mixed_requests(rng: np.random.Generator) -> list[Request]:
    """Decode tokens at odd and even positions, a prefill chunk from 0, a chunk mid-sequence."""
    return [Request(int(rng.integers(0, 60)), 1) for _ in range(4)] + [Request(0, 9), Request(17, 6)]


def ratio1_step(seed: int, *, bf16_kv: bool = False, entries: int = 4, num_padding: int = 3):
    rng = np.random.default_rng(seed)
    requests = _mixed_requests(rng)
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=1, state=V.paged(),
                          entries_per_page=entries, rng=rng)
    step = V.v41_step(tables, requests, rng=rng, num_padding=num_padding, drop_entry_fraction=0.2)
    kv, _ = V.projections(step.num_tokens, rng, bf16=bf16_kv)
    weight = B.random_norm_weight(rng, bf16=bool(seed % 2))
    return tables, step, kv, weight, B.rope_cos_sin_cache(128)


def _compress1(step, kv, weight, latent):
    spec.v41_compress_norm(kv, None, step.positions, None, None, None, None, None, None, None, weight, EPS,
                           step.kv_slot_mapping, latent, compress_ratio=1)


def _weight64(weight: np.ndarray) -> np.ndarray:
    return F.bits_value(weight) if weight.dtype == np.uint16 else weight.astype(np.float64)


def _input64(values: np.ndarray) -> np.ndarray:
    return F.bits_value(values) if values.dtype == np.uint16 else values.astype(np.float64)


def ideal_latent(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """float64 ``y`` of SPEC §14.3 from the pooled ``x`` (float64 [n, 512]): ``x' = bf16(x)``, then RMSNorm."""
    return F.rms_norm(F.bf16_round(x), _weight64(weight), float(F32(EPS)))


def assert_bf16_of(got_bits: np.ndarray, ideal: np.ndarray, tie: float = 2.0**-20) -> None:
    """``got`` is ``bf16(ideal)`` wherever ``ideal`` is not within ``tie`` (relative) of a bf16 tie,
    and one of the two neighbours there."""
    got = F.bits_value(got_bits)
    near = F.near_bf16_tie(ideal, tie)
    assert np.array_equal(got[~near], F.bf16_round(ideal)[~near])
    assert np.all(np.abs(got - ideal) <= F.bf16_ulp(ideal))


# ---- ratio 1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bf16_kv", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_ratio1_latent_is_bf16_of_the_norm_of_bf16_kv(seed, bf16_kv):
    _, step, kv, weight, _ = ratio1_step(seed, bf16_kv=bf16_kv)
    latent = V.latent_buffer(step.num_tokens)
    _compress1(step, kv, weight, latent)
    active = step.kv_slot_mapping >= 0  # every position is a boundary at ratio 1
    assert 0 < active.sum() < step.num_tokens
    assert_bf16_of(latent[active], ideal_latent(_input64(kv)[active], weight))
    assert np.all(latent[~active] == CANARY16)


def test_ratio1_rounds_the_fp32_kv_to_bf16_before_the_norm():
    """fp32 kv norms as its bf16 rounding: the latent of fp32 kv equals the latent of
    ``bf16(kv)`` given as bf16 (its low bits nudged so that the rounding matters)."""
    _, step, kv, weight, _ = ratio1_step(5)
    nudged = (kv.view(np.uint32) ^ np.uint32(0x1234)).view(F32)  # low bits that the bf16 rounding drops
    assert np.array_equal(_latent_of(step, nudged, weight), _latent_of(step, V.bf16_patterns(nudged), weight))
    # norming the unrounded fp32 vector (SPEC §14.10's vLLM deviation) gives other latents
    active = step.kv_slot_mapping >= 0
    unrounded = F.bf16_round(F.rms_norm(nudged[active].astype(np.float64), _weight64(weight), float(F32(EPS))))
    assert not np.array_equal(F.bits_value(_latent_of(step, nudged, weight)[active]), unrounded)


def _latent_of(step, kv, weight):
    latent = V.latent_buffer(step.num_tokens)
    _compress1(step, kv, weight, latent)
    return latent


@pytest.mark.parametrize("layout", STORE_LAYOUTS)
def test_ratio1_records_hold_the_rotated_latent(layout):
    """End to end: each active token's record is the record of ``rotate(latent)`` at ``cp = p``
    (checked byte by byte for the interleaved records, by dequantization beside the float64
    ideal for all), and nothing else changes."""
    tables, step, kv, weight, cos_sin = ratio1_step(3)
    latent = V.latent_buffer(step.num_tokens)
    _compress1(step, kv, weight, latent)
    k_cache = B.canary_k_cache(layout, tables.num_pages, tables.entries_per_page, page_pad_bytes=16)
    memory = _memory(k_cache, tables.num_pages)
    before = memory.copy()
    scale = 0.5 if layout == "fp8_per_tensor" else None
    spec.v41_rope_quant_store(latent, step.positions, step.kv_slot_mapping, cos_sin, k_cache, compress_ratio=1,
                              layout=layout, fp8_scale=scale)
    active = np.flatnonzero(step.kv_slot_mapping >= 0)
    z = rotate_bf16(latent[active], cos_sin[step.positions[active]])
    ideal = ideal_latent(_input64(kv)[active], weight)
    ideal[:, 448:] = F.rope_pairs(ideal[:, 448:], cos_sin[step.positions[active]])
    for row, t in enumerate(active):
        slot = int(step.kv_slot_mapping[t])
        page, o = divmod(slot, tables.entries_per_page)
        if layout in V41_RECORD_LAYOUTS:
            zt = F.bits_value(z[row])
            record = F.mxfp8_record(zt) if layout == "v41_mxfp8" else F.nvfp4_record(zt)
            assert np.array_equal(k_cache[page, o], record)
        value = _dequantize(k_cache, layout, page, o, scale)
        if layout == "v41_nvfp4":  # half an E2M1 step (1/4 relative, 1/4 sigma near 0), sigma's E4M3 rounding
            tile_amax = np.repeat(np.abs(ideal[row]).reshape(32, 16).max(axis=1), 16)
            bound = 0.25 * np.abs(ideal[row]) + (0.25 / 6 + 2.0**-4) * tile_amax * (1 + 2.0**-6)
        else:  # half an E4M3 step (2^-4 relative) or a bf16 one, the bf16 roundings, the block scale's subnormal floor
            step_size = 2.0**-7 if layout == "bf16" else 2.0**-4
            bound = (step_size + 2.0**-7) * np.abs(ideal[row]) + 2.0**-9 * np.abs(ideal[row]).max()
        assert np.all(np.abs(value - ideal[row]) <= bound), (t, np.max(np.abs(value - ideal[row]) - bound))
    assert _changed_outside(memory, before, k_cache, layout, step.kv_slot_mapping[active]) == 0


def _memory(k_cache: np.ndarray, num_pages: int) -> np.ndarray:
    """Every byte of the cache's pages, padding included (a view)."""
    base = k_cache.__array_interface__["data"][0]
    span = k_cache.strides[0] * num_pages  # strides in bytes
    return np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * span).from_address(base))


def _record_bytes(k_cache: np.ndarray, layout: str, slot: int) -> np.ndarray:
    """Byte offsets (from the cache's base) of the record of ``slot``."""
    entries = k_cache.shape[1]
    page, o = divmod(int(slot), entries)
    stride = k_cache.strides[0]
    if layout == "flashmla_fp8":
        return np.concatenate([page * stride + o * 576 + np.arange(576), page * stride + entries * 576 + o * 8 + np.arange(8)])
    entry = k_cache.shape[2] * k_cache.itemsize
    return page * stride + o * entry + np.arange(entry)


def _changed_outside(memory, before, k_cache, layout, slots) -> int:
    mask = np.zeros(memory.shape, bool)
    for slot in slots:
        mask[_record_bytes(k_cache, layout, slot)] = True
    return int(np.count_nonzero((memory != before) & ~mask))


def _dequantize(k_cache, layout, page, o, fp8_scale) -> np.ndarray:
    """The 512 values of a record, by the readers' formulas of SPEC §7 and §14.5."""
    entry = k_cache[page, o]
    if layout == "bf16":
        return F.bits_value(entry)
    if layout == "fp8_per_tensor":
        return F.E4M3_GRID[entry & 0x7F] * np.where(entry & 0x80, -1.0, 1.0) * fp8_scale
    if layout == "v41_mxfp8":
        codes, scale = entry[:512], np.repeat(np.ldexp(1.0, entry[512:].astype(int) - 127), 32)
        return F.E4M3_GRID[codes & 0x7F] * np.where(codes & 0x80, -1.0, 1.0) * scale
    if layout == "v41_nvfp4":
        codes = np.stack([entry[:256] & 0xF, entry[:256] >> 4], axis=1).reshape(512)
        sigma = np.repeat(F.E4M3_GRID[entry[256:]], 16)
        return F.E2M1_GRID[codes & 7] * np.where(codes & 8, -1.0, 1.0) * sigma
    raw = flashmla_page_bytes(k_cache)[page]
    entries = k_cache.shape[1]
    codes = raw[o * 576:o * 576 + 448]
    scale = np.repeat(np.ldexp(1.0, raw[entries * 576 + o * 8:entries * 576 + o * 8 + 7].astype(int) - 127), 64)
    rope = F.bits_value(raw[o * 576 + 448:(o + 1) * 576].copy().view("<u2"))
    return np.concatenate([F.E4M3_GRID[codes & 0x7F] * np.where(codes & 0x80, -1.0, 1.0) * scale, rope])


@pytest.mark.parametrize("layout", STORE_LAYOUTS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_the_store_writes_boundary_tokens_with_a_slot_only(ratio, layout):
    """``v41_rope_quant_store`` reads the latent of every boundary token with a cache slot (odd
    positions at ratio 2, with or without a state slot), rotating at ``cp = (p // r) * r``."""
    rng = np.random.default_rng(4)
    positions = np.array([0, 1, 2, 3, 6, 7, 9, 9, 0], np.int64)
    kv_slots = np.array([0, 1, 2, 3, 4, 5, -1, 6, -1], np.int64)
    latent = V.bf16_patterns(rng.standard_normal((9, 512)))
    cos_sin = B.rope_cos_sin_cache(16)
    k_cache = B.canary_k_cache(layout, 4, 2)
    before = k_cache.copy()
    scale = 2.0 if layout == "fp8_per_tensor" else None
    spec.v41_rope_quant_store(latent, positions, kv_slots, cos_sin, k_cache, compress_ratio=ratio, layout=layout,
                              fp8_scale=scale)
    stores = (kv_slots >= 0) & ((positions + 1) % ratio == 0)
    want = B.canary_k_cache(layout, 4, 2)
    tokens = np.flatnonzero(stores)
    store_rotated_entries(want, kv_slots[tokens], rotate_bf16(latent[tokens], cos_sin[(positions[tokens] // ratio) * ratio]),
                          layout, None if scale is None else F32(scale))
    assert np.array_equal(k_cache, want)
    unwritten = np.ones(8, bool)
    unwritten[kv_slots[tokens]] = False
    flat, old = k_cache.reshape(8, -1), before.reshape(8, -1)
    if layout != "flashmla_fp8":
        assert np.array_equal(flat[unwritten], old[unwritten])


# ---- the index key --------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_index_key_is_the_bf16_norm_rotated_with_bf16_outputs(ratio, layout):
    rng = np.random.default_rng(6 + ratio)
    requests = _mixed_requests(rng)
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=ratio, state=V.paged(),
                          entries_per_page=4, rng=rng)
    step = V.v41_step(tables, requests, rng=rng, num_padding=2, drop_entry_fraction=0.2)
    k_pre = V.k_pre(step.num_tokens, rng)
    weight = B.random_norm_weight(rng, bf16=ratio == 2, head_dim=128)
    cos_sin = B.rope_cos_sin_cache(128)
    k_cache = B.canary_k_cache(layout, tables.num_pages, 4, page_pad_bytes=16)
    memory = _memory(k_cache, tables.num_pages)
    before = memory.copy()
    spec.v41_index_key_store(k_pre, step.positions, step.kv_slot_mapping, weight, EPS, cos_sin, k_cache,
                             compress_ratio=ratio, layout=layout)
    active = np.flatnonzero((step.kv_slot_mapping >= 0) & ((step.positions + 1) % ratio == 0))
    assert active.size >= 3
    rows = cos_sin[(step.positions[active] // ratio) * ratio]
    w = bf16_to_f32(weight) if weight.dtype == np.uint16 else weight
    z = index_key_entries(k_pre[active], w, F32(EPS), rows)
    kappa_bits = normalized_key(k_pre[active], w, F32(EPS))
    assert_bf16_of(kappa_bits, F.rms_norm(F.bits_value(k_pre[active]), _weight64(weight), float(F32(EPS))))
    assert np.array_equal(z[:, :64], kappa_bits[:, :64])
    rotated = F.rope_pairs(F.bits_value(kappa_bits[:, 64:]), rows)
    a, b = F.bits_value(kappa_bits[:, 64::2]), F.bits_value(kappa_bits[:, 65::2])
    products = np.repeat(np.abs(a * rows[:, :32]) + np.abs(b * rows[:, 32:]), 2, axis=1)
    assert np.all(np.abs(F.bits_value(z[:, 64:]) - rotated) <= F.bf16_ulp(rotated) + products * 2.0**-22)
    entries = k_cache.shape[1]
    raw = _memory(k_cache, tables.num_pages)
    data_bytes = 128 if layout == "indexer_fp8" else 64
    for row, t in enumerate(active):
        page, o = divmod(int(step.kv_slot_mapping[t]), entries)
        base = page * k_cache.strides[0]
        data = raw[base + o * data_bytes: base + (o + 1) * data_bytes]
        scales = raw[base + entries * data_bytes + o * 4: base + entries * data_bytes + o * 4 + 4]
        q = F.bits_value(z[row])
        if layout == "indexer_fp8":
            k = F.smallest_exponent(np.abs(q).max(), 448.0, F.AMIN)
            assert np.array_equal(data, F.e4m3_byte(q * np.ldexp(1.0, -k)))
            assert scales.view("<f4")[0] == np.ldexp(1.0, int(k))
        else:
            k = F.smallest_exponent(np.abs(q.reshape(4, 32)).max(axis=1), 6.0, 6.0 * 2.0**-126)
            codes = F.e2m1_code((q.reshape(4, 32) * np.ldexp(1.0, -k)[:, None]).reshape(128))
            assert np.array_equal(data, (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8))
            assert np.array_equal(scales, (127 + k).astype(np.uint8))
    mask = np.zeros(memory.shape, bool)
    for t in active:
        page, o = divmod(int(step.kv_slot_mapping[t]), entries)
        base = page * k_cache.strides[0]
        mask[base + o * data_bytes + np.arange(data_bytes)] = True
        mask[base + entries * data_bytes + o * 4 + np.arange(4)] = True
    assert not np.any((memory != before) & ~mask)


def test_an_empty_step_and_an_empty_chunk_write_nothing_but_the_active_tokens():
    """T = 0 is a valid call at both ratios; a request with no tokens this step has an empty chunk."""
    empty = np.zeros(0, np.int64)
    latent = V.latent_buffer(0)
    spec.v41_compress_norm(np.zeros((0, 512), F32), None, empty, None, None, None, None, None, None, None,
                           np.ones(512, F32), EPS, empty, latent, compress_ratio=1)
    rng = np.random.default_rng(0)
    tables = V.v41_tables([4, 6, 2], compress_ratio=2, state=V.vllm_ring(), entries_per_page=2, rng=rng)
    step = V.v41_step(tables, [Request(3, 1), Request(4, 0), Request(0, 2)], num_padding=1)
    assert step.query_start_loc.tolist() == [0, 1, 1, 3]
    kv, score = V.projections(step.num_tokens, rng)
    state = V.state_cache(tables.num_state_blocks, 8, rng)
    k_cache = B.canary_k_cache("v41_nvfp4", tables.num_pages, 2)
    latent = V.latent_buffer(step.num_tokens)
    spec.v41_compress_norm_rope_store(kv, score, step.positions, step.token_to_req, step.query_start_loc,
                                      step.slot_mapping, step.save_slot_mapping, tables.block_table, 8, state,
                                      np.ones(512, F32), EPS, B.rope_cos_sin_cache(8), k_cache, step.kv_slot_mapping, latent,
                                      compress_ratio=2, layout="v41_nvfp4", ring_capacity=8, debug=True)
    active = (step.kv_slot_mapping >= 0) & (step.positions % 2 == 1)
    assert active.tolist() == [True, False, True, False]
    assert np.all(latent[~active] == CANARY16) and not np.any(np.all(latent[active] == CANARY16, axis=1))
