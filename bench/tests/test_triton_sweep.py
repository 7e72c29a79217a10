"""The Triton knob sweep without a GPU: its configs are valid for their head (the indexer's,
``--head 128``, too), its cases and byte counts are the main bench's, its rows are timed by the
bench's own :func:`run_case` under the config's name, its arguments select the right sweeps."""

import numpy as np
import pytest

pytest.importorskip("torch")

from dsv4_compressor.bench import triton_sweep as ts
from dsv4_compressor.bench.cases import c4_decode_sweep, c128_decode_sweep, indexer_decode_sweep
from dsv4_compressor.impl.triton.config import (DEFAULT_FUSED, DEFAULT_INDEXER, DEFAULT_SPLIT, INDEXER_C4_MANY, SplitConfig,
                                                compress_config, indexer_config)


@pytest.mark.parametrize("ratio, configs", [(4, ts.INDEXER_C4_CONFIGS), (128, ts.INDEXER_C128_CONFIGS)])
def test_indexer_configs_are_valid_distinct_and_hold_the_default(ratio, configs):
    fused = [c for c in configs if not isinstance(c, SplitConfig)]
    assert all(indexer_config(ratio, c) is c for c in fused)  # raises on block_c > 128 or tile_stages != 1
    assert all(compress_config(ratio, 128, c, 1) is c for c in configs)  # the split path's block_c <= 128 too
    names = [ts.config_name(c) for c in configs]
    assert len(set(names)) == len(names) == len(set(configs))
    assert DEFAULT_INDEXER[ratio] in configs
    assert ratio != 4 or INDEXER_C4_MANY in configs  # the C4 default from 4096 tokens too
    assert ratio == 4 or DEFAULT_SPLIT[128] in configs  # C128's default: the split path
    assert len(configs) <= 11  # the whole default sweep stays within a few minutes on one GPU


@pytest.mark.parametrize("ratio, configs", [(4, ts.C4_CONFIGS), (128, ts.C128_CONFIGS)])
def test_kv_configs_are_distinct_and_hold_the_default(ratio, configs):
    names = [ts.config_name(c) for c in configs]
    assert len(set(names)) == len(names) == len(set(configs))
    assert DEFAULT_FUSED[ratio] in configs
    assert ratio == 4 or DEFAULT_SPLIT[512] in configs  # C128's default: the split path


def test_fused_grid_keeps_the_pairs_within_the_per_thread_bounds():
    from dsv4_compressor.impl.triton.config import FusedConfig

    # a C4 [8, block_c] fp32 tile over 32 * num_warps threads: block_c 256 leaves 64, 32, 16, 8 values a thread
    # at 1, 2, 4, 8 warps, block_c 128 half as many
    grid = ts.fused_grid(4, (256, 128), (1, 2, 4, 8), (16, 32), unroll_tiles=False)
    assert [ts.config_name(c) for c in grid] == ["bc256_w2_loop1", "bc256_w4_loop1", "bc128_w1_loop1", "bc128_w2_loop1"]
    # a C128 [128, 64] tile: 64 values a thread at 4 warps, 32 at 8
    assert ts.fused_grid(128, (64,), (4, 8), (16, 32)) == [FusedConfig(block_c=64, num_warps=8)]


def test_config_names_show_every_knob():
    from dsv4_compressor.impl.triton.config import FusedConfig

    assert ts.config_name(FusedConfig(block_c=64, num_warps=2, unroll_tiles=False, max_registers=32)) == "bc64_w2_loop1_r32"
    assert ts.config_name(FusedConfig(block_c=128, num_warps=1)) == "bc128_w1_unrolled"
    assert ts.config_name(None) == "default"
    assert ts.config_name(SplitConfig()) == "split_bc64_w8_s4_runsauto-auto"
    assert ts.config_name(SplitConfig(block_c=32, num_warps=4, store_warps=1, pool_run=8)) == "split_bc32_w4_s1_runs8-auto"


def test_default_indexer_sweeps_are_c4_over_both_layouts():
    sweeps = ts.indexer_sweeps(None, None, False, None, False)
    assert [(s.head, s.ratio, s.layout, s.hadamard) for s in sweeps] == [(128, 4, "indexer_fp8", False),
                                                                         (128, 4, "indexer_mxfp4", False)]
    assert all(s.token_counts == (1024, 4096, 16384) and s.configs == tuple(ts.INDEXER_C4_CONFIGS) for s in sweeps)
    only = ts.indexer_sweeps([128], ["indexer_mxfp4"], True, [64], True)
    assert [(s.ratio, s.layout, s.hadamard, s.token_counts, s.configs) for s in only] == [
        (128, "indexer_mxfp4", True, (64,), (None,))]  # --default-only: the call's own default at each size


def test_default_kv_sweeps_are_c128_then_c4_on_flashmla():
    sweeps = ts.kv_sweeps(None, None, False)
    assert [(s.head, s.ratio, s.layout, s.hadamard) for s in sweeps] == [(512, 128, "flashmla_fp8", False),
                                                                         (512, 4, "flashmla_fp8", False)]
    assert [s.token_counts for s in sweeps] == [ts.KV_TOKENS[128], ts.KV_TOKENS[4]]
    assert [s.configs for s in sweeps] == [tuple(ts.C128_CONFIGS), tuple(ts.C4_CONFIGS)]
    only = ts.kv_sweeps([4], [64], True)
    assert [(s.ratio, s.token_counts, s.configs) for s in only] == [(4, (64,), (None,))]  # the call's own default


def test_kv_cases_are_the_main_benchs():
    assert ts.Sweep(512, 4, "flashmla_fp8", False, (64, 1024), ()).cases() == c4_decode_sweep((64, 1024))
    assert ts.Sweep(512, 128, "flashmla_fp8", False, (8,), ()).cases() == c128_decode_sweep((8,))


def test_a_sweep_times_its_configs_with_the_benchs_run_case(monkeypatch, capsys):
    """Each case is checked, then timed by ``run_case`` with one compress row per config, named as printed."""
    from dsv4_compressor.bench.sweep import Row

    sweep = ts.kv_sweeps([4], [64, 1024], False)[0]
    timed = []

    def run_case(case, impls, modes, copy_gbs, trials):
        timed.append((case, [i.name for i in impls], modes))
        return [Row(case.name, "compress", case.token_num, case.token_num, i.name, "graph", 10.0, 9.0, 11.0, None,
                    1000, 100.0, 25.0) for i in impls]

    def check_configs(case, configs, label, check_spec, host_cost):
        assert (label, check_spec, host_cost) == (f"C4 T={case.token_num}", case.token_num == 64, case.token_num == 64)
        return {ts.config_name(c): (0.5, True) for c in configs}

    monkeypatch.setattr(ts, "run_case", run_case)
    monkeypatch.setattr(ts, "check_configs", check_configs)
    monkeypatch.setattr(ts.torch.cuda, "empty_cache", lambda: None)
    ts.run_sweep(sweep, 400.0, check_spec=True)
    names = [ts.config_name(c) for c in ts.C4_CONFIGS]
    assert timed == [(case, names, ["graph"]) for case in c4_decode_sweep((64, 1024))]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(names) and all("bytes=same" in line and "25.0% of copy" in line for line in lines)
    impl = ts.compress_impl(ts.C4_CONFIGS[1])
    assert impl.compress.keywords == {"config": ts.C4_CONFIGS[1]} and impl.save is None


def test_indexer_cases_and_bytes_are_the_main_benchs():
    c4 = ts.Sweep(128, 4, "indexer_mxfp4", True, (64, 1024), ())
    assert c4.cases() == indexer_decode_sweep((64, 1024), layout="indexer_mxfp4", hadamard=True)
    c128 = ts.Sweep(128, 128, "indexer_fp8", False, (16,), ()).cases()[0]
    assert (c128.compress_ratio, c128.head_dim, c128.block_size, c128.layout) == (128, 128, 8, "indexer_fp8")
    batch = c128.batch(np.random.default_rng(0))
    assert batch.num_active == 16
    # per active token: 128 window rows x (128 kv + 128 score) fp32, a 132-byte entry, a cos/sin row, 28 bytes of
    # metadata; the weight once
    assert c128.bytes_moved(batch) == 16 * (128 * 256 * 4 + 132 + 64 * 4 + 28) + 128 * 4


def test_arguments():
    args = ts.parse_args(["--head", "128", "--layout", "indexer_fp8", "--hadamard", "--check-spec"])
    assert (args.head, args.layout, args.hadamard, args.check_spec, args.ratio) == (128, ["indexer_fp8"], True, True, None)
    assert ts.parse_args([]).head == 512
    for bad in (["--layout", "indexer_fp8"], ["--hadamard"], ["--head", "128", "--layout", "flashmla_fp8"]):
        with pytest.raises(SystemExit):
            ts.parse_args(bad)
