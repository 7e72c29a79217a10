"""SPEC §4: saving this step's projections into the paged state cache."""

from __future__ import annotations

import numpy as np

from .arithmetic import add
from .validation import check_save_contract, check_save_partial_states, describe_numpy


def save_partial_states(
    kv_score: np.ndarray,  # float32 [T, 2*SW]: kv[0:SW] then score[0:SW] (score without ape)
    ape: np.ndarray,  # float32 [r, SW]: absolute position embedding added to the score
    positions: np.ndarray,  # int64 [T]
    slot_mapping: np.ndarray,  # int64 [T]: state slot block*bs + offset, -1 = padding
    state_cache: np.ndarray,  # float32 [num_state_blocks, bs, 2*SW], written in place
    block_size: int,  # bs: rows per state block
    *,
    debug: bool = False,
) -> None:
    """For every token with ``slot >= 0``, write its state row at ``(slot // bs, slot % bs)``.

    The row is ``kv_score[t, 0:SW]`` copied, then ``add(kv_score[t, SW + d], ape[p mod r, d])``.
    Nothing else is written; nothing at all if validation fails.
    """
    call = check_save_partial_states(
        describe_numpy("kv_score", kv_score),
        describe_numpy("ape", ape),
        describe_numpy("positions", positions),
        describe_numpy("slot_mapping", slot_mapping),
        describe_numpy("state_cache", state_cache),
        block_size,
    )
    if debug:
        check_save_contract(positions, slot_mapping, state_cache.shape[0], call.block_size)
    width = call.config.state_width
    saved = np.flatnonzero(slot_mapping >= 0)
    slots = slot_mapping[saved]
    blocks, offsets = slots // call.block_size, slots % call.block_size
    kv = kv_score[saved, :width]
    score = add(kv_score[saved, width:], ape[positions[saved] % call.config.ratio])
    state_cache[blocks, offsets, :width] = kv
    state_cache[blocks, offsets, width:] = score
