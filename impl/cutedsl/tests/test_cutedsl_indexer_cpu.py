"""CPU checks of the indexer compressor's CuTe DSL kernels (SPEC §12; no GPU needed).

- every indexer variant compiles for sm_90a, passes SPEC §2's PTX rules and uses no local
  memory;
- the PTX has the structure the kernels are built on: exactly the streamed state rows as
  128-bit requests (C4: kv by ``cp.async``), issued after every other load (C4: the request
  index with the metadata), one ``sqrt.rn``, the division per channel, the lane butterflies
  of the sum of squares, the amax (32 or 8 lanes) and the Hadamard spans 64..4, E4M3
  conversions only for ``indexer_fp8`` (E2M1 codes are integer work), two stores per lane;
- configurations reject bad values; the save kernel's widths follow the head width;
- the public wrappers reject bad indexer arguments with ``ValueError`` before anything is
  compiled or launched.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor.impl import ptx_rules  # noqa: E402
from dsv4_compressor.impl.cutedsl import api, config  # noqa: E402
from dsv4_compressor.impl.cutedsl.config import IndexerConfig  # noqa: E402
from dsv4_compressor.impl.cutedsl.ptx import compile_variant, kernel_configs, streams_rows  # noqa: E402
from cutedsl_test_calls import no_compile, wrapper_arguments  # noqa: E402,F401  (no_compile: a fixture)


@pytest.fixture(scope="module")
def indexer_ptx():
    """``[(config, ptx, report)]`` of every indexer kernel variant of SPEC §3's state (SPEC §13's
    formats: ``test_cutedsl_state_formats_cpu.py``)."""
    out = []
    for kind, cfg in kernel_configs():
        if kind != "indexer" or not cfg.state.is_default:
            continue
        ptx = compile_variant(kind, cfg).__ptx__
        out.append((cfg, ptx, ptx_rules.check_ptx("cutedsl", cfg.tag, ptx, require_target="sm_90a",
                                                  require_vector_loads=streams_rows(kind, cfg))))
    return out


def _body(ptx: str) -> str:
    return "\n".join(line.split("//")[0] for line in ptx.split(".entry", 1)[1].splitlines())


def test_variants_cover_both_layouts_rotations_and_ratios(indexer_ptx):
    covered = {(c.ratio, c.layout, c.hadamard) for c, _, _ in indexer_ptx}
    assert covered == {(r, layout, h) for r in (4, 128) for layout in ("indexer_fp8", "indexer_mxfp4") for h in (False, True)}
    assert {c.rows_per_lookup for c, _, _ in indexer_ptx if c.ratio == 4} == {1, 2, 4}
    assert {c.weight_dtype for c, _, _ in indexer_ptx} == {"float32", "bfloat16"}
    assert any(c.pdl for c, _, _ in indexer_ptx) and not all(c.pdl for c, _, _ in indexer_ptx)


def test_indexer_variants_pass_the_ptx_rules(indexer_ptx):
    failures = {r.variant: r.violations for _, _, r in indexer_ptx if not r.ok}
    assert not failures, failures
    assert all(r.counts["local memory"] == 0 for _, _, r in indexer_ptx), [r.variant for _, _, r in indexer_ptx]


_ROW_REQUEST = re.compile(r"\bld\.global(?:\.\w+)*|\bcp\.async\.cg\.shared\.global\b")


def test_state_rows_stream_as_128_bit_requests(indexer_ptx):
    """A lane requests its 4 kv and 4 score channels of each of its rows (8 rows for C4,
    ``128 / warps`` for C128) with one 16-byte request each: C128 two loads; C4 a load for the
    scores and a ``cp.async`` for the kv, waited for once; nothing else is a 16-byte request."""
    for cfg, ptx, report in indexer_ptx:
        staged = cfg.rows_per_warp if cfg.ratio == 4 else 0
        assert report.counts["ld.global.v4"] == 2 * cfg.rows_per_warp - staged, cfg.tag
        assert len(re.findall(r"\bcp\.async\.cg\.shared\.global\s+\[[^]]+\], \[[^]]+\], 16\b",
                              _body(ptx))) == staged, cfg.tag
        assert _body(ptx).count("cp.async.wait_group") == (staged > 0), cfg.tag


def test_every_other_load_precedes_the_state_rows(indexer_ptx):
    """Metadata, block-table entries, norm weights and cos/sin are all requested before the
    first state row, so the rows wait for one block-table round trip and nothing else waits
    for the rows but the arithmetic."""
    for cfg, ptx, _ in indexer_ptx:
        requests = _ROW_REQUEST.findall(_body(ptx))
        rows = [".v4" in op or op.startswith("cp.async") for op in requests]
        first_row = rows.index(True)
        assert all(rows[first_row:]), (cfg.tag, requests[first_row:])


def test_c4_request_is_read_before_the_activity_test(indexer_ptx):
    """C4: the request index is loaded by a load the compiler keeps in place
    (``ld.relaxed.gpu``), before the branch on the token's activity, so it travels with the
    metadata instead of costing a round trip of its own (with PDL, after the wait)."""
    for cfg, ptx, _ in indexer_ptx:
        body = _body(ptx)
        early = body.find("ld.relaxed.gpu.global.b32")
        assert (early >= 0) == (cfg.ratio == 4), cfg.tag
        if cfg.ratio == 4:
            branches = [m.start() for m in re.finditer(r"@%p\d+ bra\b", body)]
            assert branches[0] < early < branches[1], cfg.tag  # after the tok < T test, before the activity one
            assert (body.find("griddepcontrol.wait") < early) if cfg.pdl else "griddepcontrol" not in body, cfg.tag


def test_exact_finishing_arithmetic(indexer_ptx):
    for cfg, ptx, report in indexer_ptx:
        body = _body(ptx)
        assert report.counts["sqrt.rn.f32"] == 1, cfg.tag  # rr
        assert report.counts["div.rn.f32"] == 4 + 1, cfg.tag  # x of the lane's 4 channels, and 1 / sqrt
        if cfg.layout == "indexer_fp8":
            assert report.counts["cvt.e4m3"] >= 1, cfg.tag
        else:
            assert report.counts["cvt.e4m3"] == 0, cfg.tag
        assert "e2m1" not in body, cfg.tag  # integer E2M1 codes (no cvt.*.e2m1x2 on sm_90)
        assert report.counts["cvt.bf16"] >= 1, cfg.tag  # q = bf16(z)


def test_lane_butterflies(indexer_ptx):
    """xor shuffles: 5 for the sum of squares (offsets 1..16), 5 (FP8, one 128-channel block)
    or 3 (MXFP4, 8 lanes per block) for the amax, and with the rotation 5 spans x 4 registers."""
    for cfg, ptx, _ in indexer_ptx:
        body = _body(ptx)
        offsets = [int(m) for m in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", body)]
        amax = [1, 2, 4, 8, 16] if cfg.layout == "indexer_fp8" else [1, 2, 4]
        rotation = [16, 8, 4, 2, 1] * 4 if cfg.hadamard else []
        assert sorted(offsets) == sorted([1, 2, 4, 8, 16] + amax + rotation), cfg.tag


def test_two_stores_per_lane(indexer_ptx):
    """The lane's data bytes (4 E4M3 bytes, or 2 bytes of E2M1 pairs) and one scale store
    (FP8: lane 0's 4-byte fp32; MXFP4: lanes 0, 8, 16, 24 one byte each)."""
    for cfg, ptx, report in indexer_ptx:
        body = _body(ptx)
        assert report.counts["st.global"] == 2, cfg.tag
        if cfg.layout == "indexer_fp8":
            assert re.search(r"st\.global\.b32\b", body), cfg.tag
        else:
            assert re.search(r"st\.global\.b16\b", body) and re.search(r"st\.global\.b8\b", body), cfg.tag


def test_only_c128_synchronizes_the_cta(indexer_ptx):
    """C4 tokens live in one warp (no barrier: each lane reads back only its own kv copies); a
    C128 CTA meets after the row maxima, the per-warp partials and the trees over the warps."""
    for cfg, _, report in indexer_ptx:
        assert report.counts["bar.sync"] == (0 if cfg.ratio == 4 else 3), cfg.tag


# ---- configurations ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    (dict(ratio=8), "compress_ratio"),
    (dict(block_size=0), "block_size"),
    (dict(layout="flashmla_fp8"), "layout"),
    (dict(hadamard=1), "hadamard"),
    (dict(entries_per_page=0), "entries_per_page"),
    (dict(weight_dtype="float16"), "rms_norm_weight dtype"),
    (dict(warps=3), "warps"),
    (dict(ratio=128, warps=4), "warps"),
    (dict(ratio=4, warps=16), "warps"),
    (dict(pdl=None), "pdl"),
])
def test_indexer_config_rejects_bad_values(kwargs, needle):
    base = dict(ratio=4, block_size=16, layout="indexer_fp8", hadamard=False, entries_per_page=64,
                weight_dtype="bfloat16", warps=4, pdl=False)
    with pytest.raises(ValueError, match=needle):
        IndexerConfig(**{**base, **kwargs})


def test_indexer_config_shapes():
    c4 = IndexerConfig(4, 16, "indexer_fp8", True, 64, "bfloat16")
    assert (c4.state_width, c4.entry_bytes, c4.data_record_bytes, c4.rows_per_warp, c4.rows_per_lookup) == (256, 132, 128, 8, 4)
    c128 = IndexerConfig(128, 5, "indexer_mxfp4", False, 2, "float32", 16)
    assert (c128.state_width, c128.entry_bytes, c128.data_record_bytes, c128.rows_per_warp, c128.rows_per_lookup) == (128, 68, 64, 8, 1)
    assert IndexerConfig(128, 12, "indexer_fp8", False, 1, "float32", 8).rows_per_lookup == 4
    assert IndexerConfig(4, 6, "indexer_fp8", False, 1, "float32").rows_per_lookup == 2
    assert c4.tag != IndexerConfig(4, 16, "indexer_fp8", False, 64, "bfloat16").tag


def test_save_config_follows_the_head_width():
    widths = {(r, h): config.SaveConfig(r, 8, True, head_dim=h) for r in (4, 128) for h in (512, 128)}
    assert {k: (c.state_width, c.group_threads) for k, c in widths.items()} == {
        (4, 512): (1024, 128), (128, 512): (512, 128), (4, 128): (256, 64), (128, 128): (128, 32)}
    assert widths[(4, 512)].tag == config.SaveConfig(4, 8, True).tag  # the 512-wide tags are unchanged
    with pytest.raises(ValueError, match="head_dim"):
        config.SaveConfig(4, 8, True, head_dim=256)


# ---- the public wrappers: ValueError before anything is compiled or launched ------------------------------
def _indexer_call(compress_ratio=4, block_size=16, layout="indexer_fp8", entries=4):
    return wrapper_arguments(compress_ratio, block_size, layout, entries, head_dim=128)


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("change, keywords, needle", [
    ({}, dict(layout="flashmla_fp8"), "layout: expected one of 'indexer_fp8', 'indexer_mxfp4' for head width 128"),
    ({}, dict(layout="indexer_mxfp4"), "k_cache"),  # a 132-byte cache for 68-byte entries
    ({}, dict(hadamard=1), "hadamard"),
    ({}, dict(fp8_scale=1.0), "fp8_scale"),
    ({}, dict(c128_path="cluster"), "c128_path"),
    (dict(rms_norm_weight=lambda a: torch.ones(512, dtype=torch.bfloat16)), {}, "rms_norm_weight"),
    (dict(positions=lambda a: a["positions"].int()), {}, "positions: expected dtype int64"),
    (dict(kv_slot_mapping=lambda a: a["kv_slot_mapping"][:2]), {}, "kv_slot_mapping: expected length T"),
    (dict(k_cache=lambda a: a["k_cache"][:, :, :128]), {}, "k_cache"),
    (dict(block_size=lambda a: 3), {}, "state_cache: expected shape\\[1\\] = 3"),
])
def test_indexer_call_rejects_bad_arguments(no_compile, monkeypatch, ratio, change, keywords, needle):
    from dsv4_compressor.impl.cutedsl.host import buffers

    monkeypatch.setattr(buffers, "require_cuda", lambda name, tensor: None)  # CPU tensors stand for CUDA ones
    args = _indexer_call(ratio, 16 if ratio == 4 else 8)
    for key, fn in change.items():
        args[key] = fn(args)
    with pytest.raises(ValueError, match=needle):
        api.compress_norm_rope_store(**args, **{"compress_ratio": ratio, "layout": "indexer_fp8", **keywords})


def test_hadamard_needs_an_indexer_layout(no_compile):
    """``hadamard=True`` on the 512-wide head is rejected by name, also on the combined call."""
    args = wrapper_arguments(4, 4, "flashmla_fp8", 4, head_dim=512)  # the 512-wide head
    with pytest.raises(ValueError, match="hadamard"):
        api.compress_norm_rope_store(**args, compress_ratio=4, hadamard=True)
    kv_score, ape = torch.zeros(4, 2048), torch.zeros(4, 1024)
    with pytest.raises(ValueError, match="hadamard"):
        api.save_and_compress_norm_rope_store(kv_score, ape, **args, compress_ratio=4, hadamard=True)


def test_indexer_cpu_tensors_are_rejected_after_validation(no_compile):
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of \\('cuda',\\)"):
        api.compress_norm_rope_store(**_indexer_call(), compress_ratio=4, layout="indexer_fp8")
    args = _indexer_call(layout="indexer_mxfp4")
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of \\('cuda',\\)"):
        api.compress_norm_rope_store(**args, compress_ratio=4, layout="indexer_mxfp4", hadamard=True)
    kv_score, ape = torch.zeros(4, 512), torch.zeros(4, 256)  # the indexer's C4 widths pass validation
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of"):
        api.save_partial_states(kv_score, ape, args["positions"], args["slot_mapping"], args["state_cache"], 16)
    with pytest.raises(ValueError, match="ape"):
        api.save_partial_states(kv_score, ape[:, :128], args["positions"], args["slot_mapping"], args["state_cache"], 16)


def test_compress_x_stays_512_wide(no_compile):
    """``compress`` (the fp32 x, for tests) has no indexer kernel: a 128-wide state is rejected."""
    args = _indexer_call()
    pooling = {k: args[k] for k in ("state_cache", "token_to_req_indices", "positions", "slot_mapping", "block_table",
                                    "block_size", "kv_slot_mapping")}
    with pytest.raises(ValueError, match="state_cache"):
        api.compress(**pooling, compress_ratio=4)


def test_indexer_variants_are_frozen_choices(no_compile):
    """An indexer variant is a :class:`.variants.Variant`: a frozen policy (the indexer's
    mapping) and ``pdl``, passed to each call; nothing global changes."""
    from dataclasses import FrozenInstanceError

    from dsv4_compressor.impl.cutedsl import variants
    from dsv4_compressor.impl.cutedsl.host.paths import PATHS, PathRequest
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY, Policy

    def indexer_config(ratio, bs, layout, hadamard, weight, policy, pdl):
        request = PathRequest(ratio, bs, 1, layout, 64, weight, 16, hadamard, policy, pdl)
        return PATHS["indexer"].configs(request)[0]

    default = DEFAULT_POLICY
    assert default.shapes.indexer_c4_warps == 4
    assert variants.indexer_c4_w1.policy.shapes.indexer_c4_warps == 1
    assert variants.indexer_nopdl.pdl is False and variants.indexer_nopdl.policy == default
    config = indexer_config(4, 16, "indexer_fp8", False, "bfloat16", default.with_overrides(indexer_c4_warps=8), True)
    assert (config.warps, config.pdl) == (8, True)
    config = indexer_config(128, 8, "indexer_mxfp4", True, "float32", default, False)
    assert (config.warps, config.pdl) == (default.shapes.indexer_c128_warps, False)
    with pytest.raises(FrozenInstanceError):
        variants.indexer_c4_w1.pdl = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="indexer_c4_warp"):
        default.with_overrides(indexer_c4_warp=2)
    with pytest.raises(ValueError, match="warps"):  # the kernel configuration checks the mapping
        indexer_config(4, 16, "indexer_fp8", False, "bfloat16", default.with_overrides(indexer_c4_warps=3), True)
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of"):  # validated, then refused on CPU
        variants.indexer_c4_w1.compress_norm_rope_store(**_indexer_call(), compress_ratio=4, layout="indexer_fp8")
    assert default == Policy()


def test_numpy_bools_take_the_same_path(no_compile):
    """``hadamard=np.False_`` is ``False`` (the 512-wide path), ``np.True_`` needs an indexer layout."""
    args = _indexer_call()
    with pytest.raises(ValueError, match="state_cache: expected a tensor on one of"):
        api.compress_norm_rope_store(**args, compress_ratio=4, layout="indexer_fp8", hadamard=np.True_)
    with pytest.raises(ValueError, match="layout: expected one of 'indexer_fp8', 'indexer_mxfp4' for head width 128"):
        api.compress_norm_rope_store(**args, compress_ratio=4, hadamard=np.False_)  # flashmla_fp8 on a 128-wide state
