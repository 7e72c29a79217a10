"""Static (compile-time) configurations of the CuTe DSL kernels.

Each frozen dataclass holds everything that changes a kernel's code, so it doubles as the
key of the in-process compile cache (:mod:`.host.compile_cache`). Values that only change data
(token counts, strides, positions, eps) stay dynamic. The constructors check their
invariants in Python, before anything is traced, and raise ``ValueError`` naming the knob,
what was expected and what was given.

Knobs worth sweeping on the GPU are documented on each field; the defaults are the ones
the dispatcher (:mod:`.host.paths`) uses.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from ...spec.constants import DATA_RECORD_BYTES, HEAD_DIM, INDEXER_HEAD_DIM, NOPE_DIM, QUANT_BLOCK, ROPE_DIM
from ...spec.constants import INDEXER_ROPE_START as INDEXER_ROPE_FIRST  # RoPE on channels 64..127
from ...spec.constants import SCALE_RECORD_BYTES
from ...spec.entry_layout import ENTRY_LAYOUTS, INDEXER_LAYOUTS, LAYOUTS, EntryLayout

WEIGHT_DTYPES = ("float32", "bfloat16")
__all__ = ["DATA_RECORD_BYTES", "HEAD_DIM", "INDEXER_HEAD_DIM", "INDEXER_ROPE_FIRST", "NOPE_DIM", "QUANT_BLOCK",
           "ROPE_DIM", "SCALE_RECORD_BYTES", "EntryFormat", "C4Config", "C128PoolConfig", "SplitStoreConfig",
           "FusedClusterConfig", "FusedHandoffConfig", "FusedPipelinedConfig", "SaveConfig", "IndexerConfig",
           "StateFormat", "DEFAULT_STATE"]


def _fail(name: str, expected: str, given) -> None:
    raise ValueError(f"{name}: expected {expected}, got {given!r}")


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        _fail(name, "True or False", value)


def check_page(entry: EntryLayout, entries_per_page, store_align, layout: str) -> None:
    """A store's page: ``entries_per_page`` (k_cache.shape[1]) an integer >= 1, ``store_align`` one
    of the alignments of ``entry`` (the layout's descriptor)."""
    if not isinstance(entries_per_page, int) or isinstance(entries_per_page, bool) or entries_per_page < 1:
        _fail("entries_per_page (k_cache.shape[1])", "an integer >= 1", entries_per_page)
    allowed = store_alignments(entry)
    if store_align not in allowed:
        _fail("store_align", f"one of {allowed} for layout {layout!r}", store_align)


def _state(name: str, value) -> None:
    if not isinstance(value, StateFormat):
        _fail(name, "a StateFormat", value)


def _default_state(name: str, value) -> None:
    if value != DEFAULT_STATE:
        _fail(name, "the default StateFormat() (this kernel reads SPEC §3's state only; the split and pipelined "
              "paths take SPEC §13's formats)", value)


def _float32_state(name: str, value) -> None:
    if value.dtype != "float32":
        _fail(name, "a float32 StateFormat (the pipelined kernel stages rows 16 bytes a lane; the split path "
              "takes a bf16 state)", value)


def _one_token_per_cta(name: str, pool) -> None:
    if pool.token_run != 1:
        _fail(f"{name}.token_run", "1 (runs of tokens are the split compress kernel's; a fused kernel's grid "
              "places its own tokens)", pool.token_run)


def _ratio_and_block_size(ratio, block_size) -> None:
    """``compress_ratio`` 4 or 128 and ``block_size`` (rows per state block) an integer >= 1."""
    if ratio not in (4, 128):
        _fail("compress_ratio", "4 or 128", ratio)
    if not isinstance(block_size, int) or block_size < 1:
        _fail("block_size", "an integer >= 1", block_size)


def _pdl_tag(pdl: bool) -> str:
    return "_pdl" if pdl else ""


TOKEN_RUNS = (1, 2, 4, 8, 16, 32)  # a run's tokens are read by one warp's lanes and ballotted


def _run_tag(token_run: int) -> str:
    return f"_run{token_run}" if token_run > 1 else ""


def _token_run(token_run: int, tokens_per_cta: int) -> None:
    _power_of_two("token_run", token_run, TOKEN_RUNS)
    if token_run > 1 and tokens_per_cta != 1:
        _fail("tokens_per_cta", f"1 with token_run={token_run} (a CTA's one token group walks the run)", tokens_per_cta)


def _power_of_two(name: str, value: int, allowed=None) -> None:
    if not isinstance(value, int) or value < 1 or value & (value - 1):
        _fail(name, "a power of two", value)
    if allowed is not None and value not in allowed:
        _fail(name, f"one of {allowed}", value)


def store_alignments(entry: EntryLayout) -> tuple[int, ...]:
    """The byte alignments a kernel's 4-channel stores may assume for a layout: paged records
    sit in 16-byte aligned pages at multiples of 8 bytes; rows allow any strides, so one
    element, or four when the base and strides allow it."""
    if entry.records:
        return (16,)
    return (entry.element_bytes, 4 * entry.element_bytes)


STATE_DTYPES = ("float32", "bfloat16")  # SPEC §13.1
APE_AT = ("save", "compress")  # SPEC §13.2


@dataclass(frozen=True)
class StateFormat:
    """How a kernel's partial state is kept (SPEC §13), fixed per compile.

    ``dtype``: the state's elements (a bf16 state stores each value rounded once, to nearest
    with ties to even, and pooling widens it exactly); ``ape_at``: ``"save"`` (the state holds
    ``add(score, ape)``) or ``"compress"`` (the state holds the raw score, pooling adds
    ``ape[p mod r]``); ``ring``: a ring of ``ring_capacity`` rows per request (SPEC §13.3; the
    capacity itself is a launch argument); ``rows_from_inputs``: SPEC §13.4's step, the window rows at
    or after the request's chunk start read from this call's ``kv``/``score`` (then ``ape``, the
    ``kv``, ``score`` and ``query_start_loc`` launch arguments follow ``ring_capacity``; a save does
    not read it). The default is SPEC §3-§5's state, and a kernel of the default format compiles
    exactly as it did before SPEC §13: without the launch arguments ``ape`` and ``ring_capacity``.
    """

    dtype: str = "float32"  # "float32" | "bfloat16"
    ape_at: str = "save"  # "save" | "compress"
    ring: bool = False  # position q at ring row q mod C (C = ring_capacity, dynamic)
    rows_from_inputs: bool = False  # SPEC §13.4: rows at positions >= the chunk start from kv/score

    SWEEP = {  # each option alone, and together; the step's rows alone, in a ring, and with every other option
        #        (in both dtypes: the pipelined kernel takes an fp32 state only)
        ("dtype", "ape_at", "ring", "rows_from_inputs"): (
            ("bfloat16", "save", False, False), ("float32", "compress", False, False), ("float32", "save", True, False),
            ("bfloat16", "compress", False, False), ("bfloat16", "compress", True, False),
            ("float32", "save", False, True), ("float32", "save", True, True), ("float32", "compress", True, True),
            ("bfloat16", "compress", True, True)),
    }

    def __post_init__(self):
        if self.dtype not in STATE_DTYPES:
            _fail("state dtype", " or ".join(STATE_DTYPES), self.dtype)
        if self.ape_at not in APE_AT:
            _fail("ape_at", " or ".join(repr(a) for a in APE_AT), self.ape_at)
        _flag("ring", self.ring)
        _flag("rows_from_inputs", self.rows_from_inputs)

    @property
    def is_default(self) -> bool:
        """SPEC §3-§5's format: fp32, ``ape`` added at the save, paged."""
        return self == DEFAULT_STATE

    @property
    def element_bytes(self) -> int:
        return 2 if self.dtype == "bfloat16" else 4

    @property
    def tag(self) -> str:
        """``""`` for the default format (its kernels keep their names), else e.g. ``_sbf16_apec_ring``
        (``_step`` appended with ``rows_from_inputs``)."""
        if self.is_default:
            return ""
        dtype = "_sbf16" if self.dtype == "bfloat16" else "_sf32"
        step = "_step" if self.rows_from_inputs else ""
        return f"{dtype}{'_apec' if self.ape_at == 'compress' else ''}{'_ring' if self.ring else ''}{step}"

    @property
    def stored(self) -> "StateFormat":
        """The format as a save writes it: dtype and ``ape_at`` (a ring and the step's row source
        change where pooling reads, not what a save stores)."""
        return StateFormat(self.dtype, self.ape_at)


DEFAULT_STATE = StateFormat()


@dataclass(frozen=True)
class EntryFormat:
    """How one compressed entry is written (SPEC §6-§7), fixed per compile.

    ``store_align`` is the byte alignment every 4-channel store of the ``bf16`` and
    ``fp8_per_tensor`` layouts may assume (the front end derives it from ``k_cache``'s
    strides and base address, SPEC allows any strides there); ``flashmla_fp8`` records are
    always 16-byte aligned pages plus multiples of 8 bytes.
    """

    layout: str  # "flashmla_fp8" | "bf16" | "fp8_per_tensor"
    entries_per_page: int  # B = k_cache.shape[1]
    weight_dtype: str  # rms_norm_weight dtype: "float32" | "bfloat16"
    store_align: int = 16  # bytes; bf16: 8 or 2, fp8_per_tensor: 4 or 1, flashmla: 16

    SWEEP = {  # values worth compiling (see :mod:`.space`); a layout goes with the alignments it allows
        ("layout", "store_align"): tuple((name, align) for name in LAYOUTS
                                         for align in store_alignments(ENTRY_LAYOUTS[name])),
        "entries_per_page": (1, 7, 64),
        "weight_dtype": WEIGHT_DTYPES,
    }

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            _fail("layout", "one of " + ", ".join(LAYOUTS), self.layout)
        check_page(self.entry, self.entries_per_page, self.store_align, self.layout)
        if self.weight_dtype not in WEIGHT_DTYPES:
            _fail("rms_norm_weight dtype", " or ".join(WEIGHT_DTYPES), self.weight_dtype)

    @property
    def entry(self) -> EntryLayout:
        """The layout's descriptor (SPEC §7): element dtype, entry width, records."""
        return ENTRY_LAYOUTS[self.layout]

    @property
    def cache_elem_bytes(self) -> int:
        return self.entry.element_bytes

    @property
    def tag(self) -> str:
        w = "wbf16" if self.weight_dtype == "bfloat16" else "wf32"
        return f"{self.layout}_B{self.entries_per_page}_{w}_a{self.store_align}"


@dataclass(frozen=True)
class C4Config:
    """C4 fused kernel: pool the 8-row overlapped window, then norm/RoPE/quant/store.

    ``entry=None`` compiles the pooling-only variant that writes ``x`` (``compress``).
    """

    block_size: int  # bs, rows per state block (any >= 1)
    entry: EntryFormat | None  # None: write the fp32 compressed vector instead of the cache
    tokens_per_cta: int = 1  # 1, 2, 4 (128 threads per token)
    pdl: bool = False  # programmatic dependent launch (see :mod:`.stages.dependent_launch`)
    state: StateFormat = DEFAULT_STATE  # SPEC §13 (a non-default one takes ``ape`` and ``ring_capacity``)

    SWEEP = {"block_size": (1, 2, 3, 4, 8, 16), "entry": (None,), "tokens_per_cta": (1, 2, 4), "pdl": (False, True)}

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            _fail("block_size", "an integer >= 1", self.block_size)
        _power_of_two("tokens_per_cta", self.tokens_per_cta, (1, 2, 4, 8))
        _flag("pdl", self.pdl)
        _state("state", self.state)

    @property
    def rows_per_lookup(self) -> int:
        """Window rows that share one block-table lookup: each half (4 rows, starting at a
        multiple of 4) splits into runs of ``gcd(bs, 4)`` rows inside one state block."""
        return math.gcd(self.block_size, 4)

    @property
    def tag(self) -> str:
        out = self.entry.tag if self.entry is not None else "x"
        return f"c4_bs{self.block_size}_{out}_tpc{self.tokens_per_cta}{_pdl_tag(self.pdl)}{self.state.tag}"


@dataclass(frozen=True)
class C128PoolConfig:
    """C128 pooling of one channel tile (split path's compress kernel, and the cluster kernel).

    A CTA has ``warps`` warps; a warp's lanes form ``32 / (tile/4)`` row groups of
    ``tile/4`` lanes, each lane holds 4 channels of ``rows_per_lane`` consecutive window
    rows. ``rows_per_lookup`` rows of a lane share one block-table lookup: ``rows_per_lane``
    is the Block8 kernel (bs a multiple of 8 for the default 8 rows per lane), a divisor of
    ``gcd(bs, rows_per_lane)`` the generic one (1: a lookup per row).
    """

    block_size: int  # bs
    rows_per_lookup: int  # 8 = Block8 (default mapping); gcd(bs, 8) or 1 = generic
    warps: int = 8  # sweep: 4, 8, 16
    tile: int = 64  # channels per CTA; sweep: 64, 32 (split path only)
    kv_in_smem: bool = False  # sweep: stage kv rows in shared memory (cp.async), halving registers
    kv_after_max: bool = False  # sweep: issue the kv loads once the window max is known, so that
    #                             every CTA's scores (which gate the exps) reach HBM's queue first
    pdl: bool = False  # programmatic dependent launch (the split compress kernel, and the cluster
    #                    cluster, handoff and pipelined kernels built around this pooling; see :mod:`.stages.dependent_launch`)
    early_metadata: bool = False  # with pdl (split, cluster and handoff kernels): read the per-token
    #                              metadata, the block table, weights and cos/sin before griddepcontrol.wait;
    #                              the previous kernel must not write them (see :mod:`.stages.dependent_launch`)
    state: StateFormat = DEFAULT_STATE  # SPEC §13: the split compress and pipelined kernels only (a non-default
    #                                     one takes ``ape`` and ``ring_capacity``); a bf16 state keeps kv in registers
    token_run: int = 1  # the split compress kernel only: consecutive tokens per CTA and tile (a power of two
    #                     <= 32), the active ones found by a ballot and pooled one after the other

    SWEEP = {  # lookup runs of every length, each mapping with a run it allows
        ("block_size", "rows_per_lookup"): ((8, 8), (16, 8), (4, 4), (5, 1), (2, 2), (8, 1)),
        ("warps", "tile", "rows_per_lookup"): ((16, 64, 4), (4, 64, 8), (8, 32, 4), (16, 32, 2)),
        "kv_in_smem": (False, True),
        "kv_after_max": (False, True),
        ("pdl", "early_metadata"): ((False, False), (True, False), (True, True)),
        "token_run": (1, 32),
    }

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            _fail("block_size", "an integer >= 1", self.block_size)
        _power_of_two("warps", self.warps, (2, 4, 8, 16))
        _power_of_two("tile", self.tile, (32, 64))
        rpl = self.rows_per_lane
        if rpl < 1 or rpl & (rpl - 1):
            _fail("warps/tile", "a mapping with a power-of-two number (>= 1) of rows per lane", (self.warps, self.tile))
        _power_of_two("rows_per_lookup", self.rows_per_lookup)
        if rpl % self.rows_per_lookup or self.block_size % self.rows_per_lookup:
            _fail("rows_per_lookup", f"a divisor of rows_per_lane ({rpl}) and of block_size ({self.block_size})", self.rows_per_lookup)
        for name in ("kv_in_smem", "kv_after_max", "pdl", "early_metadata"):
            _flag(name, getattr(self, name))
        if self.early_metadata and not self.pdl:
            _fail("early_metadata", "False without pdl (there is no wait to read ahead of)", self.early_metadata)
        _state("state", self.state)
        if self.state.dtype == "bfloat16" and self.kv_in_smem:
            _fail("kv_in_smem", "False with a bf16 state (its rows are 8 bytes a lane: no 16-byte cp.async)",
                  self.kv_in_smem)
        _power_of_two("token_run", self.token_run, TOKEN_RUNS)
        if self.state.rows_from_inputs and self.kv_after_max:
            _fail("kv_after_max", "False with rows_from_inputs (the split kernel reads each row from the chunk or "
                  "the state, kv and score together; the pipelined kernel stages both)", self.kv_after_max)

    @property
    def lanes_per_row_group(self) -> int:
        return self.tile // 4

    @property
    def row_groups_per_warp(self) -> int:
        return 32 // self.lanes_per_row_group

    @property
    def rows_per_lane(self) -> int:
        return 128 // (self.warps * self.row_groups_per_warp)

    @property
    def is_block8(self) -> bool:
        return self.rows_per_lookup == self.rows_per_lane

    @property
    def tag(self) -> str:
        kind = "block8" if self.is_block8 else f"generic{self.rows_per_lookup}"
        staged = "_kvsmem" if self.kv_in_smem else ""
        late = "_kvlate" if self.kv_after_max else ""
        early = "_early" if self.early_metadata else ""
        return (f"c128pool_{kind}_bs{self.block_size}_w{self.warps}_t{self.tile}{staged}{late}{_pdl_tag(self.pdl)}"
                f"{early}{self.state.tag}{_run_tag(self.token_run)}")


@dataclass(frozen=True)
class SplitStoreConfig:
    """C128 split path's store kernel: x scratch -> RMSNorm, RoPE, quant, store."""

    entry: EntryFormat
    tokens_per_cta: int = 1  # 1, 2, 4 (128 threads per token)
    pdl: bool = False  # programmatic dependent launch (see :mod:`.stages.dependent_launch`)
    token_run: int = 1  # consecutive tokens per CTA (one token group), the active ones found by a ballot

    SWEEP = {"tokens_per_cta": (1, 2, 4), "pdl": (False, True), "token_run": (1, 32)}

    def __post_init__(self):
        _power_of_two("tokens_per_cta", self.tokens_per_cta, (1, 2, 4, 8))
        _flag("pdl", self.pdl)
        _token_run(self.token_run, self.tokens_per_cta)

    @property
    def tag(self) -> str:
        return f"split_store_{self.entry.tag}_tpc{self.tokens_per_cta}{_pdl_tag(self.pdl)}{_run_tag(self.token_run)}"


@dataclass(frozen=True)
class FusedClusterConfig:
    """C128 single-launch kernel: one thread-block cluster per token, one CTA per channel tile.

    ``pool.tile`` 64: 8 CTAs, each a quantization block (or the RoPE part); 32: 16 CTAs (a
    non-portable cluster size, which CuTe DSL enables on every kernel), two per block.
    """

    pool: C128PoolConfig  # tile 64 (8-CTA cluster) or 32 (16-CTA cluster)
    entry: EntryFormat

    def __post_init__(self):
        if self.pool.tile not in (32, 64):
            _fail("pool.tile", "64 (8 CTAs per token) or 32 (16 CTAs per token)", self.pool.tile)
        _default_state("pool.state", self.pool.state)
        _one_token_per_cta("pool", self.pool)

    @property
    def cluster_size(self) -> int:
        return HEAD_DIM // self.pool.tile

    @property
    def state(self) -> StateFormat:
        """The state format its pooling reads (``pool.state``)."""
        return self.pool.state

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def tag(self) -> str:
        return f"fused_cluster_{self.pool.tag}_{self.entry.tag}"


def _pool_of_64_channel_ctas(pool: C128PoolConfig, expected: tuple[str, str, str], formats: bool = False) -> None:
    """The pool of a C128 single-launch kernel whose CTAs each take one 64-channel block of a token:
    SPEC §3's state (``formats``: any fp32 state of SPEC §13), ``tile`` 64, 8 warps, the rows staged in
    shared memory (``expected``: what the kernel's messages say it expects of ``tile``, ``warps`` and
    ``kv_in_smem``)."""
    if formats:
        _float32_state("pool.state", pool.state)
    else:
        _default_state("pool.state", pool.state)
    _one_token_per_cta("pool", pool)
    if pool.tile != 64:
        _fail("pool.tile", expected[0], pool.tile)
    if pool.warps != 8:
        _fail("pool.warps", expected[1], pool.warps)
    if not pool.kv_in_smem:
        _fail("pool.kv_in_smem", expected[2], pool.kv_in_smem)


FUSED_HANDOFF_CTAS_PER_SM = 4  # the handoff kernel's occupancy (its .minnctapersm)


@dataclass(frozen=True)
class FusedHandoffConfig(FusedClusterConfig):
    """C128 single-launch kernel without clusters: 8 independent CTAs per token (64-channel
    tiles, 8 warps); the last of them to finish, found by a global atomic counter, reads
    the token's ``x`` back from the scratch and finishes the entry (a warp per 64-channel
    block). Needs ``pool.tile == 64`` and ``pool.warps == 8``.
    """

    def __post_init__(self):
        _pool_of_64_channel_ctas(self.pool, ("64 (the handoff kernel finishes a 64-channel block per warp)",
                                             "8 (one warp per block of the entry when finishing)",
                                             "True (kv in registers does not fit the 64 registers of 4 CTAs per SM)"))

    @property
    def tag(self) -> str:
        return f"fused_handoff_{self.pool.tag}_{self.entry.tag}"


@dataclass(frozen=True)
class FusedPipelinedConfig(FusedClusterConfig):
    """C128 single-launch kernel on a persistent grid of 8-CTA clusters (64-channel tiles, 8
    warps): each cluster walks a contiguous run of the tokens, skips inactive ones for a ballot
    bit and keeps the next active token's rows in flight (``cp.async`` into shared memory)
    while it finishes the current one. Needs ``pool.tile == 64``, ``pool.warps == 8`` and
    ``pool.kv_in_smem`` (both the scores and the kv rows are staged, 16 bytes a lane: any fp32
    state of SPEC §13, the step's chunk rows included; not a bf16 one)."""

    ctas_per_sm: int = 3  # 3 (registers capped at 80) or 2 (128 registers)

    SWEEP = {"ctas_per_sm": (2, 3)}

    def __post_init__(self):
        _pool_of_64_channel_ctas(self.pool, ("64 (8 CTAs per token, one per quantization block)", "8",
                                             "True (the pipelined kernel stages every row in shared memory)"),
                                 formats=True)
        if self.ctas_per_sm not in (1, 2, 3):
            _fail("ctas_per_sm", "1, 2 or 3 (about 72 KiB of shared memory per CTA)", self.ctas_per_sm)

    @property
    def tag(self) -> str:
        return f"fused_pipelined_{self.pool.tag}_{self.entry.tag}_occ{self.ctas_per_sm}"


@dataclass(frozen=True)
class SaveConfig:
    """save_partial_states: copy kv, add ape to the score (SPEC §4)."""

    compress_ratio: int  # 4 or 128
    block_size: int  # bs
    vector_inputs: bool  # kv_score and ape rows 16-byte aligned: 128-bit loads
    tokens_per_cta: int = 1
    pdl: bool = False  # programmatic dependent launch (see :mod:`.stages.dependent_launch`)
    head_dim: int = HEAD_DIM  # 512, or 128 for the indexer compressor (SPEC §12)
    state: StateFormat = DEFAULT_STATE  # SPEC §13.1/§13.2: dtype and ape_at (a ring saves as it is paged)
    split_inputs: bool = False  # SPEC §13.4: kv [T, SW] and score [T, SW] as two tensors (score after the stream)
    token_run: int = 1  # consecutive tokens per CTA (one token group), the saved ones found by a ballot
    inputs_before_wait: bool = False  # the step's save (pdl, split_inputs): inputs read before griddepcontrol.wait

    SWEEP = {
        ("compress_ratio", "block_size"): ((4, 4), (128, 8), (4, 3), (4, 16)),
        "vector_inputs": (False, True),
        "tokens_per_cta": (1, 2, 4),
        "pdl": (False, True),
        "head_dim": (HEAD_DIM, INDEXER_HEAD_DIM),
        "split_inputs": (False, True),
        "token_run": (1, 32),
        "inputs_before_wait": (False, True),
    }

    def __post_init__(self):
        _ratio_and_block_size(self.compress_ratio, self.block_size)
        _power_of_two("tokens_per_cta", self.tokens_per_cta, (1, 2, 4, 8))
        _flag("pdl", self.pdl)
        if self.head_dim not in (HEAD_DIM, 128):
            _fail("head_dim", f"{HEAD_DIM} or 128", self.head_dim)
        _state("state", self.state)
        if self.state.ring:
            _fail("state.ring", "False (the save writes at slot_mapping, which names ring slots already)",
                  self.state.ring)
        if self.state.rows_from_inputs:
            _fail("state.rows_from_inputs", "False (a save writes rows; only pooling reads them from the inputs)",
                  self.state.rows_from_inputs)
        _flag("split_inputs", self.split_inputs)
        _token_run(self.token_run, self.tokens_per_cta)
        _flag("inputs_before_wait", self.inputs_before_wait)
        if self.inputs_before_wait and not (self.pdl and self.split_inputs and self.token_run == 1):
            _fail("inputs_before_wait", "False unless pdl, split_inputs and token_run = 1 (the step call's save, "
                  "whose predecessor is the step's own compress)", self.inputs_before_wait)

    @property
    def state_width(self) -> int:
        """SW = coff * head width: 1024 / 512 (C4 / C128), indexer 256 / 128."""
        return (2 if self.compress_ratio == 4 else 1) * self.head_dim

    @property
    def group_threads(self) -> int:
        """Threads per token: one per 16-byte chunk of a half-row, at most 128."""
        return min(128, self.state_width // 4)

    @property
    def tag(self) -> str:
        v = "v4" if self.vector_inputs else "v1"
        head = "" if self.head_dim == HEAD_DIM else f"_h{self.head_dim}"
        split = "_split" if self.split_inputs else ""
        first = "_readfirst" if self.inputs_before_wait else ""
        return (f"save_r{self.compress_ratio}{head}_bs{self.block_size}_{v}{split}_tpc{self.tokens_per_cta}"
                f"{_pdl_tag(self.pdl)}{first}{self.state.tag}{_run_tag(self.token_run)}")


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
    pdl: bool = False  # programmatic dependent launch (see :mod:`.stages.dependent_launch`)
    state: StateFormat = DEFAULT_STATE  # SPEC §13 (a non-default one takes ``ape`` and ``ring_capacity``)

    SWEEP = {  # lookup runs of 1, 2 and 4 rows (C4) and 1, 4, 8 and 16 (C128), every mapping width
        ("ratio", "block_size", "warps"): ((4, 16, 4), (4, 8, 1), (4, 3, 2), (4, 2, 8), (128, 8, 16), (128, 5, 16),
                                           (128, 4, 8), (128, 16, 8)),
        ("layout", "hadamard"): tuple((layout, h) for layout in INDEXER_LAYOUTS for h in (False, True)),
        "entries_per_page": (1, 3, 64),
        "weight_dtype": WEIGHT_DTYPES,
        "pdl": (False, True),
    }

    def __post_init__(self):
        _ratio_and_block_size(self.ratio, self.block_size)
        if self.layout not in INDEXER_LAYOUTS:
            _fail("layout", "one of " + ", ".join(INDEXER_LAYOUTS), self.layout)
        _flag("hadamard", self.hadamard)
        if not isinstance(self.entries_per_page, int) or self.entries_per_page < 1:
            _fail("entries_per_page (k_cache.shape[1])", "an integer >= 1", self.entries_per_page)
        if self.weight_dtype not in WEIGHT_DTYPES:
            _fail("rms_norm_weight dtype", " or ".join(WEIGHT_DTYPES), self.weight_dtype)
        _power_of_two("warps", self.warps, (1, 2, 4, 8) if self.ratio == 4 else (8, 16))
        _flag("pdl", self.pdl)
        _state("state", self.state)

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
        return math.gcd(self.block_size, 4 if self.ratio == 4 else self.rows_per_warp)

    @property
    def tag(self) -> str:
        w = "wbf16" if self.weight_dtype == "bfloat16" else "wf32"
        rotation = "_hadamard" if self.hadamard else ""
        return (f"indexer_c{self.ratio}_{self.layout}{rotation}_bs{self.block_size}_B{self.entries_per_page}_{w}"
                f"_w{self.warps}{_pdl_tag(self.pdl)}{self.state.tag}")
