"""Benchmarks of SPEC §13's state formats: the step call ``compress_and_save`` against the two calls
a user would otherwise make (``save_partial_states`` then ``compress_norm_rope_store``), and the
dense decode sweeps with a bf16 state beside fp32, each beside its floor (:mod:`.step_floor`).

Cases (:class:`StateCase`), each paged and as a ring (C128: 128 rows per request, C4: 8; blocks
of 8 and 4 rows), with an fp32 and a bf16 state:

- the serving steps (:func:`serving_steps`): a 16384-token C128 prefill chunk (128 windows close),
  a 16384-token C4 prefill chunk (4096 close), the 4608-token mixed steps (a 4096-token chunk
  and 512 decode tokens at random positions; C128 and C4), and C128 decode steps of 64 tokens
  (one active) and 512 tokens (three active);
- the dense sweeps (:func:`dense_sweeps`): the C128 and C4 decode-boundary sweeps of
  :mod:`.cases` through ``compress_norm_rope_store`` (every window row from the state), paged.

Where a request's chunk is longer than its ring, saving every token before the compress would
overwrite rows the compress still reads; the two calls cannot run such a step on a ring, and
their row says so (the paged case of the same step has them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..spec import batch as B
from ..spec.constants import HEAD_DIM, ratio_config
from ..spec.entry_layout import PAGED_LAYOUTS
from .cases import C4_SWEEP, C128_SWEEP
from .step_floor import FloorPlan, FloorShape, floor_launcher, record_offsets, window_runs
from .step_runner import StepPrepared
from .sweep import RowLabel

BLOCK_SIZE = {128: 8, 4: 4}  # rows per state block (production)
RING_CAPACITY = {128: 128, 4: 8}  # rows of a request's ring: one window (vLLM's C128 ring without drafts; SGLang's)
ENTRIES_PER_PAGE = {128: 2, 4: 64}  # as the main benchmark's cases
STATE_DTYPES = ("fp32", "bf16")
ADDRESSING = ("paged", "ring")
RMS_NORM_EPS = 1e-6
STEP_NAMES = ("compress_and_save", "save+compress", "floor")
DENSE_NAMES = ("compress", "floor")


@dataclass(frozen=True)
class StateCase:
    """One step on one state format."""

    name: str  # the table, e.g. "c128_prefill_step"
    ratio: int  # 4 or 128
    kind: str  # "prefill", "mixed", "decode_step" (the step call) or "decode" (compress only, every token active)
    token_num: int
    addressing: str = "paged"  # or "ring" (SPEC §13.3)
    state_dtype: str = "fp32"  # or "bf16" (SPEC §13.1)
    active: int | None = None  # decode_step: exactly this many tokens close a window (None: random positions)
    decode_tokens: int = 512  # mixed: the decode tokens beside the chunk
    layout: str = "flashmla_fp8"

    def __post_init__(self):
        for field, value, allowed in (("ratio", self.ratio, (4, 128)), ("addressing", self.addressing, ADDRESSING),
                                      ("state_dtype", self.state_dtype, STATE_DTYPES),
                                      ("kind", self.kind, ("prefill", "mixed", "decode_step", "decode"))):
            if value not in allowed:
                raise ValueError(f"StateCase.{field}: expected one of {allowed}, got {value!r}")
        if self.kind == "mixed" and not 0 < self.decode_tokens < self.token_num:
            raise ValueError(f"StateCase.decode_tokens: expected 1..{self.token_num - 1}, got {self.decode_tokens}")

    @property
    def operation(self) -> str:
        return "compress" if self.kind == "decode" else "step"

    @property
    def variant(self) -> str:
        return f"{self.addressing} {self.state_dtype}"

    @property
    def config(self):
        return ratio_config(self.ratio)

    @property
    def block_size(self) -> int:
        return BLOCK_SIZE[self.ratio]

    @property
    def ring_capacity(self) -> int | None:
        return RING_CAPACITY[self.ratio] if self.addressing == "ring" else None

    def requests(self, rng: np.random.Generator) -> list[B.Request]:
        r = self.ratio
        if self.kind == "prefill":  # one chunk starting on a window boundary
            return [B.chunked_prefill(r * int(rng.integers(0, 4)), self.token_num)]
        if self.kind == "mixed":
            return B.mixed_requests(rng, r, num_decode=self.decode_tokens,
                                    prefill_tokens=(self.token_num - self.decode_tokens,), max_entries=64)
        if self.kind == "decode_step" and self.active is not None:
            requests = (B.decode_requests(self.active, r, rng, boundary=True, max_entries=64)
                        + B.decode_requests(self.token_num - self.active, r, rng, boundary=False, max_entries=64))
            return [requests[i] for i in rng.permutation(len(requests))]
        if self.kind == "decode_step":
            return B.mixed_requests(rng, r, num_decode=self.token_num, prefill_tokens=(), max_entries=64)
        return B.decode_requests(self.token_num, r, rng, max_entries=64 if r == 128 else 512)

    def batch(self, rng: np.random.Generator) -> B.Batch:
        """The step's metadata (tokens packed request by request; a ring's tail saves)."""
        common = dict(compress_ratio=self.ratio, block_size=self.block_size,
                      entries_per_page=ENTRIES_PER_PAGE[self.ratio], rng=rng, spare_pages=0)
        if self.ring_capacity is not None:
            return B.build_ring_batch(self.requests(rng), ring_capacity=self.ring_capacity, spare_state_blocks=0,
                                      **common)
        return B.build_batch(self.requests(rng), spare_state_blocks=0, **common)

    def pair_refusal(self, batch: B.Batch) -> str:
        """Why ``save_partial_states`` then ``compress_norm_rope_store`` cannot run this step ("" if they can)."""
        if self.ring_capacity is None:
            return ""
        longest = int(np.diff(batch.query_start_loc).max())
        if longest > self.ring_capacity:
            return (f"unsupported: a {longest}-token chunk on a ring of {self.ring_capacity} rows (saving every token "
                    "first overwrites rows the compress reads)")
        return ""

    def dry_run_version(self) -> "StateCase":
        """The same step at a size the Triton interpreter runs in seconds."""
        r = self.ratio
        sizes = {"prefill": 2 * r, "mixed": 2 * r + 8, "decode_step": 8, "decode": 3}
        return replace(self, token_num=sizes[self.kind], decode_tokens=8,
                       active=None if self.active is None else min(self.active, 2))


def serving_steps(addressing=ADDRESSING, state_dtypes=STATE_DTYPES) -> list[StateCase]:
    """The serving steps of SPEC §13.4's step call on every format."""
    shapes = [("c128_prefill_step", 128, "prefill", 16384, None), ("c4_prefill_step", 4, "prefill", 16384, None),
              ("c128_mixed", 128, "mixed", 4096 + 512, None), ("c4_mixed", 4, "mixed", 4096 + 512, None),
              ("c128_decode_step", 128, "decode_step", 64, 1), ("c128_decode_step", 128, "decode_step", 512, 3)]
    return [StateCase(name, ratio, kind, tokens, a, d, active)
            for name, ratio, kind, tokens, active in shapes for a in addressing for d in state_dtypes]


def dense_sweeps(ratios=(128, 4), sizes=None, state_dtypes=STATE_DTYPES) -> list[StateCase]:
    """The decode-boundary sweeps (compress only, paged) with each state dtype."""
    return [StateCase(f"c{r}_decode", r, "decode", n, "paged", d)
            for r in ratios for n in (sizes or (C128_SWEEP if r == 128 else C4_SWEEP)) for d in state_dtypes]


# ---- input sets ----------------------------------------------------------------------------------------
def _floor_plan(case: StateCase, batch: B.Batch, state_strides: tuple[int, int], page_stride: int) -> FloorPlan:
    config = case.config
    entry_bytes = PAGED_LAYOUTS[case.layout].entry_bytes
    active = batch.active
    if case.operation == "step":  # rows at or after the chunk's start come from kv / score
        starts = batch.positions[batch.query_start_loc[batch.token_to_req_indices]]
    else:
        starts = batch.positions + 1
    runs = window_runs(batch.positions, batch.token_to_req_indices, active, starts, window=config.window,
                       ratio=config.ratio, head_dim=HEAD_DIM, block_table=batch.block_table,
                       block_size=batch.block_size, ring_capacity=batch.ring_capacity, strides=state_strides)
    step = case.operation == "step"
    shape = FloorShape(state_width=config.state_width, head_dim=HEAD_DIM, input_bf16=False, has_score=True,
                       state_bf16=case.state_dtype == "bf16", reads=2 if step else 0, entry_bytes=entry_bytes,
                       latent=False)
    saves = batch.save_slot_mapping if step else np.full(batch.num_tokens, -1, dtype=np.int64)
    entries = record_offsets(batch.kv_slot_mapping, active, batch.entries_per_page, page_stride, entry_bytes)
    return FloorPlan(shape, saves.astype(np.int64), entries, runs)


def _shifted(slots: np.ndarray, by: int) -> np.ndarray:
    return np.where(slots >= 0, slots + by, -1)


def _batch_sets(case: StateCase, batch: B.Batch, copies: int, rng: np.random.Generator, device) -> tuple[list, int]:
    """``copies`` input sets of one batch (each its own kv / score and state blocks; weights, cos/sin
    and the compressed cache shared), and the bytes the step must move."""
    import torch

    from .timing import record_cache

    config = case.config
    width = config.state_row_width
    dtype = torch.bfloat16 if case.state_dtype == "bf16" else torch.float32
    blocks = max(batch.num_state_blocks, 1)
    state = torch.randn((copies * blocks, case.block_size, width), device=device).to(dtype)
    tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    weight = tensor(B.random_norm_weight(rng, bf16=False))
    cos_sin = tensor(B.rope_cos_sin_cache(int(batch.positions.max()) + 1))
    k_cache, cache_bytes = record_cache(case.layout, max(batch.num_pages, 1), batch.entries_per_page, device,
                                        zeroed=True)
    ape = torch.randn((case.ratio, config.state_width), device=device) * 0.5
    plan = _floor_plan(case, batch, (state.stride(0), state.stride(1)), k_cache.stride(0))
    shared = dict(positions=tensor(batch.positions), token_to_req=tensor(batch.token_to_req_indices),
                  query_start_loc=tensor(batch.query_start_loc), kv_slot_mapping=tensor(batch.kv_slot_mapping),
                  state=state, weight=weight, cos_sin=cos_sin, k_cache=k_cache, ape=ape)
    sets = []
    for k in range(copies):
        kv_score = torch.randn((batch.num_tokens, width), device=device)
        s = dict(shared, kv_score=kv_score, kv=kv_score[:, :config.state_width], score=kv_score[:, config.state_width:],
                 block_table=tensor(batch.block_table + k * blocks),
                 slot_mapping=tensor(_shifted(batch.slot_mapping, k * blocks * case.block_size)),
                 save_slot_mapping=tensor(_shifted(batch.save_slot_mapping, k * blocks * case.block_size)))
        floor_tensors = dict(kv=s["kv"], score=s["score"], state=state, block_size=case.block_size, cache=cache_bytes)
        s["floor"] = floor_launcher(plan.shifted(k * blocks * case.block_size, k * blocks * state.stride(0)),
                                    floor_tensors, device)
        sets.append(s)
    return sets, plan.bytes_moved()


def prepare_state(case: StateCase, device, num_sets: int | None = None, seed: int = 0) -> tuple[StepPrepared, str]:
    """The input sets of ``case`` (by default as many as keep its reads out of L2, up to four
    independent batches, the others copies on further state blocks) and why the two calls cannot
    run it ("" if they can)."""
    from .timing import interleave, rotation_layout

    rng = np.random.default_rng(seed)
    batches = [case.batch(rng)]
    first_sets, nbytes = _batch_sets(case, batches[0], 1, rng, device)
    count, independent, copies = rotation_layout(nbytes, num_sets)
    groups = [first_sets + _batch_sets(case, batches[0], copies - 1, rng, device)[0] if copies > 1 else first_sets]
    for _ in range(independent - 1):
        batches.append(case.batch(rng))
        groups.append(_batch_sets(case, batches[-1], copies, rng, device)[0])
    sets = interleave(groups, count)
    label = RowLabel(case.name, case.operation, case.token_num, batches[0].num_active, case.variant)
    refusal = "" if case.operation != "step" else next((r for r in map(case.pair_refusal, batches) if r), "")
    return StepPrepared(label, sets, nbytes), refusal


# ---- the calls --------------------------------------------------------------------------------------------
def state_calls(case: StateCase, module, refusal: str = "") -> dict:
    """The calls of ``case`` by name, on ``module`` (an object with SPEC §13's options on its
    ``save_partial_states`` and ``compress_norm_rope_store`` and, for the steps, ``compress_and_save``):
    ``compress_and_save``, ``save+compress`` (``refusal`` when the two calls cannot run the step) and
    ``floor``; for a dense sweep ``compress`` and ``floor``."""
    bs, ring, r = case.block_size, case.ring_capacity, case.ratio
    rings = {} if ring is None else dict(ring_capacity=ring)  # a paged call passes no §13 keyword (any compressor takes it)
    keywords = dict(compress_ratio=r, layout=case.layout, **rings)

    def compress(s) -> None:
        module.compress_norm_rope_store(s["state"], s["token_to_req"], s["positions"], s["slot_mapping"],
                                        s["block_table"], bs, s["weight"], RMS_NORM_EPS, s["cos_sin"], s["k_cache"],
                                        s["kv_slot_mapping"], **keywords)

    def floor(s) -> None:
        s["floor"]()

    if case.operation == "compress":
        return {"compress": compress, "floor": floor}

    def step(s) -> None:
        module.compress_and_save(s["kv"], s["score"], s["ape"], s["positions"], s["token_to_req"], s["query_start_loc"],
                                 s["slot_mapping"], s["save_slot_mapping"], s["block_table"], bs, s["state"],
                                 s["weight"], RMS_NORM_EPS, s["cos_sin"], s["k_cache"], s["kv_slot_mapping"],
                                 ape_at="save", **keywords)

    def pair(s) -> None:  # every token saved (a ring's chunks fit it), then the compress reads the state
        module.save_partial_states(s["kv_score"], s["ape"], s["positions"], s["slot_mapping"], s["state"], bs, **rings)
        compress(s)

    return {"compress_and_save": step, "save+compress": refusal or pair, "floor": floor}
