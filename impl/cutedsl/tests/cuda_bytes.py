"""The indexer GPU tests' harness: NumPy arrays on CUDA with identical strides and padding, the
byte comparison of whole spans, and the metadata moves that a CUDA graph replay is checked with.

The other CuTe DSL GPU tests run on the conformance suite's buffers and runner
(:mod:`cutedsl_steps`), whose request mix this harness shares."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import torch

from cutedsl_steps import mixed_requests  # also the indexer tests' request mix

from dsv4_compressor.spec import batch as B

NP_TO_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
               np.dtype(np.uint8): torch.uint8, np.dtype(np.uint16): torch.bfloat16}


def span(a: np.ndarray) -> np.ndarray:
    """The bytes from ``a``'s first to its last element (padding between them included)."""
    extent = sum((n - 1) * s for n, s in zip(a.shape, a.strides)) + a.itemsize
    return np.ctypeslib.as_array((ctypes.c_uint8 * extent).from_address(a.__array_interface__["data"][0]))


def to_cuda(a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CUDA tensor with ``a``'s shape and strides over a copy of its whole span."""
    raw = torch.from_numpy(span(a).copy()).cuda()
    dtype = dtype or NP_TO_TORCH[a.dtype]
    return torch.as_strided(raw.view(dtype), a.shape, tuple(s // a.itemsize for s in a.strides))


def storage(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of ``t``'s whole storage (padding included), to snapshot and restore it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def span_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t``'s storage (created by :func:`to_cuda`: exactly its span)."""
    return storage(t).cpu().numpy()


def assert_same_bytes(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape, (name, got.shape, expected.shape)
    diff = np.flatnonzero(got != expected)
    assert diff.size == 0, f"{name}: {diff.size} bytes differ, first at byte {diff[0]}: got {got[diff[0]]}, expected {expected[diff[0]]}"


def cuda_args(batch, state, weight, cos_sin, k_cache, k_dtype: torch.dtype | None = None) -> dict:
    """``compress_norm_rope_store``'s tensor and metadata arguments (all but ratio and layout) on CUDA."""
    return dict(
        state_cache=to_cuda(state),
        token_to_req_indices=to_cuda(batch.token_to_req_indices),
        positions=to_cuda(batch.positions),
        slot_mapping=to_cuda(batch.slot_mapping),
        block_table=to_cuda(batch.block_table),
        block_size=batch.block_size,
        rms_norm_weight=to_cuda(weight),
        rms_norm_eps=1e-6,
        cos_sin_cache=to_cuda(cos_sin),
        k_cache=to_cuda(k_cache, k_dtype),
        kv_slot_mapping=to_cuda(batch.kv_slot_mapping),
    )


def move_metadata_in_place(args: dict, batch, state, entries_per_page: int):
    """New metadata for a graph replay: the same logical rows on relocated state blocks and other kv
    slots, copied into ``args``' CUDA tensors in place; returns the moved ``(batch, state)`` for the spec."""
    rng = np.random.default_rng(123)
    moved, moved_state = B.relocate_state_blocks(batch, state, rng)
    kv_slots = moved.kv_slot_mapping.copy()
    used = kv_slots >= 0
    kv_slots[used] = rng.permutation(batch.num_pages * entries_per_page)[: used.sum()]
    moved = replace(moved, kv_slot_mapping=kv_slots)
    for key, value in (("state_cache", moved_state), ("slot_mapping", moved.slot_mapping),
                       ("block_table", moved.block_table), ("kv_slot_mapping", moved.kv_slot_mapping)):
        args[key].copy_(to_cuda(value))
    return moved, moved_state


def capture_after_warm_up(call, args: dict, kwargs: dict) -> torch.cuda.CUDAGraph:
    """``call(**args, **kwargs)`` once eagerly (it compiles: no compile during capture), then captured."""
    call(**args, **kwargs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(**args, **kwargs)
    return graph


def replay_with_moved_metadata(graph, args: dict, batch, state, entries_per_page: int, k_clean: torch.Tensor):
    """:func:`move_metadata_in_place`, ``k_cache`` reset to ``k_clean``, then ``graph`` replayed;
    returns the moved ``(batch, state)`` for the spec."""
    moved, moved_state = move_metadata_in_place(args, batch, state, entries_per_page)
    args["k_cache"].copy_(k_clean)
    graph.replay()
    torch.cuda.synchronize()
    return moved, moved_state


def check_save_partial_states(ratio: int, block_size: int, misaligned: bool, head_dim: int) -> None:
    """The CuTe DSL ``save_partial_states`` writes the spec's bytes into a padded state cache
    (padding untouched); ``misaligned``: rows of kv_score not 16-byte aligned (the scalar-load variant)."""
    from dsv4_compressor import spec
    from dsv4_compressor.impl import cutedsl

    rng = np.random.default_rng(7)
    batch = B.build_batch(mixed_requests(ratio, rng), compress_ratio=ratio, block_size=block_size, entries_per_page=4,
                          rng=rng, num_padding=2, padding_at_end=False, unsaved_fraction=0.1)
    state = B.random_state_cache(batch.num_state_blocks, block_size, ratio, rng, row_pad=8, block_pad_rows=2,
                                 head_dim=head_dim)
    kv = B.random_kv_score(batch.num_tokens, ratio, rng, head_dim=head_dim)
    if misaligned:
        kv = B.padded_view(kv.shape, np.float32, (0, 1), np.float32(0))[...]
        kv[...] = B.random_kv_score(batch.num_tokens, ratio, rng, head_dim=head_dim)
    ape = B.random_ape(ratio, rng, head_dim=head_dim)
    spec_state = B.padded_view(state.shape, np.float32, (0, 2, 8), np.float32(np.nan))
    span(spec_state)[...] = span(state)
    spec.save_partial_states(kv, ape, batch.positions, batch.slot_mapping, spec_state, block_size, debug=True)
    state_t = to_cuda(state)
    cutedsl.save_partial_states(to_cuda(kv), to_cuda(ape), to_cuda(batch.positions), to_cuda(batch.slot_mapping),
                                state_t, block_size)
    torch.cuda.synchronize()
    assert_same_bytes("state_cache", span_bytes(state_t), span(spec_state).copy())
