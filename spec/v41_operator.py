"""SPEC §14.7: DeepSeek-V4.1's four operations, composed from §14.3-§14.6 after the §14.8 checks.

- :func:`v41_compress_norm`: pool (ratio 1 or 2), norm and write the bf16 latent; ratio 2
  then saves the step's rows into its state;
- :func:`v41_rope_quant_store`: rotate the latent and store one record per boundary token with
  a cache slot;
- :func:`v41_compress_norm_rope_store`: both in one call (``latent`` may be ``None``);
- :func:`v41_index_key_store`: the indexer's key from ``k_pre = wk(latent)``.

Arrays in, buffers written in place; bf16 data travels as ``uint16`` bit patterns and E4M3 data
as ``uint8`` bytes. A call either raises ``ValueError`` before writing anything or writes
exactly the bytes SPEC §14 names.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .postprocess import norm_weight_f32, rope_row
from .v41_compress import StateArguments, active_tokens, as_binary32, latent_of, pooled_ratio2, save_ratio2, stored_tokens
from .v41_index_key import index_key_entries, store_index_keys
from .v41_records import store_rotated_entries
from .v41_rope import rotate_bf16
from .validation import ArrayInfo, check_contract, check_save_contract, check_step_contract, numpy_describer
from .v41_validation import (
    V41CompressCall, V41StateCall, check_v41_compress, check_v41_index_key, check_v41_state, check_v41_store,
    check_v41_store_contract, describe_numpy, describe_optional,
)

__all__ = ["v41_compress_norm", "v41_rope_quant_store", "v41_compress_norm_rope_store", "v41_index_key_store"]


def _k_cache_info(k_cache: np.ndarray, layout) -> ArrayInfo:
    """``k_cache`` described for validation: NumPy holds ``fp8_per_tensor``'s E4M3 as uint8."""
    return numpy_describer(layout)("k_cache", k_cache)


def _check_compress(kv, score, positions, state: StateArguments, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent,
                    compress_ratio, ape, latent_optional=False) -> tuple[V41CompressCall, V41StateCall | None]:
    """The §14.8 checks of a compress (arrays as in :func:`v41_compress_norm`); ratio 1 describes
    only ``state_cache`` of the state arguments, so the others may be anything."""
    call = check_v41_compress(
        describe_numpy("kv", kv), describe_optional("score", score), describe_numpy("positions", positions),
        describe_numpy("rms_norm_weight", rms_norm_weight), rms_norm_eps, describe_numpy("kv_slot_mapping", kv_slot_mapping),
        describe_optional("latent", latent), compress_ratio, ape, latent_optional=latent_optional,
    )
    if call.config.ratio == 1:  # only a state given is an error; the other state arguments are not read
        state_call = check_v41_state(None, None, None, None, None, None, describe_optional("state_cache", state.state_cache),
                                     None, call.config, call.num_tokens)
        return call, state_call
    state_call = check_v41_state(
        describe_optional("token_to_req", state.token_to_req), describe_optional("query_start_loc", state.query_start_loc),
        describe_optional("slot_mapping", state.slot_mapping), describe_optional("save_slot_mapping", state.save_slot_mapping),
        describe_optional("block_table", state.block_table), state.bs, describe_optional("state_cache", state.state_cache),
        state.ring_capacity, call.config, call.num_tokens,
    )
    return call, state_call


def _check_state_contract(call: V41CompressCall, state_call: V41StateCall | None, positions, state: StateArguments,
                          kv_slot_mapping) -> None:
    """``debug=True`` at ratio 2: SPEC §13.4's chunk contract, the window rows before each chunk
    inside the state (paged or the ring), the slots saved once and inside the state."""
    if state_call is None:
        return
    active = active_tokens(positions, state.slot_mapping, kv_slot_mapping, call.config.ratio)
    check_step_contract(state.query_start_loc, state.token_to_req, positions, state.slot_mapping, state.save_slot_mapping,
                        kv_slot_mapping)
    check_contract(call.config, active, state.token_to_req, positions, state.slot_mapping, state.block_table,
                   state.state_cache.shape[0], state_call.block_size, kv_slot_mapping,
                   state_format=state_call.state_format, query_start_loc=state.query_start_loc)
    check_save_contract(positions, state.save_slot_mapping, state.state_cache.shape[0], state_call.block_size)


def _compress(call: V41CompressCall, state_call: V41StateCall | None, kv, score, positions, state: StateArguments,
              rms_norm_weight, kv_slot_mapping) -> tuple[np.ndarray, np.ndarray]:
    """The active tokens (int64 ``[n]``) and their latents (uint16 ``[n, 512]``); ratio 2 then
    saves (the caller writes the latents: the save is the last write to the state)."""
    r = call.config.ratio
    tokens = np.flatnonzero(active_tokens(positions, state.slot_mapping, kv_slot_mapping, r))
    kv32 = as_binary32(kv)
    if r == 1:
        return tokens, latent_of(kv32[tokens], norm_weight_f32(rms_norm_weight), call.eps)
    score32 = as_binary32(score)
    state = replace(state, bs=state_call.block_size)
    x = pooled_ratio2(kv32, score32, positions, tokens, state, state_call.state_format)
    bits = latent_of(x, norm_weight_f32(rms_norm_weight), call.eps)
    save_ratio2(kv32, score32, positions, state, state_call.state_format)  # after the compress has read its rows
    return tokens, bits


def v41_compress_norm(
    kv: np.ndarray,  # float32 or uint16 (bf16) [T, 512]: the wkv projection
    score: np.ndarray | None,  # float32 or uint16 (bf16) [T, 512]: the raw wgate projection; None for ratio 1
    positions: np.ndarray,  # int64 [T]
    token_to_req: np.ndarray | None,  # int32 [T]: block_table row of each token (ratio 2)
    query_start_loc: np.ndarray | None,  # int32 [num_reqs + 1]: first token of each request's chunk (ratio 2)
    slot_mapping: np.ndarray | None,  # int64 [T]: state slot, -1 = padding (ratio 2; activity)
    save_slot_mapping: np.ndarray | None,  # int64 [T]: slot each token is saved at after the compress, -1 = not saved (ratio 2)
    block_table: np.ndarray | None,  # int32 [num_reqs, max_blocks]: state blocks per request (ratio 2)
    bs: int | None,  # rows per state block (ratio 2)
    state_cache: np.ndarray | None,  # float32 or uint16 (bf16) [num_state_blocks, bs, 1024]: kv then raw score (ratio 2)
    rms_norm_weight: np.ndarray,  # float32 [512] or uint16 [512] (bf16)
    rms_norm_eps: float,  # rounded to binary32
    kv_slot_mapping: np.ndarray,  # int64 [T]: compressed-cache slot, -1 = none
    latent: np.ndarray,  # uint16 (bf16) [T, 512], written in place: the rows of active tokens
    *,
    compress_ratio: int,  # 1 or 2
    ring_capacity: int | None = None,  # ratio 2: None (paged state) or C rows per request (a ring)
    ape=None,  # must be None: V4.1 has no absolute position embedding
    debug: bool = False,  # also check values against the buffers (slots, block-table entries, chunks)
) -> None:
    """SPEC §14.3: write ``latent[t] = bf16(RMSNorm(bf16(x)))`` for every active token; for
    ratio 2, then save every token with ``save_slot_mapping >= 0`` into the state.

    Ratio 1 keeps no state: ``score`` and ``state_cache`` are ``None`` and ``token_to_req``,
    ``query_start_loc``, ``slot_mapping``, ``save_slot_mapping``, ``block_table``, ``bs`` and
    ``ring_capacity`` are not read.
    """
    state = StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs, state_cache,
                           ring_capacity)
    call, state_call = _check_compress(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent,
                                       compress_ratio, ape)
    if debug:
        _check_state_contract(call, state_call, positions, state, kv_slot_mapping)
    tokens, bits = _compress(call, state_call, kv, score, positions, state, rms_norm_weight, kv_slot_mapping)
    latent[tokens] = bits


def v41_rope_quant_store(
    latent: np.ndarray,  # uint16 (bf16) [T, 512]: read for the tokens that store
    positions: np.ndarray,  # int64 [T]
    kv_slot_mapping: np.ndarray,  # int64 [T]: compressed-cache slot, -1 = none
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]: cos[0:32] then sin[0:32] (V4.1's compress RoPE table)
    k_cache: np.ndarray,  # flashmla_fp8: uint8 [num_pages, B, 584]; bf16: uint16 [num_pages, B, 512]; fp8_per_tensor: uint8 [num_pages, B, 512]; v41_mxfp8: uint8 [num_pages, B, 528]; v41_nvfp4: uint8 [num_pages, B, 288]
    *,
    compress_ratio: int,  # 1 or 2
    layout: str,  # flashmla_fp8, bf16, fp8_per_tensor, v41_mxfp8 or v41_nvfp4
    fp8_scale: float | None = None,  # fp8_per_tensor only
    debug: bool = False,  # also check slots and RoPE rows against the buffers
) -> None:
    """SPEC §14.4-§14.5: for every token with ``kv_slot_mapping >= 0`` at a boundary position,
    rotate its latent row (RoPE at ``cp = (p // r) * r``, bf16 outputs, NoPE copied) and store
    the record of ``z`` at its slot."""
    call = check_v41_store(describe_numpy("latent", latent), describe_numpy("positions", positions),
                           describe_numpy("kv_slot_mapping", kv_slot_mapping), describe_numpy("cos_sin_cache", cos_sin_cache),
                           _k_cache_info(k_cache, layout), compress_ratio, layout, fp8_scale)
    stores = stored_tokens(positions, kv_slot_mapping, call.config.ratio)
    if debug:
        check_v41_store_contract(stores, positions, kv_slot_mapping, k_cache.shape[0] * call.entries_per_page,
                                 cos_sin_cache.shape[0], call.config.ratio)
    tokens = np.flatnonzero(stores)
    _rotate_and_store(latent[tokens], tokens, positions, kv_slot_mapping, cos_sin_cache, k_cache, call.config.ratio,
                      call.layout, call.fp8_scale)


def _rotate_and_store(
    latent_bits: np.ndarray,  # uint16 [n, 512]: the latents of the storing tokens
    tokens: np.ndarray,  # int64 [n]: those tokens
    positions: np.ndarray,  # int64 [T]
    kv_slot_mapping: np.ndarray,  # int64 [T]
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]
    k_cache: np.ndarray,  # the layout's cache, written in place
    ratio: int,
    layout: str,
    fp8_scale: np.float32 | None,
) -> None:
    """SPEC §14.4-§14.5 for validated arguments: rotate at ``cp = (p // r) * r``, store ``z``."""
    if tokens.size == 0:
        return
    z = rotate_bf16(latent_bits, cos_sin_cache[rope_row(positions[tokens], ratio)])
    store_rotated_entries(k_cache, kv_slot_mapping[tokens], z, layout, fp8_scale)


def v41_compress_norm_rope_store(
    kv: np.ndarray,  # float32 or uint16 (bf16) [T, 512]
    score: np.ndarray | None,  # float32 or uint16 (bf16) [T, 512]; None for ratio 1
    positions: np.ndarray,  # int64 [T]
    token_to_req: np.ndarray | None,  # int32 [T] (ratio 2)
    query_start_loc: np.ndarray | None,  # int32 [num_reqs + 1] (ratio 2)
    slot_mapping: np.ndarray | None,  # int64 [T] (ratio 2)
    save_slot_mapping: np.ndarray | None,  # int64 [T] (ratio 2)
    block_table: np.ndarray | None,  # int32 [num_reqs, max_blocks] (ratio 2)
    bs: int | None,  # (ratio 2)
    state_cache: np.ndarray | None,  # float32 or uint16 (bf16) [num_state_blocks, bs, 1024] (ratio 2)
    rms_norm_weight: np.ndarray,  # float32 [512] or uint16 [512] (bf16)
    rms_norm_eps: float,
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]
    k_cache: np.ndarray,  # as for v41_rope_quant_store
    kv_slot_mapping: np.ndarray,  # int64 [T]
    latent: np.ndarray | None,  # uint16 (bf16) [T, 512] written in place, or None (not written)
    *,
    compress_ratio: int,  # 1 or 2
    layout: str,  # flashmla_fp8, bf16, fp8_per_tensor, v41_mxfp8 or v41_nvfp4
    ring_capacity: int | None = None,
    fp8_scale: float | None = None,
    ape=None,  # must be None
    debug: bool = False,  # also check values against the buffers
) -> None:
    """:func:`v41_compress_norm` then :func:`v41_rope_quant_store` in one call, every check made
    before anything is written. Each token active in §14.3's sense writes its latent row
    (when ``latent`` is given) and its record; inactive tokens write nothing anywhere (a
    ratio-2 boundary token without a state slot stores no record either)."""
    state = StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs, state_cache,
                           ring_capacity)
    call, state_call = _check_compress(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent,
                                       compress_ratio, ape, latent_optional=True)
    store = check_v41_store(describe_optional("latent", latent), describe_numpy("positions", positions),
                            describe_numpy("kv_slot_mapping", kv_slot_mapping), describe_numpy("cos_sin_cache", cos_sin_cache),
                            _k_cache_info(k_cache, layout), compress_ratio, layout, fp8_scale)
    if debug:
        _check_state_contract(call, state_call, positions, state, kv_slot_mapping)
        check_v41_store_contract(active_tokens(positions, slot_mapping, kv_slot_mapping, call.config.ratio), positions,
                                 kv_slot_mapping, k_cache.shape[0] * store.entries_per_page, cos_sin_cache.shape[0],
                                 call.config.ratio)
    tokens, bits = _compress(call, state_call, kv, score, positions, state, rms_norm_weight, kv_slot_mapping)
    if latent is not None:
        latent[tokens] = bits
    _rotate_and_store(bits, tokens, positions, kv_slot_mapping, cos_sin_cache, k_cache, call.config.ratio, store.layout,
                      store.fp8_scale)


def v41_index_key_store(
    k_pre: np.ndarray,  # uint16 (bf16) [T, 128]: wk(latent)
    positions: np.ndarray,  # int64 [T]
    kv_slot_mapping: np.ndarray,  # int64 [T]: the slot in the indexer's cache, -1 = none
    rms_norm_weight: np.ndarray,  # float32 [128] or uint16 [128] (bf16)
    rms_norm_eps: float,
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]
    k_cache: np.ndarray,  # indexer_fp8: uint8 [num_pages, B, 132]; indexer_mxfp4: uint8 [num_pages, B, 68]
    *,
    compress_ratio: int,  # 1 or 2
    layout: str,  # indexer_fp8 or indexer_mxfp4
    debug: bool = False,  # also check slots and RoPE rows against the buffers
) -> None:
    """SPEC §14.6: for every token with ``kv_slot_mapping >= 0`` at a boundary position, norm
    ``k_pre`` over 128 channels into bf16, rotate channels 64..127 at ``cp`` with bf16 outputs
    (no Hadamard rotation) and store §12's record of the result."""
    call = check_v41_index_key(describe_numpy("k_pre", k_pre), describe_numpy("positions", positions),
                               describe_numpy("kv_slot_mapping", kv_slot_mapping),
                               describe_numpy("rms_norm_weight", rms_norm_weight), rms_norm_eps,
                               describe_numpy("cos_sin_cache", cos_sin_cache), describe_numpy("k_cache", k_cache),
                               compress_ratio, layout)
    stores = stored_tokens(positions, kv_slot_mapping, call.config.ratio)
    if debug:
        check_v41_store_contract(stores, positions, kv_slot_mapping, k_cache.shape[0] * call.entries_per_page,
                                 cos_sin_cache.shape[0], call.config.ratio)
    tokens = np.flatnonzero(stores)
    if tokens.size == 0:
        return
    cos_sin = cos_sin_cache[rope_row(positions[tokens], call.config.ratio)]
    z = index_key_entries(k_pre[tokens], norm_weight_f32(rms_norm_weight), call.eps, cos_sin)
    store_index_keys(k_cache, kv_slot_mapping[tokens], z, call.layout)
