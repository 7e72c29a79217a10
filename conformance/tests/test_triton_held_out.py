"""The Triton kernels against the independent torch implementation of SPEC.md on held-out
random batches (under TRITON_INTERPRET=1 on a CPU, compiled on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4_compressor.conformance.implementations import LoadedImplementation, load_implementation
from dsv4_compressor.conformance.runner import run_implementation, run_spec
from dsv4_compressor.conformance.scenarios import random_scenario
from dsv4_compressor.conformance.torch_reference import TorchReference

pytest.importorskip("triton")


@st.composite
def small_batches(draw):
    ratio = draw(st.sampled_from([4, 4, 128]))
    return random_scenario(
        draw(st.integers(0, 2**31 - 1)),
        compress_ratio=ratio,
        block_size=draw(st.sampled_from([4, 8, 16])),
        entries_per_page=draw(st.sampled_from([1, 2, 64])),
        layout=draw(st.sampled_from(["flashmla_fp8", "bf16", "fp8_per_tensor"])),
        bf16_weight=draw(st.booleans()),
        num_decode=draw(st.integers(1, 6 if ratio == 4 else 2)),
        prefill=tuple(draw(st.lists(st.integers(1, 24), max_size=1))) if ratio == 4 else (),
        num_padding=draw(st.integers(0, 2)),
        row_pad=draw(st.sampled_from([0, 4])),
        block_pad_rows=draw(st.sampled_from([0, 1])),
        page_pad_bytes=draw(st.sampled_from([0, 32])),
        values=draw(st.sampled_from(["normal", "signed_zeros", "tiny_amax"])),
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_batches())
def test_triton_writes_the_bytes_of_the_independent_implementation(scenario):
    triton = load_implementation("triton")
    device = triton.device()
    inputs = scenario.build()
    expected = run_spec(inputs)  # also the post-save state both start the store from
    reference_state, reference_cache = run_implementation(
        LoadedImplementation("torch", TorchReference(), ("cpu",)), inputs, expected, "cpu")
    state, cache = run_implementation(triton, inputs, expected, device)
    assert np.array_equal(state, reference_state), "save_partial_states differs from the independent implementation"
    assert np.array_equal(cache, reference_cache), f"{np.count_nonzero(cache != reference_cache)} cache bytes differ"
    assert np.array_equal(reference_state, expected.state_after_save), "the independent implementation differs from the spec"
    assert np.array_equal(reference_cache, expected.k_cache_after_store), "the independent implementation differs from the spec"
