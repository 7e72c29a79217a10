"""The indexer compressor (SPEC §12) in Triton against the NumPy spec, byte for byte over whole
buffers: both layouts, with and without the Hadamard rotation, C4 and C128, several state block
sizes (non-powers of two included), padded strides and pages, padding and inactive tokens.
Under ``TRITON_INTERPRET=1`` on CPU; the ``gpu`` tests repeat the comparison at engine-like sizes."""

import numpy as np
import pytest
import torch

from dsv4_compressor.impl import triton as triton_impl
from dsv4_compressor.impl.triton import FusedConfig
from dsv4_compressor.impl.triton.config import DEFAULT_INDEXER, INDEXER_C4_MANY, INDEXER_C4_MANY_TOKENS, indexer_config
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

from triton_test_scenarios import Scenario, assert_identical, build_scenario, run_spec_and_triton, state_row, torch_arguments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYOUTS = ("indexer_fp8", "indexer_mxfp4")


def _c4(layout, block_size, seed, **kw) -> Scenario:
    requests = [Request(3, 1), Request(4 * 9 - 2, 2), Request(6, 7), Request(17, 1)]  # p = 3 (invalid rows), not boundary, prefill
    return build_scenario(requests, ratio=4, block_size=block_size, layout=layout, seed=seed, head_dim=128, **kw)


def _c128(layout, block_size, seed, **kw) -> Scenario:
    requests = [Request(127, 1), Request(2 * 128 - 1, 1), Request(300, 1)]  # two boundary tokens, one not
    return build_scenario(requests, ratio=128, block_size=block_size, layout=layout, seed=seed, head_dim=128, **kw)


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ratio, block_size, options", [
    (4, 16, dict(entries_per_page=3, bf16_weight=True, row_pad=4, page_pad_bytes=16, num_padding=3)),
    (4, 5, dict(entries_per_page=1, num_padding=2, padding_at_end=False, drop_entry_fraction=0.3, block_pad_rows=1)),
    (4, 4, dict(entries_per_page=64, unsaved_fraction=0.2, cos_sin_row_pad=8)),
    (128, 8, dict(entries_per_page=2, bf16_weight=True, row_pad=8, page_pad_bytes=32, num_padding=2)),
    (128, 3, dict(entries_per_page=5, block_pad_rows=2)),
])
def test_bytes_identical_to_spec(ratio, block_size, options, layout, hadamard):
    scenario = (_c4 if ratio == 4 else _c128)(layout, block_size, seed=ratio + block_size + hadamard, hadamard=hadamard, **options)
    assert 1 <= scenario.batch.num_active < scenario.batch.num_tokens
    assert_identical(run_spec_and_triton(scenario, DEVICE))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_signed_zeros_tiny_and_huge_blocks(layout):
    """Zero channels (the sign of zero kept), a block far below the floors and one near the top."""
    scenario = _c4(layout, 4, 9, entries_per_page=4, hadamard=False)
    for request, position in ((0, 0), (0, 1), (0, 2), (0, 3), (2, 6), (2, 7), (2, 8), (2, 9), (2, 10), (2, 11)):
        row = state_row(scenario, request, position)
        row[0:128:3] = 0.0  # kv halves (C4: channels 0..127 and 128..255 of a 256-wide kv)
        row[128:256:3] = -0.0
        row[32:64] *= np.float32(1e-30)
        row[160:192] *= np.float32(1e-30)
        row[96:128] *= np.float32(1e6)
        row[224:256] *= np.float32(1e6)
    assert_identical(run_spec_and_triton(scenario, DEVICE))


@pytest.mark.parametrize("config", [FusedConfig(block_c=64, num_warps=4), FusedConfig(block_c=32, num_warps=1),
                                    FusedConfig(block_c=128, num_warps=4, unroll_tiles=False),
                                    FusedConfig(block_c=64, num_warps=2, unroll_tiles=False, max_registers=32),
                                    INDEXER_C4_MANY])
def test_knobs_do_not_change_bytes(config):
    for make, bs in ((_c4, 16), (_c128, 8)):
        scenario = make("indexer_mxfp4", bs, 21, entries_per_page=4, hadamard=True)
        assert_identical(run_spec_and_triton(scenario, DEVICE, config=config))


def test_the_c4_default_follows_the_token_count():
    assert indexer_config(4, None, INDEXER_C4_MANY_TOKENS - 1) is DEFAULT_INDEXER[4]
    assert indexer_config(4, None, INDEXER_C4_MANY_TOKENS) is INDEXER_C4_MANY
    assert indexer_config(128, None, 10**6) is DEFAULT_INDEXER[128]
    given = FusedConfig(block_c=32, num_warps=1)
    assert indexer_config(4, given, 10**6) is given


def test_no_active_token_writes_nothing():
    scenario = build_scenario([Request(5, 2), Request(9, 1)], ratio=4, block_size=16, entries_per_page=4,
                              layout="indexer_fp8", seed=3, head_dim=128)
    assert scenario.batch.num_active == 0
    results = run_spec_and_triton(scenario, DEVICE)
    assert_identical(results)
    assert np.all(results["k_cache"][1][:64] == spec_batch.CANARY_BYTE)


@pytest.mark.parametrize("change, message", [
    (dict(layout="flashmla_fp8"), "layout"),
    (dict(hadamard=2), "hadamard"),
    (dict(fp8_scale=0.5), "fp8_scale"),
    (dict(config=FusedConfig(block_c=256, num_warps=4)), "config"),
])
def test_invalid_calls_raise_before_writing(change, message):
    scenario = _c4("indexer_fp8", 16, 4, entries_per_page=4)
    args, raw = torch_arguments(scenario, DEVICE)
    before = {name: tensor.clone() for name, tensor in raw.items()}
    kwargs = {"compress_ratio": 4, "layout": "indexer_fp8", **change}
    with pytest.raises(ValueError, match=message):
        triton_impl.compress_norm_rope_store(*args.values(), **kwargs)
    for name, tensor in raw.items():
        assert torch.equal(tensor, before[name]), name


def test_the_512_wide_layouts_reject_hadamard():
    scenario = build_scenario([Request(3, 1)], ratio=4, block_size=4, entries_per_page=4, layout="flashmla_fp8", seed=1)
    args, _ = torch_arguments(scenario, DEVICE)
    with pytest.raises(ValueError, match="hadamard"):
        triton_impl.compress_norm_rope_store(*args.values(), compress_ratio=4, hadamard=True)


# ---- GPU: engine-like sizes -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ratio, block_size", [(4, 16), (4, 4), (128, 8), (128, 5)])
def test_gpu_engine_sized_batches(ratio, block_size, layout, hadamard):
    rng = np.random.default_rng(ratio * 7 + block_size)
    decode = spec_batch.decode_requests(256 if ratio == 4 else 48, ratio, rng, max_entries=64 if ratio == 4 else 8)
    mixed = spec_batch.mixed_requests(rng, ratio, num_decode=64, prefill_tokens=(37, 300) if ratio == 4 else (200,))
    scenario = build_scenario(decode + mixed, ratio=ratio, block_size=block_size, entries_per_page=64, layout=layout,
                              seed=ratio + block_size, bf16_weight=block_size % 8 == 0, row_pad=4, page_pad_bytes=64,
                              num_padding=5, padding_at_end=False, head_dim=128, hadamard=hadamard)
    assert_identical(run_spec_and_triton(scenario, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_c4_batches_past_the_default_switch(layout):
    """From ``INDEXER_C4_MANY_TOKENS`` tokens the C4 default is :data:`INDEXER_C4_MANY`: the same bytes."""
    rng = np.random.default_rng(11)
    decode = spec_batch.decode_requests(INDEXER_C4_MANY_TOKENS, 4, rng, max_entries=64)
    scenario = build_scenario(decode, ratio=4, block_size=16, entries_per_page=64, layout=layout, seed=12,
                              bf16_weight=True, row_pad=4, page_pad_bytes=64, num_padding=3, padding_at_end=False,
                              head_dim=128, hadamard=layout == "indexer_mxfp4")
    assert indexer_config(4, None, scenario.batch.num_tokens) is INDEXER_C4_MANY
    assert_identical(run_spec_and_triton(scenario, "cuda"))
