"""Where the time goes: floors and leave-one-stage-out timings, on a GPU.

    python -m dsv4_compressor.bench.probe floor [--sizes 1 32 64 128 1024]
    python -m dsv4_compressor.bench.probe c4-floor [--head 512|128] [--sizes 128 1024 16384]
    python -m dsv4_compressor.bench.probe indexer-floor [--sizes ...]   (c4-floor --head 128)
    python -m dsv4_compressor.bench.probe variants [--sizes ...] [--variants nopdl cluster8 ...]
    python -m dsv4_compressor.bench.probe no-exp [--sizes ...] [--variants ...]
    python -m dsv4_compressor.bench.probe pairs [--sizes ...]
    python -m dsv4_compressor.bench.probe profile-one --tokens 64 --variant cluster8
    python -m dsv4_compressor.bench.probe host [--ratio 4 128] [--sizes 1 8 64 1024] [--calls 2000]

- ``floor``: graph replay of a one-CTA kernel that reads and stores one word (the per-call
  floor of a launch in a graph), then of every read floor of :mod:`.floor_kernels`: the
  bytes a C128 decode step must read at each size, read contiguously (32 KiB per CTA), in
  the fused kernels' tile pattern (with 16-byte loads and with TMA), one 512-thread CTA per
  token, and through the benchmark's own paged state cache and metadata (16-byte loads,
  TMA). What no kernel with that access pattern can beat.
- ``c4-floor``: the same for a C4 decode sweep (``--head 512``: the attention compressor's,
  32 KiB a token; ``--head 128``: the indexer compressor's, 8 KiB a token, also as
  ``indexer-floor``): its bytes read contiguously, and through the benchmark's paged state with
  exactly the kernels' reads.
- ``variants``: the C128 decode sweep over named CuTe DSL variants
  (:mod:`dsv4_compressor.impl.cutedsl.variants`), each in its own graph, interleaved.
- ``no-exp``: the same, with SPEC's ``exp2s`` replaced by one subtraction in the CuTe DSL
  pooling code. **The results are wrong on purpose**; the time difference to ``variants``
  is what the exact exponentials cost where they are not hidden behind memory traffic.
  Run it in its own process (it patches the kernel source before compiling).
- ``pairs``: a step's ``save_partial_states`` + ``compress_norm_rope_store`` against one
  ``save_and_compress_norm_rope_store`` (whose compress kernel reads its metadata while the
  save kernel runs), per size and on the serving steps.
- ``host``: host time of one eager call split into validation, plan key, the plan's own
  Python, the TVM-FFI launch, and whole calls (direct, bound, torch op, Triton); see
  :mod:`.host_time` (runs on a CPU too, without the launches).
- ``profile-one``: warm up one variant at one size, then run it once between
  ``cudaProfilerStart``/``Stop`` (for ``ncu --profile-from-start off``).

Numbers go to stdout as Markdown tables (µs per call, graph replay, input sets rotated past L2).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

DEFAULT_SIZES = (1, 8, 32, 64, 128, 256, 1024)
WINDOW_BYTES = 128 * 2 * 512 * 4  # kv and score halves of 128 state rows
STREAM_BLOCK = 8192  # fp32 per CTA of the plain streaming read (32 KiB)


def _graph_us(launch, sets: list, trials: int = 5) -> float:
    """Median µs per launch: one graph of launches cycling over ``sets`` (every set, 200 launches at
    least), replayed."""
    from .timing import capture_graph, time_graph

    calls = max(200, len(sets))
    graph = capture_graph(launch, sets, calls)
    per_call = time_graph(graph, calls, 1)
    replays = max(1, min(200, int(20000 / (calls * max(per_call, 0.5)))))
    return statistics.median(time_graph(graph, calls, replays) for _ in range(trials))


def _floor_launchers(t: int):
    """``{name: (launch(set), sets)}`` for every read floor of :mod:`.floor_kernels` at ``T = t``."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from . import floor_kernels as K
    from .cases import c128_decode_sweep
    from .timing import prepare, rotation_sets

    tile = 64
    tiles = t * 512 // tile
    windows = [torch.randn((128 * t, 1024), device="cuda")  # contiguous windows, as many as the paged sets
               for _ in range(rotation_sets(t * WINDOW_BYTES))]
    paged = prepare(c128_decode_sweep((t,))[0]).sets  # the benchmark's own state cache and metadata
    out = torch.empty(max(tiles, t * WINDOW_BYTES // 4 // STREAM_BLOCK), device="cuda")

    def paged_args(s):  # state [num_blocks, 8, 1024], token_to_req, positions, block_table
        state, token_req, positions, _, block_table = s.args[:5]
        return state, token_req, positions, block_table

    def paged_tma(s):
        state, token_req, positions, block_table = paged_args(s)
        desc = TensorDescriptor.from_tensor(state.view(-1, 1024), block_shape=[8, tile])
        K.paged_tile_read_tma[(tiles,)](desc, token_req, positions, block_table, out, block_table.stride(0),
                                        BLOCK_SIZE=8, TILE=tile, STAGES=8, num_warps=4)

    def paged_ldg(s):
        state, token_req, positions, block_table = paged_args(s)
        K.paged_tile_read[(tiles,)](state, token_req, positions, block_table, out, block_table.stride(0),
                                    BLOCK_SIZE=8, TILE=tile, num_warps=8)

    def tile_tma(w):
        desc = TensorDescriptor.from_tensor(w.view(-1, 2, 512), block_shape=[128, 2, tile])
        K.tile_read_tma[(tiles,)](desc, out, TILE=tile, num_warps=8)

    return {
        "stream 32 KiB/CTA": (lambda w: K.stream_read[(t * WINDOW_BYTES // 4 // STREAM_BLOCK,)](
            w, out, BLOCK=STREAM_BLOCK, num_warps=8), windows),
        "tile (8 CTAs/token)": (lambda w: K.tile_read[(tiles,)](w, out, TILE=tile, num_warps=8), windows),
        "tile, TMA": (tile_tma, windows),
        "token (1 CTA of 512 thr)": (lambda w: K.token_read[(t,)](w, out, CHUNK_ROWS=32, num_warps=16), windows),
        "paged tile": (paged_ldg, paged),
        "paged tile, TMA": (paged_tma, paged),
    }


def floor(sizes) -> None:
    """The launch floor, then every read floor of :mod:`.floor_kernels` per size."""
    import torch

    from .floor_kernels import stream_read
    from .timing import copy_bandwidth_gbs

    copy_gbs = copy_bandwidth_gbs()
    out = torch.empty(1, device="cuda")
    empty = _graph_us(lambda s: stream_read[(1,)](out, out, BLOCK=1), [None])
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; a one-CTA kernel that reads and stores one word, in a graph: "
          f"{empty:.2f} µs per launch\n")
    header = None
    for t in sizes:
        launchers = _floor_launchers(t)
        if header is None:
            header = list(launchers)
            print("| T | MB read | " + " | ".join(header) + " |\n|---:|---:|" + "---:|" * len(header))
        nbytes = t * WINDOW_BYTES
        cells = []
        for name in header:
            launch, sets = launchers[name]
            us = _graph_us(launch, sets)
            cells.append(f"{us:.2f} ({100 * nbytes / (us * 1e-6) / 1e9 / copy_gbs:.0f}%)")
        print(f"| {t} | {nbytes / 1e6:.1f} | " + " | ".join(cells) + " |", flush=True)
        del launchers
        torch.cuda.empty_cache()


def c4_token_bytes(head: int) -> int:
    """Bytes a C4 token reads: 8 window rows' own halves (``head`` floats), kv and score."""
    return 8 * 2 * head * 4


def c4_floor(sizes, head: int) -> None:
    """A C4 decode sweep (the benchmark's own cases, head width 512 or 128): a plain streaming
    read of the same bytes, and the paged window read (:func:`.floor_kernels.paged_c4_read`),
    one program per token with a few warp counts."""
    import torch

    from . import floor_kernels as K
    from .cases import c4_decode_sweep, indexer_decode_sweep
    from .timing import copy_bandwidth_gbs, prepare, rotation_sets

    cases = (c4_decode_sweep if head == 512 else indexer_decode_sweep)(tuple(sizes))
    warp_counts = (4, 8) if head == 512 else (1, 2)
    copy_gbs = copy_bandwidth_gbs()
    print(f"C4, head width {head}; copy bandwidth {copy_gbs:.0f} GB/s\n")
    print("| T | MB read | stream 32 KiB/CTA | " + " | ".join(f"paged window, {w} warps/token" for w in warp_counts)
          + " |\n|---:|---:|---:|" + "---:|" * len(warp_counts))
    for case in cases:
        t = case.token_num
        prepared = prepare(case)
        nbytes = t * c4_token_bytes(head)
        out = torch.empty(max(t, nbytes // 4 // STREAM_BLOCK + 1), device="cuda")
        flat = [torch.randn(max(nbytes // 4, STREAM_BLOCK), device="cuda") for _ in range(rotation_sets(nbytes))]

        def paged(warps):
            def launch(s):
                state, token_req, positions, _, block_table = s.args[:5]
                K.paged_c4_read[(t,)](state, token_req, positions, block_table, out, block_table.stride(0),
                                      state.stride(0), state.stride(1), BLOCK_SIZE=case.block_size, HEAD=head,
                                      num_warps=warps)
            return launch

        timings = [_graph_us(lambda w: K.stream_read[(max(1, nbytes // 4 // STREAM_BLOCK),)](
                       w, out, BLOCK=STREAM_BLOCK, num_warps=8), flat)]
        timings += [_graph_us(paged(w), prepared.sets) for w in warp_counts]
        cells = [f"{us:.2f} ({100 * nbytes / (us * 1e-6) / 1e9 / copy_gbs:.1f}%)" for us in timings]
        print(f"| {t} | {nbytes / 1e6:.1f} | " + " | ".join(cells) + " |", flush=True)
        del prepared, flat
        torch.cuda.empty_cache()


def patch_out_exp2s() -> None:
    """Make the CuTe DSL pooling compute ``e = s - M`` instead of ``exp2s((s - M) * L)``."""
    from ..impl.cutedsl.stages import exact_math, pooling_c128

    pooling_c128.softmax_weight = lambda score, row_max: exact_math.fsub(score, row_max)  # every C128 kernel's


def time_variants(sizes, names) -> None:
    from .cutedsl_tune import settings, time_case
    from ..impl.cutedsl.variants import VARIANTS
    from .cases import c128_decode_sweep
    from .timing import copy_bandwidth_gbs

    known = {**VARIANTS, **settings(128)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"variants: expected names of impl.cutedsl.variants or tuner settings, got {unknown}")
    chosen = {n: known[n] for n in names}
    copy_gbs = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s; graph replay, µs per call (% of copy bandwidth)\n")
    print("| T | " + " | ".join(chosen) + " |\n|---|" + "---|" * len(chosen))
    for case in c128_decode_sweep(tuple(sizes)):
        times, nbytes = time_case(case, chosen, trials=5)
        cells = [f"{times[n]:.2f} ({100 * nbytes / (times[n] * 1e-6) / 1e9 / copy_gbs:.0f}%)" if n in times else "error"
                 for n in chosen]
        print(f"| {case.token_num} | " + " | ".join(cells) + " |", flush=True)


def time_pairs(sizes) -> None:
    """A step's two calls, ``save_partial_states`` then ``compress_norm_rope_store`` (auto, PDL),
    against one ``save_and_compress_norm_rope_store``: µs per pair in a graph (input sets rotated past L2)."""
    import torch

    from ..impl import cutedsl
    from ..spec import batch as B
    from .cases import c128_decode_sweep, mixed_steps
    from .timing import prepare

    cases = c128_decode_sweep(tuple(sizes)) + [c for c in mixed_steps() if c.compress_ratio == 128]
    print("| case | T | save, then compress | save_and_compress | gain |\n|---|---:|---:|---:|---:|")
    for case in cases:
        prepared = prepare(case)
        rng = np.random.default_rng(5)
        extra = [(torch.from_numpy(B.random_kv_score(case.token_num, 128, rng)).cuda(),
                  torch.from_numpy(B.random_ape(128, rng)).cuda()) for _ in prepared.sets]
        pairs = list(zip(prepared.sets, extra))

        def separate(pair):
            s, (kv_score, ape) = pair
            state, _, positions, slot_mapping = s.args[:4]
            cutedsl.save_partial_states(kv_score, ape, positions, slot_mapping, state, case.block_size)
            cutedsl.compress_norm_rope_store(*s.args, **s.kwargs, workspace=s.workspace)

        def combined(pair):
            s, (kv_score, ape) = pair
            cutedsl.save_and_compress_norm_rope_store(kv_score, ape, *s.args, **s.kwargs, workspace=s.workspace)

        a, b = _graph_us(separate, pairs), _graph_us(combined, pairs)
        print(f"| {case.name} | {case.token_num} | {a:.2f} | {b:.2f} | {a - b:.2f} |", flush=True)
        del prepared, extra, pairs
        torch.cuda.empty_cache()


def profile_case(case_name: str, tokens: int):
    """The bench case ``profile-one`` runs: the C128, C4 or indexer decode sweep's ``tokens`` row, or
    a serving step of :func:`.cases.mixed_steps` by name (``c128_decode_step`` takes ``tokens``
    64 or 512)."""
    from .cases import c4_decode_sweep, c128_decode_sweep, indexer_decode_sweep, mixed_steps

    if case_name == "c128_decode":
        return c128_decode_sweep((tokens,))[0]
    if case_name == "c4_decode":
        return c4_decode_sweep((tokens,))[0]
    if case_name in ("indexer_fp8", "indexer_mxfp4"):
        return indexer_decode_sweep((tokens,), case_name)[0]
    steps = [c for c in mixed_steps() if c.name == case_name and (case_name != "c128_decode_step" or c.token_num == tokens)]
    if not steps:
        raise ValueError(f"profile-one --case: expected c128_decode, c4_decode, indexer_fp8, indexer_mxfp4 or a serving step "
                         f"({', '.join(sorted({c.name for c in mixed_steps()}))}), got {case_name!r} at {tokens} tokens")
    return steps[0]


def profile_one(tokens: int, name: str, case_name: str = "c128_decode") -> None:
    """One call of variant ``name`` on one case, between cudaProfilerStart/Stop (for ``ncu
    --profile-from-start off``), after warm-up calls."""
    import torch

    from ..impl.cutedsl.variants import INDEXER_VARIANTS, VARIANTS, Variant
    from .cutedsl_tune import settings
    from .timing import BenchImpl, prepare

    known = {**VARIANTS, **INDEXER_VARIANTS, **settings(128), **settings(4)}
    if name != "auto" and name not in known:
        raise ValueError(f"profile-one --variant: expected auto or one of {', '.join(sorted(known))}, got {name!r}")
    variant = Variant("auto") if name == "auto" else known[name]
    prepared = prepare(profile_case(case_name, tokens), num_sets=2)  # ncu flushes the caches before the call
    call = BenchImpl(name, variant.compress_norm_rope_store, variant.save_partial_states).caller(prepared)
    for s in prepared.sets * 3:
        call(s)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call(prepared.sets[1])
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "host":  # host time of an eager call, by part (runs on a CPU too)
        from .host_time import main as host_main

        return host_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor.bench.probe", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("floor", "c4-floor", "indexer-floor", "variants", "no-exp", "pairs", "profile-one", "host"))
    parser.add_argument("--sizes", type=int, nargs="*", default=list(DEFAULT_SIZES))
    parser.add_argument("--variants", nargs="*", default=["fused_cluster", "nopdl"])
    parser.add_argument("--head", type=int, choices=(512, 128), default=512, help="c4-floor: the head width")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--variant", default="cluster8", help="a CuTe DSL variant's name, or auto")
    parser.add_argument("--case", default="c128_decode", help="profile-one: c128_decode, c4_decode, indexer_fp8, indexer_mxfp4 "
                        "or a serving step's name")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.what == "floor":
        floor(args.sizes)
    elif args.what in ("c4-floor", "indexer-floor"):
        c4_floor(args.sizes, 128 if args.what == "indexer-floor" else args.head)
    elif args.what == "pairs":
        time_pairs(args.sizes)
    elif args.what == "profile-one":
        profile_one(args.tokens, args.variant, args.case)
    else:
        if args.what == "no-exp":
            patch_out_exp2s()
            print("exp2s PATCHED OUT: results are wrong on purpose (timing only)")
        time_variants(args.sizes, args.variants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
