"""Batch invariance: every byte a token writes is the same whether it runs alone, with its
request, or inside any batch.

An engine runs a token in whatever batch the scheduler formed: verified with its drafts,
decoded alone, padded into a graph's bucket. Greedy output that differs between batch
verification and single-token decode is the symptom of an implementation whose bytes depend
on the batch. Exact implementations are batch-invariant by construction; this verdict says so
of any implementation, a tolerant one included, by comparing it with *itself*.

For one step, the reference is the implementation's own result on the whole step. The step's
tokens are then split (:func:`partitionings`: a few tokens alone, each of a few requests with
its own tokens, random partitions) and each part is one call of its own: its saves into a copy
of the step's initial state, its stores into a fresh canary cache, every store reading the
state the whole step's save leaves (the spec's, the same for every part). Tokens of different
parts write different rows and entries, so once every part of a partitioning has run, both
allocations must equal the whole step's, byte for byte (a part that writes where none of its
tokens does shows too).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, replace

import numpy as np

from ..spec.batch import Batch
from . import step_call
from .arrays import HostArrays, TorchArrays, arrays_for
from .implementations import LoadedImplementation
from .runner import StatusVerdict, features, first_difference, spec_result
from .scenarios import Scenario, StepInputs
from .step_call import StaticArgs, StepArrays

TOKEN_ARRAYS = ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping")  # one value per token


@dataclass(frozen=True)
class Partitioning:
    """One way of splitting a step's tokens into calls."""

    name: str  # "alone", "by request", "random"
    parts: tuple[np.ndarray, ...]  # int64 token indices per call, ascending; together every token once


@dataclass(frozen=True)
class InvarianceConfig:
    """How many calls a step is checked with."""

    alone: int = 3  # tokens run alone (active ones first), the rest in one more call
    requests: int = 4  # requests run each in a call of its own with all its tokens, the rest in one more call
    random_partitions: int = 1  # random partitions into 2 ... 4 calls
    seed: int = 0


@dataclass
class InvarianceVerdict(StatusVerdict):
    name: str  # the scenario (or step)
    implementation: str
    status: str  # "pass", "fail", "error", "unsupported", "skip"
    detail: str = ""
    calls: int = 0  # calls made (the whole step's included)
    traceback: str = ""  # of an error


def partitionings(batch: Batch, config: InvarianceConfig, rng: np.random.Generator) -> list[Partitioning]:
    """The partitionings a step is checked with (each with at least two calls)."""
    tokens = np.arange(batch.num_tokens)
    found = []
    active = np.flatnonzero(batch.active)
    others = np.setdiff1d(tokens, active)
    alone = np.concatenate([rng.permutation(active), rng.permutation(others)])[:config.alone]
    found.append(("alone", [np.array([t]) for t in sorted(alone)] + [np.setdiff1d(tokens, alone)]))
    rows = np.unique(batch.token_to_req_indices)
    chosen = rng.permutation(rows)[:config.requests]
    own = [np.flatnonzero(batch.token_to_req_indices == row) for row in sorted(chosen)]
    found.append(("by request", own + [np.flatnonzero(~np.isin(batch.token_to_req_indices, chosen))]))
    for _ in range(config.random_partitions):
        label = rng.integers(0, int(rng.integers(2, 5)), size=batch.num_tokens)
        found.append(("random", [np.flatnonzero(label == k) for k in range(label.max() + 1)]))
    result = []
    for name, parts in found:
        parts = tuple(p.astype(np.int64) for p in parts if p.size)
        if len(parts) > 1:
            result.append(Partitioning(name, parts))
    return result


def sub_batch(batch: Batch, tokens: np.ndarray) -> Batch:
    """The step's tokens ``tokens`` (indices) as a call of their own: same block table and buffers."""
    return replace(batch, **{name: getattr(batch, name)[tokens] for name in TOKEN_ARRAYS})


def _run_parts(target, arrays: HostArrays | TorchArrays, inputs: StepInputs, state_after_save: np.ndarray,
               parts: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Each part's save (into one copy of the initial state) and store (into one canary cache,
    reading ``state_after_save``, the whole step's post-save state allocation, uint8):
    ``(state bytes, k_cache bytes)`` once every part has run."""
    strided = inputs.strided_inputs
    state_owner, state = arrays.allocate(inputs.state_cache)
    saved_owner, saved = arrays.allocate(replace(inputs.state_cache, owner=state_after_save))
    k_owner, k_cache = arrays.allocate(inputs.k_cache)
    fixed = dict(ape=arrays.convert(inputs.ape, strided), rms_norm_weight=arrays.convert(inputs.rms_norm_weight, strided),
                 cos_sin_cache=arrays.convert(inputs.cos_sin_cache, strided),
                 block_table=arrays.convert(inputs.batch.block_table, strided))
    static = StaticArgs.of(inputs)
    for part in parts:
        b = sub_batch(inputs.batch, part)
        per_token = {name: arrays.convert(getattr(b, name), strided) for name in TOKEN_ARRAYS}
        kv_score = arrays.convert(inputs.kv_score[part], strided)
        step_call.save(target, StepArrays(kv_score=kv_score, **fixed, **per_token, state_cache=state, k_cache=k_cache), static)
        step_call.compress(target, StepArrays(kv_score=kv_score, **fixed, **per_token, state_cache=saved, k_cache=k_cache),
                           static)
    return arrays.host_bytes(state_owner), arrays.host_bytes(k_owner)


def _describe(partitioning: Partitioning, inputs: StepInputs, whole: np.ndarray, parts: np.ndarray, which: str) -> str:
    text, _ = first_difference(inputs, whole, parts, which)
    text = text.replace(": expected ", ": in the whole step ").replace(", got ", ", in its own call ")
    sizes = "/".join(str(p.size) for p in partitioning.parts)
    return f"{partitioning.name} ({len(partitioning.parts)} calls of {sizes} tokens): {text}"


def check_invariance(impl: LoadedImplementation, inputs: StepInputs, state_after_save: np.ndarray, device: str,
                     config: InvarianceConfig = InvarianceConfig(), name: str = "") -> InvarianceVerdict:
    """Batch invariance of ``impl`` on one step (``state_after_save``: the whole step's
    post-save state allocation, uint8, that every store reads)."""
    arrays = arrays_for(impl.takes_numpy, device)
    everything = (np.arange(inputs.batch.num_tokens, dtype=np.int64),)
    verdict = InvarianceVerdict(name, impl.name, "pass")
    try:
        whole_state, whole_k = _run_parts(impl.target, arrays, inputs, state_after_save, everything)
        verdict.calls = 2
        for partitioning in partitionings(inputs.batch, config, np.random.default_rng(config.seed)):
            state, k_cache = _run_parts(impl.target, arrays, inputs, state_after_save, partitioning.parts)
            verdict.calls += 2 * len(partitioning.parts)
            for which, whole, got in (("state", whole_state, state), ("k_cache", whole_k, k_cache)):
                if not np.array_equal(whole, got):
                    verdict.status, verdict.detail = "fail", _describe(partitioning, inputs, whole, got, which)
                    return verdict
    except Exception as error:  # an implementation may fail in any way; report it
        verdict.status, verdict.traceback = "error", traceback.format_exc()
        verdict.detail = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    return verdict


def run_invariance(impl: LoadedImplementation, scenario: Scenario, *, device: str | None = None,
                   config: InvarianceConfig = InvarianceConfig()) -> InvarianceVerdict:
    """Batch invariance of ``impl`` on a scenario, or why it was not checked."""
    device = device or impl.device()
    if device is None:
        return InvarianceVerdict(scenario.name, impl.name, "skip", f"needs one of {impl.devices}; none found here")
    if scenario.device and (impl.takes_numpy or scenario.device != device):
        return InvarianceVerdict(scenario.name, impl.name, "skip", f"runs on {scenario.device} only")
    inputs, expected = spec_result(scenario)
    reason = impl.capabilities.unsupported(features(inputs))
    if reason:
        return InvarianceVerdict(scenario.name, impl.name, "unsupported", f"declared unsupported: {reason}")
    if inputs.step_call or inputs.ring_capacity is not None:
        return InvarianceVerdict(scenario.name, impl.name, "skip", "a step of SPEC §13.4 or on a ring is one call by "
                                 "contract (its chunks, tail saves and ring slots do not split into parts)")
    return check_invariance(impl, inputs, expected.state_after_save, device, config, scenario.name)
