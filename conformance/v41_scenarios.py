"""The DeepSeek-V4.1 scenario catalogue (SPEC §14): one call of one of the four operations each.

A scenario is built from the batch builders of :mod:`dsv4_compressor.spec.v41_batch` (block
tables kept per request, the state ``slot_mapping``, ratio 2's saves, boundary tokens'
``kv_slot_mapping``, padding) and a value profile (:mod:`.v41_values`). Every buffer an
implementation writes is a canary-filled allocation with its padding (latent rows, state rows,
cache pages), so comparing whole allocations also catches stray writes. Sizes as V4's catalogue:
``small`` runs under the Triton interpreter in seconds, ``medium`` holds enough values for
one-ulp slips to reach the bytes, ``large`` is for GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from ..spec import batch as B
from ..spec import v41_batch as V
from ..spec.batch import Request
from ..spec.constants import HEAD_DIM, INDEXER_HEAD_DIM, V41_STATE_ROW_WIDTH
from ..spec.entry_layout import V41_INDEX_KEY_LAYOUTS
from ..spec.formats import bf16_bits, bf16_to_f32
from .buffers import Buffer
from .capabilities import V41Features
from .v41_values import LATENT_PROFILES, V41Values, apply_profiles

F32 = np.float32
STATES = ("paged", "reference_ring", "vllm_ring")
INPUT_DTYPES = ("fp32", "bf16", "mixed")  # mixed: kv fp32, score bf16
SECTIONS = {"compress_norm": ("§14.2", "§14.3"), "rope_quant_store": ("§14.4", "§14.5"),
            "compress_norm_rope_store": ("§14.2", "§14.3", "§14.4", "§14.5"), "index_key_store": ("§14.6",)}


@dataclass(frozen=True)
class V41Recipe:
    """How to build one V4.1 call; :func:`build_v41` turns it into :class:`V41Inputs`."""

    requests: Callable[[np.random.Generator], list[Request]]
    compress_ratio: int  # 1 or 2
    operation: str = "compress_norm_rope_store"  # compress_norm, rope_quant_store, compress_norm_rope_store, index_key_store
    layout: str | None = "v41_nvfp4"  # None for compress_norm
    entries_per_page: int = 2  # B
    page_pad_bytes: int = 0  # bytes after each page's entries (a multiple of 16)
    state: str = "paged"  # ratio 2: "paged", "reference_ring" (C = bs = 2) or "vllm_ring" (C = bs = 8 or more)
    block_size: int = 4  # ratio 2, paged: bs
    num_speculative: int = 0  # vllm_ring: C = max(8, 2^ceil(log2(S + 2)))
    state_dtype: str = "fp32"  # ratio 2: "fp32" or "bf16"
    state_row_pad: int = 0  # elements after each state row (16-byte multiples)
    input_dtype: str = "fp32"  # kv and score: "fp32", "bf16" or "mixed" (kv fp32, score bf16)
    separate_projections: bool = False  # ratio 2: kv and score in two allocations (else views of one [T, 1024])
    latent: bool = True  # compress_norm_rope_store: the latent is an output (else None)
    latent_row_pad: int = 0  # elements after each latent row (multiples of 8)
    num_padding: int = 1  # padding tokens (every slot -1) after the requests'
    drop_entry_fraction: float = 0.0  # boundary tokens without a cache slot
    unslotted_fraction: float = 0.0  # ratio 2: tokens without a state slot (saved all the same)
    bf16_weight: bool = False
    fp8_scale: float | None = None  # fp8_per_tensor
    rms_norm_eps: float = 1e-6
    values: tuple[str, ...] = ()  # value profiles (:mod:`.v41_values`)
    edit: Callable | None = None  # (V41Step, V41Tables, rng) -> V41Step: metadata changes after the builder


@dataclass(frozen=True)
class V41Scenario:
    name: str
    description: str
    size: str  # "small", "medium" or "large"
    recipe: V41Recipe
    seed: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)
    device: str | None = None  # "cuda": GPU only
    model: str = "v4.1"

    @property
    def sections(self) -> tuple[str, ...]:
        return SECTIONS[self.recipe.operation]

    def build(self) -> "V41Inputs":
        return build_v41(self.recipe, np.random.default_rng(self.seed))


@dataclass
class V41Inputs:
    """One V4.1 call's arguments as NumPy data (bf16 as uint16 patterns); buffers with their padding."""

    operation: str
    compress_ratio: int
    tables: V.V41Tables
    step: V.V41Step
    kv: np.ndarray | None  # float32 or uint16 [T, 512] (separate projections or ratio 1)
    score: np.ndarray | None  # float32 or uint16 [T, 512] (separate projections)
    projections: Buffer | None  # [T, 1024]: kv then score, one allocation (ratio 2 unless separate)
    state_cache: Buffer | None  # ratio 2: float32 or uint16 [num_state_blocks, bs, 1024]
    rms_norm_weight: np.ndarray  # float32 or uint16 [512] ([128] for the index key)
    rms_norm_eps: float
    cos_sin_cache: np.ndarray  # float32 [max_pos, 64]
    k_cache: Buffer | None  # the layout's canary-filled cache (None for compress_norm)
    latent: Buffer | None  # uint16 [T, 512]: an output (compress ops) or v41_rope_quant_store's input
    k_pre: np.ndarray | None  # uint16 [T, 128]: the index key's input
    layout: str | None
    fp8_scale: float | None
    features: V41Features

    @property
    def num_tokens(self) -> int:
        return self.step.num_tokens

    @property
    def ring_capacity(self) -> int | None:
        return self.tables.state.ring_capacity if self.compress_ratio == 2 else None

    def kv_score_arrays(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(kv, score)`` as NumPy views (of the projection allocation, when shared)."""
        if self.projections is None:
            return self.kv, self.score
        _, view = self.projections.numpy_copy()
        return view[:, :HEAD_DIM], view[:, HEAD_DIM:]

    @property
    def active(self) -> np.ndarray:
        """SPEC §14.3's active tokens (bool ``[T]``; the index key and the store: the storing tokens)."""
        from ..spec.v41_compress import active_tokens, stored_tokens

        s = self.step
        if self.operation in ("rope_quant_store", "index_key_store"):
            return stored_tokens(s.positions, s.kv_slot_mapping, self.compress_ratio)
        return active_tokens(s.positions, s.slot_mapping, s.kv_slot_mapping, self.compress_ratio)


# ---- building -----------------------------------------------------------------------------------
def _uses_state(recipe: V41Recipe) -> bool:
    return recipe.compress_ratio == 2 and recipe.operation in ("compress_norm", "compress_norm_rope_store")


def _state_layout(recipe: V41Recipe) -> V.StateLayout:
    if not _uses_state(recipe):  # tables of a ring of 2 rows: small, and never read
        return V.reference_ring()
    if recipe.state == "reference_ring":
        return V.reference_ring()
    if recipe.state == "vllm_ring":
        return V.vllm_ring(recipe.num_speculative)
    if recipe.state == "paged":
        return V.paged(recipe.block_size)
    raise ValueError(f"V41Recipe.state: expected one of {STATES}, got {recipe.state!r}")


def _padded(values: np.ndarray, row_pad: int) -> np.ndarray:
    fill = B.CANARY_BYTE * (0x0101 if values.dtype == np.uint16 else 1)
    out = B.padded_view(values.shape, values.dtype, (0,) * (values.ndim - 1) + (row_pad,), fill)
    out[...] = values
    return out


def _as_bf16(values: np.ndarray) -> np.ndarray:
    return bf16_bits(np.asarray(values, dtype=F32))


def _cos_sin(max_pos: int) -> np.ndarray:
    return B.rope_cos_sin_cache(max_pos).astype(F32)


def _projection_buffers(recipe: V41Recipe, kv32: np.ndarray, score32: np.ndarray):
    """``(kv, score, projections)`` in the recipe's dtypes: two arrays, or one ``[T, 1024]`` allocation."""
    kv = _as_bf16(kv32) if recipe.input_dtype == "bf16" else kv32
    if recipe.compress_ratio == 1:
        return kv, None, None
    score = _as_bf16(score32) if recipe.input_dtype in ("bf16", "mixed") else score32
    if recipe.separate_projections or recipe.input_dtype == "mixed":
        return _padded(kv, 4 if kv.dtype == np.float32 else 8), _padded(score, 8), None
    return None, None, Buffer.of(_padded(np.concatenate([kv, score], axis=1), 0))


def _features(recipe: V41Recipe, tables: V.V41Tables, step: V.V41Step) -> V41Features:
    ratio2_state = _uses_state(recipe)
    compresses = recipe.operation in ("compress_norm", "compress_norm_rope_store")
    dtypes = {"fp32": ("fp32",), "bf16": ("bf16",), "mixed": ("fp32", "bf16")}[recipe.input_dtype] if compresses else ()
    latent = "input" if recipe.operation == "rope_quant_store" else (
        "written" if recipe.operation == "compress_norm" or (recipe.operation == "compress_norm_rope_store"
                                                            and recipe.latent) else "none")
    ring = tables.state.ring_capacity if ratio2_state else None
    tail = True
    if ratio2_state:
        starts = step.query_start_loc
        real = step.positions.shape[0] - recipe.num_padding
        if ring is None:
            tail = False
        else:
            tail = bool(np.array_equal(step.save_slot_mapping[:real], B.tail_saves(step.slot_mapping[:real], starts, ring)))
    return V41Features(
        operation=recipe.operation, compress_ratio=recipe.compress_ratio, layout=recipe.layout,
        entries_per_page=recipe.entries_per_page if recipe.layout else None, input_dtypes=dtypes,
        state_dtype=recipe.state_dtype if ratio2_state else None, ring_capacity=ring,
        block_size=tables.state.block_size if ratio2_state else None, tail_saves=tail,
        separate_projections=ratio2_state and (recipe.separate_projections or recipe.input_dtype == "mixed"),
        latent=latent, latent_row_pad=latent != "none" and recipe.latent_row_pad > 0,
    )


def build_v41(recipe: V41Recipe, rng: np.random.Generator) -> V41Inputs:
    """Metadata from :mod:`~dsv4_compressor.spec.v41_batch`, random values, the value profiles, buffers."""
    ratio = recipe.compress_ratio
    requests = recipe.requests(rng)
    state_layout = _state_layout(recipe)
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=ratio, state=state_layout,
                          entries_per_page=recipe.entries_per_page, rng=rng)
    step = V.v41_step(tables, requests, rng=rng, num_padding=recipe.num_padding,
                      drop_entry_fraction=recipe.drop_entry_fraction, unslotted_fraction=recipe.unslotted_fraction)
    if recipe.edit is not None:
        step = recipe.edit(step, tables, rng)
    t = step.num_tokens
    head = INDEXER_HEAD_DIM if recipe.operation == "index_key_store" else HEAD_DIM
    kv32, score32 = V.projections(t, rng)
    state_blocks = tables.num_state_blocks if _uses_state(recipe) else 0
    state32 = rng.standard_normal((state_blocks, state_layout.block_size, V41_STATE_ROW_WIDTH)).astype(F32)
    max_pos = int(step.positions.max(initial=0)) + 2
    values = V41Values(ratio=ratio, kv=kv32, score=score32, state=state32,
                       weight=(1.0 + 0.25 * rng.standard_normal(head)).astype(F32),
                       latent=bf16_to_f32(_as_bf16(rng.standard_normal((t, HEAD_DIM)))),
                       cos_sin=_cos_sin(max_pos), k_pre=bf16_to_f32(_as_bf16(rng.standard_normal((t, INDEXER_HEAD_DIM)))))
    apply_profiles(recipe.values, values, rng)
    weight = _as_bf16(values.weight) if recipe.bf16_weight else values.weight
    kv, score, projections = _projection_buffers(recipe, values.kv, values.score)
    state_cache = None
    if _uses_state(recipe):
        rows = _as_bf16(values.state) if recipe.state_dtype == "bf16" else values.state
        state_cache = Buffer.of(_padded(rows, recipe.state_row_pad))
    latent = None
    if recipe.operation == "rope_quant_store":
        latent = Buffer.of(_padded(_as_bf16(values.latent), recipe.latent_row_pad))
    elif recipe.operation == "compress_norm" or (recipe.operation == "compress_norm_rope_store" and recipe.latent):
        latent = Buffer.of(V.latent_buffer(t, row_pad=recipe.latent_row_pad))
    k_cache = None
    if recipe.layout is not None:
        cache = B.canary_k_cache(recipe.layout, tables.num_pages, recipe.entries_per_page,
                                 page_pad_bytes=recipe.page_pad_bytes)
        k_cache = Buffer.of(cache, "float8_e4m3fn" if recipe.layout == "fp8_per_tensor" else None)
    fp8_scale = recipe.fp8_scale if recipe.fp8_scale is not None else (0.0123 if recipe.layout == "fp8_per_tensor" else None)
    return V41Inputs(
        operation=recipe.operation, compress_ratio=ratio, tables=tables, step=step,
        kv=kv if recipe.operation in ("compress_norm", "compress_norm_rope_store") else None, score=score,
        projections=projections if recipe.operation in ("compress_norm", "compress_norm_rope_store") else None,
        state_cache=state_cache, rms_norm_weight=weight, rms_norm_eps=recipe.rms_norm_eps, cos_sin_cache=values.cos_sin,
        k_cache=k_cache, latent=latent, k_pre=_as_bf16(values.k_pre) if recipe.operation == "index_key_store" else None,
        layout=recipe.layout, fp8_scale=fp8_scale, features=_features(recipe, tables, step),
    )


# ---- request mixes ---------------------------------------------------------------------------------
def _fixed(*pairs: tuple[int, int]):
    return lambda rng: [Request(context_len=c, num_tokens=n) for c, n in pairs]


def _decode(n: int, max_position: int = 4096):
    return lambda rng: [Request(int(c), 1) for c in rng.integers(0, max_position, size=n)]


def _verify(n: int, drafts: int, max_position: int = 200):
    """Verify groups of ``drafts + 1`` tokens starting at every parity (the boundary anywhere inside)."""
    return lambda rng: V.verify_requests([int(c) for c in rng.integers(1, max_position, size=n)], drafts)


def _after_rejection(drafts: int, accepted: tuple[int, ...], max_position: int = 200):
    """The step after a verify step that accepted ``accepted[i]`` drafts: each request starts again
    inside its previous group, over state rows its rejected drafts wrote (the state holds them)."""
    def requests(rng):
        before = V.verify_requests([int(c) for c in rng.integers(1, max_position, size=len(accepted))], drafts)
        return [Request(c, drafts + 1) for c in V.after_verify(before, list(accepted))]
    return requests


# decode at odd and even positions (row p - 1 from the state), prefill chunks from 0 and from an odd position
MIXED = _fixed((3, 1), (8, 1), (0, 5), (9, 3), (20, 6))
RECORDS = ("v41_mxfp8", "v41_nvfp4", "flashmla_fp8", "bf16", "fp8_per_tensor")


def _short(layout: str) -> str:
    """A layout as a scenario name spells it (the V4.1 records without their prefix)."""
    return layout.removeprefix("v41_")
PAGES = {"v41_mxfp8": (2, 16), "v41_nvfp4": (64, 48), "flashmla_fp8": (1, 0), "bf16": (2, 0), "fp8_per_tensor": (64, 0)}


def _scenario(size: str, name: str, description: str, recipe: V41Recipe, seed: int, tags=()) -> V41Scenario:
    """A catalogue entry of a size class: named ``v41_<name>`` (small) or ``v41_<size>_<name>``."""
    prefix = "v41_" if size == "small" else f"v41_{size}_"
    return V41Scenario(prefix + name, description, size, recipe, seed, tags)


def _small() -> list[V41Scenario]:
    s: list[V41Scenario] = []

    def add(name, description, recipe, seed, tags=()):
        s.append(_scenario("small", name, description, recipe, seed, tags))

    for i, layout in enumerate(RECORDS):  # every record at both ratios
        b, pad = PAGES[layout]
        add(f"r1_{_short(layout)}", f"ratio 1 into {layout}: decode and prefill chunks, padding, B = {b}",
            V41Recipe(MIXED, 1, layout=layout, entries_per_page=b, page_pad_bytes=pad, num_padding=2), 10 + i)
        add(f"r2_paged_{_short(layout)}", f"ratio 2, paged fp32 state (bs 4) into {layout}: decode at odd and even positions, "
            f"chunks from 0 and from odd positions, B = {b}",
            V41Recipe(MIXED, 2, layout=layout, entries_per_page=b, page_pad_bytes=pad, num_padding=2), 20 + i)
    _small_ratio2(add)
    _small_values(add)
    _small_operations(add)
    return s


def _small_ratio2(add) -> None:
    """Ratio 2's state options: dtypes, rings, inputs, activity."""
    chunks = _fixed((9, 2), (5, 7), (1, 3), (14, 1), (0, 4))  # chunks longer than a ring of 2 from odd positions
    for dtype in ("fp32", "bf16"):
        add(f"r2_reference_ring_{dtype}", f"ratio 2 on the reference's ring of 2 rows (bs 2), {dtype} state: chunks "
            f"from odd positions longer than the ring (the tail saves overwrite the row the chunk's first window "
            f"reads), decode", V41Recipe(chunks, 2, state="reference_ring", state_dtype=dtype, input_dtype=dtype,
                                         entries_per_page=2, layout="v41_nvfp4"), 30 + (dtype == "bf16"))
        add(f"r2_vllm_ring_{dtype}", f"ratio 2 on vLLM's ring of 8 rows (bs 8), {dtype} state: chunks of 9 and 20 "
            f"tokens, decode tokens whose rows wrap the ring's end", V41Recipe(
                _fixed((5, 9), (1, 20), (15, 1), (22, 1), (31, 2)), 2, state="vllm_ring", num_speculative=3,
                state_dtype=dtype, layout="v41_mxfp8", entries_per_page=64, page_pad_bytes=32), 32 + (dtype == "bf16"))
        add(f"r2_paged_{dtype}_state_bs2", f"ratio 2, paged {dtype} state of 2-row blocks, padded rows, B = 1",
            V41Recipe(MIXED, 2, state="paged", block_size=2, state_dtype=dtype, state_row_pad=16, entries_per_page=1,
                      layout="v41_nvfp4"), 34 + (dtype == "bf16"))
    add("r2_verify_groups", "speculative verify groups of 4 tokens (3 drafts) on vLLM's ring of 8: the window "
        "boundary at every offset inside a group", V41Recipe(_verify(6, 3), 2, state="vllm_ring", num_speculative=3,
                                                           layout="v41_nvfp4", entries_per_page=2), 40)
    add("r2_after_rejected_drafts", "the step after a verify step that rejected some drafts: each request starts "
        "again inside its group, over ring rows the rejected drafts wrote", V41Recipe(
            _after_rejection(3, (0, 1, 2, 3, 0, 2)), 2, state="vllm_ring", num_speculative=3, layout="v41_mxfp8",
            entries_per_page=2, state_dtype="bf16"), 41)
    add("r2_bf16_inputs", "ratio 2 with bf16 kv and score, a paged fp32 state", V41Recipe(
        MIXED, 2, input_dtype="bf16", layout="v41_mxfp8", entries_per_page=2), 42)
    add("r2_mixed_inputs", "ratio 2 with fp32 kv and bf16 score in separate allocations, a bf16 state", V41Recipe(
        MIXED, 2, input_dtype="mixed", state_dtype="bf16", layout="v41_nvfp4", entries_per_page=2), 43)
    add("r2_separate_projections", "ratio 2 with kv and score in two allocations with padded rows", V41Recipe(
        MIXED, 2, separate_projections=True, layout="flashmla_fp8", entries_per_page=2), 44)
    add("r2_inactive_tokens", "boundary tokens without a cache slot, tokens without a state slot (saved all the same), "
        "padding: inactive tokens write nothing, not even their latent row", V41Recipe(
            _fixed((0, 12), (7, 9), (30, 1)), 2, drop_entry_fraction=0.3, unslotted_fraction=0.25, num_padding=3,
            layout="v41_nvfp4", entries_per_page=2), 45)
    add("r1_bf16_inputs_bf16_weight", "ratio 1 with bf16 kv (its own rounding is exact) and a bf16 norm weight",
        V41Recipe(MIXED, 1, input_dtype="bf16", bf16_weight=True, layout="v41_nvfp4", entries_per_page=2), 46)
    add("r1_inactive_tokens", "ratio 1 tokens without a cache slot and padding write nothing",
        V41Recipe(_fixed((0, 9), (11, 4)), 1, drop_entry_fraction=0.4, num_padding=3, layout="v41_mxfp8",
                  entries_per_page=2, latent_row_pad=8), 47)


def _small_values(add) -> None:
    """Values on ties, zeros, saturation and floors."""
    for ratio in (1, 2):
        add(f"r{ratio}_pooled_ties", f"ratio {ratio}: pooled vectors exactly halfway between two bf16 values (the "
            f"latent shows whether x is rounded to bf16, to even, before the norm)",
            V41Recipe(MIXED, ratio, values=("pooled_ties",), layout="v41_mxfp8", entries_per_page=2), 50 + ratio)
        add(f"r{ratio}_zeros", f"ratio {ratio}: +0 and -0 in kv and in the norm weight, all-zero NVFP4 tiles and MXFP8 "
            f"blocks, RoPE pairs of zeros", V41Recipe(MIXED, ratio, values=("zeros",), layout="v41_nvfp4",
                                                      entries_per_page=2), 52 + ratio)
        add(f"r{ratio}_zeros_bf16_layout", f"ratio {ratio}: signed zeros into the bf16 layout",
            V41Recipe(MIXED, ratio, values=("zeros",), layout="bf16", entries_per_page=2), 54 + ratio)
    add("r1_scale_saturation", "norm weights up to 2e4: NVFP4 scales saturate at 448 and codes at +-6",
        V41Recipe(MIXED, 1, values=("huge",), layout="v41_nvfp4", entries_per_page=2), 56)
    add("r2_scale_saturation_mxfp8", "ratio 2, norm weights up to 2e4 into v41_mxfp8 (large UE8M0 exponents)",
        V41Recipe(MIXED, 2, values=("huge",), layout="v41_mxfp8", entries_per_page=2), 57)
    add("r1_amax_floors", "tiles and blocks below NVFP4's 6*2^-9 and MXFP8's 1e-4 amax floors",
        V41Recipe(MIXED, 1, values=("tiny",), layout="v41_nvfp4", entries_per_page=2), 58)
    add("r2_amax_floors_mxfp8", "ratio 2, blocks below MXFP8's 1e-4 amax floor",
        V41Recipe(MIXED, 2, values=("tiny",), layout="v41_mxfp8", entries_per_page=2), 59)
    add("r2_fp8_per_tensor_saturation", "ratio 2 into fp8_per_tensor with scale 1e-3: values saturate at +-448",
        V41Recipe(MIXED, 2, layout="fp8_per_tensor", fp8_scale=1e-3, entries_per_page=2), 60)


def _small_operations(add) -> None:
    """The operations alone, and the combined call without a latent."""
    for ratio in (1, 2):
        add(f"r{ratio}_no_latent", f"ratio {ratio} combined call with latent=None: the records and the state only",
            V41Recipe(MIXED, ratio, latent=False, layout="v41_nvfp4", entries_per_page=2), 70 + ratio)
        add(f"r{ratio}_compress_norm", f"ratio {ratio}: v41_compress_norm alone, latent rows padded",
            V41Recipe(MIXED, ratio, operation="compress_norm", layout=None, latent_row_pad=8,
                      state="vllm_ring" if ratio == 2 else "paged", unslotted_fraction=0.2), 72 + ratio)
        for i, layout in enumerate(RECORDS):
            b, pad = PAGES[layout]
            profiles = {"v41_nvfp4": ("fp4_ties", "rope_fp4_midpoints"), "v41_mxfp8": ("fp8_ties", "rope_fp8_midpoints"),
                        "flashmla_fp8": ("rope_ties", "fp8_ties")}.get(layout, ("rope_ties",))
            add(f"r{ratio}_store_{_short(layout)}", f"ratio {ratio}: v41_rope_quant_store alone into {layout} from a given "
                f"latent ({', '.join(profiles)}), B = {b}", V41Recipe(
                    _fixed((3, 2), (8, 5), (0, 9)), ratio, operation="rope_quant_store", layout=layout,
                    entries_per_page=b, page_pad_bytes=pad, latent_row_pad=8, values=profiles,
                    drop_entry_fraction=0.15), 80 + 10 * ratio + i)
        for i, layout in enumerate(V41_INDEX_KEY_LAYOUTS):
            add(f"r{ratio}_index_key_{layout}", f"ratio {ratio}: v41_index_key_store into {layout}, bf16 weight",
                V41Recipe(MIXED, ratio, operation="index_key_store", layout=layout, entries_per_page=2 + 62 * i,
                          page_pad_bytes=16, bf16_weight=i == 0, drop_entry_fraction=0.2), 100 + 10 * ratio + i)


def _medium() -> list[V41Scenario]:
    scenario = partial(_scenario, "medium")

    # Every request of a step gets the pages of the step's largest position (spec.v41_batch.v41_tables):
    # decode positions stay small, so that the caches stay below a gigabyte.
    return [
        scenario("r1_decode_1024_nvfp4", "ratio 1, 1024 decode tokens into v41_nvfp4 (about half a million values)",
                 V41Recipe(_decode(1024, 128), 1, layout="v41_nvfp4", entries_per_page=8), 200),
        scenario("r2_vllm_ring_512_mxfp8", "ratio 2 on vLLM's rings, 512 requests of verify groups into v41_mxfp8",
                 V41Recipe(_verify(512, 3, 256), 2, state="vllm_ring", num_speculative=3, layout="v41_mxfp8",
                           entries_per_page=16), 201),
        scenario("r2_paged_bf16_prefill_flashmla", "ratio 2, bf16 state and inputs: a 1024-token prefill and 32 "
                 "decode tokens into flashmla_fp8", V41Recipe(lambda rng: [Request(1, 1024)] + _decode(32, 64)(rng), 2,
                                                                state_dtype="bf16", input_dtype="bf16",
                                                                layout="flashmla_fp8", entries_per_page=64), 202),
        scenario("r2_index_key_2048", "ratio 2 index keys of 2048 tokens into indexer_mxfp4",
                 V41Recipe(_decode(2048, 512), 2, operation="index_key_store", layout="indexer_mxfp4",
                           entries_per_page=64), 203),
    ]


def _large() -> list[V41Scenario]:
    scenario = partial(_scenario, "large")

    return [
        scenario("r1_decode_8192_mxfp8", "ratio 1, 8192 decode tokens into v41_mxfp8",
                 V41Recipe(_decode(8192, 64), 1, layout="v41_mxfp8", entries_per_page=2), 300),
        scenario("r2_prefill_4096_vllm_ring", "ratio 2 on vLLM's rings: a 4096-token chunk (tail saves) and 256 "
                 "decode tokens into v41_nvfp4", V41Recipe(lambda rng: [Request(3, 4096)] + _decode(256)(rng), 2,
                                                           state="vllm_ring", layout="v41_nvfp4", entries_per_page=64,
                                                           num_padding=64), 301),
        scenario("r2_reference_ring_bf16_16384", "ratio 2 on the reference's rings of 2, bf16: 16384 decode tokens",
                 V41Recipe(_decode(16384, 128), 2, state="reference_ring", state_dtype="bf16", input_dtype="bf16",
                           layout="v41_nvfp4", entries_per_page=8), 302),
    ]


V41_CATALOGUE: tuple[V41Scenario, ...] = tuple(_small() + _medium() + _large())


def v41_scenarios(names: list[str] | None = None, size: str | None = None) -> list[V41Scenario]:
    """V4.1 catalogue entries by name (glob patterns) and/or size class (cumulative, as V4's)."""
    import fnmatch

    rank = {"small": 0, "medium": 1, "large": 2}
    if size not in (None, "all") and size not in rank:
        raise ValueError(f"size: expected one of small, medium, large, all, got {size!r}")
    chosen = [sc for sc in V41_CATALOGUE if size in (None, "all") or rank[sc.size] <= rank[size]]
    if names:
        chosen = [sc for sc in chosen if any(fnmatch.fnmatch(sc.name, n) for n in names)]
    return chosen


__all__ = ["V41_CATALOGUE", "V41Inputs", "V41Recipe", "V41Scenario", "build_v41", "v41_scenarios", "LATENT_PROFILES"]
