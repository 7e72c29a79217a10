"""Scenarios for the Triton tests: NumPy buffers from ``spec.batch``, their torch twins, and
byte-for-byte comparison of whole buffers (padding included).

Every buffer is built once in NumPy (padded strides and canary bytes included). The spec runs
on one copy, the Triton implementation on a torch twin of another copy with the *same
allocation layout* (the conformance suite's :class:`~dsv4_compressor.conformance.buffers.Buffer`),
so comparing the two whole allocations byte by byte also catches writes into padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

@dataclass
class Scenario:
    """One call's arguments as NumPy arrays (the spec's view of them)."""

    batch: spec_batch.Batch
    state_cache: np.ndarray
    weight: np.ndarray  # float32 [H] or uint16 bf16 patterns (H = 512, or 128 for the indexer)
    cos_sin: np.ndarray
    k_cache: np.ndarray
    layout: str
    eps: float = 1e-6
    fp8_scale: float | None = None
    hadamard: bool = False  # indexer layouts only
    notes: dict = field(default_factory=dict)

    @property
    def ratio(self) -> int:
        return self.batch.compress_ratio


def build_scenario(
    requests: list[Request], *, ratio: int, block_size: int, entries_per_page: int, layout: str, seed: int,
    bf16_weight: bool = False, row_pad: int = 0, block_pad_rows: int = 0, page_pad_bytes: int = 0,
    num_padding: int = 0, padding_at_end: bool = True, drop_entry_fraction: float = 0.0, unsaved_fraction: float = 0.0,
    fp8_scale: float | None = None, eps: float = 1e-6, cos_sin_row_pad: int = 0, head_dim: int = 512,
    hadamard: bool = False,
) -> Scenario:
    rng = np.random.default_rng(seed)
    batch = spec_batch.build_batch(
        requests, compress_ratio=ratio, block_size=block_size, entries_per_page=entries_per_page, rng=rng,
        num_padding=num_padding, padding_at_end=padding_at_end, drop_entry_fraction=drop_entry_fraction,
        unsaved_fraction=unsaved_fraction,
    )
    state = spec_batch.random_state_cache(batch.num_state_blocks, block_size, ratio, rng, row_pad=row_pad,
                                          block_pad_rows=block_pad_rows, head_dim=head_dim)
    max_pos = int(batch.positions.max()) + ratio + 1
    cos_sin_table = spec_batch.rope_cos_sin_cache(max_pos)
    cos_sin = spec_batch.padded_view(cos_sin_table.shape, np.float32, (0, cos_sin_row_pad), np.float32(np.nan))
    cos_sin[...] = cos_sin_table
    weight = spec_batch.random_norm_weight(rng, bf16=bf16_weight, head_dim=head_dim)
    k_cache = spec_batch.canary_k_cache(layout, batch.num_pages, entries_per_page, page_pad_bytes=page_pad_bytes)
    if layout == "fp8_per_tensor" and fp8_scale is None:
        fp8_scale = 0.0123
    return Scenario(batch=batch, state_cache=state, weight=weight, cos_sin=cos_sin, k_cache=k_cache, layout=layout,
                    eps=eps, fp8_scale=fp8_scale, hadamard=hadamard)


def torch_arguments(scenario: Scenario, device: str) -> tuple[dict, dict]:
    """The Triton call's positional arguments (by name) as torch tensors on ``device``, and the whole
    allocations (uint8 tensors) behind ``state_cache`` and ``k_cache``."""
    b = scenario.batch
    cache_dtype = {"flashmla_fp8": "uint8", "bf16": "bfloat16", "fp8_per_tensor": "float8_e4m3fn", "indexer_fp8": "uint8",
                   "indexer_mxfp4": "uint8"}[scenario.layout]
    state_raw, state = Buffer.of(scenario.state_cache).torch_copy(device)
    cache_raw, cache = Buffer.of(scenario.k_cache, cache_dtype).torch_copy(device)
    _, cos_sin = Buffer.of(scenario.cos_sin).torch_copy(device)
    _, weight = Buffer.of(scenario.weight).torch_copy(device)  # uint16 patterns become bfloat16
    _, block_table = Buffer.of(b.block_table).torch_copy(device)
    token = {name: torch.from_numpy(getattr(b, name).copy()).to(device)
             for name in ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping")}
    args = dict(
        state_cache=state, token_to_req_indices=token["token_to_req_indices"], positions=token["positions"],
        slot_mapping=token["slot_mapping"], block_table=block_table, block_size=b.block_size, rms_norm_weight=weight,
        rms_norm_eps=scenario.eps, cos_sin_cache=cos_sin, k_cache=cache, kv_slot_mapping=token["kv_slot_mapping"],
    )
    return args, {"state_cache": state_raw, "k_cache": cache_raw}


def run_spec_and_triton(scenario: Scenario, device: str, *, config=None, debug: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run the spec and the Triton implementation from identical buffers.

    Returns ``{name: (spec bytes, triton bytes)}`` of the whole allocations of ``k_cache`` and
    ``state_cache`` after the call.
    """
    from dsv4_compressor import spec
    from dsv4_compressor.impl import triton as triton_impl

    b = scenario.batch
    state_owner, spec_state = Buffer.of(scenario.state_cache).numpy_copy()
    cache_owner, spec_cache = Buffer.of(scenario.k_cache).numpy_copy()
    spec.compress_norm_rope_store(
        spec_state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
        scenario.weight, scenario.eps, scenario.cos_sin, spec_cache, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=scenario.layout, fp8_scale=scenario.fp8_scale, hadamard=scenario.hadamard,
    )
    args, raw = torch_arguments(scenario, device)
    triton_impl.compress_norm_rope_store(
        *args.values(), compress_ratio=b.compress_ratio, layout=scenario.layout, fp8_scale=scenario.fp8_scale,
        hadamard=scenario.hadamard, config=config, debug=debug,
    )
    return {
        "k_cache": (cache_owner, raw["k_cache"].cpu().numpy()),
        "state_cache": (state_owner, raw["state_cache"].cpu().numpy()),
    }


def first_difference(expected: np.ndarray, actual: np.ndarray) -> str:
    """Where a kernel's allocation bytes first depart from the spec's (``"identical"`` where they do not)."""
    diff = np.flatnonzero(expected != actual)
    if diff.size == 0:
        return "identical"
    i = int(diff[0])
    return f"{diff.size} differing bytes; first at byte {i}: spec 0x{expected[i]:02x}, kernel 0x{actual[i]:02x}"


def assert_identical(results: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """``results``: ``{buffer name: (the spec's allocation bytes, a kernel's)}``, equal byte for byte."""
    for name, (expected, actual) in results.items():
        assert expected.shape == actual.shape, f"{name}: allocation sizes differ"
        assert np.array_equal(expected, actual), f"{name}: {first_difference(expected, actual)}"


def state_row(scenario: Scenario, request: int, position: int) -> np.ndarray:
    """The state-cache row (float32 [2*SW], a view) that holds ``position`` of ``request``."""
    b = scenario.batch
    block = b.block_table[request, position // b.block_size]
    return scenario.state_cache[block, position % b.block_size]
