"""The C4 kernels' opt-in load-order and occupancy knobs against their defaults, on one GPU.

    python -m dsv4_compressor.bench.c4_variants [--sizes 1 8 128 1024 16384] [--skip-check]

For the 512-wide C4 kernel (:class:`...impl.cutedsl.config.C4Config`, ``flashmla_fp8``, state
block size 4, 64 entries per page) and the indexer's 128-wide C4 kernel
(:class:`...impl.cutedsl.indexer_config.IndexerConfig`, ``indexer_fp8``, block size 16), each
configuration below is compiled directly (no dispatcher), checked byte for byte against the
NumPy spec on an 8-token and a 1024-token decode batch and a prefill step from position 0 (the
whole ``k_cache`` buffer, padding included), then timed by CUDA-graph replay over 4 rotated
input sets of the decode sweep (:mod:`.cases`, :mod:`.timing`), variants interleaved within each
trial. The tables give µs per call (median of the trials) and the share of the device copy
bandwidth measured in this run that the step's bytes (:meth:`.cases.Case.bytes_moved`) would
take at that time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

SIZES = (1, 8, 128, 1024, 16384)
CHECK_SIZES = (8, 1024)
NUM_SETS = 4
TRIALS = 5


def c4_configs() -> dict:
    """Name -> C4Config: the default (as the dispatcher builds it) and the opt-in variants."""
    from ..impl.cutedsl.config import C4Config, EntryFormat
    from ..impl.cutedsl.dispatch import DEFAULT_POLICY, c4_config

    entry = EntryFormat("flashmla_fp8", 64, "float32", 16)
    base = dict(block_size=4, entry=entry, pdl=True)
    return {
        "default": c4_config(4, entry, DEFAULT_POLICY, pdl=True),
        "lookups_first": C4Config(**base, lookups_first=True),
        "occupancy8": C4Config(**base, min_ctas_per_sm=8),
        "lookups_first+occupancy8": C4Config(**base, lookups_first=True, min_ctas_per_sm=8),
        "lookups+inputs_first+occupancy8": C4Config(**base, lookups_first=True, entry_inputs_first=True,
                                                    min_ctas_per_sm=8),
        "tpc2+lookups_first+occupancy4": C4Config(**base, tokens_per_cta=2, lookups_first=True, min_ctas_per_sm=4),
    }


def indexer_configs() -> dict:
    """Name -> IndexerConfig: the default (the dispatcher's tuning) and the opt-in variants."""
    from ..impl.cutedsl.dispatch import DEFAULT_POLICY, indexer_config
    from ..impl.cutedsl.indexer_config import IndexerConfig

    base = dict(ratio=4, block_size=16, layout="indexer_fp8", hadamard=False, entries_per_page=64,
                weight_dtype="float32", warps=DEFAULT_POLICY.shapes.indexer_c4_warps, pdl=True)
    return {
        "default": indexer_config(4, 16, "indexer_fp8", False, 64, "float32", DEFAULT_POLICY, pdl=True),
        "occupancy8": IndexerConfig(**base, min_ctas_per_sm=8),
        "tokens_per_warp2": IndexerConfig(**base, tokens_per_warp=2),
        "tokens_per_warp2+occupancy4": IndexerConfig(**base, tokens_per_warp=2, min_ctas_per_sm=4),
        "tokens_per_warp4 (2 warps)": IndexerConfig(**{**base, "warps": 2}, tokens_per_warp=4),
    }


def _compile(kind: str, config):
    from ..impl.cutedsl.ptx import compile_variant

    return compile_variant(kind, config, keep_ptx=False)


def _launcher(kind: str, kernel):
    """``launch(input_set)`` of a compiled kernel on :func:`.timing.prepare`'s argument tuple."""
    def launch(s) -> None:
        state, req, pos, slots, table, _bs, weight, eps, cos_sin, k_cache, kv_slots = s.args
        if kind == "c4":
            kernel(state, req, pos, slots, table, weight, cos_sin, k_cache, kv_slots, eps, 1.0)
        else:
            kernel(state, req, pos, slots, table, weight, cos_sin, k_cache, kv_slots, eps)

    return launch


def _spec_bytes(case, s, flat_shape, view) -> np.ndarray:
    """The spec's bytes of the zeroed ``k_cache`` buffer after the call on input set ``s``."""
    from ..spec import compress_norm_rope_store

    state, req, pos, slots, table, bs, weight, eps, cos_sin, k_cache, kv_slots = s.args
    flat = np.zeros(flat_shape, dtype=np.uint8)
    out = np.lib.stride_tricks.as_strided(flat, view.shape, view.stride())
    compress_norm_rope_store(state.cpu().numpy(), req.cpu().numpy(), pos.cpu().numpy(), slots.cpu().numpy(),
                             table.cpu().numpy(), bs, weight.cpu().numpy(), eps, cos_sin.cpu().numpy(), out,
                             kv_slots.cpu().numpy(), compress_ratio=4, layout=case.layout)
    return flat


def prefill_case(case):
    """``case``'s shapes on prefill chunks from position 0 and 5, so the first window (``p = 3``,
    whose first half lies before the sequence) and runs of consecutive tokens are checked too."""
    from dataclasses import dataclass

    from ..spec import batch as B
    from .cases import Case

    @dataclass(frozen=True)
    class PrefillCase(Case):
        def batch(self, rng):
            requests = [B.Request(0, 4), B.Request(0, 7), B.Request(0, 64), B.Request(5, 16), B.Request(0, 3)]
            return B.build_batch(requests, compress_ratio=4, block_size=self.block_size,
                                 entries_per_page=self.entries_per_page, rng=rng, spare_state_blocks=0, spare_pages=0)

    fields = {name: getattr(case, name) for name in case.__dataclass_fields__}
    return PrefillCase(**{**fields, "name": case.name + "_prefill", "kind": "prefill", "token_num": 94})


def check_bytes(kind: str, case_of, kernels: dict) -> list[str]:
    """Failures of every kernel against the spec on the check batches (k_cache bytes, padding included)."""
    import torch

    from .timing import prepare

    failures = []
    for n in CHECK_SIZES + ("prefill",):
        case = prefill_case(case_of(1)) if n == "prefill" else case_of(n)
        s = prepare(case, num_sets=1, seed=7).sets[0]
        k_cache = s.args[9]
        flat = torch.as_strided(k_cache, (k_cache.shape[0], k_cache.stride(0)), (k_cache.stride(0), 1))
        expected = _spec_bytes(case, s, tuple(flat.shape), k_cache)
        for name, kernel in kernels.items():
            flat.zero_()
            _launcher(kind, kernel)(s)
            torch.cuda.synchronize()
            got = flat.cpu().numpy()
            if not np.array_equal(got, expected):
                bad = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
                failures.append(f"{kind} {name} T={n}: {bad.size} bytes differ (first at byte {bad[0]})")
    return failures


def _graph(launch, sets, calls: int):
    from .timing import capture_graph

    return capture_graph(launch, sets, calls)


def time_sizes(case_of, kind: str, kernels: dict, sizes, copy_gbs: float) -> dict:
    """``{size: {name: (µs, % of copy bandwidth)}}``, variants interleaved per trial."""
    import torch

    from .timing import prepare, time_graph

    results = {}
    for n in sizes:
        prepared = prepare(case_of(n), num_sets=NUM_SETS)
        graphs = {}
        for name, kernel in kernels.items():
            calls = 200 if n <= 1024 else 40
            graph = _graph(_launcher(kind, kernel), prepared.sets, calls)
            per_call = time_graph(graph, calls, 1)
            replays = max(1, min(100, int(20000 / (calls * max(per_call, 0.5)))))
            graphs[name] = (graph, calls, replays)
        samples = {name: [] for name in kernels}
        for _ in range(TRIALS):
            for name, (graph, calls, replays) in graphs.items():
                samples[name].append(time_graph(graph, calls, replays))
        results[n] = {}
        for name, values in samples.items():
            us = statistics.median(values)
            results[n][name] = (us, 100.0 * prepared.bytes_moved / (us * 1e-6) / (copy_gbs * 1e9))
        del graphs, prepared
        torch.cuda.empty_cache()
    return results


def table(title: str, results: dict, names) -> str:
    sizes = list(results)
    lines = [f"### {title}", "", "| variant | " + " | ".join(f"T={n}" for n in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for name in names:
        cells = [f"{results[n][name][0]:.2f} µs ({results[n][name][1]:.1f}%)" for n in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--skip-check", action="store_true", help="time without the byte checks")
    args = parser.parse_args(argv)

    import torch

    from .cases import c4_decode_sweep, indexer_decode_sweep
    from .timing import copy_bandwidth_gbs

    if not torch.cuda.is_available():
        print("c4_variants: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    kinds = (
        ("c4", "512-wide C4 (flashmla_fp8, bs 4, B 64)", lambda n: c4_decode_sweep((n,))[0], c4_configs()),
        ("indexer", "indexer C4 (indexer_fp8, bs 16, B 64)", lambda n: indexer_decode_sweep((n,))[0],
         indexer_configs()),
    )
    compiled = {kind: {name: _compile(kind, cfg) for name, cfg in configs.items()} for kind, _, _, configs in kinds}
    print(f"compiled {sum(map(len, compiled.values()))} kernels in {time.perf_counter() - started:.0f} s", flush=True)
    if not args.skip_check:
        failures = []
        for kind, _, case_of, _ in kinds:
            failures += check_bytes(kind, case_of, compiled[kind])
        if failures:
            print("BYTE MISMATCH vs the spec:\n" + "\n".join(failures))
            return 1
        print(f"bytes equal to the spec (decode T = {', '.join(map(str, CHECK_SIZES))}, a prefill step) for every kernel "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    copy_gbs = copy_bandwidth_gbs()
    print(f"\ncopy bandwidth: {copy_gbs:.0f} GB/s (read + write)\n")
    for kind, title, case_of, configs in kinds:
        results = time_sizes(case_of, kind, compiled[kind], args.sizes, copy_gbs)
        print(table(title, results, configs), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
