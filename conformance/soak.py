"""The soak: a randomized engine that runs for minutes and compares every step's bytes.

Layers of every layout (:data:`LAYERS`) each run their own engine (:mod:`.soak_engine`:
requests arriving and leaving, chunked prefill, decode, speculative verify groups and their
rollbacks). Every implementation keeps its own caches of every layer and makes each step in a
randomly chosen way: eagerly with the step's own token count, eagerly padded into the smallest
bucket that holds it, or by replaying a CUDA graph captured once per bucket (GPU), as two calls
or as the combined call where it has one. After every step, both whole cache allocations of
every implementation are compared with the first implementation's; on a sample of steps (a
share of the run's time) the spec runs the same step from the same bytes and every
implementation is compared with it, and one implementation's step is checked for batch
invariance (:mod:`.invariance`). A difference is reported, and the implementations are set
back to the reference's bytes so that the next difference is a new one.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field, replace

import numpy as np

from ..spec import batch as B
from ..spec.batch import Batch
from . import step_call
from .arrays import arrays_for
from .buckets import TOKEN_ARRAYS, buckets_holding, pad_batch, pad_kv_score, padding_only
from .buffers import Buffer
from .engine import Geometry
from .implementations import LoadedImplementation
from .invariance import InvarianceConfig, check_invariance
from .runner import first_difference, spec_step
from .scenarios import StepInputs
from .soak_engine import LayerBlocks, ScheduleConfig, Scheduler
from .step_call import StaticArgs, StepArrays


@dataclass(frozen=True)
class SoakLayer:
    """One layer's cache configuration."""

    name: str
    compress_ratio: int
    block_size: int
    entries_per_page: int
    layout: str
    head_dim: int = 512  # 128: the indexer compressor (SPEC §12)
    hadamard: bool = False
    bf16_weight: bool = True
    fp8_scale: float | None = None


LAYERS = (
    SoakLayer("c4_flashmla", 4, 4, 64, "flashmla_fp8"),
    SoakLayer("c4_bf16_bs8", 4, 8, 16, "bf16", bf16_weight=False),
    SoakLayer("c4_fp8_per_tensor", 4, 4, 32, "fp8_per_tensor", fp8_scale=0.0371),
    SoakLayer("c128_flashmla", 128, 8, 2, "flashmla_fp8"),
    SoakLayer("c128_bf16_bs16", 128, 16, 4, "bf16"),
    SoakLayer("c128_fp8_per_tensor", 128, 8, 3, "fp8_per_tensor", bf16_weight=False, fp8_scale=0.5),
    SoakLayer("indexer_c4_fp8_hadamard", 4, 16, 8, "indexer_fp8", head_dim=128, hadamard=True),
    SoakLayer("indexer_c4_mxfp4", 4, 16, 8, "indexer_mxfp4", head_dim=128),
    SoakLayer("indexer_c128_fp8", 128, 8, 3, "indexer_fp8", head_dim=128),
    SoakLayer("indexer_c128_mxfp4_hadamard", 128, 8, 3, "indexer_mxfp4", head_dim=128, hadamard=True),
)


@dataclass(frozen=True)
class SoakSize:
    """How large the engines are, their buckets, and how many layers step at once."""

    schedule: ScheduleConfig
    buckets: tuple[int, ...]  # the largest is the schedule's step_tokens
    layers_per_step: int | None  # None: every layer every step


SIZES = {
    "small": SoakSize(ScheduleConfig(rows=4, max_len=200, max_prompt=150, max_decode=24, chunk=48,
                                     step_tokens=64), (8, 16, 64), 2),
    "large": SoakSize(ScheduleConfig(rows=24, max_len=2560, max_prompt=2200, max_decode=320, chunk=512,
                                     step_tokens=2048),
                      (1, 8, 64, 512, 2048), None),
}


@dataclass(frozen=True)
class SoakOptions:
    seconds: float
    size: SoakSize
    layers: tuple[SoakLayer, ...]
    seed: int = 0
    check_share: float = 0.3  # of the run's time spent running the spec and the invariance checks, at most
    graphs: bool = True  # replay captured graphs (torch implementations on CUDA)


@dataclass
class SoakReport:
    engine_steps: int = 0
    layer_steps: int = 0
    tokens: int = 0
    entries: int = 0  # compressed entries written (active tokens), per layer step
    bytes_compared: int = 0  # across implementations, whole allocations
    spec_checks: int = 0  # layer steps the spec ran too
    spec_bytes: int = 0
    invariance_checks: int = 0
    calls: dict = field(default_factory=dict)  # "eager" / "padded" / "graph" -> layer steps made that way
    captures: int = 0
    arrived: int = 0
    finished: int = 0
    verify_groups: int = 0
    rerun_positions: int = 0  # positions run again after a verify step
    differences: list[str] = field(default_factory=list)
    stopped: str = ""  # why the run ended early (an implementation's error)


# ---- one layer ------------------------------------------------------------------------------------
class LayerState:
    """A layer's engine (scheduler and blocks) and its fixed inputs, on the host."""

    def __init__(self, layer: SoakLayer, schedule: ScheduleConfig, rng: np.random.Generator):
        self.layer = layer
        self.scheduler = Scheduler(schedule, rng)
        self.blocks = LayerBlocks(Geometry(layer.compress_ratio, layer.block_size, layer.entries_per_page),
                                  schedule.rows, schedule.max_len, rng)
        r, head = layer.compress_ratio, layer.head_dim
        self.state = Buffer.of(B.random_state_cache(self.blocks.state_pool.size, layer.block_size, r, rng, head_dim=head))
        self.k_cache = Buffer.of(B.canary_k_cache(layer.layout, self.blocks.page_pool.size, layer.entries_per_page),
                                 "float8_e4m3fn" if layer.layout == "fp8_per_tensor" else None)
        self.ape = B.random_ape(r, rng, head_dim=head)
        self.weight = B.random_norm_weight(rng, bf16=layer.bf16_weight, head_dim=head)
        self.cos_sin = B.rope_cos_sin_cache(schedule.max_len + r)
        self.static = StaticArgs(layer.block_size, 1e-6, r, layer.layout, layer.fp8_scale, layer.hadamard)
        self.rng = rng

    def inputs(self, batch: Batch, kv_score: np.ndarray, state: np.ndarray | None = None,
               k_cache: np.ndarray | None = None) -> StepInputs:
        """The step as the conformance runners take it (``state``, ``k_cache``: allocations, uint8, to start from)."""
        return StepInputs(batch=batch, kv_score=kv_score, ape=self.ape,
                          state_cache=self.state if state is None else replace(self.state, owner=state),
                          rms_norm_weight=self.weight, rms_norm_eps=self.static.rms_norm_eps, cos_sin_cache=self.cos_sin,
                          k_cache=self.k_cache if k_cache is None else replace(self.k_cache, owner=k_cache),
                          layout=self.layer.layout, fp8_scale=self.layer.fp8_scale, hadamard=self.layer.hadamard)


class ImplCaches:
    """One implementation's caches of one layer, and its programs (a bucket, a call form, a graph or not)."""

    def __init__(self, impl: LoadedImplementation, device: str, layer: LayerState):
        self.impl, self.device, self.layer = impl, device, layer
        self.arrays = arrays_for(impl.takes_numpy, device)
        self.state_owner, self.state = self.arrays.allocate(layer.state)
        self.k_owner, self.k_cache = self.arrays.allocate(layer.k_cache)
        self.fixed = dict(ape=self.arrays.convert(layer.ape), rms_norm_weight=self.arrays.convert(layer.weight),
                          cos_sin_cache=self.arrays.convert(layer.cos_sin))
        self.programs: dict[tuple[int, str, bool], tuple[StepArrays, object]] = {}

    def arrays_of(self, batch: Batch, kv_score: np.ndarray) -> StepArrays:  # kv_score: fp32 [T, 2*SW]
        convert = self.arrays.convert
        return StepArrays(kv_score=convert(kv_score), block_table=convert(batch.block_table),
                          **{name: convert(getattr(batch, name)) for name in TOKEN_ARRAYS}, **self.fixed,
                          state_cache=self.state, k_cache=self.k_cache)

    def program(self, bucket: int, form: str, graph: bool, batch: Batch, report: SoakReport):
        """The bucket's tensors and how to run them: made once, warmed up with a step of padding
        only (it writes nothing), captured when ``graph``."""
        key = (bucket, form, graph)
        if key not in self.programs:
            empty = padding_only(batch, bucket)
            tensors = self.arrays_of(empty, pad_kv_score(np.zeros((0, self.layer.ape.shape[1] * 2), np.float32), bucket))
            run = lambda: step_call.step(self.impl.target, tensors, self.layer.static, form)  # noqa: E731
            run()
            if graph:
                from .graphs import capture

                run = capture(run)
                report.captures += 1
            self.programs[key] = (tensors, run)
        return self.programs[key]

    def step(self, batch: Batch, kv_score: np.ndarray, how: tuple[str, int, str], report: SoakReport) -> None:
        """One step (``kv_score``: fp32 [T, 2*SW], its projections): ``how`` = (mode, bucket, form),
        mode "eager" (the step's own token count), "padded" or "graph" (the bucket's tensors,
        written in place)."""
        mode, bucket, form = how
        if mode == "eager":
            step_call.step(self.impl.target, self.arrays_of(batch, kv_score), self.layer.static, form)
            return
        tensors, run = self.program(bucket, form, mode == "graph", batch, report)
        padded = pad_batch(batch, bucket)
        for name in TOKEN_ARRAYS:
            self.arrays.load(getattr(tensors, name), getattr(padded, name))
        self.arrays.load(tensors.block_table, batch.block_table)
        self.arrays.load(tensors.kv_score, pad_kv_score(kv_score, bucket))
        run()

    def host(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of both allocations: uint8 (state, k_cache)."""
        return self.arrays.host_bytes(self.state_owner), self.arrays.host_bytes(self.k_owner)

    def load(self, state: np.ndarray, k_cache: np.ndarray) -> None:
        """Both allocations from host bytes (uint8, their whole sizes)."""
        self.arrays.load(self.state_owner, state)
        self.arrays.load(self.k_owner, k_cache)


def _same(a: ImplCaches, b: ImplCaches) -> bool:
    """Both allocations equal in every byte (on the device when both are there)."""
    if not a.impl.takes_numpy and not b.impl.takes_numpy and a.device == b.device:
        import torch

        return torch.equal(a.state_owner, b.state_owner) and torch.equal(a.k_owner, b.k_owner)
    return all(np.array_equal(x, y) for x, y in zip(a.host(), b.host()))


# ---- the run ------------------------------------------------------------------------------------
class ImplementationFailed(Exception):
    """An implementation raised during a step: the run ends (its device may be unusable)."""


class Soak:
    """The engines, every implementation's caches, and the report."""

    def __init__(self, implementations: list[tuple[LoadedImplementation, str]], options: SoakOptions, log=print):
        self.options, self.log = options, log
        self.rng = np.random.default_rng(options.seed)
        self.implementations = implementations
        self.layers = [LayerState(layer, options.size.schedule, np.random.default_rng([options.seed, i]))
                       for i, layer in enumerate(options.layers)]
        self.caches = [[ImplCaches(impl, device, layer) for impl, device in implementations] for layer in self.layers]
        self.report = SoakReport()
        self.check_seconds = 0.0
        self.started = time.perf_counter()

    def ways(self, cache: ImplCaches, tokens: int) -> list[tuple[str, int, str]]:
        """How an implementation may make a step of ``tokens`` tokens: (mode, bucket, form)."""
        bucket = buckets_holding(tokens, self.options.size.buckets)[0]
        modes = ["eager", "padded"]
        if self.options.graphs and cache.device == "cuda" and not cache.impl.takes_numpy:
            modes.append("graph")
        return [(mode, bucket, form) for mode in modes for form in step_call.forms_of(cache.impl.target)]

    def _check_due(self) -> bool:
        elapsed = time.perf_counter() - self.started
        return self.report.spec_checks == 0 or self.check_seconds <= self.options.check_share * elapsed

    def _record(self, text: str) -> None:
        self.report.differences.append(text)
        self.log(f"DIFFERENCE: {text}")

    def layer_step(self, index: int) -> None:
        """One step of one layer's engine on every implementation, and the comparisons."""
        layer, caches, report = self.layers[index], self.caches[index], self.report
        plan = layer.scheduler.plan()
        if not plan:
            return
        batch = layer.blocks.batch(plan)
        kv_score = self.rng.standard_normal((batch.num_tokens, 2 * layer.ape.shape[1]), dtype=np.float32)  # [T, 2*SW]
        label = f"engine step {report.engine_steps}, layer {layer.layer.name}"
        checked = self._check_due()
        before = caches[0].host() if checked else None
        for cache in caches:
            ways = self.ways(cache, batch.num_tokens)
            how = ways[int(self.rng.integers(len(ways)))]
            try:
                cache.step(batch, kv_score, how, report)
            except Exception as error:  # a failing implementation ends the run (its device may be unusable)
                report.stopped = (f"{label}: {cache.impl.name} ({how[0]}, bucket {how[1]}, {how[2]}): "
                                  f"{type(error).__name__}: {error}")
                self.log(traceback.format_exc())
                raise ImplementationFailed from error
            report.calls[how[0]] = report.calls.get(how[0], 0) + 1
        inputs = layer.inputs(batch, kv_score)
        self._compare_implementations(inputs, caches, label)
        if checked:
            start = time.perf_counter()
            self._compare_with_spec(layer, inputs, before, caches, label)
            self.check_seconds += time.perf_counter() - start
        for row in layer.scheduler.finish(plan):
            layer.blocks.release(row)
        report.layer_steps += 1
        report.tokens += batch.num_tokens
        report.entries += batch.num_active

    def _compare_implementations(self, inputs: StepInputs, caches: list[ImplCaches], label: str) -> None:
        reference = caches[0]
        for other in caches[1:]:
            self.report.bytes_compared += reference.layer.state.nbytes + reference.layer.k_cache.nbytes
            if _same(reference, other):
                continue
            want, got = reference.host(), other.host()
            which = 0 if not np.array_equal(want[0], got[0]) else 1
            text, _ = first_difference(inputs, want[which], got[which], ("state", "k_cache")[which])
            self._record(f"{label}: {other.impl.name} against {reference.impl.name}: {text}")
            other.load(*want)

    def _compare_with_spec(self, layer: LayerState, inputs: StepInputs, before, caches: list[ImplCaches], label: str) -> None:
        """The spec from the bytes before the step (``before``: uint8 (state, k_cache) of the
        reference); every implementation's bytes after it; one implementation's batch
        invariance on the step."""
        start = layer.inputs(inputs.batch, inputs.kv_score, *before)
        state_owner, k_owner = before[0].copy(), before[1].copy()
        spec_step(start, start.state_cache.view_of(state_owner), start.k_cache.view_of(k_owner))
        self.report.spec_checks += 1
        for cache in caches:
            self.report.spec_bytes += state_owner.nbytes + k_owner.nbytes
            got = cache.host()
            for which, want, have in (("state", state_owner, got[0]), ("k_cache", k_owner, got[1])):
                if not np.array_equal(want, have):
                    text, _ = first_difference(inputs, want, have, which)
                    self._record(f"{label}: {cache.impl.name} against the spec: {text}")
                    cache.load(state_owner, k_owner)
                    break
        if inputs.batch.num_tokens < 2:
            return
        chosen = caches[self.report.spec_checks % len(caches)]
        verdict = check_invariance(chosen.impl, start, state_owner, chosen.device,
                                   InvarianceConfig(seed=self.report.spec_checks), label)
        self.report.invariance_checks += 1
        if verdict.status != "pass":
            self._record(f"{label}: {chosen.impl.name} batch invariance {verdict.status}: {verdict.detail}")

    def run(self) -> SoakReport:
        deadline = self.started + self.options.seconds
        last_log = self.started
        per_step = self.options.size.layers_per_step
        try:
            while time.perf_counter() < deadline:
                count = len(self.layers) if per_step is None else min(per_step, len(self.layers))
                for index in sorted(self.rng.choice(len(self.layers), size=count, replace=False)):
                    self.layer_step(int(index))
                self.report.engine_steps += 1
                if time.perf_counter() - last_log > 15:
                    last_log = time.perf_counter()
                    self.log(self.progress())
        except ImplementationFailed:
            pass
        self.report.arrived = sum(layer.scheduler.arrived for layer in self.layers)
        self.report.finished = sum(layer.scheduler.finished for layer in self.layers)
        self.report.verify_groups = sum(layer.scheduler.verify_groups for layer in self.layers)
        self.report.rerun_positions = sum(layer.scheduler.rerun_positions for layer in self.layers)
        return self.report

    def progress(self) -> str:
        r = self.report
        return (f"[{time.perf_counter() - self.started:7.1f}s] {r.engine_steps} steps, {r.layer_steps} layer steps, "
                f"{r.entries} entries, {r.bytes_compared / 2 ** 30:.2f} GiB compared, {r.spec_checks} spec checks, "
                f"{len(r.differences)} differences")
