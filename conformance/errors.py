"""SPEC §9 error cases: each invalid call must raise ``ValueError`` naming the argument and
write nothing (no byte of any buffer of the call changes, padding included).

Each case starts from a valid small C4 step on the implementation's device (torch tensors, or
NumPy arrays for an implementation declaring ``arrays="numpy"``) and breaks one thing about
one argument. The message must *lead* with the argument's name (``"state_cache: expected ..."``)
or the exception must carry it as an attribute. Cases run in a worker process that is replaced
when a case crashes it (:func:`run_error_cases`). The checks of SPEC §13's options (a bf16
state, ``ape_at``, ``ring_capacity`` and the step call ``compress_and_save``) run where the
implementation declares the option (:meth:`~.capabilities.Capabilities.unsupported_state`);
elsewhere they are unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..spec.constants import ENTRY_BYTES
from .error_checks import ErrorVerdict, NumpyArrays, TorchArrays, names_argument
from .implementations import LoadedImplementation
from .runner import to_numpy, to_torch
from .scenarios import C4, StepRecipe, build_step, _decode


NEEDS = {  # SPEC §13 option -> the unsupported_state() keywords of an implementation that handles it
    "bf16": dict(state_dtype="bf16"), "ape_at": dict(ape_at="compress"), "ring": dict(ring_addressing=True),
    "step_call": dict(step_call=True),
}
KEYWORDS = {  # keyword-only arguments of each operation (the others are passed by position, in order)
    "save": ("ape_at", "ring_capacity"),
    "store": ("compress_ratio", "layout", "fp8_scale", "hadamard", "ape", "ape_at", "ring_capacity"),
    "step": ("compress_ratio", "layout", "fp8_scale", "ape_at", "ring_capacity", "hadamard"),
}


@dataclass(frozen=True)
class ErrorCase:
    name: str
    operation: str  # "save", "store" or "step" (compress_and_save, SPEC §13.4)
    argument: str  # the argument the error message must name
    breaks: Callable  # (call: dict, ctx: dict) -> None, edits the call's arguments
    indexer: bool = False  # needs an implementation of SPEC §12 (head width 128)
    layout: str | None = None  # the (valid) layout the broken call is built on, when not flashmla_fp8
    numpy: bool = True  # expressible with NumPy arrays (where E4M3 is held as uint8)
    needs: tuple[str, ...] = ()  # SPEC §13 options the implementation must declare: keys of NEEDS

    def __post_init__(self):
        if self.operation == "step" and "step_call" not in self.needs:
            object.__setattr__(self, "needs", self.needs + ("step_call",))


def _valid_call(device: str, layout: str = "flashmla_fp8", numpy: bool = False):
    """A valid small C4 call's arguments: (save, store, ctx); NumPy arrays when ``numpy``."""
    rng = np.random.default_rng(7)
    inputs = build_step(StepRecipe(_decode(4, 4), **{**C4, "entries_per_page": 2}, layout=layout,
                                   fp8_scale=0.5 if layout == "fp8_per_tensor" else None), rng)
    b = inputs.batch
    if numpy:
        arrays = NumpyArrays()
        state_owner, state = inputs.state_cache.numpy_copy()
        k_owner, k_cache = inputs.k_cache.numpy_copy()
        convert = to_numpy
    else:
        arrays = TorchArrays(device)
        state_owner, state = inputs.state_cache.torch_copy(device)
        k_owner, k_cache = inputs.k_cache.torch_copy(device)
        convert = lambda array: to_torch(array, device)  # noqa: E731
    meta = {n: convert(getattr(b, n)) for n in ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")}
    save = dict(kv_score=convert(inputs.kv_score), ape=convert(inputs.ape), positions=meta["positions"],
                slot_mapping=meta["slot_mapping"], state_cache=state, block_size=b.block_size)
    store = dict(state_cache=state, token_to_req_indices=meta["token_to_req_indices"], positions=meta["positions"],
                 slot_mapping=meta["slot_mapping"], block_table=meta["block_table"], block_size=b.block_size,
                 rms_norm_weight=convert(inputs.rms_norm_weight), rms_norm_eps=1e-6,
                 cos_sin_cache=convert(inputs.cos_sin_cache), k_cache=k_cache,
                 kv_slot_mapping=meta["kv_slot_mapping"], compress_ratio=4, layout=layout, fp8_scale=inputs.fp8_scale)
    ctx = {"state_owner": state_owner, "k_owner": k_owner, "device": device, "arrays": arrays, "numpy": numpy,
           "query_start_loc": convert(b.query_start_loc), "ape": save["ape"]}
    return save, store, ctx


def _step_call(save: dict, store: dict, ctx: dict) -> dict:
    """SPEC §13.4's ``compress_and_save`` on the valid step: ``kv`` and ``score`` two views of one
    (aligned) projection output, every token saved at its slot (paged)."""
    projections = ctx["arrays"].aligned_copy(save["kv_score"])
    width = projections.shape[1] // 2
    return dict(kv=projections[:, :width], score=projections[:, width:], ape=save["ape"], positions=store["positions"],
                token_to_req=store["token_to_req_indices"], query_start_loc=ctx["query_start_loc"],
                slot_mapping=store["slot_mapping"], save_slot_mapping=store["slot_mapping"],
                block_table=store["block_table"], bs=store["block_size"], state_cache=store["state_cache"],
                rms_norm_weight=store["rms_norm_weight"], rms_norm_eps=store["rms_norm_eps"],
                cos_sin_cache=store["cos_sin_cache"], k_cache=store["k_cache"], kv_slot_mapping=store["kv_slot_mapping"],
                compress_ratio=store["compress_ratio"], layout=store["layout"], fp8_scale=store["fp8_scale"],
                ape_at="save", ring_capacity=None)


def _strided_state(ctx, *, extra_offset=0, row_stride=None, last_stride=1):
    """A state cache of the same shape whose memory layout breaks one §3 rule."""
    arrays = ctx["arrays"]
    shape = (4, 4, 2048)
    row = row_stride or 2048 * last_stride
    size = extra_offset + shape[0] * shape[1] * row + shape[2] * last_stride + 64
    owner = arrays.zeros(size, "float32")
    return arrays.as_strided(owner, shape, (shape[1] * row, row, last_stride), extra_offset)


def _paged_k_cache(ctx, page_stride: int, entry_stride: int = ENTRY_BYTES, last_stride: int = 1,
                   pages: int = 3, entries: int = 2):
    """A flashmla_fp8 cache [pages, entries, 584] with the given strides (in bytes)."""
    arrays = ctx["arrays"]
    owner = arrays.zeros(pages * page_stride + entries * entry_stride + ENTRY_BYTES * last_stride + 64, "uint8")
    return arrays.as_strided(owner, (pages, entries, ENTRY_BYTES), (page_stride, entry_stride, last_stride))


def _set(key, value_fn):
    def breaks(call, ctx):
        call[key] = value_fn(call, ctx)
    return breaks


def _settings(**values):
    """Set plain values (``ape_at``, ``ring_capacity``, ...) on the call."""
    def breaks(call, ctx):
        call.update(values)
    return breaks


def _compress_ape(ape_fn):
    """``ape_at="compress"`` on the compress, with ``ape`` from ``ape_fn(call, ctx)`` (``ctx["ape"]``: the valid one)."""
    def breaks(call, ctx):
        call["ape_at"] = "compress"
        call["ape"] = ape_fn(call, ctx)
    return breaks


def _ring_wider_than_the_table(call, ctx):
    """A ring of one block more than each block-table row holds (SPEC §13.3: ``C / bs`` blocks)."""
    call["ring_capacity"] = call.get("block_size", call.get("bs")) * (call["block_table"].shape[1] + 1)


def _bf16_state_rows_4_apart(call, ctx):
    """A bf16 state whose rows are 2052 elements apart: 16-byte multiples are 8 elements (SPEC §13.1)."""
    arrays = ctx["arrays"]
    owner = arrays.zeros(4 * 4 * 2052 + 64, arrays.bf16)
    call["state_cache"] = arrays.as_strided(owner, (4, 4, 2048), (4 * 2052, 2052, 1))


def _projection_rows(row: int, offset: int = 0):
    """A ``[T, SW]`` fp32 view whose rows are ``row`` floats apart, ``offset`` floats past a 64-byte aligned base."""
    def make(call, ctx):
        arrays = ctx["arrays"]
        shape = tuple(call["kv"].shape)
        owner = arrays.zeros(offset + shape[0] * row + 64, "float32")
        return arrays.as_strided(owner, shape, (row, 1), offset)
    return make


def _every_other(ctx, tensor):
    """The same values as a view with last stride 2 (SPEC §9: unit last strides only)."""
    return ctx["arrays"].every_other(tensor)


def _cast(key: str, dtype: str):
    """The argument converted to another dtype (a fresh contiguous array)."""
    return _set(key, lambda c, x: x["arrays"].cast(c[key], dtype))


def _overlapping_blocks(ctx):
    """Block stride below block_size * row stride: blocks share rows."""
    arrays = ctx["arrays"]
    owner = arrays.zeros(4 * 2 * 2048 + 4 * 2048 + 64, "float32")
    return arrays.as_strided(owner, (4, 4, 2048), (2 * 2048, 2048, 1))


def _with_layout(layout: str, fp8_scale, ctx, call):
    """The store call rebuilt for another layout (a fresh compressed cache of that layout)."""
    _, store, fresh = _valid_call(ctx["device"], layout, ctx["numpy"])
    ctx["k_owner"] = fresh["k_owner"]
    call["k_cache"] = store["k_cache"]
    call["layout"] = layout
    call["fp8_scale"] = fp8_scale


def _bf16_with_scale(call, ctx):
    _with_layout("bf16", 0.5, ctx, call)


def _fp8_layout(fp8_scale):
    def breaks(call, ctx):
        _with_layout("fp8_per_tensor", fp8_scale, ctx, call)
    return breaks


def _indexer_cache_for_512(call, ctx):
    arrays = ctx["arrays"]
    owner = arrays.zeros(3 * 2 * 68 + 64, "uint8")
    call["k_cache"] = arrays.as_strided(owner, (3, 2, 68), (2 * 68 + 8, 68, 1))
    call["layout"] = "indexer_mxfp4"


def _bf16_k_cache_float32(call, ctx):
    _with_layout("bf16", None, ctx, call)
    call["k_cache"] = ctx["arrays"].cast(call["k_cache"], "float32")


def _fp8_k_cache_uint8(call, ctx):
    _with_layout("fp8_per_tensor", 0.5, ctx, call)
    call["k_cache"] = ctx["arrays"].reinterpret(call["k_cache"], "uint8")


BASE_CASES: tuple[ErrorCase, ...] = (
    ErrorCase("positions int32", "store", "positions", _cast("positions", "int32")),
    ErrorCase("slot_mapping int32", "save", "slot_mapping", _cast("slot_mapping", "int32")),
    ErrorCase("token_to_req_indices int64", "store", "token_to_req_indices", _cast("token_to_req_indices", "int64")),
    ErrorCase("block_table int64", "store", "block_table", _cast("block_table", "int64")),
    ErrorCase("kv_slot_mapping shorter than positions", "store", "kv_slot_mapping", _set("kv_slot_mapping", lambda c, x: c["kv_slot_mapping"][:-1])),
    ErrorCase("block_table of rank 1", "store", "block_table", _set("block_table", lambda c, x: c["block_table"][0])),
    ErrorCase("state_cache float64", "store", "state_cache", _cast("state_cache", "float64")),
    ErrorCase("state_cache of rank 2", "store", "state_cache", _set("state_cache", lambda c, x: c["state_cache"][0])),
    ErrorCase("C4 state with compress_ratio 128", "store", "state_cache", _set("compress_ratio", lambda c, x: 128)),
    ErrorCase("compress_ratio 64", "store", "compress_ratio", _set("compress_ratio", lambda c, x: 64)),
    ErrorCase("block_size that is not state_cache.shape[1]", "store", "state_cache", _set("block_size", lambda c, x: 8)),
    ErrorCase("state_cache with a non-unit last stride", "store", "state_cache", _set("state_cache", lambda c, x: _strided_state(x, last_stride=2))),
    ErrorCase("state_cache base not 16-byte aligned", "store", "state_cache", _set("state_cache", lambda c, x: _strided_state(x, extra_offset=1))),
    ErrorCase("state row stride not a multiple of 4", "store", "state_cache", _set("state_cache", lambda c, x: _strided_state(x, row_stride=2050))),
    ErrorCase("page stride below B*584", "store", "k_cache", _set("k_cache", lambda c, x: _paged_k_cache(x, 2 * 584 - 16))),
    ErrorCase("page stride not a multiple of 16", "store", "k_cache", _set("k_cache", lambda c, x: _paged_k_cache(x, 2 * 584 + 8))),
    ErrorCase("k_cache of 576 bytes per entry", "store", "k_cache", _set("k_cache", lambda c, x: c["k_cache"][:, :, :576])),
    ErrorCase("k_cache int8", "store", "k_cache", _set("k_cache", lambda c, x: x["arrays"].reinterpret(c["k_cache"], "int8"))),
    ErrorCase("rms_norm_weight of 448", "store", "rms_norm_weight", _set("rms_norm_weight", lambda c, x: c["rms_norm_weight"][:448])),
    ErrorCase("rms_norm_weight float16", "store", "rms_norm_weight", _cast("rms_norm_weight", "float16")),
    ErrorCase("rms_norm_eps 0", "store", "rms_norm_eps", _set("rms_norm_eps", lambda c, x: 0.0)),
    ErrorCase("cos_sin_cache of width 32", "store", "cos_sin_cache", _set("cos_sin_cache", lambda c, x: c["cos_sin_cache"][:, :32])),
    ErrorCase("unknown layout", "store", "layout", _set("layout", lambda c, x: "fp8")),
    ErrorCase("fp8_scale for flashmla_fp8", "store", "fp8_scale", _set("fp8_scale", lambda c, x: 0.5)),
    ErrorCase("ape of the wrong ratio", "save", "ape", _set("ape", lambda c, x: c["ape"][:2])),
    ErrorCase("kv_score of the wrong width", "save", "kv_score", _set("kv_score", lambda c, x: c["kv_score"][:, :1024])),
    ErrorCase("kv_score of the wrong length", "save", "kv_score", _set("kv_score", lambda c, x: c["kv_score"][:-1])),
    ErrorCase("C128 ape with C4 projections", "save", "kv_score", _set("ape", lambda c, x: x["arrays"].zeros((128, 512), "float32"))),
    ErrorCase("state_cache float64 for save", "save", "state_cache", _cast("state_cache", "float64")),
    # SPEC v1.1 §9 additions
    ErrorCase("k_cache entry stride other than 584", "store", "k_cache",
              _set("k_cache", lambda c, x: _paged_k_cache(x, 4 * ENTRY_BYTES, entry_stride=592))),
    ErrorCase("k_cache with a non-unit last stride", "store", "k_cache",
              _set("k_cache", lambda c, x: _paged_k_cache(x, 4 * ENTRY_BYTES, 2 * ENTRY_BYTES, last_stride=2))),
    ErrorCase("layout of the indexer for head width 512", "store", "layout", _set("layout", lambda c, x: "indexer_fp8")),
    ErrorCase("fp8_scale for the bf16 layout", "store", "fp8_scale", _bf16_with_scale, layout="bf16"),
    ErrorCase("fp8_per_tensor without fp8_scale", "store", "fp8_scale", _fp8_layout(None), layout="fp8_per_tensor"),
    ErrorCase("fp8_scale 0", "store", "fp8_scale", _fp8_layout(0.0), layout="fp8_per_tensor"),
    ErrorCase("fp8_scale inf", "store", "fp8_scale", _fp8_layout(float("inf")), layout="fp8_per_tensor"),
    ErrorCase("fp8_scale nan", "store", "fp8_scale", _fp8_layout(float("nan")), layout="fp8_per_tensor"),
    ErrorCase("fp8_scale 1e-50 (0 in binary32)", "store", "fp8_scale", _fp8_layout(1e-50), layout="fp8_per_tensor"),
    ErrorCase("rms_norm_eps nan", "store", "rms_norm_eps", _set("rms_norm_eps", lambda c, x: float("nan"))),
    ErrorCase("rms_norm_eps inf", "store", "rms_norm_eps", _set("rms_norm_eps", lambda c, x: float("inf"))),
    ErrorCase("rms_norm_eps -1e-6", "store", "rms_norm_eps", _set("rms_norm_eps", lambda c, x: -1e-6)),
    ErrorCase("rms_norm_eps 1e-50 (0 in binary32)", "store", "rms_norm_eps", _set("rms_norm_eps", lambda c, x: 1e-50)),
    ErrorCase("overlapping state rows", "store", "state_cache", _set("state_cache", lambda c, x: _strided_state(x, row_stride=1024))),
    ErrorCase("overlapping state blocks", "store", "state_cache", _set("state_cache", lambda c, x: _overlapping_blocks(x))),
    ErrorCase("overlapping state rows for save", "save", "state_cache", _set("state_cache", lambda c, x: _strided_state(x, row_stride=1024))),
    ErrorCase("state row stride not a multiple of 4 for save", "save", "state_cache", _set("state_cache", lambda c, x: _strided_state(x, row_stride=2050))),
    ErrorCase("slot_mapping shorter than positions", "store", "slot_mapping", _set("slot_mapping", lambda c, x: c["slot_mapping"][:-1])),
    ErrorCase("token_to_req_indices shorter than positions", "store", "token_to_req_indices",
              _set("token_to_req_indices", lambda c, x: c["token_to_req_indices"][:-1])),
    ErrorCase("slot_mapping shorter than positions for save", "save", "slot_mapping", _set("slot_mapping", lambda c, x: c["slot_mapping"][:-1])),
    ErrorCase("positions with a non-unit stride", "store", "positions", _set("positions", lambda c, x: _every_other(x, c["positions"]))),
    ErrorCase("kv_score with a non-unit last stride", "save", "kv_score", _set("kv_score", lambda c, x: _every_other(x, c["kv_score"]))),
    ErrorCase("block_table with a non-unit last stride", "store", "block_table", _set("block_table", lambda c, x: _every_other(x, c["block_table"]))),
    ErrorCase("cos_sin_cache with a non-unit last stride", "store", "cos_sin_cache", _set("cos_sin_cache", lambda c, x: _every_other(x, c["cos_sin_cache"]))),
    ErrorCase("ape float64", "save", "ape", _cast("ape", "float64")),
    ErrorCase("positions int32 for save", "save", "positions", _cast("positions", "int32")),
    ErrorCase("bf16 k_cache of dtype float32", "store", "k_cache", _bf16_k_cache_float32, layout="bf16"),
    ErrorCase("fp8_per_tensor k_cache of dtype uint8", "store", "k_cache", _fp8_k_cache_uint8, layout="fp8_per_tensor",
              numpy=False),
    ErrorCase("block_size 0", "save", "block_size", _set("block_size", lambda c, x: 0)),
    ErrorCase("hadamard for flashmla_fp8", "store", "hadamard", _set("hadamard", lambda c, x: True), indexer=True),
    ErrorCase("indexer_mxfp4 k_cache of 68 bytes per entry with a 512-wide state", "store", "layout",
              _indexer_cache_for_512, indexer=True),
)

STATE_CASES: tuple[ErrorCase, ...] = (  # SPEC §9's checks of the §13 options, run where declared
    ErrorCase("state_cache float16", "store", "state_cache", _cast("state_cache", "float16"), needs=("bf16",)),
    ErrorCase("bf16 state rows 2052 elements apart", "store", "state_cache", _bf16_state_rows_4_apart, needs=("bf16",)),
    ErrorCase("bf16 state rows 2052 elements apart for save", "save", "state_cache", _bf16_state_rows_4_apart,
              needs=("bf16",)),
    ErrorCase("ape_at unknown", "store", "ape_at", _settings(ape_at="pool"), needs=("ape_at",)),
    ErrorCase("ape_at not a string", "store", "ape_at", _settings(ape_at=1), needs=("ape_at",)),
    ErrorCase("ape_at unknown for save", "save", "ape_at", _settings(ape_at="compress "), needs=("ape_at",)),
    ErrorCase("ape missing for save with ape_at save", "save", "ape", _set("ape", lambda c, x: None), needs=("ape_at",)),
    ErrorCase("ape missing with ape_at compress", "store", "ape", _compress_ape(lambda c, x: None), needs=("ape_at",)),
    ErrorCase("ape float64 with ape_at compress", "store", "ape",
              _compress_ape(lambda c, x: x["arrays"].cast(x["ape"], "float64")), needs=("ape_at",)),
    ErrorCase("ape of ratio 128 with ape_at compress", "store", "ape",
              _compress_ape(lambda c, x: x["arrays"].zeros((128, 512), "float32")), needs=("ape_at",)),
    ErrorCase("ape half wide with ape_at compress", "store", "ape",
              _compress_ape(lambda c, x: x["arrays"].aligned_copy(x["ape"][:, :512])), needs=("ape_at",)),
    ErrorCase("ring_capacity not a multiple of block_size", "store", "ring_capacity", _settings(ring_capacity=10),
              needs=("ring",)),
    ErrorCase("ring_capacity below W", "store", "ring_capacity", _settings(ring_capacity=4), needs=("ring",)),
    ErrorCase("ring_capacity a float", "store", "ring_capacity", _settings(ring_capacity=16.0), needs=("ring",)),
    ErrorCase("ring_capacity a bool", "store", "ring_capacity", _settings(ring_capacity=True), needs=("ring",)),
    ErrorCase("ring_capacity 0 for save", "save", "ring_capacity", _settings(ring_capacity=0), needs=("ring",)),
    ErrorCase("block_table narrower than the ring", "store", "block_table", _ring_wider_than_the_table, needs=("ring",)),
    # the step call (SPEC §13.4)
    ErrorCase("kv float64", "step", "kv", _cast("kv", "float64")),
    ErrorCase("kv rows 1026 floats apart", "step", "kv", _set("kv", _projection_rows(1026))),
    ErrorCase("kv base not 16-byte aligned", "step", "kv", _set("kv", _projection_rows(2048, offset=1))),
    ErrorCase("kv with a non-unit last stride", "step", "kv", _set("kv", lambda c, x: _every_other(x, c["kv"]))),
    ErrorCase("score half wide", "step", "score", _set("score", lambda c, x: x["arrays"].aligned_copy(c["kv"][:, :512]))),
    ErrorCase("score one row short", "step", "score", _set("score", lambda c, x: c["score"][:-1])),
    ErrorCase("score rows 1025 floats apart", "step", "score", _set("score", _projection_rows(1025))),
    ErrorCase("ape missing for compress_and_save", "step", "ape", _set("ape", lambda c, x: None)),
    ErrorCase("ape float64 for compress_and_save", "step", "ape", _cast("ape", "float64")),
    ErrorCase("query_start_loc int64", "step", "query_start_loc", _cast("query_start_loc", "int64")),
    ErrorCase("query_start_loc of rank 2", "step", "query_start_loc",
              _set("query_start_loc", lambda c, x: c["query_start_loc"][None])),
    ErrorCase("more requests than block_table rows", "step", "query_start_loc",
              _set("query_start_loc", lambda c, x: x["arrays"].cast(x["arrays"].zeros(c["block_table"].shape[0] + 2,
                                                                                         "int64"), "int32"))),
    ErrorCase("save_slot_mapping int32", "step", "save_slot_mapping", _cast("save_slot_mapping", "int32")),
    ErrorCase("save_slot_mapping one short", "step", "save_slot_mapping",
              _set("save_slot_mapping", lambda c, x: c["save_slot_mapping"][:-1])),
    ErrorCase("token_to_req int64 for compress_and_save", "step", "token_to_req", _cast("token_to_req", "int64")),
    ErrorCase("ape_at unknown for compress_and_save", "step", "ape_at", _settings(ape_at="both"), needs=("ape_at",)),
    ErrorCase("ring_capacity below W for compress_and_save", "step", "ring_capacity", _settings(ring_capacity=4),
              needs=("ring",)),
    ErrorCase("block_table narrower than the ring for compress_and_save", "step", "block_table",
              _ring_wider_than_the_table, needs=("ring",)),
)

CASES: tuple[ErrorCase, ...] = BASE_CASES + STATE_CASES


def run_error_case(impl: LoadedImplementation, case: ErrorCase, device: str | None = None) -> ErrorVerdict:
    """Call with the broken argument, in this process; pass iff a ValueError names the
    argument and no byte of any buffer of the call changed (a SPEC §14.8 case of
    :mod:`.v41_errors` too)."""
    device = device or impl.device()
    if device is None:
        return ErrorVerdict(case.name, impl.name, "skip", f"needs one of {impl.devices}")
    if not isinstance(case, ErrorCase):
        from .v41_errors import run_v41_error_case

        return run_v41_error_case(impl, case, device)
    numpy = impl.takes_numpy
    if numpy and not case.numpy:
        return ErrorVerdict(case.name, impl.name, "unsupported", "no NumPy form (NumPy holds E4M3 as uint8)")
    save, store, ctx = _valid_call(device, numpy=numpy)
    arrays = ctx["arrays"]
    call = dict({"save": save, "store": store}.get(case.operation) or _step_call(save, store, ctx))
    case.breaks(call, ctx)
    buffers = {k: v for k, v in call.items() if isinstance(v, arrays.Array)}
    buffers.update(state_owner=ctx["state_owner"], k_owner=ctx["k_owner"])
    before = {k: arrays.storage_bytes(v) for k, v in buffers.items()}
    operation = {"save": "save_partial_states", "store": "compress_norm_rope_store", "step": "compress_and_save"}
    operation = getattr(impl.target, operation[case.operation])
    positional = [k for k in call if k not in KEYWORDS[case.operation]]
    keywords = {k: call[k] for k in KEYWORDS[case.operation] if k in call}
    try:
        operation(*(call[k] for k in positional), **keywords)
        arrays.synchronize()
    except ValueError as error:
        arrays.synchronize()
        changed = [k for k, v in buffers.items() if not arrays.equal(arrays.storage_bytes(v), before[k])]
        message = " ".join(str(error).split())
        if not names_argument(error, case.argument):
            return ErrorVerdict(case.name, impl.name, "fail", f"ValueError does not lead with {case.argument!r}: {message[:160]}")
        if changed:
            return ErrorVerdict(case.name, impl.name, "fail", f"raised ValueError but wrote to {', '.join(sorted(changed))} first")
        return ErrorVerdict(case.name, impl.name, "pass", message)
    except Exception as error:  # any other failure is the wrong contract
        return ErrorVerdict(case.name, impl.name, "fail", " ".join(f"expected ValueError, got {type(error).__name__}: {error}".split())[:300])
    return ErrorVerdict(case.name, impl.name, "fail", "no error raised")


# ---- crash-proof running: a worker process, restarted when a case kills it -----------------
CASE_TIMEOUT_S = 300  # one case, compilation included


def _worker_main() -> None:
    """Worker loop: stdin gives ``reference device case-name`` lines, stdout answers JSON lines."""
    import json
    import sys

    from .implementations import load_implementation

    from .v41_errors import V41_CASES

    loaded = {}
    by_name = {c.name: c for c in CASES + V41_CASES}
    for line in sys.stdin:
        reference, device, name = json.loads(line)
        if reference not in loaded:
            loaded[reference] = load_implementation(reference)
        try:
            verdict = run_error_case(loaded[reference], by_name[name], device)
        except Exception as error:  # the case could not be set up: the suite's fault, not the kernel's
            verdict = ErrorVerdict(name, reference, "error", f"setting up the case failed: {type(error).__name__}: {error}"[:300])
        sys.stdout.write(json.dumps([verdict.status, verdict.detail]) + "\n")
        sys.stdout.flush()


class _Worker:
    def __init__(self):
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-c", "from dsv4_compressor.conformance.errors import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, reference: str, device: str, case: ErrorCase) -> tuple[str, str] | None:
        """The worker's (status, detail), or ``None`` when it died or hung on this case."""
        import json
        import select

        try:
            self.process.stdin.write(json.dumps([reference, device, case.name]) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return None
        ready, _, _ = select.select([self.process.stdout], [], [], CASE_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        return tuple(json.loads(line)) if line else None

    def end(self) -> str:
        """Stop the worker; a short account of how it ended."""
        import subprocess

        if self.process.poll() is None:
            self.process.kill()
        try:
            _, err = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            err = ""
        code = self.process.returncode
        tail = " ".join((err or "").strip().splitlines()[-1:])[:160]
        return f"exit status {code}" + (f" ({tail})" if tail else "")


def _v4_case_unsupported(impl: LoadedImplementation, case: ErrorCase) -> str | None:
    """Why ``impl`` is not asked a SPEC §9 case (SPEC §13's options, layouts it declares), or ``None``."""
    undeclared = impl.capabilities.unsupported_state(**{k: v for need in case.needs for k, v in NEEDS[need].items()})
    if undeclared:
        return f"outside the declaration: {undeclared}"
    layouts = impl.capabilities.layouts
    if case.layout and layouts is not None and case.layout not in layouts:
        return f"declared: no layout {case.layout!r}"
    return None


def run_error_cases(impl: LoadedImplementation, cases=CASES, device: str | None = None) -> list[ErrorVerdict]:
    """Every case against ``impl``, a crash in one hiding none of the others.

    Loadable implementations (``impl.reference``) run in a worker process that is restarted
    after any case it did not pass (a crash, a hang, or a failure that may have poisoned a
    GPU context); others run in this process.
    """
    device = device or impl.device()
    if device is None:
        return [ErrorVerdict(c.name, impl.name, "skip", f"needs one of {impl.devices}") for c in cases]
    verdicts, worker = [], None
    for case in cases:
        if not isinstance(case, ErrorCase):  # SPEC §14.8
            from .v41_errors import v41_case_unsupported

            undeclared = v41_case_unsupported(impl, case)
            if undeclared:
                verdicts.append(ErrorVerdict(case.name, impl.name, "unsupported", undeclared))
                continue
        elif not impl.capabilities.v4:
            verdicts.append(ErrorVerdict(case.name, impl.name, "unsupported", "declared: DeepSeek-V4.1 alone"))
            continue
        elif case.indexer and 128 not in impl.capabilities.head_widths:
            verdicts.append(ErrorVerdict(case.name, impl.name, "unsupported", "declared: no SPEC §12 (head width 128)"))
            continue
        undeclared = _v4_case_unsupported(impl, case) if isinstance(case, ErrorCase) else None
        if undeclared:
            verdicts.append(ErrorVerdict(case.name, impl.name, "unsupported", undeclared))
            continue
        if isinstance(case, ErrorCase) and impl.takes_numpy and not case.numpy:
            verdicts.append(ErrorVerdict(case.name, impl.name, "unsupported", "no NumPy form (NumPy holds E4M3 as uint8)"))
            continue
        if not impl.reference:
            verdicts.append(run_error_case(impl, case, device))
            continue
        worker = worker or _Worker()
        answer = worker.ask(impl.reference, device, case)
        if answer is None:
            verdicts.append(ErrorVerdict(case.name, impl.name, "fail", f"the call crashed or hung the process: {worker.end()}"))
            worker = None
            continue
        verdicts.append(ErrorVerdict(case.name, impl.name, *answer))
        if answer[0] != "pass":
            worker.end()
            worker = None
    if worker:
        worker.end()
    return verdicts
