"""Sweep the Triton kernels' knobs on a CUDA GPU: ``python -m dsv4_compressor.bench.triton_sweep``.

For decode-boundary batches (every token closes a window, one token per request, the
production case) of several sizes it times each :class:`FusedConfig` by CUDA-graph replay (the
host-side validation and launch cost stays out of the kernel time; several input sets are
rotated inside the graph so small batches do not run from L2), checks that every config writes
the same ``k_cache`` bytes as the default one, and prints effective bandwidth against a measured
device-to-device copy. It also reports the host cost of one eager call. Bytes counted: the state rows read (W rows x 4 KiB per token,
read once) plus the entry written. ``--check-spec`` also compares the default config with the
NumPy spec on the smallest batch of each ratio.

``--head 128`` sweeps the indexer kernel (SPEC §12) instead, per layout (``--layout``,
``--hadamard``), on the main bench's indexer cases (:mod:`.cases`, which also count the bytes:
per active token its W window rows' own kv and score halves, the entry, the cos/sin row and
the metadata); C4 by default, ``--ratio 128`` for the C128 path.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..impl.triton.api import compress_norm_rope_store, save_partial_states
from ..impl.triton.config import DEFAULT_FUSED, FusedConfig, SaveConfig
from ..spec import batch as spec_batch
from ..spec.constants import ENTRY_BYTES
from ..spec.entry_layout import INDEXER_LAYOUTS
from .cases import Case, indexer_c128_decode_sweep, indexer_decode_sweep
from .timing import ROTATION_BYTES, InputSet, copy_bandwidth_gbs, prepare, rotation_sets

C128_CONFIGS = [
    FusedConfig(block_c=64, num_warps=8, unroll_tiles=False),
    FusedConfig(block_c=64, num_warps=8, unroll_tiles=False, tile_stages=2),
    FusedConfig(block_c=32, num_warps=8, unroll_tiles=False),
    FusedConfig(block_c=32, num_warps=4, unroll_tiles=False),
    FusedConfig(block_c=32, num_warps=4, unroll_tiles=False, tile_stages=2),
    FusedConfig(block_c=64, num_warps=8),
]
C4_CONFIGS = [
    FusedConfig(block_c=512, num_warps=4),
    FusedConfig(block_c=512, num_warps=2),
    FusedConfig(block_c=512, num_warps=8),
    FusedConfig(block_c=256, num_warps=2),
    FusedConfig(block_c=256, num_warps=4),
    FusedConfig(block_c=256, num_warps=1),
    FusedConfig(block_c=128, num_warps=1),
]

# The indexer kernel (SPEC §12, head 128): block_c <= 128, tile_stages 1. A one-token program is
# small, so registers can bound the programs per SM (and the state bytes in flight): the
# max_registers rows cap them at the counts that let 25 or 32 two-warp programs share an SM.
INDEXER_C4_CONFIGS = [
    FusedConfig(block_c=128, num_warps=2),
    FusedConfig(block_c=128, num_warps=1),
    FusedConfig(block_c=128, num_warps=4),
    FusedConfig(block_c=64, num_warps=1),
    FusedConfig(block_c=64, num_warps=2),
    FusedConfig(block_c=64, num_warps=2, unroll_tiles=False),
    FusedConfig(block_c=128, num_warps=2, max_registers=40),
    FusedConfig(block_c=128, num_warps=2, max_registers=32),
    FusedConfig(block_c=64, num_warps=2, unroll_tiles=False, max_registers=32),
]
INDEXER_C128_CONFIGS = [
    FusedConfig(block_c=32, num_warps=4, unroll_tiles=False),
    FusedConfig(block_c=32, num_warps=8, unroll_tiles=False),
    FusedConfig(block_c=64, num_warps=8, unroll_tiles=False),
    FusedConfig(block_c=16, num_warps=4, unroll_tiles=False),
    FusedConfig(block_c=32, num_warps=2, unroll_tiles=False),
]
INDEXER_TOKENS = {4: (1024, 4096, 16384), 128: (256, 1024, 4096)}


def config_name(config: FusedConfig | None) -> str:
    if config is None:
        return "default"  # the call's own choice (the indexer's C4 default depends on the token count)
    loop = "unrolled" if config.unroll_tiles else f"loop{config.tile_stages}"
    cap = "" if config.max_registers is None else f"_r{config.max_registers}"
    return f"bc{config.block_c}_w{config.num_warps}_{loop}{cap}"


def decode_batch(ratio: int, num_tokens: int, block_size: int, rng: np.random.Generator, entries_per_page: int = 64):
    """A decode-boundary batch on the GPU: metadata from ``spec.batch``, a random state cache."""
    requests = spec_batch.decode_requests(num_tokens, ratio, rng, max_entries=64 if ratio == 4 else 16)
    b = spec_batch.build_batch(requests, compress_ratio=ratio, block_size=block_size, entries_per_page=entries_per_page, rng=rng)
    width = 2 * (1024 if ratio == 4 else 512)
    state = torch.randn(b.num_state_blocks, block_size, width, device="cuda")
    state[..., width // 2:] *= 2.0
    max_pos = int(b.positions.max()) + ratio
    cos_sin = torch.from_numpy(spec_batch.rope_cos_sin_cache(max_pos)).cuda()
    weight = torch.from_numpy(spec_batch.random_norm_weight(rng, bf16=True).view(np.int16)).cuda().view(torch.bfloat16)
    k_cache = torch.full((b.num_pages, entries_per_page, ENTRY_BYTES), spec_batch.CANARY_BYTE, dtype=torch.uint8, device="cuda")
    meta = {name: torch.from_numpy(getattr(b, name).copy()).cuda()
            for name in ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")}
    return b, state, cos_sin, weight, k_cache, meta


def run_compress(ratio, b, state, cos_sin, weight, k_cache, meta, config):
    compress_norm_rope_store(state, meta["token_to_req_indices"], meta["positions"], meta["slot_mapping"], meta["block_table"],
                             b.block_size, weight, 1e-6, cos_sin, k_cache, meta["kv_slot_mapping"], compress_ratio=ratio,
                             config=config)


def graph_time_ms(calls) -> float:
    """Median time of one call (ms) by replaying a CUDA graph of passes over ``calls`` (32 calls at least)."""
    import triton

    repeats = -(-32 // len(calls))

    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            for call in calls:
                call()
    return triton.testing.do_bench(graph.replay, return_mode="median") / (repeats * len(calls))


def sweep_ratio(ratio: int, token_counts, configs, block_size: int, copy_bw: float, check_spec: bool) -> None:
    window = 8 if ratio == 4 else 128
    for num_tokens in token_counts:
        num_sets = rotation_sets(num_tokens * window * 4096)
        sets = [decode_batch(ratio, num_tokens, block_size, np.random.default_rng(num_tokens + ratio + 1000 * i)) for i in range(num_sets)]
        b, state, cos_sin, weight, k_cache, meta = sets[0]
        nbytes = b.num_active * (window * 4096 + ENTRY_BYTES)
        reference = None
        for config in configs:
            k_cache.fill_(spec_batch.CANARY_BYTE)
            start = time.perf_counter()
            run_compress(ratio, b, state, cos_sin, weight, k_cache, meta, config)
            torch.cuda.synchronize()
            first_call = time.perf_counter() - start
            result = k_cache.clone()
            if reference is None:
                reference = result
                if check_spec and num_tokens == token_counts[0]:
                    _check_against_spec(ratio, b, state, cos_sin, weight, result)
            same = torch.equal(result, reference)
            calls = [lambda s=s_: run_compress(ratio, *s, config) for s_ in sets]
            ms = graph_time_ms(calls)
            bw = nbytes / (ms * 1e-3)
            print(f"C{ratio:<3d} bs{block_size} T={num_tokens:6d} {config_name(config):22s} {ms * 1e3:9.1f} us "
                  f"{bw / 1e12:6.3f} TB/s {100 * bw / copy_bw:5.1f}% of copy  bytes={'same' if same else 'DIFFERENT'}  "
                  f"(first call {first_call:.1f}s, {num_sets} input sets)", flush=True)
        if num_tokens == token_counts[0]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(50):
                run_compress(ratio, b, state, cos_sin, weight, k_cache, meta, configs[0])
            host_us = (time.perf_counter() - start) / 50 * 1e6
            torch.cuda.synchronize()
            print(f"C{ratio} host cost of one eager call (validation + launch): {host_us:.1f} us", flush=True)
        del sets, state, k_cache
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class IndexerSweep:
    """One indexer sweep: a ratio and layout (and rotation), its token counts and configs."""

    ratio: int
    layout: str
    hadamard: bool
    token_counts: tuple
    configs: tuple

    def cases(self) -> list[Case]:
        """The main bench's indexer decode cases (their batches and byte counts)."""
        sweep = indexer_decode_sweep if self.ratio == 4 else indexer_c128_decode_sweep
        return sweep(self.token_counts, layout=self.layout, hadamard=self.hadamard)

    def label(self) -> str:
        return f"idx C{self.ratio} {self.layout.removeprefix('indexer_')}{'+H' if self.hadamard else ''}"


def indexer_sweeps(ratios, layouts, hadamard: bool, token_counts, default_only: bool) -> list[IndexerSweep]:
    """The ``--head 128`` sweeps: C4 unless ``ratios`` says otherwise, both layouts unless ``layouts`` does."""
    out = []
    for ratio in ratios or (4,):
        configs = (None,) if default_only else tuple(INDEXER_C4_CONFIGS if ratio == 4 else INDEXER_C128_CONFIGS)
        for layout in layouts or INDEXER_LAYOUTS:
            out.append(IndexerSweep(ratio, layout, hadamard, tuple(token_counts or INDEXER_TOKENS[ratio]), configs))
    return out


K_CACHE_ARG = 9  # k_cache's place in compress_norm_rope_store's positional arguments


def _run_indexer(input_set: InputSet, config: FusedConfig | None) -> None:
    compress_norm_rope_store(*input_set.args, **input_set.kwargs, config=config)


def sweep_indexer(sweep: IndexerSweep, copy_bw: float, check_spec: bool) -> None:
    """Time every config of ``sweep`` on each of its cases; bytes compared with the default config's."""
    for case in sweep.cases():
        seed = case.token_num + sweep.ratio
        prepared = prepare(case, seed=seed)
        num_sets = len(prepared.sets)
        first = prepared.sets[0]
        k_cache = first.args[K_CACHE_ARG]
        k_cache.fill_(spec_batch.CANARY_BYTE)
        _run_indexer(first, None)
        torch.cuda.synchronize()
        reference = k_cache.clone()
        if check_spec and case.token_num == sweep.token_counts[0]:
            _check_indexer_against_spec(sweep.label(), case, first, reference)
        for config in sweep.configs:
            k_cache.fill_(spec_batch.CANARY_BYTE)
            start = time.perf_counter()
            _run_indexer(first, config)
            torch.cuda.synchronize()
            first_call = time.perf_counter() - start
            same = torch.equal(k_cache, reference)
            ms = graph_time_ms([lambda s=s, c=config: _run_indexer(s, c) for s in prepared.sets])
            bw = prepared.bytes_moved / (ms * 1e-3)
            print(f"{sweep.label():18s} T={case.token_num:6d} {config_name(config):26s} {ms * 1e3:9.1f} us "
                  f"{bw / 1e12:6.3f} TB/s {100 * bw / copy_bw:5.1f}% of copy  bytes={'same' if same else 'DIFFERENT'}  "
                  f"(first call {first_call:.1f}s, {num_sets} input sets)", flush=True)
        if case.token_num == sweep.token_counts[0]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(50):
                _run_indexer(first, None)
            host_us = (time.perf_counter() - start) / 50 * 1e6
            torch.cuda.synchronize()
            print(f"{sweep.label()} host cost of one eager call (validation + launch): {host_us:.1f} us", flush=True)
        del prepared, first, k_cache, reference
        torch.cuda.empty_cache()


def _check_indexer_against_spec(label: str, case: Case, input_set: InputSet, k_cache_after) -> None:
    """The default config's ``k_cache`` bytes against the NumPy spec on the same inputs."""
    from .. import spec

    host = [a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in input_set.args]
    k_cache = input_set.args[K_CACHE_ARG]
    host[K_CACHE_ARG] = spec_batch.canary_k_cache(case.layout, k_cache.shape[0], k_cache.shape[1])
    spec.compress_norm_rope_store(*host, compress_ratio=case.compress_ratio, layout=case.layout, hadamard=case.hadamard)
    _print_spec_check(f"{label} T={case.token_num}", host[K_CACHE_ARG], k_cache_after.cpu().numpy())


def _print_spec_check(what: str, expected: np.ndarray, got: np.ndarray) -> None:
    differing = int(np.count_nonzero(expected != got))
    print(f"{what}: spec check: {'IDENTICAL' if differing == 0 else f'{differing} DIFFERENT bytes'}", flush=True)


def _check_against_spec(ratio, b, state, cos_sin, weight, k_cache_after) -> None:
    from .. import spec

    cache = np.full(tuple(k_cache_after.shape), spec_batch.CANARY_BYTE, dtype=np.uint8)
    spec.compress_norm_rope_store(
        state.cpu().numpy(), b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
        weight.view(torch.int16).cpu().numpy().view(np.uint16), 1e-6, cos_sin.cpu().numpy(), cache, b.kv_slot_mapping,
        compress_ratio=ratio,
    )
    _print_spec_check(f"C{ratio} T={b.num_tokens}", cache, k_cache_after.cpu().numpy())


def sweep_save(copy_bw: float) -> None:
    for ratio in (4, 128):
        rng = np.random.default_rng(ratio)
        num_tokens = 16384
        width = 2 * (1024 if ratio == 4 else 512)
        block_size = 4 if ratio == 4 else 8
        num_sets = max(1, -(-ROTATION_BYTES // (2 * num_tokens * width * 4)))
        kv_score = [torch.randn(num_tokens, width, device="cuda") for _ in range(num_sets)]
        ape = torch.randn(ratio, width // 2, device="cuda")
        positions = torch.arange(num_tokens, device="cuda", dtype=torch.int64)
        slots = torch.from_numpy(rng.permutation(num_tokens + block_size * 4)[:num_tokens].astype(np.int64)).cuda()
        states = [torch.zeros((num_tokens + block_size * 4) // block_size + 1, block_size, width, device="cuda") for _ in range(num_sets)]
        for config in (SaveConfig(), SaveConfig(block=256, num_warps=2), SaveConfig(block=512, num_warps=8), SaveConfig(block=128, num_warps=1)):
            calls = [lambda i=i: save_partial_states(kv_score[i], ape, positions, slots, states[i], block_size, config=config)
                     for i in range(num_sets)]
            ms = graph_time_ms(calls)
            bw = 2 * num_tokens * width * 4 / (ms * 1e-3)
            print(f"save C{ratio} T={num_tokens} block{config.block}_w{config.num_warps}: {ms * 1e3:8.1f} us {bw / 1e12:6.3f} TB/s "
                  f"{100 * bw / copy_bw:5.1f}% of copy", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratio", type=int, choices=(4, 128), action="append")
    parser.add_argument("--tokens", type=int, action="append", help="token counts (default: per ratio)")
    parser.add_argument("--default-only", action="store_true", help="time only the default config")
    parser.add_argument("--check-spec", action="store_true")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--head", type=int, choices=(512, 128), default=512,
                        help="512: the KV compressor's kernel and the save pass; 128: the indexer kernel (SPEC §12, "
                             "C4 unless --ratio 128; no save pass)")
    parser.add_argument("--layout", choices=INDEXER_LAYOUTS, action="append",
                        help="with --head 128: the indexer layout(s) (default: both)")
    parser.add_argument("--hadamard", action="store_true", help="with --head 128: apply the Hadamard rotation")
    args = parser.parse_args(argv)
    if args.head == 512 and (args.layout or args.hadamard):
        parser.error("--layout and --hadamard need --head 128")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    copy_bw = copy_bandwidth_gbs() * 1e9  # bytes/s
    print(f"device-to-device copy: {copy_bw / 1e12:.3f} TB/s", flush=True)
    if args.head == 128:
        for sweep in indexer_sweeps(args.ratio, args.layout, args.hadamard, args.tokens, args.default_only):
            sweep_indexer(sweep, copy_bw, args.check_spec)
        return 0
    for ratio in args.ratio or (128, 4):
        configs = [DEFAULT_FUSED[ratio]] if args.default_only else (C128_CONFIGS if ratio == 128 else C4_CONFIGS)
        tokens = args.tokens or ((256, 1024, 4096) if ratio == 128 else (1024, 4096, 16384, 65536))
        sweep_ratio(ratio, tokens, configs, 8 if ratio == 128 else 4, copy_bw, args.check_spec)
    if not args.no_save:
        sweep_save(copy_bw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
