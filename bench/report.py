"""Tables in the style of a kernel pull request, CSV/JSON files and a log-log plot."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from .sweep import Row


def _fmt(value, digits=1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _by_case_and_mode(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """The rows of each (case, mode), in the order they first appear: one table each."""
    groups = defaultdict(list)
    for row in rows:
        groups[(row.case, row.mode)].append(row)
    return groups


def markdown_tables(rows: list[Row], baseline: str | None, copy_gbs: float) -> str:
    """One table per (case, mode): token_num | active | <impl> µs ... | speedup vs baseline | GB/s | % copy BW."""
    groups = _by_case_and_mode(rows)
    out = []
    for (case, mode), group in groups.items():
        impls = list(dict.fromkeys(r.implementation for r in group))
        base = baseline if baseline in impls else impls[0]
        others = [i for i in impls if i != base]
        header = ["token_num", "active"] + [f"{i} µs" for i in impls]
        header += [f"{i} vs {base}" for i in others]
        header += [f"{i} GB/s" for i in impls] + [f"{i} % copy BW" for i in impls]
        if mode == "eager":
            header += [f"{i} host µs" for i in impls]
        out.append(f"\n**{case}, {mode}** (copy bandwidth {copy_gbs:.0f} GB/s; speedup = {base} time / other time)\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        by_size = defaultdict(dict)
        for r in group:
            by_size[r.token_num][r.implementation] = r
        for n in sorted(by_size):
            cells = by_size[n]
            first = next(iter(cells.values()))
            line = [str(n), str(first.active)]
            line += [_fmt(cells[i].median_us) if i in cells and not cells[i].error else "err" for i in impls]
            for i in others:
                b, o = cells.get(base), cells.get(i)
                ok = b and o and b.median_us and o.median_us
                line.append(f"{b.median_us / o.median_us:.2f}x" if ok else "-")
            line += [_fmt(cells[i].gbs, 0) if i in cells else "-" for i in impls]
            line += [_fmt(cells[i].pct_copy) if i in cells else "-" for i in impls]
            if mode == "eager":
                line += [_fmt(cells[i].host_us) if i in cells else "-" for i in impls]
            out.append("| " + " | ".join(line) + " |")
        errors = {r.implementation: r.error for r in group if r.error}
        for impl, error in errors.items():
            out.append(f"\n{impl}: {error}")
    return "\n".join(out)


def write_files(rows: list[Row], out_dir: Path, meta: dict, stem: str = "bench") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"{stem}.csv", out_dir / f"{stem}.json"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0].as_dict()))
        writer.writeheader()
        for row in rows:
            writer.writerow(row.as_dict())
    json_path.write_text(json.dumps({"meta": meta, "rows": [r.as_dict() for r in rows]}, indent=1))
    return [csv_path, json_path]


def plot(rows: list[Row], out_path: Path, copy_gbs: float) -> Path | None:
    """Time vs token_num (log-log) per implementation and mode, with the memory floor."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cases = list(dict.fromkeys(r.case for r in rows if r.operation == "compress" and "mixed" not in r.case
                               and "step" not in r.case))  # single points, not sweeps
    if not cases:
        return None
    fig, axes = plt.subplots(1, len(cases), figsize=(7 * len(cases), 5), squeeze=False)
    for ax, case in zip(axes[0], cases):
        sub = [r for r in rows if r.case == case and r.median_us]
        for (impl, mode) in dict.fromkeys((r.implementation, r.mode) for r in sub):
            pts = sorted((r.token_num, r.median_us) for r in sub if r.implementation == impl and r.mode == mode)
            ax.plot(*zip(*pts), marker="o", markersize=3, linestyle="-" if mode == "graph" else "--", label=f"{impl} ({mode})")
        floor = sorted({(r.token_num, r.bytes_moved / (copy_gbs * 1e9) * 1e6) for r in sub})
        ax.plot(*zip(*floor), color="black", linewidth=2, label=f"memory floor ({copy_gbs:.0f} GB/s copy)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("token_num (decode-boundary tokens)")
        ax.set_ylabel("µs per call")
        ax.set_title(case)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def step_tables(rows: list[Row], baseline: str | None, copy_gbs: float, floor: str = "floor") -> str:
    """The step benchmarks' tables (:mod:`.steps`), one per (case, mode): a line per (token_num, format),
    µs per call of each implementation, the speedup of each over ``baseline`` (its time / theirs), each
    one's time over the floor's (1.00x: as fast as moving the step's bytes allows), and its share of
    the copy bandwidth; then each implementation's error or refusal."""
    groups = _by_case_and_mode(rows)
    out = []
    for (case, mode), group in groups.items():
        impls = list(dict.fromkeys(r.implementation for r in group))
        timed = [i for i in impls if i != floor]
        others = [i for i in timed if i != baseline] if baseline in impls else []
        header = ["token_num", "format", "active"] + [f"{i} µs" for i in impls]
        header += [f"{i} vs {baseline}" for i in others]
        header += [f"{i} / floor" for i in timed] if floor in impls else []
        header += [f"{i} % copy BW" for i in impls]
        out.append(f"\n**{case}, {mode}** (copy bandwidth {copy_gbs:.0f} GB/s; vs = {baseline} time / other time; "
                   f"/ floor = time / the floor's time)\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        lines = defaultdict(dict)
        for r in group:
            lines[(r.token_num, r.variant)][r.implementation] = r
        for (n, variant), cells in sorted(lines.items()):
            first = next(iter(cells.values()))
            time = {i: cells[i].median_us if i in cells and not cells[i].error else None for i in impls}
            line = [str(n), variant, str(first.active)]
            line += [_fmt(time[i], 2) if time[i] else ("unsupported" if i in cells and cells[i].error.startswith(
                "unsupported") else "err" if i in cells and cells[i].error else "-") for i in impls]
            line += [f"{time[baseline] / time[i]:.2f}x" if time.get(baseline) and time[i] else "-" for i in others]
            if floor in impls:
                line += [f"{time[i] / time[floor]:.2f}x" if time[floor] and time[i] else "-" for i in timed]
            line += [_fmt(cells[i].pct_copy) if i in cells else "-" for i in impls]
            out.append("| " + " | ".join(line) + " |")
        errors = {(r.implementation, r.variant): r.error for r in group if r.error}
        for (impl, variant), error in errors.items():
            out.append(f"\n{impl} ({variant}): {error}")
    return "\n".join(out)
