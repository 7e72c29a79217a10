"""Sweep the Triton kernels' knobs on a CUDA GPU: ``python -m dsv4_compressor.bench.triton_sweep``.

For decode-boundary batches (every token closes a window, one token per request, the
production case) of several sizes it times each :class:`FusedConfig` by CUDA-graph replay (the
host-side validation and launch cost stays out of the kernel time; several input sets are
rotated inside the graph so small batches do not run from L2), checks that every config writes
the same ``k_cache`` bytes as the default one, and prints effective bandwidth against a measured
device-to-device copy. It also reports the host cost of one eager call. Bytes counted: the state rows read (W rows x 4 KiB per token,
read once) plus the entry written. ``--check-spec`` also compares the default config with the
NumPy spec on the smallest batch of each ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ..impl.triton.api import compress_norm_rope_store, save_partial_states
from ..impl.triton.config import DEFAULT_FUSED, FusedConfig, SaveConfig
from ..spec import batch as spec_batch
from ..spec.constants import ENTRY_BYTES
from .timing import copy_bandwidth_gbs

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


def config_name(config: FusedConfig) -> str:
    loop = "unrolled" if config.unroll_tiles else f"loop{config.tile_stages}"
    return f"bc{config.block_c}_w{config.num_warps}_{loop}"


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


ROTATION_BYTES = 256 << 20  # inputs touched per graph pass, well above the 60 MB L2


def graph_time_ms(calls, repeats: int = 4) -> float:
    """Median time of one call (ms) by replaying a CUDA graph of ``repeats`` passes over ``calls``."""
    import triton

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
        bytes_per_call = num_tokens * window * 4096
        num_sets = max(1, min(8, -(-ROTATION_BYTES // bytes_per_call)))
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


def _check_against_spec(ratio, b, state, cos_sin, weight, k_cache_after) -> None:
    from .. import spec

    cache = np.full(tuple(k_cache_after.shape), spec_batch.CANARY_BYTE, dtype=np.uint8)
    spec.compress_norm_rope_store(
        state.cpu().numpy(), b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
        weight.view(torch.int16).cpu().numpy().view(np.uint16), 1e-6, cos_sin.cpu().numpy(), cache, b.kv_slot_mapping,
        compress_ratio=ratio,
    )
    got = k_cache_after.cpu().numpy()
    differing = int(np.count_nonzero(cache != got))
    print(f"C{ratio} T={b.num_tokens}: spec check: {'IDENTICAL' if differing == 0 else f'{differing} DIFFERENT bytes'}", flush=True)


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ratio", type=int, choices=(4, 128), action="append")
    parser.add_argument("--tokens", type=int, action="append", help="token counts (default: per ratio)")
    parser.add_argument("--default-only", action="store_true", help="time only the default config")
    parser.add_argument("--check-spec", action="store_true")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    copy_bw = copy_bandwidth_gbs() * 1e9  # bytes/s
    print(f"device-to-device copy: {copy_bw / 1e12:.3f} TB/s", flush=True)
    for ratio in args.ratio or (128, 4):
        configs = [DEFAULT_FUSED[ratio]] if args.default_only else (C128_CONFIGS if ratio == 128 else C4_CONFIGS)
        tokens = args.tokens or ((256, 1024, 4096) if ratio == 128 else (1024, 4096, 16384, 65536))
        sweep_ratio(ratio, tokens, configs, 8 if ratio == 128 else 4, copy_bw, args.check_spec)
    if not args.no_save:
        sweep_save(copy_bw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
