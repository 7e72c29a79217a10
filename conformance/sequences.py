"""Multi-step sequences: several layer steps on the same caches, checked after every step.

A scenario of :mod:`.scenarios` is one step from fresh buffers. A *sequence* carries the state
cache and the compressed cache from step to step, as an engine does: speculative decoding
whose drafts are rejected (the next group starts inside the last one, so positions run again
with other tokens and overwrite the rows and entries the rejected drafts wrote), accepted
tokens run again at the same positions, beside prefill chunks and plain decode. The
implementation's own caches go into each next step (its save feeds its compress, and its
entries stay), and after every step both whole allocations are compared with the spec's.
Implementations that offer ``save_and_compress_norm_rope_store`` make every other step with it.

Each request holds one block-table row for the whole sequence (its blocks reserved up front,
so every step has the same ``block_table``: a captured graph's would not change either).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np

from ..spec import batch as B
from ..spec.constants import HEAD_DIM
from . import step_call
from .arrays import arrays_for
from .buffers import Buffer
from .engine import BlockLists, BlockPool, Geometry, entry_slot, grow_state_blocks, step_metadata
from .implementations import LoadedImplementation
from .runner import METADATA, Verdict, counts_pass, features, first_difference, spec_step, tolerant_counts
from .scenarios import StepInputs
from .speculative import Plan, decode_steps, prefill_steps, verify_steps
from .step_call import StaticArgs, StepArrays


@dataclass(frozen=True)
class SequenceRecipe:
    """How to build a sequence: each request's plan (one entry per step) and the layer."""

    plans: tuple[Plan, ...]  # per request (a block-table row): (first position, count) or None, per step
    compress_ratio: int
    block_size: int
    entries_per_page: int
    layout: str = "flashmla_fp8"
    bf16_weight: bool = True
    fp8_scale: float | None = None
    num_padding: int = 2  # padding tokens (slot -1) after each step's tokens
    head_dim: int = HEAD_DIM  # 512, or 128 for the indexer compressor (SPEC §12)
    hadamard: bool = False


@dataclass(frozen=True)
class Sequence:
    name: str
    description: str
    size: str  # "small": everywhere
    recipe: SequenceRecipe
    seed: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)
    sections: tuple[str, ...] = ("§4", "§5", "§6", "§7")

    @property
    def device(self) -> None:  # like a scenario: runs on every device
        return None

    def build(self) -> tuple[StepInputs, ...]:
        return build_sequence(self.recipe, np.random.default_rng(self.seed))


def _plan_end(plan: Plan) -> int:
    """One past the last position a request's plan reaches."""
    return max(first + count for first, count in filter(None, plan))


def build_sequence(recipe: SequenceRecipe, rng: np.random.Generator) -> tuple[StepInputs, ...]:
    """Every step's inputs. All share one state buffer and one compressed-cache buffer (the
    first step's initial contents: random rows, canary entries) and one block table."""
    r, bs, entries = recipe.compress_ratio, recipe.block_size, recipe.entries_per_page
    ends = [_plan_end(plan) for plan in recipe.plans]
    state_pool = BlockPool(sum(-(-end // bs) for end in ends) + 3, rng)
    page_pool = BlockPool(sum((end - 1) // r // entries + 1 for end in ends) + 2, rng)
    owners = [BlockLists() for _ in recipe.plans]
    for owner, end in zip(owners, ends):  # every block and page the sequence reaches, up front
        grow_state_blocks(owner, end, bs, state_pool)
        entry_slot(owner, max(end - 1, 0) // r, entries, page_pool)
    table_shape = (len(owners), max(len(o.state_blocks) for o in owners))
    geometry = Geometry(r, bs, entries)
    head = recipe.head_dim
    state = Buffer.of(B.random_state_cache(state_pool.size, bs, r, rng, head_dim=head))
    k_cache = Buffer.of(B.canary_k_cache(recipe.layout, page_pool.size, entries),
                        "float8_e4m3fn" if recipe.layout == "fp8_per_tensor" else None)
    ape = B.random_ape(r, rng, head_dim=head)
    weight = B.random_norm_weight(rng, bf16=recipe.bf16_weight, head_dim=head)
    cos_sin = B.rope_cos_sin_cache(max(ends) + 8)
    steps = []
    for s in range(max(len(plan) for plan in recipe.plans)):
        plan = [(row, *p[s]) for row, p in enumerate(recipe.plans) if s < len(p) and p[s] is not None]
        tokens = sum(count for _, _, count in plan)
        batch = step_metadata(plan, owners, geometry, state_pool, page_pool, padded_tokens=tokens + recipe.num_padding,
                              table_shape=table_shape)
        steps.append(StepInputs(batch=batch, kv_score=B.random_kv_score(batch.num_tokens, r, rng, head_dim=head), ape=ape,
                                state_cache=state, rms_norm_weight=weight, rms_norm_eps=1e-6, cos_sin_cache=cos_sin,
                                k_cache=k_cache, layout=recipe.layout, fp8_scale=recipe.fp8_scale, hadamard=recipe.hadamard))
    return tuple(steps)


# ---- the catalogue ------------------------------------------------------------------------
C4 = dict(compress_ratio=4, block_size=4, entries_per_page=64)
C128 = dict(compress_ratio=128, block_size=8, entries_per_page=2)


def _sequences() -> list[Sequence]:
    s = []

    def add(name, description, recipe, seed, sections=("§4", "§5", "§6", "§7")):
        s.append(Sequence(name, description, "small", recipe, seed, ("speculative",), sections))

    add("rollback_c4_verify8", "C4 groups of 8 (two boundaries each) whose drafts are rejected, all, some or none, "
        "beside groups over the first window, a chunked prefill turning to decode, and decode",
        SequenceRecipe((verify_steps(21, 8, (1, 3, 8, 5, 2)), verify_steps(2, 4, (2, 1, 4, 3, 1)),
                        prefill_steps(0, (9, 9, 7)) + decode_steps(25, 2), decode_steps(40, 5)), **C4, num_padding=3), 90)
    add("rollback_c4_rerun_accepted", "C4: accepted tokens run again at the same positions, whole groups run "
        "again, groups of 6, 2 and 8", SequenceRecipe((verify_steps(10, 6, (3, 0, 6, 2, 4)),
                                                       verify_steps(29, 2, (1, 2, 0, 2, 1)),
                                                       verify_steps(0, 8, (8, 4, 0, 8, 8))), **C4), 91)
    add("rollback_c128_verify", "C128 groups of 8 and 5 crossing boundaries 127 and 255 as drafts are rejected and "
        "run again, beside decode at a boundary and a prefill in chunks",
        SequenceRecipe((verify_steps(122, 8, (2, 3, 8, 1, 7)), verify_steps(250, 5, (1, 1, 5, 0, 5)),
                        decode_steps(381, 5), prefill_steps(0, (60, 60, 60))), **C128), 92)
    add("rollback_c128_bs4_bf16", "C128 with 4-row state blocks (generic path) into the bf16 layout, groups of 7",
        SequenceRecipe((verify_steps(124, 7, (1, 2, 7, 3)), verify_steps(508, 3, (1, 3, 2, 3))), compress_ratio=128,
                       block_size=4, entries_per_page=3, layout="bf16", bf16_weight=False), 93)
    add("rollback_c4_fp8_per_tensor", "C4 groups of 8 and 3 into the fp8_per_tensor layout (scale 0.0371)",
        SequenceRecipe((verify_steps(5, 8, (4, 0, 8, 2)), verify_steps(14, 3, (3, 1, 0, 3))), **C4,
                       layout="fp8_per_tensor", fp8_scale=0.0371), 94)
    add("rollback_indexer_c4_mxfp4", "indexer C4 groups of 5 and 3 into indexer_mxfp4 with the rotation",
        SequenceRecipe((verify_steps(13, 5, (2, 1, 5, 3)), verify_steps(0, 3, (1, 1, 3, 2))), compress_ratio=4,
                       block_size=16, entries_per_page=8, layout="indexer_mxfp4", head_dim=128, hadamard=True), 95,
        ("§4", "§5", "§12"))
    add("rollback_indexer_c128_fp8", "indexer C128 groups of 6 crossing boundary 127 into indexer_fp8",
        SequenceRecipe((verify_steps(125, 6, (1, 6, 2, 4)), decode_steps(255, 4)), compress_ratio=128, block_size=8,
                       entries_per_page=3, layout="indexer_fp8", head_dim=128), 96, ("§4", "§5", "§12"))
    return s


SEQUENCES: tuple[Sequence, ...] = tuple(_sequences())


def sequences(names: list[str] | None = None) -> list[Sequence]:
    """Sequences by name (glob patterns allowed; a name that matches none is not an error here:
    the scenario catalogue may hold it). Every sequence is small, so every size holds them all."""
    import fnmatch

    return [sq for sq in SEQUENCES if not names or any(fnmatch.fnmatch(sq.name, n) for n in names)]


# ---- running one ------------------------------------------------------------------------------
_CACHE: dict[str, tuple[StepInputs, ...]] = {}  # the last sequence built (every implementation runs it in turn)


def sequence_steps(sequence: Sequence) -> tuple[StepInputs, ...]:
    if sequence.name not in _CACHE:
        _CACHE.clear()
        _CACHE[sequence.name] = sequence.build()
    return _CACHE[sequence.name]


def run_sequence(impl: LoadedImplementation, sequence: Sequence, *, tolerant: bool = False,
                 device: str | None = None) -> Verdict:
    """Judge ``impl`` on every step of ``sequence``, its caches carried from step to step.

    Exact: the first step whose state or compressed cache differs from the spec's in any byte
    fails the sequence. Tolerant: the state must stay exact; each step's entries are judged by
    SPEC §10's bounds and then replaced by the spec's (the store never reads them back)."""
    device = device or impl.device()
    if device is None:
        return Verdict(sequence.name, impl.name, 0, 0, "skip", f"needs one of {impl.devices}; none found here")
    steps = sequence_steps(sequence)
    verdict = Verdict(sequence.name, impl.name, sum(s.batch.num_tokens for s in steps),
                      sum(s.batch.num_active for s in steps), "pass")
    reason = impl.capabilities.unsupported(features(steps[0]))
    if reason:
        verdict.status, verdict.first_difference = "unsupported", f"declared unsupported: {reason}"
        return verdict
    arrays = arrays_for(impl.takes_numpy, device)
    spec_state_owner, spec_state = steps[0].state_cache.numpy_copy()
    spec_k_owner, spec_k = steps[0].k_cache.numpy_copy()
    state_owner, state = arrays.allocate(steps[0].state_cache)
    k_owner, k_cache = arrays.allocate(steps[0].k_cache)
    forms = step_call.forms_of(impl.target)
    for index, inputs in enumerate(steps):
        form = forms[index % len(forms)]
        label = f"step {index} ({form})"
        spec_step(inputs, spec_state, spec_k)
        strided = inputs.strided_inputs
        a = StepArrays(kv_score=arrays.convert(inputs.kv_score, strided), ape=arrays.convert(inputs.ape, strided),
                       **{name: arrays.convert(getattr(inputs.batch, name), strided) for name in METADATA},
                       rms_norm_weight=arrays.convert(inputs.rms_norm_weight, strided),
                       cos_sin_cache=arrays.convert(inputs.cos_sin_cache, strided), state_cache=state, k_cache=k_cache)
        try:
            step_call.step(impl.target, a, StaticArgs.of(inputs), form)
            state_bytes, k_bytes = arrays.host_bytes(state_owner), arrays.host_bytes(k_owner)
        except Exception as error:  # an implementation may fail in any way; report it
            verdict.status, verdict.counts = "error", {"traceback": traceback.format_exc()}
            verdict.first_difference = f"{label}: {type(error).__name__}: {error}".splitlines()[0][:300]
            return verdict
        if not np.array_equal(state_bytes, spec_state_owner):
            text, verdict.region = first_difference(inputs, spec_state_owner, state_bytes, "state")
            verdict.status, verdict.first_difference = "fail", f"{label}: {text}"
            return verdict
        if np.array_equal(k_bytes, spec_k_owner):
            continue
        text, region = first_difference(inputs, spec_k_owner, k_bytes, "k_cache")
        if not tolerant:
            verdict.status, verdict.first_difference, verdict.region = "fail", f"{label}: {text}", region
            return verdict
        for kind, n in tolerant_counts(inputs, spec_k_owner, k_bytes, spec_state_owner).items():
            verdict.counts[kind] = verdict.counts.get(kind, 0) + n
        verdict.first_difference = verdict.first_difference or f"{label}: {text}"
        if not counts_pass(verdict.counts):
            verdict.status, verdict.region = "fail", region
            return verdict
        arrays.load(k_owner, spec_k_owner)  # the next step starts from the spec's entries
    return verdict
