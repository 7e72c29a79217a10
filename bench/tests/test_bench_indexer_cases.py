"""The indexer's benchmark cases (SPEC §12): the C4 decode sweep, mixed steps and save pass, with
the bytes each moves (CPU only: the cases are NumPy metadata)."""

import argparse

import numpy as np
import pytest

from dsv4_compressor.bench import cli
from dsv4_compressor.bench.cases import C4_SWEEP, indexer_decode_sweep, indexer_mixed_steps, indexer_save_sweep


def test_decode_sweep_bytes_per_active_token():
    rng = np.random.default_rng(0)
    for layout, entry in (("indexer_fp8", 132), ("indexer_mxfp4", 68)):
        cases = indexer_decode_sweep(layout=layout)
        assert [c.token_num for c in cases] == list(C4_SWEEP) and cases[0].block_size == 16
        case = indexer_decode_sweep((64,), layout=layout, hadamard=True)[0]
        assert case.hadamard and case.name.endswith("_hadamard")
        batch = case.batch(rng)
        assert batch.num_active == 64
        # 8 window rows x (128 kv + 128 score) fp32, the entry, a cos/sin row, 28 bytes of metadata; the weight once
        assert case.bytes_moved(batch) == 64 * (8 * 256 * 4 + entry + 64 * 4 + 28) + 128 * 4


def test_mixed_steps_and_save_cover_both_layouts():
    rng = np.random.default_rng(1)
    mixed = indexer_mixed_steps()
    assert {c.layout for c in mixed} == {"indexer_fp8", "indexer_mxfp4"}
    assert all(0 < c.batch(rng).num_active < c.token_num for c in mixed)
    save = indexer_save_sweep((16,))[0]
    batch = save.batch(rng)
    assert save.bytes_moved(batch) == 16 * 2 * 512 * 4 + 16 * 16 + 4 * 256 * 4


def test_cli_accepts_the_indexer_options():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--head", "128", "--layout", "indexer_mxfp4", "--hadamard", "--sizes", "1", "16384"])
    assert (args.head, args.layout, args.hadamard, args.sizes) == (128, ["indexer_mxfp4"], True, [1, 16384])
    ratios, cases = cli.selected_cases(args)
    assert ratios == [4] and [c.token_num for c in cases] == [1, 16384]
    assert all((c.layout, c.hadamard, c.head_dim, c.compress_ratio) == ("indexer_mxfp4", True, 128, 4) for c in cases)


def test_cli_selects_the_sweeps_of_each_head():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    ratios, cases = cli.selected_cases(parser.parse_args(["--head", "128", "--extra"]))
    assert ratios == [4] and all(c.head_dim == 128 and c.compress_ratio == 4 for c in cases)
    assert [c.kind for c in cases] == ["decode"] * 2 * len(C4_SWEEP) + ["mixed"] * 2 + ["save"] * 4
    assert {c.layout for c in cases} == {"indexer_fp8", "indexer_mxfp4"}
    # --ratio 128: the indexer kernel's C128 sweep for each layout (its serving steps and save are C4's)
    ratios, cases = cli.selected_cases(parser.parse_args(["--head", "128", "--extra", "--ratio", "128",
                                                          "--sizes", "1", "64"]))
    assert ratios == [128] and [(c.kind, c.compress_ratio, c.head_dim, c.token_num) for c in cases] == \
        [("decode", 128, 128, 1), ("decode", 128, 128, 64)] * 2
    assert [c.layout for c in cases] == ["indexer_fp8"] * 2 + ["indexer_mxfp4"] * 2
    ratios, cases = cli.selected_cases(parser.parse_args(["--head", "128", "--ratio", "128", "--ratio", "4",
                                                          "--sizes", "8", "--layout", "indexer_fp8"]))
    assert ratios == [128, 4] and [c.compress_ratio for c in cases] == [128, 4]
    ratios, cases = cli.selected_cases(parser.parse_args(["--sizes", "8"]))
    assert ratios == [128, 4] and [(c.compress_ratio, c.token_num, c.head_dim) for c in cases] == [(128, 8, 512), (4, 8, 512)]
    _, cases = cli.selected_cases(parser.parse_args(["--ratio", "4", "--extra"]))
    assert all(c.head_dim == 512 for c in cases) and {c.kind for c in cases} == {"decode", "decode_step", "prefill", "mixed", "save"}


@pytest.mark.parametrize("layout", ["flashmla_fp8", "indexer_fp8", "indexer_mxfp4", "bf16", "fp8_per_tensor"])
def test_bench_k_cache_has_the_spec_cache_geometry(layout):
    pytest.importorskip("torch")
    from dsv4_compressor.bench.timing import _k_cache
    from dsv4_compressor.spec.batch import canary_k_cache

    k_cache, spec = _k_cache(layout, 3, 64, device="cpu"), canary_k_cache(layout, 3, 64)
    assert tuple(k_cache.shape) == spec.shape
    assert tuple(s * k_cache.element_size() for s in k_cache.stride()) == spec.strides


def test_indexer_knob_rows_run_only_on_indexer_compress_cases():
    from dsv4_compressor.bench.cases import c4_decode_sweep, save_sweep
    from dsv4_compressor.bench.sweep import load_bench_impl

    impl = load_bench_impl("triton-indexer_bc128_w4")
    assert impl.runs(indexer_decode_sweep((1,))[0]) and impl.runs(indexer_mixed_steps()[0])
    assert not any(impl.runs(c) for c in c4_decode_sweep((1,)) + save_sweep((1,)) + indexer_save_sweep((1,)))
    assert load_bench_impl("triton").runs(indexer_decode_sweep((1,))[0])
