"""CPU checks of the benchmark registry: every named CuTe DSL variant is a row, and only
on the cases where it differs from the dispatching implementation."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


def test_every_variant_is_registered_and_runs_only_c128_compress():
    from dsv4_compressor.bench.cases import c4_decode_sweep, c128_decode_sweep, mixed_steps, save_sweep
    from dsv4_compressor.bench.sweep import REGISTRY, load_bench_impl
    from dsv4_compressor.impl.cutedsl.variants import VARIANTS

    assert {f"cutedsl-{name}" for name in VARIANTS} <= set(REGISTRY)
    c128 = c128_decode_sweep((1,)) + [c for c in mixed_steps() if c.compress_ratio == 128]
    others = c4_decode_sweep((1,)) + [c for c in mixed_steps() if c.compress_ratio == 4] + save_sweep((1,))
    for name, variant in VARIANTS.items():
        impl = load_bench_impl(f"cutedsl-{name}")
        assert all(impl.runs(case) for case in c128), name
        # a variant whose choices concern only C128 compress is the dispatcher elsewhere; one without PDL is not
        assert any(impl.runs(case) for case in others) == (not variant.c128_compress_only), name
    assert not VARIANTS["nopdl"].c128_compress_only and VARIANTS["cluster16"].c128_compress_only
    for name in ("cutedsl", "triton"):
        impl = load_bench_impl(name)
        assert all(impl.runs(case) for case in c128 + others), name


def test_unknown_implementation_names_are_rejected():
    from dsv4_compressor.bench.sweep import load_bench_impl

    with pytest.raises(ValueError, match="--impl: expected one of"):
        load_bench_impl("cutedsl-cluster32")


def test_indexer_variants_are_bench_rows_of_the_indexer_compress_cases():
    from dsv4_compressor.bench.cases import c4_decode_sweep, indexer_decode_sweep, indexer_save_sweep, save_sweep
    from dsv4_compressor.bench.sweep import load_bench_impl
    from dsv4_compressor.impl.cutedsl.variants import INDEXER_VARIANTS

    assert {"indexer_c4_w4", "indexer_c4_w8", "indexer_nopdl"} <= set(INDEXER_VARIANTS)
    for name in INDEXER_VARIANTS:
        impl = load_bench_impl(f"cutedsl-{name}")
        assert impl.runs(indexer_decode_sweep((1,))[0]), name
        assert not any(impl.runs(c) for c in c4_decode_sweep((1,)) + save_sweep((1,)) + indexer_save_sweep((1,))), name
