"""SPEC §14.8's error cases: each breaks one argument of a valid DeepSeek-V4.1 call, which must
raise ``ValueError`` leading with the argument's name and write nothing (the latent, the state and
the cache compared whole, padding included).

The valid calls are in the format most engines can take: ratio 2 on vLLM's ring of 8 rows in one
block (fp32, the chunk tails saved, ``kv`` and ``score`` two views of one projection output), a
contiguous latent, the ``v41_mxfp8`` record. They run in :mod:`.errors`' worker process (a crash
hides no other case), where the implementation declares the operation and the ratio. An
implementation that answers a case with ``NotImplementedError`` having written nothing is
reported unsupported for it; the case of an ``ape`` argument runs where the operation takes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..spec.batch import Request
from .error_checks import ErrorVerdict, NumpyArrays, TorchArrays, names_argument
from .implementations import LoadedImplementation, takes_keywords
from .v41_calls import v41_call
from .v41_scenarios import V41Recipe, build_v41

PARAMETERS = {  # SPEC §14.7: each operation's arguments in order; the keyword-only ones after "*"
    "compress_norm": ("kv", "score", "positions", "token_to_req", "query_start_loc", "slot_mapping",
                      "save_slot_mapping", "block_table", "bs", "state_cache", "rms_norm_weight", "rms_norm_eps",
                      "kv_slot_mapping", "latent", "*", "compress_ratio", "ring_capacity", "ape"),
    "compress_norm_rope_store": ("kv", "score", "positions", "token_to_req", "query_start_loc", "slot_mapping",
                                 "save_slot_mapping", "block_table", "bs", "state_cache", "rms_norm_weight",
                                 "rms_norm_eps", "cos_sin_cache", "k_cache", "kv_slot_mapping", "latent", "*",
                                 "compress_ratio", "layout", "ring_capacity", "fp8_scale", "ape"),
    "rope_quant_store": ("latent", "positions", "kv_slot_mapping", "cos_sin_cache", "k_cache", "*", "compress_ratio",
                         "layout", "fp8_scale"),
    "index_key_store": ("k_pre", "positions", "kv_slot_mapping", "rms_norm_weight", "rms_norm_eps", "cos_sin_cache",
                        "k_cache", "*", "compress_ratio", "layout"),
}


@dataclass(frozen=True)
class V41ErrorCase:
    name: str
    operation: str  # compress_norm, rope_quant_store, compress_norm_rope_store or index_key_store
    ratio: int  # the valid call's compress_ratio
    argument: str  # the argument the message must lead with
    breaks: Callable  # (call: dict, ctx: dict) -> None, edits the call's arguments by name
    layout: str = "v41_mxfp8"


def _valid_call(case: V41ErrorCase, arrays) -> tuple[dict, dict]:
    """The valid call's arguments by name, and the allocations it may write."""
    layout = None if case.operation == "compress_norm" else (
        "indexer_mxfp4" if case.operation == "index_key_store" else case.layout)
    recipe = V41Recipe(lambda rng: [Request(5, 1), Request(0, 3), Request(9, 2)], case.ratio, operation=case.operation,
                       layout=layout, state="vllm_ring", entries_per_page=2, num_padding=1)
    inputs = build_v41(recipe, np.random.default_rng(7))
    call = v41_call(inputs, arrays)
    names = [p for p in PARAMETERS[case.operation] if p != "*"]
    arguments = dict(zip(names, call.positional))
    arguments.update(call.keywords)
    return arguments, call.owners


def _zeros(ctx, shape, dtype):
    return ctx["arrays"].zeros(shape, ctx["arrays"].bf16 if dtype == "bfloat16" else dtype)


def _set(**values):
    """Replace arguments: each value a constant or a function ``(call, ctx) -> value``."""
    def breaks(call, ctx):
        for key, value in values.items():
            call[key] = value(call, ctx) if callable(value) else value
    return breaks


def _cast(key: str, dtype: str):
    return _set(**{key: lambda c, x: x["arrays"].cast(c[key], dtype)})


def _strided(ctx, shape, dtype, row: int, offset: int = 0):
    """A ``[T, W]`` view whose rows are ``row`` elements apart, ``offset`` elements past an aligned base."""
    owner = _zeros(ctx, (offset + shape[0] * row + 64,), dtype)
    return ctx["arrays"].as_strided(owner, shape, (row, 1), offset)


def _cache(ctx, entry: int, page_stride: int, entry_stride: int | None = None, entries: int = 2, pages: int = 4):
    owner = _zeros(ctx, (pages * max(page_stride, entries * entry) + 64,), "uint8")
    return ctx["arrays"].as_strided(owner, (pages, entries, entry), (page_stride, entry_stride or entry, 1))


def _every_other(key: str):
    return _set(**{key: lambda c, x: x["arrays"].every_other(c[key])})


def _shorter(key: str):
    return _set(**{key: lambda c, x: c[key][:-1]})


T = 7  # tokens of the valid calls (six and one padding)
COMBINED, ALONE = "compress_norm_rope_store", "compress_norm"
V41_CASES: tuple[V41ErrorCase, ...] = tuple(
    V41ErrorCase(f"v41 {name}", op, ratio, argument, breaks) for name, op, ratio, argument, breaks in (
        ("compress_ratio 4", COMBINED, 1, "compress_ratio", _set(compress_ratio=4)),
        ("compress_ratio True", COMBINED, 2, "compress_ratio", _set(compress_ratio=True)),
        ("ape given", COMBINED, 2, "ape", _set(ape=lambda c, x: _zeros(x, (2, 512), "float32"))),
        ("score given for ratio 1", COMBINED, 1, "score", _set(score=lambda c, x: _zeros(x, (T, 512), "float32"))),
        ("score missing for ratio 2", COMBINED, 2, "score", _set(score=None)),
        ("state_cache missing for ratio 2", COMBINED, 2, "state_cache", _set(state_cache=None)),
        ("kv float64", COMBINED, 1, "kv", _cast("kv", "float64")),
        ("kv of width 448", COMBINED, 1, "kv", _set(kv=lambda c, x: _zeros(x, (T, 448), "float32"))),
        ("kv one row short", COMBINED, 1, "kv", _shorter("kv")),
        ("kv with a non-unit last stride", COMBINED, 1, "kv", _every_other("kv")),
        ("score float16", COMBINED, 2, "score", _cast("score", "float16")),
        ("score rows not 16-byte aligned", COMBINED, 2, "score",
         _set(score=lambda c, x: _strided(x, (T, 512), "float32", 513))),
        ("latent float32", COMBINED, 1, "latent", _set(latent=lambda c, x: _zeros(x, (T, 512), "float32"))),
        ("latent with a non-unit last stride", COMBINED, 1, "latent", _every_other("latent")),
        ("latent rows 516 elements apart", COMBINED, 1, "latent",
         _set(latent=lambda c, x: _strided(x, (T, 512), "bfloat16", 516))),
        ("latent base not 16-byte aligned", COMBINED, 1, "latent",
         _set(latent=lambda c, x: _strided(x, (T, 512), "bfloat16", 512, 1))),
        ("latent one row longer", COMBINED, 1, "latent", _set(latent=lambda c, x: _zeros(x, (T + 1, 512), "bfloat16"))),
        ("layout of the indexer", COMBINED, 1, "layout", _set(layout="indexer_fp8")),
        ("unknown layout", COMBINED, 1, "layout", _set(layout="mxfp8")),
        ("k_cache of 584-byte entries", COMBINED, 1, "k_cache", _set(k_cache=lambda c, x: _cache(x, 584, 1168))),
        ("page stride below B*E", COMBINED, 1, "k_cache", _set(k_cache=lambda c, x: _cache(x, 528, 1040))),
        ("page stride not a multiple of 16", COMBINED, 1, "k_cache", _set(k_cache=lambda c, x: _cache(x, 528, 1064))),
        ("entry stride other than E", COMBINED, 1, "k_cache", _set(k_cache=lambda c, x: _cache(x, 528, 1088, 544))),
        ("k_cache int8", COMBINED, 1, "k_cache",
         _set(k_cache=lambda c, x: x["arrays"].reinterpret(_cache(x, 528, 1056), "int8"))),
        ("fp8_scale for v41_mxfp8", COMBINED, 1, "fp8_scale", _set(fp8_scale=1.0)),
        ("rms_norm_eps 0", COMBINED, 2, "rms_norm_eps", _set(rms_norm_eps=0.0)),
        ("rms_norm_weight of 128", COMBINED, 1, "rms_norm_weight",
         _set(rms_norm_weight=lambda c, x: _zeros(x, (128,), "float32"))),
        ("positions int32", COMBINED, 1, "positions", _cast("positions", "int32")),
        ("kv_slot_mapping one short", COMBINED, 2, "kv_slot_mapping", _shorter("kv_slot_mapping")),
        ("cos_sin_cache of width 32", COMBINED, 1, "cos_sin_cache",
         _set(cos_sin_cache=lambda c, x: _zeros(x, (64, 32), "float32"))),
        ("ring_capacity 1", COMBINED, 2, "ring_capacity", _set(ring_capacity=1)),
        ("ring_capacity not a multiple of bs", COMBINED, 2, "ring_capacity", _set(ring_capacity=12)),
        ("token_to_req int64", COMBINED, 2, "token_to_req", _cast("token_to_req", "int64")),
        ("save_slot_mapping one short", COMBINED, 2, "save_slot_mapping", _shorter("save_slot_mapping")),
        ("query_start_loc int64", COMBINED, 2, "query_start_loc", _cast("query_start_loc", "int64")),
        ("state_cache float64", COMBINED, 2, "state_cache", _cast("state_cache", "float64")),
        ("state_cache rows of 2048", COMBINED, 2, "state_cache",
         _set(state_cache=lambda c, x: _zeros(x, (4, 8, 2048), "float32"))),
        ("bs 0", COMBINED, 2, "bs", _set(bs=0)),
        ("compress_norm without a latent", ALONE, 2, "latent", _set(latent=None)),
        ("compress_norm kv float64", ALONE, 1, "kv", _cast("kv", "float64")),
        ("store without a latent", "rope_quant_store", 1, "latent", _set(latent=None)),
        ("store compress_ratio 128", "rope_quant_store", 2, "compress_ratio", _set(compress_ratio=128)),
        ("store v41_nvfp4 into a 528-byte cache", "rope_quant_store", 1, "k_cache", _set(layout="v41_nvfp4")),
        ("store layout indexer_mxfp4", "rope_quant_store", 1, "layout", _set(layout="indexer_mxfp4")),
        ("index key k_pre float32", "index_key_store", 1, "k_pre",
         _set(k_pre=lambda c, x: _zeros(x, (T, 128), "float32"))),
        ("index key k_pre of width 64", "index_key_store", 2, "k_pre",
         _set(k_pre=lambda c, x: _zeros(x, (T, 64), "bfloat16"))),
        ("index key layout v41_nvfp4", "index_key_store", 1, "layout", _set(layout="v41_nvfp4")),
        ("index key compress_ratio 4", "index_key_store", 2, "compress_ratio", _set(compress_ratio=4)),
    )
)


def v41_case_unsupported(impl: LoadedImplementation, case: V41ErrorCase) -> str | None:
    """Why ``impl`` is not asked this case (its declaration), or ``None``."""
    v41 = impl.capabilities.v41
    if v41 is None:
        return "declared: no DeepSeek-V4.1 (SPEC §14)"
    if case.operation not in v41.operations or case.ratio not in v41.ratios:
        return f"declared: no v41_{case.operation} at ratio {case.ratio}"
    if "ape" in case.name:
        if not takes_keywords(getattr(impl.target, f"v41_{case.operation}"), "ape"):
            return "the operation takes no ape argument (SPEC §14.7 names none)"
    return None


def run_v41_error_case(impl: LoadedImplementation, case: V41ErrorCase, device: str) -> ErrorVerdict:
    """Call with the broken argument, in this process; pass iff a ValueError leads with the
    argument and no byte of any buffer of the call changed."""
    arrays = NumpyArrays() if impl.takes_numpy else TorchArrays(device)
    from .arrays import HostArrays
    from .arrays import TorchArrays as CallArrays

    call, owners = _valid_call(case, HostArrays() if impl.takes_numpy else CallArrays(device))
    ctx = {"arrays": arrays, "device": device}
    case.breaks(call, ctx)
    buffers = {k: v for k, v in call.items() if isinstance(v, arrays.Array)}
    buffers.update({f"{k} allocation": v for k, v in owners.items()})
    before = {k: arrays.storage_bytes(v) for k, v in buffers.items()}
    names = PARAMETERS[case.operation]
    positional = [call[k] for k in names[:names.index("*")]]
    keywords = {k: call[k] for k in names[names.index("*") + 1:] if k in call}
    operation = getattr(impl.target, f"v41_{case.operation}")
    try:
        operation(*positional, **keywords)
        arrays.synchronize()
    except (ValueError, NotImplementedError) as error:
        arrays.synchronize()
        changed = [k for k, v in buffers.items() if not arrays.equal(arrays.storage_bytes(v), before[k])]
        message = " ".join(str(error).split())
        if changed:
            return ErrorVerdict(case.name, impl.name, "fail",
                                f"raised {type(error).__name__} but wrote to {', '.join(sorted(changed))} first")
        if isinstance(error, NotImplementedError):
            return ErrorVerdict(case.name, impl.name, "unsupported", f"NotImplementedError: {message}"[:300])
        if not names_argument(error, case.argument):
            return ErrorVerdict(case.name, impl.name, "fail", f"ValueError does not lead with {case.argument!r}: {message[:160]}")
        return ErrorVerdict(case.name, impl.name, "pass", message)
    except Exception as error:  # any other failure is the wrong contract
        return ErrorVerdict(case.name, impl.name, "fail",
                            " ".join(f"expected ValueError, got {type(error).__name__}: {error}".split())[:300])
    return ErrorVerdict(case.name, impl.name, "fail", "no error raised")
