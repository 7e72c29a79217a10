"""The CPU tests of the public CuTe DSL wrappers: their arguments (a small spec batch on CPU
tensors), a fixture that fails a test when anything reaches the compiler, and one that fails it
when a bound call takes the validated path (CPU and GPU tests of the bound layers)."""

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


@pytest.fixture
def unvalidated(monkeypatch):
    """``unvalidated()``: from then on, a bound call that reaches the validated path fails."""
    def switch_on():
        def fail(*args, **kwargs):
            raise AssertionError("the call took the validated path")
        monkeypatch.setattr(api.BoundLayer, "_compress_plan", fail)
        monkeypatch.setattr(api.BoundLayer, "_save_plan", fail)
    return switch_on
