"""The CPU tests of the public CuTe DSL wrappers: their arguments (a small spec batch on CPU
tensors), a fixture that fails a test when anything reaches the compiler, and one that fails it
when a bound call takes the validated path; the broken arguments of a bound layer's save (CPU and
GPU tests of the bound layers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsv4_compressor.impl.cutedsl import api
from dsv4_compressor.impl.cutedsl.host import compile_cache
from dsv4_compressor.spec import batch as B


def wrapper_arguments(compress_ratio: int, block_size: int, layout: str, entries: int, head_dim: int) -> dict:
    """``compress_norm_rope_store``'s tensor and metadata arguments (all but ratio and layout) for one
    request of 4 tokens, on CPU; the cache is typed as the layout wants it (bf16, E4M3 or bytes)."""
    rng = np.random.default_rng(0)
    b = B.build_batch([B.Request(context_len=2 * compress_ratio - 3, num_tokens=4)], compress_ratio=compress_ratio,
                      block_size=block_size, entries_per_page=entries, rng=rng)
    state = B.random_state_cache(b.num_state_blocks, block_size, compress_ratio, rng, head_dim=head_dim)
    k_cache = torch.from_numpy(np.ascontiguousarray(B.canary_k_cache(layout, b.num_pages, entries)))
    if layout == "bf16":
        k_cache = k_cache.view(torch.bfloat16)
    elif layout == "fp8_per_tensor":
        k_cache = k_cache.view(torch.float8_e4m3fn)
    return dict(
        state_cache=torch.from_numpy(np.ascontiguousarray(state)),
        token_to_req_indices=torch.from_numpy(b.token_to_req_indices),
        positions=torch.from_numpy(b.positions),
        slot_mapping=torch.from_numpy(b.slot_mapping),
        block_table=torch.from_numpy(b.block_table),
        block_size=block_size,
        rms_norm_weight=torch.ones(head_dim, dtype=torch.bfloat16),
        rms_norm_eps=1e-6,
        cos_sin_cache=torch.from_numpy(B.rope_cos_sin_cache(1024)),
        k_cache=k_cache,
        kv_slot_mapping=torch.from_numpy(b.kv_slot_mapping),
    )


@pytest.fixture
def no_compile(monkeypatch):
    """Fail the test if anything reaches the compiler (every kernel family, the indexer's included)."""
    def refuse(*args, **kwargs):
        raise AssertionError("compiled before rejecting the call")
    monkeypatch.setattr(compile_cache, "compile_kernel", refuse)


def strided(t: torch.Tensor, step: int = 2) -> torch.Tensor:
    """The same values, every ``step``-th element of a larger buffer on ``t``'s device (last stride ``step``)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] * step, dtype=t.dtype, device=t.device)
    wide[..., ::step] = t
    return wide[..., ::step]


def unsigned(t: torch.Tensor) -> torch.Tensor:
    """The same bits as uint32 / uint64 (TVM-FFI alone takes them for int32 / int64)."""
    return t.view(torch.uint32 if t.dtype == torch.int32 else torch.uint64)


# A bound layer's save_partial_states with one argument broken: (change(kv_score, ape, positions,
# slot_mapping) -> the call's arguments, the ValueError's start); each test adds its device's cases.
BAD_SAVES = [
    (lambda kv, ape, pos, slots: (kv, ape, unsigned(pos), slots), "positions: expected dtype int64"),
    (lambda kv, ape, pos, slots: (kv, ape, pos, unsigned(slots)), "slot_mapping: expected dtype int64"),
    (lambda kv, ape, pos, slots: (kv, ape, pos, slots[:-1]), "slot_mapping: expected length T"),
    (lambda kv, ape, pos, slots: (kv[:-1], ape, pos, slots), "kv_score: expected shape\\[0\\] = T"),
    (lambda kv, ape, pos, slots: (kv[:, :-4], ape, pos, slots), "kv_score: expected shape\\[1\\]"),
    (lambda kv, ape, pos, slots: (kv.double(), ape, pos, slots), "kv_score: expected dtype float32"),
    (lambda kv, ape, pos, slots: (kv.bfloat16(), ape, pos, slots), "kv_score: expected dtype float32"),
    (lambda kv, ape, pos, slots: (kv, ape[:, :-4], pos, slots), "ape: expected shape\\[1\\]"),
    (lambda kv, ape, pos, slots: (kv, ape[:4], pos, slots), "ape: expected shape\\[1\\]"),
    (lambda kv, ape, pos, slots: (strided(kv), ape, pos, slots), "kv_score: expected last stride 1"),
    (lambda kv, ape, pos, slots: (kv, ape, strided(pos), slots), "positions: expected last stride 1"),
]


@pytest.fixture
def unvalidated(monkeypatch):
    """``unvalidated()``: from then on, a bound call that reaches the validated path fails."""
    def switch_on():
        def fail(*args, **kwargs):
            raise AssertionError("the call took the validated path")
        monkeypatch.setattr(api.BoundLayer, "_compress_plan", fail)
        monkeypatch.setattr(api.BoundLayer, "_save_plan", fail)
    return switch_on
