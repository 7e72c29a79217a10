"""What an implementation declares it handles (SPEC §10's "unsupported" verdict).

An implementation puts a :class:`Capabilities` next to its operations as ``CAPABILITIES``;
scenarios outside it are reported *unsupported* and the implementation is not called. An
implementation without a declaration is assumed to handle every valid call (its
``SUPPORTED_DEVICES``, default ``("cuda",)``, still names its devices)::

    CAPABILITIES = Capabilities(devices=("cuda",), layouts=("flashmla_fp8",),
                                block_sizes={128: (8,)}, state_stride_multiple=16)

``arrays`` says what the operations take: ``"torch"`` tensors (the default) or ``"numpy"``
arrays as the spec takes them (bf16 as ``uint16`` bit patterns, E4M3 as ``uint8``); a NumPy
implementation runs on ``"cpu"`` and the suite never imports torch for it.

SPEC §13's state formats are declared by four fields whose defaults are what every kernel
handled before §13 (an fp32 paged state with ``ape`` added at the save, the two calls only)::

    CAPABILITIES = Capabilities(state_dtypes=("fp32", "bf16"), ape_at=("save", "compress"),
                                ring_addressing=True, step_call=True)

A scenario using an option outside the declaration is unsupported and not called; one inside
it is called with the option's keywords (``ape_at=``, ``ring_capacity=``, ``ape=`` on the
compress) or, for ``step_call``, through ``compress_and_save``. Declaring is all a kernel that
adds an option has to change.

DeepSeek-V4.1's operations (SPEC §14) are declared by ``v41=V41Capabilities(...)`` (``None``:
not offered); ``v4=False`` says an implementation has V4.1's operations alone::

    CAPABILITIES = Capabilities(devices=("cuda",), v4=False, v41=V41Capabilities(state_dtypes=("fp32",)))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..spec.entry_layout import V41_INDEX_KEY_LAYOUTS, V41_STORE_LAYOUTS, layouts_for_head
from ..spec.state_format import APE_AT, STATE_DTYPES

ARRAY_KINDS = ("torch", "numpy")
V41_OPERATIONS = ("compress_norm", "rope_quant_store", "compress_norm_rope_store", "index_key_store")  # v41_<name>
V41_INPUT_DTYPES = ("fp32", "bf16")  # kv and score (SPEC §14.2)


@dataclass(frozen=True)
class V41Features:
    """What a DeepSeek-V4.1 scenario (SPEC §14) asks of an implementation."""

    operation: str  # one of V41_OPERATIONS
    compress_ratio: int  # 1 or 2
    layout: str | None  # the record's layout; None for compress_norm
    entries_per_page: int | None  # k_cache.shape[1]; None for compress_norm
    input_dtypes: tuple[str, ...] = ()  # of kv and score: "fp32" / "bf16" (empty: no projections)
    state_dtype: str | None = None  # ratio 2: "fp32" or "bf16"
    ring_capacity: int | None = None  # ratio 2: C of a ring, None for a paged state
    block_size: int | None = None  # ratio 2: bs
    tail_saves: bool = True  # ratio 2: only each chunk's last C tokens are saved (a ring's saves)
    separate_projections: bool = False  # kv and score in two allocations, not two views of one [T, 1024]
    latent: str = "none"  # "written" (an output), "input" (v41_rope_quant_store reads it) or "none"
    latent_row_pad: bool = False  # the latent's rows are padded (row stride above 512 elements)


@dataclass(frozen=True)
class V41Capabilities:
    """A declaration of the DeepSeek-V4.1 calls (SPEC §14) an implementation handles.

    ``Capabilities(v41=V41Capabilities(...))`` declares V4.1; the defaults are every valid call.
    """

    operations: tuple[str, ...] = V41_OPERATIONS
    ratios: tuple[int, ...] = (1, 2)
    layouts: tuple[str, ...] | None = None  # None: every record of SPEC §14.5 and §14.6
    entries_per_page: tuple[int, ...] | None = None  # None: any B
    input_dtypes: tuple[str, ...] = V41_INPUT_DTYPES  # kv and score: "fp32", "bf16"
    state_dtypes: tuple[str, ...] = STATE_DTYPES  # ratio 2's state_cache: "fp32", "bf16"
    paged_state: bool = True  # ratio 2 without ring_capacity
    ring_state: bool = True  # ratio 2 with ring_capacity=C
    ring_in_one_block: bool = False  # rings only where bs == C (one block per request)
    tail_saves_only: bool = False  # save_slot_mapping only ever names each chunk's last C tokens
    separate_projections: bool = True  # kv and score may be two allocations (else views of one [T, 1024])
    latent_row_pad: bool = True  # latent rows may be padded (a row stride above 512 elements)

    def __post_init__(self):
        for name, allowed in (("operations", V41_OPERATIONS), ("ratios", (1, 2)), ("input_dtypes", V41_INPUT_DTYPES),
                              ("state_dtypes", STATE_DTYPES)):
            values = tuple(getattr(self, name))
            if not values or set(values) - set(allowed):
                raise ValueError(f"V41Capabilities.{name}: expected a non-empty tuple of {allowed}, got {values!r}")
            object.__setattr__(self, name, values)
        known = V41_STORE_LAYOUTS + V41_INDEX_KEY_LAYOUTS
        if self.layouts is not None and (not self.layouts or set(self.layouts) - set(known)):
            raise ValueError(f"V41Capabilities.layouts: expected None or a tuple of {known}, got {self.layouts!r}")

    def unsupported(self, f: V41Features) -> str | None:
        """Why a V4.1 scenario with features ``f`` lies outside this declaration, or ``None``."""
        checks = [
            (f.operation in self.operations, f"v41_{f.operation} (declared {self.operations})"),
            (f.compress_ratio in self.ratios, f"compress_ratio {f.compress_ratio} (declared {self.ratios})"),
            (f.layout is None or self.layouts is None or f.layout in self.layouts,
             f"layout {f.layout!r} (declared {self.layouts})"),
            (f.entries_per_page is None or self.entries_per_page is None or f.entries_per_page in self.entries_per_page,
             f"{f.entries_per_page} entries per page (declared {self.entries_per_page})"),
            (set(f.input_dtypes) <= set(self.input_dtypes),
             f"{'/'.join(f.input_dtypes)} kv and score (declared {self.input_dtypes})"),
            (self.latent_row_pad or not f.latent_row_pad, "padded latent rows"),
            (self.separate_projections or not f.separate_projections, "kv and score in separate allocations"),
        ]
        if f.compress_ratio == 2 and f.state_dtype is not None:
            ring = f.ring_capacity is not None
            checks += [
                (f.state_dtype in self.state_dtypes, f"a {f.state_dtype} state_cache (declared {self.state_dtypes})"),
                (self.ring_state or not ring, "a ring state (ring_capacity)"),
                (self.paged_state or ring, "a paged state (no ring_capacity)"),
                (not (ring and self.ring_in_one_block) or f.block_size == f.ring_capacity,
                 f"a ring of {f.ring_capacity} rows in blocks of {f.block_size} (declared bs == ring_capacity only)"),
                (not self.tail_saves_only or f.tail_saves, "saves other than each chunk's last C tokens"),
            ]
        reasons = [text for ok, text in checks if not ok]
        return "; ".join(reasons) if reasons else None


V41_EVERYTHING = V41Capabilities()
"""Every valid DeepSeek-V4.1 call: ``Capabilities(v41=V41_EVERYTHING, ...)``."""


@dataclass(frozen=True)
class Features:
    """What a scenario asks of an implementation (the facts a declaration is checked against)."""

    head_width: int  # 512, or 128 for the indexer compressor (SPEC §12)
    compress_ratio: int  # 4 or 128
    layout: str
    block_size: int  # state rows per block
    entries_per_page: int  # k_cache.shape[1]
    state_strides: tuple[int, int]  # state_cache.stride(0), .stride(1) in floats
    strided_inputs: bool  # some input array is a non-contiguous view
    hadamard: bool = False
    max_position: int = 0
    large_offsets: bool = False  # a cache offset beyond 2^31 bytes
    state_dtype: str = "fp32"  # SPEC §13.1: "fp32" or "bf16"
    ape_at: str = "save"  # SPEC §13.2: "save" or "compress"
    ring_addressing: bool = False  # SPEC §13.3: each request's state is a ring (ring_capacity=C)
    step_call: bool = False  # SPEC §13.4: the step is one compress_and_save call


def _freeze(block_sizes) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    if block_sizes is None:
        return None
    items = block_sizes.items() if isinstance(block_sizes, Mapping) else block_sizes
    return tuple(sorted((int(r), tuple(int(b) for b in sizes)) for r, sizes in items))


@dataclass(frozen=True)
class Capabilities:
    """A declaration of the calls an implementation handles; ``None`` means "any"."""

    devices: tuple[str, ...] = ("cuda",)
    head_widths: tuple[int, ...] = (512,)
    ratios: tuple[int, ...] = (4, 128)
    layouts: tuple[str, ...] | None = None  # None: every layout of the declared head widths
    block_sizes: Mapping[int, tuple[int, ...]] | tuple | None = None  # per ratio, e.g. {128: (8,)}
    entries_per_page: tuple[int, ...] | None = None
    state_stride_multiple: int = 4  # 4-byte units (floats of an fp32 state); SPEC §3 allows any multiple of 4
    strided_inputs: bool = True  # accepts non-contiguous views of the input arrays
    hadamard: bool = True  # the §12 rotation (head width 128 only)
    max_position: int | None = None  # the largest position handled
    large_offsets: bool = True  # cache offsets beyond 2^31 bytes
    arrays: str = "torch"  # what the operations take: "torch" tensors or "numpy" arrays (cpu only)
    state_dtypes: tuple[str, ...] = ("fp32",)  # SPEC §13.1: state_cache dtypes, "fp32" and/or "bf16"
    ape_at: tuple[str, ...] = ("save",)  # SPEC §13.2: where ape may be added, "save" and/or "compress"
    ring_addressing: bool = False  # SPEC §13.3: ring_capacity=C (a ring of C rows per request)
    step_call: bool = False  # SPEC §13.4: offers compress_and_save
    v41: V41Capabilities | None = None  # SPEC §14: DeepSeek-V4.1's operations (None: not offered)
    v4: bool = True  # SPEC §1-§13: DeepSeek-V4's operations (False: an implementation of V4.1 alone)
    notes: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "block_sizes", _freeze(self.block_sizes))
        for name, allowed in (("state_dtypes", STATE_DTYPES), ("ape_at", APE_AT)):
            values = (getattr(self, name),) if isinstance(getattr(self, name), str) else tuple(getattr(self, name))
            if not values or set(values) - set(allowed):
                raise ValueError(f"Capabilities.{name}: expected a non-empty tuple of {allowed}, "
                                 f"got {getattr(self, name)!r}")
            object.__setattr__(self, name, values)
        if self.arrays not in ARRAY_KINDS:
            raise ValueError(f"Capabilities.arrays: expected one of {ARRAY_KINDS}, got {self.arrays!r}")
        if self.arrays == "numpy" and self.devices == ("cuda",):  # the default devices: NumPy runs on the host
            object.__setattr__(self, "devices", ("cpu",))
        if self.arrays == "numpy" and set(self.devices) - {"cpu"}:
            raise ValueError(f"Capabilities.devices: expected ('cpu',) for NumPy arrays, got {self.devices}")

    def unsupported_v41(self, f: V41Features) -> str | None:
        """Why a DeepSeek-V4.1 scenario lies outside this declaration, or ``None``."""
        if self.v41 is None:
            return "DeepSeek-V4.1's operations (SPEC §14; not declared)"
        return self.v41.unsupported(f)

    def unsupported(self, f: Features) -> str | None:
        """Why a scenario with features ``f`` lies outside this declaration, or ``None``."""
        if not self.v4:
            return "DeepSeek-V4's operations (SPEC §1-§13; declared V4.1 only)"
        layouts = self.layouts
        if layouts is None:
            layouts = tuple(l for w in self.head_widths for l in layouts_for_head(w))
        block_sizes = dict(self.block_sizes or ())
        checks = (
            (f.head_width in self.head_widths, f"head width {f.head_width} (declared {self.head_widths})"),
            (f.compress_ratio in self.ratios, f"compress_ratio {f.compress_ratio} (declared {self.ratios})"),
            (f.layout in layouts, f"layout {f.layout!r} (declared {layouts})"),
            (f.compress_ratio not in block_sizes or f.block_size in block_sizes[f.compress_ratio],
             f"block_size {f.block_size} for ratio {f.compress_ratio} (declared {block_sizes.get(f.compress_ratio)})"),
            (self.entries_per_page is None or f.entries_per_page in self.entries_per_page,
             f"{f.entries_per_page} entries per page (declared {self.entries_per_page})"),
            (all(s % self.state_stride_multiple == 0 for s in f.state_strides),
             f"state strides {f.state_strides} floats (declared multiples of {self.state_stride_multiple})"),
            (self.strided_inputs or not f.strided_inputs, "non-contiguous input views"),
            (self.hadamard or not f.hadamard, "the Hadamard rotation"),
            (self.max_position is None or f.max_position <= self.max_position,
             f"position {f.max_position} (declared at most {self.max_position})"),
            (self.large_offsets or not f.large_offsets, "cache offsets beyond 2^31 bytes"),
        )
        reasons = [text for ok, text in checks if not ok]
        state = self.unsupported_state(f.state_dtype, f.ape_at, f.ring_addressing, f.step_call)
        reasons += [state] if state else []
        return "; ".join(reasons) if reasons else None

    def unsupported_state(self, state_dtype: str = "fp32", ape_at: str = "save", ring_addressing: bool = False,
                          step_call: bool = False) -> str | None:
        """Why SPEC §13's options lie outside this declaration, or ``None`` (scenarios and §9
        error cases alike)."""
        checks = (
            (state_dtype in self.state_dtypes, f"a {state_dtype} state_cache (declared {self.state_dtypes}, SPEC §13.1)"),
            (ape_at in self.ape_at, f"ape_at {ape_at!r} (declared {self.ape_at}, SPEC §13.2)"),
            (self.ring_addressing or not ring_addressing, "ring addressing (SPEC §13.3)"),
            (self.step_call or not step_call, "the step call compress_and_save (SPEC §13.4)"),
        )
        reasons = [text for ok, text in checks if not ok]
        return "; ".join(reasons) if reasons else None


ANY = Capabilities(devices=("cpu", "cuda"))

STATE_FORMATS = dict(state_dtypes=STATE_DTYPES, ape_at=APE_AT, ring_addressing=True, step_call=True)
"""Every SPEC §13 option: ``Capabilities(**STATE_FORMATS, ...)`` declares them all."""
