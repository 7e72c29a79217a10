"""``python -m dsv4_compressor bench [--ratio 128|4] [--impl ...] [--mode eager|graph]``.

Runs the C128 and C4 decode-boundary sweeps (plus, with ``--extra``, the serving steps and the
save pass) for every available implementation; ``--head 128`` runs the indexer's compressor
instead (SPEC §12: the C4 decode sweep, or with ``--ratio 128`` the C128 one, for each
``--layout``, default both, ``--hadamard`` for the rotation; with ``--extra`` and C4 its mixed
steps and save pass), prints Markdown tables (token_num | µs per implementation | speedup vs
the baseline | GB/s | % of the copy bandwidth measured in the same run), and writes CSV, JSON
and a PNG plot. Needs a CUDA GPU.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--ratio", type=int, choices=(4, 128), action="append",
                        help="sweep(s) to run (default: both; with --head 128, C4)")
    parser.add_argument("--impl", action="append", help="implementation(s): triton, cutedsl, cutedsl-<variant> (the names in "
                        "dsv4_compressor.impl.cutedsl.variants.VARIANTS), cutedsl-<setting> (a setting of the tuner's generated "
                        "space, e.g. cutedsl-fused_cluster+cluster.tile=32), cutedsl-bound (a bound layer), cutedsl-op and "
                        "triton-op (the torch custom ops), triton-indexer_bc<c>_w<w> and cutedsl-indexer_* (indexer knobs, "
                        "--head 128), or module:attribute (default: triton, cutedsl and its split_block8, cluster8, "
                        "cluster16; triton and cutedsl with --head 128)")
    parser.add_argument("--mode", choices=("eager", "graph"), action="append", help="default: both")
    parser.add_argument("--sizes", type=int, nargs="*", help="token_num values (default: the full sweep)")
    parser.add_argument("--extra", action="store_true", help="also the serving steps (decode, prefill, mixed) and the save-partial-states pass")
    parser.add_argument("--baseline", default="triton", help="implementation the speedups are measured against")
    parser.add_argument("--out", default="bench/out", help="folder for CSV, JSON and PNG")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tag", default="", help="added to the output file names")
    parser.add_argument("--sets", type=int, default=None,
                        help="input sets per case (default: as many as keep every read out of L2; 4 gives the "
                             "L2-warm small rows of the earlier benchmarks)")
    parser.add_argument("--head", type=int, choices=(512, 128), default=512,
                        help="512: the KV compressor's sweeps; 128: the lightning indexer's (SPEC §12, default impls triton, cutedsl)")
    parser.add_argument("--layout", choices=("indexer_fp8", "indexer_mxfp4"), action="append",
                        help="with --head 128: the indexer layout(s) (default: both)")
    parser.add_argument("--hadamard", action="store_true", help="with --head 128: apply the Hadamard rotation")


def _versions() -> dict:
    import torch

    versions = {"torch": torch.__version__, "python": platform.python_version(), "gpu": torch.cuda.get_device_name()}
    for name, module in (("triton", "triton"), ("cutlass-dsl", "cutlass")):
        try:
            versions[name] = __import__(module).__version__
        except Exception:  # not installed
            versions[name] = None
    try:
        versions["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        versions["driver"] = None
    versions["commit"] = _commit()
    return versions


def _commit() -> str | None:
    """The package's own commit, ``-dirty`` where its files differ from it (a copied working tree
    whose git metadata lags behind says so); None outside a git checkout."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=package,
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip() if done.returncode == 0 else ""
    return commit or None


DEFAULT_IMPLS = {512: ["triton", "cutedsl", "cutedsl-split_block8", "cutedsl-cluster8", "cutedsl-cluster16"],
                 128: ["triton", "cutedsl"]}


def selected_cases(args) -> tuple[list[int], list]:
    """The ratios (for the file names) and the benchmark cases that the arguments select."""
    from .cases import decode_sweep, indexer_mixed_steps, indexer_save_sweep, mixed_steps, save_sweep
    from ..spec.entry_layout import INDEXER_LAYOUTS

    if args.head == 128:  # the indexer's compressor: C4 unless --ratio says otherwise (its serving steps are C4's)
        ratios, layouts = args.ratio or [4], tuple(args.layout or INDEXER_LAYOUTS)
        cases = [c for r in ratios for layout in layouts
                 for c in decode_sweep(128, r, args.sizes, layout=layout, hadamard=args.hadamard)]
        extra = indexer_mixed_steps(layouts, hadamard=args.hadamard) + indexer_save_sweep() if 4 in ratios else []
    else:
        ratios = args.ratio or [128, 4]
        cases = [c for r in ratios for c in decode_sweep(512, r, args.sizes)]
        extra = mixed_steps() + save_sweep()
    return ratios, cases + (extra if args.extra else [])


def run(args) -> int:
    if args.sets is not None and args.sets < 1:  # before any GPU work
        print(f"bench: --sets expected an integer >= 1, got {args.sets}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench: no CUDA GPU found; the benchmarks time kernels on a GPU and cannot run here.", file=sys.stderr)
        return 2
    from . import sweep as S
    from .report import markdown_tables, plot, write_files
    from .timing import copy_bandwidth_gbs

    names = args.impl or DEFAULT_IMPLS[args.head]
    impls = []
    for name in names:
        try:
            impls.append(S.load_bench_impl(name))
        except Exception as error:  # e.g. cutlass not installed
            print(f"bench: skipping {name}: {type(error).__name__}: {error}", file=sys.stderr)
    if not impls:
        print("bench: no implementation could be loaded", file=sys.stderr)
        return 1
    modes = args.mode or ["eager", "graph"]
    ratios, cases = selected_cases(args)
    copy_gbs = copy_bandwidth_gbs()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python -m dsv4_compressor bench", *sys.argv[2:]]), "copy_gbs": copy_gbs, **_versions()}
    print(json.dumps(meta))
    rows = S.run_sweep(cases, impls, modes, copy_gbs, num_sets=args.sets, trials=args.trials)
    print(markdown_tables(rows, args.baseline, copy_gbs))
    out = Path(args.out)
    stem = ("bench-" + ("indexer-" if args.head == 128 else "") + "-".join(f"c{r}" for r in ratios)
            + (f"-{args.tag}" if args.tag else ""))
    files = write_files(rows, out, meta, stem)
    figure = plot(rows, out / f"{stem}.png", copy_gbs)
    print("\nwrote " + ", ".join(str(p) for p in files + ([figure] if figure else [])))
    return 0
