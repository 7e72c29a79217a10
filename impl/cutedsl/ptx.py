"""Every static configuration CI should compile, with its PTX, for the SPEC §2 PTX rules.

``python -m dsv4_compressor ptx-check`` calls :func:`ptx_variants` and applies
:func:`dsv4_compressor.impl.ptx_rules.check_ptx` (only ``.rn`` arithmetic, no FMA, no
approximate functions, no ``.ftz``, 128-bit loads where state rows stream). The list
covers every code path of every kernel: the three layouts with both weight dtypes and
both store alignments, block sizes that take each lookup granularity, ``B = 1`` and a
large ``B``, and the sweepable mapping knobs. Compilation needs no GPU; set
``CUTE_DSL_ARCH=sm_90a`` (done here when unset) or the DSL silently targets sm_100a.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Iterator

TARGET = "sm_90a"
_LAYOUT_ALIGNS = (("flashmla_fp8", 16), ("bf16", 8), ("bf16", 2), ("fp8_per_tensor", 4), ("fp8_per_tensor", 1))


def variant_configs() -> Iterator[tuple[str, str, object, bool]]:
    """``(variant name, kernel kind, static config, streams state rows)`` for every CI variant."""
    from .config import (C4Config, C128PoolConfig, ClusterConfig, EntryFormat, HandoffConfig, PipelinedConfig, SaveConfig,
                         StoreConfig)

    def entry(layout="flashmla_fp8", align=16, weight="bfloat16", pages=64):
        return EntryFormat(layout, pages, weight, align)

    layouts = [(layout, align, "bfloat16") for layout, align in _LAYOUT_ALIGNS] + [("flashmla_fp8", 16, "float32")]
    for layout, align, weight in layouts:  # each layout/alignment, and the other weight dtype once
        e = entry(layout, align, weight)
        yield f"c4_{e.tag}", "c4", C4Config(4, e), True
        yield f"c128_store_{e.tag}", "c128_store", StoreConfig(e), False
        for tile in (64, 32):  # 8- and 16-CTA clusters
            cfg = ClusterConfig(C128PoolConfig(8, tile // 8, tile=tile, kv_in_smem=True, kv_after_max=True), e)
            yield cfg.tag, "c128_cluster", cfg, True
        handoff = HandoffConfig(C128PoolConfig(8, 8, kv_in_smem=True, kv_after_max=True), e)
        yield handoff.tag, "c128_handoff", handoff, True
        pipelined = PipelinedConfig(C128PoolConfig(8, 8, kv_in_smem=True), e)
        yield pipelined.tag, "c128_pipelined", pipelined, True
    for block_size in (1, 2, 3, 8, 16):  # lookup runs of 1, 2, 1, 4, 4 rows
        cfg = C4Config(block_size, entry(pages=1))
        yield cfg.tag, "c4", cfg, True
    for tokens_per_cta in (2, 4):
        cfg = C4Config(4, entry(), tokens_per_cta)
        yield cfg.tag, "c4", cfg, True
    for block_size in (4, 3):
        cfg = C4Config(block_size, None)
        yield cfg.tag, "c4", cfg, True
    for block_size, rows_per_lookup, warps, tile in (
        (8, 8, 8, 64), (16, 8, 8, 64), (4, 4, 8, 64), (5, 1, 8, 64), (2, 2, 8, 64), (8, 1, 8, 64),
        (8, 4, 16, 64), (16, 16, 4, 64), (8, 8, 4, 64), (8, 4, 8, 32), (4, 4, 8, 32),
    ):
        for staged in (False, True) if (warps, tile) == (8, 64) and block_size in (8, 5) else (False,):  # kv_in_smem
            cfg = C128PoolConfig(block_size, rows_per_lookup, warps, tile, staged)
            yield cfg.tag, "c128_pool", cfg, True
    for staged in (False, True):  # kv loads issued after the window max
        cfg = C128PoolConfig(8, 8, kv_in_smem=staged, kv_after_max=True)
        yield cfg.tag, "c128_pool", cfg, True
    for pages, tokens_per_cta in ((1, 1), (64, 2), (7, 4)):
        cfg = StoreConfig(entry(pages=pages), tokens_per_cta)
        yield cfg.tag, "c128_store", cfg, False
    for pool in (C128PoolConfig(4, 4, kv_in_smem=True), C128PoolConfig(5, 1, kv_in_smem=True), C128PoolConfig(8, 8),
                 C128PoolConfig(8, 4, warps=16), C128PoolConfig(16, 16, warps=4),
                 C128PoolConfig(5, 1, tile=32, kv_in_smem=True), C128PoolConfig(8, 2, warps=16, tile=32),
                 C128PoolConfig(8, 8, kv_in_smem=True), C128PoolConfig(8, 4, tile=32, kv_after_max=True)):
        cfg = ClusterConfig(pool, entry(pages=1))
        yield cfg.tag, "c128_cluster", cfg, True
    for pool in (C128PoolConfig(5, 1, kv_in_smem=True), C128PoolConfig(4, 4, kv_in_smem=True, kv_after_max=True),
                 C128PoolConfig(16, 8, kv_in_smem=True)):
        cfg = HandoffConfig(pool, entry(pages=1))
        yield cfg.tag, "c128_handoff", cfg, True
    for pool in (C128PoolConfig(5, 1, kv_in_smem=True), C128PoolConfig(4, 4, kv_in_smem=True),
                 C128PoolConfig(16, 8, kv_in_smem=True)):
        cfg = PipelinedConfig(pool, entry(pages=1))
        yield cfg.tag, "c128_pipelined", cfg, True
    cfg = PipelinedConfig(C128PoolConfig(8, 8, kv_in_smem=True), entry(), ctas_per_sm=3)
    yield cfg.tag, "c128_pipelined", cfg, True
    for ratio in (4, 128):
        for vector in (True, False):
            cfg = SaveConfig(ratio, 4 if ratio == 4 else 8, vector)
            yield cfg.tag, "save", cfg, vector
    yield from indexer_variant_configs()
    # programmatic dependent launch: every kernel kind once (griddepcontrol at the top)
    pdl_pool = C128PoolConfig(8, 8, kv_in_smem=True, kv_after_max=True, pdl=True)
    for kind, cfg, streams in (
        ("c4", C4Config(4, entry(), pdl=True), True), ("c4", C4Config(4, None, pdl=True), True),
        ("c128_pool", C128PoolConfig(8, 8, pdl=True), True), ("c128_store", StoreConfig(entry(), pdl=True), False),
        ("c128_cluster", ClusterConfig(pdl_pool, entry()), True),
        ("c128_cluster", ClusterConfig(C128PoolConfig(8, 4, tile=32, kv_in_smem=True, kv_after_max=True, pdl=True), entry()), True),
        ("c128_handoff", HandoffConfig(pdl_pool, entry()), True),
        ("c128_pipelined", PipelinedConfig(replace(pdl_pool, kv_after_max=False), entry()), True),
        # metadata and block table read before the wait (Policy.early_metadata)
        ("c128_pool", C128PoolConfig(8, 8, pdl=True, early_metadata=True), True),
        ("c128_cluster", ClusterConfig(replace(pdl_pool, early_metadata=True), entry()), True),
        ("c128_cluster", ClusterConfig(C128PoolConfig(8, 4, tile=32, kv_in_smem=True, kv_after_max=True, pdl=True,
                                                      early_metadata=True), entry()), True),
        ("c128_handoff", HandoffConfig(replace(pdl_pool, early_metadata=True), entry()), True),
        ("c128_pipelined", PipelinedConfig(replace(pdl_pool, kv_after_max=False, early_metadata=True), entry()), True),
        ("save", SaveConfig(128, 8, True, pdl=True), True),
    ):
        yield cfg.tag, kind, cfg, streams


def indexer_variant_configs() -> Iterator[tuple[str, str, object, bool]]:
    """The indexer compressor (SPEC §12): both layouts with and without the rotation, C4 and
    C128, lookup runs of 1, 2 and 4 (C4) and 1, 4, 8 and 16 rows (C128), both weight dtypes, ``B``
    of 1, a few and many, every mapping width, PDL; and the save kernel at the indexer's
    state widths."""
    from .config import SaveConfig
    from .indexer_config import IndexerConfig

    for ratio, bs, layout, hadamard, pages, weight, warps, pdl in (
        (4, 16, "indexer_fp8", False, 64, "bfloat16", 1, True),  # the production configuration
        (4, 16, "indexer_mxfp4", True, 64, "bfloat16", 4, True),
        (4, 8, "indexer_fp8", True, 1, "float32", 8, False),
        (4, 3, "indexer_mxfp4", False, 7, "bfloat16", 2, False),
        (4, 2, "indexer_mxfp4", True, 64, "bfloat16", 1, True),
        (128, 8, "indexer_fp8", False, 64, "bfloat16", 16, True),
        (128, 5, "indexer_mxfp4", True, 2, "float32", 16, False),
        (128, 4, "indexer_fp8", True, 3, "bfloat16", 8, False),
        (128, 16, "indexer_mxfp4", False, 1, "bfloat16", 8, True),
    ):
        cfg = IndexerConfig(ratio, bs, layout, hadamard, pages, weight, warps, pdl)
        yield cfg.tag, "indexer", cfg, True
    for ratio, bs, vector, pdl in ((4, 16, True, True), (4, 3, False, False), (128, 8, True, False)):
        cfg = SaveConfig(ratio, bs, vector, pdl=pdl, head_dim=128)
        yield cfg.tag, "save", cfg, vector


def compile_variant(kind: str, config, *, keep_ptx: bool = True):
    """The compiled TVM-FFI function of one variant (cached)."""
    from . import compile_cache
    from .indexer_launch import compile_indexer

    compile_fn = {
        "c4": compile_cache.compile_c4,
        "c128_pool": compile_cache.compile_c128_pool,
        "c128_store": compile_cache.compile_c128_store,
        "c128_cluster": compile_cache.compile_c128_cluster,
        "c128_handoff": compile_cache.compile_c128_handoff,
        "c128_pipelined": compile_cache.compile_c128_pipelined,
        "save": compile_cache.compile_save,
        "indexer": compile_indexer,
    }[kind]
    return compile_fn(config, keep_ptx=keep_ptx)


def ptx_variants() -> Iterator[tuple[str, str, dict]]:
    """Compile every variant for sm_90a; yield ``(variant_name, ptx_text, check options)``."""
    os.environ.setdefault("CUTE_DSL_ARCH", TARGET)
    seen = set()
    for name, kind, config, streams_rows in variant_configs():
        if name in seen:
            continue
        seen.add(name)
        compiled = compile_variant(kind, config)
        yield name, compiled.__ptx__, {"require_vector_loads": streams_rows}
