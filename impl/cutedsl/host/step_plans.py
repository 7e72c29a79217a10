"""The launch plan of SPEC §13.4's step call ``compress_and_save``: a compress, then a save.

:func:`build_step_plan` validates the call with the shared front end (``validate_compress_and_save``:
every argument, before anything is compiled or launched), then this implementation's own
constraints (CUDA tensors, ``pdl``, ``policy``), picks the compress path of the call's state format
with ``rows_from_inputs`` (C4: ``c4``; C128: ``fused_pipelined`` for an fp32 state, ``split_generic`` for a
bf16 one; the indexer layouts: ``indexer``), compiles it and the save kernel of separate ``kv``/``score``
inputs (``SaveConfig.split_inputs``).

:meth:`StepPlan.run` launches both on the current stream, in order: the compress reads the window
rows at or after each request's chunk start from ``kv``/``score`` and older rows from the state;
the save (``save_slot_mapping``) runs after it in the same stream, so it never overwrites a row a
window of the same call still reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ....spec.constants import HEAD_DIMS
from ...frontend import validate_compress_and_save
from . import buffers, occupancy
from .arguments import CompressOptions
from .paths import PathRequest, choose, state_format, step_save_config
from .plans import STATE_DTYPES, LaunchPlan, _check_choices, kernels, launch_scalars


class StepTensors(NamedTuple):
    """``compress_and_save``'s sixteen tensors, in its signature's order (``bs`` left out)."""

    kv: object  # fp32 [T, SW]
    score: object  # fp32 [T, SW]
    ape: object  # fp32 [r, SW]
    positions: object  # int64 [T]
    token_to_req: object  # int32 [T]
    query_start_loc: object  # int32 [num_reqs + 1]
    slot_mapping: object  # int64 [T]
    save_slot_mapping: object  # int64 [T]
    block_table: object  # int32 [num_reqs', max_blocks]
    state_cache: object  # fp32 or bf16 [num_state_blocks, bs, 2*SW]
    rms_norm_weight: object  # bf16 or fp32 [H]
    cos_sin_cache: object  # fp32 [max_pos, 64]
    k_cache: object  # the layout's cache
    kv_slot_mapping: object  # int64 [T]


@dataclass(frozen=True)
class StepPlan:
    """A validated step's compress plan and save kernel (both None for ``T = 0``)."""

    compress: LaunchPlan | None
    save: object  # the save kernel's TVM-FFI callable
    reads_ape: bool = True  # the save adds ape (ape_at="save")
    restride: bool = False  # positions or save_slot_mapping need their unit stride restored

    def run(self, t: StepTensors) -> None:
        """The compress (rows from ``kv``/``score`` and the state), then the save, on the current stream."""
        compress = self.compress
        if compress is None:
            return
        compress.run((t.state_cache, t.token_to_req, t.positions, t.slot_mapping, t.block_table, t.rms_norm_weight,
                      t.cos_sin_cache, t.k_cache, t.kv_slot_mapping), None,
                     formats=(t.ape, compress.ring_capacity, t.kv, t.score, t.query_start_loc))
        positions, saved = t.positions, t.save_slot_mapping
        if self.restride:
            positions, saved = buffers.unit_stride_1d(positions), buffers.unit_stride_1d(saved)
        self.save(t.kv, t.ape if self.reads_ape else None, positions, saved, t.state_cache, t.score)


def build_step_plan(t: StepTensors, options: CompressOptions, debug: bool) -> StepPlan:
    """Validate (SPEC §9/§13.4 through the front end, then this implementation's constraints),
    choose the compress path with ``rows_from_inputs``, compile it and the save kernel."""
    call = validate_compress_and_save(
        t.kv, t.score, t.ape, t.positions, t.token_to_req, t.query_start_loc, t.slot_mapping, t.save_slot_mapping,
        t.block_table, options.block_size, t.state_cache, t.rms_norm_weight, options.rms_norm_eps, t.cos_sin_cache,
        t.k_cache, t.kv_slot_mapping, compress_ratio=options.compress_ratio, layout=options.layout,
        fp8_scale=options.fp8_scale, ape_at=options.ape_at, ring_capacity=options.ring_capacity,
        hadamard=options.hadamard, debug=debug, head_dims=HEAD_DIMS, state_dtypes=STATE_DTYPES)
    _check_choices(options)
    pooling, store = call.pooling, call.store
    num_tokens = pooling.num_tokens
    facts = buffers.launch_facts(t.state_cache, t.k_cache, store.layout, None, num_tokens)
    if num_tokens == 0:
        return StepPlan(None, None)
    state = dataclasses.replace(state_format(pooling.state_format), rows_from_inputs=True)
    ratio, head_dim = pooling.config.ratio, pooling.config.head_dim
    path = choose("auto", ratio, head_dim, num_tokens, pooling.block_size, options.policy, state)
    weight = "bfloat16" if t.rms_norm_weight.dtype == torch.bfloat16 else "float32"
    request = PathRequest(ratio, pooling.block_size, num_tokens, store.layout, store.entries_per_page, weight,
                          facts.store_align, store.hadamard, options.policy, options.pdl, False, state)
    compile_cache = kernels()
    configs = path.configs(request)
    compiled, ffi = compile_cache.compile_path(path, configs)
    grid = (occupancy.persistent_grid(compiled[0], configs[0], request, facts),) if path.persistent else ()
    scalars = launch_scalars(path, store, grid)
    restride = any(m.stride(-1) != 1 for m in (t.token_to_req, t.positions, t.slot_mapping, t.block_table,
                                               t.kv_slot_mapping))
    ring_capacity = pooling.state_format.ring_capacity or 0  # any value for a paged state
    compress = LaunchPlan(path, compiled, ffi, scalars, num_tokens, restride, ring_capacity, True)
    reads_ape = state.ape_at == "save"
    vector_inputs = not reads_ape or (t.ape.data_ptr() % 16 == 0 and t.ape.stride(0) % 4 == 0)
    save = step_save_config(ratio, pooling.block_size, vector_inputs, options.policy, options.pdl, head_dim, state,
                            num_tokens)
    save_restride = t.positions.stride(0) != 1 or t.save_slot_mapping.stride(0) != 1
    return StepPlan(compress, compile_cache.compile_kernel("save", save), reads_ape, save_restride)
