"""``compress_norm_rope_store`` (Triton) against the NumPy spec, byte for byte over whole buffers.

Every scenario starts both implementations from identical buffers: canary-filled ``k_cache``
(padded pages), NaN-padded state caches with padded strides, shuffled block tables, padding
and non-boundary tokens. Every byte of ``k_cache`` and ``state_cache`` (padding included) must
equal the spec's afterwards. Under ``TRITON_INTERPRET=1`` on CPU; the ``gpu`` tests repeat the
comparison at engine-like sizes on a CUDA device.
"""

import numpy as np
import pytest
import torch

from dsv4_compressor.impl import triton as triton_impl
from dsv4_compressor import spec
from dsv4_compressor.impl.triton import FusedConfig
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

from triton_test_scenarios import Scenario, assert_identical, build_scenario, run_spec_and_triton, state_row, torch_arguments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = np.float32


def _c4(layout, block_size, seed, **kw) -> Scenario:
    requests = [Request(4 * 3 - 1, 1), Request(4 * 9 - 2, 2), Request(6, 7), Request(17, 1)]  # decode (boundary, not), prefill
    return build_scenario(requests, ratio=4, block_size=block_size, layout=layout, seed=seed, **kw)


def _c128(layout, block_size, seed, **kw) -> Scenario:
    requests = [Request(127, 1), Request(2 * 128 - 1, 1), Request(300, 1)]  # two boundary tokens, one not
    return build_scenario(requests, ratio=128, block_size=block_size, layout=layout, seed=seed, **kw)


SCENARIOS = {
    "c4_bs4_flashmla_bf16w_B2_padded": lambda: _c4("flashmla_fp8", 4, 1, entries_per_page=2, bf16_weight=True, row_pad=4,
                                                    block_pad_rows=1, page_pad_bytes=32, num_padding=3),
    "c4_bs8_bf16_f32w_B1_scattered_padding": lambda: _c4("bf16", 8, 2, entries_per_page=1, num_padding=4, padding_at_end=False,
                                                          drop_entry_fraction=0.3, cos_sin_row_pad=8),
    "c4_bs16_fp8pt_bf16w_B64": lambda: _c4("fp8_per_tensor", 16, 3, entries_per_page=64, bf16_weight=True, row_pad=8,
                                           unsaved_fraction=0.2, fp8_scale=0.037),
    "c4_bs4_flashmla_f32w_B64_unpadded": lambda: _c4("flashmla_fp8", 4, 4, entries_per_page=64),
    "c128_bs8_flashmla_bf16w_B2_padded": lambda: _c128("flashmla_fp8", 8, 5, entries_per_page=2, bf16_weight=True, row_pad=4,
                                                       block_pad_rows=2, page_pad_bytes=16, num_padding=2),
    "c128_bs4_bf16_f32w_B1": lambda: _c128("bf16", 4, 6, entries_per_page=1, row_pad=12),
    "c128_bs8_fp8pt_f32w_B64": lambda: _c128("fp8_per_tensor", 8, 7, entries_per_page=64, fp8_scale=0.5),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_bytes_identical_to_spec(name):
    scenario = SCENARIOS[name]()
    assert scenario.batch.num_active >= 1 and scenario.batch.num_active < scenario.batch.num_tokens
    assert_identical(run_spec_and_triton(scenario, DEVICE))


ZERO_CHANNELS = np.arange(0, 512, 3)


def _first_window_with_signed_zeros(ratio_layout_weight) -> Scenario:
    layout, bf16_weight = ratio_layout_weight
    # C4 p = 3: window rows 0..3 (positions -4..-1) are invalid, rows 4..7 are positions 0..3 (half 1)
    scenario = build_scenario([Request(0, 4), Request(3, 1)], ratio=4, block_size=4, entries_per_page=2, layout=layout,
                              seed=11, bf16_weight=bf16_weight)
    for position in range(4):
        row = state_row(scenario, 0, position)
        # kv half 1 (channels 512..1023): -0 everywhere in zero_channels, and +0/-0 mixed in a few
        row[512 + ZERO_CHANNELS] = F32(-0.0)
        row[512 + 1 + 6 * np.arange(40)] = F32(0.0) if position % 2 else F32(-0.0)
    return scenario


@pytest.mark.parametrize("layout_weight", [("flashmla_fp8", True), ("bf16", False), ("fp8_per_tensor", True)],
                         ids=["flashmla", "bf16", "fp8pt"])
def test_c4_first_window_invalid_rows_are_plus_zero(layout_weight):
    """At p = 3 the invalid rows enter both trees as +0: -0 kv values of the valid rows pool to +0."""
    scenario = _first_window_with_signed_zeros(layout_weight)
    b = scenario.batch
    assert b.num_active == 2 and np.all(b.positions[b.active] == 3)
    x = spec.compress(scenario.state_cache, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
                      b.kv_slot_mapping, compress_ratio=4)
    first = np.flatnonzero(b.active & (b.token_to_req_indices == 0))[0]
    assert np.all(x[first, ZERO_CHANNELS] == 0) and not np.any(np.signbit(x[first, ZERO_CHANNELS])), "spec: +0 expected"
    assert_identical(run_spec_and_triton(scenario, DEVICE))


def test_c128_signed_zeros_and_tiny_amax_blocks():
    """All-(-0) kv channels pool to -0 (sign kept through RMSNorm into E4M3 0x80); a block of tiny
    values has amax below AMIN, so its UE8M0 byte comes from the floor."""
    scenario = build_scenario([Request(127, 1)], ratio=128, block_size=8, entries_per_page=2, layout="flashmla_fp8", seed=12)
    for position in range(128):
        row = state_row(scenario, 0, position)
        row[0:64] *= F32(1e-7)  # block 0: tiny
        row[64:96] = F32(-0.0)  # half of block 1: -0
        row[200:264] = F32(0.0)  # straddles blocks 3 and 4: +0
    assert_identical(run_spec_and_triton(scenario, DEVICE))


def test_c4_tiny_amax_blocks_and_tiny_weights():
    scenario = _c4("flashmla_fp8", 8, 13, entries_per_page=4, bf16_weight=False)
    scenario.weight[128:192] = F32(1e-9)  # block 2 of every entry far below AMIN after the norm
    scenario.state_cache[..., 320:384] *= F32(1e-6)  # kv channels 320..383 of both halves' first half tiny
    assert_identical(run_spec_and_triton(scenario, DEVICE))


C4_CONFIGS = [FusedConfig(block_c=16, num_warps=4), FusedConfig(block_c=128, num_warps=2), FusedConfig(block_c=512, num_warps=8),
              FusedConfig(block_c=64, num_warps=4, unroll_tiles=False, tile_stages=2)]
C128_CONFIGS = [FusedConfig(block_c=64, num_warps=8), FusedConfig(block_c=32, num_warps=4, unroll_tiles=False),
                FusedConfig(block_c=16, num_warps=1, unroll_tiles=False), FusedConfig(block_c=512, num_warps=4),
                FusedConfig(block_c=64, num_warps=8, unroll_tiles=False, tile_stages=2)]


def _config_id(config: FusedConfig) -> str:
    loop = "unrolled" if config.unroll_tiles else f"loop{config.tile_stages}"
    return f"bc{config.block_c}_w{config.num_warps}_{loop}"


@pytest.mark.parametrize("config", C4_CONFIGS, ids=_config_id)
def test_c4_knobs_do_not_change_bytes(config):
    scenario = _c4("flashmla_fp8", 4, 21, entries_per_page=2, bf16_weight=True, row_pad=4)
    assert_identical(run_spec_and_triton(scenario, DEVICE, config=config))


@pytest.mark.parametrize("config", C128_CONFIGS, ids=_config_id)
def test_c128_knobs_do_not_change_bytes(config):
    scenario = build_scenario([Request(255, 1)], ratio=128, block_size=8, entries_per_page=2, layout="bf16", seed=22)
    assert_identical(run_spec_and_triton(scenario, DEVICE, config=config))


def test_no_active_token_writes_nothing():
    requests = [Request(5, 1), Request(128 * 3, 2)]  # no boundary among them
    scenario = build_scenario(requests, ratio=128, block_size=8, entries_per_page=2, layout="flashmla_fp8", seed=31, num_padding=2)
    assert scenario.batch.num_active == 0
    results = run_spec_and_triton(scenario, DEVICE)
    assert_identical(results)
    assert np.all(results["k_cache"][1] == spec_batch.CANARY_BYTE)


def _call(args, **kw):
    kwargs = dict(compress_ratio=4, layout="flashmla_fp8")
    kwargs.update(kw)
    triton_impl.compress_norm_rope_store(*args.values(), **kwargs)


@pytest.mark.parametrize("mutation, message", [
    (lambda a: a.update(k_cache=a["k_cache"].view(torch.int8)), "k_cache"),
    (lambda a: a.update(positions=a["positions"].to(torch.int32)), "positions"),
    (lambda a: a.update(slot_mapping=a["slot_mapping"][:-1]), "slot_mapping"),
    (lambda a: a.update(rms_norm_weight=a["rms_norm_weight"].to(torch.float16)), "rms_norm_weight"),
    (lambda a: a.update(state_cache=a["state_cache"][:, :, :1024]), "state_cache"),
    (lambda a: a.update(block_table=a["block_table"].to(torch.int64)), "block_table"),
    (lambda a: a.update(cos_sin_cache=a["cos_sin_cache"][:, :32]), "cos_sin_cache"),
], ids=["k_cache_dtype", "positions_dtype", "slot_mapping_length", "weight_dtype", "state_width", "block_table_dtype", "cos_sin_width"])
def test_invalid_arguments_raise_before_writing(mutation, message):
    scenario = _c4("flashmla_fp8", 4, 41, entries_per_page=2)
    args, _ = torch_arguments(scenario, DEVICE)
    mutation(args)
    before = {name: args[name].clone() for name in ("state_cache", "k_cache")}
    with pytest.raises(ValueError, match=message):
        _call(args)
    for name, tensor in before.items():
        assert torch.equal(args[name].view(torch.uint8), tensor.view(torch.uint8)), f"{name} was written"


@pytest.mark.parametrize("kwargs, message", [
    (dict(compress_ratio=8), "compress_ratio"), (dict(layout="fp16"), "layout"),
    (dict(layout="flashmla_fp8", fp8_scale=1.0), "fp8_scale"), (dict(compress_ratio=128), "state_cache"),
])
def test_invalid_options_raise(kwargs, message):
    args, _ = torch_arguments(_c4("flashmla_fp8", 4, 42, entries_per_page=2), DEVICE)
    with pytest.raises(ValueError, match=message):
        _call(args, **kwargs)


def test_debug_mode_rejects_out_of_range_block_table_entries():
    scenario = _c4("flashmla_fp8", 4, 43, entries_per_page=2)
    args, _ = torch_arguments(scenario, DEVICE)
    b = scenario.batch
    token = np.flatnonzero(b.active)[0]
    column = (b.positions[token] - 7) // b.block_size  # the block of the token's first window row
    args["block_table"][b.token_to_req_indices[token], column] = 10_000
    before = args["k_cache"].clone()
    with pytest.raises(ValueError, match="block_table"):
        _call(args, debug=True)
    assert torch.equal(args["k_cache"], before)


def test_debug_mode_accepts_a_valid_call():
    assert_identical(run_spec_and_triton(_c4("bf16", 4, 44, entries_per_page=2), DEVICE, debug=True))


# ---- GPU: engine-like sizes -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["flashmla_fp8", "bf16", "fp8_per_tensor"])
@pytest.mark.parametrize("ratio, block_size", [(4, 4), (4, 16), (128, 8), (128, 4)])
def test_gpu_engine_sized_batches(layout, ratio, block_size):
    rng = np.random.default_rng(ratio * 7 + block_size)
    decode = spec_batch.decode_requests(256 if ratio == 4 else 48, ratio, rng, max_entries=64 if ratio == 4 else 8)
    mixed = spec_batch.mixed_requests(rng, ratio, num_decode=64, prefill_tokens=(37, 300) if ratio == 4 else (200,))
    scenario = build_scenario(decode + mixed, ratio=ratio, block_size=block_size, entries_per_page=64, layout=layout,
                              seed=ratio + block_size, bf16_weight=block_size % 8 == 0, row_pad=4, page_pad_bytes=64,
                              num_padding=5, padding_at_end=False)
    assert_identical(run_spec_and_triton(scenario, "cuda"))


@pytest.mark.parametrize("kwargs", [dict(block_c=48, num_warps=4), dict(block_c=1024, num_warps=4), dict(block_c=64, num_warps=3),
                                    dict(block_c=64, num_warps=4, tile_stages=0)])
def test_invalid_configs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        FusedConfig(**kwargs)


@pytest.mark.parametrize("max_registers", [8, 256, 32.0, "32"])
def test_invalid_register_caps_are_rejected(max_registers):
    with pytest.raises(ValueError, match="max_registers"):
        FusedConfig(block_c=64, num_warps=2, max_registers=max_registers)


def test_max_registers_becomes_the_maxnreg_launch_option():
    assert FusedConfig(block_c=64, num_warps=2).launch_options() == {"num_warps": 2}
    assert FusedConfig(block_c=64, num_warps=2, max_registers=32).launch_options() == {"num_warps": 2, "maxnreg": 32}


@pytest.mark.parametrize("fp8_scale, codes", [(0.002, (0x7E, 0xFE)), (300.0, tuple(range(1, 8)))], ids=["saturating", "subnormal"])
def test_fp8_per_tensor_saturation_and_subnormal_codes(fp8_scale, codes):
    """A tiny scale drives most values past 448 (saturated to 0x7E/0xFE); a huge one into E4M3's
    subnormal range. Both must match the spec byte for byte."""
    scenario = _c4("fp8_per_tensor", 8, 51, entries_per_page=2, fp8_scale=fp8_scale)
    results = run_spec_and_triton(scenario, DEVICE)
    spec_bytes = results["k_cache"][0]
    assert np.isin(spec_bytes, codes).sum() > 100, "the scenario must exercise these codes"
    assert_identical(results)
