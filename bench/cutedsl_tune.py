"""Time the CuTe DSL kernels' shapes and dispatch choices on a GPU, every setting in one run.

    python -m dsv4_compressor.bench.cutedsl_tune [--ratio 128|4] [--sizes 1 64 1024] [--settings NAME ...]

Each *setting* is a :class:`dsv4_compressor.impl.cutedsl.variants.Variant`: a ``c128_path``
plus a :class:`dsv4_compressor.impl.cutedsl.dispatch.Policy`, pinned explicitly where a
default has changed since the setting was first measured (``bench/RESULTS.md``). For each
benchmark case (the decode-boundary sweeps of :mod:`.cases`, input sets rotated past L2) every
setting is compiled, warmed up and captured into its own CUDA graph; the trials are
interleaved across settings and the median µs per call of graph replay is printed with the
fraction of the copy bandwidth. Use the winners to set the ``Policy`` defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys


def _setting(path: str, *, cluster=None, split=None, **fields):
    """``(c128_path, Policy)``: the default policy with pool-shape fields and policy fields replaced."""
    from dataclasses import replace

    from ..impl.cutedsl.dispatch import DEFAULT_POLICY

    shapes = DEFAULT_POLICY.shapes
    for name, changes in (("cluster", cluster), ("split", split)):
        if changes:
            fields[name] = replace(getattr(shapes, name), **changes)
    return path, DEFAULT_POLICY.with_overrides(**fields)


EARLY = {"kv_after_max": False}  # the cluster kernel's first default: kv loads issued with the scores


def _c128() -> dict:
    return {
        "cluster": _setting("fused_cluster", cluster={**EARLY, "tile": 64}),
        "cluster-regkv": _setting("fused_cluster", cluster={**EARLY, "tile": 64, "kv_in_smem": False}),
        "cluster-w16": _setting("fused_cluster", cluster={**EARLY, "tile": 64, "warps": 16, "kv_in_smem": False}),
        "cluster-w16-smemkv": _setting("fused_cluster", cluster={**EARLY, "tile": 64, "warps": 16}),
        "cluster16": _setting("fused_cluster", cluster={**EARLY, "tile": 32}),
        "cluster16-regkv": _setting("fused_cluster", cluster={**EARLY, "tile": 32, "kv_in_smem": False}),
        "cluster16-w4": _setting("fused_cluster", cluster={**EARLY, "tile": 32, "warps": 4}),
        "cluster16-w16": _setting("fused_cluster", cluster={**EARLY, "tile": 32, "warps": 16}),
        "cluster-late": _setting("fused_cluster", cluster={"tile": 64, "kv_after_max": True}),
        "cluster-late-regkv": _setting("fused_cluster", cluster={"tile": 64, "kv_after_max": True, "kv_in_smem": False}),
        "cluster16-late": _setting("fused_cluster", cluster={"tile": 32, "kv_after_max": True}),
        "block8-late": _setting("split_block8", split={"kv_after_max": True}),
        "block8": _setting("split_block8"),
        "handoff": _setting("fused_handoff"),
        "pipelined": _setting("fused_pipelined"),
        "pipelined-occ2": _setting("fused_pipelined", pipelined_ctas_per_sm=2),
        **{f"pipelined-g{g}": _setting("fused_pipelined", pipelined_max_clusters=g) for g in (8, 16, 30)},
        "block8-smemkv": _setting("split_block8", split={"kv_in_smem": True}),
        "block8-w16": _setting("split_block8", split={"warps": 16}),
        "block8-t32": _setting("split_block8", split={"tile": 32}),
        "block8-store2": _setting("split_block8", store_tokens_per_cta=2),
    }


def _c4() -> dict:
    return {"c4": _setting("auto"), "c4-tpc2": _setting("auto", c4_tokens_per_cta=2),
            "c4-tpc4": _setting("auto", c4_tokens_per_cta=4)}


def settings(ratio: int) -> dict:
    """``{name: Variant}`` of every setting of a ratio."""
    from ..impl.cutedsl.variants import Variant

    table = _c128() if ratio == 128 else _c4()
    return {name: Variant(name, path, policy) for name, (path, policy) in table.items()}


C128_SIZES = (1, 8, 32, 64, 128, 256, 1024, 8192)
C4_SIZES = (1, 32, 128, 1024, 16384)


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
