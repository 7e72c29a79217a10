"""CPU checks of the C4 variant probe: its configurations and its table (the timings need a GPU)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


def test_variants_start_from_the_dispatchers_defaults_and_cover_every_knob():
    from dsv4_compressor.bench.c4_variants import c4_configs, indexer_configs
    from dsv4_compressor.impl.cutedsl.dispatch import DEFAULT_POLICY

    c4, indexer = c4_configs(), indexer_configs()
    assert (c4["default"].tokens_per_cta, c4["default"].pdl) == (DEFAULT_POLICY.shapes.c4_tokens_per_cta, True)
    assert not (c4["default"].lookups_first or c4["default"].entry_inputs_first or c4["default"].min_ctas_per_sm)
    assert (indexer["default"].warps, indexer["default"].pdl) == (DEFAULT_POLICY.shapes.indexer_c4_warps, True)
    assert (indexer["default"].tokens_per_warp, indexer["default"].min_ctas_per_sm) == (1, 0)
    for configs in (c4, indexer):
        assert len({c.tag for c in configs.values()}) == len(configs)  # every row a different kernel
    assert all(any(getattr(c, knob) for c in c4.values()) for knob in ("lookups_first", "entry_inputs_first", "min_ctas_per_sm"))
    assert any(c.tokens_per_warp > 1 for c in indexer.values()) and any(c.min_ctas_per_sm for c in indexer.values())


def test_table_has_a_row_per_variant_and_a_column_per_size():
    from dsv4_compressor.bench.c4_variants import table

    results = {1: {"default": (2.5, 0.4), "fast": (2.25, 0.45)}, 1024: {"default": (14.0, 58.6), "fast": (10.0, 82.04)}}
    lines = table("C4", results, ["default", "fast"]).splitlines()
    assert lines[2] == "| variant | T=1 | T=1024 |"
    assert lines[4] == "| default | 2.50 µs (0.4%) | 14.00 µs (58.6%) |"
    assert lines[5] == "| fast | 2.25 µs (0.5%) | 10.00 µs (82.0%) |"
