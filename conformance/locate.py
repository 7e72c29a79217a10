"""Where a byte lives: token, region and channel of an offset in a cache allocation.

Regions are SPEC §10's: ``NoPE`` (E4M3 or bf16/fp8 NoPE channels), ``scale`` (UE8M0
bytes), ``pad`` (the scale record's byte 7), ``RoPE``, ``untouched`` (bytes no active
token addresses) and ``state`` (the state cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec.constants import DATA_RECORD_BYTES, ENTRY_BYTES, NOPE_DIM, NUM_QUANT_BLOCKS
from ..spec.entry_layout import PAGED_LAYOUTS
from .buffers import Buffer


@dataclass(frozen=True)
class Place:
    """One byte of a buffer, described for a reader."""

    region: str  # NoPE / scale / pad / RoPE / untouched / state
    token: int | None = None  # the active token whose entry holds the byte
    slot: int | None = None
    channel: int | None = None  # head channel 0..511, or quant block for scale bytes
    detail: str = ""

    def describe(self) -> str:
        parts = []
        if self.token is not None:
            parts.append(f"token {self.token}")
        if self.slot is not None:
            parts.append(f"slot {self.slot}")
        parts.append(f"region {self.region}")
        if self.channel is not None:
            parts.append(("block " if self.region == "scale" else "channel ") + str(self.channel))
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts)


def _token_of_slot(active_slots: dict[int, int], slot: int, detail: str) -> tuple[int | None, str]:
    token = active_slots.get(slot)
    if token is None:
        return None, f"{detail}; no active token stores slot {slot}"
    return token, detail


def locate_k_cache(buffer: Buffer, layout: str, byte: int, active_slots: dict[int, int]) -> Place:
    """Describe byte ``byte`` of ``buffer.owner`` (a compressed cache allocation)."""
    rel = byte - buffer.offset
    num_pages, entries = buffer.shape[0], buffer.shape[1]
    if layout == "flashmla_fp8":
        page_stride = buffer.strides[0] if num_pages > 1 else entries * ENTRY_BYTES
        page, in_page = divmod(rel, page_stride)
        if rel < 0 or page >= num_pages:
            return Place("untouched", detail="outside the cache's pages")
        if in_page >= entries * ENTRY_BYTES:
            return Place("untouched", detail=f"page {page} padding byte {in_page}")
        if in_page < entries * DATA_RECORD_BYTES:
            o, b = divmod(in_page, DATA_RECORD_BYTES)
            slot = page * entries + o
            if b < NOPE_DIM:
                region, channel = "NoPE", b
            else:
                region, channel = "RoPE", NOPE_DIM + (b - NOPE_DIM) // 2
        else:
            o, b = divmod(in_page - entries * DATA_RECORD_BYTES, ENTRY_BYTES - DATA_RECORD_BYTES)
            slot = page * entries + o
            region, channel = ("scale", b) if b < NUM_QUANT_BLOCKS else ("pad", None)
        token, detail = _token_of_slot(active_slots, slot, f"page {page} entry {o}")
        return Place(region if token is not None else "untouched", token, slot, channel, detail)
    if layout in PAGED_LAYOUTS:  # the indexer's pages (SPEC §12): B data records, then B scale records
        entry = PAGED_LAYOUTS[layout]
        page_stride = buffer.strides[0] if num_pages > 1 else entries * entry.entry_bytes
        page, in_page = divmod(rel, page_stride)
        if rel < 0 or page >= num_pages:
            return Place("untouched", detail="outside the cache's pages")
        if in_page >= entries * entry.entry_bytes:
            return Place("untouched", detail=f"page {page} padding byte {in_page}")
        if in_page < entries * entry.data_bytes:
            o, b = divmod(in_page, entry.data_bytes)
            region, channel = "data", (b if layout == "indexer_fp8" else 2 * b)
        else:
            o, b = divmod(in_page - entries * entry.data_bytes, entry.scale_bytes)
            region, channel = "scale", (b if layout == "indexer_mxfp4" else None)
        slot = page * entries + o
        token, detail = _token_of_slot(active_slots, slot, f"page {page} entry {o}")
        return Place(region if token is not None else "untouched", token, slot, channel, detail)
    itemsize = buffer.dtype.itemsize
    index = []
    remainder = rel
    for axis in sorted(range(3), key=lambda a: -buffer.strides[a]):
        i, remainder = divmod(remainder, buffer.strides[axis])
        index.append((axis, i))
    index = dict(index)
    page, o, channel = index[0], index[1], index[2]
    if rel < 0 or remainder >= itemsize or not (0 <= page < num_pages and 0 <= o < entries and 0 <= channel < 512):
        return Place("untouched", detail="outside the cache's entries")
    slot = page * entries + o
    token, detail = _token_of_slot(active_slots, slot, f"page {page} entry {o}")
    region = "NoPE" if channel < NOPE_DIM else "RoPE"
    return Place(region if token is not None else "untouched", token, slot, channel, detail)


def locate_state(buffer: Buffer, byte: int, saved_slots: dict[int, int]) -> Place:
    """Describe byte ``byte`` of a state cache allocation."""
    rel = byte - buffer.offset
    num_blocks, block_size, width = buffer.shape
    s0, s1 = buffer.strides[0], buffer.strides[1]
    block, rest = divmod(rel, s0) if num_blocks > 1 else (0, rel)
    row, rest = divmod(rest, s1) if block_size > 1 else (0, rest)
    column = rest // 4
    if rel < 0 or block >= num_blocks or row >= block_size or column >= width:
        return Place("state", detail="padding or outside the state rows (never written)")
    slot = block * block_size + row
    token = saved_slots.get(slot)
    half = "kv" if column < width // 2 else "score"
    return Place("state", token, slot, column, f"block {block} row {row} ({half})")


def active_slot_map(kv_slot_mapping: np.ndarray, active: np.ndarray) -> dict[int, int]:
    """slot -> active token (the last one, as the spec's stores go in token order)."""
    return {int(kv_slot_mapping[t]): int(t) for t in np.flatnonzero(active)}
