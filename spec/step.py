"""SPEC §13.4: ``compress_and_save``, one layer's step that reads the chunk's own rows from its
inputs, then saves.

1. **Compress** every active token (SPEC §5's rule, with ``slot_mapping``): a window row at a
   position ``q`` at or after its request's chunk start ``P0`` comes from this call's ``kv`` and
   ``score`` (as the save would store it and pooling read it back), a row before ``P0`` from the
   state (paged or a ring) — :func:`.rows.window_rows`.
2. **Save** every token with ``save_slot_mapping[t] >= 0`` (SPEC §4 with §13.1, §13.2), after
   the compress, so a ring's tail may overwrite rows the compress has read.
"""

from __future__ import annotations

import numpy as np

from .operator import store_entries, validated_store
from .pooling import active_tokens, pool
from .rows import ChunkInputs
from .state import save_rows
from .validation import (
    STATE_CACHE_DTYPES, check_compress, check_contract, check_save_contract, check_step, check_step_contract, describe_numpy,
)

__all__ = ["compress_and_save"]


def compress_and_save(
    kv: np.ndarray,  # float32 [T, SW]: this call's kv projections (any row stride, 16-byte aligned rows)
    score: np.ndarray,  # float32 [T, SW]: this call's raw scores (no ape)
    ape: np.ndarray,  # float32 [r, SW]: added at the save or at the compress (ape_at)
    positions: np.ndarray,  # int64 [T]
    token_to_req: np.ndarray,  # int32 [T]: request (block_table row) of each token
    query_start_loc: np.ndarray,  # int32 [num_reqs + 1]: first token of each request's chunk
    slot_mapping: np.ndarray,  # int64 [T]: state slot, -1 = padding (the activity rule reads it)
    save_slot_mapping: np.ndarray,  # int64 [T]: slot the save writes, -1 = not saved (a ring: the tail)
    block_table: np.ndarray,  # int32 [num_reqs', max_blocks], num_reqs' >= num_reqs
    bs: int,  # rows per state block
    state_cache: np.ndarray,  # float32, or uint16 bf16 patterns, [num_state_blocks, bs, 2*SW]; written in place
    rms_norm_weight: np.ndarray,  # float32 [H] or uint16 [H] (bf16 bit patterns); H = 512 or 128
    rms_norm_eps: float,  # rounded to binary32
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]
    k_cache: np.ndarray,  # the layout's cache, as in compress_norm_rope_store; written in place
    kv_slot_mapping: np.ndarray,  # int64 [T]: compressed-cache slot, -1 = none
    *,
    compress_ratio: int,  # 4 (C4) or 128 (C128)
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    ape_at: str = "save",  # SPEC §13.2
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    hadamard: bool = False,  # SPEC §12's rotation; indexer layouts only
    debug: bool = False,
) -> None:
    """SPEC §13.4: compress every active token, its window's rows at or after its chunk's start
    taken from ``kv``/``score``, then save the tokens with ``save_slot_mapping >= 0``.

    With ``save_slot_mapping = slot_mapping``, paged addressing and a state slot for every token
    of every chunk, the bytes equal ``save_partial_states`` then ``compress_norm_rope_store`` on
    ``kv_score = [kv | score]``. Nothing is written if validation fails.
    """
    pooling = check_compress(
        describe_numpy("state_cache", state_cache), describe_numpy("token_to_req", token_to_req),
        describe_numpy("positions", positions), describe_numpy("slot_mapping", slot_mapping),
        describe_numpy("block_table", block_table), bs, describe_numpy("kv_slot_mapping", kv_slot_mapping),
        compress_ratio, ape=None if ape is None else describe_numpy("ape", ape), ape_at=ape_at,
        ring_capacity=ring_capacity, state_dtypes=STATE_CACHE_DTYPES,
    )
    config, block_size, state_format = pooling.config, pooling.block_size, pooling.state_format
    check_step(describe_numpy("kv", kv), describe_numpy("score", score), None if ape is None else describe_numpy("ape", ape),
               describe_numpy("query_start_loc", query_start_loc), describe_numpy("save_slot_mapping", save_slot_mapping),
               describe_numpy("block_table", block_table), config, pooling.num_tokens)
    store = validated_store(rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, state_cache,
                            config.head_dim, hadamard)
    active = active_tokens(positions, slot_mapping, kv_slot_mapping, config.ratio)
    if debug:
        check_step_contract(query_start_loc, token_to_req, positions, slot_mapping, save_slot_mapping, kv_slot_mapping)
        check_contract(config, active, token_to_req, positions, slot_mapping, block_table, state_cache.shape[0], block_size,
                       kv_slot_mapping, num_entries=k_cache.shape[0] * store.entries_per_page,
                       cos_sin_rows=cos_sin_cache.shape[0], state_format=state_format, query_start_loc=query_start_loc)
        check_save_contract(positions, save_slot_mapping, state_cache.shape[0], block_size)
    tokens = np.flatnonzero(active)
    if tokens.size:
        chunk = ChunkInputs(kv=kv, score=score, positions=positions, query_start_loc=query_start_loc)
        x = pool(state_cache, block_table, token_to_req[tokens], positions[tokens], config, block_size,
                 state_format=state_format, chunk=chunk, ape=ape)
        store_entries(x, positions[tokens], kv_slot_mapping[tokens], rms_norm_weight, cos_sin_cache, k_cache, store,
                      config.ratio)
    save_rows(kv, score, ape, positions, save_slot_mapping, state_cache, block_size, state_format)
