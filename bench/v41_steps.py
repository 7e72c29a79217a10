"""Benchmarks of DeepSeek-V4.1's compressors (SPEC §14): the one-launch
``v41_compress_norm_rope_store`` beside the two calls (``v41_compress_norm`` then
``v41_rope_quant_store``) and beside any implementation of SPEC §14.7 named ``module:attribute``,
and ``v41_index_key_store``; each beside its floor (:mod:`.step_floor`: kv / score read once, the
latent and the record written once).

Cases (:class:`V41Case`), ratio 1 and 2, kv / score fp32 or bf16 (one ``[T, 1024]`` buffer, score
right after kv in each row), a ring state of one block of 8 rows per request (``bs = C = 8``,
vLLM's without drafts; SPEC §14.2) in fp32, a bf16 latent ``[T, 512]`` without padding, the
record ``flashmla_fp8`` by default:

- the sweeps (:func:`sweeps`): 1 … 16384 tokens, one per request, every one a boundary (ratio 2:
  its earlier row from the state);
- the steps (:func:`steps`): a decode step (512 tokens at random positions), a 16384-token
  prefill chunk, and a mixed step (a 4096-token chunk and 512 decode tokens);
- the index key (:func:`index_key_sweeps`): the sweep's tokens through ``v41_index_key_store``.

The metadata is built as an engine builds it (:mod:`..spec.v41_batch`'s rules: ring slots, each
chunk's last ``C`` tokens saved), with each boundary token's entry on a shuffled page of a cache
holding just this step's entries.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, replace

import numpy as np

from ..spec import batch as B
from ..spec.constants import HEAD_DIM, INDEXER_HEAD_DIM, V41_STATE_ROW_WIDTH
from ..spec.entry_layout import INDEXER_LAYOUTS, RECORD_LAYOUTS
from ..spec.pooling import is_boundary
from ..spec.v41_batch import V41Step, vllm_ring
from .cases import C4_SWEEP
from .step_floor import FloorPlan, FloorShape, floor_launcher, record_offsets, window_runs
from .step_runner import StepPrepared, checked_first
from .sweep import RowLabel

V41_SWEEP = C4_SWEEP  # 1, 2, 4, ..., 16384 tokens
RING = vllm_ring(0)  # one block of C = 8 rows per request (bs = C)
ENTRIES_PER_PAGE = 64
RMS_NORM_EPS = 1e-6
INPUT_DTYPES = ("fp32", "bf16")
MAX_CONTEXT = 8192  # decode tokens sit at positions below this


@dataclass(frozen=True)
class V41Case:
    """One V4.1 step."""

    name: str  # the table, e.g. "v41_r2_decode"
    ratio: int  # 1 or 2
    kind: str  # "decode" (every token a boundary), "decode_step", "prefill" or "mixed"
    token_num: int
    input_dtype: str = "fp32"  # kv / score (compress), or "bf16" (k_pre of the index key)
    operation: str = "compress"  # or "index_key"
    layout: str = "flashmla_fp8"  # the record (compress) or the index key's layout
    decode_tokens: int = 512  # mixed: decode tokens beside the chunk

    def __post_init__(self):
        for field, value, allowed in (("ratio", self.ratio, (1, 2)), ("input_dtype", self.input_dtype, INPUT_DTYPES),
                                      ("kind", self.kind, ("decode", "decode_step", "prefill", "mixed")),
                                      ("operation", self.operation, ("compress", "index_key"))):
            if value not in allowed:
                raise ValueError(f"V41Case.{field}: expected one of {allowed}, got {value!r}")
        layouts = INDEXER_LAYOUTS if self.operation == "index_key" else tuple(RECORD_LAYOUTS)
        if self.layout not in layouts:
            raise ValueError(f"V41Case.layout: expected one of {tuple(layouts)} for {self.operation}, got {self.layout!r}")
        if self.kind == "mixed" and not 0 < self.decode_tokens < self.token_num:
            raise ValueError(f"V41Case.decode_tokens: expected 1..{self.token_num - 1}, got {self.decode_tokens}")

    @property
    def variant(self) -> str:
        return self.layout if self.operation == "index_key" else f"{self.input_dtype} kv/score"

    def requests(self, rng: np.random.Generator) -> list[B.Request]:
        r = self.ratio
        if self.kind == "decode":  # each request's one token closes a group
            return [B.Request(int(p), 1) for p in r * rng.integers(0, MAX_CONTEXT // r, size=self.token_num) + r - 1]
        decode = [B.Request(int(p), 1) for p in rng.integers(0, MAX_CONTEXT, size=self.token_num if self.kind ==
                                                             "decode_step" else self.decode_tokens)]
        if self.kind == "decode_step":
            return decode
        chunk = B.Request(2 * int(rng.integers(0, 4)), self.token_num - (self.decode_tokens if self.kind == "mixed" else 0))
        if self.kind == "prefill":
            return [chunk]
        mixed = decode + [chunk]
        return [mixed[i] for i in rng.permutation(len(mixed))]

    def step(self, rng: np.random.Generator) -> tuple[V41Step, np.ndarray, int]:
        """The step's metadata, its state block table (int32 ``[num_reqs, 1]``: one ring block each,
        shuffled) and the pages its entries need."""
        requests = self.requests(rng)
        starts = B.query_start_loc(requests)
        token_to_req = np.repeat(np.arange(len(requests), dtype=np.int32), np.diff(starts))
        positions = np.concatenate([np.arange(q.context_len, q.context_len + q.num_tokens, dtype=np.int64)
                                    for q in requests])
        block_table = rng.permutation(len(requests)).astype(np.int32)[:, None]
        slots = B.ring_slots(block_table, token_to_req, positions, RING.ring_capacity, RING.block_size)
        boundary = is_boundary(positions, self.ratio)
        entries = int(boundary.sum())
        kv_slots = np.full(positions.shape, -1, dtype=np.int64)
        kv_slots[boundary] = rng.permutation(entries)  # each entry somewhere in pages holding just this step's
        step = V41Step(positions=positions, token_to_req=token_to_req, query_start_loc=starts, slot_mapping=slots,
                       save_slot_mapping=B.tail_saves(slots, starts, RING.ring_capacity), kv_slot_mapping=kv_slots)
        return step, block_table, max(1, -(-entries // ENTRIES_PER_PAGE))

    def active(self, step: V41Step) -> np.ndarray:
        """SPEC §14.3's activity rule (the index key's: a boundary with a cache slot)."""
        active = is_boundary(step.positions, self.ratio) & (step.kv_slot_mapping >= 0)
        return active & (step.slot_mapping >= 0) if self.ratio == 2 and self.operation == "compress" else active

    def dry_run_version(self) -> "V41Case":
        sizes = {"decode": 3, "decode_step": 8, "prefill": 16, "mixed": 24}
        return replace(self, token_num=sizes[self.kind], decode_tokens=8)


def sweeps(ratios=(1, 2), sizes=V41_SWEEP, input_dtypes=INPUT_DTYPES, layout="flashmla_fp8") -> list[V41Case]:
    return [V41Case(f"v41_r{r}_decode", r, "decode", n, d, layout=layout) for r in ratios for n in sizes
            for d in input_dtypes]


def steps(ratios=(1, 2), input_dtypes=INPUT_DTYPES, layout="flashmla_fp8") -> list[V41Case]:
    shapes = (("decode_step", 512), ("prefill", 16384), ("mixed", 4096 + 512))
    return [V41Case(f"v41_r{r}_{kind}", r, kind, n, d, layout=layout) for r in ratios for kind, n in shapes
            for d in input_dtypes]


def index_key_sweeps(ratios=(1, 2), sizes=V41_SWEEP, layouts=INDEXER_LAYOUTS) -> list[V41Case]:
    return [V41Case(f"v41_r{r}_index_key", r, "decode", n, "bf16", "index_key", layout) for r in ratios for n in sizes
            for layout in layouts]


# ---- input sets ----------------------------------------------------------------------------------------
def _floor_plan(case: V41Case, step: V41Step, block_table: np.ndarray, state_strides, page_stride: int) -> FloorPlan:
    active = case.active(step)
    entry_bytes = RECORD_LAYOUTS[case.layout].entry_bytes
    entries = record_offsets(step.kv_slot_mapping, active, ENTRIES_PER_PAGE, page_stride, entry_bytes)
    none = np.full(step.num_tokens, -1, dtype=np.int64)
    if case.operation == "index_key":
        shape = FloorShape(INDEXER_HEAD_DIM, INDEXER_HEAD_DIM, True, False, False, 1, entry_bytes, False)
        return FloorPlan(shape, none, entries, np.zeros(0, dtype=np.int64))
    ratio2 = case.ratio == 2
    shape = FloorShape(HEAD_DIM, HEAD_DIM, case.input_dtype == "bf16", ratio2, False, 2, entry_bytes, True)
    if not ratio2:
        return FloorPlan(shape, none, entries, np.zeros(0, dtype=np.int64))
    starts = step.positions[step.query_start_loc[step.token_to_req]]
    runs = window_runs(step.positions, step.token_to_req, active, starts, window=2, ratio=2, head_dim=HEAD_DIM,
                       block_table=block_table, block_size=RING.block_size, ring_capacity=RING.ring_capacity,
                       strides=state_strides)
    return FloorPlan(shape, step.save_slot_mapping, entries, runs)


def _batch_sets(case: V41Case, drawn: tuple, copies: int, device) -> tuple[list, int, int]:
    """``copies`` input sets of one step (``drawn``: :meth:`V41Case.step`'s; each set its own
    inputs, latent and state block; weights, cos/sin and the cache shared), the bytes it must move
    and its active token count."""
    import torch

    from .timing import record_cache

    step, block_table, num_pages = drawn
    tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    dtype = torch.bfloat16 if case.input_dtype == "bf16" else torch.float32
    blocks, bs = block_table.shape[0], RING.block_size
    state = torch.randn((copies * blocks, bs, V41_STATE_ROW_WIDTH), device=device) if case.ratio == 2 else None
    strides = (state.stride(0), state.stride(1)) if state is not None else (0, 0)
    k_cache, cache_bytes = record_cache(case.layout, num_pages, ENTRIES_PER_PAGE, device, zeroed=True)
    plan = _floor_plan(case, step, block_table, strides, k_cache.stride(0))
    head = INDEXER_HEAD_DIM if case.operation == "index_key" else HEAD_DIM
    shared = dict(positions=tensor(step.positions), token_to_req=tensor(step.token_to_req),
                  query_start_loc=tensor(step.query_start_loc), kv_slot_mapping=tensor(step.kv_slot_mapping),
                  state=state, k_cache=k_cache,
                  weight=(1 + 0.25 * torch.randn(head, device=device)).to(torch.bfloat16),
                  cos_sin=tensor(B.rope_cos_sin_cache(int(step.positions.max()) + 1)))
    sets = []
    for k in range(copies):
        s = dict(shared, block_table=tensor(block_table + k * blocks),
                 slot_mapping=tensor(np.where(step.slot_mapping >= 0, step.slot_mapping + k * blocks * bs, -1)),
                 save_slot_mapping=tensor(np.where(step.save_slot_mapping >= 0, step.save_slot_mapping + k * blocks * bs,
                                                   -1)))
        if case.operation == "index_key":
            s["k_pre"] = torch.randn((step.num_tokens, INDEXER_HEAD_DIM), device=device).to(torch.bfloat16)
            floor_tensors = dict(kv=s["k_pre"], cache=cache_bytes)
        else:
            width = 2 * HEAD_DIM if case.ratio == 2 else HEAD_DIM
            kv_score = torch.randn((step.num_tokens, width), device=device).to(dtype)
            s.update(kv=kv_score[:, :HEAD_DIM], score=kv_score[:, HEAD_DIM:] if case.ratio == 2 else None,
                     latent=torch.empty((step.num_tokens, HEAD_DIM), dtype=torch.bfloat16, device=device))
            floor_tensors = dict(kv=s["kv"], score=s["score"], state=state, block_size=bs, cache=cache_bytes,
                                 latent=s["latent"])
        s["floor"] = floor_launcher(plan.shifted(k * blocks * bs, k * blocks * strides[0]), floor_tensors, device)
        sets.append(s)
    return sets, plan.bytes_moved(), int(case.active(step).sum())


def prepare_v41(case: V41Case, device, num_sets: int | None = None, seed: int = 0) -> StepPrepared:
    """The input sets of ``case``: by default as many as keep its reads out of L2 (up to four
    independent steps, the others copies on further state blocks with their own inputs)."""
    from .timing import interleave, rotation_layout

    rng = np.random.default_rng(seed)
    drawn = case.step(rng)
    first, nbytes, active = _batch_sets(case, drawn, 1, device)
    count, independent, copies = rotation_layout(nbytes, num_sets)
    groups = [first + (_batch_sets(case, drawn, copies - 1, device)[0] if copies > 1 else [])]
    groups += [_batch_sets(case, case.step(rng), copies, device)[0] for _ in range(independent - 1)]
    return StepPrepared(RowLabel(case.name, case.operation, case.token_num, active, case.variant),
                        interleave(groups, count), nbytes)


# ---- implementations and calls --------------------------------------------------------------------------
@dataclass(frozen=True)
class V41Impl:
    """An implementation of SPEC §14.7: the object whose operations are timed, and the one that makes
    the first call (an object with a ``check_data`` attribute checks the data on the host there)."""

    name: str
    target: object
    checked: object


def load_v41_impl(name: str) -> V41Impl:
    """``triton`` or ``cutedsl`` (the project's kernel families), ``triton-split`` (Triton's two calls in
    place of the one launch), or ``module:attribute``: an object with SPEC §14.7's operations, or a
    factory of one called with no arguments. An object with a ``check_data`` attribute makes its first call with it as given and
    the timed ones on a copy with ``check_data = False`` (the checks copy to the host, which a CUDA
    graph cannot capture)."""
    if name in ("triton", "triton-split", "cutedsl"):
        module = importlib.import_module(f"dsv4_compressor.impl.{name.removesuffix('-split')}")
        return V41Impl(name, module, module)
    module_name, _, attribute = name.partition(":")
    if not attribute:
        raise ValueError(f"--impl: expected triton, triton-split, cutedsl or module:attribute, got {name!r}")
    target = getattr(importlib.import_module(module_name), attribute)
    if isinstance(target, type) or not hasattr(target, "v41_compress_norm_rope_store"):
        target = target()
    if hasattr(target, "check_data"):
        fast = copy.copy(target)
        fast.check_data = False
        return V41Impl(name, fast, target)
    return V41Impl(name, target, target)


def _compress_arguments(case: V41Case, s: dict) -> tuple:
    """SPEC §14.7's positional arguments of ``v41_compress_norm_rope_store`` up to ``kv_slot_mapping``."""
    if case.ratio == 1:
        state = (None,) * 7
    else:
        state = (s["token_to_req"], s["query_start_loc"], s["slot_mapping"], s["save_slot_mapping"], s["block_table"],
                 RING.block_size, s["state"])
    return (s["kv"], s["score"], s["positions"], *state, s["weight"], RMS_NORM_EPS, s["cos_sin"], s["k_cache"],
            s["kv_slot_mapping"])


def v41_calls(case: V41Case, impls: list[V41Impl]) -> dict:
    """The calls of ``case`` by name: each implementation's (``triton-split`` only on the compress), then
    ``floor``."""
    ring = RING.ring_capacity if case.ratio == 2 else None
    calls = {}
    for impl in impls:
        if case.operation == "index_key" and impl.name == "triton-split":
            continue
        if case.operation == "index_key":
            def make(target):
                return lambda s: target.v41_index_key_store(s["k_pre"], s["positions"], s["kv_slot_mapping"], s["weight"],
                                                            RMS_NORM_EPS, s["cos_sin"], s["k_cache"],
                                                            compress_ratio=case.ratio, layout=case.layout)
        elif impl.name == "triton-split":
            def make(target):
                def split(s) -> None:
                    arguments = _compress_arguments(case, s)
                    target.v41_compress_norm(*arguments[:10], arguments[10], RMS_NORM_EPS, s["kv_slot_mapping"],
                                             s["latent"], compress_ratio=case.ratio, ring_capacity=ring)
                    target.v41_rope_quant_store(s["latent"], s["positions"], s["kv_slot_mapping"], s["cos_sin"],
                                                s["k_cache"], compress_ratio=case.ratio, layout=case.layout)
                return split
        else:
            def make(target):
                return lambda s: target.v41_compress_norm_rope_store(
                    *_compress_arguments(case, s), s["latent"], compress_ratio=case.ratio, layout=case.layout,
                    ring_capacity=ring)
        fast, checked = make(impl.target), make(impl.checked)
        calls[impl.name] = fast if impl.checked is impl.target else checked_first(checked, fast)
    calls["floor"] = lambda s: s["floor"]()
    return calls
