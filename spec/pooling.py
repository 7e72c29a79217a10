"""SPEC §5: which tokens are active, their window rows (read by :mod:`.rows`, with §13's
state formats), the halves they use, and the softmax-gated pooling."""

from __future__ import annotations

import numpy as np

from .arithmetic import div, exp2s, mul, sub, tree
from .constants import LOG2E, RatioConfig
from .rows import ChunkInputs, window_rows
from .state_format import PAGED_FP32, StateFormat

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


def half_channels(rows: np.ndarray, config: RatioConfig) -> np.ndarray:
    """Row ``i`` of a window uses half ``h = i // r`` of its state-width row: channels
    ``h*H .. h*H + H - 1`` (C4: rows 0..3 half 0, rows 4..7 half 1; C128 has one half).

    ``rows``: ``[n, W, SW]``; returns ``[n, W, H]`` (H = ``config.head_dim``, 512 or 128).
    """
    n, w = rows.shape[:2]
    halves = rows.reshape(n, w, config.overlap, config.head_dim)
    i = np.arange(w)
    return halves[:, i, i // config.ratio]


def gather_window(
    state_cache: np.ndarray, block_table: np.ndarray, requests: np.ndarray, positions: np.ndarray,
    config: RatioConfig, block_size: int, *, state_format: StateFormat = PAGED_FP32,
    chunk: ChunkInputs | None = None, ape: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window of each token: ``kv[t, i, c]``, ``score[t, i, c]`` (fp32) and ``valid[t, i]``.

    Row ``i`` is position ``pos_i`` (:func:`window_positions`), read by
    :func:`.rows.window_rows` (from the state, paged or a ring, or from ``chunk``), and its
    half ``h = i // r`` (:func:`half_channels`). Invalid rows read nothing (zeros here).
    """
    pos, _ = window_positions(positions, config)
    rows = window_rows(pos, requests, state_format, state_cache, block_table, block_size, chunk, ape)
    return half_channels(rows.kv, config), half_channels(rows.score, config), rows.valid


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
    config: RatioConfig, block_size: int, *, state_format: StateFormat = PAGED_FP32,
    chunk: ChunkInputs | None = None, ape: np.ndarray | None = None,
) -> np.ndarray:
    """``x`` (fp32 ``[n, H]``) for the given (active) tokens, a few tokens at a time.

    ``state_cache``: float32 or uint16 (bf16) ``[num_state_blocks, bs, 2*SW]``;
    ``requests``: int32 ``[n]``; ``positions``: int64 ``[n]``; ``ape``: float32 ``[r, SW]``,
    added where ``state_format.ape_at`` says (SPEC §13.2); ``chunk``: SPEC §13.4's rows.
    """
    out = np.empty((positions.shape[0], config.head_dim), dtype=F32)
    for start in range(0, positions.shape[0], TOKENS_PER_CHUNK):
        part = slice(start, start + TOKENS_PER_CHUNK)
        kv, score, valid = gather_window(state_cache, block_table, requests[part], positions[part], config, block_size,
                                         state_format=state_format, chunk=chunk, ape=ape)
        out[part] = pool_window(kv, score, valid)
    return out
