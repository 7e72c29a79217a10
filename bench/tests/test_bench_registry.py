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


def test_tuner_settings_are_bench_rows_and_each_changes_what_its_path_runs():
    """The tuner's generated settings load as ``cutedsl-<setting>`` rows, and the pruning rule
    holds: each setting runs something its path's default does not, at some size."""
    from dsv4_compressor.bench.cutedsl_tune import _what_runs, settings
    from dsv4_compressor.bench.sweep import load_bench_impl

    table = settings(128)
    assert {"auto", "fused_cluster", "split_block8", "fused_cluster+cluster.tile=32",
            "fused_pipelined+pipelined_ctas_per_sm=2"} <= set(table)
    sizes = (1, 8, 32, 64, 128, 256, 1024, 8192)
    for name, variant in table.items():
        path, _, change = name.partition("+")
        if change:
            base = table[path]
            assert _what_runs(variant.c128_path, 128, variant.policy, sizes) != \
                _what_runs(base.c128_path, 128, base.policy, sizes), name
    assert "fused_handoff+cluster.tile=32" not in table  # the handoff path never sees the cluster shape
    impl = load_bench_impl("cutedsl-fused_cluster+cluster.tile=32")
    assert impl.name == "cutedsl-fused_cluster+cluster.tile=32"
    assert set(settings(4)) == {"c4", "c4+c4_tokens_per_cta=2", "c4+c4_tokens_per_cta=4"}


def test_unknown_implementation_names_are_rejected():
    from dsv4_compressor.bench.sweep import load_bench_impl

    with pytest.raises(ValueError, match="--impl: expected one of"):
        load_bench_impl("cutedsl-cluster32")


def test_indexer_variants_are_bench_rows_of_the_indexer_compress_cases():
    from dsv4_compressor.bench.cases import c4_decode_sweep, indexer_decode_sweep, indexer_save_sweep, save_sweep
    from dsv4_compressor.bench.sweep import load_bench_impl
    from dsv4_compressor.impl.cutedsl.variants import INDEXER_VARIANTS

    assert {"indexer_c4_w1", "indexer_nopdl"} <= set(INDEXER_VARIANTS)
    for name in INDEXER_VARIANTS:
        impl = load_bench_impl(f"cutedsl-{name}")
        assert impl.runs(indexer_decode_sweep((1,))[0]), name
        assert not any(impl.runs(c) for c in c4_decode_sweep((1,)) + save_sweep((1,)) + indexer_save_sweep((1,))), name


@pytest.mark.parametrize("ratio, tokens", [(4, 8), (128, 64)])
def test_the_bound_impl_calls_one_bound_layer_per_input_set(ratio, tokens, monkeypatch):
    """``cutedsl-bound`` (on CPU: kernels stubbed as in host_time): each set's call is its
    own layer's, the compress with the set's workspace, the save through a layer too, and
    from the second call on the bound layers' eager path."""
    pytest.importorskip("cutlass")
    import torch

    from dsv4_compressor.bench.cases import c4_decode_sweep, c128_decode_sweep, save_sweep
    from dsv4_compressor.bench.host_time import _arguments, _no_launches
    from dsv4_compressor.bench.sweep import load_bench_impl
    from dsv4_compressor.bench.timing import InputSet, Prepared
    from dsv4_compressor.impl.cutedsl import api

    layers = []
    real_bind = api.bind
    monkeypatch.setattr(api, "_BOUND_LAUNCHES", {})
    monkeypatch.setattr("dsv4_compressor.impl.cutedsl.bind", lambda *a, **k: layers.append(real_bind(*a, **k))
                        or layers[-1])
    impl = load_bench_impl("cutedsl-bound")
    compress_case = (c4_decode_sweep if ratio == 4 else c128_decode_sweep)((tokens,))[0]
    save_case = [c for c in save_sweep((tokens,)) if c.compress_ratio == ratio][0]
    compress_sets, save_sets = [], []
    for seed in range(2):
        args, kv_score, ape, workspace = _arguments(ratio, tokens, torch.device("cpu"))
        compress_sets.append(InputSet(args, {"compress_ratio": ratio, "layout": "flashmla_fp8", "fp8_scale": None},
                                      workspace))
        save_sets.append(InputSet((kv_score, ape, args[2], args[3], args[0], args[5]), {}))
    with _no_launches(False):
        for case, sets in ((compress_case, compress_sets), (save_case, save_sets)):
            call = impl.caller(Prepared(case, sets, 0, 0))
            for s in sets * 2:
                call(s)
    assert len(layers) == 4
    assert [layer.state_cache is s.args[0] for layer, s in zip(layers, compress_sets)] == [True, True]
    assert [layer.state_cache is s.args[4] for layer, s in zip(layers[2:], save_sets)] == [True, True]
    assert tokens in layers[0]._launches and all(layer._save_kernel is not None for layer in layers[2:])


def test_the_commit_is_the_packages_own_and_says_when_its_files_differ(tmp_path, monkeypatch):
    """Results name the package's commit wherever the benchmark runs from, with ``-dirty`` where
    the files differ from it (a copied tree whose git metadata lags behind must not pass for the
    commit it names); outside a git checkout, None."""
    import re
    import subprocess

    from dsv4_compressor.bench import cli

    monkeypatch.chdir(tmp_path)  # another folder: the package's own checkout still answers
    commit = cli._commit()
    package = cli.os.path.dirname(cli.os.path.dirname(cli.os.path.abspath(cli.__file__)))
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=package, capture_output=True, text=True)
    if inside.returncode != 0:
        assert commit is None
        return
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=package, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=package,
                           capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", commit)
    assert commit.startswith(head.stdout.strip()) and commit.endswith("-dirty") == bool(dirty)
