"""``python -m dsv4_compressor ptx-check``: compile every kernel variant without a GPU and check
its PTX against SPEC §2's rules (:mod:`dsv4_compressor.impl.ptx_rules`).

Triton (capability 9.0) and CuTe DSL kernels are compiled for ``sm_90a``. Exits non-zero
if any variant breaks a rule or fails to compile.
"""

from __future__ import annotations

import os
import time

BACKENDS = {
    # backend -> (module with ptx_variants(), PTX target)
    "triton": ("dsv4_compressor.impl.triton.ptx", "sm_90a"),  # Triton targets sm_90a for capability 9.0
    "cutedsl": ("dsv4_compressor.impl.cutedsl.ptx", "sm_90a"),
}


def add_arguments(parser) -> None:
    parser.add_argument("--backend", choices=(*BACKENDS, "all"), default="all")
    parser.add_argument("--verbose", action="store_true", help="print instruction counts of every variant")
    parser.add_argument("--dump", metavar="DIR", help="write each variant's PTX into DIR")


def _prepare_environment() -> None:
    """Compile for Hopper regardless of the machine: no interpreter, an explicit CuTe arch."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def run(args) -> int:
    import importlib

    from .ptx_rules import check_ptx

    _prepare_environment()
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    failures = 0
    total = 0
    for backend in backends:
        module_name, target = BACKENDS[backend]
        start = time.perf_counter()
        try:
            variants = importlib.import_module(module_name).ptx_variants()
            for variant, ptx, requirements in variants:
                total += 1
                report = check_ptx(backend, variant, ptx, require_target=target, **requirements)
                if args.dump:
                    os.makedirs(args.dump, exist_ok=True)
                    with open(os.path.join(args.dump, f"{backend}-{variant}.ptx".replace("/", "_")), "w") as handle:
                        handle.write(ptx)
                status = "ok  " if report.ok else "FAIL"
                counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items()) if v) if args.verbose else ""
                print(f"{status} {backend:8s} {variant}" + (f"  [{counts}]" if counts else ""), flush=True)
                for violation in report.violations:
                    print(f"       {violation}")
                failures += not report.ok
        except ImportError as error:
            print(f"FAIL {backend:8s} cannot import the backend ({error}); install the '{backend}' extra: "
                  f"pip install 'dsv4-compressor[{backend}]'", flush=True)
            failures += 1
            continue
        print(f"     {backend}: compiled and checked in {time.perf_counter() - start:.1f}s", flush=True)
    print(f"{'PASSED' if not failures else 'FAILED'}: {total} variants checked, {failures} failure(s)")
    return 1 if failures else 0
