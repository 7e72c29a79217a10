"""SPEC §9 error cases: each invalid call must raise ``ValueError`` naming the argument and
write nothing (the state cache and the compressed cache keep every byte).

Each case starts from a valid small C4 step on the implementation's device and breaks one
thing about one argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .implementations import LoadedImplementation
from .runner import to_torch
from .scenarios import C4, StepRecipe, build_step, _decode


@dataclass(frozen=True)
class ErrorCase:
    name: str
    operation: str  # "save" or "store"
    argument: str  # the argument the error message must name
    breaks: Callable  # (call: dict, ctx: dict) -> None, edits the call's arguments


@dataclass
class ErrorVerdict:
    case: str
    implementation: str
    status: str  # pass / fail / skip
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status in ("pass", "skip")


def _valid_call(device: str, layout: str = "flashmla_fp8"):
    import torch

    rng = np.random.default_rng(7)
    inputs = build_step(StepRecipe(_decode(4, 4), **{**C4, "entries_per_page": 2}, layout=layout,
                                   fp8_scale=0.5 if layout == "fp8_per_tensor" else None), rng)
    b = inputs.batch
    state_owner, state = inputs.state_cache.torch_copy(device)
    k_owner, k_cache = inputs.k_cache.torch_copy(device)
    meta = {n: to_torch(getattr(b, n), device) for n in ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")}
    save = dict(kv_score=to_torch(inputs.kv_score, device), ape=to_torch(inputs.ape, device), positions=meta["positions"],
                slot_mapping=meta["slot_mapping"], state_cache=state, block_size=b.block_size)
    store = dict(state_cache=state, token_to_req_indices=meta["token_to_req_indices"], positions=meta["positions"],
                 slot_mapping=meta["slot_mapping"], block_table=meta["block_table"], block_size=b.block_size,
                 rms_norm_weight=to_torch(inputs.rms_norm_weight, device), rms_norm_eps=1e-6,
                 cos_sin_cache=to_torch(inputs.cos_sin_cache, device), k_cache=k_cache,
                 kv_slot_mapping=meta["kv_slot_mapping"], compress_ratio=4, layout=layout, fp8_scale=inputs.fp8_scale)
    ctx = {"state_owner": state_owner, "k_owner": k_owner, "device": device, "torch": torch}
    return save, store, ctx


def _strided_state(ctx, *, extra_offset=0, row_stride=None, last_stride=1):
    """A state cache of the same shape whose memory layout breaks one §3 rule."""
    torch = ctx["torch"]
    shape = (4, 4, 2048)
    row = row_stride or 2048 * last_stride
    size = extra_offset + shape[0] * shape[1] * row + 64
    owner = torch.zeros(size, dtype=torch.float32, device=ctx["device"])
    return torch.as_strided(owner, shape, (shape[1] * row, row, last_stride), extra_offset)


def _paged_k_cache(ctx, page_stride: int, pages: int = 3, entries: int = 2):
    torch = ctx["torch"]
    owner = torch.zeros(pages * page_stride + 1024, dtype=torch.uint8, device=ctx["device"])
    return torch.as_strided(owner, (pages, entries, 584), (page_stride, 584, 1))


def _set(key, value_fn):
    def breaks(call, ctx):
        call[key] = value_fn(call, ctx)
    return breaks


CASES: tuple[ErrorCase, ...] = (
    ErrorCase("positions int32", "store", "positions", _set("positions", lambda c, x: c["positions"].to(x["torch"].int32))),
    ErrorCase("slot_mapping int32", "save", "slot_mapping", _set("slot_mapping", lambda c, x: c["slot_mapping"].to(x["torch"].int32))),
    ErrorCase("token_to_req_indices int64", "store", "token_to_req_indices", _set("token_to_req_indices", lambda c, x: c["token_to_req_indices"].long())),
    ErrorCase("block_table int64", "store", "block_table", _set("block_table", lambda c, x: c["block_table"].long())),
    ErrorCase("kv_slot_mapping shorter than positions", "store", "kv_slot_mapping", _set("kv_slot_mapping", lambda c, x: c["kv_slot_mapping"][:-1])),
    ErrorCase("block_table of rank 1", "store", "block_table", _set("block_table", lambda c, x: c["block_table"][0])),
    ErrorCase("state_cache float64", "store", "state_cache", _set("state_cache", lambda c, x: c["state_cache"].double())),
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
    ErrorCase("k_cache int8", "store", "k_cache", _set("k_cache", lambda c, x: c["k_cache"].view(x["torch"].int8))),
    ErrorCase("rms_norm_weight of 448", "store", "rms_norm_weight", _set("rms_norm_weight", lambda c, x: c["rms_norm_weight"][:448])),
    ErrorCase("rms_norm_weight float16", "store", "rms_norm_weight", _set("rms_norm_weight", lambda c, x: c["rms_norm_weight"].half())),
    ErrorCase("rms_norm_eps 0", "store", "rms_norm_eps", _set("rms_norm_eps", lambda c, x: 0.0)),
    ErrorCase("cos_sin_cache of width 32", "store", "cos_sin_cache", _set("cos_sin_cache", lambda c, x: c["cos_sin_cache"][:, :32])),
    ErrorCase("unknown layout", "store", "layout", _set("layout", lambda c, x: "fp8")),
    ErrorCase("fp8_scale for flashmla_fp8", "store", "fp8_scale", _set("fp8_scale", lambda c, x: 0.5)),
    ErrorCase("ape of the wrong ratio", "save", "ape", _set("ape", lambda c, x: c["ape"][:2])),
    ErrorCase("kv_score of the wrong width", "save", "kv_score", _set("kv_score", lambda c, x: c["kv_score"][:, :1024])),
    ErrorCase("kv_score of the wrong length", "save", "kv_score", _set("kv_score", lambda c, x: c["kv_score"][:-1])),
    ErrorCase("C128 ape with C4 projections", "save", "kv_score", _set("ape", lambda c, x: x["torch"].zeros((128, 512), dtype=x["torch"].float32, device=x["device"]))),
    ErrorCase("state_cache float64 for save", "save", "state_cache", _set("state_cache", lambda c, x: c["state_cache"].double())),
)


def run_error_case(impl: LoadedImplementation, case: ErrorCase, device: str | None = None) -> ErrorVerdict:
    """Call with the broken argument; pass iff ValueError names the argument and nothing changed."""
    device = device or impl.device()
    if device is None:
        return ErrorVerdict(case.name, impl.name, "skip", f"needs one of {impl.devices}")
    save, store, ctx = _valid_call(device)
    call = dict(save if case.operation == "save" else store)
    case.breaks(call, ctx)
    before = (ctx["state_owner"].cpu().clone(), ctx["k_owner"].cpu().clone())
    operation = impl.target.save_partial_states if case.operation == "save" else impl.target.compress_norm_rope_store
    positional = [k for k in call if k not in ("compress_ratio", "layout", "fp8_scale")]
    keywords = {k: call[k] for k in ("compress_ratio", "layout", "fp8_scale") if k in call}
    try:
        operation(*(call[k] for k in positional), **keywords)
    except ValueError as error:
        if device == "cuda":
            ctx["torch"].cuda.synchronize()
        unchanged = bool((ctx["state_owner"].cpu() == before[0]).all() and (ctx["k_owner"].cpu() == before[1]).all())
        if case.argument not in str(error):
            return ErrorVerdict(case.name, impl.name, "fail", f"ValueError does not name {case.argument!r}: {error}")
        if not unchanged:
            return ErrorVerdict(case.name, impl.name, "fail", "raised ValueError but wrote to the caches first")
        return ErrorVerdict(case.name, impl.name, "pass", str(error))
    except Exception as error:  # any other failure is the wrong contract
        return ErrorVerdict(case.name, impl.name, "fail", f"expected ValueError, got {type(error).__name__}: {error}"[:300])
    return ErrorVerdict(case.name, impl.name, "fail", "no error raised")
