"""``python -m dsv4_compressor conformance --impl NAME|module:attr [--scenarios ...] [--tolerant]``.

Prints one row per scenario (scenario, implementation, tokens, active, verdict, first
difference), then the SPEC §9 error cases, then a summary naming what failed and what was
unsupported. Exit status: 0 when at least one scenario or error case was checked and nothing
failed; 1 when something failed; 2 on a usage error (an unknown implementation, a pattern
that matches no scenario); 3 when nothing was checked (no device for the implementation,
every scenario unsupported).
"""

from __future__ import annotations

import json
import os
import sys
import time

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_CHECKED = 0, 1, 2, 3


def add_arguments(parser) -> None:
    parser.add_argument("--impl", required=True, action="append",
                        help="spec, torch, triton, cutedsl, module:attribute or an entry-point name (repeatable: "
                             "several implementations share the spec's results)")
    parser.add_argument("--scenarios", nargs="*", metavar="NAME",
                        help="scenario names or glob patterns, looked up in the whole catalogue unless --size is given")
    parser.add_argument("--size", choices=("small", "medium", "large", "all"), default=None,
                        help="catalogue part, cumulative: medium includes small, large includes both "
                             "(default: all on a GPU implementation, small otherwise)")
    parser.add_argument("--tolerant", action="store_true", help="SPEC §10 tolerant verdict (error bounds; docs/conformance.md)")
    parser.add_argument("--no-errors", action="store_true", help="skip the SPEC §9 error cases")
    parser.add_argument("--errors-only", action="store_true", help="run only the SPEC §9 error cases")
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


def run(args) -> int:
    from .errors import CASES, run_error_cases
    from .implementations import load_implementation
    from .runner import run_scenario
    from .scenarios import CATALOGUE, scenarios

    if args.list:
        for sc in CATALOGUE:
            where = f"{sc.size} ({sc.device} only)" if sc.device else sc.size
            print(f"{sc.name:40s} {where:18s} {sc.description}")
        return EXIT_PASSED
    if args.errors_only and args.no_errors:
        return _usage("--errors-only and --no-errors exclude each other")
    try:
        loaded = [load_implementation(name) for name in args.impl]
    except ValueError as error:
        return _usage(str(error))
    except Exception as error:  # an implementation module that fails on import
        return _usage(f"--impl: loading failed: {type(error).__name__}: {error}")
    runnable, skipped = [], []
    for name, impl in zip(args.impl, loaded):
        device = args.device or impl.device()
        if impl.takes_numpy and device not in (None, "cpu"):
            return _usage(f"--device: expected cpu for {name!r}, which takes NumPy arrays, got {device!r}")
        if device is None:
            print(f"SKIPPED: implementation {name!r} needs one of {impl.devices} and none is available here "
                  f"(no CUDA GPU found).")
            skipped.append(name)
        else:
            runnable.append((name, impl, device))
            warning = _interpreter_warning(name, impl)
            if warning:
                print(warning, file=sys.stderr)
    size = args.size or ("all" if any(d == "cuda" for _, _, d in runnable) else "small")
    try:
        chosen = [] if args.errors_only else scenarios(args.scenarios, args.size if args.scenarios and not args.size else size)
    except ValueError as error:
        return _usage(str(error))
    if args.scenarios and not chosen and not args.errors_only:
        return _usage(f"--scenarios {' '.join(args.scenarios)} selects no scenario of size {args.size!r}")
    results = {"implementations": {n: {"device": d} for n, _, d in runnable}, "skipped": skipped,
               "mode": "tolerant" if args.tolerant else "exact", "scenarios": [], "errors": []}
    failed: dict[str, list[str]] = {}
    unsupported: dict[str, list[str]] = {}
    checked = 0
    if runnable and chosen:
        mode = "tolerant (SPEC §10 error bounds)" if args.tolerant else "exact (every byte)"
        names = ", ".join(f"{n!r} on {d}" for n, _, d in runnable)
        print(f"conformance of {names}: {len(chosen)} scenarios, verdict {mode}", flush=True)
        widths = (44, 12, 6, 6, 11, 80)
        print(_row(("scenario", "impl", "tokens", "active", "verdict", "first difference / deviations"), widths))
        print("-" * 150)
        for scenario in chosen:
            for name, impl, device in runnable:
                start = time.perf_counter()
                verdict = run_scenario(impl, scenario, tolerant=args.tolerant, device=device)
                detail = verdict.first_difference
                if args.tolerant and verdict.counts:
                    detail = "; ".join(f"{k}: {v}" for k, v in verdict.counts.items() if k != "traceback") or detail
                print(_row((scenario.name, name, verdict.tokens, verdict.active, verdict.status.upper(), detail), widths)
                      + f"  ({time.perf_counter() - start:.1f}s)", flush=True)
                if verdict.status == "error" and "traceback" in verdict.counts:
                    print(verdict.counts["traceback"], file=sys.stderr)
                checked += verdict.checked
                if not verdict.passed:
                    failed.setdefault(name, []).append(scenario.name)
                if verdict.status == "unsupported":
                    unsupported.setdefault(name, []).append(scenario.name)
                results["scenarios"].append({
                    "scenario": scenario.name, "size": scenario.size, "sections": list(scenario.sections), "impl": name,
                    "device": device, "tokens": verdict.tokens, "active": verdict.active, "status": verdict.status,
                    "detail": verdict.first_difference, "region": verdict.region,
                    "counts": {k: v for k, v in verdict.counts.items() if k != "traceback"},
                    "seconds": round(time.perf_counter() - start, 3)})
    if runnable and not args.no_errors:
        print("\nSPEC §9 error cases (ValueError leading with the argument's name, no byte of any buffer changed):",
              flush=True)
        widths = (44, 12, 6, 6, 11, 80)
        for name, impl, device in runnable:
            for result in run_error_cases(impl, CASES, device):
                print(_row((result.case, name, "", "", result.status.upper(), result.detail[:110]), widths), flush=True)
                checked += result.status in ("pass", "fail", "error")
                if not result.passed:
                    failed.setdefault(name, []).append(f"§9 {result.case}")
                if result.status == "unsupported":
                    unsupported.setdefault(name, []).append(f"§9 {result.case}")
                results["errors"].append({"case": result.case, "impl": name, "status": result.status, "detail": result.detail})
    print()
    for name, names in unsupported.items():
        print(f"UNSUPPORTED by {name} (declared; not called): {len(names)}: {', '.join(names)}")
    for name, names in failed.items():
        print(f"FAILED by {name}: {len(names)}: {', '.join(names)}")
    if failed:
        status, line = EXIT_FAILED, f"FAILED: {sum(map(len, failed.values()))} failure(s) in {checked} check(s)"
    elif not checked:
        status, line = EXIT_NOTHING_CHECKED, ("NOTHING CHECKED: no scenario or error case ran "
                                              + ("(no device for " + ", ".join(skipped) + ")" if skipped else "(all unsupported)")
                                              + " — this is not a pass")
    else:
        status, line = EXIT_PASSED, f"PASSED: {checked} check(s), 0 failures"
    print(line)
    if args.json:
        results.update(exit_status=status, summary=line, failed=failed, unsupported=unsupported, checked=checked)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return status
