"""GPU timing: input sets rotated past L2, CUDA events, eager calls and CUDA-graph replay.

- Every size gets enough input sets, used in rotation, that one pass over them touches at
  least :data:`ROTATION_BYTES` (2.5 times the H200's 50 MB L2), so no launch finds the rows it
  reads in L2 (:func:`rotation_sets`): up to four independent sets (state cache, metadata,
  compressed cache), and for small calls copies of them whose block tables point into further
  state blocks (the metadata, weights and compressed cache shared, as a serving step finds
  them hot in L2).
- *eager*: many back-to-back calls, timed with CUDA events around the loop (host launch
  overhead included when it exceeds the kernel time); the host time of the issuing loop is
  reported separately.
- *graph*: one CUDA graph holding many calls (cycling through the sets), replayed; the
  time per call is what a serving engine pays.
- Trials are repeated and implementations interleaved within each trial, so a drifting
  clock does not favour one; the median and the spread are reported.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..conformance.implementations import takes_keywords
from ..spec import batch as B
from ..spec.constants import HEAD_DIM
from ..spec.entry_layout import PAGED_LAYOUTS, RECORD_LAYOUTS
from .cases import Case


@dataclass
class InputSet:
    """The tensors of one call (on the GPU)."""

    args: tuple
    kwargs: dict
    workspace: torch.Tensor | None = None


@dataclass
class Prepared:
    case: Case
    sets: list[InputSet]
    bytes_moved: int
    num_active: int


def _device_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def record_cache(layout: str, num_pages: int, entries: int, device="cuda", *,
                 zeroed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_cache uint8 ``[pages, B, E]`` of a layout of E-byte records, its storage uint8
    ``[pages * page stride]``), the page stride as :func:`spec.batch.canary_k_cache` rounds it;
    zero-filled if ``zeroed``, else uninitialised."""
    entry = RECORD_LAYOUTS[layout].entry_bytes
    granule = 576 if layout == "flashmla_fp8" else 16  # the engines' round_up(B*584, 576); B*E to 16
    page_stride = -(-entries * entry // granule) * granule
    flat = (torch.zeros if zeroed else torch.empty)(num_pages * page_stride, dtype=torch.uint8, device=device)
    return torch.as_strided(flat, (num_pages, entries, entry), (page_stride, entry, 1)), flat


def _k_cache(layout: str, num_pages: int, entries: int, device: str = "cuda") -> torch.Tensor:
    if layout in PAGED_LAYOUTS:  # uint8 [pages, B, E]
        return record_cache(layout, num_pages, entries, device)[0]
    dtype = torch.bfloat16 if layout == "bf16" else torch.float8_e4m3fn
    return torch.empty((num_pages, entries, HEAD_DIM), dtype=dtype, device=device)


ROTATION_BYTES = 128 << 20  # bytes one pass over the input sets touches: 2.5 times the H200's 50 MB L2
MAX_SETS = 16384  # the smallest calls (one 8 KiB indexer window) reach ROTATION_BYTES here
INDEPENDENT_SETS = 4  # sets with their own batch (positions, requests, metadata); the others copy one


def rotation_sets(bytes_per_call: int, target: int = ROTATION_BYTES) -> int:
    """Input sets to rotate through so one pass touches at least ``target`` bytes (2 to
    :data:`MAX_SETS`; two at least, so consecutive calls never share their buffers)."""
    return max(2, min(MAX_SETS, -(-target // max(bytes_per_call, 1))))


def rotation_layout(bytes_per_set: int, num_sets: int | None = None) -> tuple[int, int, int]:
    """(sets, independent sets, copies of each, itself included): ``num_sets`` sets, by default
    :func:`rotation_sets` of ``bytes_per_set``; up to :data:`INDEPENDENT_SETS` of them independent."""
    count = rotation_sets(bytes_per_set) if num_sets is None else num_sets
    independent = min(count, INDEPENDENT_SETS)
    return count, independent, -(-count // independent)


def interleave(groups: list[list], count: int) -> list:
    """The first ``count`` sets taken round-robin across ``groups`` (each an independent set and its
    copies), so consecutive calls read other batches."""
    return [group[k] for k in range(len(groups[0])) for group in groups][:count]


def prepare(case: Case, num_sets: int | None = None, seed: int = 0) -> Prepared:
    """Build the input sets of ``case`` on the GPU: ``num_sets`` of them, by default
    :func:`rotation_sets` of the case's bytes. Up to :data:`INDEPENDENT_SETS` are independent
    batches; the rest copy them round-robin with fresh state rows (compress: the block table
    shifted into more state blocks of one larger cache; save: their own ``kv_score``)."""
    if num_sets is not None and num_sets < 1:
        raise ValueError(f"prepare: expected num_sets >= 1 or None, got {num_sets}")
    rng = np.random.default_rng(seed)
    first = case.batch(rng)
    count, independent, copies = rotation_layout(case.bytes_moved(first), num_sets)
    sets = []
    bytes_moved = num_active = 0
    for i in range(independent):
        batch = first if i == 0 else case.batch(rng)
        bytes_moved, num_active = case.bytes_moved(batch), batch.num_active
        sets.append(_input_sets(case, batch, rng, copies))
    torch.cuda.synchronize()
    return Prepared(case, interleave(sets, count), bytes_moved, num_active)


def _input_sets(case: Case, batch: B.Batch, rng: np.random.Generator, copies: int) -> list[InputSet]:
    """``copies`` input sets of one batch, each reading its own state rows."""
    width = case.config.state_row_width
    blocks = max(batch.num_state_blocks, 1)
    meta = {n: _device_tensor(getattr(batch, n)) for n in
            ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")}
    if case.operation == "save":  # each copy its own kv_score and state cache
        ape = torch.randn((case.compress_ratio, width // 2), device="cuda")
        return [InputSet((torch.randn((batch.num_tokens, width), device="cuda"), ape, meta["positions"],
                          meta["slot_mapping"], torch.randn((blocks, case.block_size, width), device="cuda"),
                          case.block_size), {})
                for _ in range(copies)]
    state = torch.randn((copies * blocks, case.block_size, width), device="cuda")  # copy k: blocks k*blocks ..
    weight = _device_tensor(B.random_norm_weight(rng, bf16=False, head_dim=case.head_dim))
    cos_sin = _device_tensor(B.rope_cos_sin_cache(int(batch.positions.max()) + 1))
    k_cache = _k_cache(case.layout, max(batch.num_pages, 1), case.entries_per_page)
    kwargs = {"compress_ratio": case.compress_ratio, "layout": case.layout,
              "fp8_scale": 0.05 if case.layout == "fp8_per_tensor" else None}
    if case.hadamard:
        kwargs["hadamard"] = True
    workspace = torch.empty((batch.num_tokens, HEAD_DIM), dtype=torch.float32, device="cuda")
    sets = []
    for k in range(copies):
        block_table = meta["block_table"] + k * blocks if k else meta["block_table"]
        args = (state, meta["token_to_req_indices"], meta["positions"], meta["slot_mapping"], block_table,
                case.block_size, weight, 1e-6, cos_sin, k_cache, meta["kv_slot_mapping"])
        sets.append(InputSet(args, kwargs, workspace))
    return sets


@dataclass
class BenchImpl:
    """A named way to run the two operations (an implementation, maybe with a forced path)."""

    name: str
    compress: Callable | None
    save: Callable | None
    c128_compress_only: bool = False  # a named variant: it differs from its implementation only on C128 compress
    indexer_compress_only: bool = False  # a named variant: it differs only on the indexer's compress (SPEC §12)
    prepare_calls: Callable | None = None  # Prepared -> {id(input set): its call, no arguments} (bound layers)

    def runs(self, case) -> bool:
        """Whether this row belongs in ``case`` (a variant elsewhere would time the same kernel again)."""
        if self.indexer_compress_only:
            return case.head_dim == 128 and case.operation == "compress"
        return not self.c128_compress_only or (case.compress_ratio == 128 and case.operation == "compress")

    def caller(self, prepared: Prepared) -> Callable[[InputSet], None]:
        if self.prepare_calls is not None:  # each set's call made beforehand: the loop times the call alone
            calls = self.prepare_calls(prepared)
            return lambda s: calls[id(s)]()
        if prepared.case.operation == "save":
            if self.save is None:
                raise NotImplementedError(f"{self.name} has no save_partial_states")
            return lambda s: self.save(*s.args)
        if self.compress is None:
            raise NotImplementedError(f"{self.name} has no compress_norm_rope_store")
        takes_workspace = takes_keywords(self.compress, "workspace")
        def call(s: InputSet) -> None:
            kwargs = dict(s.kwargs)
            if takes_workspace:
                kwargs["workspace"] = s.workspace
            self.compress(*s.args, **kwargs)

        return call


@dataclass
class Timing:
    median_us: float
    low_us: float
    high_us: float
    host_us: float | None = None  # eager only: host time to issue one call


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def time_eager(call: Callable, sets: list[InputSet], iters: int) -> tuple[float, float]:
    """(device-inclusive µs per call, host µs per call) over ``iters`` back-to-back calls."""
    start, end = _events()
    torch.cuda.synchronize()
    start.record()
    host_start = time.perf_counter()
    for i in range(iters):
        call(sets[i % len(sets)])
    host = (time.perf_counter() - host_start) / iters * 1e6
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters, host


def capture_graph(call: Callable, sets: list[InputSet], calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` calls cycling through the input sets."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch recommends
        for s in sets:
            call(s)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(sets[i % len(sets)])
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, calls: int, replays: int) -> float:
    """µs per call over ``replays`` replays of a graph holding ``calls`` calls."""
    start, end = _events()
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def summarize(samples: list[float], host: list[float] | None = None) -> Timing:
    return Timing(statistics.median(samples), min(samples), max(samples), statistics.median(host) if host else None)


def copy_bandwidth_gbs(nbytes: int = 1 << 30, trials: int = 10) -> float:
    """Device copy bandwidth (bytes read + written per second), the roofline we compare with."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    samples = []
    start, end = _events()
    for _ in range(trials):
        torch.cuda.synchronize()
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(2 * nbytes / (start.elapsed_time(end) * 1e-3) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(samples)
