"""SPEC §9: argument validation, shared by the NumPy spec and every torch front end.

The checks work on :class:`ArrayInfo` descriptions (dtype name, shape, strides in elements,
address, device), so the spec and the GPU wrappers reject exactly the same calls with
exactly the same messages, before anything is written. Every error is a ``ValueError``
whose text names the argument, what was expected and what was given.

SPEC §13's options (a bf16 state, ``ape_at``, ``ring_capacity``, and ``compress_and_save``'s
inputs) are checked here too; a validated call carries its
:class:`.state_format.StateFormat`. A caller names the state dtypes it supports
(``state_dtypes``): the spec and the Triton kernels take float32 and bf16, the CuTe DSL kernels
float32 only, so a front end that passes nothing refuses a bf16 state.

The debug checks (:func:`check_contract`) look at *values*: block-table entries and slots
against the buffers. SPEC §9 leaves them to the caller; they cost a host pass over the
metadata and are off unless asked for.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .constants import HEAD_DIM, HEAD_DIMS, ROPE_DIM, RatioConfig, SUPPORTED_RATIOS, ratio_config
from .entry_layout import ENTRY_LAYOUTS, PAGE_STRIDE_MULTIPLE, RECORD_LAYOUTS, EntryLayout, layouts_for_head
from .state_format import APE_AT, PAGED_FP32, StateFormat

ALL_LAYOUTS = tuple(ENTRY_LAYOUTS)
STATE_ALIGN_BYTES = 16
STATE_STRIDE_MULTIPLE = 4  # elements (16 bytes) of an fp32 state; 8 of a bf16 state (SPEC §13.1)
STATE_CACHE_DTYPES = ("float32", "bfloat16")  # SPEC §13.1; front ends pass the dtypes their kernels read
_STATE_FORMAT_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


@dataclass(frozen=True)
class ArrayInfo:
    """What validation needs to know about one array argument."""

    name: str  # the argument's name in the public API
    dtype: str  # "float32", "int32", "int64", "uint8", "bfloat16", "float8_e4m3fn", ...
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    itemsize: int  # bytes per element
    address: int  # address of element [0, ..., 0]
    device: str = "cpu"


_NUMPY_DTYPE_NAMES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.uint16): "bfloat16",  # the spec's bf16 containers are uint16 bit patterns
}


def describe_numpy(name: str, array, *, uint8_as: str = "uint8") -> ArrayInfo:
    """Describe a NumPy array; ``uint16`` counts as bf16 and ``uint8`` as ``uint8_as``."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name}: expected a numpy.ndarray, got {type(array).__name__}")
    dtype = _NUMPY_DTYPE_NAMES.get(array.dtype, str(array.dtype))
    if array.dtype not in _NUMPY_DTYPE_NAMES and dtype in _NUMPY_DTYPE_NAMES.values():
        # a foreign dtype that bears one of our names: ml_dtypes' "bfloat16" is not a uint16 container
        dtype = f"{array.dtype.type.__module__}.{dtype} (the spec takes bf16 as uint16 bit patterns)"
    if dtype == "uint8":
        dtype = uint8_as
    itemsize = array.dtype.itemsize
    if any(s % itemsize for s in array.strides):
        raise ValueError(f"{name}: expected strides that are whole elements, got {array.strides} bytes")
    return ArrayInfo(
        name=name,
        dtype=dtype,
        shape=tuple(array.shape),
        strides=tuple(s // itemsize for s in array.strides),
        itemsize=itemsize,
        address=array.__array_interface__["data"][0],
    )


def numpy_describer(layout=None):
    """:func:`describe_numpy` as ``describe(name, array)`` for a call that stores ``layout``: NumPy
    holds an ``fp8_per_tensor`` cache's E4M3 values as uint8 bytes, so ``k_cache`` is described
    as ``float8_e4m3fn`` there."""
    k_cache_uint8_as = "float8_e4m3fn" if layout == "fp8_per_tensor" else "uint8"
    return lambda name, array: describe_numpy(name, array, uint8_as=k_cache_uint8_as if name == "k_cache" else "uint8")


# ---- elementary checks ------------------------------------------------------------------
def _fail(name: str, expected: str, given) -> None:
    raise ValueError(f"{name}: expected {expected}, got {given}")


def _dtype(info: ArrayInfo, *allowed: str) -> None:
    if info.dtype not in allowed:
        _fail(info.name, "dtype " + " or ".join(allowed), info.dtype)


def _rank(info: ArrayInfo, rank: int, shape_doc: str) -> None:
    if len(info.shape) != rank:
        _fail(info.name, f"{rank} dimensions {shape_doc}", f"shape {list(info.shape)}")


def _dim(info: ArrayInfo, axis: int, size: int, what: str) -> None:
    if info.shape[axis] != size:
        _fail(info.name, f"shape[{axis}] = {size} ({what})", f"shape {list(info.shape)}")


def _unit_last_stride(info: ArrayInfo) -> None:
    if info.shape and info.shape[-1] > 1 and info.strides[-1] != 1:
        _fail(info.name, "last stride 1 (contiguous rows)", f"strides {list(info.strides)}")
    if any(s < 0 for s in info.strides):
        _fail(info.name, "non-negative strides", f"strides {list(info.strides)}")


def _aligned(info: ArrayInfo, alignment: int) -> None:
    if info.address % alignment:
        _fail(info.name, f"a {alignment}-byte aligned base address", f"address 0x{info.address:x}")


def _no_self_overlap(info: ArrayInfo) -> None:
    """Distinct indices must address distinct elements (the array is written in place)."""
    dims = sorted((s, n) for s, n in zip(info.strides, info.shape) if n > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            _fail(info.name, "strides under which no two elements overlap", f"strides {list(info.strides)} for shape {list(info.shape)}")
        extent = stride * (size - 1) + extent


def _same_device(*infos: ArrayInfo) -> None:
    first = infos[0]
    for info in infos[1:]:
        if info.device != first.device:
            _fail(info.name, f"a tensor on {first.device} (like {first.name})", f"a tensor on {info.device}")


def _int_arg(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(name, "an integer", repr(value))
    if value < minimum:
        _fail(name, f"an integer >= {minimum}", value)
    return int(value)


def _positions(positions: ArrayInfo) -> int:
    """``positions``: int64 ``[T]``, unit last stride; returns ``T``."""
    _dtype(positions, "int64")
    _rank(positions, 1, "[T]")
    _unit_last_stride(positions)
    return positions.shape[0]


def _per_token(info: ArrayInfo, dtype: str, num_tokens: int, reference: str) -> None:
    _dtype(info, dtype)
    _rank(info, 1, "[T]")
    if info.shape[0] != num_tokens:
        _fail(info.name, f"length T = {num_tokens} (the length of {reference})", info.shape[0])
    _unit_last_stride(info)


def _state_cache(info: ArrayInfo, config: RatioConfig, block_size: int, state_dtypes: tuple[str, ...]) -> None:
    _dtype(info, *state_dtypes)
    _rank(info, 3, "[num_state_blocks, block_size, 2*SW]")
    width = config.state_row_width
    if info.shape[2] != width:
        _fail(info.name, f"shape[2] = 2*SW = {width} for compress_ratio {config.ratio} (overlap {config.overlap})", f"shape {list(info.shape)}")
    _dim(info, 1, block_size, "block_size")
    _unit_last_stride(info)
    s0, s1 = info.strides[0], info.strides[1]
    multiple = STATE_ALIGN_BYTES // info.itemsize  # 4 fp32 or 8 bf16 elements
    if (info.shape[0] > 1 and s0 % multiple) or (block_size > 1 and s1 % multiple):
        _fail(info.name, f"strides[0] and strides[1] multiples of {multiple} elements (16 bytes)", f"strides {list(info.strides)}")
    if (block_size > 1 and s1 < width) or (info.shape[0] > 1 and s0 < block_size * max(s1, width)):
        _fail(info.name, f"non-overlapping rows (strides[1] >= {width}, strides[0] >= block_size*strides[1])", f"strides {list(info.strides)}")
    _aligned(info, STATE_ALIGN_BYTES)


def _config_from_width(info: ArrayInfo, axis: int, compress_ratio: int, factor: int, what: str, head_dims) -> RatioConfig:
    """The ratio configuration whose ``factor * SW`` is ``info.shape[axis]``: the head width
    (512, or 128 for the indexer) follows from a state width and the ratio (SPEC §12)."""
    configs = [ratio_config(compress_ratio, head) for head in head_dims]
    for config in configs:
        if info.shape[axis] == factor * config.state_width:
            return config
    expected = " or ".join(f"{factor * c.state_width} (head width {c.head_dim})" for c in configs)
    _fail(info.name, f"shape[{axis}] = {what} = {expected} for compress_ratio {compress_ratio} (overlap {configs[0].overlap})",
          f"shape {list(info.shape)}")


# ---- SPEC §13: the state options ----------------------------------------------------------------
def _ape_at(ape_at) -> str:
    if not isinstance(ape_at, str) or ape_at not in APE_AT:
        _fail("ape_at", " or ".join(repr(x) for x in APE_AT), repr(ape_at))
    return ape_at


def _ape(ape: ArrayInfo | None, config: RatioConfig, why: str) -> None:
    """``ape`` is fp32 ``[r, SW]`` with a unit last stride; ``why`` says what needs it."""
    expected = f"[{config.ratio}, {config.state_width}] ([compress_ratio, SW])"
    if ape is None:
        _fail("ape", f"a float32 {expected} array ({why})", None)
    _dtype(ape, "float32")
    _rank(ape, 2, "[compress_ratio, SW]")
    if tuple(ape.shape) != (config.ratio, config.state_width):
        _fail(ape.name, f"shape {expected}", f"shape {list(ape.shape)}")
    _unit_last_stride(ape)


def _ring_capacity(ring_capacity, config: RatioConfig, block_size: int) -> int | None:
    """``None`` (paged) or ``C``: a positive multiple of ``block_size``, at least ``W`` (SPEC §13.3)."""
    if ring_capacity is None:
        return None
    if (isinstance(ring_capacity, bool) or not isinstance(ring_capacity, numbers.Integral)
            or ring_capacity < config.window or ring_capacity % block_size):
        _fail("ring_capacity", f"None or a positive multiple of block_size {block_size} that is at least W = {config.window}",
              repr(ring_capacity))
    return int(ring_capacity)


def _ring_blocks(block_table: ArrayInfo, ring_capacity: int | None, block_size: int) -> None:
    """A ring lives in the first ``C / bs`` blocks of each block-table row."""
    if ring_capacity is not None and block_table.shape[1] < ring_capacity // block_size:
        _fail(block_table.name, f"shape[1] >= ring_capacity / block_size = {ring_capacity // block_size} blocks (the ring)",
              f"shape {list(block_table.shape)}")


def _state_format(state_cache: ArrayInfo, ape_at: str, ring_capacity: int | None) -> StateFormat:
    return StateFormat(_STATE_FORMAT_DTYPES[state_cache.dtype], ape_at, ring_capacity)


# ---- per-operation checks --------------------------------------------------------------
@dataclass(frozen=True)
class SaveCall:
    """What a validated ``save_partial_states`` call needs; a validated pooling call
    (:data:`CompressCall`) needs the same."""

    config: RatioConfig
    num_tokens: int
    block_size: int
    state_format: StateFormat = PAGED_FP32


CompressCall = SaveCall  # what a validated pooling call needs


def _config_from_row_width(info: ArrayInfo, head_dims) -> RatioConfig:
    """The ratio and head width whose ``2*SW`` is ``info.shape[1]`` (the four widths differ)."""
    configs = [ratio_config(r, head) for head in head_dims for r in SUPPORTED_RATIOS]
    for config in configs:
        if info.shape[1] == config.state_row_width:
            return config
    expected = " or ".join(f"{c.state_row_width} (compress_ratio {c.ratio}, head width {c.head_dim})" for c in configs)
    _fail(info.name, f"shape[1] = 2*SW = {expected}", f"shape {list(info.shape)}")


def check_save_partial_states(
    kv_score: ArrayInfo, ape: ArrayInfo | None, positions: ArrayInfo, slot_mapping: ArrayInfo,
    state_cache: ArrayInfo, block_size, *, head_dims: tuple[int, ...] = HEAD_DIMS, ape_at="save",
    ring_capacity=None, state_dtypes: tuple[str, ...] = ("float32",),
) -> SaveCall:
    """SPEC §4/§9/§13 checks of ``save_partial_states``; the ratio is ``ape.shape[0]`` and the head
    width follows from ``ape.shape[1] = SW`` (one of ``head_dims``, the widths the caller supports).
    With ``ape_at = "compress"`` ``ape`` is not used (it may be ``None``) and both follow from
    ``kv_score.shape[1] = 2*SW``. ``state_dtypes``: the state dtypes the caller supports."""
    ape_at = _ape_at(ape_at)
    if ape_at == "save":
        if ape is None:
            _fail("ape", "a float32 [compress_ratio, SW] array (ape_at 'save' adds it in the save)", None)
        _dtype(ape, "float32")
        _rank(ape, 2, "[compress_ratio, SW]")
        if ape.shape[0] not in SUPPORTED_RATIOS:
            _fail(ape.name, f"shape[0] = compress_ratio in {SUPPORTED_RATIOS}", f"shape {list(ape.shape)}")
        config = _config_from_width(ape, 1, ape.shape[0], 1, "SW", head_dims)
        _unit_last_stride(ape)
    block_size = _int_arg("block_size", block_size, 1)
    num_tokens = _positions(positions)
    _per_token(slot_mapping, "int64", num_tokens, positions.name)
    _dtype(kv_score, "float32")
    _rank(kv_score, 2, "[T, 2*SW]")
    if kv_score.shape[0] != num_tokens:
        _fail(kv_score.name, f"shape[0] = T = {num_tokens} (the length of {positions.name})", f"shape {list(kv_score.shape)}")
    if ape_at == "compress":
        config = _config_from_row_width(kv_score, head_dims)
    _dim(kv_score, 1, config.state_row_width, f"2*SW for compress_ratio {config.ratio}")
    _unit_last_stride(kv_score)
    _state_cache(state_cache, config, block_size, state_dtypes)
    ring_capacity = _ring_capacity(ring_capacity, config, block_size)
    _same_device(state_cache, kv_score, *([ape] if ape_at == "save" else []), positions, slot_mapping)
    return SaveCall(config=config, num_tokens=num_tokens, block_size=block_size,
                    state_format=_state_format(state_cache, ape_at, ring_capacity))


def check_save_arrays(describe, kv_score, ape, positions, slot_mapping, state_cache, block_size, *,
                      head_dims: tuple[int, ...] = HEAD_DIMS, ape_at="save", ring_capacity=None,
                      state_dtypes: tuple[str, ...] = ("float32",)) -> SaveCall:
    """:func:`check_save_partial_states` of the call's arrays themselves, each described by
    ``describe(name, array)`` (:func:`describe_numpy`, or a front end's for its tensors); ``ape``
    may be None (with ``ape_at = "compress"``)."""
    return check_save_partial_states(
        describe("kv_score", kv_score), None if ape is None else describe("ape", ape), describe("positions", positions),
        describe("slot_mapping", slot_mapping), describe("state_cache", state_cache), block_size, head_dims=head_dims,
        ape_at=ape_at, ring_capacity=ring_capacity, state_dtypes=state_dtypes)


def check_compress(
    state_cache: ArrayInfo, token_to_req_indices: ArrayInfo, positions: ArrayInfo, slot_mapping: ArrayInfo,
    block_table: ArrayInfo, block_size, kv_slot_mapping: ArrayInfo, compress_ratio, *,
    head_dims: tuple[int, ...] = HEAD_DIMS, ape: ArrayInfo | None = None, ape_at="save", ring_capacity=None,
    state_dtypes: tuple[str, ...] = ("float32",),
) -> CompressCall:
    """SPEC §3/§9/§13 checks of the pooling inputs; the head width follows from
    ``state_cache.shape[2] = 2*SW`` (one of ``head_dims``, the widths the caller supports).
    ``ape`` is needed (fp32 ``[r, SW]``) with ``ape_at = "compress"`` and not looked at otherwise;
    ``state_dtypes``: the state dtypes the caller supports."""
    if isinstance(compress_ratio, bool) or compress_ratio not in SUPPORTED_RATIOS:
        _fail("compress_ratio", f"one of {SUPPORTED_RATIOS}", repr(compress_ratio))
    _dtype(state_cache, *state_dtypes)
    _rank(state_cache, 3, "[num_state_blocks, block_size, 2*SW]")
    config = _config_from_width(state_cache, 2, int(compress_ratio), 2, "2*SW", head_dims)
    block_size = _int_arg("block_size", block_size, 1)
    num_tokens = _positions(positions)
    _per_token(token_to_req_indices, "int32", num_tokens, positions.name)
    _per_token(slot_mapping, "int64", num_tokens, positions.name)
    _per_token(kv_slot_mapping, "int64", num_tokens, positions.name)
    _dtype(block_table, "int32")
    _rank(block_table, 2, "[num_reqs, max_blocks]")
    _unit_last_stride(block_table)
    _state_cache(state_cache, config, block_size, state_dtypes)
    ape_at = _ape_at(ape_at)
    if ape_at == "compress":
        _ape(ape, config, "ape_at 'compress' adds it in the compress")
    ring_capacity = _ring_capacity(ring_capacity, config, block_size)
    _ring_blocks(block_table, ring_capacity, block_size)
    _same_device(state_cache, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                 *([ape] if ape_at == "compress" else []))
    return CompressCall(config=config, num_tokens=num_tokens, block_size=block_size,
                        state_format=_state_format(state_cache, ape_at, ring_capacity))


@dataclass(frozen=True)
class StepCall:
    """What a validated ``compress_and_save`` call adds to its pooling and store checks (SPEC §13.4)."""

    num_reqs: int  # query_start_loc.shape[0] - 1


def _projection(info: ArrayInfo, config: RatioConfig, num_tokens: int) -> None:
    """``kv`` or ``score``: fp32 ``[T, SW]``, unit last stride, 16-byte aligned rows."""
    _dtype(info, "float32")
    _rank(info, 2, "[T, SW]")
    if tuple(info.shape) != (num_tokens, config.state_width):
        _fail(info.name, f"shape [{num_tokens}, {config.state_width}] ([T, SW] for compress_ratio {config.ratio})",
              f"shape {list(info.shape)}")
    _unit_last_stride(info)
    if num_tokens > 1 and (info.strides[0] * info.itemsize) % STATE_ALIGN_BYTES:
        _fail(info.name, f"a row stride (strides[0]) that is a multiple of {STATE_ALIGN_BYTES // info.itemsize} elements (16-byte aligned rows)",
              f"strides {list(info.strides)}")
    _aligned(info, STATE_ALIGN_BYTES)


def check_step(
    kv: ArrayInfo, score: ArrayInfo, ape: ArrayInfo | None, query_start_loc: ArrayInfo, save_slot_mapping: ArrayInfo,
    block_table: ArrayInfo, config: RatioConfig, num_tokens: int,
) -> StepCall:
    """SPEC §9/§13.4 checks of what ``compress_and_save`` takes beyond the pooling and store
    arguments (``check_compress`` and ``check_store`` run first): ``kv``, ``score``, ``ape``
    (needed with either ``ape_at``), ``query_start_loc`` and ``save_slot_mapping``."""
    _projection(kv, config, num_tokens)
    _projection(score, config, num_tokens)
    _ape(ape, config, "compress_and_save adds it to this call's scores")
    num_reqs = check_query_start_loc(query_start_loc, block_table)
    _per_token(save_slot_mapping, "int64", num_tokens, "positions")
    _same_device(block_table, kv, score, ape, query_start_loc, save_slot_mapping)
    return StepCall(num_reqs=num_reqs)


def check_query_start_loc(query_start_loc: ArrayInfo, block_table: ArrayInfo) -> int:
    """SPEC §13.4's ``query_start_loc``: int32 ``[num_reqs + 1]`` with ``num_reqs`` at most the
    block table's rows; returns ``num_reqs``."""
    _dtype(query_start_loc, "int32")
    _rank(query_start_loc, 1, "[num_reqs + 1]")
    _unit_last_stride(query_start_loc)
    num_reqs = query_start_loc.shape[0] - 1
    if num_reqs < 0 or num_reqs > block_table.shape[0]:
        _fail(query_start_loc.name, f"length num_reqs + 1 with 0 <= num_reqs <= block_table.shape[0] = {block_table.shape[0]}",
              query_start_loc.shape[0])
    return num_reqs


@dataclass(frozen=True)
class StoreCall:
    """What a validated store needs."""

    layout: str
    entries_per_page: int  # B
    page_stride: int  # in elements of k_cache (bytes for flashmla_fp8 and the indexer layouts)
    eps: np.float32
    fp8_scale: np.float32 | None
    head_dim: int = HEAD_DIM  # 512, or 128 for the indexer layouts
    hadamard: bool = False  # SPEC §12's rotation (indexer layouts only)


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(name, "a real number", repr(value))
    return float(value)


def _layout(layout, head_dim: int) -> None:
    """``layout`` is a known layout and matches the head width (SPEC §9, §12)."""
    if not isinstance(layout, str) or layout not in ALL_LAYOUTS:
        _fail("layout", "one of " + ", ".join(repr(x) for x in ALL_LAYOUTS), repr(layout))
    if ENTRY_LAYOUTS[layout].head_dim != head_dim:
        expected = ", ".join(repr(x) for x in layouts_for_head(head_dim))
        _fail("layout", f"one of {expected} for head width {head_dim} (from the state width)", repr(layout))


def check_hadamard(hadamard, layout: str) -> bool:
    """``hadamard`` is a bool, and True only for the indexer layouts (SPEC §12)."""
    if not isinstance(hadamard, (bool, np.bool_)):
        _fail("hadamard", "True or False", repr(hadamard))
    entry = ENTRY_LAYOUTS.get(layout)
    if hadamard and (entry is None or not entry.hadamard):
        rotating = ", ".join(repr(name) for name, entry in ENTRY_LAYOUTS.items() if entry.hadamard)
        _fail("hadamard", f"False for layout {layout!r} (the rotation belongs to the indexer layouts {rotating})",
              repr(hadamard))
    return bool(hadamard)


def _paged_cache(k_cache: ArrayInfo, layout: EntryLayout) -> int:
    """SPEC §7/§12/§14.5 checks of a ``k_cache`` of ``E``-byte records (data and scales, split or
    interleaved): uint8 ``[num_pages, B, E]``, entry stride ``E``, unit last stride, a page
    stride ``>= B*E`` and a multiple of 16 when there is more than one page; returns B."""
    entry = layout.entry_bytes
    _dtype(k_cache, layout.element)
    _rank(k_cache, 3, f"[num_pages, B, {entry}]")
    _dim(k_cache, 2, entry, "bytes per FlashMLA entry" if layout.name == "flashmla_fp8" else f"bytes per {layout.name} entry")
    entries = k_cache.shape[1]
    if entries < 1:
        _fail(k_cache.name, "shape[1] = B >= 1 entries per page", f"shape {list(k_cache.shape)}")
    if k_cache.strides[2] != 1 or (entries > 1 and k_cache.strides[1] != entry):
        _fail(k_cache.name, f"strides (page_stride, {entry}, 1): a page is B*{entry} contiguous bytes", f"strides {list(k_cache.strides)}")
    page_stride = k_cache.strides[0]
    if k_cache.shape[0] > 1 and (page_stride % PAGE_STRIDE_MULTIPLE or page_stride < entries * entry):
        _fail(k_cache.name, f"a page stride (strides[0]) >= B*{entry} = {entries * entry} bytes and a multiple of {PAGE_STRIDE_MULTIPLE}", f"{page_stride}")
    _aligned(k_cache, PAGE_STRIDE_MULTIPLE)
    return entries


def _norm_weight(rms_norm_weight: ArrayInfo, head_dim: int) -> None:
    _dtype(rms_norm_weight, "bfloat16", "float32")
    _rank(rms_norm_weight, 1, f"[{head_dim}]")
    _dim(rms_norm_weight, 0, head_dim, "head width H" if head_dim == HEAD_DIM else "the indexer's head width")
    _unit_last_stride(rms_norm_weight)


def _eps(rms_norm_eps) -> np.float32:
    eps = np.float32(_real("rms_norm_eps", rms_norm_eps))
    if not (math.isfinite(eps) and eps > 0):
        _fail("rms_norm_eps", "a finite value > 0 after rounding to binary32", repr(rms_norm_eps))
    return eps


def _cos_sin_cache(cos_sin_cache: ArrayInfo) -> None:
    _dtype(cos_sin_cache, "float32")
    _rank(cos_sin_cache, 2, f"[max_pos, {ROPE_DIM}]")
    _dim(cos_sin_cache, 1, ROPE_DIM, "cos[0:32] then sin[0:32]")
    _unit_last_stride(cos_sin_cache)


def _k_cache(k_cache: ArrayInfo, layout: str) -> int:
    """The destination cache of a known ``layout`` (SPEC §7, §12, §14.5); returns B."""
    if layout in RECORD_LAYOUTS:
        return _paged_cache(k_cache, RECORD_LAYOUTS[layout])
    entry = ENTRY_LAYOUTS[layout]
    _dtype(k_cache, entry.element)
    _rank(k_cache, 3, f"[num_pages, B, {entry.entry_elements}]")
    _dim(k_cache, 2, entry.entry_elements, "head width H")
    entries = k_cache.shape[1]
    if entries < 1:
        _fail(k_cache.name, "shape[1] = B >= 1 entries per page", f"shape {list(k_cache.shape)}")
    _unit_last_stride(k_cache)
    _no_self_overlap(k_cache)
    return entries


def _fp8_scale(fp8_scale, layout: str) -> np.float32 | None:
    """The per-tensor scale: required (finite, > 0 in binary32) for ``fp8_per_tensor``, else None."""
    if ENTRY_LAYOUTS.get(layout) is not None and ENTRY_LAYOUTS[layout].per_tensor_scale:
        if fp8_scale is None:
            _fail("fp8_scale", "a positive finite scale for layout 'fp8_per_tensor'", None)
        scale = np.float32(_real("fp8_scale", fp8_scale))
        if not (math.isfinite(scale) and scale > 0):
            _fail("fp8_scale", "a finite value > 0 after rounding to binary32", repr(fp8_scale))
        return scale
    if fp8_scale is not None:
        _fail("fp8_scale", f"None for layout {layout!r} (only 'fp8_per_tensor' takes a scale)", repr(fp8_scale))
    return None


def check_store(
    rms_norm_weight: ArrayInfo, rms_norm_eps, cos_sin_cache: ArrayInfo, k_cache: ArrayInfo,
    layout, fp8_scale, reference: ArrayInfo, *, head_dim: int = HEAD_DIM, hadamard=False,
) -> StoreCall:
    """SPEC §6/§7/§9/§12 checks of the post-processing inputs and the destination cache.

    ``head_dim`` is the head width the pooling checks found (512, or 128 for the indexer).
    """
    _layout(layout, head_dim)
    hadamard = check_hadamard(hadamard, layout)
    _norm_weight(rms_norm_weight, head_dim)
    eps = _eps(rms_norm_eps)
    _cos_sin_cache(cos_sin_cache)
    entries = _k_cache(k_cache, layout)
    scale = _fp8_scale(fp8_scale, layout)
    _same_device(reference, rms_norm_weight, cos_sin_cache, k_cache)
    return StoreCall(layout=layout, entries_per_page=entries, page_stride=k_cache.strides[0], eps=eps, fp8_scale=scale,
                     head_dim=head_dim, hadamard=hadamard)


def check_store_arrays(describe, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, state_cache,
                       *, head_dim: int = HEAD_DIM, hadamard=False) -> StoreCall:
    """:func:`check_store` of the call's arrays themselves, each described by ``describe(name,
    array)`` (:func:`numpy_describer`'s, or a front end's for its tensors); ``state_cache`` is the
    reference of the device check."""
    return check_store(describe("rms_norm_weight", rms_norm_weight), rms_norm_eps, describe("cos_sin_cache", cos_sin_cache),
                       describe("k_cache", k_cache), layout, fp8_scale, describe("state_cache", state_cache),
                       head_dim=head_dim, hadamard=hadamard)


# ---- debug: values against buffers -------------------------------------------------------
def _contract(message: str) -> None:
    raise ValueError(f"debug check: {message}")


def check_save_contract(positions: np.ndarray, slot_mapping: np.ndarray, num_state_blocks: int, block_size: int) -> None:
    """Saved tokens: positions >= 0, slots inside the state cache, no slot saved twice."""
    saved = np.flatnonzero(slot_mapping >= 0)
    num_slots = num_state_blocks * block_size
    for t in saved:
        if positions[t] < 0:
            _contract(f"positions[{t}] = {positions[t]} is negative for a token with slot_mapping[{t}] = {slot_mapping[t]}")
        if slot_mapping[t] >= num_slots:
            _contract(f"slot_mapping[{t}] = {slot_mapping[t]} is outside the state cache ({num_slots} slots)")
    values, counts = np.unique(slot_mapping[saved], return_counts=True)
    if np.any(counts > 1):
        _contract(f"state slot {values[counts > 1][0]} is written by more than one token")


def check_contract(
    config: RatioConfig, active: np.ndarray, token_to_req_indices: np.ndarray, positions: np.ndarray,
    slot_mapping: np.ndarray, block_table: np.ndarray, num_state_blocks: int, block_size: int,
    kv_slot_mapping: np.ndarray, num_entries: int | None = None, cos_sin_rows: int | None = None, *,
    state_format: StateFormat = PAGED_FP32, query_start_loc: np.ndarray | None = None,
) -> None:
    """Active tokens: request rows, every window row's block-table entry (paged or in the ring;
    with ``query_start_loc``, SPEC §13.4, only the rows before the request's chunk), entry
    slots, RoPE rows."""
    num_reqs, max_blocks = block_table.shape
    for t in np.flatnonzero(slot_mapping >= 0):
        if positions[t] < 0:
            _contract(f"positions[{t}] = {positions[t]} is negative for a token with slot_mapping[{t}] = {slot_mapping[t]}")
        if slot_mapping[t] >= num_state_blocks * block_size:
            _contract(f"slot_mapping[{t}] = {slot_mapping[t]} is outside the state cache ({num_state_blocks * block_size} slots)")
    for t in np.flatnonzero(active):
        q = int(token_to_req_indices[t])
        if not 0 <= q < num_reqs:
            _contract(f"token_to_req_indices[{t}] = {q} is outside block_table's {num_reqs} rows")
        p = int(positions[t])
        chunk_start = None
        if query_start_loc is not None:
            if q >= query_start_loc.shape[0] - 1:
                _contract(f"token_to_req_indices[{t}] = {q} is outside query_start_loc's {query_start_loc.shape[0] - 1} requests")
            chunk_start = int(positions[query_start_loc[q]])
        for i in range(config.window):
            pos = p - config.window + 1 + i
            if pos < 0 or (chunk_start is not None and pos >= chunk_start):
                continue
            column = (pos if state_format.ring_capacity is None else pos % state_format.ring_capacity) // block_size
            if column >= max_blocks:
                _contract(f"token {t} (position {p}) needs block_table[{q}, {column}] but block_table has {max_blocks} columns")
            block = int(block_table[q, column])
            if not 0 <= block < num_state_blocks:
                _contract(f"block_table[{q}, {column}] = {block} (token {t}, position {p}, window row {i}) is outside [0, {num_state_blocks}) state blocks")
        if num_entries is not None and kv_slot_mapping[t] >= num_entries:
            _contract(f"kv_slot_mapping[{t}] = {kv_slot_mapping[t]} is outside k_cache ({num_entries} entries)")
        if cos_sin_rows is not None:
            row = (p // config.ratio) * config.ratio
            if row >= cos_sin_rows:
                _contract(f"token {t} (position {p}) rotates with cos_sin_cache row {row} but cos_sin_cache has {cos_sin_rows} rows")
    slots = kv_slot_mapping[active]
    values, counts = np.unique(slots, return_counts=True)
    if np.any(counts > 1):
        _contract(f"compressed-cache slot {values[counts > 1][0]} is written by more than one active token")


def check_step_contract(
    query_start_loc: np.ndarray, token_to_req: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
    save_slot_mapping: np.ndarray, kv_slot_mapping: np.ndarray,
) -> None:
    """SPEC §13.4's caller's contract: ``query_start_loc`` nondecreasing from 0 up to at most
    ``T``; request ``req``'s tokens at consecutive positions with ``token_to_req = req``; the
    tokens after the last request are padding (every slot ``-1``)."""
    num_tokens = positions.shape[0]
    if query_start_loc[0] != 0 or np.any(np.diff(query_start_loc) < 0) or query_start_loc[-1] > num_tokens:
        _contract(f"query_start_loc = {query_start_loc.tolist()} is not nondecreasing from 0 to at most T = {num_tokens}")
    for req in range(query_start_loc.shape[0] - 1):
        tokens = np.arange(query_start_loc[req], query_start_loc[req + 1])
        if tokens.size == 0:
            continue
        wrong = tokens[token_to_req[tokens] != req]
        if wrong.size:
            _contract(f"token {wrong[0]} lies in request {req}'s chunk but token_to_req[{wrong[0]}] = {token_to_req[wrong[0]]}")
        expected = positions[tokens[0]] + np.arange(tokens.size)
        wrong = tokens[positions[tokens] != expected]
        if wrong.size:
            _contract(f"token {wrong[0]} of request {req}'s chunk has position {positions[wrong[0]]}, not "
                      f"{expected[wrong[0] - tokens[0]]} (a chunk's positions are consecutive)")
    padding = np.arange(query_start_loc[-1], num_tokens)
    for name, slots in (("slot_mapping", slot_mapping), ("save_slot_mapping", save_slot_mapping), ("kv_slot_mapping", kv_slot_mapping)):
        wrong = padding[slots[padding] >= 0]
        if wrong.size:
            _contract(f"{name}[{wrong[0]}] = {slots[wrong[0]]} for a padding token (tokens from query_start_loc[-1] = "
                      f"{query_start_loc[-1]} on have slot -1)")
