"""Time the CuTe DSL kernels' shapes and dispatch choices on a GPU, every setting in one run.

    python -m dsv4_compressor.bench.cutedsl_tune [--ratio 128|4] [--sizes 1 64 1024] [--settings NAME ...]

The settings are generated, not listed: for each path of a ratio (and ``auto``), the default
policy, then every policy one field group away from it in the policy's configuration space
(:func:`dsv4_compressor.impl.cutedsl.space.neighbours`) that changes what the path runs at some
benchmarked size (its kernels' static configurations, or ``auto``'s choice of path); the one
pruning rule leaves out a change that the path never sees. A setting is named by its path and
the field it changes (``fused_cluster+cluster.tile=32``; ``bench --impl cutedsl-<setting>`` times
one beside the others). For each benchmark case (the
decode-boundary sweeps of :mod:`.cases`, input sets rotated past L2) every setting is compiled,
warmed up and captured into its own CUDA graph; the trials are interleaved across settings
and the median µs per call of graph replay is printed with the fraction of the copy bandwidth.
Use the winners to set the ``Policy`` defaults; ``bench/RESULTS.md`` keeps what was measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import fields, is_dataclass

C128_SIZES = (1, 8, 32, 64, 128, 256, 1024, 8192)
C4_SIZES = (1, 32, 128, 1024, 16384)


def changed_fields(policy, base, prefix: str = "") -> list[str]:
    """``field=value`` of every field in which ``policy`` differs from ``base`` (nested: dotted,
    without the ``shapes.`` level)."""
    out = []
    for f in fields(base):
        mine, theirs = getattr(policy, f.name), getattr(base, f.name)
        if mine == theirs:
            continue
        name = prefix + ("" if f.name == "shapes" else f.name + ".")
        if is_dataclass(mine):
            out.extend(changed_fields(mine, theirs, name))
        else:
            out.append(f"{name.rstrip('.')}={mine}")
    return out


def _what_runs(c128_path: str, ratio: int, policy, sizes) -> tuple:
    """The path, kernel configurations and persistent grid cap a setting runs at each size
    (flashmla_fp8, bs 8 or 4)."""
    from ..impl.cutedsl.host.occupancy import pipelined_clusters
    from ..impl.cutedsl.host.paths import PathRequest, choose

    block_size = 8 if ratio == 128 else 4
    runs = []
    for tokens in sizes:
        path = choose(c128_path, ratio, 512, tokens, block_size, policy)
        request = PathRequest(ratio, block_size, tokens, "flashmla_fp8", 64, "bfloat16", 16, False, policy, True)
        grid = pipelined_clusters(tokens, None, policy) if path.persistent else None
        runs.append((path.name, path.configs(request), grid))
    return tuple(runs)


def settings(ratio: int, sizes=None) -> dict:
    """``{name: Variant}`` of every setting of a ratio (see the module)."""
    from ..impl.cutedsl.host.paths import paths_for
    from ..impl.cutedsl.host.policy import DEFAULT_POLICY
    from ..impl.cutedsl.space import neighbours
    from ..impl.cutedsl.variants import Variant

    sizes = sizes or (C128_SIZES if ratio == 128 else C4_SIZES)
    c128_paths = ["auto", *(p.name for p in paths_for(ratio, 512))] if ratio == 128 else ["auto"]
    table = {}
    for c128_path in c128_paths:
        label = c128_path if ratio == 128 else "c4"
        base = _what_runs(c128_path, ratio, DEFAULT_POLICY, sizes)
        table[label] = Variant(label, c128_path, DEFAULT_POLICY)
        for policy in neighbours(DEFAULT_POLICY)[1:]:
            try:
                runs = _what_runs(c128_path, ratio, policy, sizes)
            except ValueError:  # the path's configurations reject this policy (e.g. Block8 with 16 rows a lane)
                continue
            if runs != base:
                name = f"{label}+{'+'.join(changed_fields(policy, DEFAULT_POLICY))}"
                table[name] = Variant(name, c128_path, policy)
    return table


def named_setting(name: str):
    """``(ratio, Variant)`` of ``cutedsl-<setting>`` (a setting of :func:`settings`, C128's first), or None."""
    if not name.startswith("cutedsl-"):
        return None
    setting = name.removeprefix("cutedsl-")
    for ratio in (128, 4):
        variant = settings(ratio).get(setting)
        if variant is not None:
            return ratio, variant
    return None


def time_case(case, settings: dict, trials: int = 5) -> tuple[dict[str, float], int]:
    """Median µs per call (graph replay) of every setting on one case, and the case's bytes."""
    import torch

    from .timing import BenchImpl, capture_graph, prepare, time_graph

    prepared = prepare(case)
    graphs = {}
    for name, variant in settings.items():
        try:
            call = BenchImpl(name, variant.compress_norm_rope_store, variant.save_partial_states).caller(prepared)
            for s in prepared.sets:  # compile and warm up with these knobs
                call(s)
            torch.cuda.synchronize()
            calls = max(len(prepared.sets), min(200, 20000 // max(case.token_num, 1)))
            graphs[name] = (capture_graph(call, prepared.sets, calls), calls)
        except Exception as error:  # report and go on
            print(f"  {name}: {type(error).__name__}: {str(error).splitlines()[0][:160]}", file=sys.stderr)
    replays = {}  # each sample lasts about 20 ms
    for name, (graph, calls) in graphs.items():
        per_call = time_graph(graph, calls, 1)
        replays[name] = max(1, min(500, int(20000 / (calls * max(per_call, 0.5)))))
    samples = {name: [] for name in graphs}
    for _ in range(trials):
        for name, (graph, calls) in graphs.items():
            samples[name].append(time_graph(graph, calls, replays[name]))
    del graphs
    torch.cuda.empty_cache()
    return {name: statistics.median(v) for name, v in samples.items()}, prepared.bytes_moved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor.bench.cutedsl_tune", description=__doc__.split("\n")[0])
    parser.add_argument("--ratio", type=int, choices=(4, 128), action="append")
    parser.add_argument("--sizes", type=int, nargs="*")
    parser.add_argument("--settings", nargs="*", help="setting names (default: all of the ratio)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mixed", action="store_true", help="also the mixed steps (default: only without --sizes)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    from .cases import c4_decode_sweep, c128_decode_sweep, mixed_steps
    from .timing import copy_bandwidth_gbs

    copy_gbs = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; graph replay, µs per call (% of copy bandwidth)")
    for ratio in args.ratio or [128, 4]:
        table = settings(ratio)
        chosen = {k: v for k, v in table.items() if not args.settings or k in args.settings}
        sizes = args.sizes or (C128_SIZES if ratio == 128 else C4_SIZES)
        sweep = c128_decode_sweep if ratio == 128 else c4_decode_sweep
        print(f"\n**C{ratio} decode**\n\n| T | " + " | ".join(chosen) + " |\n|---|" + "---|" * len(chosen))
        mixed = [c for c in mixed_steps() if c.compress_ratio == ratio] if args.mixed or not args.sizes else []
        for case in sweep(tuple(sizes)) + mixed:
            times, nbytes = time_case(case, chosen, args.trials)
            cells = [f"{times[n]:.1f} ({100 * nbytes / (times[n] * 1e-6) / 1e9 / copy_gbs:.0f}%)" if n in times else "error"
                     for n in chosen]
            label = case.token_num if case.kind == "decode" else f"{case.token_num} {case.kind}"
            print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
