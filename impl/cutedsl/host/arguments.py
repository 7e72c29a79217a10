"""One argument record for every compress call, and one plan key for unbound, bound and save calls.

A plan depends only on what SPEC §9 validates (each tensor's dtype, shape, strides, device
and base alignment; the scalars) and on the call's choices (``c128_path``, ``pdl``, the
policy, ``early_metadata``, the workspace's layout). Its key has two parts:

- the *fixed* part: the layer's state cache, norm weight, cos/sin cache and compressed cache,
  and :class:`CompressOptions` — what a bound layer holds (:func:`fixed_key`);
- the *per-token* part: the per-token arrays, the block table and the workspace
  (:func:`token_part`).

An unbound call keys its plan by both parts in one flat tuple (:func:`compress_key`); a
bound layer interns its fixed part once as a small integer and keys by that integer and
the per-token part (:func:`bound_key`). Saves key the same way (:func:`unbound_save_key`,
:func:`save_key`), the combined step call by :func:`step_key`. The keys are plain tuples of
tensor metadata: building one is the whole host cost of a repeated call before its launch,
so a call passes its tensors and options as plain tuples in the records' order, and the
records (:class:`CompressTensors`, :class:`CompressOptions`) are made when a plan is built.
"""

from __future__ import annotations

from typing import NamedTuple

from .policy import Policy


class CompressOptions(NamedTuple):
    """A compress call's scalars and choices: everything but its tensors."""

    block_size: int  # bs
    rms_norm_eps: float  # rounded to binary32 by validation
    compress_ratio: int  # 4 or 128
    layout: str
    fp8_scale: float | None  # fp8_per_tensor only
    hadamard: bool  # SPEC §12's rotation (indexer layouts)
    c128_path: str  # "auto" or a path of paths.C128_PATHS
    pdl: bool  # programmatic dependent launch
    policy: Policy
    early_metadata: bool = False  # with pdl: C128 metadata read before the wait (save_and_compress)
    ape_at: str = "save"  # SPEC §13.2: "save" or "compress" (then the call passes ape)
    ring_capacity: int | None = None  # SPEC §13.3: None paged, C a ring of C rows per request


class CompressTensors(NamedTuple):
    """The nine tensors of a compress call, in the kernels' argument order."""

    state_cache: object  # fp32 [num_state_blocks, bs, 2*SW]
    token_to_req_indices: object  # int32 [T]
    positions: object  # int64 [T]
    slot_mapping: object  # int64 [T]
    block_table: object  # int32 [num_reqs, max_blocks]
    rms_norm_weight: object  # bf16 or fp32 [H]
    cos_sin_cache: object  # fp32 [max_pos, 64]
    k_cache: object  # as the layout says (spec.entry_layout)
    kv_slot_mapping: object  # int64 [T]

    @property
    def metadata(self) -> tuple:
        """The per-token arrays and the block table, as the launches take them."""
        return (self.token_to_req_indices, self.positions, self.slot_mapping, self.block_table, self.kv_slot_mapping)


def tensor_key(tensor) -> tuple:
    """What SPEC §9 looks at in a tensor (AttributeError for a non-tensor)."""
    return (tensor.dtype, tensor.shape, tensor.stride(), tensor.device, tensor.data_ptr() & 15)


def _scalar_types(options: tuple) -> tuple:
    """The Python types of the scalars a value comparison cannot tell apart (8 and 8.0, True and 1):
    block size, eps, ratio, fp8 scale, hadamard, pdl, SPEC §13's ``ape_at`` and ``ring_capacity``."""
    return (type(options[0]), type(options[1]), type(options[2]), type(options[4]), type(options[5]), type(options[7]),
            type(options[10]), type(options[11]))


def fixed_key(state_cache, rms_norm_weight, cos_sin_cache, k_cache, options: tuple) -> tuple:
    """The fixed part of a compress plan's key (AttributeError for a non-tensor)."""
    return (*tensor_key(state_cache), *tensor_key(rms_norm_weight), *tensor_key(cos_sin_cache),
            *tensor_key(k_cache), *options, *_scalar_types(options))


def token_part(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping, workspace) -> tuple:
    """The per-token part of a compress plan's key (SPEC §9 checks no base alignment there)."""
    return (token_to_req_indices.dtype, token_to_req_indices.shape, token_to_req_indices.stride(),
            token_to_req_indices.device, positions.dtype, positions.shape, positions.stride(), positions.device,
            slot_mapping.dtype, slot_mapping.shape, slot_mapping.stride(), slot_mapping.device,
            block_table.dtype, block_table.shape, block_table.stride(), block_table.device,
            kv_slot_mapping.dtype, kv_slot_mapping.shape, kv_slot_mapping.stride(), kv_slot_mapping.device,
            None if workspace is None else tensor_key(workspace))


def bound_key(layer: int, early_metadata: bool, tensors: tuple, workspace, ape=None) -> tuple:
    """A bound layer's plan key: its interned fixed part (``layer``), ``early_metadata``,
    :func:`token_part` and the layout of SPEC §13.2's ``ape``; ``tensors`` in
    :class:`CompressTensors` order."""
    return (layer, early_metadata, *token_part(*tensors[1:5], tensors[8], workspace),
            None if ape is None else tensor_key(ape))


def compress_key(tensors: tuple, workspace, options: tuple, ape=None) -> tuple:
    """An unbound call's plan key: :func:`fixed_key` and :func:`token_part`, flat, written out in
    one expression (it is the whole host cost of a repeated call before its launch), then the
    layout of SPEC §13.2's ``ape`` (None where the call passes none).
    ``tensors`` and ``options`` are in :class:`CompressTensors` and :class:`CompressOptions` order."""
    s, r, p, m, b, w, c, k, v = tensors
    return (s.dtype, s.shape, s.stride(), s.device, s.data_ptr() & 15,
            w.dtype, w.shape, w.stride(), w.device, w.data_ptr() & 15,
            c.dtype, c.shape, c.stride(), c.device, c.data_ptr() & 15,
            k.dtype, k.shape, k.stride(), k.device, k.data_ptr() & 15, *options,
            type(options[0]), type(options[1]), type(options[2]), type(options[4]), type(options[5]), type(options[7]),
            type(options[10]), type(options[11]),
            r.dtype, r.shape, r.stride(), r.device, p.dtype, p.shape, p.stride(), p.device,
            m.dtype, m.shape, m.stride(), m.device, b.dtype, b.shape, b.stride(), b.device,
            v.dtype, v.shape, v.stride(), v.device, None if workspace is None else tensor_key(workspace),
            None if ape is None else tensor_key(ape))


def step_key(tensors: tuple, options: tuple, ape, kv, score, query_start_loc, save_slot_mapping) -> tuple:
    """The combined step call's plan key: :func:`compress_key` of its compress arguments (``tensors``
    in :class:`CompressTensors` order, no workspace) and the layouts of its own arrays."""
    return ("step", *compress_key(tensors, None, options, ape), *tensor_key(kv), *tensor_key(score),
            *tensor_key(query_start_loc), *tensor_key(save_slot_mapping))


def save_key(fixed, kv_score, ape, positions, slot_mapping) -> tuple:
    """A save plan's key: ``fixed`` (the state cache's layout and the save's options, or a bound
    layer's interned integer) and the save's own arrays (``ape`` None: a save that reads none,
    SPEC §13.2's ``ape_at="compress"``; with ``"save"`` validation refuses it, so no plan is kept)."""
    return ("save", fixed, *tensor_key(kv_score), None if ape is None else tensor_key(ape), positions.dtype,
            positions.shape, positions.stride(), positions.device, slot_mapping.dtype, slot_mapping.shape,
            slot_mapping.stride(), slot_mapping.device)


def unbound_save_key(kv_score, ape, positions, slot_mapping, state_cache, block_size, pdl, policy, ape_at,
                     ring_capacity) -> tuple:
    """An unbound save plan's key: the state cache's layout, the save's options (SPEC §13's
    ``ape_at`` and ``ring_capacity`` included) and its own arrays, written out flat because every
    eager save builds it (AttributeError for a non-tensor)."""
    s = state_cache
    return ("save", s.dtype, s.shape, s.stride(), s.device, s.data_ptr() & 15, block_size, type(block_size), pdl,
            type(pdl), policy, ape_at, type(ape_at), ring_capacity, type(ring_capacity), *tensor_key(kv_score),
            None if ape is None else tensor_key(ape), positions.dtype, positions.shape, positions.stride(),
            positions.device, slot_mapping.dtype, slot_mapping.shape, slot_mapping.stride(), slot_mapping.device)
