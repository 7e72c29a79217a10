"""vLLM 0.33.0's DeepSeek-V4.1 compressor entry points, keyword for keyword, on this project's kernels.

vLLM's V4.1 compressor layer makes up to four calls per layer and step: ``fused_save_compress_norm``
(pool, norm, the bf16 latent, ratio 2's ring saved), ``save_ring_rows`` (prefill context
parallelism only), ``rope_quant_insert`` (RoPE and the compressed-cache record) and, for layers
that own an indexer, ``indexer_k_norm_rope_store`` on ``k_pre = wk(latent)``. The functions here
take exactly vLLM's parameters and call SPEC §14.7's operations in
:mod:`dsv4_compressor.impl.triton`, the family vLLM's own V4.1 kernels belong to (on a CPU tensor
Triton's interpreter runs them; the CuTe DSL family's ``cutedsl.v41_*`` take the same §14.7
arguments). The bytes written are the spec's (docs/SPEC.md §14), which differ
from vLLM's own kernels where SPEC §14.10 says. :func:`fused_save_compress_norm_rope_quant_insert`
replaces the first and third call with one launch.

How vLLM's conventions map onto §14.7 (docs/engine.md has the whole table):

- ``kv_score`` fp32 ``[T, 512 * r]`` -> ``kv = kv_score[:, :512]``, ``score = kv_score[:, 512:]``
  (views; ratio 1 has no score). ``T = slot_mapping.numel()``: ``kv_score``, ``positions``,
  ``latent_out`` and ``token_to_req_indices`` may be longer (buffers sized for a CUDA graph) and
  are cut to ``T`` rows (views).
- Ratio 2's state is one ring block of ``C = state_cache.shape[1]`` rows per request and
  ``slot_mapping[t] = block * C + p % C`` (``-1``: no ring block). Hence ``bs = ring_capacity = C``,
  ``block_table[req, 0] = slot_mapping[query_start_loc[req]] // C`` and, as vLLM saves each chunk's
  last ``min(n, C)`` rows inside the compress, ``save_slot_mapping`` is ``slot_mapping`` on those
  tokens of every request whose first token has a ring slot, ``-1`` elsewhere. These are derived on
  the device (no host synchronization).
- vLLM's compress writes the latent of every boundary token with a ring slot (ratio 2) or a
  compressed-cache slot (ratio 1, whose ``slot_mapping`` is that cache's). §14.3 also asks for a
  compressed-cache slot; the compress alone passes ``slot_mapping`` as ``kv_slot_mapping`` so
  both rules name the same tokens.
- ``prev_rows`` / ``prev_row_indices`` (prefill context parallelism: the row before a chunk's
  first token gathered from another rank, the ring left to ``save_ring_rows``): each such row is
  saved first into its ring slot ``block * C + (p - 1) % C``, then the compress reads it from the
  state as §13.4 says, and no chunk tail is saved. The latent is the one vLLM's pooling of
  ``prev_rows[prev_row_indices[req]]`` defines; the ring holds that row in one slot more than
  vLLM's does, a slot no later step reads before overwriting it.
- ``save_ring_rows(rows, slot_mapping, state_cache)``: §14.3's save of ``rows`` at those slots
  (a ratio-2 compress in which no token is active).
- ``rope_quant_insert``: the record from ``kv_cache``: uint8 of width 584 ``flashmla_fp8``, 528
  ``v41_mxfp8``, 288 ``v41_nvfp4``; bf16 rows ``bf16``; float8_e4m3fn rows ``fp8_per_tensor``,
  whose ``fp8_scale`` (one fp32 element) is read on the host (a device sync: not capturable in a
  CUDA graph; pass a Python float there). ``fp8_scale`` is ignored for the other records, as vLLM does.
- ``indexer_k_norm_rope_store``: ``use_fp4_cache`` -> ``indexer_mxfp4`` (68 B), else
  ``indexer_fp8`` (132 B, §12's binary32 scale; vLLM's Blackwell variant with four UE8M0 bytes and
  ROCm's tiled layout are not written here).

Errors: ``ValueError`` naming the argument, what was expected and what was given, raised before
anything is written; where vLLM only asserts, the check here is the spec's (§14.8) or this
module's. Ratio 1 with a ``state_cache`` or ``prev_rows`` is refused (§14.8), where vLLM ignores them.
"""

from __future__ import annotations

import torch

from ..impl.v41_frontend import V41StateArguments, validate_v41_compress_norm
from ..spec.constants import HEAD_DIM, INDEXER_HEAD_DIM
from .vllm import _backend, _expect, _first_rows, _per_token

__all__ = [
    "fused_save_compress_norm",
    "save_ring_rows",
    "rope_quant_insert",
    "indexer_k_norm_rope_store",
    "fused_save_compress_norm_rope_quant_insert",
]

ROW = 2 * HEAD_DIM  # a ratio-2 state row: kv then the raw score
# vLLM chooses the record by the cache's dtype (and, for uint8 pages, the record width in bytes)
RECORD_BY_WIDTH = {584: "flashmla_fp8", 528: "v41_mxfp8", 288: "v41_nvfp4"}
ROW_RECORDS = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8_per_tensor"}


# ---- argument checks ---------------------------------------------------------------------------------
def _check_ratio(compress_ratio: int) -> int:
    if compress_ratio not in (1, 2) or isinstance(compress_ratio, bool):
        raise ValueError(f"compress_ratio: expected 1 or 2 (DeepSeek-V4.1's compressors), got {compress_ratio!r}")
    return compress_ratio


def _num_tokens(name: str, slot_mapping: torch.Tensor) -> int:  # slot_mapping: int64 [T]
    """``T``: the entries of the 1-D int64 slot tensor vLLM sizes every call by."""
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dim() != 1 or slot_mapping.dtype != torch.int64:
        given = f"{slot_mapping.dtype} {list(slot_mapping.shape)}" if isinstance(slot_mapping, torch.Tensor) else type(slot_mapping).__name__
        raise ValueError(f"{name}: expected a 1-D int64 tensor, got {given}")
    return slot_mapping.shape[0]


def _rows(
    name: str,
    tensor: torch.Tensor,  # any dtype [>= count, width]
    count: int,
    width: int,
) -> torch.Tensor:
    """The first ``count`` rows of a 2-D ``[>= count, width]`` tensor (a view, or itself)."""
    if tensor.dim() != 2 or tensor.shape[1] != width or tensor.shape[0] < count:
        raise ValueError(f"{name}: expected a 2-D tensor [>= {count}, {width}], got shape {list(tensor.shape)}")
    return _first_rows(tensor, count)


def _split_kv_score(
    kv_score: torch.Tensor,  # fp32 or bf16 [>= T, 512 * r]
    ratio: int,
    count: int,  # T
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``kv`` and ``score`` ``[T, 512]`` as views of ``kv_score`` ``[>= T, 512 * r]`` (score ``None`` for ratio 1)."""
    rows = _rows("kv_score", kv_score, count, HEAD_DIM * ratio)
    if ratio == 1:
        return rows, None
    return rows[:, :HEAD_DIM], rows[:, HEAD_DIM:]


def _check_state_given(ratio: int, state_cache, prev_rows) -> None:
    if ratio == 1:
        for name, given in (("state_cache", state_cache), ("prev_rows", prev_rows)):
            if given is not None:
                raise ValueError(f"{name}: expected None for compress_ratio 1 (no state, SPEC §14.8), got a tensor")
        return
    if not isinstance(state_cache, torch.Tensor) or state_cache.dim() != 3 or state_cache.shape[2] != ROW:
        given = list(state_cache.shape) if isinstance(state_cache, torch.Tensor) else state_cache
        raise ValueError(f"state_cache: expected a ring [num_blocks, C, {ROW}] for compress_ratio 2, got {given}")


def _check_request_tensors(query_start_loc, token_to_req_indices, count: int) -> None:
    if not isinstance(query_start_loc, torch.Tensor) or query_start_loc.dim() != 1 or query_start_loc.shape[0] < 1 \
            or query_start_loc.dtype != torch.int32:
        given = (f"{query_start_loc.dtype} {list(query_start_loc.shape)}" if isinstance(query_start_loc, torch.Tensor)
                 else query_start_loc)
        raise ValueError(f"query_start_loc: expected a 1-D int32 tensor [num_reqs + 1] for compress_ratio 2, got {given}")
    if not isinstance(token_to_req_indices, torch.Tensor):
        raise ValueError(f"token_to_req_indices: expected an int32 tensor [>= {count}] for compress_ratio 2, got None")
    _per_token("token_to_req_indices", token_to_req_indices, count)


def _check_prev_rows(prev_rows, prev_row_indices, num_reqs: int) -> None:
    if prev_rows is None:
        if prev_row_indices is not None:
            raise ValueError("prev_row_indices: expected None without prev_rows, got a tensor")
        return
    if prev_rows.dim() != 2 or prev_rows.shape[1] != ROW or prev_rows.shape[0] < 1:
        raise ValueError(f"prev_rows: expected a 2-D tensor [rows >= 1, {ROW}] (kv then score), got {list(prev_rows.shape)}")
    if not isinstance(prev_row_indices, torch.Tensor) or prev_row_indices.dim() != 1 or prev_row_indices.shape[0] < num_reqs:
        given = list(prev_row_indices.shape) if isinstance(prev_row_indices, torch.Tensor) else prev_row_indices
        raise ValueError(f"prev_row_indices: expected a 1-D tensor of at least num_reqs = {num_reqs} entries, got {given}")


def _record_layout(kv_cache: torch.Tensor) -> str:  # kv_cache: uint8 [pages, B, E] or bf16 / float8_e4m3fn [pages, B, 512]
    """vLLM's choice of record from the cache tensor (SPEC §14.5's names)."""
    if kv_cache.dtype == torch.uint8 and kv_cache.dim() == 3 and kv_cache.shape[2] in RECORD_BY_WIDTH:
        return RECORD_BY_WIDTH[kv_cache.shape[2]]
    if kv_cache.dtype in ROW_RECORDS:
        return ROW_RECORDS[kv_cache.dtype]
    raise ValueError(f"kv_cache: expected uint8 pages of 584, 528 or 288-byte records, or bfloat16 / float8_e4m3fn rows "
                     f"of 512, got {kv_cache.dtype} {list(kv_cache.shape)}")


def _host_scale(fp8_scale, layout: str) -> float | None:
    """``fp8_per_tensor``'s dequantization scale as a Python float (vLLM requires one); ``None`` for other records."""
    if layout != "fp8_per_tensor":
        return None
    if fp8_scale is None:
        raise ValueError("fp8_scale: expected one fp32 element for a float8_e4m3fn kv_cache, got None")
    if isinstance(fp8_scale, torch.Tensor):
        _expect("fp8_scale", fp8_scale.numel(), 1, "elements of the per-tensor scale")
        return float(fp8_scale.item())  # a device sync when the tensor lives on the GPU
    return float(fp8_scale)


# ---- ratio 2's ring, as SPEC §13.3 / §13.4 arguments -------------------------------------------------------
def _ring_block_table(
    slot_mapping: torch.Tensor,  # int64 [T]: ring slots, -1 = none
    query_start_loc: torch.Tensor,  # int32 [num_reqs + 1]
    capacity: int,  # C
) -> torch.Tensor:
    """int32 ``[num_reqs, 1]``: each request's ring block, read off its first token's slot (0 where it has none)."""
    count = slot_mapping.shape[0]
    if query_start_loc.shape[0] == 1:  # no request: one row nothing reads
        return torch.zeros((1, 1), dtype=torch.int32, device=slot_mapping.device)
    first = slot_mapping[query_start_loc[:-1].long().clamp(max=count - 1)]
    return torch.where(first >= 0, first // capacity, 0).to(torch.int32).unsqueeze(1)


def _tail_saves(
    slot_mapping: torch.Tensor,  # int64 [T]: ring slots, -1 = none
    query_start_loc: torch.Tensor,  # int32 [num_reqs + 1]
    token_to_req: torch.Tensor,  # int32 [T]
    capacity: int,  # C
) -> torch.Tensor:
    """int64 ``[T]``: vLLM's ring saves as a ``save_slot_mapping``: ``slot_mapping`` on each request's last
    ``min(n, C)`` tokens when its first token has a ring slot, ``-1`` elsewhere (padding included)."""
    count, num_reqs = slot_mapping.shape[0], query_start_loc.shape[0] - 1
    if num_reqs == 0:
        return torch.full_like(slot_mapping, -1)
    starts = query_start_loc.long()
    token = torch.arange(count, device=slot_mapping.device)
    req = token_to_req.long().clamp(0, max(num_reqs - 1, 0))
    first_has_slot = slot_mapping[starts[req].clamp(max=count - 1)] >= 0
    keep = (token < starts[num_reqs]) & (token >= starts[req + 1] - capacity) & first_has_slot
    return torch.where(keep, slot_mapping, -1)


def _predecessor_saves(
    prev_rows: torch.Tensor,  # fp32 [rows, 1024]
    prev_row_indices: torch.Tensor,  # int [>= num_reqs]: -1 = the ring
    positions: torch.Tensor,  # int64 [T]
    slot_mapping: torch.Tensor,  # int64 [T]: ring slots
    query_start_loc: torch.Tensor,  # int32 [num_reqs + 1]
    capacity: int,  # C
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``[num_reqs, 1024]`` and ring slots ``[num_reqs]`` (``-1``: none) of the gathered
    predecessors: ``prev_rows[prev_row_indices[req]]`` at ``block * C + (p - 1) % C`` for every
    request whose chunk starts at an odd position with a ring slot and has such a row."""
    count, num_reqs = slot_mapping.shape[0], query_start_loc.shape[0] - 1
    starts, ends = query_start_loc[:-1].long(), query_start_loc[1:].long()
    first = starts.clamp(max=count - 1)
    slot, position = slot_mapping[first], positions[first]
    index = prev_row_indices[:num_reqs].long()
    wanted = (ends > starts) & (slot >= 0) & (position % 2 == 1) & (index >= 0)
    ring_slot = slot - slot % capacity + (position - 1) % capacity
    rows = prev_rows[index.clamp(0, prev_rows.shape[0] - 1)]
    return rows, torch.where(wanted, ring_slot, -1)


def _save_rows(
    rows: torch.Tensor,  # fp32 or bf16 [n, 1024]: kv then score
    slots: torch.Tensor,  # int64 [n]: ring slots, -1 = skipped
    state_cache: torch.Tensor,  # fp32 or bf16 [num_blocks, C, 1024], written in place
) -> None:
    """SPEC §14.3's save of ``rows`` ``[n, 1024]`` at ring ``slots`` ``[n]`` (-1: skipped): a ratio-2
    compress whose tokens are all inactive (no state slot, no cache slot), so only the save writes."""
    backend = _backend("triton")

    count, device, capacity = rows.shape[0], rows.device, state_cache.shape[1]
    none = torch.full((count,), -1, dtype=torch.int64, device=device)
    backend.v41_compress_norm(
        rows[:, :HEAD_DIM], rows[:, HEAD_DIM:], torch.zeros(count, dtype=torch.int64, device=device),
        torch.zeros(count, dtype=torch.int32, device=device),
        torch.arange(0, 2 * count, count, dtype=torch.int32, device=device)[:2], none, slots,
        torch.zeros((1, 1), dtype=torch.int32, device=device), capacity, state_cache,
        torch.zeros(HEAD_DIM, dtype=torch.float32, device=device), 1e-6, none,
        torch.empty((count, HEAD_DIM), dtype=torch.bfloat16, device=device), compress_ratio=2, ring_capacity=capacity,
    )


NO_STATE = V41StateArguments(None, None, None, None, None, None, None)  # ratio 1


def _state_arguments(
    ratio: int,
    state_cache: torch.Tensor | None,  # fp32 [num_blocks, C, 1024] (ratio 2)
    slot_mapping: torch.Tensor,  # int64 [T]
    query_start_loc: torch.Tensor | None,  # int32 [num_reqs + 1] (ratio 2)
    token_to_req_indices: torch.Tensor | None,  # int32 [>= T] (ratio 2)
    save: bool,
) -> V41StateArguments:
    """The §14.7 state arguments of a compress from vLLM's (none for ratio 1); ``save``: vLLM's
    tail saves, else none (``prev_rows`` leaves the ring to ``save_ring_rows``)."""
    if ratio == 1:
        return NO_STATE
    count, capacity = slot_mapping.shape[0], state_cache.shape[1]
    token_to_req = _first_rows(token_to_req_indices, count)
    saves = (_tail_saves(slot_mapping, query_start_loc, token_to_req, capacity) if save
             else torch.full_like(slot_mapping, -1))
    return V41StateArguments(token_to_req, query_start_loc, slot_mapping, saves,
                             _ring_block_table(slot_mapping, query_start_loc, capacity), capacity, state_cache, capacity)


# ---- vLLM's entry points -----------------------------------------------------------------------------------
def fused_save_compress_norm(
    kv_score: torch.Tensor,  # fp32 (or bf16) [>= T, 512 * r]: kv, then (ratio 2) the raw score
    positions: torch.Tensor,  # int64 [>= T]
    state_cache: torch.Tensor | None,  # fp32 [num_blocks, C, 1024]: one ring block per request (ratio 2); None (ratio 1)
    slot_mapping: torch.Tensor,  # int64 [T]: ring slots block*C + p % C (ratio 2) or compressed-cache slots (ratio 1); -1 = none
    query_start_loc: torch.Tensor | None,  # int32 [num_reqs + 1] (ratio 2)
    token_to_req_indices: torch.Tensor | None,  # int32 [>= T] (ratio 2)
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
    rms_norm_eps: float,
    compress_ratio: int,  # 1 or 2
    latent_out: torch.Tensor,  # bf16 [>= T, 512], written at the active tokens' rows
    prev_rows: torch.Tensor | None = None,  # fp32 [rows, 1024]: rows gathered across prefill-context-parallel ranks (ratio 2)
    prev_row_indices: torch.Tensor | None = None,  # int [>= num_reqs]: row of prev_rows before each chunk, -1 = the ring
) -> None:
    """vLLM's ``fused_save_compress_norm`` on SPEC §14.3 (Triton's ``v41_compress_norm``, one launch;
    with ``prev_rows``, one save launch before it)."""
    backend = _backend("triton")

    ratio = _check_ratio(compress_ratio)
    count = _num_tokens("slot_mapping", slot_mapping)
    _check_state_given(ratio, state_cache, prev_rows)
    kv, score = _split_kv_score(kv_score, ratio, count)
    positions, latent = _per_token("positions", positions, count), _rows("latent_out", latent_out, count, HEAD_DIM)
    if ratio == 2:
        _check_request_tensors(query_start_loc, token_to_req_indices, count)
        _check_prev_rows(prev_rows, prev_row_indices, query_start_loc.shape[0] - 1)
    if count == 0:
        return
    state = _state_arguments(ratio, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
                             save=prev_rows is None)
    if prev_rows is not None:  # every check of the compress before the save writes anything
        validate_v41_compress_norm(kv, score, positions, state, rms_norm_weight, rms_norm_eps, slot_mapping, latent,
                                   compress_ratio=ratio)
        rows, slots = _predecessor_saves(prev_rows, prev_row_indices, positions, slot_mapping, query_start_loc,
                                         state_cache.shape[1])
        _save_rows(rows, slots, state_cache)
    backend.v41_compress_norm(kv, score, positions, state.token_to_req, state.query_start_loc, state.slot_mapping,
                              state.save_slot_mapping, state.block_table, state.bs, state.state_cache, rms_norm_weight,
                              rms_norm_eps, slot_mapping, latent, compress_ratio=ratio, ring_capacity=state.ring_capacity)


def save_ring_rows(
    rows: torch.Tensor,  # fp32 [n, 1024]: kv then score
    slot_mapping: torch.Tensor,  # int64 [n]: ring slot of each row, -1 = skipped
    state_cache: torch.Tensor,  # fp32 [num_blocks, C, 1024], written in place
) -> None:
    """vLLM's ``save_ring_rows`` on SPEC §14.3's save (one launch of Triton's ``v41_compress_norm``)."""
    count = _num_tokens("slot_mapping", slot_mapping)
    _rows("rows", rows, count, ROW)
    _expect("rows", rows.shape[0], count, "one row per slot_mapping entry")
    _check_state_given(2, state_cache, None)
    if count:
        _save_rows(rows, slot_mapping, state_cache)


def rope_quant_insert(
    latent: torch.Tensor,  # bf16 [>= T, 512]: read at the storing tokens' rows
    positions: torch.Tensor,  # int64 [>= T]
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]: cos then sin
    kv_cache: torch.Tensor,  # uint8 [pages, B, 584 | 528 | 288], bf16 [pages, B, 512] or float8_e4m3fn [pages, B, 512]
    slot_mapping: torch.Tensor,  # int64 [T]: compressed-cache slots, -1 = none
    compress_ratio: int,  # 1 or 2
    fp8_scale: torch.Tensor | float | None = None,  # float8_e4m3fn rows only: stored = e4m3(x / fp8_scale)
) -> None:
    """vLLM's ``rope_quant_insert`` on SPEC §14.4-§14.5 (Triton's ``v41_rope_quant_store``, one launch)."""
    backend = _backend("triton")

    ratio = _check_ratio(compress_ratio)
    count = _num_tokens("slot_mapping", slot_mapping)
    layout = _record_layout(kv_cache)
    scale = _host_scale(fp8_scale, layout)
    latent, positions = _rows("latent", latent, count, HEAD_DIM), _per_token("positions", positions, count)
    if count:
        backend.v41_rope_quant_store(latent, positions, slot_mapping, cos_sin_cache, kv_cache, compress_ratio=ratio,
                                     layout=layout, fp8_scale=scale)


def indexer_k_norm_rope_store(
    k_pre: torch.Tensor,  # bf16 [>= T, 128]: wk(latent)
    positions: torch.Tensor,  # int64 [>= T]
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [128]
    rms_norm_eps: float,
    k_cache: torch.Tensor,  # uint8 [pages, B, 68] (use_fp4_cache) or [pages, B, 132]
    kv_slot_mapping: torch.Tensor,  # int64 [T]: indexer-cache slots, -1 = none
    compress_ratio: int,  # 1 or 2
    use_fp4_cache: bool,  # indexer_mxfp4 when True, else indexer_fp8
) -> None:
    """vLLM's ``indexer_k_norm_rope_store`` on SPEC §14.6 (Triton's ``v41_index_key_store``, one launch)."""
    backend = _backend("triton")

    ratio = _check_ratio(compress_ratio)
    count = _num_tokens("kv_slot_mapping", kv_slot_mapping)
    k_pre, positions = _rows("k_pre", k_pre, count, INDEXER_HEAD_DIM), _per_token("positions", positions, count)
    if count:
        backend.v41_index_key_store(k_pre, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps, cos_sin_cache,
                                    k_cache, compress_ratio=ratio,
                                    layout="indexer_mxfp4" if use_fp4_cache else "indexer_fp8")


# ---- the fused entry ----------------------------------------------------------------------------------------
def fused_save_compress_norm_rope_quant_insert(
    kv_score: torch.Tensor,  # fp32 (or bf16) [>= T, 512 * r]
    positions: torch.Tensor,  # int64 [>= T]
    state_cache: torch.Tensor | None,  # fp32 [num_blocks, C, 1024] (ratio 2); None (ratio 1)
    slot_mapping: torch.Tensor,  # int64 [T]: ring slots (ratio 2); ratio 1: vLLM passes the compressed-cache slots (not read)
    query_start_loc: torch.Tensor | None,  # int32 [num_reqs + 1] (ratio 2)
    token_to_req_indices: torch.Tensor | None,  # int32 [>= T] (ratio 2)
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
    rms_norm_eps: float,
    compress_ratio: int,  # 1 or 2
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    kv_cache: torch.Tensor,  # as for rope_quant_insert, written in place
    kv_slot_mapping: torch.Tensor,  # int64 [>= T]: compressed-cache slots (the k-cache metadata's), -1 = none
    latent_out: torch.Tensor | None = None,  # bf16 [>= T, 512], or None: no latent written
    fp8_scale: torch.Tensor | float | None = None,  # float8_e4m3fn rows only
) -> None:
    """``fused_save_compress_norm`` then ``rope_quant_insert`` in ONE launch (Triton's
    ``v41_compress_norm_rope_store``): pool, norm, the bf16 latent, RoPE, the record, ratio 2's
    ring tail saved last. A token writes its latent row and record when it is active in §14.3's
    sense: a boundary with a compressed-cache slot and (ratio 2) a ring slot. Wherever the pair's
    result is defined (the record of a token whose latent the compress wrote) the bytes are the
    pair's. Prefill context parallelism (``prev_rows``) takes the pair."""
    backend = _backend("triton")

    ratio = _check_ratio(compress_ratio)
    count = _num_tokens("slot_mapping", slot_mapping)
    _check_state_given(ratio, state_cache, None)
    kv, score = _split_kv_score(kv_score, ratio, count)
    positions, kv_slots = _per_token("positions", positions, count), _per_token("kv_slot_mapping", kv_slot_mapping, count)
    latent = None if latent_out is None else _rows("latent_out", latent_out, count, HEAD_DIM)
    layout = _record_layout(kv_cache)
    scale = _host_scale(fp8_scale, layout)
    if ratio == 2:
        _check_request_tensors(query_start_loc, token_to_req_indices, count)
    if count == 0:
        return
    state = _state_arguments(ratio, state_cache, slot_mapping, query_start_loc, token_to_req_indices, save=True)
    backend.v41_compress_norm_rope_store(
        kv, score, positions, state.token_to_req, state.query_start_loc, state.slot_mapping, state.save_slot_mapping,
        state.block_table, state.bs, state.state_cache, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache, kv_slots,
        latent, compress_ratio=ratio, layout=layout, ring_capacity=state.ring_capacity, fp8_scale=scale)
