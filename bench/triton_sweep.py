"""Sweep the Triton kernels' knobs on a CUDA GPU: ``python -m dsv4_compressor.bench.triton_sweep``.

On the main bench's decode-boundary cases (:mod:`.cases`: every token closes a window, one token
per request) of several sizes it first runs every configuration (:class:`FusedConfig`, and at C128
:class:`SplitConfig`, the split path's) once on one input set and checks that it writes the same
``k_cache`` bytes as the call's default configuration, then times all of them with the bench's own
machinery (:func:`.sweep.run_case`: input sets rotated past L2 by :func:`.timing.prepare`,
CUDA-graph replay, trials interleaved across configs; the host-side validation and launch cost
stays out of the kernel time) and prints the effective bandwidth (the case's bytes moved,
:meth:`.cases.Case.bytes_moved`) against a measured device-to-device copy. It also reports the host
cost of one eager call. ``--check-spec`` also compares the default configuration's bytes with the
NumPy spec on the smallest case of each sweep.

``--head 128`` sweeps the fused kernel on the indexer's head (SPEC §12) instead, per layout
(``--layout``, ``--hadamard``), on the main bench's indexer cases; C4 by default, ``--ratio 128``
for the C128 path. Without ``--head 128`` the save pass's :class:`SaveConfig` are timed too on
the bench's save cases (``--no-save`` to skip).
"""

from __future__ import annotations

import argparse
import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..impl.triton.api import compress_norm_rope_store, save_partial_states
from ..impl.triton.config import DEFAULT_FUSED, DEFAULT_SPLIT, FusedConfig, SaveConfig, SplitConfig
from ..impl.triton.pooling import THREADS_PER_WARP
from ..spec import batch as spec_batch
from ..spec.constants import ratio_config
from ..spec.entry_layout import INDEXER_LAYOUTS
from .cases import Case, decode_sweep, save_sweep
from .sweep import TRIALS, Row, run_case
from .timing import BenchImpl, InputSet, copy_bandwidth_gbs, prepare, time_eager


def fused_grid(ratio: int, block_cs: tuple, warps: tuple, per_thread: tuple[int, int], **fixed) -> list[FusedConfig]:
    """Every ``block_c`` x ``num_warps`` pair of the grid (in the order given) with the ``fixed``
    knobs, pruned to the pairs whose ``[W, block_c]`` fp32 kv tile (W: the ratio's window) leaves
    ``per_thread[0]..per_thread[1]`` values in each thread: fewer wastes the threads, more spills
    (a step holds as many again for the score)."""
    window = ratio_config(ratio).window
    lo, hi = per_thread
    return [FusedConfig(block_c=block_c, num_warps=num_warps, **fixed) for block_c in block_cs for num_warps in warps
            if lo <= window * block_c // (THREADS_PER_WARP * num_warps) <= hi]


# C4 ([8, block_c] tiles): 16 to 64 values a thread; C128 ([128, block_c]): 16 to 32, as a runtime loop
# (one stage, or two software-pipelined), and the unrolled default shape
C4_CONFIGS = fused_grid(4, (512, 256, 128), (1, 2, 4, 8), (16, 64))
# C128's split path (the default): its tile, its store's warps and fixed runs beside the device's own
SPLIT_C128_CONFIGS = [DEFAULT_SPLIT[512], SplitConfig(pool_run=1, store_run=1), SplitConfig(pool_run=8),
                      SplitConfig(pool_run=64, store_run=64), SplitConfig(block_c=32, num_warps=4),
                      SplitConfig(block_c=128, num_warps=8), SplitConfig(store_warps=8)]
C128_CONFIGS = (fused_grid(128, (64, 32), (4, 8), (16, 32), unroll_tiles=False)
                + fused_grid(128, (64, 32), (4, 8), (16, 32), unroll_tiles=False, tile_stages=2)
                + [FusedConfig(block_c=64, num_warps=8)] + SPLIT_C128_CONFIGS)
KV_TOKENS = {128: (256, 1024, 4096), 4: (1024, 4096, 16384, 65536)}

# The indexer's head (SPEC §12, head 128): block_c <= 128, tile_stages 1. A one-token program is
# small, so registers can bound the programs per SM (and the state bytes in flight): the
# max_registers rows cap them at the counts that let 25 or 32 two-warp programs share an SM.
INDEXER_C4_CONFIGS = fused_grid(4, (128, 64), (1, 2, 4), (8, 32)) + [
    FusedConfig(block_c=64, num_warps=2, unroll_tiles=False),
    FusedConfig(block_c=128, num_warps=2, max_registers=40),
    FusedConfig(block_c=128, num_warps=2, max_registers=32),
    FusedConfig(block_c=64, num_warps=2, unroll_tiles=False, max_registers=32),
]
INDEXER_C128_CONFIGS = (fused_grid(128, (32, 64, 16), (4, 8, 2), (16, 64), unroll_tiles=False)
                        + [DEFAULT_SPLIT[128], SplitConfig(block_c=64, num_warps=4, store_warps=1)])
INDEXER_TOKENS = {4: (1024, 4096, 16384), 128: (256, 1024, 4096)}

SAVE_CONFIGS = (SaveConfig(), SaveConfig(block=256, num_warps=2), SaveConfig(block=512, num_warps=8),
                SaveConfig(block=128, num_warps=1))
SAVE_TOKENS = 16384
HOST_CALLS = 50  # eager calls timed for the host cost of one call
K_CACHE_ARG = 9  # k_cache's place in compress_norm_rope_store's positional arguments


def config_name(config: FusedConfig | SplitConfig | None) -> str:
    if config is None:
        return "default"  # the call's own choice (the indexer's C4 default depends on the token count)
    if isinstance(config, SplitConfig):
        runs = "-".join("auto" if run is None else str(run) for run in (config.pool_run, config.store_run))
        return f"split_bc{config.block_c}_w{config.num_warps}_s{config.store_warps}_runs{runs}"
    loop = "unrolled" if config.unroll_tiles else f"loop{config.tile_stages}"
    cap = "" if config.max_registers is None else f"_r{config.max_registers}"
    return f"bc{config.block_c}_w{config.num_warps}_{loop}{cap}"


@dataclass(frozen=True)
class Sweep:
    """One knob sweep: a head width, ratio and layout (and rotation), its token counts and configs
    (None: the call's own default)."""

    head: int  # 512, or the indexer's 128 (SPEC §12)
    ratio: int
    layout: str
    hadamard: bool
    token_counts: tuple
    configs: tuple

    def cases(self) -> list[Case]:
        """The main bench's decode cases of this head and ratio (their batches and bytes moved)."""
        indexer = {"hadamard": self.hadamard} if self.head == 128 else {}
        return decode_sweep(self.head, self.ratio, self.token_counts, layout=self.layout, **indexer)

    def label(self) -> str:
        if self.head == 128:
            return f"idx C{self.ratio} {self.layout.removeprefix('indexer_')}{'+H' if self.hadamard else ''}"
        return f"C{self.ratio}"


def kv_sweeps(ratios, token_counts, default_only: bool) -> list[Sweep]:
    """The 512-wide sweeps (``flashmla_fp8``): C128 then C4 unless ``ratios`` says otherwise."""
    out = []
    for ratio in ratios or (128, 4):
        configs = (None,) if default_only else tuple(C4_CONFIGS if ratio == 4 else C128_CONFIGS)
        out.append(Sweep(512, ratio, "flashmla_fp8", False, tuple(token_counts or KV_TOKENS[ratio]), configs))
    return out


def indexer_sweeps(ratios, layouts, hadamard: bool, token_counts, default_only: bool) -> list[Sweep]:
    """The ``--head 128`` sweeps: C4 unless ``ratios`` says otherwise, both layouts unless ``layouts`` does."""
    out = []
    for ratio in ratios or (4,):
        configs = (None,) if default_only else tuple(INDEXER_C4_CONFIGS if ratio == 4 else INDEXER_C128_CONFIGS)
        for layout in layouts or INDEXER_LAYOUTS:
            out.append(Sweep(128, ratio, layout, hadamard, tuple(token_counts or INDEXER_TOKENS[ratio]), configs))
    return out


def compress_impl(config: FusedConfig | SplitConfig | None) -> BenchImpl:
    """The Triton compress call with ``config`` as a bench row named by :func:`config_name`."""
    return BenchImpl(config_name(config), functools.partial(compress_norm_rope_store, config=config), None)


def save_impl(config: SaveConfig) -> BenchImpl:
    return BenchImpl(f"block{config.block}_w{config.num_warps}", None, functools.partial(save_partial_states, config=config))


def check_configs(case: Case, configs, label: str, check_spec: bool, host_cost: bool) -> dict[str, tuple[float, bool]]:
    """``{config name: (first call in seconds, compilation included; whether it wrote the default
    configuration's k_cache bytes)}`` on one input set of ``case``. ``check_spec``: compare the
    default's bytes with the NumPy spec too; ``host_cost``: print the host time of one eager call
    of the default."""
    prepared = prepare(case, num_sets=1)  # the first batch of the timed sets (the same seed)
    first = prepared.sets[0]
    k_cache = first.args[K_CACHE_ARG]
    default = compress_impl(None).caller(prepared)
    k_cache.fill_(spec_batch.CANARY_BYTE)
    default(first)
    torch.cuda.synchronize()
    reference = k_cache.clone()
    if check_spec:
        _check_against_spec(label, case, first, reference)
    out = {}
    for config in configs:
        call = compress_impl(config).caller(prepared)
        k_cache.fill_(spec_batch.CANARY_BYTE)
        start = time.perf_counter()
        call(first)
        torch.cuda.synchronize()
        out[config_name(config)] = time.perf_counter() - start, torch.equal(k_cache, reference)
    if host_cost:
        _, host_us = time_eager(default, prepared.sets, HOST_CALLS)
        print(f"{label} host cost of one eager call (validation + launch): {host_us:.1f} us", flush=True)
    return out


def run_sweep(sweep: Sweep, copy_gbs: float, check_spec: bool, trials: int = TRIALS) -> None:
    """Check, then time, every config of ``sweep`` on each of its cases (graph replay)."""
    for case in sweep.cases():
        smallest = case.token_num == sweep.token_counts[0]
        checks = check_configs(case, sweep.configs, f"{sweep.label()} T={case.token_num}", check_spec and smallest,
                               smallest)
        for row in run_case(case, [compress_impl(c) for c in sweep.configs], ["graph"], copy_gbs, trials):
            first_call, same = checks[row.implementation]
            print(f"{sweep.label():18s} bs{case.block_size} T={case.token_num:6d} {row.implementation:26s} {_timing(row)}"
                  f"  bytes={'same' if same else 'DIFFERENT'}  (first call {first_call:.1f}s)", flush=True)
        torch.cuda.empty_cache()


def _timing(row: Row) -> str:
    if row.median_us is None:
        return f"error: {row.error}"
    return (f"{row.median_us:9.1f} us [{row.low_us:.1f}..{row.high_us:.1f}] {row.gbs / 1e3:6.3f} TB/s "
            f"{row.pct_copy:5.1f}% of copy")


def _check_against_spec(label: str, case: Case, input_set: InputSet, k_cache_after) -> None:
    """The default config's ``k_cache`` bytes against the NumPy spec on the same inputs."""
    from .. import spec

    host = [a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in input_set.args]
    k_cache = input_set.args[K_CACHE_ARG]
    host[K_CACHE_ARG] = spec_batch.canary_k_cache(case.layout, k_cache.shape[0], k_cache.shape[1])
    spec.compress_norm_rope_store(*host, **input_set.kwargs)
    expected, got = host[K_CACHE_ARG], k_cache_after.cpu().numpy()
    differing = int(np.count_nonzero(expected != got))
    print(f"{label}: spec check: {'IDENTICAL' if differing == 0 else f'{differing} DIFFERENT bytes'}", flush=True)


def sweep_save(copy_gbs: float, trials: int = TRIALS) -> None:
    """Every :data:`SAVE_CONFIGS` on the bench's save cases of :data:`SAVE_TOKENS` tokens (graph replay)."""
    for case in save_sweep((SAVE_TOKENS,)):
        for row in run_case(case, [save_impl(c) for c in SAVE_CONFIGS], ["graph"], copy_gbs, trials):
            print(f"save C{case.compress_ratio} T={case.token_num} {row.implementation:14s} {_timing(row)}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratio", type=int, choices=(4, 128), action="append")
    parser.add_argument("--tokens", type=int, action="append", help="token counts (default: per ratio)")
    parser.add_argument("--default-only", action="store_true", help="time only the default config")
    parser.add_argument("--check-spec", action="store_true")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--head", type=int, choices=(512, 128), default=512,
                        help="512: the KV compressor's head and the save pass; 128: the indexer's head (SPEC §12, "
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
    copy_gbs = copy_bandwidth_gbs()
    print(f"device-to-device copy: {copy_gbs / 1e3:.3f} TB/s", flush=True)
    if args.head == 128:
        sweeps = indexer_sweeps(args.ratio, args.layout, args.hadamard, args.tokens, args.default_only)
    else:
        sweeps = kv_sweeps(args.ratio, args.tokens, args.default_only)
    for sweep in sweeps:
        run_sweep(sweep, copy_gbs, args.check_spec)
    if args.head == 512 and not args.no_save:
        sweep_save(copy_gbs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
