"""Static configuration of the indexer compressor's kernel (SPEC §12, head width 128).

Like :mod:`.config`, a frozen dataclass holds everything that changes the kernel's code, so
it is also the compile-cache key; the constructor checks its invariants and raises
``ValueError`` naming the knob, what was expected and what was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ...spec.constants import INDEXER_FP8, INDEXER_HEAD_DIM, INDEXER_LAYOUTS, INDEXER_MXFP4
from ...spec.constants import INDEXER_ROPE_START as INDEXER_ROPE_FIRST  # RoPE on channels 64..127
from .config import WEIGHT_DTYPES, _fail, _flag, _pdl_tag, _power_of_two

ENTRY_LAYOUTS = {layout.name: layout for layout in (INDEXER_FP8, INDEXER_MXFP4)}  # E = 132 / 68


@dataclass(frozen=True)
class IndexerConfig:
    """One ``compress_norm_rope_store`` kernel of the indexer compressor.

    C4: one warp per token (lane ``l`` owns channels ``4l..4l+3``), ``warps`` tokens per CTA.
    C128: one CTA of ``warps`` warps per token; warp ``w`` pools window rows
    ``w*R .. w*R+R-1`` (``R = 128 / warps``), warp 0 finishes the entry.
    """

    ratio: int  # 4 or 128
    block_size: int  # bs, rows per state block (any >= 1)
    layout: str  # "indexer_fp8" | "indexer_mxfp4"
    hadamard: bool  # the optional Hadamard rotation before quantization
    entries_per_page: int  # B = k_cache.shape[1]
    weight_dtype: str  # rms_norm_weight dtype: "float32" | "bfloat16"
    warps: int = 4  # C4: tokens per CTA (1, 2, 4, 8); C128: warps per token (8, 16: 256 threads sum the partials)
    pdl: bool = False  # programmatic dependent launch (see :mod:`.dependent_launch`)

    def __post_init__(self):
        if self.ratio not in (4, 128):
            _fail("compress_ratio", "4 or 128", self.ratio)
        if not isinstance(self.block_size, int) or self.block_size < 1:
            _fail("block_size", "an integer >= 1", self.block_size)
        if self.layout not in INDEXER_LAYOUTS:
            _fail("layout", "one of " + ", ".join(INDEXER_LAYOUTS), self.layout)
        _flag("hadamard", self.hadamard)
        if not isinstance(self.entries_per_page, int) or self.entries_per_page < 1:
            _fail("entries_per_page (k_cache.shape[1])", "an integer >= 1", self.entries_per_page)
        if self.weight_dtype not in WEIGHT_DTYPES:
            _fail("rms_norm_weight dtype", " or ".join(WEIGHT_DTYPES), self.weight_dtype)
        _power_of_two("warps", self.warps, (1, 2, 4, 8) if self.ratio == 4 else (8, 16))
        _flag("pdl", self.pdl)

    @property
    def state_width(self) -> int:
        """SW: 256 (C4, two halves) or 128 (C128); a state row holds ``2*SW`` floats."""
        return (2 if self.ratio == 4 else 1) * INDEXER_HEAD_DIM

    @property
    def data_record_bytes(self) -> int:
        return ENTRY_LAYOUTS[self.layout].data_bytes

    @property
    def entry_bytes(self) -> int:
        """E: 132 (indexer_fp8) or 68 (indexer_mxfp4)."""
        return ENTRY_LAYOUTS[self.layout].entry_bytes

    @property
    def rows_per_warp(self) -> int:
        """Window rows a warp pools: 8 (C4: the whole window) or ``128 / warps`` (C128)."""
        return 8 if self.ratio == 4 else 128 // self.warps

    @property
    def rows_per_lookup(self) -> int:
        """Window rows that share one block-table lookup: runs of ``gcd(bs, run)`` rows that
        start at a multiple of it (C4: each half is 4 rows from a multiple of 4; C128: a
        warp's rows start at a multiple of ``R``)."""
        return gcd(self.block_size, 4 if self.ratio == 4 else self.rows_per_warp)

    @property
    def tag(self) -> str:
        w = "wbf16" if self.weight_dtype == "bfloat16" else "wf32"
        rotation = "_hadamard" if self.hadamard else ""
        return (f"indexer_c{self.ratio}_{self.layout}{rotation}_bs{self.block_size}_B{self.entries_per_page}_{w}"
                f"_w{self.warps}{_pdl_tag(self.pdl)}")
