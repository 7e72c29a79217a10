"""``python -m dsv4_compressor conformance --impl NAME|module:attr [--scenarios ...] [--tolerant]``.

Prints one row per scenario (scenario, tokens, active, verdict, first difference), then the
SPEC §9 error cases, and exits non-zero if anything failed. An implementation that needs a
GPU is skipped with a clear message where there is none.
"""

from __future__ import annotations

import sys
import time


def add_arguments(parser) -> None:
    parser.add_argument("--impl", required=True, action="append",
                        help="spec, torch, triton, cutedsl, module:attribute or an entry-point name (repeatable: "
                             "several implementations share the spec's results)")
    parser.add_argument("--scenarios", nargs="*", metavar="NAME", help="scenario names or glob patterns (default: all of --size)")
    parser.add_argument("--size", choices=("small", "medium", "large", "all"), default=None,
                        help="catalogue part (default: all on a GPU implementation, small otherwise)")
    parser.add_argument("--tolerant", action="store_true", help="SPEC §10 tolerant verdict: count deviations by kind")
    parser.add_argument("--no-errors", action="store_true", help="skip the SPEC §9 error cases")
    parser.add_argument("--device", default=None, help="override the device (cpu or cuda)")
    parser.add_argument("--list", action="store_true", help="list the catalogue and exit")


def _row(cells, widths) -> str:
    return " | ".join(str(c).ljust(w) for c, w in zip(cells, widths))


def run(args) -> int:
    from .errors import CASES, run_error_case
    from .implementations import load_implementation
    from .runner import run_scenario
    from .scenarios import CATALOGUE, scenarios

    if args.list:
        for sc in CATALOGUE:
            print(f"{sc.name:34s} {sc.size:5s} {sc.description}")
        return 0
    loaded = [load_implementation(name) for name in args.impl]
    runnable = []
    for name, impl in zip(args.impl, loaded):
        device = args.device or impl.device()
        if device is None:
            print(f"SKIPPED: implementation {name!r} needs one of {impl.devices} and none is available here "
                  f"(no CUDA GPU found). Nothing was checked.")
        else:
            runnable.append((name, impl, device))
    if not runnable:
        return 0
    size = args.size or ("all" if any(d == "cuda" for _, _, d in runnable) else "small")
    chosen = scenarios(args.scenarios, size)
    mode = "tolerant (SPEC §10)" if args.tolerant else "exact (every byte)"
    names = ", ".join(f"{n!r} on {d}" for n, _, d in runnable)
    print(f"conformance of {names}: {len(chosen)} scenarios, verdict {mode}", flush=True)
    widths = (44, 12, 6, 6, 6, 80)
    print(_row(("scenario", "impl", "tokens", "active", "verdict", "first difference / deviations"), widths))
    print("-" * 150)
    failures = 0
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
            failures += not verdict.passed
    if not args.no_errors:
        print("\nSPEC §9 error cases (ValueError naming the argument, nothing written):")
        for case in CASES:
            for name, impl, device in runnable:
                result = run_error_case(impl, case, device)
                print(_row((case.name, name, "", "", result.status.upper(), result.detail[:110]), widths))
                failures += not result.passed
    print(f"\n{'FAILED' if failures else 'PASSED'}: {failures} failure(s)")
    return 1 if failures else 0
