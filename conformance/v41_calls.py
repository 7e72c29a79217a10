"""One DeepSeek-V4.1 call (SPEC §14.7) on fresh copies of a scenario's buffers, for the spec or an
implementation: the arguments in the spec's order (positional, then the keyword-only ones), and
the allocations the call may write.

Ratio 1 passes ``None`` for every state argument and no ``ring_capacity``; ratio 2 passes
``ring_capacity`` (``None`` for a paged state). ``fp8_scale`` is passed where the layout has one.
Shared projections are two views (``[:, :512]`` and ``[:, 512:]``) of one ``[T, 1024]``
allocation, as an engine passes its fused projection output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import HostArrays, TorchArrays
from .v41_scenarios import V41Inputs

WRITTEN = ("latent", "state_cache", "k_cache")  # the allocations compared after a call (an input latent too)
STATE_ARGUMENTS = ("token_to_req", "query_start_loc", "slot_mapping", "save_slot_mapping", "block_table", "bs",
                   "state_cache")


@dataclass
class V41Call:
    """An operation's arguments and the allocations behind the buffers it may write."""

    operation: str  # v41_<operation>
    positional: list
    keywords: dict
    owners: dict  # name -> allocation (uint8 NumPy array or torch tensor) of latent / state_cache / k_cache

    def run(self, target) -> None:
        getattr(target, f"v41_{self.operation}")(*self.positional, **self.keywords)


def _compress_arguments(inputs: V41Inputs, convert, allocated: dict, projections) -> list:
    s, t = inputs.step, inputs.tables
    if projections is not None:
        kv, score = projections[:, :512], projections[:, 512:]
    else:
        kv = convert(inputs.kv)
        score = convert(inputs.score) if inputs.score is not None else None
    if inputs.compress_ratio == 1:
        state = [None] * len(STATE_ARGUMENTS)
        score = None
    else:
        state = [convert(s.token_to_req), convert(s.query_start_loc), convert(s.slot_mapping),
                 convert(s.save_slot_mapping), convert(t.block_table), t.state.block_size, allocated["state_cache"]]
    return [kv, score, convert(s.positions), *state]


def v41_call(inputs: V41Inputs, arrays: HostArrays | TorchArrays) -> V41Call:
    """The scenario's call on fresh copies of its buffers, as ``arrays`` holds them."""
    s = inputs.step
    convert = arrays.convert
    owners, allocated = {}, {}
    for name in WRITTEN:
        buffer = getattr(inputs, name)
        if buffer is not None:
            owners[name], allocated[name] = arrays.allocate(buffer)
    projections = arrays.allocate(inputs.projections)[1] if inputs.projections is not None else None
    ratio = inputs.compress_ratio
    keywords = {"compress_ratio": ratio}
    if inputs.layout is not None and inputs.operation != "compress_norm":
        keywords["layout"] = inputs.layout
    if inputs.fp8_scale is not None:
        keywords["fp8_scale"] = inputs.fp8_scale
    weight, eps = convert(inputs.rms_norm_weight), inputs.rms_norm_eps
    kv_slots, cos_sin = convert(s.kv_slot_mapping), convert(inputs.cos_sin_cache)
    op = inputs.operation
    if op in ("compress_norm", "compress_norm_rope_store") and ratio == 2:
        keywords["ring_capacity"] = inputs.ring_capacity
    if op == "compress_norm":
        positional = [*_compress_arguments(inputs, convert, allocated, projections), weight, eps, kv_slots,
                      allocated["latent"]]
    elif op == "compress_norm_rope_store":
        positional = [*_compress_arguments(inputs, convert, allocated, projections), weight, eps, cos_sin,
                      allocated["k_cache"], kv_slots, allocated.get("latent")]
    elif op == "rope_quant_store":
        positional = [allocated["latent"], convert(s.positions), kv_slots, cos_sin, allocated["k_cache"]]
    elif op == "index_key_store":
        positional = [convert(inputs.k_pre), convert(s.positions), kv_slots, weight, eps, cos_sin, allocated["k_cache"]]
    else:
        raise ValueError(f"operation: expected compress_norm, rope_quant_store, compress_norm_rope_store or "
                         f"index_key_store, got {op!r}")
    return V41Call(op, positional, keywords, owners)


def host_bytes(call: V41Call, arrays: HostArrays | TorchArrays) -> dict[str, np.ndarray]:
    """The call's allocations as host bytes (uint8), by name."""
    return {name: arrays.host_bytes(owner) for name, owner in call.owners.items()}


def spec_bytes(inputs: V41Inputs) -> dict[str, np.ndarray]:
    """The spec's bytes of every allocation after the scenario's call (``debug=True``: a scenario
    that breaks a contract shows as an error here)."""
    from .. import spec

    arrays = HostArrays()
    call = v41_call(inputs, arrays)
    getattr(spec, f"v41_{call.operation}")(*call.positional, **call.keywords, debug=True)
    return host_bytes(call, arrays)
