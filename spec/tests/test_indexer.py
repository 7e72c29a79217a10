"""SPEC §12, the indexer compressor (head width 128), against independent things: a brute-force
E2M1 nearest-grid search over every binary32 of a range, a float64 Sylvester-Hadamard product,
a float64 ideal of the whole entry, byte positions computed from SPEC §12's text, and the §9
errors (argument named, nothing written)."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import float64_ideal
from dsv4_compressor.spec.formats import E4M3_MAGNITUDES, e2m1_bits, e2m1_to_f32, mxfp4_exponent
from dsv4_compressor.spec.indexer import hadamard_rotate

F32 = np.float32
GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
ENTRY_BYTES = {"indexer_fp8": (128, 4), "indexer_mxfp4": (64, 4)}  # (data record, scale record) per SPEC §12


# ---- E2M1 ------------------------------------------------------------------------------
def _brute_force_e2m1(values: np.ndarray) -> np.ndarray:
    """Nearest grid point by exhaustive distance (float64, exact here), ties to the even code,
    saturation at 6, the sign bit from the binary32 pattern."""
    magnitude = np.abs(values.astype(np.float64))
    distance = np.abs(magnitude[:, None] - GRID[None, :])
    best = distance.min(axis=1, keepdims=True)
    candidates = distance == best  # one or two adjacent codes
    even = candidates & (np.arange(8) % 2 == 0)[None, :]
    code = np.where(even.any(axis=1), np.argmax(even, axis=1), np.argmax(candidates, axis=1))
    code = np.where(magnitude >= 6.0, 7, code)
    sign = (values.view(np.uint32) >> 31).astype(np.uint8) << 3
    return code.astype(np.uint8) | sign


@pytest.mark.slow
def test_e2m1_every_binary32_in_a_range_matches_brute_force():
    """Every binary32 with magnitude in [2^-3, 8) (both signs, 2 x 3 * 2^24 values) in chunks."""
    first, last = int(np.array(0.125, F32).view(np.uint32)), int(np.array(8.0, F32).view(np.uint32))
    chunk = 1 << 21
    for start in range(first, last, chunk):
        bits = np.arange(start, min(start + chunk, last), dtype=np.uint32)
        for signed in (bits, bits | np.uint32(0x80000000)):
            values = signed.view(F32)
            got, want = e2m1_bits(values), _brute_force_e2m1(values)
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)[0]
                pytest.fail(f"e2m1({values[bad]!r}) = {got[bad]:#x}, nearest-grid search gives {want[bad]:#x}")


def test_e2m1_small_huge_and_signed_zeros():
    rng = np.random.default_rng(1)
    tiny = np.concatenate([rng.random(10_000).astype(F32) * F32(0.125), np.array([0.0, 1e-45, 2.0**-126], F32)])
    huge = np.array([6.0, 6.5, 7.0, 100.0, 3.4e38], F32)
    for values in (tiny, -tiny, huge, -huge):
        assert np.array_equal(e2m1_bits(values), _brute_force_e2m1(values))
    assert e2m1_bits(np.array([-0.0], F32))[0] == 0x8
    assert e2m1_bits(np.array([0.0], F32))[0] == 0x0


def test_e2m1_decode_of_encode_is_the_identity_on_the_grid_and_monotone():
    grid = np.concatenate([GRID, -GRID]).astype(F32)
    assert np.array_equal(e2m1_to_f32(e2m1_bits(grid)), grid)
    assert np.array_equal(e2m1_bits(e2m1_to_f32(np.arange(16, dtype=np.uint8))), np.arange(16, dtype=np.uint8))
    ramp = np.linspace(0, 7, 100_001, dtype=F32)
    assert np.all(np.diff(e2m1_to_f32(e2m1_bits(ramp))) >= 0)
    # ties go to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
    assert e2m1_to_f32(e2m1_bits(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_mxfp4_exponent_is_the_smallest_k_with_a_within_6_times_2_to_k():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 0x7F800000, 200_000, dtype=np.uint64).astype(np.uint32)
    amax = np.concatenate([bits.view(F32), np.array([0.0, 6.0, 6.0000005, 3.0, 1e-38, 3.4e38], F32)])
    k = mxfp4_exponent(amax)
    a = np.maximum(amax.astype(np.float64), 6.0 * 2.0**-126)
    assert np.all(a <= 6.0 * np.exp2(k.astype(np.float64)))
    assert np.all(a > 6.0 * np.exp2(k.astype(np.float64) - 1))
    assert k.min() >= -126 and k.max() <= 126


# ---- Hadamard --------------------------------------------------------------------------
def test_hadamard_of_a_unit_vector_is_the_sylvester_column_exactly():
    """Butterflies of a one-hot vector add only zeros: the result is exactly ``h * H[:, j]``."""
    h = np.float64(np.array(0x3DB504F3, np.uint32).view(F32))
    eye = np.eye(128, dtype=F32)
    assert np.array_equal(hadamard_rotate(eye).astype(np.float64), (float64_ideal.sylvester(128) * h).T)


def test_hadamard_matches_the_float64_matrix_product():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((64, 128)).astype(F32)
    ideal = z.astype(np.float64) @ float64_ideal.sylvester(128).T / np.sqrt(128.0)
    got = hadamard_rotate(z).astype(np.float64)
    bound = 8 * 2.0**-24 * np.abs(z.astype(np.float64)).sum(axis=1, keepdims=True) / np.sqrt(128.0) * 8
    assert np.all(np.abs(got - ideal) <= bound)


# ---- the whole operator ----------------------------------------------------------------
def indexer_step(ratio: int, layout: str, seed: int, *, block_size: int | None = None, entries: int = 16):
    rng = np.random.default_rng(seed)
    bs = block_size or B.INDEXER_STATE_BLOCK_SIZE[ratio]
    requests = B.decode_requests(5, ratio, rng, max_entries=6) + [B.chunked_prefill(1, 3 * ratio + 2)]
    batch = B.build_batch(requests, compress_ratio=ratio, block_size=bs, entries_per_page=entries, rng=rng,
                          num_padding=2, padding_at_end=False, drop_entry_fraction=0.2)
    state = B.random_state_cache(batch.num_state_blocks, bs, ratio, rng, row_pad=4, head_dim=128)
    inputs = dict(
        kv_score=B.random_kv_score(batch.num_tokens, ratio, rng, head_dim=128),
        ape=B.random_ape(ratio, rng, head_dim=128),
        weight=B.random_norm_weight(rng, bf16=bool(seed % 2), head_dim=128),
        cos_sin=B.rope_cos_sin_cache(int(batch.positions.max()) + 1),
        k_cache=B.canary_k_cache(layout, batch.num_pages, entries, page_pad_bytes=16),
    )
    return batch, state, inputs


def run_indexer(batch, state, inputs, layout, hadamard):
    spec.save_partial_states(inputs["kv_score"], inputs["ape"], batch.positions, batch.slot_mapping, state, batch.block_size, debug=True)
    spec.compress_norm_rope_store(
        state, batch.token_to_req_indices, batch.positions, batch.slot_mapping, batch.block_table, batch.block_size,
        inputs["weight"], 1e-6, inputs["cos_sin"], inputs["k_cache"], batch.kv_slot_mapping,
        compress_ratio=batch.compress_ratio, layout=layout, hadamard=hadamard, debug=True)


def float64_entry(batch, state, inputs, token: int, hadamard: bool) -> np.ndarray:
    """SPEC §12's z (before bf16) in float64, from the formulas: softmax pooling over the window,
    RMSNorm over 128, RoPE on 64..127, then the normalized Walsh-Hadamard matrix."""
    return float64_ideal.indexer_entry(state, batch, inputs["weight"], 1e-6, inputs["cos_sin"], token, hadamard)


def read_entry(k_cache: np.ndarray, layout: str, slot: int) -> tuple[np.ndarray, np.ndarray]:
    """(data record, scale record) bytes of ``slot``, addressed as SPEC §12 says."""
    data_bytes, scale_bytes = ENTRY_BYTES[layout]
    entries = k_cache.shape[1]
    page, o = divmod(slot, entries)
    base = k_cache.__array_interface__["data"][0] + page * k_cache.strides[0]
    raw = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (entries * (data_bytes + scale_bytes))).from_address(base))
    return raw[o * data_bytes:(o + 1) * data_bytes].copy(), raw[entries * data_bytes + o * scale_bytes:][:scale_bytes].copy()


def dequantize(layout: str, data: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and per-channel scale (float64 [128] each) from the readers' formulas of SPEC §12."""
    if layout == "indexer_fp8":
        scale = float(scales.view("<f4")[0])
        magnitude = E4M3_MAGNITUDES[np.minimum(data & 0x7F, 0x7E)].astype(np.float64)
        return np.where(data & 0x80, -magnitude, magnitude) * scale, np.full(128, scale)
    codes = np.stack([data & 0xF, data >> 4], axis=1).reshape(128)
    magnitude = GRID[codes & 7]
    scale = np.repeat(np.exp2(scales.astype(np.float64) - 127), 32)
    return np.where(codes & 8, -magnitude, magnitude) * scale, scale


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
@pytest.mark.parametrize("ratio", [4, 128])
def test_entries_are_the_float64_ideal_within_the_format_step(ratio, layout, hadamard):
    batch, state, inputs = indexer_step(ratio, layout, seed=ratio + len(layout) + hadamard)
    run_indexer(batch, state, inputs, layout, hadamard)
    assert batch.num_active >= 3
    for t in np.flatnonzero(batch.active):
        ideal = float64_entry(batch, state, inputs, int(t), hadamard)
        data, scales = read_entry(inputs["k_cache"], layout, int(batch.kv_slot_mapping[t]))
        value, scale = dequantize(layout, data, scales)
        if layout == "indexer_fp8":  # 3 mantissa bits: half a step is 2^-4 relative, 2^-10 * scale below 2^-6
            bound = 2.0**-4 * np.abs(ideal) + 2.0**-10 * scale + 2.0**-8 * np.abs(ideal)
            top = 448.0
        else:  # E2M1: half a grid step is at most 1/4 relative above 1, 1/4 absolute below
            bound = 0.25 * np.abs(ideal) + 0.25 * scale + 2.0**-8 * np.abs(ideal)
            top = 6.0
        assert np.all(np.abs(value - ideal) <= bound), (t, np.max(np.abs(value - ideal) - bound))
        blocks = ideal.reshape(-1, 128 if layout == "indexer_fp8" else 32)
        block_scale = scale.reshape(blocks.shape)[:, 0]
        amax = np.abs(blocks).max(axis=1)  # within bf16's half step (and float32 noise) of max |q|
        assert np.all(amax <= top * block_scale * (1 + 2.0**-8))
        assert np.all(amax > top * block_scale / 2 * (1 - 2.0**-8))  # the smallest such power of two


@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
@pytest.mark.parametrize("ratio, block_size", [(4, 16), (4, 3), (128, 8), (128, 5)])
def test_only_the_active_entries_records_are_written(ratio, block_size, layout):
    batch, state, inputs = indexer_step(ratio, layout, seed=7, block_size=block_size)
    k_cache = inputs["k_cache"]
    page_stride, entries = k_cache.strides[0], k_cache.shape[1]
    base = k_cache.__array_interface__["data"][0]
    span = page_stride * batch.num_pages
    memory = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * span).from_address(base))
    before = memory.copy()
    run_indexer(batch, state, inputs, layout, hadamard=True)
    data_bytes, scale_bytes = ENTRY_BYTES[layout]
    expected = np.zeros(span, bool)
    for slot in batch.kv_slot_mapping[batch.active]:
        page, o = divmod(int(slot), entries)
        expected[page * page_stride + o * data_bytes + np.arange(data_bytes)] = True
        expected[page * page_stride + entries * data_bytes + o * scale_bytes + np.arange(scale_bytes)] = True
    changed = memory != before
    assert not np.any(changed & ~expected), "a byte outside the active entries' records changed"
    assert changed.sum() > 0.5 * expected.sum()


def test_the_512_wide_compressor_ignores_nothing_new():
    """``hadamard=False`` is the default and the 512-wide layouts keep their bytes (see test_operator)."""
    rng = np.random.default_rng(0)
    batch = B.build_batch(B.decode_requests(2, 4, rng), compress_ratio=4, block_size=4, entries_per_page=4, rng=rng)
    state = B.random_state_cache(batch.num_state_blocks, 4, 4, rng)
    x = spec.compress(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping, batch.block_table, 4,
                      batch.kv_slot_mapping, compress_ratio=4)
    assert x.shape == (batch.num_tokens, 512)


# ---- SPEC §9 errors ----------------------------------------------------------------------
def _store_args(layout="indexer_fp8", ratio=4):
    batch, state, inputs = indexer_step(ratio, layout, seed=11, entries=4)
    args = [state, batch.token_to_req_indices, batch.positions, batch.slot_mapping, batch.block_table, batch.block_size,
            inputs["weight"], 1e-6, inputs["cos_sin"], inputs["k_cache"], batch.kv_slot_mapping]
    return args, dict(compress_ratio=ratio, layout=layout), inputs["k_cache"]


def _strided_cache(entries: int, entry: int, page_stride: int, entry_stride: int | None = None, num_pages: int = 6):
    flat = np.full(num_pages * max(page_stride, entries * entry) + 64, 0xA5, np.uint8)
    return np.lib.stride_tricks.as_strided(flat, (num_pages, entries, entry), (page_stride, entry_stride or entry, 1))


@pytest.mark.parametrize("change, argument", [
    (dict(layout="flashmla_fp8"), "layout"),  # a 512-wide layout for a 128-wide state
    (dict(layout="bf16"), "layout"),
    (dict(hadamard=1), "hadamard"),
    (dict(hadamard="yes"), "hadamard"),
    (dict(fp8_scale=1.0), "fp8_scale"),
    (dict(rms_norm_weight=np.ones(512, F32)), "rms_norm_weight"),
    (dict(k_cache=_strided_cache(4, 131, 528)), "k_cache"),  # not the entry size
    (dict(k_cache=_strided_cache(4, 132, 512)), "k_cache"),  # page stride < B*E
    (dict(k_cache=_strided_cache(4, 132, 536)), "k_cache"),  # page stride not a multiple of 16
    (dict(k_cache=_strided_cache(4, 132, 1056, entry_stride=264)), "k_cache"),  # entry stride != E
    (dict(k_cache=np.zeros((6, 4, 132), np.uint16)), "k_cache"),
    (dict(k_cache=_strided_cache(4, 68, 272)), "k_cache"),  # an mxfp4 cache for indexer_fp8
])
def test_indexer_errors_name_the_argument_and_write_nothing(change, argument):
    args, kwargs, k_cache = _store_args()
    before = k_cache.copy()
    if "rms_norm_weight" in change:
        args[6] = change.pop("rms_norm_weight")
    if "k_cache" in change:
        args[9] = change.pop("k_cache")
    with pytest.raises(ValueError, match=argument):
        spec.compress_norm_rope_store(*args, **{**kwargs, **change})
    assert np.array_equal(k_cache, before)


def test_hadamard_with_a_512_wide_layout_is_an_error():
    rng = np.random.default_rng(0)
    batch = B.build_batch(B.decode_requests(2, 4, rng), compress_ratio=4, block_size=4, entries_per_page=4, rng=rng)
    state = B.random_state_cache(batch.num_state_blocks, 4, 4, rng)
    k_cache = B.canary_k_cache("flashmla_fp8", batch.num_pages, 4)
    before = k_cache.copy()
    with pytest.raises(ValueError, match="hadamard"):
        spec.compress_norm_rope_store(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping,
                                      batch.block_table, 4, B.random_norm_weight(rng, bf16=False), 1e-6,
                                      B.rope_cos_sin_cache(1024), k_cache, batch.kv_slot_mapping, compress_ratio=4,
                                      hadamard=True)
    with pytest.raises(ValueError, match="layout"):  # an indexer layout for a 512-wide state
        spec.compress_norm_rope_store(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping,
                                      batch.block_table, 4, B.random_norm_weight(rng, bf16=False), 1e-6,
                                      B.rope_cos_sin_cache(1024), k_cache, batch.kv_slot_mapping, compress_ratio=4,
                                      layout="indexer_fp8")
    assert np.array_equal(k_cache, before)


def test_save_infers_the_head_from_ape_and_checks_kv_score():
    rng = np.random.default_rng(0)
    state = B.random_state_cache(4, 16, 4, rng, head_dim=128)
    before = state.copy()
    positions, slots = np.arange(3, dtype=np.int64), np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError, match="kv_score"):
        spec.save_partial_states(B.random_kv_score(3, 4, rng), B.random_ape(4, rng, head_dim=128), positions, slots, state, 16)
    with pytest.raises(ValueError, match="state_cache"):
        spec.save_partial_states(B.random_kv_score(3, 4, rng), B.random_ape(4, rng), positions, slots, state, 16)
    with pytest.raises(ValueError, match="ape"):
        spec.save_partial_states(B.random_kv_score(3, 4, rng, head_dim=128), np.zeros((4, 300), F32), positions, slots, state, 16)
    assert np.array_equal(state, before, equal_nan=True)
    spec.save_partial_states(B.random_kv_score(3, 4, rng, head_dim=128), B.random_ape(4, rng, head_dim=128), positions, slots, state, 16)
    assert not np.array_equal(state, before, equal_nan=True)
