"""The scenario catalogue: named, documented layer steps built with the spec's batch builders.

A scenario is one layer step: ``save_partial_states`` for this step's tokens, then
``compress_norm_rope_store``, or (SPEC §13.4) one ``compress_and_save`` call; SPEC §13's
state formats (a bf16 state, ``ape`` added at the compress, a ring per request) are options
of its recipe. Each has a size class: ``small`` runs everywhere (CPU, the
Triton interpreter); ``medium`` holds about a million output values, enough for one-ulp
arithmetic differences (approximate exp2, other summation orders) to reach the bytes;
``large`` (thousands to ~16K tokens) is for GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ..spec import batch as B
from ..spec.batch import Batch, Request
from ..spec.constants import HEAD_DIM, QUANT_BLOCK, ratio_config
from .buffers import Buffer
from .speculative import GROUP_SIZES, mixed_group_requests, verify_group_requests
from .state_inputs import bf16_state, projection_view, tune_bf16_ties

F32 = np.float32


@dataclass
class StepInputs:
    """Everything one step's two calls take, as NumPy data (buffers with their padding)."""

    batch: Batch  # with ring_capacity, query_start_loc and save_slot_mapping (SPEC §13)
    kv_score: np.ndarray  # float32 [T, 2*SW]: this step's projections (score without ape)
    ape: np.ndarray  # float32 [r, SW]
    state_cache: Buffer  # float32, or uint16 bf16 patterns, [num_blocks, bs, 2*SW] view (padding = NaN canary)
    rms_norm_weight: np.ndarray  # float32 [512] or uint16 [512] (bf16 patterns)
    rms_norm_eps: float
    cos_sin_cache: np.ndarray  # float32 [max_pos, 64]
    k_cache: Buffer  # canary-filled compressed cache of the layout
    layout: str
    fp8_scale: float | None = None
    strided_inputs: bool = False  # hand the implementation strided views (see runner.to_torch)
    hadamard: bool = False  # SPEC §12's rotation (indexer layouts)
    state_dtype: str = "fp32"  # SPEC §13.1: "fp32" or "bf16" (the state_cache's dtype)
    ape_at: str = "save"  # SPEC §13.2: "save" or "compress"
    step_call: bool = False  # SPEC §13.4: one compress_and_save call instead of the save and the compress
    projections: Buffer | None = None  # float32 [T, 2*SW] (kv then raw score): the step call's kv and score views

    @property
    def ring_capacity(self) -> int | None:
        """SPEC §13.3: ``C`` of a ring state, ``None`` for a paged one."""
        return self.batch.ring_capacity


@dataclass(frozen=True)
class StepRecipe:
    """How to build a step; :func:`build_step` turns it into :class:`StepInputs`."""

    requests: Callable[[np.random.Generator], list[Request]]
    compress_ratio: int
    block_size: int
    entries_per_page: int
    layout: str = "flashmla_fp8"
    bf16_weight: bool = False
    fp8_scale: float | None = None
    num_padding: int = 0
    padding_at_end: bool = True
    row_pad: int = 0  # floats appended to each state row (multiple of 4)
    block_pad_rows: int = 0  # rows appended to each state block
    page_pad_bytes: int = 0  # bytes appended to each flashmla page (multiple of 16)
    drop_entry_fraction: float = 0.0
    unsaved_fraction: float = 0.0
    slot_for_non_boundary: bool = False
    values: str = "normal"  # a key of VALUE_PROFILES
    rms_norm_eps: float = 1e-6
    strided_inputs: bool = False  # every input array a strided view into a wider allocation
    entry_pad: int = 0  # elements appended to each bf16 / fp8_per_tensor cache entry
    edit: Callable | None = None  # (Batch, rng) -> Batch: metadata changes after the builder
    tune_to_ties: bool = False  # weights and cos/sin rows chosen so one-ulp slips show (ties.py)
    rope_rows: int = 0  # cos_sin_cache rows (default: the largest position + 8)
    head_dim: int = HEAD_DIM  # 512, or 128 for the indexer compressor (SPEC §12)
    hadamard: bool = False  # SPEC §12's rotation
    state_dtype: str = "fp32"  # SPEC §13.1: "bf16" holds the state as bf16 (row_pad then a multiple of 8)
    ape_at: str = "save"  # SPEC §13.2: where ape is added
    ring_capacity: int | None = None  # SPEC §13.3: a ring of C rows per request with tail saves (build_ring_batch)
    step_call: bool = False  # SPEC §13.4: one compress_and_save call (tokens packed, padding at the end)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    size: str  # "small" (CPU, interpreter), "medium" (~1M values) or "large" (GPU)
    recipe: StepRecipe
    seed: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)
    device: str | None = None  # "cuda": a GPU-only scenario (memory beyond a CPU run's budget)
    sections: tuple[str, ...] = ("§4", "§5", "§6", "§7")  # the SPEC sections it exercises

    def build(self) -> StepInputs:
        return build_step(self.recipe, np.random.default_rng(self.seed))


# ---- value profiles: what the state rows, projections and weights look like ------------
def _normal(state, kv_score, weight, rng):
    return state, kv_score, weight


def _tiny_amax(state, kv_score, weight, rng):
    """Blocks whose amax falls below 448*2^-14 (and below the 1e-4 floor): weights ~1e-2..1e-9."""
    weight = weight.copy()
    for block, factor in ((1, 1e-2), (2, 1e-4), (4, 3e-3), (5, 1e-9), (6, 5e-6)):
        weight[block * QUANT_BLOCK:(block + 1) * QUANT_BLOCK] *= F32(factor)
    return state, kv_score, weight


def _huge(state, kv_score, weight, rng):
    """kv ~1e15 (the norm divides it away) and weights up to ~1e20: large scale bytes."""
    half = state.shape[-1] // 2
    state[..., :half] *= F32(1e15)
    kv_score[:, :kv_score.shape[1] // 2] *= F32(1e15)
    weight = weight.copy()
    weight[:QUANT_BLOCK] *= F32(1e20)
    weight[3 * QUANT_BLOCK:4 * QUANT_BLOCK] *= F32(1e9)
    weight[-64:] *= F32(1e12)  # the RoPE part
    return state, kv_score, weight


def _equal_scores(state, kv_score, weight, rng):
    """All scores equal: every row gets the same weight e = exp2s(0) = 1."""
    half = state.shape[-1] // 2
    state[..., half:] = F32(0.75)
    kv_score[:, kv_score.shape[1] // 2:] = F32(0.75)
    return state, kv_score, weight


def _spread_scores(state, kv_score, weight, rng):
    """Scores ~N(0, 60^2): most exp2s arguments fall below -126 (+0) or into the subnormals."""
    half = state.shape[-1] // 2
    state[..., half:] *= F32(30.0)
    return state, kv_score, weight


def _signed_zeros(state, kv_score, weight, rng):
    """kv and scores of +0 and -0 (every other block all -0), weights with signed zeros."""
    half = state.shape[-1] // 2
    signs = np.where(rng.random(state.shape) < 0.5, F32(-0.0), F32(0.0)).astype(F32)
    state[...] = signs
    state[::2, :, :half] = F32(-0.0)
    kv_score[...] = np.where(rng.random(kv_score.shape) < 0.5, F32(-0.0), F32(0.0))
    weight = weight.copy()
    weight[::7] = F32(-0.0)
    return state, kv_score, weight


def _subnormal_kv(state, kv_score, weight, rng):
    """kv values in binary32's subnormal range: a flush-to-zero kernel writes zeros instead."""
    half = state.shape[-1] // 2
    state[..., :half] *= F32(1e-40)
    return state, kv_score, weight


def _cutoff_window(state, kv_score, weight, rng):
    """Window rows whose exp2s argument is exactly -126 (kept), just above it (kept) or just
    below (+0), with kv ~1e33 against ~1e-5 elsewhere: 2^-126·1e33 is as large as the rest,
    so where the cut-off falls shows in the bytes. This step's rows get score +0 exactly
    (build_step), so every window's maximum is 0."""
    half = state.shape[-1] // 2
    log2e = np.array(0x3FB8AA3B, dtype=np.uint32).view(F32)
    at = F32(-126.0) / log2e
    for _ in range(64):  # the binary32 s with mul(s, L) == -126 exactly
        product = F32(at * log2e)
        if product == F32(-126.0):
            break
        at = np.nextafter(at, F32(0.0) if product < -126 else F32(-np.inf), dtype=F32)
    above, below = np.nextafter(at, F32(0.0), dtype=F32), np.nextafter(at, F32(-np.inf), dtype=F32)
    choice = rng.integers(0, 5, size=state[..., half:].shape)
    scores = np.select([choice == 0, choice == 1, choice == 2, choice == 3], [F32(0.0), at, above, below], F32(-1000.0))
    state[..., half:] = scores.astype(F32)
    kv = rng.standard_normal(state[..., :half].shape).astype(F32) * F32(1e-5)
    big = rng.choice(np.array([-1e33, 1e33], dtype=F32), size=kv.shape)
    state[..., :half] = np.where((choice >= 1) & (choice <= 3), big, kv).astype(F32)
    kv_score[:, :kv_score.shape[1] // 2] *= F32(1e-5)
    return state, kv_score, weight


def _weight_span(state, kv_score, weight, rng):
    """Norm weights from 1e-7 to 1e4 inside every block, either sign."""
    magnitude = 10.0 ** rng.uniform(-7.0, 4.0, size=weight.shape)
    return state, kv_score, (magnitude * np.where(rng.random(weight.shape) < 0.5, -1.0, 1.0)).astype(F32)


def _hadamard_cancel(state, kv_score, weight, rng):
    """Indexer: channels 0 and 64 pooled from identical rows (x[0] = x[64] exactly) with weights
    1e6 against ~1 elsewhere. At RoPE row 0 (cos 1, sin 0) z[64] = y[64], so the rotation's
    first stage (span 64) cancels the large pair exactly in outputs 64..127; stages in another
    order add the small values to the large ones first and lose their low bits."""
    width = state.shape[-1]
    head = weight.shape[0]
    for base in range(0, width, head):  # every head-wide slice of kv and score
        state[..., base + 64] = state[..., base]
        kv_score[:, base + 64] = kv_score[:, base]
    weight = weight.copy()
    weight[0] = weight[64] = F32(1e6)
    return state, kv_score, weight


def _indexer_tiny(state, kv_score, weight, rng):
    """Indexer weights ~1e-6 (amax below the 1e-4 floor) with blocks at 1e-38 and 1e-41 (below
    MXFP4's 6·2^-126 floor, subnormal)."""
    weight = weight * F32(1e-6)
    weight[32:64] = weight[32:64] * F32(1e-32)
    weight[96:128] = (weight[96:128].astype(np.float64) * 1e-35).astype(F32)
    return state, kv_score, weight


VALUE_PROFILES = {
    "bf16_ties": _normal,  # this step's kv, score and score + ape on bf16 ties (state_inputs.tune_bf16_ties, after ape)
    "hadamard_cancel": _hadamard_cancel,
    "indexer_tiny": _indexer_tiny,
    "cutoff_window": _cutoff_window,
    "weight_span": _weight_span,
    "normal": _normal,
    "tiny_amax": _tiny_amax,
    "huge": _huge,
    "equal_scores": _equal_scores,
    "spread_scores": _spread_scores,
    "signed_zeros": _signed_zeros,
    "subnormal_kv": _subnormal_kv,
}


def _cos_sin_cache(rows: int, chunk: int = 1 << 18) -> np.ndarray:
    """The spec's RoPE table (``B.rope_cos_sin_cache``), built a chunk of rows at a time so
    that 2^22 rows stay at their 1 GiB."""
    if rows <= chunk:
        return B.rope_cos_sin_cache(rows)
    half = 32
    freqs = 10000.0 ** (-np.arange(half, dtype=np.float64) / half)
    table = np.empty((rows, 2 * half), dtype=F32)
    for start in range(0, rows, chunk):
        angles = np.arange(start, min(rows, start + chunk), dtype=np.float64)[:, None] * freqs[None, :]
        table[start:start + len(angles), :half] = np.cos(angles)
        table[start:start + len(angles), half:] = np.sin(angles)
    return table


def _k_cache(recipe: StepRecipe, batch: Batch) -> np.ndarray:
    if recipe.entry_pad and recipe.layout in ("bf16", "fp8_per_tensor"):
        dtype = np.uint16 if recipe.layout == "bf16" else np.uint8
        return B.padded_view((batch.num_pages, recipe.entries_per_page, HEAD_DIM), dtype, (0, 0, recipe.entry_pad),
                             B.CANARY_BYTE * (0x0101 if dtype == np.uint16 else 1))
    return B.canary_k_cache(recipe.layout, batch.num_pages, recipe.entries_per_page, page_pad_bytes=recipe.page_pad_bytes)


def _build_batch(recipe: StepRecipe, rng: np.random.Generator) -> Batch:
    """The step's metadata: paged (:func:`~..spec.batch.build_batch`) or on a ring of
    ``recipe.ring_capacity`` rows per request with the tail saves (``build_ring_batch``)."""
    if recipe.ring_capacity is None:
        batch = B.build_batch(
            recipe.requests(rng), compress_ratio=recipe.compress_ratio, block_size=recipe.block_size,
            entries_per_page=recipe.entries_per_page, rng=rng, num_padding=recipe.num_padding,
            padding_at_end=recipe.padding_at_end, drop_entry_fraction=recipe.drop_entry_fraction,
            unsaved_fraction=recipe.unsaved_fraction, slot_for_non_boundary=recipe.slot_for_non_boundary,
        )
    elif not recipe.padding_at_end or recipe.drop_entry_fraction or recipe.unsaved_fraction or recipe.slot_for_non_boundary:
        raise ValueError("StepRecipe.ring_capacity: expected padding at the end and every slot given (a ring batch), "
                         "got scattered padding or dropped slots")
    else:
        batch = B.build_ring_batch(recipe.requests(rng), compress_ratio=recipe.compress_ratio,
                                   ring_capacity=recipe.ring_capacity, block_size=recipe.block_size,
                                   entries_per_page=recipe.entries_per_page, rng=rng, num_padding=recipe.num_padding)
    if recipe.step_call and batch.query_start_loc is None:
        raise ValueError("StepRecipe.step_call: expected tokens packed request by request (padding_at_end=True), "
                         "got scattered padding")
    return batch


def build_step(recipe: StepRecipe, rng: np.random.Generator) -> StepInputs:
    """Metadata from the batch builder, random buffers, then the value profile."""
    batch = _build_batch(recipe, rng)
    if recipe.edit is not None:
        batch = recipe.edit(batch, rng)
    head = recipe.head_dim
    state = B.random_state_cache(batch.num_state_blocks, recipe.block_size, recipe.compress_ratio, rng,
                                 row_pad=recipe.row_pad, block_pad_rows=recipe.block_pad_rows, head_dim=head)
    kv_score = B.random_kv_score(batch.num_tokens, recipe.compress_ratio, rng, head_dim=head)
    weight = (1.0 + 0.25 * rng.standard_normal(head)).astype(F32)
    state, kv_score, weight = VALUE_PROFILES[recipe.values](state, kv_score, weight, rng)
    if recipe.bf16_weight:
        weight = (weight.view(np.uint32) >> np.uint32(16)).astype(np.uint16)  # truncation: any bf16 will do
    ape = B.random_ape(recipe.compress_ratio, rng, head_dim=head)
    if recipe.values == "hadamard_cancel":  # the same ape for the duplicated channels
        for base in range(0, ape.shape[1], head):
            ape[:, base + 64] = ape[:, base]
    if recipe.values == "cutoff_window":  # add(-a, a) = +0: this step's scores are exactly 0
        kv_score[:, kv_score.shape[1] // 2:] = -ape[batch.positions % recipe.compress_ratio]
    if recipe.values == "bf16_ties":
        kv_score, ape = tune_bf16_ties(kv_score, ape, rng)
    if recipe.state_dtype == "bf16":
        state = bf16_state(state, recipe.row_pad, recipe.block_pad_rows)
    k_cache = _k_cache(recipe, batch)
    max_pos = int(batch.positions.max()) + 1
    inputs = StepInputs(
        batch=batch,
        kv_score=kv_score,
        ape=ape,
        state_cache=Buffer.of(state),
        rms_norm_weight=weight,
        rms_norm_eps=recipe.rms_norm_eps,
        cos_sin_cache=_cos_sin_cache(max(recipe.rope_rows, max_pos + 7)),
        k_cache=Buffer.of(k_cache, "float8_e4m3fn" if recipe.layout == "fp8_per_tensor" else None),
        layout=recipe.layout,
        fp8_scale=recipe.fp8_scale,
        strided_inputs=recipe.strided_inputs,
        hadamard=recipe.hadamard,
        state_dtype=recipe.state_dtype,
        ape_at=recipe.ape_at,
        step_call=recipe.step_call,
    )
    if recipe.tune_to_ties:
        from .ties import tune_indexer_ties, tune_to_ties

        if recipe.state_dtype != "fp32" or recipe.ape_at != "save" or recipe.ring_capacity or recipe.step_call:
            raise ValueError("StepRecipe.tune_to_ties: expected the default state format and the two calls (ties.py "
                             "tunes on their state), got SPEC §13 options")
        (tune_indexer_ties if head != HEAD_DIM else tune_to_ties)(inputs)
    if recipe.step_call:  # kv and score: two views of one projection output (rows padded with strided inputs)
        inputs.projections = Buffer.of(projection_view(inputs.kv_score, 4 if recipe.strided_inputs else 0))
    return inputs


# ---- request mixes --------------------------------------------------------------------
def _decode(n: int, ratio: int, max_entries: int = 8):
    return lambda rng: B.decode_requests(n, ratio, rng, max_entries=max_entries)


def _fixed(*pairs: tuple[int, int]):
    return lambda rng: [Request(context_len=c, num_tokens=n) for c, n in pairs]


def _mixed(ratio: int, num_decode: int, prefill: tuple[int, ...], max_entries: int = 6):
    return lambda rng: B.mixed_requests(rng, ratio, num_decode=num_decode, prefill_tokens=prefill, max_entries=max_entries)


def _c4_first_windows():
    """Requests whose first window closes at p = 3 (4 invalid rows), beside later windows."""
    return lambda rng: [Request(0, 4), Request(3, 1), Request(2, 6), Request(11, 1)]


# ---- batch edits (after the builder) ---------------------------------------------------
def _with(batch: Batch, **changes) -> Batch:
    return Batch(**{**batch.__dict__, **changes})


def _activity_combinations(batch: Batch, rng) -> Batch:
    """Every combination of SPEC §5's three conditions (state slot, boundary, cache slot):
    boundary tokens with a cache slot but no state slot among them."""
    slots, kv = batch.slot_mapping.copy(), batch.kv_slot_mapping.copy()
    boundary = (batch.positions + 1) % batch.compress_ratio == 0
    pattern = np.arange(len(slots)) % 4
    slots[boundary & (pattern == 0)] = -1  # boundary, cache slot, no state slot
    kv[boundary & (pattern == 1)] = -1  # boundary, state slot, no cache slot
    both = boundary & (pattern == 2)
    slots[both], kv[both] = -1, -1  # boundary, neither
    slots[~boundary & (pattern == 3)] = -1  # non-boundary with a cache slot, no state slot
    return _with(batch, slot_mapping=slots, kv_slot_mapping=kv)


NEGATIVE_SLOTS = np.array([-2, -3, -7, -128, -1000, -(2 ** 31), -(2 ** 40), -(2 ** 62)], dtype=np.int64)


def _negative_slots(batch: Batch, rng) -> Batch:
    """Padding and missing slots other than -1 (SPEC §9: any negative slot means none)."""
    slots, kv = batch.slot_mapping.copy(), batch.kv_slot_mapping.copy()
    for array in (slots, kv):
        where = np.flatnonzero(array == -1)
        array[where] = NEGATIVE_SLOTS[np.arange(len(where)) % len(NEGATIVE_SLOTS)]
    return _with(batch, slot_mapping=slots, kv_slot_mapping=kv)


def _shared_state_blocks(batch: Batch, rng) -> Batch:
    """Requests that share the state blocks of their common prefix (one table, several rows
    naming the same blocks), as prefix caching does."""
    table = batch.block_table.copy()
    first = int(np.flatnonzero(batch.token_to_req_indices == 0)[0])
    shared_columns = int(batch.positions[first]) // batch.block_size  # the columns before request 0's own
    for q in range(1, table.shape[0]):
        table[q, :shared_columns] = table[0, :shared_columns]
    return _with(batch, block_table=table)


def _beyond_2_31_bytes(state_row_bytes: int, entry_bytes: int):
    """State blocks and cache pages moved past 2^31 bytes from the base (GPU memory)."""
    def edit(batch: Batch, rng) -> Batch:
        blocks = (2 ** 31) // (batch.block_size * state_row_bytes) + 1
        pages = (2 ** 31) // (batch.entries_per_page * entry_bytes) + 1
        table = np.where(batch.block_table >= 0, batch.block_table + blocks, -1).astype(np.int32)
        slots = np.where(batch.slot_mapping >= 0, batch.slot_mapping + blocks * batch.block_size, batch.slot_mapping)
        kv = np.where(batch.kv_slot_mapping >= 0, batch.kv_slot_mapping + pages * batch.entries_per_page, batch.kv_slot_mapping)
        return _with(batch, block_table=table, slot_mapping=slots, kv_slot_mapping=kv,
                     num_state_blocks=batch.num_state_blocks + blocks, num_pages=batch.num_pages + pages)
    return edit


C4 = dict(compress_ratio=4, block_size=4, entries_per_page=64)
C128 = dict(compress_ratio=128, block_size=8, entries_per_page=2)


def _small() -> list[Scenario]:
    s = []

    def add(name, description, recipe, seed=0, tags=()):
        s.append(Scenario(name, description, "small", recipe, seed, tags))

    add("c128_decode_boundary", "C128 decode: every token closes a window (bs 8, 2 entries per page)",
        StepRecipe(_decode(3, 128), **C128))
    add("c4_decode_boundary", "C4 decode: every token closes a window (bs 4, 64 entries per page)",
        StepRecipe(_decode(6, 4), **C4))
    add("c4_first_window", "C4 windows closing at p = 3: rows 0..3 invalid, their +0 still in the trees",
        StepRecipe(_c4_first_windows(), **C4))
    add("c4_chunked_prefill", "C4 varlen chunked prefill: several boundaries per request, non-boundary tokens",
        StepRecipe(_fixed((5, 13), (0, 9), (30, 6)), **C4))
    add("c128_chunked_prefill", "C128 chunked prefill crossing two boundaries, plus a decode boundary",
        StepRecipe(_fixed((100, 160), (255, 1)), **C128))
    add("c4_mixed_padding", "C4 mixed decode + prefill + non-boundary tokens with padding scattered (slot -1)",
        StepRecipe(_mixed(4, 7, (11,)), **C4, num_padding=3, padding_at_end=False))
    add("c128_mixed_padding", "C128 mixed decode + prefill + non-boundary + padding at the end",
        StepRecipe(_mixed(128, 4, (140,), max_entries=3), **C128, num_padding=2))
    add("c4_bs8_b1", "C4 with 8-row state blocks and 1 entry per page", StepRecipe(_decode(5, 4), compress_ratio=4, block_size=8, entries_per_page=1))
    add("c4_bs16_b2", "C4 with 16-row state blocks and 2 entries per page", StepRecipe(_fixed((20, 9), (3, 1)), compress_ratio=4, block_size=16, entries_per_page=2))
    add("c128_bs4_b64", "C128 with 4-row state blocks (generic path), 64 entries per page",
        StepRecipe(_decode(2, 128), compress_ratio=128, block_size=4, entries_per_page=64))
    add("c128_bs16_b1", "C128 with 16-row state blocks (generic path), 1 entry per page",
        StepRecipe(_decode(2, 128), compress_ratio=128, block_size=16, entries_per_page=1))
    add("c4_padded_strides", "C4 with padded state rows and blocks and padded pages (canary in the padding)",
        StepRecipe(_fixed((6, 7), (15, 1)), **C4, row_pad=8, block_pad_rows=1, page_pad_bytes=48))
    add("c128_padded_strides", "C128 with padded state rows and blocks and padded pages",
        StepRecipe(_decode(2, 128), **C128, row_pad=4, block_pad_rows=2, page_pad_bytes=32))
    add("c4_layout_bf16", "C4 into the bf16 layout", StepRecipe(_fixed((1, 11), (6, 2)), **C4, layout="bf16"))
    add("c128_layout_bf16", "C128 into the bf16 layout", StepRecipe(_decode(2, 128), **C128, layout="bf16"))
    add("c4_layout_fp8_per_tensor", "C4 into the fp8_per_tensor layout (scale 0.02)",
        StepRecipe(_fixed((1, 11), (6, 2)), **C4, layout="fp8_per_tensor", fp8_scale=0.02))
    add("c128_layout_fp8_per_tensor", "C128 into the fp8_per_tensor layout (scale 0.5)",
        StepRecipe(_decode(2, 128), **C128, layout="fp8_per_tensor", fp8_scale=0.5))
    add("fp8_per_tensor_saturation", "fp8_per_tensor with a tiny scale: values saturate to +-448",
        StepRecipe(_decode(4, 4), **C4, layout="fp8_per_tensor", fp8_scale=1e-3))
    add("c4_bf16_weight", "C4 with a bf16 RMSNorm weight", StepRecipe(_decode(4, 4), **C4, bf16_weight=True))
    add("c128_bf16_weight", "C128 with a bf16 RMSNorm weight", StepRecipe(_decode(2, 128), **C128, bf16_weight=True))
    add("tiny_amax", "blocks with amax below 448*2^-14 and below the 1e-4 floor (scale-floor kernels differ here)",
        StepRecipe(_decode(6, 4), **C4, values="tiny_amax"), tags=("scale",))
    add("c128_tiny_amax", "C128 blocks with tiny amax", StepRecipe(_decode(2, 128), **C128, values="tiny_amax"), tags=("scale",))
    add("huge_values", "kv ~1e15 and weights up to 1e20: large scale bytes, large RoPE values",
        StepRecipe(_decode(5, 4), **C4, values="huge"))
    add("equal_scores", "all scores equal: uniform softmax weights", StepRecipe(_fixed((0, 12), (7, 1)), **C4, values="equal_scores"))
    add("spread_scores", "scores spread so exp2s underflows to +0 or to subnormals",
        StepRecipe(_decode(5, 4), **C4, values="spread_scores"))
    add("c128_spread_scores", "C128 scores spread so exp2s underflows", StepRecipe(_decode(2, 128), **C128, values="spread_scores"))
    add("signed_zeros", "kv, scores and weights of +0 and -0, with C4 first windows (p = 3)",
        StepRecipe(_c4_first_windows(), **C4, values="signed_zeros"))
    add("subnormal_kv", "kv values in the subnormal range (flush-to-zero shows here)",
        StepRecipe(_decode(5, 4), **C4, values="subnormal_kv"))
    add("inactive_tokens", "boundary tokens without a cache slot and tokens without a state slot write nothing",
        StepRecipe(_fixed((0, 16), (40, 8)), **C4, drop_entry_fraction=0.5, unsaved_fraction=0.2), seed=3)
    add("non_boundary_slots", "non-boundary tokens carry their group's cache slot: still only the boundary token writes",
        StepRecipe(_fixed((2, 9), (13, 5)), **C4, slot_for_non_boundary=True))
    add("c128_non_boundary_slots", "C128 non-boundary tokens carrying a cache slot",
        StepRecipe(_fixed((120, 10)), **C128, slot_for_non_boundary=True))
    _small_v11(add)
    return s


def _small_v11(add) -> None:
    """Scenarios for what kernels get wrong: each names the cheapest wrong implementation it kills."""
    add("c4_activity_combinations", "every combination of state slot, boundary and cache slot (SPEC §5); boundary "
        "tokens with a cache slot but no state slot write nothing", StepRecipe(_fixed((0, 24), (5, 19), (40, 9)), **C4,
        slot_for_non_boundary=True, edit=_activity_combinations), seed=5)
    add("c128_activity_combinations", "C128: boundary tokens without a state slot, without a cache slot, neither",
        StepRecipe(_decode(8, 128, 4), **C128, edit=_activity_combinations), seed=5)
    add("c4_negative_slots", "padding and missing slots of -2, -7, -2^31, -2^62 ... (any negative slot means none)",
        StepRecipe(_fixed((2, 14), (9, 7)), **C4, num_padding=5, padding_at_end=False, drop_entry_fraction=0.4,
                   unsaved_fraction=0.2, edit=_negative_slots), seed=6)
    add("c128_negative_slots", "C128 with negative slots other than -1",
        StepRecipe(_decode(6, 128, 3), **C128, num_padding=3, drop_entry_fraction=0.4, edit=_negative_slots), seed=6)
    add("c4_positions_2e15_2e16", "C4 positions beyond 2^15 and 2^16 (a 16-bit position, a 16-bit RoPE row)",
        StepRecipe(_fixed((32767, 1), (65535, 1), (65539, 1), (131071, 1), (40000, 9)), **C4), seed=7)
    add("c128_positions_2e16", "C128 positions beyond 2^16", StepRecipe(_fixed((65535, 1), (131071, 1), (98303, 1)), **C128))
    add("c4_bs3_b5", "C4 with 3-row state blocks and 5 entries per page (neither a power of two)",
        StepRecipe(_mixed(4, 5, (13,)), compress_ratio=4, block_size=3, entries_per_page=5), seed=8)
    add("c4_bs6_b3_prefill", "C4 prefill with 6-row state blocks: state slots differ from positions in every residue mod 4",
        StepRecipe(_fixed((1, 22), (14, 11)), compress_ratio=4, block_size=6, entries_per_page=3), seed=9)
    add("c4_bs5_b12", "C4 with 5-row state blocks and 12 entries per page", StepRecipe(_decode(7, 4), compress_ratio=4,
        block_size=5, entries_per_page=12), seed=10)
    add("c128_bs5_b6", "C128 with 5-row state blocks and 6 entries per page", StepRecipe(_decode(3, 128, 8),
        compress_ratio=128, block_size=5, entries_per_page=6), seed=11)
    add("c128_bs12_b3", "C128 with 12-row state blocks and 3 entries per page", StepRecipe(_fixed((120, 10), (383, 1)),
        compress_ratio=128, block_size=12, entries_per_page=3), seed=12)
    add("c128_bs1_b1", "C128 with 1-row state blocks and 1 entry per page", StepRecipe(_decode(2, 128, 3),
        compress_ratio=128, block_size=1, entries_per_page=1), seed=13)
    add("c4_bs64_b6", "C4 with 64-row state blocks", StepRecipe(_fixed((60, 10), (3, 1)), compress_ratio=4, block_size=64,
        entries_per_page=6), seed=14)
    add("c4_strided_inputs", "every input array a strided view into a wider allocation (rows padded, base moved)",
        StepRecipe(_mixed(4, 4, (9,)), **C4, strided_inputs=True, num_padding=2, padding_at_end=False), seed=15)
    add("c128_strided_inputs_bf16", "C128 strided inputs into a bf16 cache with padded entries",
        StepRecipe(_decode(3, 128, 3), **C128, layout="bf16", strided_inputs=True, entry_pad=8, bf16_weight=True), seed=16)
    add("c4_strided_fp8_per_tensor", "strided inputs into an fp8_per_tensor cache with padded entries, scale 0.0371",
        StepRecipe(_fixed((6, 7), (19, 1)), **C4, layout="fp8_per_tensor", fp8_scale=0.0371, strided_inputs=True,
                   entry_pad=16), seed=17)
    add("c128_fp8_scale_3_7", "C128 fp8_per_tensor with scale 3.7 (not a power of two)",
        StepRecipe(_decode(2, 128), **C128, layout="fp8_per_tensor", fp8_scale=3.7), seed=18)
    add("c4_fp8_scale_0_0093", "fp8_per_tensor with scale 0.0093: division and rounding, some saturation",
        StepRecipe(_decode(5, 4), **C4, layout="fp8_per_tensor", fp8_scale=0.0093), seed=19)
    add("c4_eps_1e-20", "rms_norm_eps = 1e-20", StepRecipe(_decode(4, 4), **C4, rms_norm_eps=1e-20), seed=20)
    add("c4_eps_1", "rms_norm_eps = 1 (larger than the mean square)", StepRecipe(_decode(4, 4), **C4, rms_norm_eps=1.0), seed=21)
    add("c128_eps_0_37", "C128 with rms_norm_eps = 0.37", StepRecipe(_decode(2, 128), **C128, rms_norm_eps=0.37), seed=22)
    add("c4_weight_span", "norm weights from 1e-7 to 1e4 within every block, either sign",
        StepRecipe(_decode(5, 4), **C4, values="weight_span"), seed=23)
    add("c128_weight_span", "C128 norm weights from 1e-7 to 1e4", StepRecipe(_decode(2, 128), **C128, values="weight_span"), seed=24)
    add("c4_exp2_cutoff", "exp2s arguments exactly -126 (kept), just above and just below (+0) with kv ~1e33",
        StepRecipe(_fixed((0, 12), (9, 3), (30, 2)), **C4, values="cutoff_window", layout="bf16"), seed=25)
    add("c128_exp2_cutoff", "C128 exp2s arguments at the -126 cut-off with large kv",
        StepRecipe(_decode(2, 128), **C128, values="cutoff_window", layout="bf16"), seed=26)
    add("c4_shared_state_blocks", "requests whose table rows share the state blocks of a common prefix",
        StepRecipe(_fixed((39, 1), (39, 1), (39, 1), (38, 2)), **C4, edit=_shared_state_blocks), seed=27)
    add("c4_ulp_ties", "weights and cos/sin rows chosen so every stored value sits on a bf16 tie: one-ulp slips "
        "(FMA, summation order, weight first, rounding of rsqrt or exp2) show", StepRecipe(_decode(4, 4), **C4, layout="bf16",
        tune_to_ties=True), seed=28)
    add("c128_ulp_ties", "C128 on bf16 ties", StepRecipe(_decode(2, 128), **C128, layout="bf16", tune_to_ties=True), seed=29)
    add("c4_prefill_ulp_ties", "C4 prefill on bf16 ties, first windows included",
        StepRecipe(_fixed((0, 8), (13, 3)), **C4, layout="bf16", tune_to_ties=True), seed=30)
    add("c4_ulp_ties_flashmla", "C4 on ties, flashmla_fp8 layout (the RoPE bytes are on bf16 ties)",
        StepRecipe(_decode(4, 4), **C4, tune_to_ties=True), seed=31)


def _indexer() -> list[Scenario]:
    """SPEC §12: every layout x rotation x ratio, the floors, E2M1 ties, saturation, signed zeros."""
    s = []

    def add(name, description, recipe, seed=0):
        s.append(Scenario(name, description, "small", recipe, seed, sections=("§4", "§5", "§12")))

    for layout in ("indexer_fp8", "indexer_mxfp4"):
        short = layout.removeprefix("indexer_")
        for hadamard in (False, True):
            rot = "_hadamard" if hadamard else ""
            add(f"indexer_c4_{short}{rot}", f"indexer C4 decode and prefill into {layout}" + (" with the rotation" if hadamard else ""),
                StepRecipe(_mixed(4, 5, (11,)), compress_ratio=4, block_size=16, entries_per_page=8, layout=layout,
                           head_dim=128, hadamard=hadamard, num_padding=2), seed=40 + hadamard)
            add(f"indexer_c128_{short}{rot}", f"indexer C128 decode into {layout}" + (" with the rotation" if hadamard else ""),
                StepRecipe(_decode(3, 128, 4), compress_ratio=128, block_size=8, entries_per_page=3, layout=layout,
                           head_dim=128, hadamard=hadamard), seed=42 + hadamard)
        add(f"indexer_{short}_floors", f"{layout}: amax below the floors (1e-4; 6·2^-126), subnormal values",
            StepRecipe(_decode(4, 4), compress_ratio=4, block_size=16, entries_per_page=4, layout=layout, head_dim=128,
                       values="indexer_tiny"), seed=44)
        add(f"indexer_{short}_signed_zeros", f"{layout}: kv, scores and weights of +0 and -0",
            StepRecipe(_c4_first_windows(), compress_ratio=4, block_size=16, entries_per_page=4, layout=layout,
                       head_dim=128, values="signed_zeros", hadamard=layout == "indexer_mxfp4"), seed=45)
        add(f"indexer_{short}_ties", f"{layout}: values on E2M1 ties and grid points (5 and 6 included) and block "
            "maxima that bf16 rounds onto 6·2^k / 448·2^k",
            StepRecipe(_decode(2, 4), compress_ratio=4, block_size=16, entries_per_page=4, layout=layout, head_dim=128,
                       tune_to_ties=True), seed=46)
        add(f"indexer_{short}_hadamard_cancel", f"{layout} with the rotation over a cancelling pair of large values: "
            "the order of the stages shows", StepRecipe(_fixed((3, 1), (3, 1), (0, 4)), compress_ratio=4, block_size=16, entries_per_page=4,
                                                       layout=layout, head_dim=128, hadamard=True, values="hadamard_cancel"),
            seed=47)
    add("indexer_c4_bs5_b3_strided", "indexer C4 with 5-row state blocks, 3 entries per page, strided inputs",
        StepRecipe(_mixed(4, 3, (9,)), compress_ratio=4, block_size=5, entries_per_page=3, layout="indexer_mxfp4",
                   head_dim=128, strided_inputs=True, page_pad_bytes=16), seed=48)
    return s


def _speculative() -> list[Scenario]:
    """Speculative decoding's verify groups (:mod:`.speculative`): ``k + 1 = 2 ... 8`` consecutive
    tokens per request with the window boundary at every offset of a group, several requests,
    beside prefill chunks, plain decode tokens and padding."""
    s = []

    def add(name, description, recipe, seed, sections=("§4", "§5", "§6", "§7")):
        s.append(Scenario(name, description, "small", recipe, seed, tags=("speculative",), sections=sections))

    for group in GROUP_SIZES:
        add(f"verify_c4_group{group}", f"C4 verify groups of {group} tokens, the boundary at each offset of a group, "
            "beside a prefill chunk, decode tokens and scattered padding",
            StepRecipe(verify_group_requests(group, 4, num_groups=group, max_entries=12, prefill=(7,), num_decode=2), **C4,
                       num_padding=3, padding_at_end=False), 60 + group)
        add(f"verify_c128_group{group}", f"C128 verify groups of {group} tokens crossing a boundary at each offset, "
            "beside a decode token and padding",
            StepRecipe(verify_group_requests(group, 128, num_groups=group, max_entries=4, num_decode=1), **C128,
                       num_padding=2), 70 + group)
    add("verify_mixed_c4", "C4 verify groups of every size 2 ... 8, a group holding the first window, prefill and decode",
        StepRecipe(mixed_group_requests(4, max_entries=10), **C4, num_padding=4, padding_at_end=False), 80)
    add("verify_mixed_c128", "C128 verify groups of every size 2 ... 8 with prefill and decode",
        StepRecipe(mixed_group_requests(128, max_entries=3), **C128, num_padding=2), 81)
    add("verify_mixed_c4_bf16", "C4 verify groups of every size into the bf16 layout, bf16 weight",
        StepRecipe(mixed_group_requests(4, max_entries=10), **C4, layout="bf16", bf16_weight=True), 82)
    add("verify_mixed_c128_fp8_per_tensor", "C128 verify groups of every size into the fp8_per_tensor layout",
        StepRecipe(mixed_group_requests(128, max_entries=3), **C128, layout="fp8_per_tensor", fp8_scale=0.0371), 83)
    add("verify_indexer_c4_mxfp4_hadamard", "indexer C4 verify groups of 5 tokens into indexer_mxfp4 with the rotation",
        StepRecipe(verify_group_requests(5, 4, num_groups=5, max_entries=8, num_decode=2), compress_ratio=4,
                   block_size=16, entries_per_page=8, layout="indexer_mxfp4", head_dim=128, hadamard=True,
                   num_padding=2), 84, ("§4", "§5", "§12"))
    add("verify_indexer_c128_fp8", "indexer C128 verify groups of 8 tokens into indexer_fp8",
        StepRecipe(verify_group_requests(8, 128, num_groups=4, max_entries=3), compress_ratio=128, block_size=8,
                   entries_per_page=3, layout="indexer_fp8", head_dim=128), 85, ("§4", "§5", "§12"))
    return s


# ---- SPEC §13: the state formats ----------------------------------------------------------
STATE_SECTIONS = ("§4", "§5", "§6", "§7", "§13")
STATE_FORMS = {"two_call": False, "step": True}  # the save then the compress, or compress_and_save (§13.4)


@dataclass(frozen=True)
class _StateGeometry:
    """One ratio and head width of the §13 family: blocks, pages, the ring and the requests."""

    compress_ratio: int
    head_dim: int
    block_size: int
    entries_per_page: int
    ring_capacity: int  # not a power of two where bs allows (a mask in place of mod C shows)
    requests: Callable  # windows across the ring's end, rows from the state and from the chunk, a first window
    layouts: tuple[tuple[str, bool], ...]  # (layout, hadamard) taken in turn


_C4_REQUESTS = _fixed((0, 4), (39, 1), (18, 9), (46, 2))  # p = 3; 32..39 wraps a ring of 12; chunks of 9 and 2
_C128_REQUESTS = _fixed((383, 1), (200, 60), (5, 1))  # 256..383 wraps a ring of 136; 128..199 before a chunk
_STATE_GEOMETRIES = (
    _StateGeometry(4, 512, 4, 64, 12, _C4_REQUESTS,
                   (("flashmla_fp8", False), ("bf16", False), ("fp8_per_tensor", False))),
    _StateGeometry(128, 512, 8, 2, 136, _C128_REQUESTS,
                   (("bf16", False), ("fp8_per_tensor", False), ("flashmla_fp8", False))),
    _StateGeometry(4, 128, 16, 8, 16, _C4_REQUESTS, (("indexer_fp8", False), ("indexer_mxfp4", True),
                                                     ("indexer_mxfp4", False), ("indexer_fp8", True))),
    _StateGeometry(128, 128, 8, 3, 136, _C128_REQUESTS, (("indexer_mxfp4", False), ("indexer_fp8", True),
                                                         ("indexer_fp8", False), ("indexer_mxfp4", True))),
)


def _state_options(dtype: str, ape_at: str, ring: int | None, form: str) -> dict:
    """A recipe's SPEC §13 fields."""
    return dict(state_dtype=dtype, ape_at=ape_at, ring_capacity=ring, step_call=STATE_FORMS[form])


def _state_combinations() -> list[Scenario]:
    """Every state dtype x ape_at x addressing x form, for C4 and C128 at both head widths, the
    layouts of the head width taken in turn."""
    s = []
    for g_index, g in enumerate(_STATE_GEOMETRIES):
        head = "" if g.head_dim == HEAD_DIM else "indexer_"
        combos = [(d, a, addressing, form) for d in ("fp32", "bf16") for a in ("save", "compress")
                  for addressing in ("paged", "ring") for form in STATE_FORMS]
        for i, (dtype, ape_at, addressing, form) in enumerate(combos):
            layout, hadamard = g.layouts[i % len(g.layouts)]
            ring = g.ring_capacity if addressing == "ring" else None
            name = f"state_{head}c{g.compress_ratio}_{dtype}_{ape_at}_{addressing}_{form}"
            where = f"a ring of {ring} rows (tail saves)" if ring else "paged"
            call = "compress_and_save" if STATE_FORMS[form] else "the save, then the compress"
            description = (f"SPEC §13: {'indexer ' if head else ''}C{g.compress_ratio}, {dtype} state, "
                           f"ape at the {ape_at}, {where}, {call}; into {layout}"
                           + (" with the rotation" if hadamard else ""))
            recipe = StepRecipe(g.requests, compress_ratio=g.compress_ratio, block_size=g.block_size,
                                entries_per_page=g.entries_per_page, layout=layout, head_dim=g.head_dim, hadamard=hadamard,
                                fp8_scale=0.0371 if layout == "fp8_per_tensor" else None, num_padding=2,
                                row_pad=8 if i % 4 == 1 else 0, **_state_options(dtype, ape_at, ring, form))
            sections = STATE_SECTIONS + (("§12",) if head else ())
            s.append(Scenario(name, description, "small", recipe, 100 + 16 * g_index + i, ("state",), sections=sections))
    return s


def _states() -> list[Scenario]:
    """SPEC §13: every option combination (:func:`_state_combinations`), then the cases engines
    meet: windows across a ring's end, chunks longer than the ring, tail saves, verify groups with
    a boundary inside, and this step's values on bf16 ties of ``kv``, ``score`` and ``score + ape``."""
    s = _state_combinations()

    def add(name, description, recipe, seed):
        s.append(Scenario(name, description, "small", recipe, seed, ("state",), sections=STATE_SECTIONS))

    c4_ring = dict(compress_ratio=4, block_size=4, entries_per_page=64)
    add("state_c4_ring_wraparound", "C4 on a ring of exactly W = 8 rows (SGLang: bf16 state, ape at the compress, "
        "compress_and_save): every window but p = 7 mod 8 wraps the ring's end; a first window, a chunk of C tokens",
        StepRecipe(_fixed((11, 1), (19, 1), (26, 2), (40, 8), (3, 1)), **c4_ring, num_padding=2,
                   **_state_options("bf16", "compress", 8, "step")), 140)
    add("state_c128_ring_wraparound", "C128 on a ring of exactly W = 128 rows in one block of 128 (bf16, ape at the "
        "compress, compress_and_save): windows across the ring's end and before a chunk",
        StepRecipe(_fixed((383, 1), (200, 56), (639, 1)), compress_ratio=128, block_size=128, entries_per_page=2,
                   num_padding=1, **_state_options("bf16", "compress", 128, "step")), 141)
    add("state_c4_chunk_longer_than_ring", "C4 chunks of 30 and 13 tokens on a ring of 12 (bf16, compress_and_save): "
        "the tail saves overwrite the rows the chunk's first windows read from the ring",
        StepRecipe(_fixed((5, 30), (0, 13), (27, 1)), **c4_ring, num_padding=3, layout="bf16",
                   **_state_options("bf16", "save", 12, "step")), 142)
    add("state_c128_chunk_longer_than_ring", "C128 chunk of 300 tokens on a ring of 128 (fp32, compress_and_save): "
        "three boundaries, the first window's rows before the chunk in the ring, only the last 128 tokens saved",
        StepRecipe(_fixed((100, 300), (255, 1)), compress_ratio=128, block_size=8, entries_per_page=2, num_padding=2,
                   **_state_options("fp32", "save", 128, "step")), 143)
    add("state_c4_tail_saves", "C4 chunks of 11, 12, 13 and 25 tokens and a decode token on a ring of 12 (vLLM's "
        "format: fp32, ape at the save, compress_and_save): save_slot_mapping names each chunk's last 12 tokens",
        StepRecipe(_fixed((2, 11), (20, 12), (33, 13), (50, 25), (71, 1)), **c4_ring, num_padding=4,
                   **_state_options("fp32", "save", 12, "step")), 144)
    _state_verify_groups(add)
    _state_ties(add)
    return s


def _draft_requests(num_requests: int, ratio: int, drafts: int, max_entries: int):
    return lambda rng: B.speculative_requests(num_requests, ratio, drafts, rng, max_entries=max_entries)


def _state_verify_groups(add) -> None:
    """Speculative verify groups (3 drafts) with a boundary inside, on rings sized for the window
    plus the drafts (C4: 12 rows; C128: vLLM's 128·ceil((128 + 3)/128) = 256) and paged."""
    add("state_c4_verify_ring_step", "C4 verify groups of 4 tokens, the boundary inside, on a ring of 12 (bf16, ape at "
        "the compress, compress_and_save)", StepRecipe(_draft_requests(6, 4, 3, 12), compress_ratio=4, block_size=4,
                                                     entries_per_page=64, num_padding=2, layout="bf16",
                                                     **_state_options("bf16", "compress", 12, "step")), 150)
    add("state_c4_verify_paged_two_call", "C4 verify groups of 4 tokens on a paged bf16 state, ape at the save, "
        "the save then the compress", StepRecipe(_draft_requests(6, 4, 3, 12), **C4, num_padding=2,
                                                 **_state_options("bf16", "save", None, "two_call")), 151)
    add("state_c128_verify_ring_step", "C128 verify groups of 4 tokens on vLLM's ring of 256 rows (fp32, ape at the "
        "save, compress_and_save)", StepRecipe(_draft_requests(4, 128, 3, 6), **C128, num_padding=2,
                                               **_state_options("fp32", "save", 256, "step")), 152)
    add("state_c128_verify_ring_two_call", "C128 verify groups of 4 tokens on a ring of 256 rows (bf16, ape at the "
        "compress), the save then the compress", StepRecipe(_draft_requests(4, 128, 3, 6), **C128, layout="fp8_per_tensor",
                                                           fp8_scale=0.0371,
                                                           **_state_options("bf16", "compress", 256, "two_call")), 153)


def _state_ties(add) -> None:
    """This step's kv, score and score + ape on bf16 ties (state_inputs.tune_bf16_ties), stored
    into the bf16 layout: truncation, ties away from zero and ape on the wrong side of the
    rounding each change bytes."""
    prefill = _fixed((0, 8), (13, 3), (29, 4))  # every chunk holds a boundary: this step's rows are pooled
    for ape_at in ("save", "compress"):
        add(f"state_c4_bf16_ties_{ape_at}", f"C4 bf16 state, ape at the {ape_at}, the save then the compress: this "
            f"step's kv, score and score + ape on bf16 ties", StepRecipe(prefill, **C4, layout="bf16", values="bf16_ties",
                                                                      **_state_options("bf16", ape_at, None, "two_call")),
            160 + (ape_at == "compress"))
        add(f"state_c4_bf16_ties_{ape_at}_step", f"C4 bf16 state on a ring of 12, ape at the {ape_at}, compress_and_save: "
            "the chunk's rows rounded as the save would store them, on bf16 ties",
            StepRecipe(prefill, compress_ratio=4, block_size=4, entries_per_page=64, layout="bf16", values="bf16_ties",
                       **_state_options("bf16", ape_at, 12, "step")), 162 + (ape_at == "compress"))
    add("state_c128_bf16_ties_compress_step", "C128 bf16 state, ape at the compress, compress_and_save on a paged "
        "state: a chunk of 130 tokens on bf16 ties", StepRecipe(_fixed((126, 130), (255, 1)), **C128, layout="bf16",
                                                                values="bf16_ties",
                                                                **_state_options("bf16", "compress", None, "step")), 164)


def _states_medium_large() -> list[Scenario]:
    """SPEC §13 at the medium and large sizes: vLLM's C128 ring (fp32, ape at the save, the step
    call) and SGLang's format (bf16, ape at the compress, a ring of W rows)."""
    def scenario(name, description, size, recipe, seed):
        return Scenario(name, description, size, recipe, seed, ("state",), sections=STATE_SECTIONS)

    return [
        scenario("medium_state_c128_bf16_compress_ring_step", "C128 decode boundary batch of 512 on rings of 256 rows, "
                 "bf16 state, ape at the compress, compress_and_save", "medium",
                 StepRecipe(_decode(512, 128, 32), **C128, **_state_options("bf16", "compress", 256, "step")), 13),
        scenario("medium_state_c4_bf16_save_paged", "C4 decode boundary batch of 2048 on a paged bf16 state, ape at the "
                 "save, the save then the compress", "medium",
                 StepRecipe(_decode(2048, 4, 128), **C4, **_state_options("bf16", "save", None, "two_call")), 14),
        scenario("large_state_c128_ring_prefill_step", "C128 on vLLM's rings of 256 rows: a 4096-token chunked prefill "
                 "(tail saves) plus 512 decode tokens and padding, compress_and_save", "large",
                 StepRecipe(_mixed(128, 512, (4096,), max_entries=40), **C128, num_padding=64,
                            **_state_options("fp32", "save", 256, "step")), 34),
        scenario("large_state_c4_bf16_compress_ring_step", "C4 decode batch of 8192 on rings of W = 8 rows (SGLang's "
                 "format: bf16, ape at the compress), compress_and_save", "large",
                 StepRecipe(_decode(8192, 4, 256), compress_ratio=4, block_size=4, entries_per_page=64,
                            **_state_options("bf16", "compress", 8, "step")), 35),
    ]


def _large() -> list[Scenario]:
    s = []

    def add(name, description, recipe, seed=0):
        s.append(Scenario(name, description, "large", recipe, seed))

    add("large_c128_decode_2048", "C128 decode boundary batch, 2048 requests (bs 8, B 2)",
        StepRecipe(_decode(2048, 128, 64), **C128))
    add("large_c128_generic_bs16_1024", "C128 decode, 1024 requests, 16-row state blocks (generic path)",
        StepRecipe(_decode(1024, 128, 16), compress_ratio=128, block_size=16, entries_per_page=64))
    add("large_c128_mixed_prefill", "C128: a 4096-token chunked prefill plus 512 decode tokens and padding",
        StepRecipe(_mixed(128, 512, (4096,), max_entries=40), **C128, num_padding=64, page_pad_bytes=64))
    add("large_c4_decode_16384", "C4 decode boundary batch, 16384 requests (bs 4, B 64)",
        StepRecipe(_decode(16384, 4, 512), **C4))
    add("large_c4_mixed", "C4: two prefill chunks of 2048 and 1500 tokens plus 2048 decode tokens, padded strides",
        StepRecipe(_mixed(4, 2048, (2048, 1500), max_entries=512), **C4, num_padding=32, row_pad=4, block_pad_rows=1, page_pad_bytes=16))
    add("large_c4_bf16_layout", "C4 decode batch of 8192 into the bf16 layout, bf16 weight",
        StepRecipe(_decode(8192, 4, 256), **C4, layout="bf16", bf16_weight=True))
    add("large_c128_fp8_per_tensor", "C128 decode batch of 1024 into the fp8_per_tensor layout",
        StepRecipe(_decode(1024, 128, 32), **C128, layout="fp8_per_tensor", fp8_scale=0.05))
    add("large_c4_positions_2e22", "C4 positions up to 2^22 - 1 (a cos_sin_cache of 2^22 rows, 1 GiB)",
        StepRecipe(_fixed((2 ** 22 - 1, 1), (2 ** 21 + 3, 1), (3_000_003, 1)), **C4, rope_rows=2 ** 22))
    s.append(Scenario("large_c4_offsets_beyond_2e31", "C4 state blocks and flashmla pages more than 2^31 bytes from "
                      "the base (int32 offset arithmetic overflows)", "large",
                      StepRecipe(_decode(64, 4, 8), **C4, edit=_beyond_2_31_bytes(2048 * 4, 584)), 32, device="cuda"))
    s.append(Scenario("large_c128_offsets_beyond_2e31", "C128 state blocks and flashmla pages beyond 2^31 bytes", "large",
                      StepRecipe(_decode(16, 128, 4), **C128, edit=_beyond_2_31_bytes(1024 * 4, 584)), 33, device="cuda"))
    return s


def _medium() -> list[Scenario]:
    """Enough values (about a million) that 1-ulp arithmetic differences reach the bytes."""
    return [
        Scenario("medium_c128_decode_512", "C128 decode boundary batch of 512: catches non-tree sums and approximate exp2",
                 "medium", StepRecipe(_decode(512, 128, 32), **C128), 11),
        Scenario("medium_c4_decode_2048", "C4 decode boundary batch of 2048: catches approximate exp2 and rsqrt",
                 "medium", StepRecipe(_decode(2048, 4, 128), **C4), 12),
    ]


CATALOGUE: tuple[Scenario, ...] = tuple(_small() + _indexer() + _speculative() + _states() + _medium() + _large()
                                        + _states_medium_large())


def scenarios(names: list[str] | None = None, size: str | None = None) -> list[Scenario]:
    """Catalogue entries by name (glob patterns allowed) and/or size class (cumulative:
    ``medium`` includes ``small``, ``large`` both)."""
    import fnmatch

    rank = {"small": 0, "medium": 1, "large": 2}
    if size not in (None, "all") and size not in rank:
        raise ValueError(f"size: expected one of small, medium, large, all, got {size!r}")
    chosen = [sc for sc in CATALOGUE if size in (None, "all") or rank[sc.size] <= rank[size]]
    if names:
        unknown = [n for n in names if not any(fnmatch.fnmatch(sc.name, n) for sc in CATALOGUE)]
        if unknown:
            raise ValueError(f"--scenarios: no scenario matches {unknown} (python -m dsv4_compressor conformance --impl spec --list shows the catalogue)")
        chosen = [sc for sc in chosen if any(fnmatch.fnmatch(sc.name, n) for n in names)]
    return chosen


def random_scenario(seed: int, *, compress_ratio: int, block_size: int, entries_per_page: int, layout: str,
                    bf16_weight: bool, num_decode: int, prefill: tuple[int, ...], num_padding: int,
                    row_pad: int, block_pad_rows: int, page_pad_bytes: int, values: str = "normal") -> Scenario:
    """A scenario from explicit parameters (hypothesis draws them)."""
    recipe = StepRecipe(
        _mixed(compress_ratio, num_decode, prefill, max_entries=4 if compress_ratio == 128 else 12),
        compress_ratio=compress_ratio, block_size=block_size, entries_per_page=entries_per_page, layout=layout,
        bf16_weight=bf16_weight, fp8_scale=0.03 if layout == "fp8_per_tensor" else None, num_padding=num_padding,
        padding_at_end=bool(seed % 2), row_pad=row_pad, block_pad_rows=block_pad_rows, page_pad_bytes=page_pad_bytes,
        values=values,
    )
    description = (f"random: r={compress_ratio} bs={block_size} B={entries_per_page} {layout} bf16_weight={bf16_weight} "
                   f"decode={num_decode} prefill={prefill} padding={num_padding} pads=({row_pad},{block_pad_rows},{page_pad_bytes}) {values}")
    return Scenario(f"random_{seed}", description, "small", recipe, seed)


def with_layout(scenario: Scenario, layout: str, fp8_scale: float | None = None) -> Scenario:
    """The same step stored into another layout."""
    return replace(scenario, name=f"{scenario.name}[{layout}]", recipe=replace(scenario.recipe, layout=layout, fp8_scale=fp8_scale))


__all__ = ["CATALOGUE", "Scenario", "StepInputs", "StepRecipe", "build_step", "scenarios", "random_scenario", "ratio_config"]
