"""Shared test helpers: a small step built from the catalogue machinery, and a float64 ideal."""

from __future__ import annotations

import numpy as np

from dsv4_compressor import spec
from dsv4_compressor.spec import float64_ideal
from dsv4_compressor.conformance.scenarios import StepInputs


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
