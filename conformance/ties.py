"""Inputs tuned so that a one-ulp arithmetic slip changes a stored byte, deterministically.

A random input reaches a rounding tie rarely, so an implementation that contracts a
multiply-add, sums in another order or applies the weight first agrees with the spec on
most small scenarios. Here the spec's own intermediate values choose the inputs:

- NoPE channel ``d`` (of active token ``d mod n``): the RMSNorm weight ``w[d]`` is chosen so
  that ``y = mul(g, w)`` with ``g = mul(x, rr)`` lands *exactly* on a bf16 rounding tie, so
  any change of ``x``, ``rr`` or the order of the two products moves the stored bf16 value
  half the time;
- RoPE pair ``j`` (of active token ``j mod n``): ``cos_sin_cache[cp, j]`` is chosen so that
  ``o0 = sub(mul(a, co), mul(b, si))`` lands exactly on a bf16 tie, so an FMA (one rounding
  fewer) or a changed ``a`` shows.

Use with the ``bf16`` layout, which stores the bf16 values themselves.
:func:`tune_indexer_ties` does the like for SPEC §12's E2M1 grid and block exponents.
"""

from __future__ import annotations

import numpy as np

from .. import spec
from ..spec.constants import NOPE_DIM, ratio_config
from ..spec.pooling import pool
from ..spec.postprocess import rms_norm

F32 = np.float32


def _midpoint_near(v: np.ndarray) -> np.ndarray:
    """The bf16 rounding tie (binary32 with low half 0x8000) nearest to each binary32 ``v``."""
    bits = v.astype(F32).view(np.uint32)
    return ((bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(F32)


def _search(target: np.ndarray, start: np.ndarray, evaluate, steps: int = 8) -> np.ndarray:
    """Per element, a binary32 near ``start`` whose ``evaluate`` equals ``target`` (else ``start``)."""
    found = start.copy()
    done = np.zeros(start.shape, dtype=bool)
    for k in range(steps + 1):
        for sign in (1, -1):
            candidate = (start.view(np.int32) + sign * k).view(F32)
            hit = ~done & (evaluate(candidate) == target)
            found = np.where(hit, candidate, found)
            done |= hit
    return found


def _normalized(inputs) -> tuple[np.ndarray, np.ndarray]:
    """The active tokens and ``g = mul(x, rr)``, float32 [n, H]: their pooled vectors after
    SPEC §6's RMSNorm with a unit weight (exact), from the spec's own post-save state."""
    b = inputs.batch
    tokens = np.flatnonzero(b.active)
    _, state = inputs.state_cache.numpy_copy()
    spec.save_partial_states(inputs.kv_score, inputs.ape, b.positions, b.slot_mapping, state, b.block_size)
    head = inputs.rms_norm_weight.shape[0]
    x = pool(state, b.block_table, b.token_to_req_indices[tokens], b.positions[tokens],
             ratio_config(b.compress_ratio, head), b.block_size)
    return tokens, rms_norm(x, F32(1.0), inputs.rms_norm_eps)


def tune_to_ties(inputs) -> None:
    """Rewrite ``inputs.rms_norm_weight`` (fp32) and rows of ``inputs.cos_sin_cache`` in place."""
    b = inputs.batch
    if not b.active.any():
        return
    tokens, g = _normalized(inputs)  # [n, 512]
    n = len(tokens)
    w = inputs.rms_norm_weight.astype(F32)
    d = np.arange(NOPE_DIM)
    gd = g[d % n, d]
    nonzero = gd != 0
    target = _midpoint_near((gd * w[:NOPE_DIM]).astype(F32))
    start = np.where(nonzero, (target.astype(np.float64) / np.where(nonzero, gd, 1)).astype(F32), w[:NOPE_DIM])
    tuned = _search(target, start, lambda cand: (gd * cand).astype(F32))
    w[:NOPE_DIM] = np.where(nonzero, tuned, w[:NOPE_DIM])
    inputs.rms_norm_weight = w
    # RoPE: a, b from the tuned y; co chosen per pair for one token per cache row
    y = (g * w[None, :]).astype(F32)
    cp = (b.positions[tokens] // b.compress_ratio) * b.compress_ratio
    table = inputs.cos_sin_cache
    for j in range(32):
        t = j % n
        a, bb = y[t, NOPE_DIM + 2 * j], y[t, NOPE_DIM + 2 * j + 1]
        row = cp[t]
        co, si = table[row, j], table[row, 32 + j]
        if a == 0 or bb == 0 or si == 0:
            continue
        q = F32(bb * si)
        m = _midpoint_near(np.array([F32(a * co) - q], dtype=F32))
        start = np.array([F32((float(m[0]) + float(q)) / float(a))], dtype=F32)
        found = _search(m, start, lambda cand: ((a * cand).astype(F32) - q).astype(F32), steps=16)
        table[row, j] = found[0]


MXFP4_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 4.0, 5.0, 3.5)  # grid midpoints, then grid points


def tune_indexer_ties(inputs) -> None:
    """The indexer's weights chosen so that ``q = bf16(y)`` of channels 0..63 (unrotated) hits
    E2M1 ties exactly (``mxfp4``) and each block's largest value is ``6·2^K`` or ``448·2^K``
    times ``1 + 2^-10``: bf16 rounds it down onto the boundary, so an exponent taken from the
    unrounded value is one larger. Channel ``d`` serves active token ``(d // 32) mod n``."""
    if not inputs.batch.active.any():
        return
    tokens, g = _normalized(inputs)  # [n, 128]
    w = inputs.rms_norm_weight.astype(F32).copy()
    rng = np.random.default_rng(len(tokens))
    fp8 = inputs.layout == "indexer_fp8"
    for block in range(2):  # channels 0..63: z = y before any rotation
        channels = np.arange(32 * block, 32 * block + 32)
        gt = g[block % len(tokens), channels].astype(np.float64)
        if np.any(gt == 0):
            continue
        top = 448.0 if fp8 else 6.0
        k = int(np.ceil(np.log2(np.max(np.abs(gt * w[channels])) / top))) + 1
        targets = np.array([MXFP4_TIES[i % len(MXFP4_TIES)] for i in range(32)]) * 2.0 ** k
        targets *= np.where(rng.random(32) < 0.5, -1.0, 1.0)
        targets[0] = top * 2.0 ** k * (1 + 2.0 ** -10)  # the block's amax, just above a boundary before bf16
        w[channels] = (targets / gt).astype(F32)
    inputs.rms_norm_weight = w
