"""SPEC §8: the public operations, composed from §4-§7 (§12, §13) after the §9 checks.

The head width follows from the state cache's width and the ratio: 512 (layouts
``flashmla_fp8``, ``bf16``, ``fp8_per_tensor``) or the indexer's 128 (``indexer_fp8``,
``indexer_mxfp4``, optionally with the Hadamard rotation).

Arrays in, buffers written in place. Argument names and dtypes follow vLLM's DeepSeek V4
compressor; bf16 data travels as ``uint16`` bit patterns and E4M3 data as ``uint8`` bytes.
"""

from __future__ import annotations

import numpy as np

from .indexer import quantize_fp8, quantize_mxfp4, quantized_values
from .layouts import store_bf16, store_flashmla_fp8, store_fp8_per_tensor, store_indexer_fp8, store_indexer_mxfp4
from .pooling import active_tokens, pool
from .postprocess import norm_weight_f32, quantize_nope, rms_norm, rope_bf16_bits, rope_row
from .validation import (
    STATE_CACHE_DTYPES, StoreCall, check_compress, check_contract, check_store_arrays, describe_numpy, numpy_describer,
)

F32 = np.float32

__all__ = ["compress", "compress_norm_rope_store"]


def _validated_pooling_call(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                            kv_slot_mapping, compress_ratio, ape, ape_at, ring_capacity):
    return check_compress(
        describe_numpy("state_cache", state_cache),
        describe_numpy("token_to_req_indices", token_to_req_indices),
        describe_numpy("positions", positions),
        describe_numpy("slot_mapping", slot_mapping),
        describe_numpy("block_table", block_table),
        block_size,
        describe_numpy("kv_slot_mapping", kv_slot_mapping),
        compress_ratio,
        ape=None if ape is None else describe_numpy("ape", ape),
        ape_at=ape_at,
        ring_capacity=ring_capacity,
        state_dtypes=STATE_CACHE_DTYPES,
    )


def _pooling_ape(call, ape: np.ndarray | None) -> np.ndarray | None:
    """``ape`` where pooling adds it (``ape_at = "compress"``); otherwise it is not looked at."""
    return ape if call.state_format.ape_at == "compress" else None


def validated_store(rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, state_cache, head_dim,
                    hadamard) -> StoreCall:
    """SPEC §9's checks of the post-processing inputs and ``k_cache`` of NumPy arguments."""
    return check_store_arrays(numpy_describer(layout), rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout,
                              fp8_scale, state_cache, head_dim=head_dim, hadamard=hadamard)


def compress(
    state_cache: np.ndarray,  # float32, or uint16 bf16 patterns (SPEC §13.1), [num_state_blocks, bs, 2*SW]
    token_to_req_indices: np.ndarray,  # int32 [T]: block_table row of each token
    positions: np.ndarray,  # int64 [T]
    slot_mapping: np.ndarray,  # int64 [T]: state slot, -1 = padding
    block_table: np.ndarray,  # int32 [num_reqs, max_blocks]: state blocks per request
    block_size: int,  # bs
    kv_slot_mapping: np.ndarray,  # int64 [T]: compressed-cache slot, -1 = none
    *,
    compress_ratio: int,  # 4 (C4, overlapped) or 128 (C128)
    ape: np.ndarray | None = None,  # float32 [r, SW]: needed with ape_at="compress" (SPEC §13.2)
    ape_at: str = "save",  # "save": the state's scores include ape; "compress": pooling adds it
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    debug: bool = False,
) -> np.ndarray:
    """SPEC §5 (with §13's state formats): the compressed vector ``x`` (float32 ``[T, H]``,
    H = 512 or 128); rows of inactive tokens are NaN."""
    call = _validated_pooling_call(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                   kv_slot_mapping, compress_ratio, ape, ape_at, ring_capacity)
    active = active_tokens(positions, slot_mapping, kv_slot_mapping, call.config.ratio)
    if debug:
        check_contract(call.config, active, token_to_req_indices, positions, slot_mapping, block_table, state_cache.shape[0],
                       call.block_size, kv_slot_mapping, state_format=call.state_format)
    x = np.full((call.num_tokens, call.config.head_dim), np.nan, dtype=F32)
    tokens = np.flatnonzero(active)
    x[tokens] = pool(state_cache, block_table, token_to_req_indices[tokens], positions[tokens], call.config,
                     call.block_size, state_format=call.state_format, ape=_pooling_ape(call, ape))
    return x


def compress_norm_rope_store(
    state_cache: np.ndarray,  # float32, or uint16 bf16 patterns (SPEC §13.1), [num_state_blocks, bs, 2*SW]
    token_to_req_indices: np.ndarray,  # int32 [T]
    positions: np.ndarray,  # int64 [T]
    slot_mapping: np.ndarray,  # int64 [T]
    block_table: np.ndarray,  # int32 [num_reqs, max_blocks]
    block_size: int,  # bs
    rms_norm_weight: np.ndarray,  # float32 [H] or uint16 [H] (bf16 bit patterns); H = 512 or 128
    rms_norm_eps: float,  # rounded to binary32
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]: cos[0:32] then sin[0:32]
    k_cache: np.ndarray,  # flashmla_fp8: uint8 [num_pages, B, 584]; bf16: uint16 [num_pages, B, 512]; fp8_per_tensor: uint8 [num_pages, B, 512]; indexer_fp8: uint8 [num_pages, B, 132]; indexer_mxfp4: uint8 [num_pages, B, 68]
    kv_slot_mapping: np.ndarray,  # int64 [T]
    *,
    compress_ratio: int,
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    hadamard: bool = False,  # SPEC §12's rotation; indexer layouts only
    ape: np.ndarray | None = None,  # float32 [r, SW]: needed with ape_at="compress" (SPEC §13.2)
    ape_at: str = "save",  # "save": the state's scores include ape; "compress": pooling adds it
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    debug: bool = False,
) -> None:
    """SPEC §5-§7 (§12 for the 128-wide head, §13 for the state formats): pool, normalize,
    rotate, quantize and store one entry per active token."""
    call = _validated_pooling_call(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                   kv_slot_mapping, compress_ratio, ape, ape_at, ring_capacity)
    store = validated_store(rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, state_cache,
                            call.config.head_dim, hadamard)
    active = active_tokens(positions, slot_mapping, kv_slot_mapping, call.config.ratio)
    if debug:
        check_contract(
            call.config, active, token_to_req_indices, positions, slot_mapping, block_table, state_cache.shape[0],
            call.block_size, kv_slot_mapping, num_entries=k_cache.shape[0] * store.entries_per_page,
            cos_sin_rows=cos_sin_cache.shape[0], state_format=call.state_format,
        )
    tokens = np.flatnonzero(active)
    if tokens.size == 0:
        return
    x = pool(state_cache, block_table, token_to_req_indices[tokens], positions[tokens], call.config, call.block_size,
             state_format=call.state_format, ape=_pooling_ape(call, ape))
    store_entries(x, positions[tokens], kv_slot_mapping[tokens], rms_norm_weight, cos_sin_cache, k_cache, store,
                  call.config.ratio)


def store_entries(
    x: np.ndarray,  # float32 [n, H]: the compressed vectors of the active tokens
    positions: np.ndarray,  # int64 [n]: their positions
    slots: np.ndarray,  # int64 [n]: their k_cache slots
    rms_norm_weight: np.ndarray,  # float32 or uint16 (bf16) [H]
    cos_sin_cache: np.ndarray,  # float32 [max_pos, 64]
    k_cache: np.ndarray,  # the layout's cache (see compress_norm_rope_store), written in place
    store: StoreCall,  # the validated layout, eps, fp8_scale and hadamard
    compress_ratio: int,  # r: the RoPE row is (p // r) * r
) -> None:
    """SPEC §6/§7 (§12): RMSNorm, RoPE, quantization and the store of each compressed vector."""
    y = rms_norm(x, norm_weight_f32(rms_norm_weight), store.eps)
    cos_sin = cos_sin_cache[rope_row(positions, compress_ratio)]
    if store.layout == "indexer_fp8":
        store_indexer_fp8(k_cache, slots, quantize_fp8(quantized_values(y, cos_sin, store.hadamard)))
        return
    if store.layout == "indexer_mxfp4":
        store_indexer_mxfp4(k_cache, slots, quantize_mxfp4(quantized_values(y, cos_sin, store.hadamard)))
        return
    rope_bits = rope_bf16_bits(y, cos_sin)
    if store.layout == "flashmla_fp8":
        store_flashmla_fp8(k_cache, slots, quantize_nope(y), rope_bits)
    elif store.layout == "bf16":
        store_bf16(k_cache, slots, y, rope_bits)
    else:
        store_fp8_per_tensor(k_cache, slots, y, rope_bits, store.fp8_scale)
