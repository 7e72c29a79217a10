"""CPU checks of the CuTe DSL implementation (no GPU needed).

- every kernel variant compiles for sm_90a and its PTX passes SPEC §2's rules
  (:mod:`dsv4_compressor.impl.ptx_rules`), with no local memory;
- the compile cache returns the same object for the same static configuration;
- configurations and the public wrappers reject bad inputs with ``ValueError`` before
  anything is compiled or launched.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor.impl import ptx_rules  # noqa: E402
from dsv4_compressor.impl.cutedsl import api, config  # noqa: E402
from dsv4_compressor.impl.cutedsl.host import buffers, compile_cache, occupancy, paths  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.paths import PATHS, PathRequest  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.v41_paths import V41_PATHS  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY, Policy, PoolShape  # noqa: E402
from dsv4_compressor.impl.cutedsl.ptx import kernel_configs, ptx_variants  # noqa: E402
from cutedsl_test_calls import no_compile, wrapper_arguments  # noqa: E402,F401  (no_compile: a fixture)


# ---- PTX -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ptx_reports():
    return [
        ptx_rules.check_ptx("cutedsl", name, ptx, require_target="sm_90a", **options)
        for name, ptx, options in ptx_variants()
    ]


def test_every_variant_passes_the_ptx_rules(ptx_reports):
    failures = {r.variant: r.violations for r in ptx_reports if not r.ok}
    assert not failures, failures


def test_no_variant_uses_local_memory(ptx_reports):
    assert all(r.counts["local memory"] == 0 for r in ptx_reports), [r.variant for r in ptx_reports if r.counts["local memory"]]


def test_variants_cover_every_kernel_and_layout(ptx_reports):
    names = {r.variant for r in ptx_reports}
    kernels = {kernel for kernel, _ in kernel_configs()}
    assert kernels == {k for path in PATHS.values() for k in path.kernels} | {"save"} | set(V41_PATHS)
    for layout in ("flashmla_fp8", "bf16", "fp8_per_tensor"):
        for prefix in ("c4_", "split_store_", "fused_cluster_", "fused_handoff_", "fused_pipelined_"):
            for align in config.store_alignments(config.ENTRY_LAYOUTS[layout]):
                assert any(n.startswith(prefix) and f"{layout}_B" in n and n.endswith(f"_a{align}") or
                           f"{layout}_B" in n and f"_a{align}_" in n and n.startswith(prefix) for n in names), \
                    (prefix, layout, align)
    assert {kernel for kernel, cfg in kernel_configs() if "_pdl" in cfg.tag} == kernels  # PDL on every kernel
    assert len(names) == len(list(kernel_configs()))  # one name per variant


def test_pdl_kernels_wait_before_any_global_access(ptx_reports):
    """A PDL kernel's first memory instruction comes after ``griddepcontrol.wait`` (it may
    start while the previous kernel still writes); a kernel without PDL has none. With
    ``early_metadata`` only scalar and small vector metadata loads (positions, block table,
    weights, cos/sin) may come first: every state row load (16-byte ``ld.global.v4``,
    ``cp.async``) and every store or atomic follows the wait. The step call's save
    (``inputs_before_wait``, tag ``_readfirst``) reads its inputs, rows included, before it: only
    its stores and atomics follow."""
    from dsv4_compressor.impl.cutedsl.ptx import compile_variant

    memory_ops = ("ld.global", "st.global", "cp.async", "atom.global", "red.global", "ld.volatile.global")
    state_and_writes = ("ld.global.v4", "ld.global.nc.v4", "cp.async", "st.global", "atom.global", "red.global")
    writes = ("st.global", "atom.global", "red.global")
    early = read_first = 0
    for kind, cfg in kernel_configs():
        name = cfg.tag
        body = compile_variant(kind, cfg).__ptx__.split(".entry", 1)[1]
        if "_pdl" not in name:
            assert "griddepcontrol" not in body, name
            continue
        wait = body.index("griddepcontrol.wait")
        ops = writes if "_readfirst" in name else state_and_writes if "_early" in name else memory_ops
        early += "_early" in name
        read_first += "_readfirst" in name
        first_access = min(i for i in (body.find(op) for op in ops) if i >= 0)
        assert wait < first_access < len(body), name
        assert wait < body.index("griddepcontrol.launch_dependents"), name
    assert early >= 4  # the split, cluster, handoff and pipelined kernels
    assert read_first >= 2  # the step save, both head widths


def test_handoff_kernel_publishes_before_it_counts(ptx_reports):
    """The handoff kernel's order: x stores, a GPU-scope fence, the acq_rel arrival atomic, a
    fence, then the scratch read back through L2 (``ld.global.cg``), not L1."""
    from dsv4_compressor.impl.cutedsl.ptx import compile_variant

    handoffs = [(kind, cfg) for kind, cfg in kernel_configs() if kind == "fused_handoff"]
    for kind, cfg in handoffs[:2]:
        name = cfg.tag
        body = compile_variant(kind, cfg).__ptx__.split(".entry", 1)[1]
        arrival = body.index("atom.global.acq_rel.add")
        assert body.rindex("fence.acq_rel.gpu", 0, arrival) > body.index("st.global"), name
        assert arrival < body.index("fence.acq_rel.gpu", arrival) < body.index("ld.global.cg.v2.f32", arrival), name


def test_exact_arithmetic_is_present(ptx_reports):
    by_name = {r.variant: r for r in ptx_reports}
    pool = by_name["c128pool_block8_bs8_w8_t64_pdl"]
    assert pool.counts["div.rn.f32"] >= 2 and pool.counts["ld.global.v4"] == 16  # 8 rows x (kv, score)
    fused = next(r for n, r in by_name.items() if n.startswith("c4_bs4_flashmla"))
    assert fused.counts["sqrt.rn.f32"] == 1 and fused.counts["cvt.e4m3"] >= 1 and fused.counts["cvt.bf16"] >= 1


# ---- compile cache -----------------------------------------------------------------------
def test_compile_cache_returns_the_same_object():
    cfg = config.C128PoolConfig(8, 8)
    first = compile_cache.compile_kernel("split_pool", cfg)
    assert compile_cache.compile_kernel("split_pool", config.C128PoolConfig(8, 8)) is first
    assert compile_cache.compile_kernel("split_pool", config.C128PoolConfig(8, 4)) is not first


def test_each_compile_names_its_target_in_one_process(monkeypatch):
    """The DSL reads CUTE_DSL_ARCH once per process; a compile names its target (``--gpu-arch``),
    so Hopper and Blackwell PTX come from one process, each cached under its own target."""
    from dsv4_compressor.impl.cutedsl.ptx import compile_variant, knows_target

    cfg = config.C128PoolConfig(8, 8)
    hopper, blackwell = (compile_variant("split_pool", cfg, target=t) for t in ("sm_90a", "sm_100a"))
    assert hopper is not blackwell and compile_variant("split_pool", cfg, target="sm_100a") is blackwell
    assert ".target sm_90a" in hopper.__ptx__ and ".target sm_100a" in blackwell.__ptx__
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")  # no target named: CUTE_DSL_ARCH as it is now
    assert compile_cache.target_arch() == "sm_100a" and compile_cache.target_arch("sm_103a") == "sm_103a"
    assert compile_cache.compile_kernel("split_pool", cfg, keep_ptx=True) is blackwell
    assert knows_target("sm_100a") and knows_target("sm_103a") and not knows_target("sm_999a")


# ---- static configurations ---------------------------------------------------------------
@pytest.mark.parametrize("make, needle", [
    (lambda: config.EntryFormat("fp8", 64, "bfloat16"), "layout"),
    (lambda: config.EntryFormat("bf16", 0, "bfloat16", 8), "entries_per_page"),
    (lambda: config.EntryFormat("bf16", 4, "float16", 8), "rms_norm_weight dtype"),
    (lambda: config.EntryFormat("bf16", 4, "float32", 16), "store_align"),
    (lambda: config.C4Config(0, None), "block_size"),
    (lambda: config.C4Config(4, None, 3), "tokens_per_cta"),
    (lambda: config.C128PoolConfig(4, 8), "rows_per_lookup"),
    (lambda: config.C128PoolConfig(8, 8, warps=6), "warps"),
    (lambda: config.C128PoolConfig(8, 8, tile=128), "tile"),
    (lambda: config.SaveConfig(8, 4, True), "compress_ratio"),
    (lambda: config.C128PoolConfig(8, 8, token_run=3), "token_run"),
    (lambda: config.C128PoolConfig(8, 8, token_run=64), "token_run"),
    (lambda: config.SplitStoreConfig(config.EntryFormat("bf16", 4, "float32", 8), 2, token_run=32), "tokens_per_cta"),
    (lambda: config.SaveConfig(128, 8, True, 4, token_run=32), "tokens_per_cta"),
    (lambda: config.FusedClusterConfig(config.C128PoolConfig(8, 8, token_run=32),
                                       config.EntryFormat("bf16", 4, "float32", 8)), "pool.token_run"),
    (lambda: config.FusedPipelinedConfig(config.C128PoolConfig(8, 8, kv_in_smem=True, token_run=2),
                                         config.EntryFormat("bf16", 4, "float32", 8)), "pool.token_run"),
    (lambda: Policy(split_runs=0), "split_runs"),
    (lambda: config.FusedHandoffConfig(config.C128PoolConfig(8, 8), config.EntryFormat("bf16", 4, "float32", 8)),
     "pool.kv_in_smem"),
    (lambda: config.FusedHandoffConfig(config.C128PoolConfig(8, 4, tile=32, kv_in_smem=True),
                                  config.EntryFormat("bf16", 4, "float32", 8)), "pool.tile"),
])
def test_configurations_reject_bad_values(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()


def test_cluster_sizes_follow_the_tile():
    entry = config.EntryFormat("bf16", 4, "float32", 8)
    assert config.FusedClusterConfig(config.C128PoolConfig(8, 8), entry).cluster_size == 8
    sixteen = config.FusedClusterConfig(config.C128PoolConfig(8, 4, tile=32), entry)
    assert sixteen.cluster_size == 16 and sixteen.pool.rows_per_lane == 4 and sixteen.pool.is_block8


def test_the_retired_stream_path_is_an_unknown_c128_path():
    with pytest.raises(ValueError, match="c128_path: expected one of 'auto', 'fused_cluster', 'fused_handoff', "
                                         "'fused_pipelined', 'split_block8', 'split_generic', got 'fused_stream'"):
        paths.choose("fused_stream", 128, 512, 8, 8, DEFAULT_POLICY)
    with pytest.raises(ValueError, match="expected fields of Policy or KernelShapes, got \\['stream'\\]"):
        DEFAULT_POLICY.with_overrides(stream=PoolShape(8, 32))


def _pool(path, block_size, num_tokens=1, policy=DEFAULT_POLICY, pdl=True, early_metadata=False):
    """The C128 pooling configuration of a path's first kernel for a flashmla_fp8 request."""
    request = PathRequest(128, block_size, num_tokens, "flashmla_fp8", 64, "bfloat16", 16, False, policy, pdl,
                          early_metadata and pdl)
    first = PATHS[path].configs(request)[0]
    return getattr(first, "pool", first)


def test_block8_and_generic_lookups():
    assert _pool("split_block8", 8).is_block8
    assert _pool("split_generic", 16).rows_per_lookup == 8
    assert _pool("split_generic", 4).rows_per_lookup == 4
    assert _pool("split_generic", 5).rows_per_lookup == 1
    with pytest.raises(ValueError, match="c128_path: 'split_block8' expected block_size a multiple of 8"):
        _pool("split_block8", 4)


def test_cluster_tile_follows_the_token_count():
    assert [paths.cluster_tile(t, DEFAULT_POLICY) for t in (1, 4, 5)] == [32, 32, 64]
    assert _pool("fused_cluster", 8, 1).tile == 32
    assert _pool("fused_cluster", 8, 128).tile == 64
    assert _pool("fused_cluster", 8, 128).kv_after_max
    assert not _pool("split_block8", 8, 128).kv_after_max
    pinned = DEFAULT_POLICY.with_overrides(cluster=PoolShape(8, 64, True, True))
    assert paths.cluster_tile(1, pinned) == 64


def test_split_kernels_take_runs_of_tokens_on_large_steps():
    """A run per CTA once T gives at least ``split_runs`` runs of it, doubling up to 32 tokens; the fused
    paths and small steps keep a token per CTA; the store kernel follows the compress kernel."""
    assert [paths.token_run(t, DEFAULT_POLICY) for t in (1, 64, 511, 512, 1024, 4608, 8192, 16384, 10**6)] == \
        [1, 1, 1, 2, 4, 16, 32, 32, 32]
    assert [paths.token_run(t, Policy(split_runs=1)) for t in (1, 2, 3, 4, 63, 64)] == [1, 2, 2, 4, 32, 32]
    assert paths.token_run(16384, Policy(split_runs=1 << 30)) == 1
    assert _pool("split_generic", 5, 16384).token_run == 32 and _pool("split_block8", 8, 4608).token_run == 16
    assert _pool("split_block8", 8, 64).token_run == 1
    assert _pool("fused_pipelined", 8, 16384).token_run == 1 and _pool("fused_cluster", 8, 16).token_run == 1
    request = PathRequest(128, 8, 16384, "flashmla_fp8", 64, "bfloat16", 16, False, DEFAULT_POLICY, True)
    pool, store = PATHS["split_block8"].configs(request)
    assert store.token_run == pool.token_run == 32
    grouped = DEFAULT_POLICY.with_overrides(store_tokens_per_cta=2)
    assert PATHS["split_block8"].configs(dataclasses.replace(request, policy=grouped))[1].token_run == 1
    # the step call's save: four token groups a CTA by default; runs (one group a CTA) for a ring's tail saves
    # only where the policy asks for them
    ring, paged = config.StateFormat("bfloat16", "compress", True, True), config.StateFormat(rows_from_inputs=True)
    runs = DEFAULT_POLICY.with_overrides(step_save_runs=True, step_save_tokens_per_cta=1)  # runs take one group
    assert paths.step_save_config(128, 8, True, DEFAULT_POLICY, True, 512, ring, 16384).token_run == 1  # 4 groups
    assert paths.step_save_config(128, 8, True, runs, True, 512, ring, 16384).token_run == 32
    assert paths.step_save_config(128, 8, True, runs, True, 512, ring, 16384).state == ring.stored
    assert paths.step_save_config(128, 8, True, runs, True, 512, paged, 16384).token_run == 1
    assert paths.step_save_config(4, 4, True, runs, True, 512, ring, 64).token_run == 1
    # it reads its inputs before the grid-dependency wait with PDL and no runs (its predecessor is the
    # step's own compress)
    assert paths.step_save_config(128, 8, True, DEFAULT_POLICY, True, 512, ring, 16384).inputs_before_wait
    assert not paths.step_save_config(128, 8, True, DEFAULT_POLICY, False, 512, ring, 16384).inputs_before_wait
    assert not paths.step_save_config(128, 8, True, runs, True, 512, ring, 16384).inputs_before_wait
    # its token groups a CTA: the step's own shape (not save_partial_states'); a shape of several groups
    # keeps them and takes no runs, as the split store does
    grouped = DEFAULT_POLICY.with_overrides(step_save_tokens_per_cta=4, save_tokens_per_cta=2)
    assert paths.step_save_config(128, 8, True, DEFAULT_POLICY, True, 512, ring, 16384).tokens_per_cta == 4
    single = DEFAULT_POLICY.with_overrides(step_save_tokens_per_cta=1)
    assert paths.step_save_config(128, 8, True, single, True, 512, ring, 16384).tokens_per_cta == 1
    assert paths.step_save_config(128, 8, True, grouped, True, 512, ring, 16384).tokens_per_cta == 4
    assert paths.save_config(128, 8, True, grouped, True, 512).tokens_per_cta == 2
    both = grouped.with_overrides(step_save_runs=True)
    assert (paths.step_save_config(128, 8, True, both, True, 512, ring, 16384).tokens_per_cta,
            paths.step_save_config(128, 8, True, both, True, 512, ring, 16384).token_run) == (4, 1)
    assert paths.step_save_config(128, 8, True, runs.with_overrides(save_tokens_per_cta=2), True, 512, ring,
                                  16384).token_run == 32
    assert paths.step_save_config(128, 8, True, both, True, 512, paged, 16384).tokens_per_cta == 4
    with pytest.raises(ValueError, match="step_save_runs"):
        Policy(step_save_runs=1)


def test_a_run_of_tokens_waits_for_every_warp_between_its_tokens():
    """The store kernel's groups share their partial sums of squares through shared memory: on a run
    of tokens, a second barrier keeps a fast warp from writing the next token's partial before the
    others have read this token's (one barrier per token; two in the run's loop)."""
    from dsv4_compressor.impl.cutedsl.ptx import compile_variant

    entry = config.EntryFormat("flashmla_fp8", 64, "bfloat16", 16)
    one = compile_variant("split_store", config.SplitStoreConfig(entry, 1, True)).__ptx__
    run = compile_variant("split_store", config.SplitStoreConfig(entry, 1, True, 32)).__ptx__
    assert one.count("bar.sync") == 1 and run.count("bar.sync") == 2


def test_pdl_and_early_metadata_are_explicit_choices():
    assert _pool("split_block8", 8).pdl and not _pool("split_block8", 8).early_metadata
    assert not _pool("split_block8", 8, pdl=False).pdl
    assert _pool("fused_handoff", 8, early_metadata=True).early_metadata
    assert not _pool("fused_handoff", 8, pdl=False, early_metadata=True).early_metadata  # no wait to read ahead of
    assert _pool("fused_cluster", 8, policy=Policy(early_metadata=True)).early_metadata


def test_auto_dispatch():
    def choose(c128_path, num_tokens, block_size, policy=DEFAULT_POLICY):
        return paths.choose(c128_path, 128, 512, num_tokens, block_size, policy).name

    assert choose("auto", 1, 8) == "fused_cluster"
    assert choose("auto", 16, 8) == "fused_cluster"
    assert choose("auto", 17, 8) == "fused_handoff"
    assert choose("auto", 64, 5) == "fused_handoff"
    assert choose("auto", 65, 8) == "fused_pipelined"  # any block size: generic lookups where Block8 cannot
    assert choose("auto", 65, 4) == "fused_pipelined"
    assert choose("auto", 4608, 5) == "fused_pipelined"
    assert choose("split_generic", 65, 8) == "split_generic"
    assert choose("split_block8", 65, 8) == "split_block8"
    assert choose("auto", 1, 8, Policy(cluster_max_tokens=0, handoff_max_tokens=0)) == "fused_pipelined"
    assert choose("auto", 100000, 8, Policy(handoff_max_tokens=10**9)) == "fused_handoff"
    # one path for a ratio and head width: C4 and the indexer, whatever c128_path names (a typo still raises)
    assert paths.choose("split_block8", 4, 512, 8, 5, DEFAULT_POLICY).name == "c4"
    assert paths.choose("auto", 128, 128, 8, 5, DEFAULT_POLICY).name == "indexer"
    with pytest.raises(ValueError, match="c128_path: expected one of"):
        choose("fused", 1, 8)
    with pytest.raises(ValueError, match="c128_path: 'split_block8' expected block_size a multiple of 8"):
        choose("split_block8", 65, 4)


def test_policies_are_frozen_values():
    policy = Policy(cluster_max_tokens=8)
    with pytest.raises(AttributeError):
        policy.cluster_max_tokens = 4
    assert policy == Policy(cluster_max_tokens=8) and hash(policy) == hash(Policy(cluster_max_tokens=8))
    assert policy != DEFAULT_POLICY
    changed = DEFAULT_POLICY.with_overrides(c4_tokens_per_cta=2, handoff_max_tokens=0)
    assert changed.shapes.c4_tokens_per_cta == 2 and changed.handoff_max_tokens == 0
    assert DEFAULT_POLICY.shapes.c4_tokens_per_cta == 1
    with pytest.raises(ValueError, match="cluster_tiles"):
        DEFAULT_POLICY.with_overrides(cluster_tiles=32)


# ---- wrappers: ValueError before anything is compiled or launched -------------------------------
def _cpu_call(compress_ratio=128, block_size=8, layout="flashmla_fp8", entries=4):
    return wrapper_arguments(compress_ratio, block_size, layout, entries, head_dim=512)


@pytest.mark.parametrize("change, needle", [
    (dict(positions=lambda a: a["positions"].to(torch.int32)), "positions: expected dtype int64"),
    (dict(state_cache=lambda a: a["state_cache"].to(torch.float64)), "state_cache: expected dtype float32"),
    (dict(rms_norm_weight=lambda a: a["rms_norm_weight"].to(torch.float16)), "rms_norm_weight: expected dtype bfloat16 or float32"),
    (dict(k_cache=lambda a: a["k_cache"][:, :, :576]), "k_cache"),
    (dict(kv_slot_mapping=lambda a: a["kv_slot_mapping"][:2]), "kv_slot_mapping: expected length T"),
    (dict(block_size=lambda a: 3), "state_cache: expected shape\\[1\\] = 3"),
])
def test_compress_norm_rope_store_rejects_bad_arguments(no_compile, change, needle):
    args = _cpu_call()
    for key, fn in change.items():
        args[key] = fn(args)
    with pytest.raises(ValueError, match=needle):
        api.compress_norm_rope_store(**args, compress_ratio=128)


def test_wrong_ratio_and_layout_are_rejected(no_compile):
    with pytest.raises(ValueError, match="compress_ratio"):
        api.compress_norm_rope_store(**_cpu_call(), compress_ratio=64)
    with pytest.raises(ValueError, match="layout"):
        api.compress_norm_rope_store(**_cpu_call(), compress_ratio=128, layout="fp8")
    with pytest.raises(ValueError, match="fp8_scale"):
        api.compress_norm_rope_store(**_cpu_call(layout="fp8_per_tensor"), compress_ratio=128, layout="fp8_per_tensor")


def test_forced_path_that_the_block_size_does_not_allow(no_compile, monkeypatch):
    monkeypatch.setattr(buffers, "require_cuda", lambda name, tensor: None)  # CPU tensors stand for CUDA ones
    args = _cpu_call(block_size=4)
    with pytest.raises(ValueError, match="c128_path: 'split_block8' expected block_size a multiple of 8"):
        api.compress_norm_rope_store(**args, compress_ratio=128, c128_path="split_block8")
    with pytest.raises(ValueError, match="c128_path: expected one of"):
        api.compress_norm_rope_store(**args, compress_ratio=128, c128_path="cluster")


def test_bad_workspace_is_rejected(no_compile):
    args = _cpu_call()
    T = args["positions"].shape[0]
    for workspace, needle in (
        (torch.empty(T, 512, dtype=torch.float64), "workspace: expected dtype float32"),
        (torch.empty(T - 1, 512), "workspace: expected float32 \\[S >= "),
        (torch.empty(T, 514)[:, :512], r"workspace: expected strides \(multiple of 4, 1\)"),
    ):
        with pytest.raises(ValueError, match=needle):
            api.compress_norm_rope_store(**args, compress_ratio=128, c128_path="split_generic", workspace=workspace)


def test_cpu_tensors_are_rejected_after_validation(no_compile):
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of \\('cuda',\\)"):
        api.compress_norm_rope_store(**_cpu_call(), compress_ratio=128)


def test_compress_and_save_reject_bad_arguments(no_compile):
    args = _cpu_call()
    pooling = {k: args[k] for k in ("state_cache", "token_to_req_indices", "positions", "slot_mapping", "block_table",
                                    "block_size", "kv_slot_mapping")}
    with pytest.raises(ValueError, match="out: expected dtype float32"):
        api.compress(**pooling, compress_ratio=128, out=torch.empty(4, 512, dtype=torch.float16))
    with pytest.raises(ValueError, match="block_table: expected dtype int32"):
        api.compress(**{**pooling, "block_table": pooling["block_table"].long()}, compress_ratio=128)
    kv_score = torch.zeros(4, 1024)
    ape = torch.zeros(128, 512)
    with pytest.raises(ValueError, match="ape"):
        api.save_partial_states(kv_score, ape[:, :256], args["positions"], args["slot_mapping"], args["state_cache"], 8)
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of"):
        api.save_partial_states(kv_score, ape, args["positions"], args["slot_mapping"], args["state_cache"], 8)


def test_save_and_compress_validates_the_compress_arguments_first(no_compile):
    """The combined call rejects a bad compress argument before anything (the save) launches."""
    args = _cpu_call()
    kv_score, ape = torch.zeros(4, 1024), torch.zeros(128, 512)
    with pytest.raises(ValueError, match="positions: expected dtype int64"):
        api.save_and_compress_norm_rope_store(kv_score, ape, **{**args, "positions": args["positions"].int()},
                                              compress_ratio=128)
    with pytest.raises(ValueError, match="layout"):
        api.save_and_compress_norm_rope_store(kv_score, ape, **args, compress_ratio=128, layout="fp8")


def test_import_needs_no_cutlass():
    """The package imports torch only; CuTe DSL is loaded on first use."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['cutlass'] = None; import dsv4_compressor.impl.cutedsl as m; "
            "print(m.SUPPORTED_DEVICES)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "cuda" in result.stdout


# ---- named variants ------------------------------------------------------------------------------
def test_variants_are_frozen_choices():
    from dsv4_compressor.impl.cutedsl import variants

    assert variants.cluster16.policy.shapes.cluster.tile == 32 and variants.cluster16.c128_path == "fused_cluster"
    assert variants.nopdl.pdl is False and not variants.nopdl.c128_compress_only
    assert variants.fused_pipelined.c128_compress_only and variants.cluster16.c128_compress_only
    with pytest.raises(ValueError, match="c128_path"):
        variants.Variant("bad", "cluster")
    with pytest.raises(AttributeError):
        variants.cluster16.pdl = False


def test_variants_load_as_conformance_implementations():
    from dsv4_compressor.conformance.implementations import load_implementation

    loaded = load_implementation("dsv4_compressor.impl.cutedsl.variants:cluster16")
    assert loaded.devices == ("cuda",) and loaded.target.policy.shapes.cluster.tile == 32


# ---- the pipelined kernel's host side ----------------------------------------------------------
def test_pipelined_grid_is_the_resident_clusters_with_a_token_each():
    clusters = occupancy.pipelined_clusters
    assert clusters(1, 45, DEFAULT_POLICY) == 1
    assert clusters(100000, 45, DEFAULT_POLICY) == 45
    assert clusters(256, 30, DEFAULT_POLICY) == 29  # runs of 9 tokens: 29 clusters cover 256
    assert clusters(100, None, DEFAULT_POLICY) == 100  # no GPU: a cluster per token
    assert clusters(100000, 45, Policy(pipelined_max_clusters=3)) == 3
    for tokens in range(1, 400):  # every cluster's run starts below T
        for resident in (1, 7, 30, 45):
            g = clusters(tokens, resident, DEFAULT_POLICY)
            share = -(-tokens // g)
            assert g <= resident and (g - 1) * share < tokens <= g * share
    with pytest.raises(ValueError, match="pipelined_max_clusters: expected None or an integer >= 1, got 0"):
        Policy(pipelined_max_clusters=0)


def test_without_the_driver_the_grid_is_half_the_device_cta_slots():
    """No driver answer: half the CTA slots of the device's SM count, in clusters, for any SM count."""
    fallback = occupancy.fallback_clusters
    assert fallback(132, 3, 8) == 24 and fallback(148, 3, 8) == 27 and fallback(160, 2, 8) == 20
    assert fallback(1, 1, 8) == 1  # never no cluster
    rng = random.Random(0)
    for _ in range(2000):  # any grouping of the SMs into GPCs that each hold a cluster holds at least as many
        ctas_per_sm, size = rng.choice((1, 2, 3, 4)), rng.choice((2, 4, 8, 16))
        gpcs = [n for n in (rng.randint(1, 20) for _ in range(rng.randint(1, 12))) if n * ctas_per_sm >= size]
        if gpcs:
            assert sum(n * ctas_per_sm // size for n in gpcs) >= fallback(sum(gpcs), ctas_per_sm, size), gpcs
    for name, args in (("sm_count", (0, 3, 8)), ("ctas_per_sm", (132, 2.5, 8)), ("cluster_size", (132, 3, True))):
        with pytest.raises(ValueError, match=f"{name}: expected an integer >= 1, got"):
            fallback(*args)


@pytest.mark.parametrize("sm_count, resident, expected", [(132, None, 24), (148, None, 27), (100, None, 18),
                                                          (148, 61, 61), (None, None, 100000)])
def test_persistent_grid_takes_the_device_facts(monkeypatch, sm_count, resident, expected):
    """The grid comes from the device: the driver's resident clusters, else the fallback of the
    device's SM count (faked here), else (no GPU) a cluster per token."""
    monkeypatch.setattr(occupancy, "resident_clusters", lambda *args: resident)
    request = PathRequest(128, 8, 100000, "flashmla_fp8", 64, "bfloat16", 16, False, DEFAULT_POLICY, True)
    facts = buffers.LaunchFacts(torch.device("cuda" if sm_count else "cpu"), 16, sm_count)
    config = PATHS["fused_pipelined"].configs(request)[0]
    assert occupancy.persistent_grid(None, config, request, facts) == expected


class _StandInDriver:
    """The driver calls of the occupancy query, recorded; ``fail`` names the one that errs."""

    CUfunction_attribute = type("Attr", (), {"CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": "max_dynamic_smem",
                                             "CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT": "carveout"})
    CUlaunchAttributeID = type("AttrId", (), {"CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION": "cluster_dimension"})

    def __init__(self, fail=None, clusters=45):
        self.calls, self.fail, self.clusters = [], fail, clusters
        self.CUlaunchConfig = lambda: type("Config", (), {})()

    def CUlaunchAttribute(self):
        attribute = type("Attribute", (), {})()
        attribute.value = type("Value", (), {})()
        attribute.value.clusterDim = type("Dim", (), {})()
        return attribute

    def _result(self, name, *values):
        self.calls.append(name)
        return (1 if name == self.fail else 0, *values)

    def cuDeviceGet(self, index):
        return self._result(f"device {index}", f"device {index}")

    def cuDevicePrimaryCtxRetain(self, device):
        return self._result(f"retain {device}", "primary")

    def cuCtxPushCurrent(self, context):
        return self._result(f"push {context}")

    def cuCtxPopCurrent(self):
        return self._result("pop", "primary")

    def cuDevicePrimaryCtxRelease(self, device):
        return self._result(f"release {device}")

    def cuLibraryLoadData(self, cubin, *_):
        return self._result("load", "library")

    def cuLibraryEnumerateKernels(self, count, library):
        return self._result("enumerate", ["kernel"])

    def cuKernelGetFunction(self, kernel):
        return self._result("function", "function")

    def cuFuncSetAttribute(self, function, attribute, value):
        return self._result(f"{attribute}={value}")

    def cuOccupancyMaxActiveClusters(self, function, config):
        self.config = config
        return self._result("occupancy", self.clusters)

    def cuLibraryUnload(self, library):
        return self._result("unload")


@pytest.mark.parametrize("fail", [None, "occupancy"])
def test_occupancy_query_asks_for_the_kernels_cluster_shape_and_unloads_its_module(monkeypatch, fail):
    """The driver is asked for clusters of the kernel's own shape, threads and shared memory (all
    the carveout in shared memory, as the launch asks), inside the device's primary context (a
    fresh process has none current yet); the query's module is unloaded and the context released
    whether or not the count comes back; a failed call raises and names itself."""
    from cuda import bindings

    from dsv4_compressor.impl.cutedsl.host import occupancy

    driver = _StandInDriver(fail=fail)
    monkeypatch.setattr(bindings, "driver", driver)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    if fail:
        with pytest.raises(RuntimeError, match="CUDA driver call failed: 1"):
            occupancy._query(b"cubin", torch.device("cuda", 1), 256, 73000, 8)
    else:
        assert occupancy._query(b"cubin", torch.device("cuda", 1), 256, 73000, 8) == 45
        config = driver.config
        (shape,) = config.attrs
        assert (config.blockDimX, config.sharedMemBytes, config.numAttrs) == (256, 73000, 1)
        assert config.gridDimX % 8 == 0 and shape.id == "cluster_dimension"
        assert (shape.value.clusterDim.x, shape.value.clusterDim.y, shape.value.clusterDim.z) == (8, 1, 1)
    assert "max_dynamic_smem=73000" in driver.calls and "carveout=100" in driver.calls
    assert driver.calls[:4] == ["device 1", "retain device 1", "push primary", "load"]
    assert driver.calls[-3:] == ["unload", "pop", "release device 1"]


def test_resident_clusters_without_a_driver_answer_is_none_and_asked_once(monkeypatch):
    """No cubin or a device other than CUDA: None (the host then sizes the grid from the SM
    count); a driver error: None and a warning; an answer is kept per compiled kernel and device."""
    from dsv4_compressor.impl.cutedsl.host import occupancy

    asked = []

    def query(cubin, device, threads, smem_bytes, cluster_size):
        asked.append(cubin)
        if cubin == b"old driver":
            raise RuntimeError("CUDA driver call failed: 500")
        return 30

    def compiled(cubin):
        return type("Compiled", (), {"artifacts": type("Artifacts", (), {"CUBIN": cubin})()})()

    monkeypatch.setattr(occupancy, "_query", query)
    monkeypatch.setattr(occupancy, "_RESIDENT", {})
    cuda = torch.device("cuda", 0)
    assert occupancy.resident_clusters(compiled(b"cubin"), torch.device("cpu"), 256, 73000, 8) is None
    assert occupancy.resident_clusters(object(), cuda, 256, 73000, 8) is None
    assert occupancy.resident_clusters(compiled(b"old driver"), cuda, 256, 73000, 8) is None
    kernel = compiled(b"cubin")
    assert occupancy.resident_clusters(kernel, cuda, 256, 73000, 8) == 30
    assert occupancy.resident_clusters(kernel, cuda, 256, 73000, 8) == 30
    assert asked == [b"old driver", b"cubin"]


def test_handoff_counters_are_filled_once_per_capture_until_a_fill_runs_outside(monkeypatch):
    """A counter array first used inside graph captures gets one zero-fill per capture (each
    graph must start from zeros, whichever is replayed first), not one per call; the first
    use outside capture fills it, and from then on nothing does (the kernel keeps it zero)."""
    device = torch.device("cpu")  # the bookkeeping only; the stream and capture ids are planted
    capture = [1]
    monkeypatch.setattr(buffers, "_current_stream", lambda d: 12345)
    monkeypatch.setattr(buffers, "_capture_id", lambda d: capture[0])
    monkeypatch.setattr(buffers, "_COUNTERS", {})
    monkeypatch.setattr(buffers, "_OUTGROWN", [])
    first = buffers.handoff_counters(device, 10)
    assert first.dtype == torch.int32 and first.numel() >= 10 and not first.any()
    first[3] = 7  # stands for "no fill issued": a fill would clear it
    assert buffers.handoff_counters(device, 10)[3] == 7  # same capture: its one fill precedes this call
    capture[0] = 2
    assert not buffers.handoff_counters(device, 10).any()  # another graph: a fill of its own
    first[3] = 7
    capture[0] = None
    assert not buffers.handoff_counters(device, 10).any()  # outside capture: filled for good
    first[3] = 7
    assert buffers.handoff_counters(device, 10)[3] == 7
    capture[0] = 3
    assert buffers.handoff_counters(device, 10)[3] == 7  # no more fills, in capture or not
    bigger = buffers.handoff_counters(device, 10**5)
    assert bigger.numel() >= 10**5 and not bigger.any()
    assert any(t is first for t in buffers._OUTGROWN)  # kept alive for graphs that captured it
