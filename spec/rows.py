"""SPEC §5/§13: where the rows of a window come from, as pooling reads them.

A window row at position ``q`` of request ``req`` is read from the state (paged or a ring,
§5 and §13.3), or, in §13.4's step call, from the call's own ``kv``/``score`` when the
request's chunk holds it (``q >= P0``, the chunk's first position): token
``u = query_start_loc[req] + (q - P0)`` gives the row exactly as the save would store it and
pooling would read it back (both through :class:`.state_format.StateFormat`).

:func:`window_rows` returns whole state-width rows (``SW`` channels of kv and of score), with
no pooling: §5's halves and softmax live in :mod:`.pooling`, and other pooling formulas
(DeepSeek-V4.1's ratio-2 compressor, with no ``ape``) take the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .state_format import StateFormat

F32 = np.float32


@dataclass(frozen=True)
class ChunkInputs:
    """SPEC §13.4: one call's projections and where each request's chunk starts.

    Caller's contract: tokens ``query_start_loc[req] .. query_start_loc[req+1] - 1`` are request
    ``req``'s, at consecutive positions from ``positions[query_start_loc[req]]``.
    """

    kv: np.ndarray  # float32 [T, SW]: the kv projection of each token
    score: np.ndarray  # float32 [T, SW]: the raw score projection (no ape)
    positions: np.ndarray  # int64 [T]
    query_start_loc: np.ndarray  # int32 [num_reqs + 1]: first token of each request's chunk


@dataclass(frozen=True)
class WindowRows:
    """The rows of ``n`` windows as pooling reads them; invalid rows hold ``+0``."""

    kv: np.ndarray  # float32 [n, W, SW]
    score: np.ndarray  # float32 [n, W, SW]: with ape where the format adds it at pooling
    valid: np.ndarray  # bool [n, W]: the row's position is >= 0
    from_chunk: np.ndarray  # bool [n, W]: the row came from the call's inputs, not the state


def window_rows(
    window: np.ndarray,  # int64 [n, W]: each window's row positions; rows at positions < 0 are invalid
    requests: np.ndarray,  # int [n]: block-table row (and query_start_loc index) of each window
    state_format: StateFormat,
    state_cache: np.ndarray | None,  # float32 or uint16 (bf16) [num_state_blocks, bs, 2*SW]; None: no state
    block_table: np.ndarray | None,  # int32 [num_reqs, max_blocks]
    block_size: int | None,  # bs
    chunk: ChunkInputs | None = None,  # this call's rows (SPEC §13.4); None: every row from the state
    ape: np.ndarray | None = None,  # float32 [r, SW]: row q uses ape[q mod r]; None: no ape
) -> WindowRows:
    """The kv and score rows of each window (SPEC §5's ``S_i`` with §13's formats), whole.

    A valid row at position ``q`` comes from ``chunk`` when the window's request has a chunk
    there (``q >= P0``): ``read_row(save_row(kv[u], score[u], ape[q mod r]))``; otherwise from
    the state row ``state_format.row_of(...)``, read by ``read_row``. With ``state_cache``
    ``None`` every valid row must come from the chunk.
    """
    n, w = window.shape
    width = chunk.kv.shape[1] if chunk is not None else state_cache.shape[2] // 2
    valid = window >= 0
    from_chunk = np.zeros_like(valid)
    if chunk is not None:
        start = chunk.query_start_loc[requests].astype(np.int64)  # [n]
        first = chunk.positions[np.minimum(start, chunk.positions.shape[0] - 1)]  # P0 (a window's token is in its chunk)
        from_chunk = valid & (window >= first[:, None])
    kv = np.zeros((n, w, width), dtype=F32)
    score = np.zeros((n, w, width), dtype=F32)

    def ape_rows(positions):
        return None if ape is None else ape[positions % ape.shape[0]]

    token, row = np.nonzero(from_chunk)
    if token.size:
        q = window[token, row]
        u = start[token] + (q - first[token])
        ape_q = ape_rows(q)
        kv[token, row], score[token, row] = state_format.read_row(
            *state_format.save_row(chunk.kv[u], chunk.score[u], ape_q), ape_q)
    token, row = np.nonzero(valid & ~from_chunk)
    if token.size:
        if state_cache is None:
            raise ValueError("state_cache: expected a state for the window rows before the chunk, got None")
        q = window[token, row]
        blocks, offsets = state_format.row_of(block_table, requests[token], q, block_size)
        stored = state_cache[blocks, offsets]  # [m, 2*SW]
        kv[token, row], score[token, row] = state_format.read_row(stored[:, :width], stored[:, width:], ape_rows(q))
    return WindowRows(kv=kv, score=score, valid=valid, from_chunk=from_chunk)
