"""Static (compile-time) configurations of DeepSeek-V4.1's CuTe DSL kernels (SPEC §14).

Three kernels, one frozen dataclass each (the key of the compile cache, as :mod:`.config`'s are
for V4's kernels): :class:`V41CompressConfig` (``v41_compress_norm`` and
``v41_compress_norm_rope_store`` in one launch), :class:`V41StoreConfig`
(``v41_rope_quant_store``) and :class:`V41IndexKeyConfig` (``v41_index_key_store``). Their
fields are the options that change a kernel's code, the same ones as the Triton family's
static configurations (``impl/triton/v41_kernels.py``): the ratio, the dtypes of ``kv``,
``score``, the state and the norm weight, a paged state or a ring, whether the latent is
written, the record. Values that only change data (token counts, strides, ``ring_capacity``,
``eps``, ``fp8_scale``) stay dynamic. Each constructor checks its invariants before anything
is traced and raises ``ValueError`` naming the field, what was expected and what was given.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...spec.entry_layout import ENTRY_LAYOUTS, INDEXER_LAYOUTS, V41_RECORD_LAYOUTS, V41_STORE_LAYOUTS, EntryLayout
from .config import LAYOUTS, WEIGHT_DTYPES, EntryFormat, _fail, _flag, _pdl_tag, check_page

PROJECTION_DTYPES = ("float32", "bfloat16")  # kv, score (bf16 converted exactly)
STATE_DTYPES = ("float32", "bfloat16")  # ratio 2's state (SPEC §13.1)
V41_RATIOS = (1, 2)
V41_LAYOUTS = {**ENTRY_LAYOUTS, **V41_RECORD_LAYOUTS}  # every layout a V4.1 kernel writes


def _one_of(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        _fail(name, "one of " + ", ".join(repr(a) for a in allowed), value)


def _short(dtype: str) -> str:
    return "bf16" if dtype == "bfloat16" else "f32"


@dataclass(frozen=True)
class V41RecordFormat:
    """How one rotated entry ``z`` is written (SPEC §14.5): the layout, ``B`` and the byte
    alignment of a thread's 4-channel stores (``bf16``: 8 or 2; ``fp8_per_tensor``: 4 or 1;
    the record layouts: 16, pages being 16-byte aligned)."""

    layout: str  # flashmla_fp8, bf16, fp8_per_tensor, v41_mxfp8 or v41_nvfp4
    entries_per_page: int  # B = k_cache.shape[1]
    store_align: int = 16

    def __post_init__(self):
        _one_of("layout", self.layout, V41_STORE_LAYOUTS)
        check_page(self.entry, self.entries_per_page, self.store_align, self.layout)

    @property
    def entry(self) -> EntryLayout:
        """The layout's descriptor (``spec.entry_layout``)."""
        return V41_LAYOUTS[self.layout]

    @property
    def is_v4_record(self) -> bool:
        """One of SPEC §7's three records, written by V4's store stages."""
        return self.layout in LAYOUTS

    @property
    def v4_entry(self) -> EntryFormat:
        """The V4 entry format of a §7 record, for :mod:`.stages.postprocess`' addresses and stores
        (which read its layout, ``B`` and alignment; its weight dtype is not read by the stores)."""
        return EntryFormat(self.layout, self.entries_per_page, "float32", self.store_align)

    @property
    def tag(self) -> str:
        return f"{self.layout}_B{self.entries_per_page}_a{self.store_align}"


@dataclass(frozen=True)
class V41CompressConfig:
    """The kernel of ``v41_compress_norm`` and ``v41_compress_norm_rope_store`` (one launch):
    128 threads per token, ``tokens_per_cta`` tokens per CTA.

    Ratio 1 reads ``kv`` alone (``score_dtype``, ``state_dtype`` and ``block_size`` are
    ``None``, ``ring`` False); ratio 2 its two rows from the chunk or the state, and saves
    after the compress. ``record=None`` writes the latent only (``v41_compress_norm``)."""

    ratio: int  # 1 or 2
    kv_dtype: str  # "float32" | "bfloat16"
    weight_dtype: str  # rms_norm_weight: "float32" | "bfloat16"
    latent: bool  # write the latent
    record: V41RecordFormat | None  # None: no store
    score_dtype: str | None = None  # ratio 2
    state_dtype: str | None = None  # ratio 2 (SPEC §13.1)
    block_size: int | None = None  # ratio 2: bs, rows per state block
    ring: bool = False  # ratio 2: a ring of ring_capacity rows per request (SPEC §13.3), else paged
    tokens_per_cta: int = 1  # 1, 2 or 4
    pdl: bool = False  # programmatic dependent launch (see .stages.dependent_launch)
    ctas_per_sm: int | None = None  # .minnctapersm: CTAs an SM must hold at once (caps registers), or None

    def __post_init__(self):
        _one_of("compress_ratio", self.ratio, V41_RATIOS)
        if self.ctas_per_sm is not None and (isinstance(self.ctas_per_sm, bool) or self.ctas_per_sm not in range(1, 17)):
            _fail("ctas_per_sm", "None or an integer from 1 to 16", self.ctas_per_sm)
        _one_of("kv dtype", self.kv_dtype, PROJECTION_DTYPES)
        _one_of("rms_norm_weight dtype", self.weight_dtype, WEIGHT_DTYPES)
        for name in ("latent", "ring", "pdl"):
            _flag(name, getattr(self, name))
        if self.record is not None and not isinstance(self.record, V41RecordFormat):
            _fail("record", "a V41RecordFormat or None", self.record)
        if not self.latent and self.record is None:
            _fail("latent, record", "a latent or a record (a call that writes something)", "neither")
        _one_of("tokens_per_cta", self.tokens_per_cta, (1, 2, 4))
        if self.ratio == 1:
            for name in ("score_dtype", "state_dtype", "block_size"):
                if getattr(self, name) is not None:
                    _fail(name, "None for compress_ratio 1 (no score, no state)", getattr(self, name))
            if self.ring:
                _fail("ring", "False for compress_ratio 1 (no state)", self.ring)
        else:
            _one_of("score dtype", self.score_dtype, PROJECTION_DTYPES)
            _one_of("state_cache dtype", self.state_dtype, STATE_DTYPES)
            if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 1:
                _fail("block_size", "an integer >= 1 for compress_ratio 2", self.block_size)

    @property
    def tag(self) -> str:
        inputs = f"kv{_short(self.kv_dtype)}"
        if self.ratio == 2:
            addressing = "ring" if self.ring else "paged"
            inputs += (f"_score{_short(self.score_dtype)}_state{_short(self.state_dtype)}_{addressing}"
                       f"_bs{self.block_size}")
        store = self.record.tag if self.record is not None else "nostore"
        return (f"v41_compress_r{self.ratio}_{inputs}_w{_short(self.weight_dtype)}"
                f"_{'latent' if self.latent else 'nolatent'}_{store}_tpc{self.tokens_per_cta}{_pdl_tag(self.pdl)}"
                f"{'' if self.ctas_per_sm is None else f'_occ{self.ctas_per_sm}'}")


@dataclass(frozen=True)
class V41StoreConfig:
    """The kernel of ``v41_rope_quant_store`` (SPEC §14.4-§14.5): 128 threads per token."""

    ratio: int  # 1 or 2
    record: V41RecordFormat
    tokens_per_cta: int = 1  # 1, 2 or 4
    pdl: bool = False

    def __post_init__(self):
        _one_of("compress_ratio", self.ratio, V41_RATIOS)
        if not isinstance(self.record, V41RecordFormat):
            _fail("record", "a V41RecordFormat", self.record)
        _one_of("tokens_per_cta", self.tokens_per_cta, (1, 2, 4))
        _flag("pdl", self.pdl)

    @property
    def tag(self) -> str:
        return f"v41_store_r{self.ratio}_{self.record.tag}_tpc{self.tokens_per_cta}{_pdl_tag(self.pdl)}"


@dataclass(frozen=True)
class V41IndexKeyConfig:
    """The kernel of ``v41_index_key_store`` (SPEC §14.6): one warp per token, ``warps`` tokens
    per CTA; §12's records, no Hadamard rotation."""

    ratio: int  # 1 or 2
    layout: str  # "indexer_fp8" | "indexer_mxfp4"
    entries_per_page: int  # B = k_cache.shape[1]
    weight_dtype: str  # "float32" | "bfloat16"
    warps: int = 4  # tokens per CTA: 1, 2, 4 or 8
    pdl: bool = False

    hadamard = False  # V4.1's key has no rotation (read by the shared finishing warp's helpers)

    def __post_init__(self):
        _one_of("compress_ratio", self.ratio, V41_RATIOS)
        _one_of("layout", self.layout, INDEXER_LAYOUTS)
        if not isinstance(self.entries_per_page, int) or isinstance(self.entries_per_page, bool) \
                or self.entries_per_page < 1:
            _fail("entries_per_page (k_cache.shape[1])", "an integer >= 1", self.entries_per_page)
        _one_of("rms_norm_weight dtype", self.weight_dtype, WEIGHT_DTYPES)
        _one_of("warps", self.warps, (1, 2, 4, 8))
        _flag("pdl", self.pdl)

    @property
    def data_record_bytes(self) -> int:
        """The data record's bytes (read by the shared finishing warp's helpers)."""
        return ENTRY_LAYOUTS[self.layout].data_bytes

    @property
    def tag(self) -> str:
        return (f"v41_index_key_r{self.ratio}_{self.layout}_B{self.entries_per_page}_w{_short(self.weight_dtype)}"
                f"_warps{self.warps}{_pdl_tag(self.pdl)}")


__all__ = ["PROJECTION_DTYPES", "STATE_DTYPES", "V41_LAYOUTS", "V41CompressConfig", "V41IndexKeyConfig",
           "V41RecordFormat", "V41StoreConfig"]
