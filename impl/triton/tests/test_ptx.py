"""Every Triton kernel variant, compiled for Hopper without a GPU, obeys SPEC §2's PTX rules:
``.rn`` on every f32 add/sub/mul (no FMA contraction), correctly rounded div/sqrt, no
approximate functions, no ``.ftz``, and 128-bit loads where the kernels stream state rows
(SPEC §13's state formats and the step call included).

Under ``TRITON_INTERPRET=1`` (as in CI) :func:`ptx_variants` compiles in a child process."""

import re

from dsv4_compressor.impl.ptx_rules import check_ptx
from dsv4_compressor.impl.triton.ptx import TARGET, ptx_variants


def test_every_variant_passes_the_ptx_rules():
    results = list(ptx_variants())
    names = [name for name, _, _ in results]
    assert len(names) == len(set(names))
    for ratio in ("c4", "c128"):
        for layout in ("flashmla_fp8", "bf16", "fp8_per_tensor"):
            for weight in ("bf16w", "f32w"):
                assert any(n.startswith(f"fused_{ratio}_") and f"_{layout}_{weight}_" in n for n in names), (ratio, layout, weight)
    assert any(n.startswith("save_c4") for n in names) and any(n.startswith("save_c128") for n in names)
    for ratio in ("c4", "c128"):  # SPEC §12: both indexer layouts, with and without the rotation
        for layout in ("indexer_fp8_", "indexer_mxfp4_", "indexer_fp8_hadamard_", "indexer_mxfp4_hadamard_"):
            assert any(n.startswith(f"indexer_{ratio}_") and f"_{layout}" in n for n in names), (ratio, layout)
        assert any(n.startswith(f"save_indexer_{ratio}_") for n in names)
    for prefix in ("fused_c4_", "fused_c128_", "indexer_c4_", "indexer_c128_", "save_c4", "save_c128", "save_indexer_c4",
                   "save_indexer_c128"):  # SPEC §13: each state option alone and with the others
        options = ("_state_bf16", "_ape_at_compress", "_step") + (() if prefix.startswith("save") else ("_ring",))
        for option in options:
            assert any(n.startswith(prefix) and option in n for n in names), (prefix, option)
        if not prefix.startswith("save"):
            assert any(n.startswith(prefix) and all(o in n for o in options) for n in names), prefix
    capped = [ptx for name, ptx, _ in results if name.startswith("indexer_") and name.endswith("_r32")]
    assert capped and all(re.search(r"^\s*\.maxnreg 32\b", ptx, re.M) for ptx in capped)  # max_registers reaches the PTX

    failures = []
    for name, ptx, options in results:
        report = check_ptx("triton", name, ptx, require_target=TARGET, **options)
        failures += [f"{name}: {v}" for v in report.violations]
        if name.startswith(("fused", "indexer")):
            # the exact division of the pooling and the exact RMSNorm are really there
            if report.counts["div.rn.f32"] == 0 or report.counts["sqrt.rn.f32"] != 1:
                failures.append(f"{name}: expected div.rn.f32 and one sqrt.rn.f32, got {dict(report.counts)}")
            if not re.search(r"\bmul\.rn\.f32\b", ptx) or not re.search(r"\badd\.rn\.f32\b", ptx):
                failures.append(f"{name}: no mul.rn/add.rn (exp2s polynomial missing?)")
    assert not failures, "\n".join(failures)
