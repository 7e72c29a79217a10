"""SPEC §9 errors of the NumPy API: ValueError naming the argument, nothing written."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor import spec
from dsv4_compressor.conformance.errors import CASES, run_error_case
from dsv4_compressor.conformance.implementations import load_implementation
from dsv4_compressor.conformance.scenarios import C4, StepRecipe, build_step, _decode


@pytest.mark.parametrize("case", [c for c in CASES if c.numpy], ids=lambda c: c.name)
def test_every_spec_section_9_error_case(case):
    """The spec through the suite's NumPy buffers: every §9 case that has a NumPy form (NumPy
    holds E4M3 as uint8, so a uint8 ``fp8_per_tensor`` cache is not an error there)."""
    verdict = run_error_case(load_implementation("spec"), case, "cpu")
    assert verdict.status == "pass", verdict.detail


def _numpy_call():
    inputs = build_step(StepRecipe(_decode(2, 4), **C4), np.random.default_rng(0))
    b = inputs.batch
    state, k_cache = inputs.state_cache.numpy_copy()[1], inputs.k_cache.numpy_copy()[1]
    args = [state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
            inputs.rms_norm_weight, 1e-6, inputs.cos_sin_cache, k_cache, b.kv_slot_mapping]
    return args, k_cache


@pytest.mark.parametrize("index, value, argument", [
    (1, [0, 0], "token_to_req_indices"),  # a list, not an ndarray
    (5, True, "block_size"),
    (7, "1e-6", "rms_norm_eps"),
    (7, float("nan"), "rms_norm_eps"),
    (7, 1e-50, "rms_norm_eps"),  # rounds to 0 in binary32
    (6, np.ones(512, np.float64), "rms_norm_weight"),
    (6, np.ones(512, np.dtype([("bfloat16", np.uint16)])), "rms_norm_weight"),  # a structured dtype
])
def test_numpy_specific_errors(index, value, argument):
    args, k_cache = _numpy_call()
    before = k_cache.copy()
    args[index] = value
    with pytest.raises(ValueError, match=argument):
        spec.compress_norm_rope_store(*args, compress_ratio=4)
    assert np.array_equal(k_cache, before)


def test_fp8_per_tensor_needs_a_positive_scale():
    inputs = build_step(StepRecipe(_decode(2, 4), **C4, layout="fp8_per_tensor", fp8_scale=1.0), np.random.default_rng(0))
    b = inputs.batch
    args = [inputs.state_cache.numpy_copy()[1], b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table,
            b.block_size, inputs.rms_norm_weight, 1e-6, inputs.cos_sin_cache, inputs.k_cache.numpy_copy()[1], b.kv_slot_mapping]
    for scale, message in ((None, "fp8_scale"), (0.0, "fp8_scale"), (float("inf"), "fp8_scale")):
        with pytest.raises(ValueError, match=message):
            spec.compress_norm_rope_store(*args, compress_ratio=4, layout="fp8_per_tensor", fp8_scale=scale)


def test_a_foreign_bfloat16_dtype_is_named_not_taken_for_the_uint16_container():
    """ml_dtypes' bfloat16 is called "bfloat16" but is not the spec's uint16 bit-pattern container."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    args, k_cache = _numpy_call()
    before = k_cache.copy()
    args[6] = np.ones(512, dtype=ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"rms_norm_weight: expected dtype bfloat16 or float32, got ml_dtypes\.bfloat16"):
        spec.compress_norm_rope_store(*args, compress_ratio=4)
    assert np.array_equal(k_cache, before)
