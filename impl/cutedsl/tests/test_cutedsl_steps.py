"""CPU checks of the GPU tests' harness (:mod:`cutedsl_steps`), with the conformance suite's
torch reference in place of the CuTe DSL kernels: the steps it builds are judged byte for byte
against the spec, a metadata move keeps the spec's bytes, and a differing byte is reported."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cutedsl_steps import C4_CASES, C128_CASES, Case, DeviceStep, assert_bytes, run_step, spec_store  # noqa: E402

from dsv4_compressor.conformance.runner import run_spec  # noqa: E402
from dsv4_compressor.conformance.torch_reference import TorchReference  # noqa: E402

CASES = [C4_CASES[4], C128_CASES[6][0], Case(128, 5, 4, unsaved_fraction=0.1, row_pad=8, block_pad_rows=2,
                                            strided_inputs=True),
         Case(4, 16, 7, "indexer_mxfp4", hadamard=True), Case(128, 8, 3, "indexer_fp8", slots_for_all=True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_step_of_the_reference_matches_the_spec_in_every_byte(case):
    step, expected = run_step(case, impl=TorchReference(), device="cpu")
    assert step.batch.num_active > 0
    assert not np.array_equal(expected.state_after_save, case.inputs().state_cache.owner)  # the save writes rows


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.name)
def test_moved_metadata_keeps_the_spec_bytes(case):
    inputs = case.inputs()
    step = DeviceStep(inputs, "cpu")
    moved = step.move_metadata()
    assert not np.array_equal(moved.block_table, inputs.batch.block_table)
    assert not np.array_equal(step.state_bytes(), inputs.state_cache.owner)  # the rows moved with their blocks
    TorchReference().compress_norm_rope_store(**step.compress_args(), **step.layout_kwargs())
    assert_bytes("moved", inputs, "k_cache", step.k_bytes(), spec_store(inputs, step.state_bytes(), moved))


def test_a_differing_byte_is_named():
    inputs = C4_CASES[0].inputs()
    expected = run_spec(inputs).k_cache_after_store
    got = expected.copy()
    byte = np.flatnonzero(expected != inputs.k_cache.owner)[5]  # a byte the store wrote
    got[byte] ^= 1
    with pytest.raises(AssertionError, match=r"k_cache: compress_norm_rope_store: token \d+, slot \d+, .*\[1 bytes differ\]"):
        assert_bytes("k_cache", inputs, "k_cache", got, expected)
