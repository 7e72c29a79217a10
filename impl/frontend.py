"""Torch front end shared by every implementation: SPEC §9 validation before any launch.

The checks themselves live in :mod:`dsv4_compressor.spec.validation`, so a GPU wrapper and
the NumPy spec reject the same calls with the same messages. Nothing here launches work or
synchronizes with the device, except the optional debug checks, which copy the (small)
metadata to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..spec.constants import HEAD_DIM
from ..spec.pooling import active_tokens
from ..spec.validation import (
    ArrayInfo,
    CompressCall,
    SaveCall,
    StepCall,
    StoreCall,
    check_compress,
    check_contract,
    check_save_arrays,
    check_save_contract,
    check_step,
    check_step_contract,
    check_store_arrays,
)

_TORCH_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
}


def describe_torch(name: str, tensor) -> ArrayInfo:
    """The :class:`ArrayInfo` of a torch tensor (strides in elements, device as a string)."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    return ArrayInfo(
        name=name,
        dtype=_TORCH_DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch.")),
        shape=tuple(tensor.shape),
        strides=tuple(tensor.stride()),
        itemsize=tensor.element_size(),
        address=tensor.data_ptr(),
        device=str(tensor.device),
    )


def layout_key(tensor) -> tuple:
    """What SPEC §9 looks at in a tensor: dtype, shape, strides, device, 16-byte alignment
    (a non-tensor gives its type, so validation rejects it). Plain metadata: cheap enough to
    key every call."""
    if not isinstance(tensor, torch.Tensor):
        return (type(tensor),)
    return (tensor.dtype, tensor.shape, tensor.stride(), tensor.device, tensor.data_ptr() & 15)


def token_key(tensor) -> tuple:
    """The same for a per-token array or the block table (SPEC §9 checks no base alignment there)."""
    if not isinstance(tensor, torch.Tensor):
        return (type(tensor),)
    return (tensor.dtype, tensor.shape, tensor.stride(), tensor.device)


def _describe_optional(name: str, tensor) -> ArrayInfo | None:
    """:func:`describe_torch`, or None for a missing optional argument (``ape`` where it is not needed)."""
    return None if tensor is None else describe_torch(name, tensor)


def validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, *, debug: bool = False,
                                 head_dims: tuple[int, ...] = (HEAD_DIM,), ape_at="save", ring_capacity=None,
                                 state_dtypes: tuple[str, ...] = ("float32",)) -> SaveCall:
    """SPEC §9 checks of ``save_partial_states``' torch arguments (plus the debug checks).

    ``head_dims``: the head widths the implementation supports (512; 128 for SPEC §12's indexer);
    ``state_dtypes``: the state dtypes its kernels write (``"float32"``; ``"bfloat16"``, SPEC
    §13.1); ``ape_at`` and ``ring_capacity``: SPEC §13.2/§13.3 (``ape`` may be None with
    ``ape_at = "compress"``). Not cached: the implementations keep a plan per argument layout,
    so they validate a layout once.
    """
    call = check_save_arrays(describe_torch, kv_score, ape, positions, slot_mapping, state_cache, block_size,
                             head_dims=head_dims, ape_at=ape_at, ring_capacity=ring_capacity, state_dtypes=state_dtypes)
    if debug:
        check_save_contract(positions.cpu().numpy(), slot_mapping.cpu().numpy(), state_cache.shape[0], call.block_size)
    return call


@dataclass(frozen=True)
class CompressStoreCall:
    """A validated ``compress_norm_rope_store`` call."""

    pooling: CompressCall
    store: StoreCall


def validate_compress_norm_rope_store(
    state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
    rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, *, compress_ratio, layout, fp8_scale, debug: bool = False,
    hadamard=False, head_dims: tuple[int, ...] = (HEAD_DIM,), ape=None, ape_at="save", ring_capacity=None,
    state_dtypes: tuple[str, ...] = ("float32",),
) -> CompressStoreCall:
    """SPEC §9 checks of ``compress_norm_rope_store``' torch arguments (plus the debug checks).

    ``head_dims``: the head widths the implementation supports (512; 128 for SPEC §12's indexer,
    whose layouts take ``hadamard``); ``state_dtypes``: the state dtypes its kernels read; ``ape``,
    ``ape_at``, ``ring_capacity``: SPEC §13.2/§13.3. Not cached: the implementations keep a plan
    per argument layout (the checks depend only on each tensor's dtype, shape, strides, device and
    base alignment and on the scalars), so they validate a layout once.
    """
    pooling = check_compress(
        describe_torch("state_cache", state_cache),
        describe_torch("token_to_req_indices", token_to_req_indices),
        describe_torch("positions", positions),
        describe_torch("slot_mapping", slot_mapping),
        describe_torch("block_table", block_table),
        block_size,
        describe_torch("kv_slot_mapping", kv_slot_mapping),
        compress_ratio,
        head_dims=head_dims,
        ape=_describe_optional("ape", ape),
        ape_at=ape_at,
        ring_capacity=ring_capacity,
        state_dtypes=state_dtypes,
    )
    store = check_store_arrays(describe_torch, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale,
                               state_cache, head_dim=pooling.config.head_dim, hadamard=hadamard)
    if debug:
        positions_h, slots_h, kv_slots_h = (t.cpu().numpy() for t in (positions, slot_mapping, kv_slot_mapping))
        check_contract(
            pooling.config, active_tokens(positions_h, slots_h, kv_slots_h, pooling.config.ratio),
            token_to_req_indices.cpu().numpy(), positions_h, slots_h, block_table.cpu().numpy(),
            state_cache.shape[0], pooling.block_size, kv_slots_h,
            num_entries=k_cache.shape[0] * store.entries_per_page, cos_sin_rows=cos_sin_cache.shape[0],
            state_format=pooling.state_format,
        )
    return CompressStoreCall(pooling=pooling, store=store)


@dataclass(frozen=True)
class StepStoreCall:
    """A validated ``compress_and_save`` call (SPEC §13.4): its pooling, store and step checks."""

    pooling: CompressCall
    store: StoreCall
    step: StepCall


def validate_compress_and_save(
    kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs,
    state_cache, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, *, compress_ratio, layout,
    fp8_scale, ape_at, ring_capacity, hadamard, debug: bool = False, head_dims: tuple[int, ...] = (HEAD_DIM,),
    state_dtypes: tuple[str, ...] = ("float32",),
) -> StepStoreCall:
    """SPEC §9/§13.4 checks of ``compress_and_save``' torch arguments, in ``spec.step``'s order (the
    pooling inputs, then ``kv``, ``score``, ``ape``, ``query_start_loc`` and ``save_slot_mapping``,
    then the store), plus the debug checks (the step's contract, the window rows before each chunk,
    the saved slots). ``head_dims``, ``state_dtypes``: what the implementation supports."""
    pooling = check_compress(
        describe_torch("state_cache", state_cache), describe_torch("token_to_req", token_to_req),
        describe_torch("positions", positions), describe_torch("slot_mapping", slot_mapping),
        describe_torch("block_table", block_table), bs, describe_torch("kv_slot_mapping", kv_slot_mapping),
        compress_ratio, head_dims=head_dims, ape=_describe_optional("ape", ape), ape_at=ape_at,
        ring_capacity=ring_capacity, state_dtypes=state_dtypes,
    )
    step = check_step(describe_torch("kv", kv), describe_torch("score", score), _describe_optional("ape", ape),
                      describe_torch("query_start_loc", query_start_loc),
                      describe_torch("save_slot_mapping", save_slot_mapping), describe_torch("block_table", block_table),
                      pooling.config, pooling.num_tokens)
    store = check_store_arrays(describe_torch, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale,
                               state_cache, head_dim=pooling.config.head_dim, hadamard=hadamard)
    if debug:
        host = {name: t.cpu().numpy() for name, t in (
            ("query_start_loc", query_start_loc), ("token_to_req", token_to_req), ("positions", positions),
            ("slot_mapping", slot_mapping), ("save_slot_mapping", save_slot_mapping),
            ("kv_slot_mapping", kv_slot_mapping), ("block_table", block_table))}
        check_step_contract(host["query_start_loc"], host["token_to_req"], host["positions"], host["slot_mapping"],
                            host["save_slot_mapping"], host["kv_slot_mapping"])
        check_contract(
            pooling.config,
            active_tokens(host["positions"], host["slot_mapping"], host["kv_slot_mapping"], pooling.config.ratio),
            host["token_to_req"], host["positions"], host["slot_mapping"], host["block_table"], state_cache.shape[0],
            pooling.block_size, host["kv_slot_mapping"], num_entries=k_cache.shape[0] * store.entries_per_page,
            cos_sin_rows=cos_sin_cache.shape[0], state_format=pooling.state_format,
            query_start_loc=host["query_start_loc"],
        )
        check_save_contract(host["positions"], host["save_slot_mapping"], state_cache.shape[0], pooling.block_size)
    return StepStoreCall(pooling=pooling, store=store, step=step)


def flashmla_page_view(k_cache: torch.Tensor) -> torch.Tensor:
    """A ``uint8 [num_pages, page_stride]`` view of a paged cache's pages (same memory):
    ``flashmla_fp8`` (E = 584) or the indexer layouts (E = 132, 68).

    Kernels address ``page * page_stride + byte``; only bytes below ``B*E`` are written.
    The last page's view is cut at ``B*E`` so the view never reaches past the buffer.
    """
    num_pages, entries, entry_bytes = k_cache.shape
    page_stride = k_cache.stride(0) if num_pages > 1 else entries * entry_bytes
    return torch.as_strided(k_cache, (num_pages, entries * entry_bytes), (page_stride, 1))


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor; bf16 as uint16 patterns and e4m3 as uint8 bytes."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
        return tensor.numpy().view(np.uint16)
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()
