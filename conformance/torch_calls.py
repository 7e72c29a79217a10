"""The torch references' calls: what a call's state options, row source and store are, and
SPEC §9's checks (with §13's) of their torch arguments.

The checks are ``spec.validation``'s, on ``impl.frontend``'s descriptions of torch tensors, for
both head widths and both state dtypes, made in the order the spec makes them, so a torch
reference rejects exactly the calls the spec rejects, with the same messages. Nothing here
computes: the arithmetic lives in :mod:`.torch_reference`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..impl.frontend import describe_torch
from ..spec.validation import (
    CompressCall, SaveCall, StepCall, StoreCall, check_compress, check_save_arrays, check_step, check_store_arrays,
)

HEAD_DIMS = (512, 128)  # SPEC §1 and the indexer's (§12)
STATE_DTYPES = ("float32", "bfloat16")  # SPEC §13.1


@dataclass(frozen=True)
class StateOptions:
    """SPEC §13.2-§13.3 options of one call (the state dtype is the state tensor's)."""

    ape: torch.Tensor | None  # fp32 [r, SW]; None where nothing adds it
    ape_at: str = "save"  # "save": the save adds ape; "compress": pooling adds it to every row it reads
    ring_capacity: int | None = None  # None: paged; C: a ring of C rows per request


@dataclass(frozen=True)
class ChunkRows:
    """SPEC §13.4: the step call's own rows, read in place of the state's at or after a chunk's start."""

    kv: torch.Tensor  # fp32 [T, SW]
    score: torch.Tensor  # fp32 [T, SW], raw (no ape)
    positions: torch.Tensor  # int64 [T]
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]: each request's first token


@dataclass(frozen=True)
class RowSource:
    """Where pooling reads a window's rows: the state (paged or a ring) and, for the step call, the chunk."""

    state_cache: torch.Tensor  # fp32 or bf16 [num_state_blocks, bs, 2*SW]
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    block_size: int  # bs
    options: StateOptions
    chunk: ChunkRows | None = None


@dataclass(frozen=True)
class StoreArgs:
    """SPEC §6-§7 (§12) inputs of the store: the post-processing and the destination cache."""

    rms_norm_weight: torch.Tensor  # fp32 or bf16 [H]
    rms_norm_eps: float
    cos_sin_cache: torch.Tensor  # fp32 [max_pos, 64]
    k_cache: torch.Tensor  # the layout's cache, written in place
    layout: str
    fp8_scale: float | None
    hadamard: bool = False


def _described(name: str, tensor):
    return None if tensor is None else describe_torch(name, tensor)


def check_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, options: StateOptions) -> SaveCall:
    """SPEC §4/§9/§13 checks of ``save_partial_states`` (``ape`` may be None with ``ape_at="compress"``)."""
    return check_save_arrays(describe_torch, kv_score, ape, positions, slot_mapping, state_cache, block_size,
                             head_dims=HEAD_DIMS, ape_at=options.ape_at, ring_capacity=options.ring_capacity,
                             state_dtypes=STATE_DTYPES)


def check_pooling(state_cache, token_to_req, positions, slot_mapping, block_table, block_size, kv_slot_mapping,
                  compress_ratio, options: StateOptions, token_name: str = "token_to_req_indices") -> CompressCall:
    """SPEC §3/§9/§13 checks of the pooling arguments; ``token_name`` is the request array's name in
    the operation checked (``token_to_req`` in ``compress_and_save``)."""
    return check_compress(
        describe_torch("state_cache", state_cache), describe_torch(token_name, token_to_req),
        describe_torch("positions", positions), describe_torch("slot_mapping", slot_mapping),
        describe_torch("block_table", block_table), block_size, describe_torch("kv_slot_mapping", kv_slot_mapping),
        compress_ratio, head_dims=HEAD_DIMS, ape=_described("ape", options.ape), ape_at=options.ape_at,
        ring_capacity=options.ring_capacity, state_dtypes=STATE_DTYPES)


def check_step_inputs(kv, score, ape, query_start_loc, save_slot_mapping, block_table, pooling: CompressCall) -> StepCall:
    """SPEC §9/§13.4 checks of what ``compress_and_save`` adds to the pooling and store arguments."""
    return check_step(describe_torch("kv", kv), describe_torch("score", score), _described("ape", ape),
                      describe_torch("query_start_loc", query_start_loc),
                      describe_torch("save_slot_mapping", save_slot_mapping), describe_torch("block_table", block_table),
                      pooling.config, pooling.num_tokens)


def check_store_args(store: StoreArgs, state_cache, head_dim: int) -> StoreCall:
    """SPEC §6/§7/§9/§12 checks of the store's arguments (``head_dim`` from the pooling checks)."""
    return check_store_arrays(describe_torch, store.rms_norm_weight, store.rms_norm_eps, store.cos_sin_cache,
                              store.k_cache, store.layout, store.fp8_scale, state_cache, head_dim=head_dim,
                              hadamard=store.hadamard)
