"""``python -m dsv4_compressor ptx-check``: compile every kernel variant without a GPU and check
its PTX against SPEC §2's rules (:mod:`dsv4_compressor.impl.ptx_rules`).

``--arch`` picks the targets, one or several: ``sm_90a`` (Hopper, the default), ``sm_100a``
and ``sm_103a`` (Blackwell), or ``all``. Triton compiles for the target's compute capability (9.0, 10.0,
10.3), CuTe DSL names the target in each compile (``--gpu-arch``); a target the installed
CuTe DSL does not know is skipped with a printed line (counted as skipped, not as passed).
Exits non-zero if any variant breaks a rule or fails to compile.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass

BACKENDS = {  # backend -> module with ptx_variants(target), knows_target(target) and toolchain()
    "triton": "dsv4_compressor.impl.triton.ptx",
    "cutedsl": "dsv4_compressor.impl.cutedsl.ptx",
}
#: The PTX targets, in order: Hopper's, then Blackwell's (B200/GB200, B300/GB300).
TARGETS = ("sm_90a", "sm_100a", "sm_103a")
DEFAULT_TARGET = "sm_90a"


def add_arguments(parser) -> None:
    parser.add_argument("--backend", choices=(*BACKENDS, "all"), default="all")
    parser.add_argument("--arch", choices=(*TARGETS, "all"), nargs="+", default=[DEFAULT_TARGET],
                        help=f"PTX targets (default {DEFAULT_TARGET}; all: {', '.join(TARGETS)})")
    parser.add_argument("--verbose", action="store_true", help="print instruction counts of every variant")
    parser.add_argument("--dump", metavar="DIR", help="write each variant's PTX into DIR")


@dataclass
class Tally:
    """Variants checked, failed and (backend, target) pairs skipped over a run."""

    total: int = 0
    failures: int = 0
    skipped: int = 0


def _prepare_environment() -> None:
    """Compile regardless of the machine: no Triton interpreter (each compile names its target)."""
    os.environ.pop("TRITON_INTERPRET", None)


def _dump(directory: str, backend: str, target: str, variant: str, ptx: str) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{backend}-{target}-{variant}.ptx".replace("/", "_")), "w") as handle:
        handle.write(ptx)


def _report(args, backend: str, target: str, variant: str, ptx: str, requirements: dict) -> bool:
    """Check one variant's PTX, print its line (and violations); True if it passes."""
    from .ptx_rules import check_ptx

    report = check_ptx(backend, variant, ptx, require_target=target, **requirements)
    if args.dump:
        _dump(args.dump, backend, target, variant, ptx)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items()) if v) if args.verbose else ""
    print(f"{'ok  ' if report.ok else 'FAIL'} {backend:8s} {target} {variant}" + (f"  [{counts}]" if counts else ""),
          flush=True)
    for violation in report.violations:
        print(f"       {violation}")
    return report.ok


def _check_backend(args, backend: str, target: str, tally: Tally) -> None:
    """Compile and check one backend's variants for one target, printing a line per variant; a
    target the backend's compiler does not know is skipped with a line saying so."""
    start = time.perf_counter()
    try:
        module = importlib.import_module(BACKENDS[backend])
    except ImportError as error:
        print(f"FAIL {backend:8s} cannot import the backend ({error}); install the '{backend}' extra: "
              f"pip install 'dsv4-compressor[{backend}]'", flush=True)
        tally.failures += 1
        return
    if not module.knows_target(target):
        print(f"skip {backend:8s} {target}: {module.toolchain()} does not know this target; nothing compiled",
              flush=True)
        tally.skipped += 1
        return
    count = 0
    try:
        for variant, ptx, requirements in module.ptx_variants(target):
            count += 1
            tally.failures += not _report(args, backend, target, variant, ptx, requirements)
    except Exception as error:  # a variant that does not compile for this target: named by the compiler's error
        print(f"FAIL {backend:8s} {target}: compiling failed after {count} variant(s) "
              f"({type(error).__name__}: {error})", flush=True)
        tally.failures += 1
    tally.total += count
    print(f"     {backend} {target}: {count} variants compiled and checked in {time.perf_counter() - start:.1f}s",
          flush=True)


def _targets(asked: list[str]) -> tuple[str, ...]:
    """The targets asked for (``all``: every one), each once, in :data:`TARGETS` order."""
    return tuple(t for t in TARGETS if t in asked or "all" in asked)


def run(args) -> int:
    _prepare_environment()
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    targets = _targets(args.arch)
    tally = Tally()
    for target in targets:
        for backend in backends:
            _check_backend(args, backend, target, tally)
    skipped = f", {tally.skipped} target(s) skipped" if tally.skipped else ""
    print(f"{'PASSED' if not tally.failures else 'FAILED'}: {tally.total} variants checked for "
          f"{', '.join(targets)}, {tally.failures} failure(s){skipped}")
    return 1 if tally.failures else 0
