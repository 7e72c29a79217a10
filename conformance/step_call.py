"""One layer step's calls, as an engine makes them (SPEC §8).

A step is ``save_partial_states`` then ``compress_norm_rope_store`` ("two calls"), or one
``save_and_compress_norm_rope_store`` where the implementation offers it ("combined": the
same bytes by SPEC §8). :class:`StepArrays` holds the arrays of a step as the implementation
takes them (NumPy or torch), :class:`StaticArgs` the arguments a captured graph bakes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import state_calls
from .implementations import takes_keywords

FORMS = ("two calls", "combined")  # the ways of making a step's calls


@dataclass(frozen=True)
class StaticArgs:
    """The scalar arguments of a step (fixed for a layer; baked into a captured graph)."""

    block_size: int  # bs: rows per state block
    rms_norm_eps: float
    compress_ratio: int  # 4 or 128
    layout: str
    fp8_scale: float | None = None
    hadamard: bool = False  # SPEC §12's rotation (indexer layouts only)
    ape_at: str = "save"  # SPEC §13.2
    ring_capacity: int | None = None  # SPEC §13.3: None = paged

    @classmethod
    def of(cls, inputs) -> "StaticArgs":
        """The static arguments of a conformance step (:class:`~.scenarios.StepInputs`)."""
        b = inputs.batch
        return cls(b.block_size, inputs.rms_norm_eps, b.compress_ratio, inputs.layout, inputs.fp8_scale, inputs.hadamard,
                   inputs.ape_at, inputs.ring_capacity)

    def keywords(self) -> dict:
        """The compress call's keywords (``hadamard`` only where it is on: only the indexer's
        implementations need take it)."""
        return dict(compress_ratio=self.compress_ratio, layout=self.layout, fp8_scale=self.fp8_scale,
                    **({"hadamard": True} if self.hadamard else {}))


@dataclass
class StepArrays:
    """A step's arrays as one implementation takes them (NumPy arrays or torch tensors)."""

    kv_score: Any  # fp32 [T, 2*SW]: kv then score
    ape: Any  # fp32 [r, SW]
    token_to_req_indices: Any  # int32 [T]
    positions: Any  # int64 [T]
    slot_mapping: Any  # int64 [T], negative = padding
    block_table: Any  # int32 [num_reqs, max_blocks]
    kv_slot_mapping: Any  # int64 [T], negative = no entry
    rms_norm_weight: Any  # fp32 or bf16 (NumPy: uint16 patterns) [H]
    cos_sin_cache: Any  # fp32 [max_pos, 64]
    state_cache: Any  # fp32 [num_state_blocks, bs, 2*SW] view into its allocation
    k_cache: Any  # the layout's view into its allocation (SPEC §7, §12)


def has_combined(target) -> bool:
    """Whether the implementation offers ``save_and_compress_norm_rope_store``."""
    return callable(getattr(target, "save_and_compress_norm_rope_store", None))


def forms_of(target, inputs=None) -> tuple[str, ...]:
    """The call forms an implementation offers (for a step of ``inputs``' static arguments: the
    combined call only where it takes the step's SPEC §13 options)."""
    if not has_combined(target):
        return FORMS[:1]
    if inputs is not None and not takes_keywords(target.save_and_compress_norm_rope_store,
                                                 *state_calls.save_keywords(inputs)):
        return FORMS[:1]
    return FORMS


def save(target, a: StepArrays, s: StaticArgs) -> None:
    target.save_partial_states(a.kv_score, a.ape, a.positions, a.slot_mapping, a.state_cache, s.block_size,
                               **state_calls.save_keywords(s))


def compress(target, a: StepArrays, s: StaticArgs) -> None:
    target.compress_norm_rope_store(
        a.state_cache, a.token_to_req_indices, a.positions, a.slot_mapping, a.block_table, s.block_size,
        a.rms_norm_weight, s.rms_norm_eps, a.cos_sin_cache, a.k_cache, a.kv_slot_mapping, **s.keywords(),
        **state_calls.compress_keywords(s, a.ape))


def combined(target, a: StepArrays, s: StaticArgs) -> None:
    target.save_and_compress_norm_rope_store(
        a.kv_score, a.ape, a.state_cache, a.token_to_req_indices, a.positions, a.slot_mapping, a.block_table,
        s.block_size, a.rms_norm_weight, s.rms_norm_eps, a.cos_sin_cache, a.k_cache, a.kv_slot_mapping, **s.keywords(),
        **state_calls.save_keywords(s))


def step(target, a: StepArrays, s: StaticArgs, form: str) -> None:
    """The step's calls in ``form`` ("two calls" or "combined")."""
    if form == "combined":
        combined(target, a, s)
    elif form == "two calls":
        save(target, a, s)
        compress(target, a, s)
    else:
        raise ValueError(f"form: expected one of {FORMS}, got {form!r}")
