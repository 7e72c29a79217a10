"""The vLLM entry points as an implementation (:mod:`dsv4_compressor.integrations.vllm_impl`):
judged by the conformance suite against the spec, byte for byte, as the bench runs them.

Triton runs under its interpreter on CPU; the CuTe DSL family needs a GPU.
"""

from __future__ import annotations

import pytest

from dsv4_compressor.conformance import load_implementation, run_scenario, scenarios
from dsv4_compressor.integrations import vllm_impl

FLASHMLA = ["c4_chunked_prefill", "c128_chunked_prefill", "c4_mixed_padding", "c128_mixed_padding"]
OTHER_LAYOUTS = ["c4_layout_bf16", "c128_layout_fp8_per_tensor"]


def _verdicts(name: str, wanted: list[str]) -> dict[str, object]:
    impl = load_implementation(name)
    return {s.name: run_scenario(impl, s) for s in scenarios(wanted)}


def test_triton_entry_points_write_the_specs_bytes():
    verdicts = _verdicts("dsv4_compressor.integrations.vllm_impl:triton", FLASHMLA)
    for name, verdict in verdicts.items():
        assert verdict.status == "pass", f"{name}: {verdict.status} {verdict.first_difference}"


def test_triton_entry_points_declare_the_flashmla_record_only():
    verdicts = _verdicts("dsv4_compressor.integrations.vllm_impl:triton", OTHER_LAYOUTS)
    for name, verdict in verdicts.items():
        assert verdict.status == "unsupported", f"{name}: {verdict.status} {verdict.first_difference}"
        assert "layout" in verdict.first_difference


@pytest.mark.gpu
def test_cutedsl_entry_points_write_the_specs_bytes():
    verdicts = _verdicts("dsv4_compressor.integrations.vllm_impl:cutedsl", FLASHMLA + OTHER_LAYOUTS)
    for name, verdict in verdicts.items():
        assert verdict.status == "pass", f"{name}: {verdict.status} {verdict.first_difference}"


def test_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="family: expected 'cutedsl' or 'triton', got 'cuda'"):
        vllm_impl.VllmEntryPoints("cuda")
