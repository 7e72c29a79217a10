"""Steps replayed in padded buckets: ``conformance --graph`` (captured CUDA graphs) and
``conformance --padded`` (the same steps made eagerly, on any device).

For each group of scenarios that share a static configuration (:class:`.buckets.StaticKey`),
each bucket that holds some of them and each call form the implementation offers (two calls,
or ``save_and_compress_norm_rope_store``):

1. the group's buffers are allocated once (:class:`Arena`), the per-token arrays at the
   bucket's size, every token padding;
2. the step is made eagerly once (it compiles; being all padding, it must write nothing) and,
   with ``--graph``, captured into a CUDA graph and replayed, all padding again: both caches
   must be untouched, every byte;
3. each scenario that fits is copied *into* the captured tensors in place (its metadata padded
   with tokens of slot ``-1``, its projections, its cache allocations at the same view
   offsets) and the graph replayed; both whole allocations are compared with the spec's,
   the bytes no scenario owns included (they must keep what they held).

So a tiny prefill runs in a large bucket, the metadata changes under a graph captured with
padding only, and replays follow each other as they do in an engine.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import step_call
from .arrays import HostArrays, TorchArrays, arrays_for
from .buckets import TOKEN_ARRAYS, ArenaPlan, StaticKey, buckets_holding, pad_batch, pad_kv_score, padding_only, placement
from .implementations import LoadedImplementation
from .runner import Expected, Verdict, counts_pass, features, first_difference, spec_result, tolerant_counts
from .scenarios import Scenario, StepInputs
from .step_call import StaticArgs, StepArrays


@dataclass
class ReplayVerdict(Verdict):
    bucket: int = 0  # the bucket's token count
    form: str = ""  # "two calls" or "combined"


@dataclass
class Group:
    """Scenarios that share a static configuration (one graph per bucket and form)."""

    key: StaticKey
    scenarios: list[Scenario]


def plan_groups(chosen: list[Scenario], buckets: tuple[int, ...]) -> tuple[list[Group], list[Scenario]]:
    """The chosen scenarios grouped by static configuration, and those that fit no bucket."""
    groups: dict[StaticKey, Group] = {}
    too_large = []
    for scenario in chosen:
        inputs = scenario.build()
        if not buckets_holding(inputs.batch.num_tokens, buckets):
            too_large.append(scenario)
            continue
        key = StaticKey.of(inputs, scenario.name)
        groups.setdefault(key, Group(key, [])).scenarios.append(scenario)
    return list(groups.values()), too_large


def capture(run: Callable[[], None]) -> Callable[[], None]:
    """``run`` captured into a CUDA graph (after it ran once eagerly): the graph's ``replay``."""
    import torch

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay  # the bound method keeps the graph alive


class Arena:
    """A group's buffers for one bucket, as one implementation takes them, with a host mirror
    of what both cache allocations must hold."""

    def __init__(self, plan: ArenaPlan, sample: StepInputs, bucket: int, arrays: HostArrays | TorchArrays):
        self.plan, self.bucket, self.arrays = plan, bucket, arrays
        self.strided = sample.strided_inputs
        self.state_owner, state = arrays.allocate(plan.state)
        self.k_owner, k_cache = arrays.allocate(plan.k_cache)
        self.mirror_state, self.mirror_k = plan.state.owner.copy(), plan.k_cache.owner.copy()
        empty = padding_only(sample.batch, bucket)
        convert = lambda array: arrays.convert(array, self.strided)  # noqa: E731
        self.tensors = StepArrays(
            kv_score=convert(pad_kv_score(sample.kv_score[:0], bucket)), ape=convert(sample.ape),
            **{name: convert(getattr(empty, name)) for name in TOKEN_ARRAYS},
            block_table=convert(np.full(plan.table_shape, -1, dtype=np.int32)),
            rms_norm_weight=convert(sample.rms_norm_weight),
            cos_sin_cache=convert(np.full((plan.cos_sin_rows, 64), np.nan, dtype=np.float32)),
            state_cache=state, k_cache=k_cache)
        self.static = StaticArgs.of(sample)
        self.empty = empty

    def load_padding_only(self) -> None:
        """Every token padding (the caches as they are)."""
        for name in TOKEN_ARRAYS:
            self.arrays.load(getattr(self.tensors, name), getattr(self.empty, name))

    def load(self, inputs: StepInputs) -> tuple[slice, slice]:
        """A step written into the tensors in place; where its allocations went (state, k_cache)."""
        load = self.arrays.load
        padded = pad_batch(inputs.batch, self.bucket)
        for name in TOKEN_ARRAYS:
            load(getattr(self.tensors, name), getattr(padded, name))
        load(self.tensors.kv_score, pad_kv_score(inputs.kv_score, self.bucket))
        table = np.full(self.plan.table_shape, -1, dtype=np.int32)
        table[:inputs.batch.block_table.shape[0], :inputs.batch.block_table.shape[1]] = inputs.batch.block_table
        load(self.tensors.block_table, table)
        cos_sin = np.full((self.plan.cos_sin_rows, 64), np.nan, dtype=np.float32)
        cos_sin[:inputs.cos_sin_cache.shape[0]] = inputs.cos_sin_cache
        load(self.tensors.cos_sin_cache, cos_sin)
        load(self.tensors.ape, inputs.ape)
        load(self.tensors.rms_norm_weight, inputs.rms_norm_weight)
        state_at, k_at = placement(self.plan.state, inputs.state_cache), placement(self.plan.k_cache, inputs.k_cache)
        load(self.state_owner[state_at], inputs.state_cache.owner)
        load(self.k_owner[k_at], inputs.k_cache.owner)
        self.mirror_state[state_at] = inputs.state_cache.owner
        self.mirror_k[k_at] = inputs.k_cache.owner
        return state_at, k_at

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """Both allocations' bytes; they become the mirror (what the next step must leave alone)."""
        state, k_cache = self.arrays.host_bytes(self.state_owner), self.arrays.host_bytes(self.k_owner)
        self.mirror_state, self.mirror_k = state, k_cache
        return state, k_cache


def _outside(which: str, expected: np.ndarray, actual: np.ndarray, owned: slice) -> str:
    """The first differing byte outside a step's own allocation (``expected``, ``actual``: uint8
    [bucket allocation bytes]; ``owned``: where the step's allocation lies in it)."""
    differ = np.flatnonzero(expected != actual)
    outside = differ[(differ < owned.start) | (differ >= owned.stop)]
    return (f"{which}: byte {int(outside[0])} of the bucket's allocation, outside the step's blocks and pages, "
            f"changed from 0x{expected[outside[0]]:02x} to 0x{actual[outside[0]]:02x} [{outside.size} bytes]")


def _judge(verdict: ReplayVerdict, inputs: StepInputs, expected: Expected, before: tuple[np.ndarray, np.ndarray],
           after: tuple[np.ndarray, np.ndarray], owned: tuple[slice, slice], tolerant: bool) -> None:
    """Every byte of both allocations: the step's own as the spec says (its entries by SPEC
    §10's bounds when ``tolerant``), the rest as before (``before``, ``after``: uint8 (state,
    k_cache) bucket allocations; ``owned``: the step's place in each)."""
    for which, spec_bytes, old, new, at in (("state", expected.state_after_save, before[0], after[0], owned[0]),
                                            ("k_cache", expected.k_cache_after_store, before[1], after[1], owned[1])):
        want = old.copy()
        want[at] = spec_bytes
        if np.array_equal(want, new):
            continue
        verdict.status = "fail"
        if np.array_equal(new[at], spec_bytes):
            verdict.first_difference, verdict.region = _outside(which, want, new, at), "untouched"
            return
        verdict.first_difference, verdict.region = first_difference(inputs, spec_bytes, new[at], which)
        outside_same = np.array_equal(want[:at.start], new[:at.start]) and np.array_equal(want[at.stop:], new[at.stop:])
        if tolerant and which == "k_cache" and outside_same:
            verdict.counts = tolerant_counts(inputs, spec_bytes, new[at], expected.state_after_save)
            verdict.status = "pass" if counts_pass(verdict.counts) else "fail"
        return


def _untouched(arena: Arena, when: str) -> str:
    """"" when neither allocation changed since the mirror was taken, else what changed."""
    before = (arena.mirror_state, arena.mirror_k)
    after = arena.read()
    for which, old, new in zip(("state", "k_cache"), before, after):
        differ = np.flatnonzero(old != new)
        if differ.size:
            return f"{when}: {differ.size} bytes of {which} changed by a step of padding only (first: byte {int(differ[0])})"
    return ""


def _replay_bucket(impl: LoadedImplementation, plan: ArenaPlan, members: list[tuple[Scenario, StepInputs, Expected]],
                   bucket: int, form: str, graph: bool, device: str, tolerant: bool) -> list[ReplayVerdict]:
    """One bucket and call form: the all-padding checks, then every member replayed in turn."""
    arrays = arrays_for(impl.takes_numpy, device)
    head = ReplayVerdict(f"(padding only) {members[0][0].name}", impl.name, bucket, 0, "pass", bucket=bucket, form=form)
    try:
        arena = Arena(plan, members[0][1], bucket, arrays)
        run = lambda: step_call.step(impl.target, arena.tensors, arena.static, form)  # noqa: E731
        arena.load_padding_only()
        run()  # eager, all padding: compiles, warms up, must write nothing
        problem = _untouched(arena, "eager")
        replay = run
        if graph:
            replay = capture(run)
            replay()
            problem = problem or _untouched(arena, "graph replay")
    except Exception as error:  # an implementation may fail in any way; report it for every member
        text = f"{'capture' if graph else 'warm-up'}: {type(error).__name__}: {error}".splitlines()[0][:300]
        tb = {"traceback": traceback.format_exc()}
        return [ReplayVerdict(head.scenario, impl.name, bucket, 0, "error", text, counts=tb, bucket=bucket, form=form)] + [
            ReplayVerdict(s.name, impl.name, i.batch.num_tokens, i.batch.num_active, "error", text, bucket=bucket, form=form)
            for s, i, _ in members]
    if problem:
        head.status, head.first_difference, head.region = "fail", problem, "untouched"
    verdicts = [head]
    for scenario, inputs, expected in members:
        verdict = ReplayVerdict(scenario.name, impl.name, inputs.batch.num_tokens, inputs.batch.num_active, "pass",
                                bucket=bucket, form=form)
        try:
            owned = arena.load(inputs)
            before = (arena.mirror_state.copy(), arena.mirror_k.copy())
            replay()
            _judge(verdict, inputs, expected, before, arena.read(), owned, tolerant)
        except Exception as error:
            verdict.status, verdict.counts = "error", {"traceback": traceback.format_exc()}
            verdict.first_difference = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        verdicts.append(verdict)
    return verdicts


def group_steps(group: Group) -> list[tuple[Scenario, StepInputs, Expected]]:
    """Each member's inputs and the spec's bytes."""
    return [(scenario, *spec_result(scenario)) for scenario in group.scenarios]


def run_group(impl: LoadedImplementation, steps: list[tuple[Scenario, StepInputs, Expected]], buckets: tuple[int, ...],
              *, graph: bool, device: str, tolerant: bool = False) -> list[ReplayVerdict]:
    """Every bucket and call form of one group (``steps``: :func:`group_steps`'s) for ``impl``:
    captured graphs (``graph``) or eager calls in the padded buckets; exact, or with each
    scenario's entries judged by SPEC §10's bounds (``tolerant``)."""
    verdicts, runnable = [], []
    for scenario, inputs, expected in steps:
        tokens, active = inputs.batch.num_tokens, inputs.batch.num_active
        reason = impl.capabilities.unsupported(features(inputs))
        if scenario.device and (impl.takes_numpy or scenario.device != device):
            verdicts.append(ReplayVerdict(scenario.name, impl.name, tokens, active, "skip", f"runs on {scenario.device} only"))
        elif inputs.step_call:
            verdicts.append(ReplayVerdict(scenario.name, impl.name, tokens, active, "skip",
                                          "SPEC §13.4's step call is judged by eager calls (not padded into buckets)"))
        elif reason:
            verdicts.append(ReplayVerdict(scenario.name, impl.name, tokens, active, "unsupported",
                                          f"declared unsupported: {reason}"))
        else:
            runnable.append((scenario, inputs, expected))
    if not runnable:
        return verdicts
    plan = ArenaPlan.of([inputs for _, inputs, _ in runnable])
    for bucket in sorted(buckets):
        members = [m for m in runnable if m[1].batch.num_tokens <= bucket]
        for form in step_call.forms_of(impl.target, runnable[0][1]) if members else ():
            verdicts += _replay_bucket(impl, plan, members, bucket, form, graph, device, tolerant)
    return verdicts
