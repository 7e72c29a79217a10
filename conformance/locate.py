"""Where a byte lives: token, region and channel of an offset in a cache allocation.

Regions are SPEC §10's: ``NoPE`` (E4M3 or bf16/fp8 NoPE channels), ``scale`` (UE8M0
bytes), ``pad`` (the scale record's byte 7), ``RoPE``, ``data`` (a whole-entry record's codes),
``untouched`` (bytes no active token addresses) and ``state`` (the state cache). Which byte of
an entry is which comes from the layout's descriptor (:mod:`dsv4_compressor.spec.entry_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec.entry_layout import ENTRY_LAYOUTS, RECORD_LAYOUTS, EntryLayout
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
    """Describe byte ``byte`` of ``buffer.owner`` (a compressed cache allocation) by the layout's
    byte map (:mod:`dsv4_compressor.spec.entry_layout`)."""
    entry = RECORD_LAYOUTS.get(layout) or ENTRY_LAYOUTS[layout]
    if entry.records:
        return _locate_record_byte(buffer, entry, byte - buffer.offset, active_slots)
    return _locate_row_element(buffer, entry, byte - buffer.offset, active_slots)


def _locate_record_byte(buffer: Buffer, entry: EntryLayout, rel: int, active_slots: dict[int, int]) -> Place:
    """A byte of a layout of ``E``-byte records in uint8 pages (paged or interleaved)."""
    num_pages, entries = buffer.shape[0], buffer.shape[1]
    page_stride = buffer.strides[0] if num_pages > 1 else entries * entry.entry_bytes
    page, in_page = divmod(rel, page_stride)
    if rel < 0 or page >= num_pages:
        return Place("untouched", detail="outside the cache's pages")
    found = entry.locate_in_page(in_page, entries)
    if found is None:
        return Place("untouched", detail=f"page {page} padding byte {in_page}")
    offset, region = found
    slot = page * entries + offset
    token, detail = _token_of_slot(active_slots, slot, f"page {page} entry {offset}")
    return Place(region.name if token is not None else "untouched", token, slot, region.channel, detail)


def _locate_row_element(buffer: Buffer, entry: EntryLayout, rel: int, active_slots: dict[int, int]) -> Place:
    """A byte of a layout whose entry is a row of elements (any strides)."""
    num_pages, entries = buffer.shape[0], buffer.shape[1]
    index = {}
    remainder = rel
    for axis in sorted(range(3), key=lambda a: -buffer.strides[a]):
        index[axis], remainder = divmod(remainder, buffer.strides[axis])
    page, o, channel = index[0], index[1], index[2]
    if rel < 0 or remainder >= buffer.dtype.itemsize or not (
            0 <= page < num_pages and 0 <= o < entries and 0 <= channel < entry.head_dim):
        return Place("untouched", detail="outside the cache's entries")
    slot = page * entries + o
    token, detail = _token_of_slot(active_slots, slot, f"page {page} entry {o}")
    region = entry.region_of_channel(channel)
    return Place(region if token is not None else "untouched", token, slot, channel, detail)


def locate_state(buffer: Buffer, byte: int, saved_slots: dict[int, int]) -> Place:
    """Describe byte ``byte`` of a state cache allocation."""
    rel = byte - buffer.offset
    num_blocks, block_size, width = buffer.shape
    s0, s1 = buffer.strides[0], buffer.strides[1]
    block, rest = divmod(rel, s0) if num_blocks > 1 else (0, rel)
    row, rest = divmod(rest, s1) if block_size > 1 else (0, rest)
    column = rest // buffer.dtype.itemsize  # an fp32 or a bf16 (SPEC §13.1) element
    if rel < 0 or block >= num_blocks or row >= block_size or column >= width:
        return Place("state", detail="padding or outside the state rows (never written)")
    slot = block * block_size + row
    token = saved_slots.get(slot)
    half = "kv" if column < width // 2 else "score"
    return Place("state", token, slot, column, f"block {block} row {row} ({half})")


def active_slot_map(kv_slot_mapping: np.ndarray, active: np.ndarray) -> dict[int, int]:
    """slot -> active token (the last one, as the spec's stores go in token order)."""
    return {int(kv_slot_mapping[t]): int(t) for t in np.flatnonzero(active)}
