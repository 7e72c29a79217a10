"""SPEC §14.8: the argument checks of the DeepSeek-V4.1 operations (§9's, plus their own).

Like :mod:`.validation`, whose elementary checks it uses, it works on :class:`ArrayInfo`
descriptions, so the NumPy spec and GPU front ends reject the same calls with the same
messages, before anything is written. Every error is a ``ValueError`` naming the argument,
what was expected and what was given. An optional array argument is described as ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .constants import HEAD_DIM, INDEXER_HEAD_DIM, V41_RATIOS, RatioConfig, v41_ratio_config
from .entry_layout import V41_INDEX_KEY_LAYOUTS, V41_STORE_LAYOUTS
from .state_format import StateFormat
from .validation import (
    STATE_CACHE_DTYPES, ArrayInfo, _aligned, _contract, _cos_sin_cache, _dim, _dtype, _eps, _fail, _fp8_scale, _int_arg, _k_cache,
    _norm_weight, _per_token, _positions, _rank, _ring_blocks, _ring_capacity, _same_device, _state_cache, _state_format,
    _unit_last_stride, check_query_start_loc, describe_numpy,
)

ROW_ALIGN_BYTES = 16  # latent rows (and kv/score rows): base and row stride multiples of 16 bytes
PROJECTION_DTYPES = ("float32", "bfloat16")  # kv, score (bf16 converted exactly)


def describe_optional(name: str, array, **kwargs) -> ArrayInfo | None:
    """:func:`.validation.describe_numpy`, or ``None`` for an argument passed as ``None``."""
    return None if array is None else describe_numpy(name, array, **kwargs)


def check_v41_ratio(compress_ratio) -> RatioConfig:
    """``compress_ratio`` is 1 or 2 (SPEC §14.1); returns ``coff = 1``, ``SW = 512``, ``W = r``."""
    if isinstance(compress_ratio, bool) or compress_ratio not in V41_RATIOS:
        _fail("compress_ratio", f"one of {V41_RATIOS} (DeepSeek-V4.1's compressors)", repr(compress_ratio))
    return v41_ratio_config(int(compress_ratio))


def _no_ape(ape) -> None:
    if ape is not None:
        _fail("ape", "None (DeepSeek-V4.1's compressors add no absolute position embedding)", type(ape).__name__)


def _rows_aligned(info: ArrayInfo) -> None:
    """Rows start on 16-byte boundaries: the base address and (with more than one row) the row stride."""
    _aligned(info, ROW_ALIGN_BYTES)
    if info.shape[0] > 1 and (info.strides[0] * info.itemsize) % ROW_ALIGN_BYTES:
        _fail(info.name, f"a row stride that is a multiple of {ROW_ALIGN_BYTES} bytes", f"strides {list(info.strides)}")


def _token_rows(info: ArrayInfo, dtypes: tuple[str, ...], width: int, num_tokens: int, reference: str, *, aligned: bool) -> None:
    """``[T, width]`` rows of one of ``dtypes``, unit last stride (16-byte aligned rows when ``aligned``)."""
    _dtype(info, *dtypes)
    _rank(info, 2, f"[T, {width}]")
    if info.shape[0] != num_tokens:
        _fail(info.name, f"shape[0] = T = {num_tokens} (the length of {reference})", f"shape {list(info.shape)}")
    _dim(info, 1, width, "head width H" if width == HEAD_DIM else "the indexer's head width")
    if num_tokens == 0:  # no row is read or written (NumPy gives empty arrays zero strides)
        return
    _unit_last_stride(info)
    if aligned:
        _rows_aligned(info)


def _layout_of(layout, allowed: tuple[str, ...], operation: str) -> str:
    if not isinstance(layout, str) or layout not in allowed:
        _fail("layout", f"one of {', '.join(repr(x) for x in allowed)} for {operation}", repr(layout))
    return layout


def _latent(latent: ArrayInfo, num_tokens: int) -> None:
    """``latent``: bf16 ``[T, 512]``, unit last stride, 16-byte aligned rows (SPEC §14.2, §14.8)."""
    _token_rows(latent, ("bfloat16",), HEAD_DIM, num_tokens, "positions", aligned=True)


# ---- v41_compress_norm: the projections, the latent and the norm ------------------------------------
@dataclass(frozen=True)
class V41CompressCall:
    """What a validated ``v41_compress_norm`` needs."""

    config: RatioConfig  # r = 1 or 2, W = r
    num_tokens: int  # T
    eps: np.float32
    latent: bool  # False: the combined call was given latent=None (nothing written there)


def check_v41_compress(
    kv: ArrayInfo, score: ArrayInfo | None, positions: ArrayInfo, rms_norm_weight: ArrayInfo, rms_norm_eps,
    kv_slot_mapping: ArrayInfo, latent: ArrayInfo | None, compress_ratio, ape=None, *, latent_optional: bool = False,
) -> V41CompressCall:
    """SPEC §14.8/§9 checks of everything but the state: the ratio, no ``ape``, ``kv`` (and, for
    ``r = 2``, ``score``) fp32 or bf16 ``[T, 512]`` with 16-byte aligned rows, ``score = None``
    for ``r = 1``, the per-token metadata, the norm and ``latent`` (``None`` only where
    ``latent_optional``)."""
    config = check_v41_ratio(compress_ratio)
    _no_ape(ape)
    num_tokens = _positions(positions)
    _token_rows(kv, PROJECTION_DTYPES, HEAD_DIM, num_tokens, positions.name, aligned=True)
    if config.ratio == 1 and score is not None:
        _fail(score.name, "None for compress_ratio 1 (ratio 1 compresses kv alone: no score, no state)", "an array")
    if config.ratio == 2:
        if score is None:
            _fail("score", "a float32 or bfloat16 [T, 512] array for compress_ratio 2", None)
        _token_rows(score, PROJECTION_DTYPES, HEAD_DIM, num_tokens, positions.name, aligned=True)
    _per_token(kv_slot_mapping, "int64", num_tokens, positions.name)
    _norm_weight(rms_norm_weight, HEAD_DIM)
    eps = _eps(rms_norm_eps)
    if latent is None and not latent_optional:
        _fail("latent", "a bfloat16 [T, 512] output array", None)
    if latent is not None:
        _latent(latent, num_tokens)
    _same_device(*[info for info in (kv, score, positions, rms_norm_weight, kv_slot_mapping, latent) if info is not None])
    return V41CompressCall(config=config, num_tokens=num_tokens, eps=eps, latent=latent is not None)


# ---- v41_compress_norm: the ratio-2 state ---------------------------------------------------------
@dataclass(frozen=True)
class V41StateCall:
    """What a validated ratio-2 state needs (SPEC §14.2, §13.1, §13.3)."""

    block_size: int  # bs: rows per state block
    state_format: StateFormat  # fp32 or bf16 rows of kv and the raw score ("compress": no ape), paged or a ring


def check_v41_state(
    token_to_req: ArrayInfo | None, query_start_loc: ArrayInfo | None, slot_mapping: ArrayInfo | None,
    save_slot_mapping: ArrayInfo | None, block_table: ArrayInfo | None, bs, state_cache: ArrayInfo | None, ring_capacity,
    config: RatioConfig, num_tokens: int, *, state_dtypes: tuple[str, ...] = STATE_CACHE_DTYPES,
) -> V41StateCall | None:
    """SPEC §14.8/§9/§13 checks of the state arguments. Ratio 1 keeps no state: ``state_cache``
    must be ``None`` and the other state arguments are not read (``None`` or anything); returns
    ``None``. Ratio 2: the per-token metadata of length ``T``, ``query_start_loc`` int32
    ``[num_reqs + 1]`` with ``num_reqs <= block_table.shape[0]``, the state cache
    ``[num_state_blocks, bs, 1024]`` (one of ``state_dtypes``), and ``ring_capacity`` (``None``,
    or a multiple of ``bs`` that is at least ``W = 2``, with a block table at least
    ``ring_capacity / bs`` blocks wide)."""
    if config.ratio == 1:
        if state_cache is not None:
            _fail(state_cache.name, "None for compress_ratio 1 (ratio 1 keeps no state)", "an array")
        return None
    given = dict(token_to_req=token_to_req, query_start_loc=query_start_loc, slot_mapping=slot_mapping,
                 save_slot_mapping=save_slot_mapping, block_table=block_table, state_cache=state_cache)
    for name, info in given.items():
        if info is None:
            _fail(name, "an array for compress_ratio 2 (ratio 2 keeps a state)", None)
    _per_token(token_to_req, "int32", num_tokens, "positions")
    _per_token(slot_mapping, "int64", num_tokens, "positions")
    _per_token(save_slot_mapping, "int64", num_tokens, "positions")
    _dtype(block_table, "int32")
    _rank(block_table, 2, "[num_reqs, max_blocks]")
    _unit_last_stride(block_table)
    check_query_start_loc(query_start_loc, block_table)
    block_size = _int_arg("bs", bs, 1)
    _state_cache(state_cache, config, block_size, state_dtypes)
    ring_capacity = _ring_capacity(ring_capacity, config, block_size)
    _ring_blocks(block_table, ring_capacity, block_size)
    _same_device(state_cache, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table)
    return V41StateCall(block_size=block_size, state_format=_state_format(state_cache, "compress", ring_capacity))


# ---- v41_rope_quant_store ------------------------------------------------------------------------
@dataclass(frozen=True)
class V41StoreCall:
    """What a validated ``v41_rope_quant_store`` needs."""

    config: RatioConfig
    num_tokens: int
    layout: str
    entries_per_page: int  # B
    fp8_scale: np.float32 | None


def check_v41_store(
    latent: ArrayInfo | None, positions: ArrayInfo, kv_slot_mapping: ArrayInfo, cos_sin_cache: ArrayInfo,
    k_cache: ArrayInfo, compress_ratio, layout, fp8_scale,
) -> V41StoreCall:
    """SPEC §14.8/§9 checks of ``v41_rope_quant_store``: the ratio, one of its five layouts and
    that layout's cache, ``fp8_scale`` for ``fp8_per_tensor`` only, ``cos_sin_cache`` fp32
    ``[max_pos, 64]``, and ``latent`` (``None`` when the combined call computes it itself)."""
    config = check_v41_ratio(compress_ratio)
    layout = _layout_of(layout, V41_STORE_LAYOUTS, "v41_rope_quant_store")
    num_tokens = _positions(positions)
    if latent is not None:
        _latent(latent, num_tokens)
    _per_token(kv_slot_mapping, "int64", num_tokens, positions.name)
    _cos_sin_cache(cos_sin_cache)
    entries = _k_cache(k_cache, layout)
    scale = _fp8_scale(fp8_scale, layout)
    _same_device(*[info for info in (positions, latent, kv_slot_mapping, cos_sin_cache, k_cache) if info is not None])
    return V41StoreCall(config=config, num_tokens=num_tokens, layout=layout, entries_per_page=entries, fp8_scale=scale)


# ---- v41_index_key_store ---------------------------------------------------------------------------
@dataclass(frozen=True)
class V41IndexKeyCall:
    """What a validated ``v41_index_key_store`` needs."""

    config: RatioConfig
    num_tokens: int
    layout: str
    entries_per_page: int  # B
    eps: np.float32


def check_v41_index_key(
    k_pre: ArrayInfo, positions: ArrayInfo, kv_slot_mapping: ArrayInfo, rms_norm_weight: ArrayInfo, rms_norm_eps,
    cos_sin_cache: ArrayInfo, k_cache: ArrayInfo, compress_ratio, layout,
) -> V41IndexKeyCall:
    """SPEC §14.8/§9 checks of ``v41_index_key_store``: ``k_pre`` bf16 ``[T, 128]``, the norm
    over 128 channels, ``indexer_fp8`` or ``indexer_mxfp4`` and its cache."""
    config = check_v41_ratio(compress_ratio)
    layout = _layout_of(layout, V41_INDEX_KEY_LAYOUTS, "v41_index_key_store")
    num_tokens = _positions(positions)
    _token_rows(k_pre, ("bfloat16",), INDEXER_HEAD_DIM, num_tokens, positions.name, aligned=False)
    _per_token(kv_slot_mapping, "int64", num_tokens, positions.name)
    _norm_weight(rms_norm_weight, INDEXER_HEAD_DIM)
    eps = _eps(rms_norm_eps)
    _cos_sin_cache(cos_sin_cache)
    entries = _k_cache(k_cache, layout)
    _same_device(k_pre, positions, kv_slot_mapping, rms_norm_weight, cos_sin_cache, k_cache)
    return V41IndexKeyCall(config=config, num_tokens=num_tokens, layout=layout, entries_per_page=entries, eps=eps)


# ---- debug: values against buffers ---------------------------------------------------------------------
def check_v41_store_contract(
    stores: np.ndarray,  # bool [T]: the tokens that write a record
    positions: np.ndarray,  # int64 [T]
    kv_slot_mapping: np.ndarray,  # int64 [T]
    num_entries: int,  # num_pages * B
    cos_sin_rows: int,  # cos_sin_cache.shape[0]
    compress_ratio: int,
) -> None:
    """The debug checks of a V4.1 store (SPEC §9 leaves them to the caller): every storing token's
    slot inside ``k_cache``, its RoPE row ``cp = (p // r) * r`` inside ``cos_sin_cache``, and no
    slot written by two tokens."""
    for t in np.flatnonzero(stores):
        if kv_slot_mapping[t] >= num_entries:
            _contract(f"kv_slot_mapping[{t}] = {kv_slot_mapping[t]} is outside k_cache ({num_entries} entries)")
        row = (int(positions[t]) // compress_ratio) * compress_ratio
        if not 0 <= row < cos_sin_rows:
            _contract(f"token {t} (position {positions[t]}) rotates with cos_sin_cache row {row} but cos_sin_cache has {cos_sin_rows} rows")
    values, counts = np.unique(kv_slot_mapping[stores], return_counts=True)
    if np.any(counts > 1):
        _contract(f"compressed-cache slot {values[counts > 1][0]} is written by more than one token")
