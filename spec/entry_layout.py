"""SPEC §7/§12: one descriptor per compressed-cache layout — what ``k_cache`` holds and where
each entry's bytes go.

Everything that depends on a layout reads it from here: the §9 checks (dtype, entry width,
page stride), the stores of :mod:`.layouts`, both kernel families' compile-time entry formats
and the conformance suite's byte map (which byte of the cache is which channel of which
entry). A new layout is one more :class:`EntryLayout` in :data:`ENTRY_LAYOUTS` plus its
encoder; its bytes are located by the fields below, not by a string switch.

Three placements:

- ``"paged"`` (``flashmla_fp8``, ``indexer_fp8``, ``indexer_mxfp4``): ``k_cache`` is uint8
  ``[num_pages, B, E]`` whose page (stride ``stride(0)`` bytes, a multiple of 16) holds ``B``
  data records, then ``B`` scale records;
- ``"interleaved"`` (SPEC §14.5's ``v41_mxfp8``, ``v41_nvfp4``): the same uint8 pages, but entry
  ``o``'s scale record follows its own data record inside its ``E`` bytes;
- ``"rows"`` (``bf16``, ``fp8_per_tensor``): an entry is one row of ``head_dim`` elements of
  ``k_cache`` ``[num_pages, B, head_dim]``, any strides.

:data:`ENTRY_LAYOUTS` are DeepSeek V4's (SPEC §7, §12); :data:`V41_RECORD_LAYOUTS` the two
records only the V4.1 operations write (SPEC §14.5); :data:`RECORD_LAYOUTS` every layout of
``E``-byte records in a uint8 cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from .constants import (
    DATA_RECORD_BYTES, HEAD_DIM, MXFP8_BLOCKS, NVFP4_TILES, INDEXER_FP8_DATA_BYTES, INDEXER_FP8_SCALE_BYTES, INDEXER_HEAD_DIM,
    INDEXER_MXFP4_DATA_BYTES, INDEXER_MXFP4_SCALE_BYTES, NOPE_DIM, NUM_QUANT_BLOCKS,
    SCALE_RECORD_BYTES,
)

PAGE_STRIDE_MULTIPLE = 16  # bytes: the page stride of every paged layout
ELEMENT_BYTES = {"uint8": 1, "bfloat16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class Region:
    """A run of bytes of a record: ``size`` bytes from byte ``first``, holding channels
    ``channel + b // bytes_per_channel * channels_per_step`` (``None``: no channel, e.g. a
    whole-entry scale or a pad byte)."""

    name: str  # "NoPE", "RoPE", "data", "scale", "pad"
    first: int  # first byte in its record
    size: int  # bytes
    channel: int | None = None  # channel of the region's first byte (scale records: its first block)
    bytes_per_channel: int = 1  # bf16 RoPE values: 2
    channels_per_step: int = 1  # packed E2M1 codes: 2 channels a byte

    def channel_of(self, byte: int) -> int | None:
        """The channel (or block) of byte ``byte`` of the record, which lies in this region."""
        if self.channel is None:
            return None
        return self.channel + (byte - self.first) // self.bytes_per_channel * self.channels_per_step


@dataclass(frozen=True)
class EntryLayout:
    """One layout of the compressed cache (SPEC §7, §12)."""

    name: str
    head_dim: int  # the head width whose entries it stores (512, or the indexer's 128)
    element: str  # k_cache dtype: "uint8", "bfloat16" or "float8_e4m3fn"
    placement: str  # "paged" (a page's data records, then its scale records), "interleaved" or "rows"
    data_bytes: int  # bytes of one data record (rows: the entry's bytes)
    scale_bytes: int = 0  # bytes of one scale record (rows: 0)
    data_regions: tuple[Region, ...] = ()  # the data record's byte map
    scale_regions: tuple[Region, ...] = ()  # the scale record's byte map
    per_tensor_scale: bool = False  # takes ``fp8_scale``
    hadamard: bool = False  # may apply SPEC §12's rotation

    @property
    def entry_bytes(self) -> int:
        """E: bytes per entry (paged: ``k_cache.shape[2]`` and the entry stride)."""
        return self.data_bytes + self.scale_bytes

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.element]

    @property
    def entry_elements(self) -> int:
        """``k_cache.shape[2]``: E bytes (paged) or ``head_dim`` elements (rows)."""
        return self.entry_bytes // self.element_bytes

    @property
    def records(self) -> bool:
        """``E``-byte data and scale records in uint8 pages (paged or interleaved)."""
        return self.placement != "rows"

    @property
    def interleaved(self) -> bool:
        return self.placement == "interleaved"

    def data_offset(self, offset, entries_per_page: int):
        """Byte of entry ``o``'s data record in its page: ``o * data_bytes`` (paged) or ``o * E``
        (interleaved); ``o`` may be an array."""
        return offset * (self.entry_bytes if self.interleaved else self.data_bytes)

    def scale_offset(self, offset, entries_per_page: int):
        """Byte of entry ``o``'s scale record in its page: ``B * data_bytes + o * scale_bytes``
        (paged) or ``o * E + data_bytes`` (interleaved)."""
        if self.interleaved:
            return offset * self.entry_bytes + self.data_bytes
        return entries_per_page * self.data_bytes + offset * self.scale_bytes

    def locate_in_page(self, byte: int, entries_per_page: int) -> tuple[int, Region] | None:
        """``(o, region)`` of byte ``byte`` of a page of a record layout, or None past the
        ``B`` entries (the page's padding)."""
        if byte >= entries_per_page * self.entry_bytes:
            return None
        data_end = entries_per_page * self.data_bytes
        if self.interleaved:
            offset, in_entry = divmod(byte, self.entry_bytes)
            in_data = in_entry < self.data_bytes
            in_record = in_entry if in_data else in_entry - self.data_bytes
        else:
            in_data = byte < data_end
            offset, in_record = divmod(byte, self.data_bytes) if in_data else \
                divmod(byte - data_end, self.scale_bytes)
        regions = self.data_regions if in_data else self.scale_regions
        region = next(r for r in regions if r.first <= in_record < r.first + r.size)
        return offset, Region(region.name, in_record, 1, region.channel_of(in_record))

    def region_of_channel(self, channel: int) -> str:
        """The region a channel of a ``rows`` entry belongs to."""
        return "NoPE" if channel < NOPE_DIM else "RoPE"


FLASHMLA_FP8 = EntryLayout(
    "flashmla_fp8", HEAD_DIM, "uint8", "paged", DATA_RECORD_BYTES, SCALE_RECORD_BYTES,
    data_regions=(Region("NoPE", 0, NOPE_DIM, 0), Region("RoPE", NOPE_DIM, DATA_RECORD_BYTES - NOPE_DIM, NOPE_DIM, 2)),
    scale_regions=(Region("scale", 0, NUM_QUANT_BLOCKS, 0), Region("pad", NUM_QUANT_BLOCKS, 1)),
)  # 576 + 8 = 584
BF16 = EntryLayout("bf16", HEAD_DIM, "bfloat16", "rows", 2 * HEAD_DIM)
FP8_PER_TENSOR = EntryLayout("fp8_per_tensor", HEAD_DIM, "float8_e4m3fn", "rows", HEAD_DIM, per_tensor_scale=True)
INDEXER_FP8 = EntryLayout(
    "indexer_fp8", INDEXER_HEAD_DIM, "uint8", "paged", INDEXER_FP8_DATA_BYTES, INDEXER_FP8_SCALE_BYTES,
    data_regions=(Region("data", 0, INDEXER_FP8_DATA_BYTES, 0),),
    scale_regions=(Region("scale", 0, INDEXER_FP8_SCALE_BYTES),), hadamard=True,
)  # 128 + 4 = 132
INDEXER_MXFP4 = EntryLayout(
    "indexer_mxfp4", INDEXER_HEAD_DIM, "uint8", "paged", INDEXER_MXFP4_DATA_BYTES, INDEXER_MXFP4_SCALE_BYTES,
    data_regions=(Region("data", 0, INDEXER_MXFP4_DATA_BYTES, 0, 1, 2),),
    scale_regions=(Region("scale", 0, INDEXER_MXFP4_SCALE_BYTES, 0),), hadamard=True,
)  # 64 + 4 = 68; scale byte g is block g (channels 32g..32g+31)

V41_MXFP8 = EntryLayout(
    "v41_mxfp8", HEAD_DIM, "uint8", "interleaved", HEAD_DIM, MXFP8_BLOCKS,
    data_regions=(Region("data", 0, HEAD_DIM, 0),), scale_regions=(Region("scale", 0, MXFP8_BLOCKS, 0),),
)  # 512 + 16 = 528: E4M3 codes of the 512 channels, then a UE8M0 byte per 32-channel block
V41_NVFP4 = EntryLayout(
    "v41_nvfp4", HEAD_DIM, "uint8", "interleaved", HEAD_DIM // 2, NVFP4_TILES,
    data_regions=(Region("data", 0, HEAD_DIM // 2, 0, 1, 2),), scale_regions=(Region("scale", 0, NVFP4_TILES, 0),),
)  # 256 + 32 = 288: packed E2M1 codes, then an E4M3 scale per 16-channel tile

ENTRY_LAYOUTS = {layout.name: layout for layout in (FLASHMLA_FP8, BF16, FP8_PER_TENSOR, INDEXER_FP8, INDEXER_MXFP4)}
PAGED_LAYOUTS = {name: layout for name, layout in ENTRY_LAYOUTS.items() if layout.placement == "paged"}
V41_RECORD_LAYOUTS = {layout.name: layout for layout in (V41_MXFP8, V41_NVFP4)}
RECORD_LAYOUTS = {**PAGED_LAYOUTS, **V41_RECORD_LAYOUTS}  # every layout of E-byte records in a uint8 cache


def layouts_for_head(head_dim: int) -> tuple[str, ...]:
    """The names of the layouts that store entries of head width ``head_dim``, in SPEC order."""
    return tuple(name for name, layout in ENTRY_LAYOUTS.items() if layout.head_dim == head_dim)


LAYOUTS = layouts_for_head(HEAD_DIM)  # the 512-wide head's layouts (SPEC §7)
INDEXER_LAYOUTS = layouts_for_head(INDEXER_HEAD_DIM)  # the indexer's (SPEC §12)
V41_STORE_LAYOUTS = (*LAYOUTS, *V41_RECORD_LAYOUTS)  # v41_rope_quant_store (SPEC §14.5)
V41_INDEX_KEY_LAYOUTS = INDEXER_LAYOUTS  # v41_index_key_store: SPEC §12's two records
