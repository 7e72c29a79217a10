"""Shared test helpers: a small step built from the catalogue machinery, and a float64 ideal."""

from __future__ import annotations

import numpy as np

from dsv4_compressor import spec
from dsv4_compressor.spec import float64_ideal
from dsv4_compressor.conformance.scenarios import StepInputs

# SPEC §14.8's debug checks of a v41_compress_norm_rope_store call (spec/tests/test_v41_errors.py's
# ``v41_call``; the Triton family's test makes the same call with torch tensors): ``(ratio, the change:
# with_entry's (argument, index, value or value(call)), the end of the message)``, None where the
# change breaks no check.
V41_DEBUG_CASES = [
    (1, ("kv_slot_mapping", 0, 10_000), "is outside k_cache"),
    (2, ("kv_slot_mapping", 2, 10_000), "is outside k_cache"),
    (1, ("positions", 1, 40), "rotates with cos_sin_cache row 40"),
    (2, ("slot_mapping", 4, -1), None),  # not an error: the token is inactive
    (2, ("save_slot_mapping", 1, 1_000_000), "is outside the state cache"),
    (2, ("token_to_req", 1, 0), "lies in request 1's chunk"),
    (2, ("positions", 2, 7), "positions are consecutive"),
    (2, ("kv_slot_mapping", 2, lambda call: call["kv_slot_mapping"][0]), "is written by more than one"),  # positions 1 and 3
    (2, ("kv_slot_mapping", 4, 0), "for a padding token"),
]


def with_entry(call: dict, name: str, index, value) -> dict:
    """``call`` with a copy of its array ``name`` (NumPy or torch) whose entry ``index`` is ``value``
    (``value(call)`` where callable)."""
    array = call[name].copy() if isinstance(call[name], np.ndarray) else call[name].clone()
    array[index] = value(call) if callable(value) else value
    return {**call, name: array}


def store(inputs: StepInputs, batch, state: np.ndarray, k_cache: np.ndarray, tokens=slice(None)) -> None:
    """``compress_norm_rope_store`` of ``batch``'s tokens ``tokens`` with the step's other inputs."""
    spec.compress_norm_rope_store(
        state, batch.token_to_req_indices[tokens], batch.positions[tokens], batch.slot_mapping[tokens],
        batch.block_table, batch.block_size, inputs.rms_norm_weight, inputs.rms_norm_eps, inputs.cos_sin_cache,
        k_cache, batch.kv_slot_mapping[tokens], compress_ratio=batch.compress_ratio, layout=inputs.layout,
        fp8_scale=inputs.fp8_scale,
    )


def run_step(inputs: StepInputs, *, state=None, k_cache=None, batch=None):
    """Run save + store of the spec on fresh copies; returns (state owner, state, k owner, k_cache)."""
    b = batch or inputs.batch
    state_owner, state_view = inputs.state_cache.numpy_copy() if state is None else (None, state)
    spec.save_partial_states(inputs.kv_score, inputs.ape, b.positions, b.slot_mapping, state_view, b.block_size, debug=True)
    k_owner, k_view = inputs.k_cache.numpy_copy() if k_cache is None else (None, k_cache)
    spec.compress_norm_rope_store(
        state_view, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
        inputs.rms_norm_weight, inputs.rms_norm_eps, inputs.cos_sin_cache, k_view, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=inputs.layout, fp8_scale=inputs.fp8_scale, debug=True,
    )
    return state_owner, state_view, k_owner, k_view


def ideal_entry(state: np.ndarray, inputs: StepInputs, token: int) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ideal of one token's entry: (y [512] normalized, rope [64] rotated), from SPEC §0's math.

    Written from the formulas (softmax, RMSNorm, RoPE), not from the spec's code.
    """
    return float64_ideal.attention_entry(state, inputs.batch, inputs.rms_norm_weight, inputs.rms_norm_eps,
                                         inputs.cos_sin_cache, token)
