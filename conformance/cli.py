"""``python -m dsv4_compressor conformance --impl NAME|module:attr [--model v4|v4.1|all] [--scenarios ...] [--tolerant] [--graph|--padded]``.

Judges DeepSeek-V4's operations (SPEC §1-§13) and DeepSeek-V4.1's (SPEC §14), each where the
implementation declares them (``--model`` narrows it). Prints one row per scenario (scenario, implementation, tokens, active, verdict, first
difference), then the multi-step sequences (speculative decoding's rollbacks), the batch
invariance of every scenario, the SPEC §9 error cases, and a summary naming what failed and
what was unsupported. ``--graph`` replays every scenario that fits inside CUDA graphs captured
per bucket (``--padded``: the same padded buckets, eagerly, on any device) instead.

Exit status: 0 when at least one check ran and nothing failed; 1 when something failed; 2 on a
usage error (an unknown implementation, a pattern that matches no scenario, ``--graph`` with
an implementation that takes NumPy arrays); 3 when nothing was checked (no device for the
implementation, every scenario unsupported, ``--graph`` without a CUDA GPU).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_CHECKED = 0, 1, 2, 3
WIDTHS = (44, 12, 6, 6, 11, 80)  # scenario, impl, tokens, active, verdict, detail
REPLAY_WIDTHS = (44, 12, 6, 10, 6, 6, 11, 80)  # scenario, impl, bucket, form, tokens, active, verdict, detail


def add_arguments(parser) -> None:
    parser.add_argument("--impl", required=True, action="append",
                        help="spec, torch, triton, cutedsl, module:attribute or an entry-point name (repeatable: "
                             "several implementations share the spec's results)")
    parser.add_argument("--scenarios", nargs="*", metavar="NAME",
                        help="scenario or sequence names or glob patterns, looked up in the whole catalogue unless "
                             "--size is given")
    parser.add_argument("--size", choices=("small", "medium", "large", "all"), default=None,
                        help="catalogue part, cumulative: medium includes small, large includes both "
                             "(default: all on a GPU implementation, small otherwise)")
    parser.add_argument("--model", choices=("v4", "v4.1", "all"), default=None,
                        help="DeepSeek-V4's operations (SPEC §1-§13), V4.1's (SPEC §14) or both (default: every model "
                             "the implementation declares)")
    parser.add_argument("--tolerant", action="store_true", help="SPEC §10 tolerant verdict (error bounds; docs/conformance.md)")
    parser.add_argument("--no-errors", action="store_true", help="skip the SPEC §9 error cases")
    parser.add_argument("--errors-only", action="store_true", help="run only the SPEC §9 error cases")
    parser.add_argument("--no-sequences", action="store_true", help="skip the multi-step sequences")
    parser.add_argument("--no-invariance", action="store_true", help="skip the batch-invariance verdict")
    replay = parser.add_mutually_exclusive_group()
    replay.add_argument("--graph", action="store_true",
                        help="replay each scenario inside CUDA graphs captured once per bucket and static configuration "
                             "(GPU; docs/conformance.md)")
    replay.add_argument("--padded", action="store_true",
                        help="as --graph, with eager calls instead of graph replays (any device)")
    parser.add_argument("--buckets", nargs="+", type=int, metavar="TOKENS", default=None,
                        help="bucket sizes for --graph / --padded (default 1 8 64 512 4096)")
    parser.add_argument("--device", default=None, help="override the device (cpu or cuda)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write every verdict to FILE as JSON")
    parser.add_argument("--list", action="store_true", help="list the catalogue and exit")


def _row(cells, widths) -> str:
    return " | ".join(str(c).ljust(w) for c, w in zip(cells, widths))


def _usage(message: str) -> int:
    print(f"conformance: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _uses_triton(name: str, target) -> bool:
    """Whether a third-party implementation is (or is built from) Triton kernels."""
    import types

    if name == "triton":  # the project's kernels encode bf16 and E4M3 with integer arithmetic
        return False
    module_name = target.__name__ if isinstance(target, types.ModuleType) else type(target).__module__
    if "triton" in module_name.lower():
        return True
    module = sys.modules.get(module_name)
    return module is not None and any(type(v).__module__.startswith("triton") for v in list(vars(module).values()))


def _interpreter_warning(name: str, impl) -> str | None:
    """A warning when a Triton implementation runs under the Triton interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1" or not _uses_triton(name, impl.target):
        return None
    return (f"WARNING: {name!r} runs under TRITON_INTERPRET=1. The interpreter's fp32->bf16 cast truncates and its "
            f"fp32->fp8 cast can drop a carry, unlike a GPU's: a kernel using .to(tl.bfloat16) or .to(tl.float8e4nv) "
            f"fails here for reasons not its own. Judge Triton kernels on a GPU.")


class UsageError(Exception):
    """A bad command line: reported on stderr with exit status 2."""


class NothingToCheck(Exception):
    """Nothing can run here (no device): reported with exit status 3."""


@dataclass
class Report:
    """What the run found, section by section, and its JSON form."""

    mode: str  # "exact" or "tolerant"
    failed: dict = field(default_factory=dict)  # implementation -> [what failed]
    unsupported: dict = field(default_factory=dict)  # implementation -> [what was declared unsupported]
    variant: dict = field(default_factory=dict)  # implementation -> [scenarios whose bytes depend on the batch]
    checked: int = 0
    results: dict = field(default_factory=lambda: {"scenarios": [], "sequences": [], "invariance": [], "replays": [],
                                                   "errors": []})

    def count(self, impl: str, label: str, status: str, passed: bool) -> None:
        """One verdict: checked or not, failed or not, unsupported or not."""
        self.checked += status in ("pass", "fail", "error")
        if not passed:
            self.failed.setdefault(impl, []).append(label)
        if status == "unsupported":
            self.unsupported.setdefault(impl, []).append(label)


# ---- choosing what runs ---------------------------------------------------------------------
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _load(names: list[str]) -> list:
    from .implementations import load_implementation

    try:
        return [load_implementation(name) for name in names]
    except ValueError as error:
        raise UsageError(str(error)) from None
    except Exception as error:  # an implementation module that fails on import
        raise UsageError(f"--impl: loading failed: {type(error).__name__}: {error}") from None


def _runnable(args, loaded: list) -> tuple[list[tuple[str, object, str]], list[str]]:
    """(name, implementation, device) of each implementation that can run here, and the names of those that cannot."""
    numpy_ones = [name for name, impl in zip(args.impl, loaded) if impl.takes_numpy]
    if args.graph and numpy_ones:
        raise UsageError(f"--graph: expected implementations taking torch tensors on a CUDA GPU, got {numpy_ones[0]!r}, "
                         f"which takes NumPy arrays (--padded runs the same buckets eagerly)")
    if args.graph and not _cuda_available():
        raise NothingToCheck("--graph needs a CUDA GPU (none found here): CUDA graphs are captured and replayed on one "
                             "(--padded runs the same padded buckets eagerly, on any device)")
    runnable, skipped = [], []
    for name, impl in zip(args.impl, loaded):
        device = args.device or impl.device()
        if impl.takes_numpy and device not in (None, "cpu"):
            raise UsageError(f"--device: expected cpu for {name!r}, which takes NumPy arrays, got {device!r}")
        if device is None:
            print(f"SKIPPED: implementation {name!r} needs one of {impl.devices} and none is available here "
                  f"(no CUDA GPU found).")
            skipped.append(name)
            continue
        if args.graph and device != "cuda":
            raise NothingToCheck(f"--graph needs a CUDA GPU: {name!r} runs on {device!r} here (--padded runs the same "
                                 f"padded buckets eagerly, on any device)")
        runnable.append((name, impl, device))
        warning = _interpreter_warning(name, impl)
        if warning:
            print(warning, file=sys.stderr)
    return runnable, skipped


def _models(args, runnable) -> set[str]:
    """The models judged: ``--model``, or every model some runnable implementation declares."""
    if args.model == "all":
        return {"v4", "v4.1"}
    if args.model:
        return {args.model}
    declared = set()
    for _, impl, _ in runnable:
        declared |= {"v4"} if impl.capabilities.v4 else set()
        declared |= {"v4.1"} if impl.capabilities.v41 is not None else set()
    return declared or {"v4"}


def _selection(args, on_gpu: bool, models: set[str] = frozenset({"v4"})) -> tuple[list, list, list]:
    """(scenarios, sequences, V4.1 scenarios) chosen by ``--scenarios`` / ``--size`` / ``--model``."""
    import fnmatch

    from .scenarios import CATALOGUE, scenarios
    from .sequences import SEQUENCES, sequences
    from .v41_scenarios import V41_CATALOGUE, v41_scenarios

    if args.errors_only:
        return [], [], []
    size = args.size or ("all" if on_gpu else "small")
    patterns = args.scenarios
    if patterns:
        every = CATALOGUE + SEQUENCES + V41_CATALOGUE
        unknown = [p for p in patterns if not any(fnmatch.fnmatch(s.name, p) for s in every)]
        if unknown:
            raise UsageError(f"--scenarios: no scenario matches {unknown} (python -m dsv4_compressor conformance --impl "
                             f"spec --list shows the catalogue)")
        in_catalogue = [p for p in patterns if any(fnmatch.fnmatch(s.name, p) for s in CATALOGUE)]
        chosen = scenarios(in_catalogue, args.size) if in_catalogue else []
        chosen_sequences = sequences(patterns)
        chosen_v41 = v41_scenarios(patterns, args.size)
    else:
        chosen, chosen_sequences, chosen_v41 = scenarios(None, size), sequences(), v41_scenarios(None, size)
    if "v4" not in models:
        chosen, chosen_sequences = [], []
    if "v4.1" not in models or args.graph or args.padded:  # V4.1 is judged by eager calls
        chosen_v41 = []
    if patterns and not chosen and not chosen_sequences and not chosen_v41:
        raise UsageError(f"--scenarios {' '.join(patterns)} selects no scenario of size {args.size!r} of "
                         f"{' or '.join(sorted(models))}")
    if args.no_sequences or args.graph or args.padded:
        chosen_sequences = []
    return chosen, chosen_sequences, chosen_v41


# ---- the sections ---------------------------------------------------------------------------
def _scenario_rows(args, runnable, chosen, report: Report) -> None:
    from .runner import run_scenario

    mode = "tolerant (SPEC §10 error bounds)" if args.tolerant else "exact (every byte)"
    names = ", ".join(f"{n!r} on {d}" for n, _, d in runnable)
    print(f"conformance of {names}: {len(chosen)} scenarios, verdict {mode}", flush=True)
    _scenario_table(args, runnable, chosen, report, run_scenario, lambda verdict: {})


def _v41_rows(args, runnable, chosen, report: Report) -> None:
    from .v41_runner import run_v41_scenario

    mode = "tolerant (SPEC §14.9 error bounds)" if args.tolerant else "exact (every byte)"
    print(f"\nDeepSeek-V4.1 (SPEC §14): {len(chosen)} scenarios, verdict {mode}; latent, state and cache compared",
          flush=True)
    _scenario_table(args, runnable, chosen, report, run_v41_scenario,
                    lambda verdict: {"model": "v4.1", "departure": verdict.departure})


def _scenario_table(args, runnable, chosen, report: Report, run, extra) -> None:
    """A catalogue's table: its header, then :func:`_verdict_rows` (``extra(verdict)``: the JSON
    fields the catalogue adds to each scenario's)."""
    print(_row(("scenario", "impl", "tokens", "active", "verdict", "first difference / deviations"), WIDTHS))
    print("-" * 150)

    def record(scenario, name: str, device: str, verdict, seconds: float) -> tuple[str, dict]:
        return "scenarios", {
            "scenario": scenario.name, "size": scenario.size, "sections": list(scenario.sections), "impl": name,
            "device": device, **_verdict_json(verdict), **extra(verdict), "seconds": round(seconds, 3)}

    _verdict_rows(args, runnable, chosen, report, run, record)


def _verdict_rows(args, runnable, chosen, report: Report, run, record) -> None:
    """One table row per scenario (or sequence) and implementation: ``run(impl, item, tolerant=,
    device=)`` gives the verdict, ``record(item, impl name, device, verdict, seconds)`` the section of
    the JSON report and the entry it gets."""
    for item in chosen:
        for name, impl, device in runnable:
            start = time.perf_counter()
            verdict = run(impl, item, tolerant=args.tolerant, device=device)
            _print_verdict(args, item.name, name, verdict, time.perf_counter() - start)
            report.count(name, item.name, verdict.status, verdict.passed)
            section, entry = record(item, name, device, verdict, time.perf_counter() - start)
            report.results[section].append(entry)


def _print_verdict(args, label: str, name: str, verdict, seconds: float) -> None:
    detail = verdict.first_difference
    if args.tolerant and verdict.counts:
        detail = "; ".join(f"{k}: {v}" for k, v in verdict.counts.items() if k != "traceback") or detail
    print(_row((label, name, verdict.tokens, verdict.active, verdict.status.upper(), detail), WIDTHS)
          + f"  ({seconds:.1f}s)", flush=True)
    if verdict.status == "error" and "traceback" in verdict.counts:
        print(verdict.counts["traceback"], file=sys.stderr)


def _verdict_json(verdict) -> dict:
    return {"tokens": verdict.tokens, "active": verdict.active, "status": verdict.status,
            "detail": verdict.first_difference, "region": verdict.region,
            "counts": {k: v for k, v in verdict.counts.items() if k != "traceback"}}


def _sequence_rows(args, runnable, chosen_sequences, report: Report) -> None:
    from .sequences import run_sequence

    print(f"\nmulti-step sequences ({len(chosen_sequences)}: the caches carried from step to step, both compared with "
          f"the spec's after every step):", flush=True)
    _verdict_rows(args, runnable, chosen_sequences, report, run_sequence,
                  lambda sequence, name, device, verdict, seconds: (
                      "sequences", {"sequence": sequence.name, "impl": name, "device": device, **_verdict_json(verdict)}))


def _invariance_rows(args, runnable, chosen, report: Report) -> None:
    from .invariance import run_invariance

    print("\nbatch invariance (each scenario's tokens alone, with their request, in random parts: the bytes of the "
          "whole step; " + ("reported, not a failure, in the tolerant verdict):" if args.tolerant else "a failure otherwise):"),
          flush=True)
    for scenario in chosen:
        for name, impl, device in runnable:
            verdict = run_invariance(impl, scenario, device=device)
            if not verdict.checked:  # unsupported or not on this device: the scenario's own row says so
                continue
            varies = verdict.status == "fail"
            shown = "VARIANT" if varies and args.tolerant else verdict.status.upper()
            detail = f"{verdict.calls} calls" if verdict.status == "pass" else verdict.detail
            print(_row((scenario.name, name, "", "", shown, detail), WIDTHS), flush=True)
            if verdict.traceback:
                print(verdict.traceback, file=sys.stderr)
            if varies:
                report.variant.setdefault(name, []).append(scenario.name)
            passed = verdict.passed or (varies and args.tolerant)
            report.count(name, f"batch invariance {scenario.name}", verdict.status, passed)
            report.results["invariance"].append({"scenario": scenario.name, "impl": name, "status": verdict.status,
                                                 "detail": verdict.detail, "calls": verdict.calls})


def _error_rows(runnable, report: Report, models: set[str] = frozenset({"v4"})) -> None:
    from .errors import CASES, run_error_cases
    from .v41_errors import V41_CASES

    cases = (CASES if "v4" in models else ()) + (V41_CASES if "v4.1" in models else ())
    sections = " and ".join(s for s, m in (("SPEC §9", "v4"), ("SPEC §14.8", "v4.1")) if m in models)
    print(f"\n{sections} error cases (ValueError leading with the argument's name, no byte of any buffer changed):",
          flush=True)
    for name, impl, device in runnable:
        for result in run_error_cases(impl, cases, device):
            print(_row((result.case, name, "", "", result.status.upper(), result.detail[:110]), WIDTHS), flush=True)
            section = "§14.8" if result.case.startswith("v41 ") else "§9"
            report.count(name, f"{section} {result.case}", result.status, result.passed)
            report.results["errors"].append({"case": result.case, "impl": name, "status": result.status,
                                             "detail": result.detail})


def _replay_rows(args, runnable, chosen, report: Report) -> None:
    from .buckets import DEFAULT_BUCKETS
    from .graphs import group_steps, plan_groups, run_group

    buckets = tuple(args.buckets or DEFAULT_BUCKETS)
    how = "CUDA graphs captured once per bucket and configuration" if args.graph else "eager calls padded into buckets"
    groups, too_large = plan_groups(chosen, buckets)
    judged = "tolerant: SPEC §10 bounds for the entries" if args.tolerant else "exact"
    print(f"replays of {len(chosen) - len(too_large)} scenarios in {len(groups)} configurations, buckets "
          f"{' '.join(map(str, buckets))}: {how}, every byte compared with the spec ({judged})", flush=True)
    if too_large:
        print(f"(larger than every bucket, not replayed: {', '.join(s.name for s in too_large)})")
    print(_row(("scenario", "impl", "bucket", "form", "tokens", "active", "verdict", "first difference"), REPLAY_WIDTHS))
    print("-" * 160)
    for group in groups:
        steps = group_steps(group)
        for name, impl, device in runnable:
            for verdict in run_group(impl, steps, buckets, graph=args.graph, device=device, tolerant=args.tolerant):
                print(_row((verdict.scenario, name, verdict.bucket or "", verdict.form, verdict.tokens, verdict.active,
                            verdict.status.upper(), verdict.first_difference), REPLAY_WIDTHS), flush=True)
                if verdict.status == "error" and "traceback" in verdict.counts:
                    print(verdict.counts["traceback"], file=sys.stderr)
                label = f"{verdict.scenario} [bucket {verdict.bucket}, {verdict.form}]"
                report.count(name, label, verdict.status, verdict.passed)
                report.results["replays"].append({"scenario": verdict.scenario, "impl": name, "bucket": verdict.bucket,
                                                  "form": verdict.form, **_verdict_json(verdict)})


def _summary(report: Report, skipped: list[str]) -> tuple[int, str]:
    print()
    for name, names in report.unsupported.items():
        print(f"UNSUPPORTED by {name} (declared; not called): {len(names)}: {', '.join(names)}")
    for name, names in report.variant.items():
        print(f"NOT BATCH-INVARIANT: {name}, on {len(names)} scenario(s): {', '.join(names)}")
    for name, names in report.failed.items():
        print(f"FAILED by {name}: {len(names)}: {', '.join(names)}")
    if report.failed:
        status = EXIT_FAILED
        line = f"FAILED: {sum(map(len, report.failed.values()))} failure(s) in {report.checked} check(s)"
    elif not report.checked:
        status = EXIT_NOTHING_CHECKED
        line = ("NOTHING CHECKED: no scenario or error case ran "
                + ("(no device for " + ", ".join(skipped) + ")" if skipped else "(all unsupported)") + " — this is not a pass")
    else:
        status, line = EXIT_PASSED, f"PASSED: {report.checked} check(s), 0 failures"
    print(line)
    return status, line


def _list_catalogue() -> int:
    from .scenarios import CATALOGUE
    from .sequences import SEQUENCES
    from .v41_scenarios import V41_CATALOGUE

    for sc in CATALOGUE:
        where = f"{sc.size} ({sc.device} only)" if sc.device else sc.size
        print(f"{sc.name:40s} {where:18s} {sc.description}")
    for sq in SEQUENCES:
        print(f"{sq.name:40s} {'small (steps)':18s} {sq.description}")
    for sc in V41_CATALOGUE:
        print(f"{sc.name:40s} {sc.size + ' (V4.1)':18s} {sc.description}")
    return EXIT_PASSED


def run(args) -> int:
    if args.list:
        return _list_catalogue()
    if args.errors_only and args.no_errors:
        return _usage("--errors-only and --no-errors exclude each other")
    if (args.graph or args.padded) and args.errors_only:
        return _usage("--errors-only runs no scenario: it excludes --graph and --padded")
    if args.buckets is not None and not (args.graph or args.padded):
        return _usage("--buckets: expected with --graph or --padded")
    if args.buckets is not None and min(args.buckets) < 1:
        return _usage(f"--buckets: expected token counts of at least 1, got {args.buckets}")
    try:
        runnable, skipped = _runnable(args, _load(args.impl))
        models = _models(args, runnable)
        chosen, chosen_sequences, chosen_v41 = _selection(args, any(d == "cuda" for _, _, d in runnable), models)
    except UsageError as error:
        return _usage(str(error))
    except NothingToCheck as error:
        print(f"NOTHING CHECKED: {error}")
        return EXIT_NOTHING_CHECKED
    report = Report("tolerant" if args.tolerant else "exact")
    if runnable and chosen and (args.graph or args.padded):
        _replay_rows(args, runnable, chosen, report)
    elif runnable:
        if chosen:
            _scenario_rows(args, runnable, chosen, report)
        if chosen_sequences:
            _sequence_rows(args, runnable, chosen_sequences, report)
        if chosen and not args.no_invariance:
            _invariance_rows(args, runnable, chosen, report)
        if chosen_v41:
            _v41_rows(args, runnable, chosen_v41, report)
        if not args.no_errors:
            _error_rows(runnable, report, models)
    status, line = _summary(report, skipped)
    if args.json:
        _write_json(args.json, report, runnable, skipped, status, line)
    return status


def _write_json(path: str, report: Report, runnable, skipped: list[str], status: int, line: str) -> None:
    results = {"implementations": {n: {"device": d} for n, _, d in runnable}, "skipped": skipped, "mode": report.mode,
               **report.results, "exit_status": status, "summary": line, "failed": report.failed,
               "unsupported": report.unsupported, "not_batch_invariant": report.variant, "checked": report.checked}
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
