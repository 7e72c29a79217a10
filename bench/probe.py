"""Where the C128 time goes: floors and leave-one-stage-out timings, on a GPU.

    python -m dsv4_compressor.bench.probe floor [--sizes 1 32 64 128 1024]
    python -m dsv4_compressor.bench.probe variants [--sizes ...] [--variants nopdl cluster8 ...]
    python -m dsv4_compressor.bench.probe no-exp [--sizes ...] [--variants ...]
    python -m dsv4_compressor.bench.probe profile-one --tokens 64 --variant cluster8

- ``floor``: graph replay of (a) a one-CTA kernel that stores one word (the per-call
  floor of a launch in a graph) and (b) a streaming read of exactly the bytes a C128
  decode step must read at each size (T windows of 128 rows x 4 KiB, contiguous, 16-byte
  loads, one partial sum stored per CTA): what no kernel that reads its input can beat.
- ``variants``: the C128 decode sweep over named CuTe DSL variants
  (:mod:`dsv4_compressor.impl.cutedsl.variants`), each in its own graph, interleaved.
- ``no-exp``: the same, with SPEC's ``exp2s`` replaced by one subtraction in the CuTe DSL
  pooling code. **The results are wrong on purpose**; the time difference to ``variants``
  is what the exact exponentials cost where they are not hidden behind memory traffic.
  Run it in its own process (it patches the kernel source before compiling).
- ``profile-one``: warm up one variant at one size, then run it once between
  ``cudaProfilerStart``/``Stop`` (for ``ncu --profile-from-start off``).

Numbers go to stdout as Markdown tables (µs per call, graph replay, 4 rotated input sets).
"""

from __future__ import annotations

import argparse
import statistics
import sys

DEFAULT_SIZES = (1, 8, 32, 64, 128, 256, 1024)
WINDOW_BYTES = 128 * 2 * 512 * 4  # kv and score halves of 128 state rows


def _read_floor_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def store_one(out_ptr):
        tl.store(out_ptr, 1.0)

    @triton.jit
    def stream_read(src_ptr, out_ptr, BLOCK: tl.constexpr):
        # one CTA reads BLOCK consecutive fp32 (16-byte vectors) and stores their sum
        pid = tl.program_id(0)
        offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(src_ptr + offsets, cache_modifier=".cg")
        tl.store(out_ptr + pid, tl.sum(values, axis=0))

    return store_one, stream_read


def _graph_us(launch, sets: list, calls: int = 200, trials: int = 5) -> float:
    """Median µs per launch: one graph of ``calls`` launches cycling over ``sets``, replayed."""
    from .timing import capture_graph, time_graph

    graph = capture_graph(launch, sets, calls)
    per_call = time_graph(graph, calls, 1)
    replays = max(1, min(200, int(20000 / (calls * max(per_call, 0.5)))))
    return statistics.median(time_graph(graph, calls, replays) for _ in range(trials))


def floor(sizes) -> None:
    import torch

    from .timing import copy_bandwidth_gbs

    store_one, stream_read = _read_floor_kernels()
    copy_gbs = copy_bandwidth_gbs()
    out = torch.empty(1, device="cuda")
    empty = _graph_us(lambda s: store_one[(1,)](out), [None])
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; a one-CTA store kernel in a graph: {empty:.2f} µs per launch\n")
    print("| T | bytes read | streaming read µs | % of copy BW |\n|---:|---:|---:|---:|")
    block = 8192  # fp32 per CTA: 32 KiB
    for t in sizes:
        nbytes = t * WINDOW_BYTES
        sets = [torch.randn(nbytes // 4, device="cuda") for _ in range(4)]
        grid = (nbytes // 4 // block,)
        out = torch.empty(grid[0], device="cuda")  # one partial sum per CTA
        us = _graph_us(lambda s: stream_read[grid](s, out, BLOCK=block, num_warps=8), sets)
        print(f"| {t} | {nbytes / 1e6:.1f} MB | {us:.2f} | {100 * nbytes / (us * 1e-6) / 1e9 / copy_gbs:.0f}% |", flush=True)
        del sets
        torch.cuda.empty_cache()


def patch_out_exp2s() -> None:
    """Make the CuTe DSL pooling compute ``e = s - M`` instead of ``exp2s((s - M) * L)``."""
    from ..impl.cutedsl import exact_math, pooling_c128

    pooling_c128.softmax_weight = lambda score, row_max: exact_math.fsub(score, row_max)  # every C128 kernel's


def time_variants(sizes, names) -> None:
    from ..impl.cutedsl.tune import time_case
    from ..impl.cutedsl.variants import VARIANTS
    from .cases import c128_decode_sweep
    from .timing import copy_bandwidth_gbs

    chosen = {n: VARIANTS[n] for n in names}
    copy_gbs = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; graph replay, µs per call (% of copy bandwidth)\n")
    print("| T | " + " | ".join(chosen) + " |\n|---|" + "---|" * len(chosen))
    for case in c128_decode_sweep(tuple(sizes)):
        times, nbytes = time_case(case, chosen, trials=5)
        cells = [f"{times[n]:.2f} ({100 * nbytes / (times[n] * 1e-6) / 1e9 / copy_gbs:.0f}%)" if n in times else "error"
                 for n in chosen]
        print(f"| {case.token_num} | " + " | ".join(cells) + " |", flush=True)


def profile_one(tokens: int, name: str) -> None:
    import torch

    from ..impl.cutedsl.variants import VARIANTS
    from .cases import c128_decode_sweep
    from .timing import BenchImpl, prepare

    variant = VARIANTS[name]
    prepared = prepare(c128_decode_sweep((tokens,))[0])
    call = BenchImpl(name, variant.compress_norm_rope_store, variant.save_partial_states).caller(prepared)
    for s in prepared.sets * 3:
        call(s)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call(prepared.sets[1])
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor.bench.probe", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("floor", "variants", "no-exp", "profile-one"))
    parser.add_argument("--sizes", type=int, nargs="*", default=list(DEFAULT_SIZES))
    parser.add_argument("--variants", nargs="*", default=["fused_cluster", "nopdl"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--variant", default="cluster8")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.what == "floor":
        floor(args.sizes)
    elif args.what == "profile-one":
        profile_one(args.tokens, args.variant)
    else:
        if args.what == "no-exp":
            patch_out_exp2s()
            print("exp2s PATCHED OUT: results are wrong on purpose (timing only)")
        time_variants(args.sizes, args.variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
