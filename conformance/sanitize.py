"""Every kernel path under ``compute-sanitizer``: memcheck, racecheck, synccheck and initcheck.

``python -m dsv4_compressor.conformance.sanitize [--tools memcheck ...] [--impls NAME ...]`` runs,
once under each tool, a workload (this module with ``--workload``) that makes every kernel
path run on a small catalogue (:data:`SCENARIOS`, :data:`SEQUENCES`): each implementation of
:data:`IMPLEMENTATIONS` (the CuTe DSL dispatcher, a variant forcing each C128 path, early
metadata, PDL off, and Triton) judged on every scenario eagerly, then in padded buckets
eagerly and inside captured CUDA graphs (a bucket of 64 tokens), as two calls and as the
combined call where it has one, and on multi-step sequences (eager, the combined call every
other step). The C4 and indexer kernels and the saves run under every implementation; the
scenarios' own token counts (3 to 146) and the bucket put steps through the dispatcher's paths
for small and larger token counts.

Each tool's run passes when the sanitizer reports no error and every verdict of the workload
is a pass. ``--report-api-errors no``: the CUDA Python bindings probe for driver entry points
and produce host API errors that are not the kernels'.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
VARIANTS = "dsv4_compressor.impl.cutedsl.variants:"
IMPLEMENTATIONS = (
    "cutedsl",  # the dispatcher: C4, the indexer, the saves, C128 cluster (16 and 8 CTAs), handoff and pipelined by T
    VARIANTS + "fused_cluster", VARIANTS + "fused_handoff", VARIANTS + "fused_pipelined",  # each C128 path forced
    VARIANTS + "split_block8", VARIANTS + "split_generic",
    VARIANTS + "split_generic_runs",  # the split kernels and the step call's save on runs of tokens (a ballot)
    VARIANTS + "early_metadata", VARIANTS + "split_block8_early",  # metadata read before griddepcontrol.wait
    VARIANTS + "nopdl", VARIANTS + "fused_handoff_nopdl", VARIANTS + "split_block8_nopdl",  # PDL off (C4, indexer, saves too)
    "triton",
)
SCENARIOS = (  # C128 at 8-row state blocks, which every forced path takes
    "c4_mixed_padding", "c4_layout_bf16", "verify_c4_group8", "c128_decode_boundary", "c128_mixed_padding",
    "c128_layout_fp8_per_tensor", "verify_c128_group8", "indexer_c4_mxfp4_hadamard", "indexer_c128_fp8",
)
SEQUENCES = ("rollback_c4_verify8", "rollback_c128_verify")
BUCKETS = (64,)  # every scenario but one fits (that one runs eagerly at its 146 tokens: the pipelined path)
EXIT_SANITIZER = 86  # compute-sanitizer's exit status when it found errors


# ---- the workload (runs under the sanitizer) -----------------------------------------------------
def workload(implementations: tuple[str, ...], buckets: tuple[int, ...], device: str = "cuda") -> int:
    """Every implementation on every scenario: eager, padded, graph-captured (on CUDA); and the sequences."""
    from .graphs import group_steps, plan_groups, run_group
    from .implementations import load_implementation
    from .runner import run_scenario
    from .scenarios import scenarios
    from .sequences import run_sequence, sequences

    chosen = scenarios(list(SCENARIOS))
    groups, _ = plan_groups(chosen, buckets)
    steps = [group_steps(group) for group in groups]
    bad = []
    for name in implementations:
        impl = load_implementation(name)
        verdicts = [run_scenario(impl, scenario, device=device) for scenario in chosen]
        verdicts += [run_sequence(impl, sequence, device=device) for sequence in sequences(list(SEQUENCES))]
        for graph in (False, True) if device == "cuda" else (False,):
            verdicts += [v for group in steps for v in run_group(impl, group, buckets, graph=graph, device=device)]
        failed = [v for v in verdicts if v.status != "pass"]
        print(f"workload: {name}: {len(verdicts)} verdicts, {len(failed)} not passed", flush=True)
        for v in failed:
            print(f"  {v.scenario}: {v.status.upper()} {v.first_difference}", flush=True)
        bad += failed
    print(f"WORKLOAD {'FAILED' if bad else 'PASSED'}: {len(implementations)} implementations, {len(bad)} not passed")
    return 1 if bad else 0


# ---- the driver ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolResult:
    tool: str
    exit_status: int
    errors: int | None  # the sanitizer's error summary (None: not found in its output)
    workload: str  # the workload's last verdict line
    seconds: float

    @property
    def passed(self) -> bool:
        return self.exit_status == 0 and self.errors == 0 and self.workload.startswith("WORKLOAD PASSED")


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, or under CUDA_HOME, or the default toolkit folder."""
    found = shutil.which("compute-sanitizer")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = os.path.join(home, "bin", "compute-sanitizer") if home else None
        if found is None and candidate and os.access(candidate, os.X_OK):
            found = candidate
    return found


def sanitizer_command(sanitizer: str, tool: str, implementations: tuple[str, ...], buckets: tuple[int, ...]) -> list[str]:
    """The command line of one tool's run."""
    return [sanitizer, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", str(EXIT_SANITIZER),
            "--print-limit", "20", sys.executable, "-m", "dsv4_compressor.conformance.sanitize", "--workload",
            "--impls", *implementations, "--buckets", *map(str, buckets)]


def run_tool(command: list[str], tool: str, log_dir: str | None) -> ToolResult:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    output = done.stdout + done.stderr
    if log_dir:
        with open(os.path.join(log_dir, f"sanitize-{tool}.log"), "w") as f:
            f.write(output)
    summary = re.findall(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards displayed \((\d+) error", output)
    summary = [int(a or b) for a, b in summary]
    verdict = [line for line in output.splitlines() if line.startswith("WORKLOAD ")]
    result = ToolResult(tool, done.returncode, summary[-1] if summary else None,
                        verdict[-1] if verdict else "no workload verdict (it did not finish)", time.perf_counter() - start)
    if not result.passed:
        print("\n".join(output.splitlines()[-60:]))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor.conformance.sanitize",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--impls", nargs="+", default=list(IMPLEMENTATIONS), metavar="NAME",
                        help="implementations of the workload (default: every kernel path)")
    parser.add_argument("--buckets", nargs="+", type=int, default=list(BUCKETS), metavar="TOKENS")
    parser.add_argument("--logs", metavar="DIR", default=None, help="write each tool's whole output to DIR")
    parser.add_argument("--workload", action="store_true", help="run the workload here (what each tool runs)")
    parser.add_argument("--device", default="cuda", help="the workload's device (cpu: no graphs; for its own tests)")
    args = parser.parse_args(argv)
    if args.workload:
        return workload(tuple(args.impls), tuple(args.buckets), args.device)
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("NOTHING CHECKED: compute-sanitizer not found (on PATH, under CUDA_HOME or /usr/local/cuda)")
        return 3
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    results = []
    for tool in args.tools:
        print(f"=== {tool}: {' '.join(sanitizer_command(sanitizer, tool, tuple(args.impls), tuple(args.buckets))[:9])} ...",
              flush=True)
        results.append(run_tool(sanitizer_command(sanitizer, tool, tuple(args.impls), tuple(args.buckets)), tool, args.logs))
        r = results[-1]
        print(f"=== {tool}: exit {r.exit_status}, sanitizer errors {r.errors}, {r.workload} ({r.seconds:.0f}s)", flush=True)
    print()
    for r in results:
        print(f"{r.tool:10s} {'PASS' if r.passed else 'FAIL':5s} exit {r.exit_status:3d}  sanitizer errors "
              f"{'?' if r.errors is None else r.errors:>4}  {r.workload}  ({r.seconds:.0f}s)")
    failed = [r.tool for r in results if not r.passed]
    print(f"SANITIZERS {'FAILED: ' + ', '.join(failed) if failed else 'PASSED'}: {len(results)} tool(s), "
          f"{len(args.impls)} implementations")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
