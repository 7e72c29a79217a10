"""vLLM's newer DeepSeek V4 compressor call (the C128 ring state), keyword for keyword, on SPEC §13.

vLLM's newer compressor module keeps each request's C128 state as a ring of
``C = 128·⌈(128 + S)/128⌉`` rows (``S`` speculative tokens; :func:`c128_ring_capacity`), one
state block of ``C`` rows per request (its ``block_size`` is ``C``). A step then runs in this
order:

1. the compressor call, with the keywords of :mod:`.vllm`'s entry points plus ``kv=``,
   ``score=``, ``ape=``, ``query_start_loc=`` and ``is_circular=`` (and, in later vLLM,
   ``int8_ds_mla=``). With ``is_circular=True`` the window rows of the current chunk are read
   straight from ``kv``/``score`` (with ``ape`` added), earlier rows from the ring, and nothing
   is saved; ``slot_mapping`` holds each token's ring slot (``-1``: padding);
2. ``save_partial_states`` with ``slot_mapping=tail_slot_mapping``: the ring slots of the last
   ``C`` tokens of each request's chunk, ``-1`` for the others.

With ``is_circular=False`` (a paged state, C4) the state was saved before the call and the
call is the older one: ``kv``, ``score``, ``ape`` and ``query_start_loc`` are checked and not
read.

How that maps onto SPEC §13 (docs/engine.md has the whole table):

- ``is_circular=True`` -> ``compress_and_save(kv, score, ape, ..., slot_mapping,
  save_slot_mapping=<all -1>, ..., ring_capacity=C, ape_at="save")`` on an fp32 state: the
  compress of §13.4 with no save; the tail save that follows is :func:`save_partial_states`
  (vLLM's Triton save, re-exported from :mod:`.vllm`). The two together are §13.4's step
  with ``save_slot_mapping = tail_slot_mapping``.
- ``C`` is ``block_size`` (vLLM's one-block ring); an engine whose ring spans several blocks
  passes ``ring_capacity=`` (an addition to vLLM's keywords).
- ``is_circular=False`` -> ``compress_norm_rope_store`` as in :mod:`.vllm`.

:func:`compress_norm_rope_store_cutedsl` with ``is_circular=True`` runs the CuTe DSL family's
``compress_and_save`` on every step, and :func:`compress_norm_rope_store_triton` the Triton
family's: the same bytes either way. Everything is validated before anything is
launched; ``ValueError`` names the argument.
"""

from __future__ import annotations

from typing import Any

import torch

from ..spec.constants import ratio_config
from .vllm import (_backend, _check_fixed, _check_ratio, _expect, _first_rows, _host_scale, _store_layout,
                   _token_views, save_partial_states, save_partial_states_cutedsl)

__all__ = [
    "c128_ring_capacity",
    "compress_norm_rope_store_triton",
    "compress_norm_rope_store_cutedsl",
    "save_partial_states",
    "save_partial_states_cutedsl",
]

C128 = 128


def c128_ring_capacity(num_speculative_tokens: int) -> int:
    """Rows of vLLM's C128 ring for ``S`` speculative tokens: ``128·⌈(128 + S)/128⌉``, the
    smallest multiple of 128 that holds a window and a verify group's rejected drafts
    (SPEC §13.3: ``k`` rejected drafts need ``k <= C - W + 1``)."""
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 0:
        raise ValueError(f"num_speculative_tokens: expected an integer >= 0, got {num_speculative_tokens!r}")
    return C128 * -(-(C128 + num_speculative_tokens) // C128)


def _projection(
    name: str,
    tensor: torch.Tensor | None,  # fp32 or bf16 [>= num_actual, SW]: kv or score
    num_actual: int,
    state_width: int,  # SW
) -> torch.Tensor:
    """``kv`` or ``score`` cut to ``num_actual`` rows, fp32 (bf16 is widened exactly)."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor [T, {state_width}] with is_circular=True, got {type(tensor).__name__}")
    if tensor.dim() != 2 or tensor.shape[1] != state_width or tensor.shape[0] < num_actual:
        raise ValueError(f"{name}: expected shape [>= num_actual = {num_actual}, {state_width}] (state_width), "
                         f"got {list(tensor.shape)}")
    if tensor.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"{name}: expected dtype float32 or bfloat16, got {tensor.dtype}")
    return _first_rows(tensor, num_actual).float()  # itself when already fp32 and num_actual rows long


def _query_start_loc(query_start_loc: torch.Tensor | None) -> torch.Tensor:  # int32 [num_reqs + 1]
    if not isinstance(query_start_loc, torch.Tensor) or query_start_loc.dim() != 1:
        shape = list(query_start_loc.shape) if isinstance(query_start_loc, torch.Tensor) else type(query_start_loc).__name__
        raise ValueError(f"query_start_loc: expected an int32 tensor [num_reqs + 1] with is_circular=True, got {shape}")
    return query_start_loc


def _capacity(ring_capacity: int | None, block_size: int, compress_ratio: int) -> int:
    """The ring's rows: ``ring_capacity``, or ``block_size`` (vLLM's one-block ring), at least ``W``."""
    window = ratio_config(compress_ratio).window
    if ring_capacity is None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < window:
            raise ValueError(f"block_size: expected the ring's capacity C >= W = {window} with is_circular=True "
                             f"(vLLM keeps the ring in one block of C rows; pass ring_capacity= for a ring of "
                             f"several blocks), got {block_size!r}")
        return block_size
    return ring_capacity  # checked by the kernels' validation (a multiple of block_size, at least W)


def _check_paged_inputs(
    kv: torch.Tensor | None,  # fp32 or bf16 [>= num_actual, SW]
    score: torch.Tensor | None,  # fp32 or bf16 [>= num_actual, SW]
    ape: torch.Tensor | None,  # fp32 [r, SW]
    query_start_loc: torch.Tensor | None,  # int32 [num_reqs + 1]
    num_actual: int,
    state_width: int,  # SW
) -> None:
    """With ``is_circular=False`` the state holds every row: the extra inputs are checked, not read."""
    for name, tensor in (("kv", kv), ("score", score)):
        if tensor is not None:
            _projection(name, tensor, num_actual, state_width)
    if ape is not None and (not isinstance(ape, torch.Tensor) or ape.dim() != 2 or ape.shape[1] != state_width):
        raise ValueError(f"ape: expected a tensor [r, {state_width}], got "
                         f"{list(ape.shape) if isinstance(ape, torch.Tensor) else type(ape).__name__}")
    if query_start_loc is not None:
        _query_start_loc(query_start_loc)


def _compress(
    backend_name: str,  # "triton" or "cutedsl": the kernels of a paged call
    tensors: dict[str, Any],  # the call's tensors by vLLM's names
    scalars: dict[str, Any],  # block_size, state_width, compress_ratio, rms_norm_eps, num_actual
    layout: str,  # the store layout (SPEC §7)
    fp8_scale: float | None,
    is_circular: bool,
    ring_capacity: int | None,
) -> None:
    """Validate, then run one compressor call on ``backend_name``'s kernels: the ring step
    (``compress_and_save``) or the paged compress."""
    t, s = tensors, scalars
    num_actual, state_width, ratio = s["num_actual"], s["state_width"], s["compress_ratio"]
    _check_ratio(ratio, state_width, t["state_cache"], s["overlap"])
    token_to_req, positions, slots, kv_slots = _token_views(
        num_actual, t["k_cache_metadata"], t["token_to_req_indices"], t["positions"], t["slot_mapping"])
    if not isinstance(is_circular, bool):
        raise ValueError(f"is_circular: expected True (a ring state) or False (a paged one), got {is_circular!r}")
    backend = _backend(backend_name)
    if not is_circular:
        _check_paged_inputs(t["kv"], t["score"], t["ape"], t["query_start_loc"], num_actual, state_width)
        backend.compress_norm_rope_store(
            t["state_cache"], token_to_req, positions, slots, t["block_table"], s["block_size"], t["rms_norm_weight"],
            s["rms_norm_eps"], t["cos_sin_cache"], t["kv_cache"], kv_slots, compress_ratio=ratio, layout=layout,
            fp8_scale=fp8_scale)
        return
    kv = _projection("kv", t["kv"], num_actual, state_width)
    score = _projection("score", t["score"], num_actual, state_width)
    query_start_loc = _query_start_loc(t["query_start_loc"])
    capacity = _capacity(ring_capacity, s["block_size"], ratio)
    no_saves = torch.full_like(slots, -1)  # the tail is saved by the save_partial_states call that follows
    backend.compress_and_save(
        kv, score, t["ape"], positions, token_to_req, query_start_loc, slots, no_saves, t["block_table"],
        s["block_size"], t["state_cache"], t["rms_norm_weight"], s["rms_norm_eps"], t["cos_sin_cache"], t["kv_cache"],
        kv_slots, compress_ratio=ratio, layout=layout, fp8_scale=fp8_scale, ape_at="save", ring_capacity=capacity)


_TENSORS = ("state_cache", "token_to_req_indices", "positions", "slot_mapping", "block_table", "cos_sin_cache",
            "kv_cache", "k_cache_metadata", "rms_norm_weight", "kv", "score", "ape", "query_start_loc")
_SCALARS = ("num_actual", "block_size", "state_width", "compress_ratio", "overlap", "rms_norm_eps")


def _compress_call(backend_name: str, call: dict[str, Any], layout: str, fp8_scale: float | None) -> None:
    """An entry point's call (its parameters by vLLM's names): the fixed shapes checked, then
    :func:`_compress`."""
    c = call
    _check_fixed(c["head_dim"], c["rope_head_dim"], c["quant_block"], c["token_stride"], c["scale_dim"],
                 c["use_fp4_cache"])
    _expect("int8_ds_mla", bool(c["int8_ds_mla"]), False, "the int8 cache layout is not one of SPEC §7's")
    _compress(backend_name, {n: c[n] for n in _TENSORS}, {n: c[n] for n in _SCALARS}, layout, fp8_scale,
              c["is_circular"], c["ring_capacity"])


def compress_norm_rope_store_triton(
    state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW]; a ring: [blocks, C, 2*SW] (bs = C)
    num_actual: int,  # T: tokens of this step
    token_to_req_indices: torch.Tensor,  # int32 [>= T]
    positions: torch.Tensor,  # int64 [>= T]
    slot_mapping: torch.Tensor,  # int64 [>= T]: state slot (a ring: the ring slot), -1 = padding
    block_table: torch.Tensor,  # int32 [num_reqs, max_blocks]; a ring: column 0 is the request's ring block
    block_size: int,  # bs (a one-block ring: C)
    state_width: int,  # SW
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    kv_cache: torch.Tensor,  # uint8 [num_pages, B, 584] (FlashMLA fp8 pages)
    k_cache_metadata: Any,  # .slot_mapping: int64 [>= T], -1 = no entry
    pdl_kwargs: dict,  # ignored
    head_dim: int,  # 512
    rope_head_dim: int,  # 64
    compress_ratio: int,  # 4 or 128
    overlap: bool,  # compress_ratio == 4
    use_fp4_cache: bool,  # False
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
    rms_norm_eps: float,
    quant_block: int,  # 64
    token_stride: int,  # 576
    scale_dim: int,  # 8
    int8_ds_mla: bool = False,  # not a layout of SPEC §7: True is refused
    kv: torch.Tensor | None = None,  # fp32 or bf16 [>= T, SW]: this step's kv projections
    score: torch.Tensor | None = None,  # fp32 or bf16 [>= T, SW]: this step's raw scores (no ape)
    ape: torch.Tensor | None = None,  # fp32 [r, SW]
    query_start_loc: torch.Tensor | None = None,  # int32 [num_reqs + 1]: first token of each request's chunk
    is_circular: bool = False,  # True: the state is a ring and this chunk's rows come from kv/score
    *,
    ring_capacity: int | None = None,  # C when the ring spans several blocks (default: block_size)
) -> None:
    """vLLM's newer ``compress_norm_rope_store_triton`` call on this project's Triton kernels
    (SPEC §5-§7, §13.3, §13.4): with ``is_circular=True`` the compress of ``compress_and_save``
    on a ring of ``C`` rows, saving nothing (vLLM saves the tail afterwards)."""
    _compress_call("triton", locals(), "flashmla_fp8", None)


def compress_norm_rope_store_cutedsl(
    state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW]; a ring: [blocks, C, 2*SW] (bs = C)
    num_actual: int,
    token_to_req_indices: torch.Tensor,  # int32 [>= T]
    positions: torch.Tensor,  # int64 [>= T]
    slot_mapping: torch.Tensor,  # int64 [>= T]: state slot (a ring: the ring slot), -1 = padding
    block_table: torch.Tensor,  # int32 [num_reqs, max_blocks]; a ring: column 0 is the request's ring block
    block_size: int,  # bs (a one-block ring: C)
    state_width: int,
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    kv_cache: torch.Tensor,  # uint8 [pages, B, 584]; bf16 [pages, B, 512] (store_full_kv); float8_e4m3fn (store_full_fp8)
    k_cache_metadata: Any,  # .slot_mapping: int64 [>= T]
    pdl_kwargs: dict,  # ignored
    head_dim: int,
    rope_head_dim: int,
    compress_ratio: int,
    overlap: bool,
    use_fp4_cache: bool,
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
    rms_norm_eps: float,
    quant_block: int,
    token_stride: int,
    scale_dim: int,
    int8_ds_mla: bool = False,  # not a layout of SPEC §7: True is refused
    kv: torch.Tensor | None = None,  # fp32 or bf16 [>= T, SW]
    score: torch.Tensor | None = None,  # fp32 or bf16 [>= T, SW], without ape
    ape: torch.Tensor | None = None,  # fp32 [r, SW]
    query_start_loc: torch.Tensor | None = None,  # int32 [num_reqs + 1]
    is_circular: bool = False,
    store_full_kv: bool = False,
    store_full_fp8: bool = False,
    fp8_scale: torch.Tensor | float | None = None,  # dequantization scale: stored = e4m3(x / fp8_scale)
    *,
    ring_capacity: int | None = None,  # C when the ring spans several blocks (default: block_size)
) -> None:
    """vLLM's newer CuTe DSL compressor call (``kv=``, ``score=``, ``ape=``, ``query_start_loc=``,
    ``is_circular=``) on the CuTe DSL kernels: a paged call's compress, or a ring's
    (``is_circular=True``) ``compress_and_save`` (SPEC §13.4)."""
    layout = _store_layout(store_full_kv, store_full_fp8)
    _compress_call("cutedsl", locals(), layout, _host_scale(fp8_scale, layout))
