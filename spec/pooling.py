"""SPEC §5: which tokens are active, their window rows, and the softmax-gated pooling."""

from __future__ import annotations

import numpy as np

from .arithmetic import div, exp2s, mul, sub, tree
from .constants import LOG2E, RatioConfig

F32 = np.float32
TOKENS_PER_CHUNK = 32  # bounds the gathered window rows to ~32 * 128 * 4 KiB at C128


def is_boundary(positions: np.ndarray, compress_ratio: int) -> np.ndarray:
    """A boundary token closes a group: ``(p + 1) mod r == 0``; it produces entry ``p // r``."""
    return (positions + 1) % compress_ratio == 0


def active_tokens(positions: np.ndarray, slot_mapping: np.ndarray, kv_slot_mapping: np.ndarray, compress_ratio: int) -> np.ndarray:
    """SPEC §5's activity rule: a saved (``slot >= 0``) boundary token with a cache slot.

    Inactive tokens write nothing anywhere.
    """
    return (slot_mapping >= 0) & is_boundary(positions, compress_ratio) & (kv_slot_mapping >= 0)


def window_positions(positions: np.ndarray, config: RatioConfig) -> tuple[np.ndarray, np.ndarray]:
    """Row ``i`` of token ``t``'s window is position ``p - W + 1 + i``; it is valid iff >= 0.

    Returns ``(pos[t, i], valid[t, i])``. Only C4 at ``p = 3`` has invalid rows.
    """
    rows = np.arange(config.window, dtype=np.int64)
    pos = positions[:, None] - config.window + 1 + rows[None, :]
    return pos, pos >= 0


def gather_window(
    state_cache: np.ndarray, block_table: np.ndarray, requests: np.ndarray, positions: np.ndarray,
    config: RatioConfig, block_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window of each token: ``kv[t, i, c]``, ``score[t, i, c]`` (fp32) and ``valid[t, i]``.

    Row ``i`` reads state row ``S_i = state_cache[block_table[q, pos_i // bs], pos_i mod bs]``
    and its half ``h = i // r`` (C4: rows 0..3 take channels 0..H-1 of kv and score, rows
    4..7 channels H..2H-1; C128 has one half; H = ``config.head_dim``, 512 or 128). Invalid
    rows read nothing (zeros here).
    """
    pos, valid = window_positions(positions, config)
    safe_pos = np.where(valid, pos, 0)
    blocks = block_table[requests[:, None], safe_pos // block_size]
    rows = state_cache[blocks, safe_pos % block_size]  # [t, W, 2*SW]
    half = np.arange(config.window) // config.ratio  # h for each window row
    head = config.head_dim
    channel = half[:, None] * head + np.arange(head)[None, :]  # [W, H]
    kv = np.take_along_axis(rows, channel[None, :, :], axis=2)
    score = np.take_along_axis(rows, (config.state_width + channel)[None, :, :], axis=2)
    kv = np.where(valid[:, :, None], kv, F32(0.0))
    score = np.where(valid[:, :, None], score, F32(0.0))
    return kv.astype(F32), score.astype(F32), valid


def pool_window(kv: np.ndarray, score: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The compressed vector ``x[t, c]`` of SPEC §5, per channel, from one gathered window.

    ``M = max`` of the valid scores; valid rows: ``e = exp2s(mul(sub(s, M), L))``,
    ``u = mul(kv, e)``; invalid rows: ``e = u = +0`` (they still take part in the trees);
    ``x = div(tree(u), tree(e))`` with the trees over the window rows in row order.
    """
    valid3 = valid[:, :, None]
    m = np.max(np.where(valid3, score, F32(-np.inf)), axis=1, keepdims=True)
    e = exp2s(mul(sub(np.where(valid3, score, m), m), LOG2E))
    e = np.where(valid3, e, F32(0.0))
    u = np.where(valid3, mul(kv, e), F32(0.0))
    return div(tree(u, axis=1), tree(e, axis=1))


def pool(
    state_cache: np.ndarray, block_table: np.ndarray, requests: np.ndarray, positions: np.ndarray,
    config: RatioConfig, block_size: int,
) -> np.ndarray:
    """``x`` (fp32 ``[n, H]``) for the given (active) tokens, a few tokens at a time."""
    out = np.empty((positions.shape[0], config.head_dim), dtype=F32)
    for start in range(0, positions.shape[0], TOKENS_PER_CHUNK):
        chunk = slice(start, start + TOKENS_PER_CHUNK)
        kv, score, valid = gather_window(state_cache, block_table, requests[chunk], positions[chunk], config, block_size)
        out[chunk] = pool_window(kv, score, valid)
    return out
