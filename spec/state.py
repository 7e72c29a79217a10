"""SPEC §4 (with §13.1-§13.3): saving this step's projections into the state cache."""

from __future__ import annotations

import numpy as np

from .state_format import StateFormat
from .validation import STATE_CACHE_DTYPES, check_save_arrays, check_save_contract, describe_numpy


def save_partial_states(
    kv_score: np.ndarray,  # float32 [T, 2*SW]: kv[0:SW] then score[0:SW] (score without ape)
    ape: np.ndarray | None,  # float32 [r, SW]: absolute position embedding; unused (may be None) with ape_at="compress"
    positions: np.ndarray,  # int64 [T]
    slot_mapping: np.ndarray,  # int64 [T]: state slot block*bs + offset, -1 = padding
    state_cache: np.ndarray,  # float32, or uint16 bf16 patterns, [num_state_blocks, bs, 2*SW]; written in place
    block_size: int,  # bs: rows per state block
    *,
    ape_at: str = "save",  # SPEC §13.2: "save" adds ape here, "compress" stores the raw score
    ring_capacity: int | None = None,  # SPEC §13.3: checked only; slot_mapping already names ring slots
    debug: bool = False,
) -> None:
    """For every token with ``slot >= 0``, write its state row at ``(slot // bs, slot % bs)``.

    The row is ``kv_score[t, 0:SW]``, then the score: ``add(kv_score[t, SW + d], ape[p mod r, d])``
    with ``ape_at = "save"``, ``kv_score[t, SW + d]`` with ``"compress"``; a bf16 state stores each
    element rounded once to bf16. Nothing else is written; nothing at all if validation fails.
    """
    call = check_save_arrays(describe_numpy, kv_score, ape, positions, slot_mapping, state_cache, block_size,
                             ape_at=ape_at, ring_capacity=ring_capacity, state_dtypes=STATE_CACHE_DTYPES)
    if debug:
        check_save_contract(positions, slot_mapping, state_cache.shape[0], call.block_size)
    width = call.config.state_width
    used_ape = ape if call.state_format.ape_at == "save" else None
    save_rows(kv_score[:, :width], kv_score[:, width:], used_ape, positions, slot_mapping, state_cache, call.block_size,
              call.state_format)


def save_rows(
    kv: np.ndarray,  # float32 [T, SW]
    score: np.ndarray,  # float32 [T, SW]: raw, without ape
    ape: np.ndarray | None,  # float32 [r, SW]; None: no ape to add
    positions: np.ndarray,  # int64 [T]
    slots: np.ndarray,  # int64 [T]: state slot of each token, -1 = not saved
    state_cache: np.ndarray,  # state_format.storage [num_state_blocks, bs, 2*SW], written in place
    block_size: int,  # bs
    state_format: StateFormat,
) -> None:
    """Write ``state_format.save_row`` of every token with ``slot >= 0`` at ``(slot // bs, slot % bs)``
    (the arguments are validated by the caller)."""
    saved = np.flatnonzero(slots >= 0)
    blocks, offsets = slots[saved] // block_size, slots[saved] % block_size
    ape_rows = None if ape is None else ape[positions[saved] % ape.shape[0]]
    stored_kv, stored_score = state_format.save_row(kv[saved], score[saved], ape_rows)
    width = kv.shape[1]
    state_cache[blocks, offsets, :width] = stored_kv
    state_cache[blocks, offsets, width:] = stored_score
