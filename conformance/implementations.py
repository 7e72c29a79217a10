"""The implementation protocol and how the suite finds implementations.

An implementation is any object (a module will do) with SPEC §8's two operations taking
torch tensors (or NumPy arrays, when it declares ``Capabilities(arrays="numpy")``) with
vLLM's names and dtypes::

    save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size)
    compress_norm_rope_store(state_cache, token_to_req_indices, positions, slot_mapping,
                             block_table, block_size, rms_norm_weight, rms_norm_eps,
                             cos_sin_cache, k_cache, kv_slot_mapping, *, compress_ratio,
                             layout="flashmla_fp8", fp8_scale=None)

and optionally ``CAPABILITIES``, a :class:`~.capabilities.Capabilities` declaring the
devices, layouts, ratios, block sizes and strides it handles (scenarios outside it are
reported *unsupported*), or the older ``SUPPORTED_DEVICES`` (default ``("cuda",)``). Both
operations write in place and must raise ``ValueError`` (having written nothing) on the
inputs of SPEC §9.

SPEC §13's options, where the declaration names them: a bf16 ``state_cache``; the keywords
``ape_at=`` and ``ring_capacity=`` on both operations and ``ape=`` on the compress (passed only
where a scenario uses them); and, with ``step_call=True``, the step call::

    compress_and_save(kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping,
                      save_slot_mapping, block_table, bs, state_cache, rms_norm_weight,
                      rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, *, compress_ratio,
                      layout, fp8_scale, ape_at, ring_capacity[, hadamard])

DeepSeek-V4.1 (SPEC §14), where an implementation offers it: the four operations of SPEC §14.7
with the spec's argument order, ``v41_compress_norm``, ``v41_rope_quant_store``,
``v41_compress_norm_rope_store`` and ``v41_index_key_store``, declared by
``Capabilities(v41=V41Capabilities(...))``. An implementation of V4.1 alone (no V4 operations)
loads too; without a declaration it is taken to handle every valid V4.1 call, and a call it
answers with ``NotImplementedError`` (having written nothing) is reported unsupported.

Names the suite understands: the built-ins ``spec``, ``torch``, ``triton``, ``cutedsl``;
``module:attribute`` (attribute may be a factory called with no arguments); or a name
registered by another package under the entry-point group ``dsv4_compressor.implementations``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any, Protocol

from ..spec import compress_and_save as spec_compress_and_save
from ..spec import compress_norm_rope_store as spec_compress_norm_rope_store
from ..spec import save_partial_states as spec_save_partial_states
from ..spec import v41_operator
from .capabilities import STATE_FORMATS, V41_EVERYTHING, V41_OPERATIONS, Capabilities

ENTRY_POINT_GROUP = "dsv4_compressor.implementations"
BUILTIN = {
    "spec": "dsv4_compressor.conformance.implementations:SpecImplementation",
    "torch": "dsv4_compressor.conformance.torch_reference:TorchReference",
    "fast-math": "dsv4_compressor.conformance.fast_math:FastMathReference",
    "triton": "dsv4_compressor.impl.triton",
    "cutedsl": "dsv4_compressor.impl.cutedsl",
}


class Implementation(Protocol):
    def save_partial_states(self, kv_score, ape, positions, slot_mapping, state_cache, block_size) -> None: ...

    def compress_norm_rope_store(self, state_cache, token_to_req_indices, positions, slot_mapping, block_table,
                                 block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping,
                                 *, compress_ratio, layout="flashmla_fp8", fp8_scale=None) -> None: ...


class SpecImplementation:
    """The NumPy specification itself: it takes NumPy arrays (bf16 as uint16 bit patterns) and
    makes SPEC §9's checks before writing anything; no torch involved."""

    CAPABILITIES = Capabilities(devices=("cpu",), head_widths=(512, 128), arrays="numpy", v41=V41_EVERYTHING,
                                **STATE_FORMATS)
    name = "spec"
    v41_compress_norm = staticmethod(v41_operator.v41_compress_norm)  # SPEC §14.7, the spec's own signatures
    v41_rope_quant_store = staticmethod(v41_operator.v41_rope_quant_store)
    v41_compress_norm_rope_store = staticmethod(v41_operator.v41_compress_norm_rope_store)
    v41_index_key_store = staticmethod(v41_operator.v41_index_key_store)

    def save_partial_states(self, kv_score, ape, positions, slot_mapping, state_cache, block_size, *, ape_at="save",
                            ring_capacity=None):
        spec_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, ape_at=ape_at,
                                 ring_capacity=ring_capacity)

    def compress_norm_rope_store(self, state_cache, token_to_req_indices, positions, slot_mapping, block_table,
                                 block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping,
                                 *, compress_ratio, layout="flashmla_fp8", fp8_scale=None, hadamard=False, ape=None,
                                 ape_at="save", ring_capacity=None):
        spec_compress_norm_rope_store(
            state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
            rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
            fp8_scale=fp8_scale, hadamard=hadamard, ape=ape, ape_at=ape_at, ring_capacity=ring_capacity,
        )

    def compress_and_save(self, *arrays, **keywords):  # SPEC §13.4; the spec's own signature
        spec_compress_and_save(*arrays, **keywords)


# The project's kernels handle every valid call (general paths behind the fast ones), the
# indexer's head width where their compress call takes ``hadamard``; their devices come from
# their own SUPPORTED_DEVICES. Both run every SPEC §13 option, the step call included, and every
# DeepSeek-V4.1 call (SPEC §14).
BUILTIN_CAPABILITIES = {  # the project's kernels: both run SPEC §13's state formats and its step call
    "triton": Capabilities(state_dtypes=("fp32", "bf16"), ape_at=("save", "compress"), ring_addressing=True,
                           step_call=True, v41=V41_EVERYTHING),
    "cutedsl": Capabilities(state_dtypes=("fp32", "bf16"), ape_at=("save", "compress"), ring_addressing=True,
                            step_call=True, v41=V41_EVERYTHING),
}


@dataclass
class LoadedImplementation:
    name: str
    target: Any  # has the two operations
    devices: tuple[str, ...]
    capabilities: Capabilities | None = None  # None: every valid call on ``devices``
    reference: str = ""  # how to load it again (a worker process does)

    def __post_init__(self):
        if self.capabilities is None:  # the target's own declaration, on the devices given
            declared = getattr(self.target, "CAPABILITIES", None)
            declared = declared if isinstance(declared, Capabilities) else Capabilities()
            self.capabilities = replace(declared, devices=self.devices)

    @property
    def takes_numpy(self) -> bool:
        """The operations take NumPy arrays (no torch needed), not torch tensors."""
        return self.capabilities.arrays == "numpy"

    def device(self) -> str | None:
        """The first supported device present here, or ``None`` (torch is asked only about CUDA)."""
        for device in self.devices:
            if device == "cpu":
                return device
            if device == "cuda" and not self.takes_numpy:
                import torch

                if torch.cuda.is_available():
                    return device
        return None


def takes_keywords(function, *names: str) -> bool:
    """Whether ``function`` takes every keyword of ``names``: each a parameter, or a ``**kwargs``
    that passes them on; False when its signature cannot be read."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return (all(name in parameters for name in names)
            or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()))


def _resolve(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    target = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        target = getattr(target, part)
    if isinstance(target, type) or (callable(target) and not hasattr(target, "compress_norm_rope_store")):
        try:
            target = target()  # a class or a factory
        except TypeError as error:
            raise ValueError(f"--impl {reference}: expected an implementation or a factory taking no arguments ({error})") from None
    return target


_PACKAGE = __name__.rsplit(".", 2)[0]  # dsv4_compressor


def builtin_family(name: str, target) -> str | None:
    """The project's kernel family an implementation is (``"triton"``, ``"cutedsl"``), also when it
    is one of the family's named variants (``impl.cutedsl.variants:nopdl``); ``None`` for others."""
    if name in BUILTIN_CAPABILITIES:
        return name
    module = type(target).__module__
    return next((family for family in BUILTIN_CAPABILITIES if module.startswith(f"{_PACKAGE}.impl.{family}.")), None)


def offers_v41(target) -> tuple[str, ...]:
    """The DeepSeek-V4.1 operations ``target`` has (names of :data:`~.capabilities.V41_OPERATIONS`)."""
    return tuple(op for op in V41_OPERATIONS if callable(getattr(target, f"v41_{op}", None)))


def load_implementation(name: str) -> LoadedImplementation:
    """Find an implementation by built-in name, ``module:attribute`` or entry point."""
    if name in BUILTIN:
        reference = BUILTIN[name]
    elif name.endswith(".py") or "/" in name:
        raise ValueError(f"--impl: expected a built-in name, module:attribute or an entry-point name, got the path {name!r}")
    elif ":" in name or "." in name:
        reference = name
    else:
        found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            known = sorted(set(BUILTIN) | {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})
            raise ValueError(f"--impl: expected one of {known} or module:attribute, got {name!r}")
        reference = found[0].value
    try:
        target = _resolve(reference)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--impl {name}: cannot load {reference!r}: {type(error).__name__}: {error}") from None
    missing = [op for op in ("save_partial_states", "compress_norm_rope_store") if not callable(getattr(target, op, None))]
    v41 = offers_v41(target)
    if missing and not v41:
        raise ValueError(f"--impl {name}: expected an object with save_partial_states and compress_norm_rope_store "
                         f"(or DeepSeek-V4.1's v41_* operations), missing {missing}")
    declared = getattr(target, "CAPABILITIES", None)
    if declared is not None and not isinstance(declared, Capabilities):
        raise ValueError(f"--impl {name}: expected CAPABILITIES to be a dsv4_compressor.conformance.Capabilities, "
                         f"got {type(declared).__name__}")
    if declared is not None and declared.step_call and not callable(getattr(target, "compress_and_save", None)):
        raise ValueError(f"--impl {name}: expected compress_and_save (CAPABILITIES declares step_call=True), missing")
    if declared is not None and declared.v41 is not None:
        undefined = [f"v41_{op}" for op in declared.v41.operations if not callable(getattr(target, f"v41_{op}", None))]
        if undefined:
            raise ValueError(f"--impl {name}: expected {undefined} (CAPABILITIES declares them in v41), missing")
    if declared is None:  # the older declaration: devices only
        devices = tuple(getattr(target, "SUPPORTED_DEVICES", ("cuda",)))
        family = builtin_family(name, target)
        declared = replace(BUILTIN_CAPABILITIES.get(family, Capabilities()), devices=devices)
        if family and takes_keywords(importlib.import_module(f"{_PACKAGE}.impl.{family}").compress_norm_rope_store,
                                     "hadamard"):  # with SPEC §12
            declared = replace(declared, head_widths=(512, 128))
        if declared.v41 is not None and not v41:  # a family's object without the V4.1 operations (a variant)
            declared = replace(declared, v41=None)
        if v41 and declared.v41 is None:  # undeclared V4.1 operations: every valid call of those offered
            declared = replace(declared, v41=replace(V41_EVERYTHING, operations=v41))
    if missing:  # V4.1 alone
        declared = replace(declared, v4=False)
    return LoadedImplementation(name=getattr(target, "name", name) if name in ("torch",) else name, target=target,
                                devices=declared.devices, capabilities=declared, reference=name)
