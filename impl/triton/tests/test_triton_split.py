"""The C128 split path (Triton: a pool kernel per channel tile and run of tokens, then a store
kernel) against the NumPy spec, byte for byte over whole buffers, and its configuration.

The runs a program walks are exercised at 1, at lengths that do not divide ``T`` and at the
longest (:data:`MAX_TOKEN_RUN`), on batches whose runs hold several active tokens, none, and
padding between them. Under ``TRITON_INTERPRET=1`` on CPU; the ``gpu`` test repeats the
comparison at an engine-like size on a CUDA device.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from dsv4_compressor.impl.triton.config import (DEFAULT_FUSED, DEFAULT_INDEXER, DEFAULT_SPLIT, MAX_TOKEN_RUN, FusedConfig,
                                                SplitConfig, compress_config, token_run)
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

from triton_state_scenarios import assert_identical as assert_step_identical, format_step, run_step, step_requests
from triton_test_scenarios import assert_identical, build_scenario, run_spec_and_triton, torch_arguments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _many_windows(layout: str, seed: int, head_dim: int = 512, **kw):
    """Decode boundaries side by side (a run holds several), non-boundary decodes, a prefill chunk
    with two boundaries inside and padding in the middle."""
    requests = [Request(127, 1), Request(255, 1), Request(130, 1), Request(383, 1), Request(200, 120),
                Request(511, 1), Request(639, 1), Request(12, 1)]
    return build_scenario(requests, ratio=128, block_size=8, entries_per_page=4, layout=layout, seed=seed,
                          head_dim=head_dim, num_padding=3, padding_at_end=False, **kw)


SPLIT_CONFIGS = [
    SplitConfig(pool_run=1, store_run=1),
    SplitConfig(pool_run=3, store_run=7),
    SplitConfig(pool_run=MAX_TOKEN_RUN, store_run=MAX_TOKEN_RUN),
    SplitConfig(block_c=32, num_warps=4, store_warps=1, pool_run=5, store_run=2),
    SplitConfig(block_c=512, num_warps=4, store_warps=8, pool_run=2),
]


def _split_id(config: SplitConfig) -> str:
    return f"bc{config.block_c}_w{config.num_warps}_s{config.store_warps}_runs{config.pool_run}-{config.store_run}"


@pytest.mark.parametrize("config", SPLIT_CONFIGS, ids=_split_id)
@pytest.mark.parametrize("layout", ["flashmla_fp8", "bf16", "fp8_per_tensor"])
def test_split_path_bytes_identical_to_spec(layout, config):
    scenario = _many_windows(layout, 41 + SPLIT_CONFIGS.index(config), bf16_weight=layout != "bf16", row_pad=4)
    assert 4 <= scenario.batch.num_active < scenario.batch.num_tokens
    assert_identical(run_spec_and_triton(scenario, DEVICE, config=config))


def test_default_c128_path_and_fused_kernel_write_the_same_bytes():
    """The default (the split path) and an explicit FusedConfig (the one-program-per-token kernel)."""
    for config in (None, DEFAULT_FUSED[128]):
        scenario = _many_windows("flashmla_fp8", 47)
        assert_identical(run_spec_and_triton(scenario, DEVICE, config=config))


@pytest.mark.parametrize("config", [None, SplitConfig(block_c=64, num_warps=2, store_warps=2, pool_run=3, store_run=5)],
                         ids=["default", "runs"])
@pytest.mark.parametrize("layout, hadamard", [("indexer_fp8", False), ("indexer_mxfp4", True)])
def test_split_path_on_the_indexer_head(layout, hadamard, config):
    scenario = _many_windows(layout, 53, head_dim=128, hadamard=hadamard)
    assert_identical(run_spec_and_triton(scenario, DEVICE, config=config))


@pytest.mark.parametrize("bf16_state, ape_at, ring", [(False, "save", True), (True, "compress", True),
                                                      (True, "save", False)], ids=["ring", "bf16-ring-ape_at_compress",
                                                                                   "bf16"])
def test_split_path_in_the_step_call(bf16_state, ape_at, ring):
    step = format_step(128, 512, "flashmla_fp8", False, bf16_state, ape_at, ring, step_requests(128, ring), 61)
    assert_step_identical(run_step(step, DEVICE, config=SplitConfig(pool_run=2, store_run=3)))


def test_compress_config_takes_the_split_path_for_c128_only():
    assert compress_config(128, 512, None, 1) is DEFAULT_SPLIT[512]
    assert compress_config(128, 128, None, 1) is DEFAULT_SPLIT[128]
    assert compress_config(4, 512, None, 10**6) is DEFAULT_FUSED[4]
    assert compress_config(4, 128, None, 1) is DEFAULT_INDEXER[4]
    fused = FusedConfig(block_c=32, num_warps=4, unroll_tiles=False)
    assert compress_config(128, 512, fused, 1) is fused  # a FusedConfig keeps C128 on the fused kernel
    split = SplitConfig(pool_run=4)
    assert compress_config(128, 512, split, 1) is split


@pytest.mark.parametrize("ratio, head, config, message", [
    (4, 512, SplitConfig(), "compress_ratio 128"),
    (128, 128, SplitConfig(block_c=256), "block_c <= 128"),
    (128, 512, "split", "expected None, a FusedConfig or a SplitConfig"),
])
def test_compress_config_rejects_what_it_cannot_run(ratio, head, config, message):
    with pytest.raises(ValueError, match=message):
        compress_config(ratio, head, config, 1)


def test_a_c4_call_with_a_split_config_writes_nothing():
    from dsv4_compressor.impl import triton as triton_impl

    scenario = build_scenario([Request(11, 1), Request(0, 8)], ratio=4, block_size=4, entries_per_page=2,
                              layout="flashmla_fp8", seed=71)
    args, raw = torch_arguments(scenario, DEVICE)
    before = {name: tensor.clone() for name, tensor in raw.items()}
    with pytest.raises(ValueError, match=r"config: a SplitConfig takes compress_ratio 128 \(a C128 window\), got 4"):
        triton_impl.compress_norm_rope_store(*args.values(), compress_ratio=4, layout="flashmla_fp8",
                                             config=SplitConfig())
    for name, tensor in raw.items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize("kwargs, name", [
    (dict(block_c=48), "block_c"), (dict(block_c=1024), "block_c"), (dict(num_warps=3), "num_warps"),
    (dict(store_warps=0), "store_warps"), (dict(pool_run=0), "pool_run"), (dict(store_run=MAX_TOKEN_RUN + 1), "store_run"),
    (dict(pool_run=True), "pool_run"), (dict(store_run=2.0), "store_run"),
])
def test_invalid_split_configs_are_rejected(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SplitConfig(**kwargs)


@given(num_tokens=st.integers(1, 1 << 20), tiles=st.sampled_from([1, 4, 8, 16]), sms=st.integers(1, 256),
       per_sm=st.integers(1, 16))
def test_token_run_is_the_shortest_power_of_two_within_the_grid_budget(num_tokens, tiles, sms, per_sm):
    run = token_run(num_tokens, tiles, sms, per_sm, None)
    assert run & (run - 1) == 0 and 1 <= run <= MAX_TOKEN_RUN
    programs = lambda r: -(-num_tokens // r) * tiles  # noqa: E731
    assert run == MAX_TOKEN_RUN or programs(run) <= sms * per_sm
    assert run == 1 or programs(run // 2) > sms * per_sm


def test_token_run_without_a_device_or_with_a_fixed_run():
    assert token_run(5, 8, None, 4, None) == MAX_TOKEN_RUN
    assert token_run(10**6, 8, 132, 4, 3) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("layout", ["flashmla_fp8", "bf16", "fp8_per_tensor"])
def test_gpu_split_path_on_an_engine_sized_batch(layout):
    rng = np.random.default_rng(7)
    decode = spec_batch.decode_requests(48, 128, rng, max_entries=8)
    mixed = spec_batch.mixed_requests(rng, 128, num_decode=64, prefill_tokens=(700,))
    scenario = build_scenario(decode + mixed, ratio=128, block_size=8, entries_per_page=64, layout=layout, seed=9,
                              bf16_weight=True, row_pad=4, page_pad_bytes=64, num_padding=5, padding_at_end=False)
    for config in (None, SplitConfig(pool_run=1, store_run=1), SplitConfig(pool_run=MAX_TOKEN_RUN)):
        assert_identical(run_spec_and_triton(scenario, "cuda", config=config))
