"""The float64 ideal of a compressed entry, written from SPEC §0/§12's formulas (softmax pooling,
RMSNorm, RoPE, the Sylvester-Hadamard matrix) and not from the operator's code: what the demo
shows beside the stored bytes and what the tests bound the rounding against."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def pooled_norm(state, batch, weight, eps, cos_sin, token, head_dim):
    """Softmax pooling over ``token``'s window and RMSNorm, in float64, and the cos/sin row of its
    compressed position: ``(y [head_dim], cs [64])``. ``weight``: float32, or uint16 bf16 patterns."""
    r = batch.compress_ratio
    window, state_width = (8, 2 * head_dim) if r == 4 else (128, head_dim)  # C4's windows overlap
    p, q = int(batch.positions[token]), int(batch.token_to_req_indices[token])
    kv, score = [], []
    for i in range(window):
        pos = p - window + 1 + i
        if pos >= 0:
            row = state[batch.block_table[q, pos // batch.block_size], pos % batch.block_size].astype(np.float64)
            h = i // r
            kv.append(row[h * head_dim:(h + 1) * head_dim])
            score.append(row[state_width + h * head_dim: state_width + (h + 1) * head_dim])
    kv, score = np.array(kv), np.array(score)
    w = np.exp(score - score.max(axis=0))
    x = (kv * w).sum(axis=0) / w.sum(axis=0)
    weight = (weight.astype(np.uint32) << 16).view(F32) if weight.dtype == np.uint16 else weight
    y = x / np.sqrt(np.mean(x * x) + float(F32(eps))) * weight.astype(np.float64)
    return y, cos_sin[(p // r) * r].astype(np.float64)


def rope(x, cs):
    """The interleaved RoPE of the 64 channels ``x`` with the cos/sin row ``cs``, in float64."""
    out = np.empty(64)
    out[0::2] = x[0::2] * cs[:32] - x[1::2] * cs[32:]
    out[1::2] = x[0::2] * cs[32:] + x[1::2] * cs[:32]
    return out


def sylvester(n: int) -> np.ndarray:
    """The unnormalized ``n x n`` Sylvester-Hadamard matrix (entries +-1)."""
    matrix = np.ones((1, 1))
    while matrix.shape[0] < n:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix


def attention_entry(state, batch, weight, eps, cos_sin, token):
    """The 512-wide entry (SPEC §0): ``(y [512] normalized, rope [64])``, the RoPE of ``y[448:]``."""
    y, cs = pooled_norm(state, batch, weight, eps, cos_sin, token, 512)
    return y, rope(y[448:], cs)


def indexer_entry(state, batch, weight, eps, cos_sin, token, hadamard):
    """SPEC §12's ``z`` (before bf16): pooling and RMSNorm over 128, RoPE on channels 64..127
    and, with ``hadamard``, the normalized Sylvester-Hadamard matrix."""
    y, cs = pooled_norm(state, batch, weight, eps, cos_sin, token, 128)
    z = y.copy()
    z[64:] = rope(y[64:], cs)
    return sylvester(128) @ z / np.sqrt(128.0) if hadamard else z
