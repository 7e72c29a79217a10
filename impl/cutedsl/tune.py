"""Time the CuTe DSL kernels' static knobs on a GPU, every variant in one run.

    python -m dsv4_compressor.impl.cutedsl.tune [--ratio 128|4] [--sizes 1 64 1024] [--settings NAME ...]

Each *setting* is a :class:`.variants.Variant`: a ``c128_path`` plus overrides of
:data:`.api.TUNING` (see :class:`.api.Tuning` for every knob), pinned explicitly where a
default has changed since the setting was first measured (``bench/RESULTS.md``). For each benchmark case (the decode-boundary sweeps
of :mod:`dsv4_compressor.bench.cases`, four rotated input sets) every setting is compiled,
warmed up and captured into its own CUDA graph; the trials are interleaved across settings
and the median µs per call of graph replay is printed with the fraction of the copy
bandwidth. Use the winners to set ``TUNING`` defaults and ``c128_fused_max_tokens``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

EARLY = {"c128_cluster_kv_after_max": False}  # the cluster kernel's default before e555146

# name -> (c128_path, TUNING overrides); made Variants below
_C128 = {
    "cluster": ("fused_cluster", {**EARLY, "c128_cluster_tile": 64}),
    "cluster-regkv": ("fused_cluster", {**EARLY, "c128_cluster_tile": 64, "c128_cluster_kv_in_smem": False}),
    "cluster-w16": ("fused_cluster", {**EARLY, "c128_cluster_tile": 64, "c128_cluster_warps": 16,
                                      "c128_cluster_kv_in_smem": False}),
    "cluster-w16-smemkv": ("fused_cluster", {**EARLY, "c128_cluster_tile": 64, "c128_cluster_warps": 16}),
    "cluster16": ("fused_cluster", {**EARLY, "c128_cluster_tile": 32}),
    "cluster16-regkv": ("fused_cluster", {**EARLY, "c128_cluster_tile": 32, "c128_cluster_kv_in_smem": False}),
    "cluster16-w4": ("fused_cluster", {**EARLY, "c128_cluster_tile": 32, "c128_cluster_warps": 4}),
    "cluster16-w16": ("fused_cluster", {**EARLY, "c128_cluster_tile": 32, "c128_cluster_warps": 16}),
    "stream": ("fused_stream", {"c128_stream_tile": 64}),
    "stream-w4": ("fused_stream", {"c128_stream_tile": 64, "c128_stream_warps": 4}),
    "stream16": ("fused_stream", {"c128_stream_tile": 32}),
    "stream16-c1": ("fused_stream", {"c128_stream_tile": 32, "c128_stream_ctas_per_sm": 1}),
    "stream16-c2": ("fused_stream", {"c128_stream_tile": 32, "c128_stream_ctas_per_sm": 2}),
    "stream16-w4": ("fused_stream", {"c128_stream_tile": 32, "c128_stream_warps": 4}),
    **{f"stream-g{g}": ("fused_stream", {"c128_stream_tile": 64, "c128_stream_clusters": g}) for g in (16, 15, 14, 12, 10)},
    **{f"stream16-g{g}": ("fused_stream", {"c128_stream_tile": 32, "c128_stream_clusters": g})
       for g in (24, 21, 18, 16, 14, 12)},
    "cluster-late": ("fused_cluster", {"c128_cluster_tile": 64, "c128_cluster_kv_after_max": True}),
    "cluster-late-regkv": ("fused_cluster", {"c128_cluster_tile": 64, "c128_cluster_kv_after_max": True,
                                             "c128_cluster_kv_in_smem": False}),
    "cluster16-late": ("fused_cluster", {"c128_cluster_tile": 32, "c128_cluster_kv_after_max": True}),
    "block8-late": ("split_block8", {"c128_split_kv_after_max": True}),
    "block8": ("split_block8", {}),
    # handoff-w4 is named "handoff" in the 6c370ba log (then the default)
    **{f"handoff-w{w}": ("fused_handoff", {"c128_handoff_waves": w}) for w in (1, 2, 4, 16, 64)},
    "handoff-chunk1": ("fused_handoff", {"c128_handoff_waves": None}),
    "block8-smemkv": ("split_block8", {"c128_split_kv_in_smem": True}),
    "block8-w16": ("split_block8", {"c128_split_warps": 16}),
    "block8-t32": ("split_block8", {"c128_split_tile": 32}),
    "block8-store2": ("split_block8", {"c128_store_tokens_per_cta": 2}),
}
_C4 = {
    "c4": ("auto", {}),
    "c4-tpc2": ("auto", {"c4_tokens_per_cta": 2}),
    "c4-tpc4": ("auto", {"c4_tokens_per_cta": 4}),
}


def _variants(table: dict) -> dict:
    from .variants import Variant

    return {name: Variant(name, path, overrides) for name, (path, overrides) in table.items()}


C128_SETTINGS = _variants(_C128)
C4_SETTINGS = _variants(_C4)
C128_SIZES = (1, 8, 32, 64, 128, 256, 1024, 8192)
C4_SIZES = (1, 32, 128, 1024, 16384)


def time_case(case, settings: dict, trials: int = 5) -> tuple[dict[str, float], int]:
    """Median µs per call (graph replay) of every setting on one case, and the case's bytes."""
    import torch

    from ...bench.timing import BenchImpl, capture_graph, prepare, time_graph

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
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor.impl.cutedsl.tune", description=__doc__.split("\n")[0])
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
    from ...bench.cases import c4_decode_sweep, c128_decode_sweep, mixed_steps
    from ...bench.timing import copy_bandwidth_gbs

    copy_gbs = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; graph replay, µs per call (% of copy bandwidth)")
    for ratio in args.ratio or [128, 4]:
        table = C128_SETTINGS if ratio == 128 else C4_SETTINGS
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
