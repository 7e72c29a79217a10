"""SPEC §13 in a conformance step: the state options' keywords of the two calls, and the
arguments of the step call ``compress_and_save`` (§13.4), for the spec and an implementation alike.

The two calls get a §13 keyword only where the scenario uses the option (``ape_at``,
``ring_capacity``, and ``ape`` on the compress where it adds it), so an implementation that
declares none of §13 is called exactly as before; a bf16 state is the state tensor's dtype.
The step call gets every argument SPEC §13.4 names, ``kv`` and ``score`` as two views of one
projection output.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import spec
from .scenarios import StepInputs

STEP_METADATA = ("positions", "token_to_req_indices", "query_start_loc", "slot_mapping", "save_slot_mapping",
                 "block_table")  # compress_and_save's per-step arrays, in its argument order (then bs)


def save_keywords(inputs) -> dict:
    """``save_partial_states``' SPEC §13 keywords: ``ape_at`` and ``ring_capacity`` where not the
    default (``inputs``: a :class:`~.scenarios.StepInputs` or a :class:`~.step_call.StaticArgs`)."""
    keywords = {}
    if inputs.ape_at != "save":
        keywords["ape_at"] = inputs.ape_at
    if inputs.ring_capacity is not None:
        keywords["ring_capacity"] = inputs.ring_capacity
    return keywords


def compress_keywords(inputs, ape: Any) -> dict:
    """``compress_norm_rope_store``'s SPEC §13 keywords: the save's, and ``ape`` (fp32 ``[r, SW]``, as
    the implementation takes arrays) where pooling adds it (``ape_at="compress"``)."""
    keywords = save_keywords(inputs)
    if inputs.ape_at == "compress":
        keywords["ape"] = ape
    return keywords


def projection_halves(projections: Any) -> tuple[Any, Any]:
    """``kv`` and ``score``: the two ``[T, SW]`` halves of a ``[T, 2*SW]`` projection view (NumPy or
    torch), views into its allocation."""
    width = projections.shape[1] // 2
    return projections[:, :width], projections[:, width:]


def step_call_arguments(inputs: StepInputs, convert: Callable, projections: Any, state_cache: Any,
                        k_cache: Any) -> tuple[list, dict]:
    """``compress_and_save``'s ``(positional, keywords)``: ``projections`` (fp32 ``[T, 2*SW]`` view),
    ``state_cache`` and ``k_cache`` (views into their allocations) as given; every other array through
    ``convert`` (numpy array -> the implementation's array)."""
    b = inputs.batch
    kv, score = projection_halves(projections)
    metadata = [convert(getattr(b, name)) for name in STEP_METADATA]
    positional = [kv, score, convert(inputs.ape), *metadata, b.block_size, state_cache, convert(inputs.rms_norm_weight),
                  inputs.rms_norm_eps, convert(inputs.cos_sin_cache), k_cache, convert(b.kv_slot_mapping)]
    keywords = dict(compress_ratio=b.compress_ratio, layout=inputs.layout, fp8_scale=inputs.fp8_scale,
                    ape_at=inputs.ape_at, ring_capacity=inputs.ring_capacity,
                    **({"hadamard": True} if inputs.hadamard else {}))
    return positional, keywords


def spec_step_call(inputs: StepInputs) -> tuple[np.ndarray, np.ndarray]:
    """The spec's ``compress_and_save`` on copies of the step's allocations (debug checks on: a
    scenario bug shows as an error here); returns the state and ``k_cache`` allocations after it."""
    state_owner, state = inputs.state_cache.numpy_copy()
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    _, projections = inputs.projections.numpy_copy()
    positional, keywords = step_call_arguments(inputs, lambda array: array, projections, state, k_cache)
    spec.compress_and_save(*positional, **keywords, debug=True)
    return state_owner, k_owner
