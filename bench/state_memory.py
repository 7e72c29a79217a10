"""State memory per request and layer, for each state format (computed, not measured).

A request's partial state (SPEC §3, §13, §14.2) is rows of ``2·SW`` values (kv, then score), fp32
or bf16 (§13.1). How many rows it holds depends on the addressing:

- a **ring** (§13.3) holds ``C`` rows for the request's whole life;
- a **paged** state whose blocks are freed once no future window reads them holds, at worst,
  the blocks that cover the rows still to be pooled (computed here by walking one request's
  positions: after the row of position ``p`` is saved and the step's compress has run, the rows
  the next window still needs stay; their blocks of ``bs`` rows are counted);
- a paged state that keeps every block holds a row per position of the context
  (given per 1024 positions).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec.constants import HEAD_DIM, INDEXER_HEAD_DIM, ratio_config

ELEMENT_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class StateFormat:
    """One engine's state for one compressor."""

    compressor: str  # e.g. "C128 (head 512)"
    engine: str  # who keeps it this way (SPEC §13.5, §14.2)
    ratio: int  # r
    window: int  # W: rows pooled per entry
    state_width: int  # SW
    block_size: int  # bs
    ring_capacity: int | None  # C, or None: paged


def live_rows_paged(window: int, ratio: int, block_size: int) -> int:
    """The most rows a paged state with freed blocks holds during a step: over one period of
    positions ``p``, the blocks covering rows ``q - W + 1 .. p``, where ``q`` is the first boundary
    at or after ``p`` (``(q + 1) mod r == 0``: its window is the earliest one still to be pooled once
    ``p`` is saved), times ``bs``."""
    worst = 0
    for p in range(window, window + window * block_size):  # the pattern repeats within W * bs positions
        boundary = p + (ratio - 1 - p) % ratio
        first = boundary - window + 1
        worst = max(worst, (p // block_size - first // block_size + 1) * block_size)
    return worst


def formats() -> list[StateFormat]:
    """The formats SPEC §13.5 and §14.2 name (rings without speculative drafts)."""
    c4, c128 = ratio_config(4), ratio_config(128)
    indexer = ratio_config(4, INDEXER_HEAD_DIM)
    return [
        StateFormat("C4 (head 512)", "vLLM paged", 4, c4.window, c4.state_width, 4, None),
        StateFormat("C4 (head 512)", "SGLang ring of W rows", 4, c4.window, c4.state_width, 4, 8),
        StateFormat("C128 (head 512)", "vLLM paged", 128, c128.window, c128.state_width, 8, None),
        StateFormat("C128 (head 512)", "vLLM ring, C = 128", 128, c128.window, c128.state_width, 8, 128),
        StateFormat("C128 (head 512)", "vLLM ring with 1..128 drafts, C = 256", 128, c128.window, c128.state_width, 8, 256),
        StateFormat("indexer C4 (head 128)", "paged", 4, indexer.window, indexer.state_width, 16, None),
        StateFormat("V4.1 ratio 2", "DeepSeek's reference ring, C = 2", 2, 2, HEAD_DIM, 2, 2),
        StateFormat("V4.1 ratio 2", "vLLM ring, C = 8", 2, 2, HEAD_DIM, 8, 8),
        StateFormat("V4.1 ratio 2", "paged", 2, 2, HEAD_DIM, 8, None),
    ]


def memory_rows(dtypes=("fp32", "bf16")) -> list[dict]:
    """One row per (format, dtype): bytes per state row, rows held, KiB per request per layer held,
    and, for paged states, KiB per 1024 context positions if no block is freed."""
    rows = []
    for f in formats():
        for dtype in dtypes:
            row_bytes = 2 * f.state_width * ELEMENT_BYTES[dtype]
            held = f.ring_capacity if f.ring_capacity is not None else live_rows_paged(f.window, f.ratio, f.block_size)
            rows.append(dict(compressor=f.compressor, engine=f.engine, dtype=dtype, block_size=f.block_size,
                             row_bytes=row_bytes, rows_held=held, kib_held=held * row_bytes / 1024,
                             kib_per_1024_positions=None if f.ring_capacity is not None else 1024 * row_bytes / 1024))
    return rows


def memory_table(dtypes=("fp32", "bf16")) -> str:
    lines = ["| compressor | state | dtype | bs | bytes per row | rows held | KiB per request per layer | "
             "KiB per 1024 positions, no block freed |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in memory_rows(dtypes):
        kept = "-" if r["kib_per_1024_positions"] is None else f"{r['kib_per_1024_positions']:.0f}"
        lines.append(f"| {r['compressor']} | {r['engine']} | {r['dtype']} | {r['block_size']} | {r['row_bytes']} | "
                     f"{r['rows_held']} | {r['kib_held']:.0f} | {kept} |")
    return "\n".join(lines)
