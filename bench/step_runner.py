"""Time a step's calls side by side: each a function of one input set, over sets rotated past L2.

The step benchmarks (:mod:`.state_steps`, :mod:`.v41_steps`) hand :func:`run_calls` a
:class:`StepPrepared` (the input sets, the bytes the step must move) and their calls by name
(a function of one set, or a string saying why the call cannot run the step); each call is
warmed up on every set, timed eagerly and as CUDA-graph replay with the trials interleaved
across calls by :func:`.sweep.time_calls`, as :func:`.sweep.run_case` times the two operations. :func:`dry_run`
calls each once on every set without timing (a CPU under ``TRITON_INTERPRET=1`` will do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .sweep import Row, RowLabel, describe_error, time_calls, timed_rows


@dataclass
class StepPrepared:
    """A step's input sets and the bytes it must move (:mod:`.step_floor`)."""

    label: RowLabel
    sets: list
    bytes_moved: int


Calls = dict  # name -> Callable[[input set], None], or a str: why it cannot run this step


def _error(error: Exception) -> str:
    text = describe_error(error)
    return f"unsupported: {text}" if isinstance(error, NotImplementedError) else text


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
        rows.append(prepared.label.row(name, "dry", prepared.bytes_moved, error=error))
    return rows


def run_calls(prepared: StepPrepared, calls: Calls, modes: list[str], copy_gbs: float, trials: int) -> list[Row]:
    """Rows of every call and mode (eager: CUDA events around back-to-back calls; graph: replay of a
    captured graph of calls cycling over the sets), trials interleaved across the calls
    (:func:`.sweep.time_calls`)."""
    results = time_calls(calls, prepared.sets, modes, trials, describe=_error)
    return timed_rows(prepared.label, results, calls, modes, prepared.bytes_moved, copy_gbs)


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
