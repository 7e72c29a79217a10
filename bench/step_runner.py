"""Time a step's calls side by side: each a function of one input set, over sets rotated past L2.

The step benchmarks (:mod:`.state_steps`, :mod:`.v41_steps`) hand :func:`run_calls` a
:class:`StepPrepared` (the input sets, the bytes the step must move) and their calls by name
(a function of one set, or a string saying why the call cannot run the step); each call is
warmed up on every set, timed eagerly and as CUDA-graph replay with the trials interleaved
across calls, exactly as :func:`.sweep.run_case` times the two operations. :func:`dry_run`
calls each once on every set without timing (a CPU under ``TRITON_INTERPRET=1`` will do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .sweep import TARGET_TRIAL_MS, Row


@dataclass(frozen=True)
class StepLabel:
    """What a row of a step benchmark is about."""

    case: str  # the table, e.g. "c128_prefill_step"
    operation: str  # "step", "compress" or "index_key"
    token_num: int
    active: int
    variant: str  # the format, e.g. "ring bf16" or "fp32 kv/score"


@dataclass
class StepPrepared:
    """A step's input sets and the bytes it must move (:mod:`.step_floor`)."""

    label: StepLabel
    sets: list
    bytes_moved: int


Calls = dict  # name -> Callable[[input set], None], or a str: why it cannot run this step


def _error(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    return f"unsupported: {text}" if isinstance(error, NotImplementedError) else text


def _row(label: StepLabel, name: str, mode: str, bytes_moved: int, timing=None, copy_gbs: float | None = None,
         error: str = "") -> Row:
    if timing is None:
        return Row(label.case, label.operation, label.token_num, label.active, name, mode, None, None, None, None,
                   bytes_moved, None, None, error, label.variant)
    gbs = bytes_moved / (timing.median_us * 1e-6) / 1e9
    return Row(label.case, label.operation, label.token_num, label.active, name, mode, timing.median_us, timing.low_us,
               timing.high_us, timing.host_us, bytes_moved, gbs, 100.0 * gbs / copy_gbs, "", label.variant)


def dry_run(prepared: StepPrepared, calls: Calls) -> list[Row]:
    """Call each call once on every input set, untimed: one row per call (mode ``dry``), its error if any."""
    rows = []
    for name, call in calls.items():
        error = call if isinstance(call, str) else ""
        if not error:
            try:
                for s in prepared.sets:
                    call(s)
            except Exception as caught:  # report and go on
                error = _error(caught)
        rows.append(_row(prepared.label, name, "dry", prepared.bytes_moved, error=error))
    return rows


def run_calls(prepared: StepPrepared, calls: Calls, modes: list[str], copy_gbs: float, trials: int) -> list[Row]:
    """Rows of every call and mode (eager: CUDA events around back-to-back calls; graph: replay of a
    captured graph of calls cycling over the sets), trials interleaved across the calls."""
    import torch

    from .timing import capture_graph, summarize, time_eager, time_graph

    sets = prepared.sets
    runnable, iterations, graphs, errors = {}, {}, {}, {}
    for name, call in calls.items():
        if isinstance(call, str):
            errors[name] = call
            continue
        try:
            for s in sets:  # compile and warm up
                call(s)
            torch.cuda.synchronize()
            per_call, _ = time_eager(call, sets, len(sets))
            iterations[name] = max(len(sets), min(2000, int(TARGET_TRIAL_MS * 1e3 / max(per_call, 1.0))))
            runnable[name] = call
            if "graph" in modes:
                count = max(len(sets), min(iterations[name], 200))
                graphs[name] = (capture_graph(call, sets, count), count)
        except Exception as caught:  # report and go on with the other calls
            errors[name] = _error(caught)
            runnable.pop(name, None)
            torch.cuda.synchronize()
    samples = {(n, m): [] for n in runnable for m in modes}
    hosts = {n: [] for n in runnable}
    for _ in range(trials):
        for name, call in runnable.items():
            if "eager" in modes:
                device_us, host_us = time_eager(call, sets, iterations[name])
                samples[(name, "eager")].append(device_us)
                hosts[name].append(host_us)
            if "graph" in modes:
                graph, count = graphs[name]
                samples[(name, "graph")].append(time_graph(graph, count, max(1, iterations[name] // count)))
    rows = []
    for name in calls:
        for mode in modes:
            if name in errors:
                rows.append(_row(prepared.label, name, mode, prepared.bytes_moved, error=errors[name]))
            else:
                timing = summarize(samples[(name, mode)], hosts[name] if mode == "eager" else None)
                rows.append(_row(prepared.label, name, mode, prepared.bytes_moved, timing, copy_gbs))
    del graphs
    torch.cuda.empty_cache()
    return rows


def checked_first(checked: Callable, fast: Callable) -> Callable:
    """A call that runs ``checked`` the first time (an implementation's host-side checks of the data,
    which copy to the host and so cannot be captured in a graph) and ``fast`` from then on."""
    state = {"first": True}

    def call(s) -> None:
        if state["first"]:
            state["first"] = False
            checked(s)
        else:
            fast(s)

    return call
