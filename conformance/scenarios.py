"""The scenario catalogue: named, documented layer steps built with the spec's batch builders.

A scenario is one layer step: ``save_partial_states`` for this step's tokens, then
``compress_norm_rope_store``. Each has a size class: ``small`` runs everywhere (CPU, the
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

F32 = np.float32


@dataclass
class StepInputs:
    """Everything one step's two calls take, as NumPy data (buffers with their padding)."""

    batch: Batch
    kv_score: np.ndarray  # float32 [T, 2*SW]: this step's projections
    ape: np.ndarray  # float32 [r, SW]
    state_cache: Buffer  # float32 [num_blocks, bs, 2*SW] view (padding = NaN canary)
    rms_norm_weight: np.ndarray  # float32 [512] or uint16 [512] (bf16 patterns)
    rms_norm_eps: float
    cos_sin_cache: np.ndarray  # float32 [max_pos, 64]
    k_cache: Buffer  # canary-filled compressed cache of the layout
    layout: str
    fp8_scale: float | None = None
    strided_inputs: bool = False  # hand the implementation strided views (see runner.to_torch)


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


VALUE_PROFILES = {
    "normal": _normal,
    "tiny_amax": _tiny_amax,
    "huge": _huge,
    "equal_scores": _equal_scores,
    "spread_scores": _spread_scores,
    "signed_zeros": _signed_zeros,
    "subnormal_kv": _subnormal_kv,
}


def build_step(recipe: StepRecipe, rng: np.random.Generator) -> StepInputs:
    """Metadata from the batch builder, random buffers, then the value profile."""
    batch = B.build_batch(
        recipe.requests(rng), compress_ratio=recipe.compress_ratio, block_size=recipe.block_size,
        entries_per_page=recipe.entries_per_page, rng=rng, num_padding=recipe.num_padding,
        padding_at_end=recipe.padding_at_end, drop_entry_fraction=recipe.drop_entry_fraction,
        unsaved_fraction=recipe.unsaved_fraction, slot_for_non_boundary=recipe.slot_for_non_boundary,
    )
    state = B.random_state_cache(batch.num_state_blocks, recipe.block_size, recipe.compress_ratio, rng,
                                 row_pad=recipe.row_pad, block_pad_rows=recipe.block_pad_rows)
    kv_score = B.random_kv_score(batch.num_tokens, recipe.compress_ratio, rng)
    weight = (1.0 + 0.25 * rng.standard_normal(HEAD_DIM)).astype(F32)
    state, kv_score, weight = VALUE_PROFILES[recipe.values](state, kv_score, weight, rng)
    if recipe.bf16_weight:
        weight = (weight.view(np.uint32) >> np.uint32(16)).astype(np.uint16)  # truncation: any bf16 will do
    k_cache = B.canary_k_cache(recipe.layout, batch.num_pages, recipe.entries_per_page, page_pad_bytes=recipe.page_pad_bytes)
    max_pos = int(batch.positions.max()) + 1
    return StepInputs(
        batch=batch,
        kv_score=kv_score,
        ape=B.random_ape(recipe.compress_ratio, rng),
        state_cache=Buffer.of(state),
        rms_norm_weight=weight,
        rms_norm_eps=recipe.rms_norm_eps,
        cos_sin_cache=B.rope_cos_sin_cache(max_pos + 7),
        k_cache=Buffer.of(k_cache, "float8_e4m3fn" if recipe.layout == "fp8_per_tensor" else None),
        layout=recipe.layout,
        fp8_scale=recipe.fp8_scale,
        strided_inputs=recipe.strided_inputs,
    )


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
    return s


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
    return s


def _medium() -> list[Scenario]:
    """Enough values (about a million) that 1-ulp arithmetic differences reach the bytes."""
    return [
        Scenario("medium_c128_decode_512", "C128 decode boundary batch of 512: catches non-tree sums and approximate exp2",
                 "medium", StepRecipe(_decode(512, 128, 32), **C128), 11),
        Scenario("medium_c4_decode_2048", "C4 decode boundary batch of 2048: catches approximate exp2 and rsqrt",
                 "medium", StepRecipe(_decode(2048, 4, 128), **C4), 12),
    ]


CATALOGUE: tuple[Scenario, ...] = tuple(_small() + _medium() + _large())


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
