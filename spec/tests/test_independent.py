"""The spec against an independent implementation of SPEC.md (torch, written separately) on
held-out random batches: C4 and C128, state block sizes 4/8/16, entries per page 1/2/64,
padded strides, padding tokens, non-boundary tokens, all layouts. Every byte must agree."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4_compressor.conformance.implementations import LoadedImplementation
from dsv4_compressor.conformance.runner import run_implementation, run_spec
from dsv4_compressor.conformance.scenarios import random_scenario
from dsv4_compressor.conformance.torch_reference import TorchReference

INDEPENDENT = LoadedImplementation("torch", TorchReference(), ("cpu",))


@st.composite
def batches(draw):
    ratio = draw(st.sampled_from([4, 128]))
    layout = draw(st.sampled_from(["flashmla_fp8", "flashmla_fp8", "bf16", "fp8_per_tensor"]))
    prefill = draw(st.lists(st.integers(1, 40 if ratio == 4 else 200), max_size=2))
    return random_scenario(
        draw(st.integers(0, 2**31 - 1)),
        compress_ratio=ratio,
        block_size=draw(st.sampled_from([4, 8, 16])),
        entries_per_page=draw(st.sampled_from([1, 2, 64])),
        layout=layout,
        bf16_weight=draw(st.booleans()),
        num_decode=draw(st.integers(1, 12 if ratio == 4 else 3)),
        prefill=tuple(prefill),
        num_padding=draw(st.integers(0, 3)),
        row_pad=draw(st.sampled_from([0, 4, 12])),
        block_pad_rows=draw(st.sampled_from([0, 1])),
        page_pad_bytes=draw(st.sampled_from([0, 16, 160])),
        values=draw(st.sampled_from(["normal", "normal", "tiny_amax", "spread_scores", "signed_zeros"])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_spec_and_the_independent_torch_implementation_write_identical_bytes(scenario):
    inputs = scenario.build()
    expected = run_spec(inputs)
    state_bytes, k_bytes = run_implementation(INDEPENDENT, inputs, expected, "cpu")
    assert np.array_equal(state_bytes, expected.state_after_save), "save_partial_states differs"
    differing = np.flatnonzero(k_bytes != expected.k_cache_after_store)
    assert differing.size == 0, f"{differing.size} cache bytes differ, first at {differing[:5]}"
