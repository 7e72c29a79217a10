"""Torch front end of DeepSeek-V4.1's operations (SPEC §14.7): the §14.8 checks before any launch.

The checks are :mod:`dsv4_compressor.spec.v41_validation`'s, on :func:`.frontend.describe_torch`
descriptions, so a GPU implementation and the NumPy spec reject the same calls with the same
messages. Nothing here launches work or synchronizes with the device, except ``debug=True``,
which copies the (small) metadata to the host for the spec's contract checks.

Each ``validate_v41_*`` returns the spec's validated call (plus, for ratio 2, the state's) and
raises ``ValueError`` naming the argument, what was expected and what was given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec.v41_compress import active_tokens, stored_tokens
from ..spec.v41_validation import (
    V41CompressCall, V41IndexKeyCall, V41StateCall, V41StoreCall, check_v41_compress, check_v41_index_key,
    check_v41_state, check_v41_store, check_v41_store_contract,
)
from ..spec.validation import check_contract, check_save_contract, check_step_contract
from .frontend import describe_torch, layout_key


def describe_optional(name: str, tensor):
    """:func:`.frontend.describe_torch`, or ``None`` for an argument passed as ``None``."""
    return None if tensor is None else describe_torch(name, tensor)


def _host(tensor: torch.Tensor):
    return tensor.cpu().numpy()


@dataclass(frozen=True)
class V41StateArguments:
    """Ratio 2's state arguments of one call (SPEC §14.2, §13.3, §13.4); ratio 1 reads only ``state_cache``."""

    token_to_req: torch.Tensor | None  # int32 [T]
    query_start_loc: torch.Tensor | None  # int32 [num_reqs + 1]
    slot_mapping: torch.Tensor | None  # int64 [T]: state slot, -1 = padding
    save_slot_mapping: torch.Tensor | None  # int64 [T]: saved after the compress, -1 = not saved
    block_table: torch.Tensor | None  # int32 [num_reqs, max_blocks]
    bs: int | None  # rows per state block
    state_cache: torch.Tensor | None  # fp32 or bf16 [num_state_blocks, bs, 1024]
    ring_capacity: int | None = None  # None: paged; C: a ring of C rows per request


@dataclass(frozen=True)
class V41CompressCheck:
    """A validated compress: the spec's call and, for ratio 2, its state (None for ratio 1)."""

    call: V41CompressCall
    state: V41StateCall | None


def _check_state(state: V41StateArguments, call: V41CompressCall) -> V41StateCall | None:
    if call.config.ratio == 1:  # only a state given is an error; the other state arguments are not read
        return check_v41_state(None, None, None, None, None, None, describe_optional("state_cache", state.state_cache),
                               None, call.config, call.num_tokens)
    return check_v41_state(
        describe_optional("token_to_req", state.token_to_req), describe_optional("query_start_loc", state.query_start_loc),
        describe_optional("slot_mapping", state.slot_mapping), describe_optional("save_slot_mapping", state.save_slot_mapping),
        describe_optional("block_table", state.block_table), state.bs, describe_optional("state_cache", state.state_cache),
        state.ring_capacity, call.config, call.num_tokens,
    )


def validate_v41_compress_norm(kv, score, positions, state: V41StateArguments, rms_norm_weight, rms_norm_eps,
                               kv_slot_mapping, latent, *, compress_ratio, ape=None, latent_optional: bool = False,
                               debug: bool = False) -> V41CompressCheck:
    """SPEC §14.8 checks of ``v41_compress_norm``'s torch arguments (``latent`` may be ``None``
    where ``latent_optional``: the combined call), plus ratio 2's debug contract checks."""
    call = check_v41_compress(
        describe_torch("kv", kv), describe_optional("score", score), describe_torch("positions", positions),
        describe_torch("rms_norm_weight", rms_norm_weight), rms_norm_eps, describe_torch("kv_slot_mapping", kv_slot_mapping),
        describe_optional("latent", latent), compress_ratio, ape, latent_optional=latent_optional,
    )
    state_call = _check_state(state, call)
    if debug and state_call is not None:
        _check_state_contract(call, state_call, positions, state, kv_slot_mapping)
    return V41CompressCheck(call=call, state=state_call)


def _check_state_contract(call: V41CompressCall, state_call: V41StateCall, positions, state: V41StateArguments,
                          kv_slot_mapping) -> None:
    """``debug=True`` at ratio 2: SPEC §13.4's chunk contract, the window rows before each chunk
    inside the state (paged or the ring), the slots saved once and inside the state."""
    positions_h, kv_slots_h = _host(positions), _host(kv_slot_mapping)
    token_to_req_h, qsl_h, slots_h, saves_h = (_host(t) for t in (state.token_to_req, state.query_start_loc,
                                                                  state.slot_mapping, state.save_slot_mapping))
    active = active_tokens(positions_h, slots_h, kv_slots_h, call.config.ratio)
    check_step_contract(qsl_h, token_to_req_h, positions_h, slots_h, saves_h, kv_slots_h)
    check_contract(call.config, active, token_to_req_h, positions_h, slots_h, _host(state.block_table),
                   state.state_cache.shape[0], state_call.block_size, kv_slots_h, state_format=state_call.state_format,
                   query_start_loc=qsl_h)
    check_save_contract(positions_h, saves_h, state.state_cache.shape[0], state_call.block_size)


def validate_v41_rope_quant_store(latent, positions, kv_slot_mapping, cos_sin_cache, k_cache, *, compress_ratio, layout,
                                  fp8_scale, debug: bool = False, latent_optional: bool = False) -> V41StoreCall:
    """SPEC §14.8 checks of ``v41_rope_quant_store``'s torch arguments (``latent`` may be
    ``None`` where ``latent_optional``: the combined call computes it), plus the debug store
    contract of §14.7's storing tokens (a cache slot and a boundary position)."""
    latent_info = describe_optional("latent", latent) if latent_optional else describe_torch("latent", latent)
    call = check_v41_store(latent_info, describe_torch("positions", positions),
                           describe_torch("kv_slot_mapping", kv_slot_mapping), describe_torch("cos_sin_cache", cos_sin_cache),
                           describe_torch("k_cache", k_cache), compress_ratio, layout, fp8_scale)
    if debug:
        positions_h, kv_slots_h = _host(positions), _host(kv_slot_mapping)
        _check_store_contract(stored_tokens(positions_h, kv_slots_h, call.config.ratio), positions_h, kv_slots_h,
                              cos_sin_cache, k_cache, call)
    return call


def _check_store_contract(stores, positions_h, kv_slots_h, cos_sin_cache, k_cache, call) -> None:
    """The debug checks of a store: slots inside ``k_cache`` and written once, RoPE rows inside ``cos_sin_cache``."""
    check_v41_store_contract(stores, positions_h, kv_slots_h, k_cache.shape[0] * call.entries_per_page,
                             cos_sin_cache.shape[0], call.config.ratio)


@dataclass(frozen=True)
class V41CompressStoreCheck:
    """A validated ``v41_compress_norm_rope_store``."""

    compress: V41CompressCheck
    store: V41StoreCall


def validate_v41_compress_norm_rope_store(kv, score, positions, state: V41StateArguments, rms_norm_weight, rms_norm_eps,
                                          cos_sin_cache, k_cache, kv_slot_mapping, latent, *, compress_ratio, layout,
                                          fp8_scale, ape=None, debug: bool = False) -> V41CompressStoreCheck:
    """Both operations' checks (``latent`` may be ``None``), every one before anything is
    written and before the debug checks, as the spec orders them; with ``debug`` the store
    contract covers the tokens active in §14.3's sense."""
    compress = validate_v41_compress_norm(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping,
                                          latent, compress_ratio=compress_ratio, ape=ape, latent_optional=True)
    store = validate_v41_rope_quant_store(latent, positions, kv_slot_mapping, cos_sin_cache, k_cache,
                                          compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale,
                                          latent_optional=True)
    if debug:
        call = compress.call
        if compress.state is not None:
            _check_state_contract(call, compress.state, positions, state, kv_slot_mapping)
        positions_h, kv_slots_h = _host(positions), _host(kv_slot_mapping)
        slots_h = None if call.config.ratio == 1 else _host(state.slot_mapping)
        _check_store_contract(active_tokens(positions_h, slots_h, kv_slots_h, call.config.ratio), positions_h, kv_slots_h,
                              cos_sin_cache, k_cache, store)
    return V41CompressStoreCheck(compress=compress, store=store)


def validate_v41_index_key_store(k_pre, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache,
                                 *, compress_ratio, layout, debug: bool = False) -> V41IndexKeyCall:
    """SPEC §14.8 checks of ``v41_index_key_store``'s torch arguments, plus the debug store contract."""
    call = check_v41_index_key(describe_torch("k_pre", k_pre), describe_torch("positions", positions),
                               describe_torch("kv_slot_mapping", kv_slot_mapping),
                               describe_torch("rms_norm_weight", rms_norm_weight), rms_norm_eps,
                               describe_torch("cos_sin_cache", cos_sin_cache), describe_torch("k_cache", k_cache),
                               compress_ratio, layout)
    if debug:
        positions_h, kv_slots_h = _host(positions), _host(kv_slot_mapping)
        _check_store_contract(stored_tokens(positions_h, kv_slots_h, call.config.ratio), positions_h, kv_slots_h,
                              cos_sin_cache, k_cache, call)
    return call


def v41_compress_key(kv, score, positions, state: V41StateArguments, rms_norm_weight, rms_norm_eps, kv_slot_mapping,
                     latent, extras: tuple) -> tuple:
    """The plan key of a compress call (both families): every tensor's layout, the scalars and their
    types, then the operation's ``extras``."""
    tensors = (kv, score, positions, state.token_to_req, state.query_start_loc, state.slot_mapping,
               state.save_slot_mapping, state.block_table, state.state_cache, rms_norm_weight, kv_slot_mapping, latent)
    scalars = (state.bs, state.ring_capacity, rms_norm_eps)
    return (*(layout_key(t) for t in tensors), *scalars, *(type(s) for s in scalars), *extras)
