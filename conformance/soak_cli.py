"""``python -m dsv4_compressor soak --minutes N [--impl NAME ...] [--size small|large] [--layers NAME ...]``.

Runs :mod:`.soak`'s randomized engine until the time is up and prints what it did: engine and
layer steps, tokens, entries written, bytes compared across implementations and with the spec,
batch-invariance checks, how the steps were made (eager, padded, graph replays), and every
difference. Defaults: on a CUDA GPU ``--impl triton --impl cutedsl`` (both kernel families side
by side) at the large size with graph replays; elsewhere ``--impl spec --impl torch --impl
triton`` (Triton under its interpreter) at the small size.

Exit status: 0 when steps ran and nothing differed; 1 on a difference or an implementation's
error; 2 on a usage error; 3 when nothing ran (no device for the implementations).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 3


def add_arguments(parser) -> None:
    from .soak import LAYERS, SIZES

    parser.add_argument("--minutes", type=float, default=1.0, help="how long to run (fractions allowed; default 1)")
    parser.add_argument("--impl", action="append", default=None,
                        help="implementations side by side, the first the reference (repeatable; default: triton and "
                             "cutedsl on a CUDA GPU, else spec, torch and triton under its interpreter)")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="engine size (default: large on a CUDA GPU, small elsewhere)")
    parser.add_argument("--layers", nargs="+", choices=[layer.name for layer in LAYERS], default=None,
                        help="layers to run (default: every layout)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-share", type=float, default=0.3,
                        help="share of the run's time for the spec's and the batch-invariance checks (default 0.3)")
    parser.add_argument("--no-graphs", action="store_true", help="no CUDA-graph replays (eager and padded calls only)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the report to FILE as JSON")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _usage(message: str) -> int:
    print(f"soak: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _implementations(names: list[str], cuda: bool):
    """(implementation, device) of each name, or raise ValueError naming the one that cannot run."""
    from .implementations import load_implementation

    if not cuda and "triton" in names:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of Triton
    chosen = []
    for name in names:
        impl = load_implementation(name)
        device = impl.device()
        if device is None:
            raise LookupError(f"implementation {name!r} needs one of {impl.devices} and none is available here")
        chosen.append((impl, device))
    return chosen


def _print_report(report, implementations, options) -> None:
    names = ", ".join(f"{impl.name} on {device}" for impl, device in implementations)
    print(f"\nsoak of {names}; {len(options.layers)} layers: {', '.join(layer.name for layer in options.layers)}")
    print(f"steps: {report.engine_steps} engine steps, {report.layer_steps} layer steps, {report.tokens} tokens, "
          f"{report.entries} entries written; requests {report.arrived} arrived, {report.finished} finished; "
          f"{report.verify_groups} verify groups, {report.rerun_positions} positions run again")
    print("calls: " + ", ".join(f"{mode} {count}" for mode, count in sorted(report.calls.items()))
          + f" (layer steps per implementation); {report.captures} graphs captured")
    print(f"compared: {report.bytes_compared} bytes across implementations, {report.spec_bytes} bytes with the spec on "
          f"{report.spec_checks} layer steps, {report.invariance_checks} batch-invariance checks")
    print(f"differences: {len(report.differences)}")
    for text in report.differences[:20]:
        print(f"  {text}")
    if report.stopped:
        print(f"STOPPED: {report.stopped}")


def run(args) -> int:
    from .soak import LAYERS, SIZES, Soak, SoakOptions

    if not args.minutes > 0:
        return _usage(f"--minutes: expected a positive number, got {args.minutes}")
    if not 0 < args.check_share <= 1:
        return _usage(f"--check-share: expected a share in (0, 1], got {args.check_share}")
    cuda = _cuda_available()
    names = args.impl or (["triton", "cutedsl"] if cuda else ["spec", "torch", "triton"])
    try:
        implementations = _implementations(names, cuda)
    except LookupError as error:
        print(f"NOTHING RAN: {error.args[0]}")
        return EXIT_NOTHING_RAN
    except ValueError as error:
        return _usage(str(error))
    size = SIZES[args.size or ("large" if cuda else "small")]
    layers = tuple(layer for layer in LAYERS if args.layers is None or layer.name in args.layers)
    options = SoakOptions(seconds=60 * args.minutes, size=size, layers=layers, seed=args.seed,
                          check_share=args.check_share, graphs=not args.no_graphs)
    report = Soak(implementations, options).run()
    _print_report(report, implementations, options)
    if report.differences or report.stopped:
        status = EXIT_FAILED
        line = f"FAILED: {len(report.differences)} difference(s)" + (", stopped early" if report.stopped else "")
    elif not report.layer_steps:
        status, line = EXIT_NOTHING_RAN, "NOTHING RAN: no step finished in the time given"
    else:
        status, line = EXIT_PASSED, (f"PASSED: {report.layer_steps} layer steps, {report.bytes_compared + report.spec_bytes} "
                                     f"bytes compared, 0 differences")
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**asdict(report), "exit_status": status, "summary": line,
                       "implementations": [f"{impl.name}@{device}" for impl, device in implementations]}, f, indent=1)
    return status
