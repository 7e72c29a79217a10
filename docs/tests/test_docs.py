"""Keeps docs/ true: figures in sync, links resolving, quoted numbers and messages right.

- The committed SVGs are byte-identical to what ``docs/figures.py`` writes.
- Every relative link (and ``#anchor``) in ``docs/*.md`` resolves.
- Numbers quoted in the prose (UE8M0 bytes, exp2s properties, bf16/E4M3 examples, layout
  offsets, the signed-zero example) are recomputed with ``dsv4_compressor.spec``.
- Every error message quoted in ``errors.md`` is produced by the spec, and vice versa.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.docs import figures
from dsv4_compressor.spec.arithmetic import div, exp2s, tree
from dsv4_compressor.spec.batch import Request, build_batch, canary_k_cache, random_ape, random_kv_score, random_state_cache, rope_cos_sin_cache
from dsv4_compressor.spec.constants import AMAX_FLOOR, DATA_RECORD_BYTES, ENTRY_BYTES
from dsv4_compressor.spec.formats import bf16_bits, e4m3_bits, ue8m0_exponent, ue8m0_scale_byte
from dsv4_compressor.spec.layouts import data_record_offset, page_and_offset, scale_record_offset, store_flashmla_fp8
from dsv4_compressor.spec.pooling import is_boundary
from dsv4_compressor.spec.postprocess import QuantizedNope, rms_norm
from dsv4_compressor.spec.validation import check_store, describe_numpy

DOCS = Path(__file__).resolve().parent.parent
F32 = np.float32


def _f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(F32)[0]


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).view(np.uint32)


# ---- figures ------------------------------------------------------------------------------------
def test_committed_figures_match_the_generator():
    for name, text in figures.render_all().items():
        path = DOCS / "figures" / name
        assert path.is_file(), f"{name} is not committed; run: python -m dsv4_compressor figures"
        assert path.read_bytes() == text.encode("utf-8"), f"{name} is stale; run: python -m dsv4_compressor figures"


def test_figures_command_writes_and_checks(tmp_path):
    parser = argparse.ArgumentParser()
    figures.add_arguments(parser)
    assert figures.run(parser.parse_args(["--out-dir", str(tmp_path)])) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(figures.FIGURES)
    assert figures.run(parser.parse_args(["--out-dir", str(tmp_path), "--check"])) == 0
    (tmp_path / "c4_window.svg").write_text("stale")
    assert figures.run(parser.parse_args(["--out-dir", str(tmp_path), "--check"])) == 1


def test_figures_are_well_formed_svg():
    import xml.etree.ElementTree as ET

    for name, text in figures.render_all().items():
        root = ET.fromstring(text.encode("utf-8"))
        assert root.tag.endswith("svg"), name


# ---- links --------------------------------------------------------------------------------------
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def test_relative_links_resolve():
    pages = sorted(DOCS.glob("*.md"))
    assert {p.name for p in pages} >= {"README.md", "arithmetic.md", "layouts.md", "errors.md", "deviations.md"}
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_figure_is_referenced():
    text = "".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    for name in figures.FIGURES:
        assert f"figures/{name}" in text, name


# ---- arithmetic.md ------------------------------------------------------------------------------
def _scale_floor_byte(amax: np.ndarray) -> np.ndarray:
    """vLLM CuTe DSL's rule: ceil(log2(max(amax/448, 1e-4))) + 127, via the exponent bits."""
    scale = np.maximum(div(np.asarray(amax, dtype=F32), F32(448.0)), F32(1e-4))
    return ((_bits(scale) + np.uint32(0x7FFFFF)) >> np.uint32(23)).astype(np.int64)


@pytest.mark.parametrize("amax, k, byte, floor_byte", [
    (0.0, -22, 105, 114), (1e-6, -22, 105, 114), (1e-4, -22, 105, 114), (0.001, -18, 109, 114),
    (0.02734375, -14, 113, 114), (0.02746582, -13, 114, 114), (1.0, -8, 119, 119), (1.75, -8, 119, 119),
    (1.7578125, -7, 120, 120), (448.0, 0, 127, 127),
])
def test_ue8m0_examples(amax, k, byte, floor_byte):
    got = int(ue8m0_exponent(F32(amax)))
    assert got == k
    assert int(ue8m0_scale_byte(got)) == byte
    assert int(_scale_floor_byte(F32(amax))) == floor_byte


def test_ue8m0_numbers_in_the_text():
    assert float(AMAX_FLOOR) == 9.999999747378752e-05
    assert int(np.ceil(np.log2(float(AMAX_FLOOR) / 448))) == -22
    assert int(np.ceil(np.log2(1e-4))) == -13
    assert 448 * 2.0**-14 == 0.02734375
    assert float(np.nextafter(np.float64(0.02734375), 1)) > 0.02734375
    assert _f32(0x3CE10000) == F32(0.0274658203125)  # the next bf16 above 448*2^-14, quoted as 0.02746582
    assert int(ue8m0_exponent(F32(3.4028235e38))) == 120 and int(ue8m0_scale_byte(120)) == 247


def test_ue8m0_formulations_agree_on_every_bf16_and_a_binary32_sample():
    every_bf16 = (np.arange(0, 0x7F80, dtype=np.uint32) << np.uint32(16)).view(F32)
    rng = np.random.default_rng(0)
    sample = rng.integers(0x38D1B717, 0x7F800000, size=200_000, dtype=np.uint32).view(F32)
    for amax in (every_bf16, sample):
        k = ue8m0_exponent(amax)
        quotient = div(np.maximum(amax, AMAX_FLOOR), F32(448.0))
        by_bits = ((_bits(quotient) + np.uint32(0x7FFFFF)) >> np.uint32(23)).astype(np.int64) - 127
        assert np.array_equal(k, by_bits)
        a = np.maximum(amax, AMAX_FLOOR).astype(np.float64)
        assert np.all(a <= 448.0 * np.ldexp(1.0, k)) and np.all(a > 448.0 * np.ldexp(1.0, k - 1))
    # the scale floor differs exactly on blocks with amax <= 448 * 2^-14
    differs = ue8m0_scale_byte(ue8m0_exponent(every_bf16)).astype(np.int64) != _scale_floor_byte(every_bf16)
    assert np.array_equal(differs, every_bf16 <= F32(0.02734375))


def test_exp2s_claims():
    assert exp2s(np.array([0.0, -0.0], F32)).tolist() == [1.0, 1.0]
    assert exp2s(np.array([-126.0], F32))[0] == F32(2.0**-126)
    assert exp2s(np.array([np.nextafter(F32(-126.0), F32(-127.0)), -np.inf], F32)).tolist() == [0.0, 0.0]
    # never subnormal: every non-zero result near the cut-off is normal
    near = np.linspace(-126.0, -124.0, 100_001).astype(F32)
    values = exp2s(near)
    assert values.min() == F32(2.0**-126)
    # the 1.5*2^23 trick is rint (ties to even), and its bits give 2^j
    rng = np.random.default_rng(1)
    x = np.concatenate([(-rng.random(500_000) * 126).astype(F32), -np.arange(0, 253, dtype=F32) / F32(2)])
    magic = F32(12582912.0)
    t = (x + magic).astype(F32)
    j = (t - magic).astype(F32)
    assert np.array_equal(j, np.rint(x))
    pow2_bits = ((_bits(t) << np.uint32(23)) + np.uint32(0x3F800000)).astype(np.uint32)
    assert np.array_equal(pow2_bits.view(F32), np.ldexp(F32(1.0), j.astype(np.int32)).astype(F32))
    clamped = np.array([-127.0], F32) + magic
    assert ((_bits(clamped) << np.uint32(23)) + np.uint32(0x3F800000)).astype(np.uint32)[0] == 0
    # accuracy: at most 1.23 ulp on a sample
    x = (-rng.random(1_000_000) * 126).astype(F32)
    exact = np.exp2(x.astype(np.float64))
    ulp = np.ldexp(1.0, np.floor(np.log2(exact)).astype(np.int64) - 23)
    assert np.max(np.abs(exp2s(x).astype(np.float64) - exact) / ulp) <= 1.2272


@pytest.mark.parametrize("bits, expected", [
    (0x3F808000, 0x3F80), (0x3F818000, 0x3F82), (0x3F80C000, 0x3F81), (0x3FFF8000, 0x4000), (0x80000000, 0x8000),
])
def test_bf16_examples(bits, expected):
    assert int(bf16_bits(np.array([_f32(bits)]))[0]) == expected


@pytest.mark.parametrize("value, byte", [
    (1.0625, 0x38), (1.1875, 0x3A), (2.0**-10, 0x00), (3 * 2.0**-10, 0x02), (500.0, 0x7E), (-(2.0**-11), 0x80),
    (-0.0, 0x80), (448.0, 0x7E), (464.0, 0x7E), (2.0**-6, 0x08), (2.0**-9, 0x01), (-500.0, 0xFE),
])
def test_e4m3_examples(value, byte):
    assert int(e4m3_bits(F32(value))) == byte


def test_tree_is_the_xor_butterfly_with_increasing_offsets_not_decreasing():
    rng = np.random.default_rng(2)
    v = (rng.standard_normal((2000, 32)) * np.ldexp(1.0, rng.integers(-20, 20, (2000, 32)))).astype(F32)

    def butterfly(values, offsets):
        lanes = values.copy()
        for offset in offsets:
            partner = lanes[:, np.arange(32) ^ offset]
            lanes = (lanes + partner).astype(F32)
        assert np.all(lanes == lanes[:, :1])  # every lane ends with the same bits
        return lanes[:, 0]

    assert np.array_equal(butterfly(v, (1, 2, 4, 8, 16)), tree(v, axis=1))
    bit_reversed = np.array([int(f"{lane:05b}"[::-1], 2) for lane in range(32)])
    assert np.array_equal(butterfly(v[:, bit_reversed], (16, 8, 4, 2, 1)), tree(v, axis=1))
    assert not np.array_equal(butterfly(v, (16, 8, 4, 2, 1)), tree(v, axis=1))


def test_signed_zero_of_the_first_c4_window():
    """kv = -0 in all four tokens of group 0 (half 1): the spec stores 0x00, skipping would store 0x80."""
    rng = np.random.default_rng(0)
    kv_score = rng.standard_normal((4, 2048)).astype(F32)
    kv_score[:, 512 + 5] = F32(-0.0)
    positions = np.arange(4, dtype=np.int64)
    slots = positions + 4  # state block 1
    state = np.full((2, 4, 2048), np.nan, F32)
    spec.save_partial_states(kv_score, np.zeros((4, 1024), F32), positions, slots, state, 4)
    block_table = np.array([[1, 0]], np.int32)
    requests = np.zeros(4, np.int32)
    kv_slots = np.array([-1, -1, -1, 0], np.int64)
    x = spec.compress(state, requests, positions, slots, block_table, 4, kv_slots, compress_ratio=4)
    assert x[3, 5] == 0 and not np.signbit(x[3, 5])
    e = exp2s(np.zeros(4, F32))  # any e: the four u of channel 5 are -0
    u = (state[1, :, 512 + 5] * e).astype(F32)
    assert np.signbit(tree(u)) and not np.signbit(tree(np.concatenate([np.zeros(4, F32), u])))
    k_cache = canary_k_cache("flashmla_fp8", 1, 2)
    spec.compress_norm_rope_store(state, requests, positions, slots, block_table, 4, np.ones(512, F32), 1e-6,
                                  rope_cos_sin_cache(8), k_cache, kv_slots, compress_ratio=4)
    assert k_cache[0, 0, 5] == 0x00


def test_rms_norm_overflow_gives_zeros():
    x = np.full((1, 512), 1e19, F32)
    with np.errstate(over="ignore"):
        y = rms_norm(x, np.ones(512, F32), F32(1e-6))
    assert np.all(y == 0)


# ---- README.md and layouts.md -------------------------------------------------------------------
def test_readme_prefill_example():
    assert np.flatnonzero(is_boundary(np.arange(10), 4)).tolist() == [3, 7]
    assert (np.array([3, 7]) // 4).tolist() == [0, 1]


@pytest.mark.parametrize("entries, stride", [(1, 1152), (2, 1728), (4, 2880), (64, 37440)])
def test_engine_page_strides(entries, stride):
    k_cache = canary_k_cache("flashmla_fp8", 2, entries)
    assert k_cache.strides[0] == stride
    assert stride - entries * ENTRY_BYTES == {1: 568, 2: 560, 4: 544, 64: 64}[entries]


def test_flashmla_slot_example():
    entries = 64
    k_cache = canary_k_cache("flashmla_fp8", 3, entries)
    slots = np.array([130], np.int64)
    page, offset = page_and_offset(slots, entries)
    assert (int(page[0]), int(offset[0])) == (2, 2)
    stride = k_cache.strides[0]
    assert stride * 2 + int(data_record_offset(offset)[0]) == 76032
    assert stride * 2 + int(scale_record_offset(offset, entries)[0]) == 111760
    before = np.lib.stride_tricks.as_strided(k_cache, (3 * stride,), (1,)).copy()
    nope = QuantizedNope(codes=np.full((1, 448), 0x11, np.uint8), scale_bytes=np.full((1, 7), 0x77, np.uint8),
                         amax=np.zeros((1, 7), F32))
    store_flashmla_fp8(k_cache, slots, nope, np.full((1, 64), 0x2222, np.uint16))
    after = np.lib.stride_tricks.as_strided(k_cache, (3 * stride,), (1,))
    changed = np.flatnonzero(before != after)
    expected = np.concatenate([np.arange(76032, 76032 + DATA_RECORD_BYTES), np.arange(111760, 111768)])
    assert np.array_equal(changed, expected)
    assert after[111767] == 0  # the pad byte


def test_fp8_per_tensor_reciprocal_example():
    assert div(F32(1.0), F32(0.02)) == F32(50.0)
    assert float(F32(0.02)) == 0.019999999552965164


# ---- errors.md ----------------------------------------------------------------------------------
def _valid():
    rng = np.random.default_rng(0)
    b = build_batch([Request(0, 8)], compress_ratio=4, block_size=4, entries_per_page=2, rng=rng)
    state = random_state_cache(b.num_state_blocks, 4, 4, rng)
    save = dict(kv_score=random_kv_score(b.num_tokens, 4, rng), ape=random_ape(4, rng), positions=b.positions,
                slot_mapping=b.slot_mapping, state_cache=state, block_size=4)
    store = dict(state_cache=state, token_to_req_indices=b.token_to_req_indices, positions=b.positions,
                 slot_mapping=b.slot_mapping, block_table=b.block_table, block_size=4,
                 rms_norm_weight=np.ones(512, F32), rms_norm_eps=1e-6, cos_sin_cache=rope_cos_sin_cache(16),
                 k_cache=canary_k_cache("flashmla_fp8", b.num_pages, 2), kv_slot_mapping=b.kv_slot_mapping, compress_ratio=4)
    return b, save, store


def _aligned(nbytes: int, dtype) -> np.ndarray:
    raw = np.zeros(nbytes + 64, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 64
    return raw[start:start + nbytes].view(dtype)


def _strided_state(num_blocks, *, row=2048, last=1, offset=0, s0=None):
    base = _aligned(4 * (num_blocks * 4 * max(row, 2048) * last + 64), F32)
    return np.lib.stride_tricks.as_strided(base[offset:], (num_blocks, 4, 2048), ((s0 or 4 * row) * 4, row * 4, last * 4))


def _paged(stride, strides1=584, pages=3, entries=2):
    base = _aligned(pages * stride + 1024, np.uint8)
    return np.lib.stride_tricks.as_strided(base, (pages, entries, 584), (stride, strides1, 1))


def _step(save: dict, store: dict) -> dict:
    """The ``compress_and_save`` call of the same step: one request of 8 tokens, every token saved."""
    kv_score = save["kv_score"]
    return dict(kv=kv_score[:, :1024], score=kv_score[:, 1024:], ape=save["ape"], positions=store["positions"],
                token_to_req=store["token_to_req_indices"], query_start_loc=np.array([0, 8], np.int32),
                slot_mapping=store["slot_mapping"], save_slot_mapping=store["slot_mapping"], block_table=store["block_table"],
                bs=4, state_cache=store["state_cache"], rms_norm_weight=store["rms_norm_weight"], rms_norm_eps=1e-6,
                cos_sin_cache=store["cos_sin_cache"], k_cache=store["k_cache"], kv_slot_mapping=store["kv_slot_mapping"],
                compress_ratio=4)


def _changed(array: np.ndarray, index, value) -> np.ndarray:
    """A copy of ``array`` with ``array[index] = value`` (one broken entry of a valid call's array)."""
    changed = array.copy()
    changed[index] = value
    return changed


def _state_format_cases(b) -> list[tuple[str, dict]]:
    """One broken call per SPEC §13 check documented in errors.md."""
    bf16_state = np.lib.stride_tricks.as_strided(_aligned(2 * b.num_state_blocks * 4 * 2052 + 64, np.uint16),
                                                 (b.num_state_blocks, 4, 2048), (4 * 2052 * 2, 2052 * 2, 2))
    kv_rows = np.lib.stride_tricks.as_strided(_aligned(4 * 9 * 1026, F32), (8, 1024), (1026 * 4, 4))
    unaligned = _aligned(4 * (8 * 1024 + 4), F32)[1:1 + 8 * 1024].reshape(8, 1024)
    positions_6 = _changed(b.positions, 5, 6)
    req_1 = _changed(b.token_to_req_indices, 3, 1)
    kv_1 = _changed(b.kv_slot_mapping, 7, 1)
    slot_none = _changed(b.slot_mapping, 7, -1)
    return [
        ("store", dict(state_cache=bf16_state)),
        ("store", dict(ape_at="pool")),
        ("save", dict(ape=None)),
        ("store", dict(ape_at="compress")),
        ("step", dict(ape=None)),
        ("step", dict(ape=np.zeros((4, 512), F32))),
        ("save", dict(ape_at="compress", kv_score=np.zeros((8, 1536), F32))),
        ("store", dict(ring_capacity=6)),
        ("store", dict(ring_capacity=16)),
        ("step", dict(kv=np.zeros((8, 2048), F32))),
        ("step", dict(kv=kv_rows)),
        ("step", dict(score=unaligned)),
        ("step", dict(query_start_loc=np.array([0, 4, 8], np.int32))),
        ("step!", dict(query_start_loc=np.array([0, 9], np.int32))),
        ("step!", dict(token_to_req=req_1)),
        ("step!", dict(positions=positions_6)),
        ("step!", dict(query_start_loc=np.array([0, 7], np.int32), slot_mapping=slot_none, save_slot_mapping=slot_none,
                       kv_slot_mapping=kv_1)),
    ]


def _error_messages() -> list[str]:
    """The messages of one broken call per documented check (argument checks, then debug checks)."""
    b, save, store = _valid()
    n = b.num_state_blocks
    bt_99 = _changed(b.block_table, (0, 1), 99)
    kv_6 = _changed(b.kv_slot_mapping, 7, 6)
    kv_dup = _changed(b.kv_slot_mapping, 7, 4)
    req_1 = _changed(b.token_to_req_indices, 3, 1)
    slot_dup = _changed(b.slot_mapping, 1, b.slot_mapping[0])
    slot_far = _changed(b.slot_mapping, 1, 1000)
    negative = _changed(b.positions, 0, -2)
    overlapping_bf16 = np.lib.stride_tricks.as_strided(_aligned(4096, np.uint16), (2, 2, 512), (0, 1024, 2))
    cases = [
        ("store", dict(positions=list(range(8)))),
        ("store", dict(positions=b.positions.astype(np.int32))),
        ("store", dict(block_table=b.block_table[0])),
        ("store", dict(kv_slot_mapping=b.kv_slot_mapping[:-1])),
        ("store", dict(block_size=0)),
        ("store", dict(state_cache=_strided_state(n, row=4096, last=2))),
        ("store", dict(state_cache=store["state_cache"].astype(np.float64))),
        ("store", dict(compress_ratio=128)),
        ("store", dict(block_size=8)),
        ("store", dict(state_cache=_strided_state(n, row=2050))),
        ("store", dict(state_cache=_strided_state(n, s0=4096))),
        ("store", dict(state_cache=_strided_state(n, offset=1))),
        ("save", dict(ape=save["ape"][:2])),
        ("save", dict(slot_mapping=b.slot_mapping.astype(np.int32))),
        ("save", dict(kv_score=save["kv_score"][:-1])),
        ("save", dict(kv_score=save["kv_score"][:, :1024])),
        ("store", dict(compress_ratio=64)),
        ("store", dict(layout="fp8")),
        ("store", dict(layout="indexer_fp8")),
        ("store", dict(hadamard=1)),
        ("store", dict(hadamard=True)),
        ("store", dict(rms_norm_weight=np.ones(512, np.float16))),
        ("store", dict(rms_norm_weight=np.ones(448, F32))),
        ("store", dict(rms_norm_eps=1e-50)),
        ("store", dict(cos_sin_cache=rope_cos_sin_cache(16)[:, :32])),
        ("store", dict(k_cache=store["k_cache"][:, :, :576])),
        ("store", dict(k_cache=_paged(2 * 584 + 8))),
        ("store", dict(k_cache=_paged(2 * 600, strides1=600))),
        ("store", dict(layout="bf16", k_cache=overlapping_bf16)),
        ("store", dict(layout="fp8_per_tensor", k_cache=canary_k_cache("fp8_per_tensor", 2, 2))),
        ("store", dict(fp8_scale=0.5)),
        ("save!", dict(positions=negative)),
        ("save!", dict(slot_mapping=slot_far)),
        ("save!", dict(slot_mapping=slot_dup)),
        ("store!", dict(token_to_req_indices=req_1)),
        ("store!", dict(block_table=b.block_table[:, :1])),
        ("store!", dict(block_table=bt_99)),
        ("store!", dict(kv_slot_mapping=kv_6)),
        ("store!", dict(cos_sin_cache=rope_cos_sin_cache(4))),
        ("store!", dict(kv_slot_mapping=kv_dup)),
    ]
    cases += _state_format_cases(b)
    functions = {"save": spec.save_partial_states, "store": spec.compress_norm_rope_store, "step": spec.compress_and_save}
    messages = []
    for operation, changes in cases:
        _, save, store = _valid()
        call = dict({"save": save, "store": store, "step": _step(save, store)}[operation.rstrip("!")], **changes)
        with pytest.raises(ValueError) as error:
            functions[operation.rstrip("!")](**call, debug=operation.endswith("!"))
        messages.append(str(error.value))
    # the device check of the torch front ends, through the shared validation
    _, _, store = _valid()
    on_gpu = lambda name, a: dataclasses.replace(describe_numpy(name, a), device="cuda:0")  # noqa: E731
    with pytest.raises(ValueError) as error:
        check_store(on_gpu("rms_norm_weight", store["rms_norm_weight"]), 1e-6, on_gpu("cos_sin_cache", store["cos_sin_cache"]),
                    describe_numpy("k_cache", store["k_cache"]), "flashmla_fp8", None, on_gpu("state_cache", store["state_cache"]))
    messages.append(str(error.value))
    return messages


def _documented_messages() -> list[str]:
    text = (DOCS / "errors.md").read_text(encoding="utf-8")
    return [m for m in re.findall(r"`([^`\n]+)`", text) if re.match(r"^(debug check: |\w+: expected )", m)]


def _pattern(documented: str) -> re.Pattern:
    return re.compile("".join(".*" if ch == "…" else re.escape(ch) for ch in documented) + "$")


def test_error_messages_are_documented_verbatim():
    documented = _documented_messages()
    patterns = [_pattern(m) for m in documented]
    produced = _error_messages()
    for message in produced:
        assert any(p.match(message) for p in patterns), f"not in errors.md: {message}"
    for doc, pattern in zip(documented, patterns):
        assert any(pattern.match(m) for m in produced), f"errors.md quotes a message no check produces: {doc}"


def test_tiny_but_positive_eps_is_accepted():
    _, _, store = _valid()
    spec.compress_norm_rope_store(**{**store, "rms_norm_eps": 1e-45})
    assert F32(1e-50) == 0 and F32(1e-45) > 0


# ---- indexer.md -----------------------------------------------------------------------------------
def test_indexer_numbers():
    from dsv4_compressor.spec.entry_layout import INDEXER_FP8, INDEXER_MXFP4
    from dsv4_compressor.spec.formats import e2m1_bits, e2m1_to_f32, mxfp4_exponent

    text = (DOCS / "indexer.md").read_text(encoding="utf-8")
    assert "`E = 132`" in text and "`E = 68`" in text
    assert (INDEXER_FP8.entry_bytes, INDEXER_MXFP4.entry_bytes) == (132, 68)
    assert ue8m0_exponent(np.array([448.0, 449.0, 0.0], F32)).tolist() == [0, 1, -22]
    assert mxfp4_exponent(np.array([6.0, np.nextafter(F32(6), F32(7)), 3.0, 0.0], F32)).tolist() == [0, 1, -1, -126]
    ties = {"0.25": 0, "0.75": 1, "1.25": 1, "1.75": 2, "2.5": 2, "3.5": 4, "5": 4}
    for value, rounded in ties.items():
        assert f"{value} → {rounded}" in text
        assert e2m1_to_f32(e2m1_bits(np.array([float(value)], F32)))[0] == rounded
    assert e2m1_bits(np.array([-0.0], F32))[0] == 0x8 and "`0x8`" in text
    assert "0x3DB504F3" in text


# ---- state-formats.md ------------------------------------------------------------------------------
def test_state_formats_numbers():
    from dsv4_compressor.spec.arithmetic import add
    from dsv4_compressor.spec.formats import bf16

    text = (DOCS / "state-formats.md").read_text(encoding="utf-8")
    score, ape = _f32(0x3F808000), F32(2.0**-9)
    assert float(score) == 1.00390625 and "`1.00390625` (`0x3F808000`)" in text
    assert int(bf16_bits(score)) == 0x3F80 and int(bf16_bits(F32(1.0078125))) == 0x3F81
    assert float(add(score, ape)) == 1.005859375 and float(bf16(add(score, ape))) == 1.0078125
    assert float(add(bf16(score), ape)) == 1.001953125
    assert "`bf16(1.005859375) = 1.0078125`" in text and "`add(1.0, 0.001953125) = 1.001953125`" in text


# ---- the project speaks of itself alone ---------------------------------------------------------
_REPOSITORY = DOCS.parent
_PROCESS_WORDS = {
    "a numbered work item": re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    "a process word": re.compile(r"(?<!\w)s[e]ssions?\b", re.IGNORECASE),
    "a direction word": re.compile(r"\bst[e]ering\b", re.IGNORECASE),
    "a path outside the repository": re.compile(r"(?<![\w.])(shared|/work|/tmp)/"),
    "a table known by a letter": re.compile(r"(?<!block )\b[Tt]ables?\s+[A-Z](?:\s*(?:,|and)\s*[A-Z])*\b(?![\w-])"),
    "a heading numbered by a letter": re.compile(r"^#+\s+[A-Z](?:,\s*[A-Z])*\.\s", re.MULTILINE),
}


def _user_facing_pages() -> list[Path]:
    """docs/*.md (SPEC.md is a verbatim copy of the normative text and is left out), plus the
    README and bench/RESULTS.md where they exist (a source checkout; an install ships docs/ only)."""
    pages = [p for p in sorted(DOCS.glob("*.md")) if p.name != "SPEC.md"]
    pages += [p for p in (_REPOSITORY / "README.md", _REPOSITORY / "bench" / "RESULTS.md") if p.is_file()]
    return pages


def test_user_facing_text_has_no_process_words_or_outside_paths():
    found = []
    for page in _user_facing_pages():
        text = page.read_text(encoding="utf-8")
        for what, pattern in _PROCESS_WORDS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{page.name}:{line}: {what}: {match.group(0)!r}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text, caught", [
    ("see " + "issue" + " 6's targets", True), ("the fourth " + "sess" + "ion", True), ("copied from the " + "steer" + "ing repo", True),
    ("see " + "shared" + "/CUTEDSL.md", True), ("table Q and tables D, E", True), ("### B, C. Stream kernel", True),
    ("bench/gpu_" + "sess" + "ion.sh runs it", False), ("shared memory", False), ("the block table T rows", False),
    ("a table of results", False), ("issued loads", False),
])
def test_the_process_word_patterns(text, caught):
    assert any(p.search(text) for p in _PROCESS_WORDS.values()) == caught


# ---- v41.md ---------------------------------------------------------------------------------------
def test_v41_numbers():
    from dsv4_compressor.spec.arithmetic import mul
    from dsv4_compressor.spec.entry_layout import V41_MXFP8, V41_NVFP4
    from dsv4_compressor.spec.formats import e2m1_bits, e4m3_to_f32, nvfp4_scale_bits

    text = (DOCS / "v41.md").read_text(encoding="utf-8")
    assert "`E = 528`" in text and "`E = 288`" in text
    assert (V41_MXFP8.entry_bytes, V41_NVFP4.entry_bytes) == (528, 288)
    assert V41_MXFP8.interleaved and V41_NVFP4.interleaved
    assert int(nvfp4_scale_bits(F32(0.0))) == 0x01 and "byte `0x01`" in text
    assert float(e4m3_to_f32(nvfp4_scale_bits(F32(6.1875)))) == 1.0 and int(e2m1_bits(F32(6.1875))) == 7
    assert 6 * 448 == 2688 and int(nvfp4_scale_bits(F32(2688.0 * 1.5))) == 0x7E
    # the rounded reciprocal: 2.34375 / 1.875 = 1.25 (a tie, code 2) against 1.2500001 (code 3)
    sigma = F32(1.875)
    assert div(F32(2.34375), sigma) == F32(1.25) and int(e2m1_bits(div(F32(2.34375), sigma))) == 2
    product = mul(F32(2.34375), div(F32(1.0), sigma))
    assert product == np.nextafter(F32(1.25), F32(2)) and int(e2m1_bits(product)) == 3
    z = (np.arange(1, 0x7F80, dtype=np.uint32) << np.uint32(16)).view(F32)
    differs = 0
    for code in range(1, 0x7F):
        s = e4m3_to_f32(np.uint8(code))
        values = z[z <= F32(6.5) * s]  # a tile's values: |z| <= a < 6.5 sigma
        differs += int(np.count_nonzero(e2m1_bits(div(values, s)) != e2m1_bits(mul(values, div(F32(1.0), s)))))
    assert differs == 42 and "42 bf16 values" in text


def _v41_error_messages() -> list[str]:
    from dsv4_compressor.spec import v41_batch as V

    rng = np.random.default_rng(0)
    positions = np.arange(5, dtype=np.int64)
    ratio1 = dict(kv=V.projections(5, rng)[0], score=None, positions=positions, token_to_req=None, query_start_loc=None,
                  slot_mapping=None, save_slot_mapping=None, block_table=None, bs=None, state_cache=None,
                  rms_norm_weight=np.ones(512, F32), rms_norm_eps=1e-6, cos_sin_cache=rope_cos_sin_cache(8),
                  k_cache=canary_k_cache("v41_nvfp4", 4, 2), kv_slot_mapping=positions.copy(),
                  latent=V.latent_buffer(5), compress_ratio=1, layout="v41_nvfp4")
    raw = np.zeros(5 * 516 * 2 + 64, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 64
    wide_rows = raw[start:start + 5 * 516 * 2].view(np.uint16).reshape(5, 516)[:, :512]
    index_key = dict(k_pre=V.k_pre(5, rng), positions=positions, kv_slot_mapping=positions.copy(),
                     rms_norm_weight=np.ones(128, F32), rms_norm_eps=1e-6, cos_sin_cache=rope_cos_sin_cache(8),
                     k_cache=canary_k_cache("indexer_mxfp4", 4, 2), compress_ratio=1, layout="v41_nvfp4")
    cases = [
        (spec.v41_compress_norm_rope_store, {**ratio1, "compress_ratio": 4}),
        (spec.v41_compress_norm_rope_store, {**ratio1, "ape": np.zeros((1, 512), F32)}),
        (spec.v41_compress_norm_rope_store, {**ratio1, "score": np.zeros((5, 512), F32)}),
        (spec.v41_compress_norm_rope_store, {**ratio1, "state_cache": np.zeros((2, 2, 1024), F32)}),
        (spec.v41_compress_norm_rope_store, {**ratio1, "latent": wide_rows}),
        (spec.v41_index_key_store, index_key),
        (spec.v41_compress_norm_rope_store, {**ratio1, "k_cache": canary_k_cache("flashmla_fp8", 4, 2)}),
    ]
    messages = []
    for function, call in cases:
        with pytest.raises(ValueError) as error:
            function(**call)
        messages.append(str(error.value))
    return messages


def test_v41_error_messages_are_quoted_verbatim():
    text = (DOCS / "v41.md").read_text(encoding="utf-8")
    section = text[text.index("## Errors"):text.index("## Known deviations")]
    quoted = [m for m in re.findall(r"^- `([^`\n]+)`$", section, re.MULTILINE)]
    assert quoted == _v41_error_messages()
