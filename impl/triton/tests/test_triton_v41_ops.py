"""DeepSeek-V4.1's Triton operations as ``torch.ops.dsv4_compressor.triton_v41_*`` custom ops (called
from ``torch.compile(fullgraph=True)`` functions they write the spec's bytes; bad arguments raise
the front end's ``ValueError`` when the op runs), warm-up, launch plans, and the PTX of every
V4.1 kernel variant under SPEC §2's rules."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import dsv4_compressor.impl.triton  # noqa: F401  (registers the ops)
from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request

from v41_scenarios import (
    DEVICE, assert_identical, build_case, index_key_arguments, run_both, torch_arguments,
)

BACKEND = "inductor" if DEVICE == "cuda" else "aot_eager"  # inductor's CPU codegen is slow on small CI machines
OPS = torch.ops.dsv4_compressor


def _compiled(op):
    """A ``torch.compile(fullgraph=True)`` function that calls ``op`` with keyword arguments."""

    @torch.compile(fullgraph=True, backend=BACKEND)
    def step(**arguments):
        op(**arguments)

    return step


@pytest.mark.parametrize("ratio, layout, latent", [(2, "v41_nvfp4", True), (1, "flashmla_fp8", False), (2, "bf16", False)])
def test_compiled_combined_op_writes_the_spec_bytes(ratio, layout, latent):
    torch._dynamo.reset()
    case = build_case([Request(3, 1), Request(9, 3), Request(0, 2)], ratio=ratio, seed=1, state=V.vllm_ring(0),
                      layout=layout, bf16_inputs=True, bf16_state=True)
    arguments = case.compress_arguments(case.latent if latent else None)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=layout, fp8_scale=case.fp8_scale)
    results = run_both(spec.v41_compress_norm_rope_store, _compiled(OPS.triton_v41_compress_norm_rope_store), arguments,
                       ("latent", "state_cache", "k_cache"))
    assert np.any(results["k_cache"][0] != B.CANARY_BYTE)
    assert_identical(results)


@pytest.mark.parametrize("ratio", [1, 2])
def test_compiled_compress_norm_and_store_ops_write_the_spec_bytes(ratio):
    """The two-call path: the latent the first op writes is the second op's input."""
    torch._dynamo.reset()
    case = build_case([Request(5, 2), Request(0, 4)], ratio=ratio, seed=2, layout="v41_mxfp8")
    results = run_both(spec.v41_compress_norm, _compiled(OPS.triton_v41_compress_norm), case.compress_arguments(case.latent),
                       ("latent", "state_cache"))
    assert_identical(results)
    latent = case.latent.copy()
    latent[...] = Buffer.of(case.latent).view_of(results["latent"][1])  # the latent Triton wrote
    arguments = dict(latent=latent, positions=case.step.positions, kv_slot_mapping=case.step.kv_slot_mapping,
                     cos_sin_cache=case.cos_sin, k_cache=case.k_cache, compress_ratio=ratio, layout="v41_mxfp8")
    assert_identical(run_both(spec.v41_rope_quant_store, _compiled(OPS.triton_v41_rope_quant_store), arguments,
                              ("k_cache",)))


@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
def test_compiled_index_key_op_writes_the_spec_bytes(layout):
    torch._dynamo.reset()
    case = build_case([Request(3, 1), Request(0, 4)], ratio=2, seed=3, layout=None)
    assert_identical(run_both(spec.v41_index_key_store, _compiled(OPS.triton_v41_index_key_store),
                              index_key_arguments(case, layout), ("k_cache",)))


@pytest.mark.parametrize("operation, change, message", [
    ("v41_compress_norm_rope_store", dict(compress_ratio=4), "compress_ratio: expected one of (1, 2)"),
    ("v41_compress_norm_rope_store", dict(layout="indexer_fp8"), "layout: expected one of"),
    ("v41_compress_norm", dict(ape=torch.zeros(2, 512)), "ape: expected None"),
    ("v41_compress_norm", dict(latent=None), "latent: expected a bfloat16"),
])
def test_ops_reject_bad_arguments_with_the_front_ends_message(operation, change, message):
    case = build_case([Request(3, 1)], ratio=2, seed=4)
    arguments = case.compress_arguments(case.latent)
    if operation == "v41_compress_norm_rope_store":
        arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout="v41_nvfp4")
    torch_args, owners = torch_arguments(arguments)
    torch_args.update(change)
    before = {name: owner.clone() for name, owner in owners.items()}
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(OPS, f"triton_{operation}")(**torch_args)
    for name, owner in owners.items():
        assert torch.equal(owner, before[name]), f"{name} was written"


@pytest.mark.parametrize("options", [
    dict(compress_ratio=2, layout="v41_nvfp4", block_size=8, ring_capacity=8, index_key_layout="indexer_mxfp4"),
    dict(compress_ratio=2, layout="flashmla_fp8", state_dtype=torch.bfloat16, kv_dtype=torch.float32, split=True),
    dict(compress_ratio=1, layout="fp8_per_tensor", fp8_scale=0.5, latent=False, weight_dtype=torch.float32),
    dict(compress_ratio=1, layout=None, index_key_layout="indexer_fp8"),
])
def test_warm_up_launches_padding_steps(options):
    """``v41_warm_up`` compiles (on a GPU) by launching each kernel a layer uses on a step whose only
    token is padding: every configuration is accepted."""
    from dsv4_compressor.impl import triton as T

    T.v41_warm_up(entries_per_page=2, device=DEVICE, **options)


def test_repeated_calls_reuse_the_plan_and_write_the_spec_bytes():
    """The second call with an argument layout reuses its launch plan (on a GPU: the compiled
    kernel's own launcher) on new tensors: still the spec's bytes; an empty call's plan is kept too."""
    from dsv4_compressor.impl import triton as T
    from dsv4_compressor.impl.triton import v41

    case = build_case([Request(3, 1), Request(9, 3)], ratio=2, seed=5, state=V.reference_ring(), layout="v41_nvfp4")

    def call():
        arguments = case.compress_arguments(case.latent)
        arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout="v41_nvfp4")
        return run_both(spec.v41_compress_norm_rope_store, T.v41_compress_norm_rope_store, arguments,
                        ("latent", "state_cache", "k_cache"))

    assert_identical(call())
    plans = len(v41._PLANS)
    for _ in range(2):
        assert_identical(call())
    assert len(v41._PLANS) == plans


# ---- PTX: every V4.1 variant, compiled for Hopper without a GPU -------------------------------------------
def test_every_v41_variant_passes_the_ptx_rules():
    from dsv4_compressor.impl.ptx_rules import check_ptx
    from dsv4_compressor.impl.triton.ptx import TARGET, ptx_variants
    from dsv4_compressor.impl.triton.v41_ptx import V41_RECORDS

    results = [(name, ptx, options) for name, ptx, options in ptx_variants() if name.startswith("v41_")]
    names = [name for name, _, _ in results]
    for ratio in (1, 2):
        for layout in (*V41_RECORDS, "nostore"):
            assert any(n.startswith(f"v41_compress_r{ratio}_") and f"_{layout}_w" in n for n in names), (ratio, layout)
        for layout in V41_RECORDS:
            assert f"v41_store_r{ratio}_{layout}_w4" in names
        for layout in ("indexer_fp8", "indexer_mxfp4"):
            assert any(n.startswith(f"v41_index_key_r{ratio}_{layout}_") for n in names)
    for option in ("kvf32", "scorebf16", "statebf16", "_ring_", "_paged_", "nolatent", "f32w"):
        assert any(option in n for n in names), option
    failures = []
    for name, ptx, options in results:
        report = check_ptx("triton", name, ptx, require_target=TARGET, **options)
        failures += [f"{name}: {v}" for v in report.violations]
        if not name.startswith("v41_store") and report.counts["sqrt.rn.f32"] != 1:  # the RMSNorm's
            failures.append(f"{name}: expected one sqrt.rn.f32, got {report.counts['sqrt.rn.f32']}")
        if "nvfp4" in name and report.counts["div.rn.f32"] < 2:  # div(a, 6) and div(z, sigma): true divisions
            failures.append(f"{name}: expected the NVFP4 divisions, got {report.counts['div.rn.f32']} div.rn.f32")
        if "_r2_" in name and name.startswith("v41_compress") and report.counts["bar.sync"] == 0:
            failures.append(f"{name}: no barrier before the deferred save")
    assert not failures, "\n".join(failures)
