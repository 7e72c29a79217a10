"""Shared test helpers: a small step built from the catalogue machinery, and a float64 ideal."""

from __future__ import annotations

import numpy as np

from dsv4_compressor import spec
from dsv4_compressor.conformance.scenarios import StepInputs

F32 = np.float32


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
    b = inputs.batch
    r = b.compress_ratio
    window = 8 if r == 4 else 128
    half_width = 1024 if r == 4 else 512
    p = int(b.positions[token])
    q = int(b.token_to_req_indices[token])
    kv_rows, score_rows = [], []
    for i in range(window):
        pos = p - window + 1 + i
        if pos < 0:
            continue
        row = state[b.block_table[q, pos // b.block_size], pos % b.block_size].astype(np.float64)
        h = i // r
        kv_rows.append(row[h * 512:(h + 1) * 512])
        score_rows.append(row[half_width + h * 512: half_width + (h + 1) * 512])
    kv, score = np.array(kv_rows), np.array(score_rows)
    weights = np.exp(score - score.max(axis=0))
    x = (kv * weights).sum(axis=0) / weights.sum(axis=0)
    w = inputs.rms_norm_weight
    w = (w.astype(np.uint32) << 16).view(F32) if w.dtype == np.uint16 else w
    y = x / np.sqrt(np.mean(x * x) + np.float64(F32(inputs.rms_norm_eps))) * w.astype(np.float64)
    cs = inputs.cos_sin_cache[(p // r) * r].astype(np.float64)
    a, c = y[448::2], y[449::2]
    rope = np.empty(64)
    rope[0::2] = a * cs[:32] - c * cs[32:]
    rope[1::2] = a * cs[32:] + c * cs[:32]
    return y, rope
