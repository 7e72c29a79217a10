"""``python -m dsv4_compressor.bench.steps state|v41|memory``: the step benchmarks of SPEC §13's state
formats and §14's V4.1 compressors, each call beside the step's floor and the copy bandwidth measured
in the same run.

    steps state [--cases serving dense] [--addressing paged ring] [--state-dtype fp32 bf16] [--ratio 128 4] [--sizes ...]
                [--impl cutedsl --impl triton --impl module:attribute]
    steps v41 [--cases sweeps steps index-key] [--ratio 1 2] [--input-dtype fp32 bf16] [--sizes ...]
              [--layout flashmla_fp8] [--impl triton --impl triton-split --impl cutedsl --impl module:attribute]
    steps memory                      the state memory per request per layer of each format (computed)

Common: ``--mode eager|graph`` (default both), ``--trials``, ``--sets``, ``--out``, ``--tag``, and
``--dry-run``: every case's metadata built at full size, then each call made once on a small version
of every case, untimed (on a CPU the Triton kernels run under ``TRITON_INTERPRET=1``); the exit
status is 1 if a call failed for another reason than a refusal ("unsupported"). ``--profile``: for
``ncu --profile-from-start off``: each call (and the floor) warmed up on every input set, then made
once more between ``cudaProfilerStart`` and ``cudaProfilerStop``, untimed, so that ncu sees each
kernel of each call once (e.g. ``ncu --profile-from-start off --metrics gpu__time_duration.sum
python -m dsv4_compressor.bench.steps state --cases serving --ratio 128 --impl cutedsl --profile``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dsv4_compressor.bench.steps", description=__doc__.split("\n")[0])
    p.add_argument("suite", choices=("state", "v41", "memory"))
    p.add_argument("--cases", nargs="+", help="state: serving, dense (default both); v41: sweeps, steps, index-key "
                   "(default sweeps and steps)")
    p.add_argument("--ratio", type=int, nargs="+", help="state: 128, 4; v41: 1, 2 (default both)")
    p.add_argument("--sizes", type=int, nargs="+", help="token counts of the sweeps (default 1 ... 16384)")
    p.add_argument("--addressing", nargs="+", choices=("paged", "ring"), help="state: serving steps (default both)")
    p.add_argument("--state-dtype", nargs="+", choices=("fp32", "bf16"), help="state (default both)")
    p.add_argument("--input-dtype", nargs="+", choices=("fp32", "bf16"), help="v41: kv / score (default both)")
    p.add_argument("--layout", nargs="+", help="v41: the record (default flashmla_fp8); index-key: indexer_fp8, "
                   "indexer_mxfp4 (default both)")
    p.add_argument("--impl", action="append", help="v41: triton, triton-split, cutedsl or module:attribute (default triton, "
                   "triton-split); state: triton, cutedsl or module:attribute of an object with SPEC §13's calls (default triton; "
                   "with several, the first one's save+compress is the baseline)")
    p.add_argument("--mode", choices=("eager", "graph"), action="append", help="default both")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--sets", type=int, default=None, help="input sets per case (default: past L2)")
    p.add_argument("--out", default="bench/out")
    p.add_argument("--tag", default="")
    p.add_argument("--dry-run", action="store_true", help="build every case, call each implementation once, no timing")
    p.add_argument("--profile", action="store_true", help="each call once inside a profiler range (for ncu "
                   "--profile-from-start off), no timing")
    return p


def _check(args) -> str:
    """Why the arguments cannot run ("" if they can), before any GPU work."""
    if args.sets is not None and args.sets < 1:
        return f"--sets expected an integer >= 1, got {args.sets}"
    allowed = {"state": ("serving", "dense"), "v41": ("sweeps", "steps", "index-key")}.get(args.suite, ())
    unknown = set(args.cases or ()) - set(allowed)
    if unknown:
        return f"--cases expected some of {allowed} for {args.suite}, got {sorted(unknown)}"
    ratios = {"state": (4, 128), "v41": (1, 2)}.get(args.suite, ())
    if set(args.ratio or ()) - set(ratios):
        return f"--ratio expected some of {ratios} for {args.suite}, got {args.ratio}"
    return ""


def state_cases(args) -> list:
    from .state_steps import ADDRESSING, STATE_DTYPES, dense_sweeps, serving_steps

    chosen = args.cases or ["serving", "dense"]
    dtypes = tuple(args.state_dtype or STATE_DTYPES)
    ratios = tuple(args.ratio or (128, 4))
    cases = []
    if "serving" in chosen:
        cases += [c for c in serving_steps(tuple(args.addressing or ADDRESSING), dtypes) if c.ratio in ratios]
    if "dense" in chosen:
        cases += dense_sweeps(ratios, tuple(args.sizes) if args.sizes else None, dtypes)
    return cases


def v41_cases(args) -> list:
    from ..spec.entry_layout import INDEXER_LAYOUTS
    from .v41_steps import INPUT_DTYPES, V41_SWEEP, index_key_sweeps, steps, sweeps

    chosen = args.cases or ["sweeps", "steps"]
    ratios, sizes = tuple(args.ratio or (1, 2)), tuple(args.sizes or V41_SWEEP)
    dtypes = tuple(args.input_dtype or INPUT_DTYPES)
    cases = []
    for layout in args.layout or ["flashmla_fp8"]:
        if "sweeps" in chosen:
            cases += sweeps(ratios, sizes, dtypes, layout)
        if "steps" in chosen:
            cases += steps(ratios, dtypes, layout)
    if "index-key" in chosen:
        layouts = tuple(l for l in (args.layout or INDEXER_LAYOUTS) if l in INDEXER_LAYOUTS) or INDEXER_LAYOUTS
        cases += index_key_sweeps(ratios, sizes, layouts)
    return cases


def _tuner_setting(name: str):
    """The :class:`..impl.cutedsl.variants.Variant` of ``cutedsl-<setting>`` (``bench/cutedsl_tune.py``'s
    generated space, e.g. ``cutedsl-split_generic+split_runs=64``), or ValueError naming it."""
    from .cutedsl_tune import named_setting

    found = named_setting(name)
    if found is not None:
        return found[1]
    raise ValueError(f"--impl: expected triton, cutedsl, cutedsl-<setting of bench/cutedsl_tune.py> or "
                     f"module:attribute, got {name!r}")


def _state_runner(args):
    """(cases, prepare(case, device, sets) -> (prepared, calls), baseline)."""
    import importlib

    from .state_steps import prepare_state, state_calls

    names = args.impl or ["triton"]
    modules = []
    for name in names:
        module_name, _, attribute = name.partition(":")
        if name in ("triton", "cutedsl"):  # the project's kernel families
            module_name = f"dsv4_compressor.impl.{name}"
        elif name.startswith("cutedsl-"):  # a setting of the tuner's space: a forced path and a policy
            modules.append((name, _tuner_setting(name)))
            continue
        module = importlib.import_module(module_name)
        modules.append((name, getattr(module, attribute) if attribute else module))

    def prepare(case, device, sets):
        prepared, refusal = prepare_state(case, device, sets)
        calls = {}
        for name, module in modules:
            prefix = "" if len(modules) == 1 else f"{name} "
            calls.update({f"{prefix}{n}" if n != "floor" else n: c
                          for n, c in state_calls(case, module, refusal).items()})
        return prepared, calls

    return state_cases(args), prepare, "save+compress" if len(modules) == 1 else f"{names[0]} save+compress"


def _v41_runner(args):
    from .v41_steps import load_v41_impl, prepare_v41, v41_calls

    impls = []
    for name in args.impl or ["triton", "triton-split"]:
        try:
            impls.append(load_v41_impl(name))
        except Exception as error:  # e.g. a third-party module not on PYTHONPATH
            print(f"steps: skipping {name}: {type(error).__name__}: {error}", file=sys.stderr)

    def prepare(case, device, sets):
        return prepare_v41(case, device, sets), v41_calls(case, impls)

    baseline = next((i.name for i in impls if ":" in i.name), "triton-split")
    return v41_cases(args), prepare, baseline


def _metadata_summary(cases) -> None:
    """Each case's metadata at full size (NumPy only): tokens and active tokens."""
    import numpy as np

    for case in cases:
        rng = np.random.default_rng(0)
        if hasattr(case, "batch"):
            batch = case.batch(rng)
            print(f"case {case.name} {case.variant}: {batch.num_tokens} tokens, {batch.num_active} active")
        else:
            step, _, pages = case.step(rng)
            print(f"case {case.name} {case.variant}: {step.num_tokens} tokens, {int(case.active(step).sum())} active, "
                  f"{pages} pages")


def dry_run(args, cases, prepare) -> int:
    from .step_runner import dry_run as call_once

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    _metadata_summary(cases)
    rows = []
    for case in dict.fromkeys(c.dry_run_version() for c in cases):
        prepared, calls = prepare(case, device, 2)
        rows += call_once(prepared, calls)
    for r in rows:
        print(f"dry {r.case} {r.variant} n={r.token_num} active={r.active} {r.implementation}: {r.error or 'ok'}")
    failed = [r for r in rows if r.error and not r.error.startswith("unsupported")]
    for r in failed:
        print(f"FAILED {r.case} {r.variant} n={r.token_num} {r.implementation}: {r.error}", file=sys.stderr)
    print(f"dry run on {device}: {len(rows)} calls, {len(failed)} failed")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"steps: {problem}", file=sys.stderr)
        return 2
    if args.suite == "memory":
        from .state_memory import memory_table

        print(memory_table())
        return 0
    import torch

    if args.dry_run and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' modules are imported
    elif not torch.cuda.is_available():
        print("steps: no CUDA GPU found (--dry-run runs on a CPU)", file=sys.stderr)
        return 2
    cases, prepare, baseline = (_state_runner if args.suite == "state" else _v41_runner)(args)
    if args.dry_run:
        return dry_run(args, cases, prepare)
    if args.profile:
        return profile_run(cases, prepare)
    return timed_run(args, cases, prepare, baseline)


@contextlib.contextmanager
def _profiler_range():
    """The CUDA profiler's capture range (what ``ncu --profile-from-start off`` profiles)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def profile_run(cases, prepare, device="cuda", profiled=_profiler_range) -> int:
    """Each case's calls (a refusal skipped), each warmed up on every input set, then called once on the
    last set inside ``profiled()``; a line names each call before its range. Untimed."""
    for case in cases:
        prepared, calls = prepare(case, device, 2)
        for name, call in calls.items():
            if isinstance(call, str):
                print(f"profile {case.name} {case.variant} n={case.token_num} {name}: skipped ({call})", flush=True)
                continue
            for s in prepared.sets:  # compiles and warms up
                call(s)
            print(f"profile {case.name} {case.variant} n={case.token_num} {name}", flush=True)
            with profiled():
                call(prepared.sets[-1])
    return 0


def timed_run(args, cases, prepare, baseline) -> int:
    import time

    import torch

    from .cli import _versions
    from .report import step_tables, write_files
    from .step_runner import run_calls
    from .timing import copy_bandwidth_gbs

    modes = args.mode or ["eager", "graph"]
    copy_gbs = copy_bandwidth_gbs()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python -m dsv4_compressor.bench.steps", *(sys.argv[1:])]), "copy_gbs": copy_gbs,
            **_versions()}
    print(json.dumps(meta))
    rows, started = [], time.perf_counter()
    for index, case in enumerate(cases, 1):
        try:
            prepared, calls = prepare(case, "cuda", args.sets)
        except Exception as error:  # e.g. out of memory: say so and go on with the next case
            print(f"[{index}/{len(cases)}] case {case.name} {case.variant} n={case.token_num} not prepared: "
                  f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            continue
        case_rows = run_calls(prepared, calls, modes, copy_gbs, args.trials)
        del prepared, calls
        rows += case_rows
        for r in case_rows:  # a line per row as it lands, so a cut-off run keeps its numbers
            print(f"[{index}/{len(cases)} {time.perf_counter() - started:.0f}s] row {r.case} {r.variant} n={r.token_num} "
                  f"{r.implementation} {r.mode}: {'-' if r.median_us is None else f'{r.median_us:.2f}'} us "
                  f"{'' if r.pct_copy is None else f'{r.pct_copy:.1f}% copy '}{r.error}", file=sys.stderr, flush=True)
    print(step_tables(rows, baseline, copy_gbs))
    stem = f"steps-{args.suite}" + (f"-{args.tag}" if args.tag else "")
    files = write_files(rows, Path(args.out), meta, stem)
    print("\nwrote " + ", ".join(str(p) for p in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
