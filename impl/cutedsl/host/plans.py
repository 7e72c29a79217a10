"""Launch plans: everything a call decides before its launches, built once per argument layout.

:func:`build_compress_plan` validates a call (SPEC §9, the shared front end; then this
implementation's own constraints), chooses its :class:`.paths.KernelPath`, compiles the
path's kernels (:mod:`.compile_cache`) and sizes a persistent grid; the plan it returns
holds the kernels' TVM-FFI functions and the scalars. The tensors change every step, the
plan does not: :mod:`..api` keeps plans by :mod:`.arguments`' keys, so a repeated call pays
its key, a dictionary lookup and the path's launches.

``LaunchPlan.run`` launches a validated call (restoring unit strides where the key says a
per-token array needs it, taking the scratch from the workspace); ``launch_bound`` a bound
layer's eager call (its fixed tensors held as TVM-FFI tensors, the per-token arrays as given,
TVM-FFI checking them; see :class:`..api.BoundLayer`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ....spec.constants import HEAD_DIMS
from ...frontend import validate_compress_norm_rope_store, validate_save_partial_states
from . import buffers, occupancy
from .arguments import CompressOptions, CompressTensors
from .paths import KernelPath, plan, save_config, state_format
from .policy import Policy

log = logging.getLogger("dsv4_compressor")
STATE_DTYPES = ("float32", "bfloat16")  # SPEC §13.1: the state dtypes the kernels read and write


def kernels():
    """The compile cache, imported lazily, with a clear message when CuTe DSL is not installed."""
    try:
        from . import compile_cache
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dsv4_compressor.impl.cutedsl needs NVIDIA's CuTe DSL and TVM-FFI: "
            'pip install "nvidia-cutlass-dsl[cu13]==4.8.1" "apache-tvm-ffi>=0.1.6,<0.2" '
            f"(import failed: {error})"
        ) from error
    return compile_cache


NO_FORMAT_ARGUMENTS = (None,) * 5  # ape, ring_capacity, kv, score, query_start_loc of SPEC §3's state


@dataclass(frozen=True)
class LaunchPlan:
    """A ``compress_norm_rope_store`` call's path, compiled kernels and scalars."""

    path: KernelPath | None  # None: no tokens, nothing to launch
    kernels: tuple  # compiled TVM-FFI callables, in launch order
    ffi: tuple = field(repr=False, compare=False)  # the kernels' TVM-FFI functions (buffers.ffi_function)
    scalars: tuple = ()  # the launches' trailing scalars: eps[, fp8_inv][, clusters]
    num_tokens: int = 0
    restride: bool = False  # a per-token array or the block table needs its unit stride restored
    ring_capacity: int | None = None  # SPEC §13: the kernels' ring_capacity launch argument, or None
    #                                   for SPEC §3's state (the kernels then take neither it nor ape)
    takes_ape: bool = False  # SPEC §13.2: ape_at="compress" (the call's ape goes to the kernels)

    def formats(self, ape) -> tuple:
        """SPEC §13's launch arguments after the plan's scalars, for a path whose kernels take them:
        ``(ape or None, ring_capacity, None, None, None)`` (the last three are the step call's
        ``kv``, ``score`` and ``query_start_loc``), every one ``None`` for SPEC §3's state. The
        TVM-FFI function takes every parameter of the kernel's entry positionally, the defaulted
        ``None`` ones too."""
        if not self.path.formats:
            return ()
        if self.ring_capacity is None:
            return NO_FORMAT_ARGUMENTS
        return (ape if self.takes_ape else None, self.ring_capacity, None, None, None)

    def run(self, tensors: tuple, workspace, ape=None, formats: tuple | None = None) -> None:
        """A validated call (``tensors`` in :class:`.arguments.CompressTensors`' order; ``ape``: fp32
        ``[r, SW]`` with ``ape_at="compress"``): unit strides restored where needed, the scratch
        taken from the workspace whose layout the plan's key holds, then the path's launches.
        ``formats``: the SPEC §13 launch arguments where the caller gives them all (the step call's,
        :class:`.step_plans.StepPlan`), else :meth:`formats`."""
        path = self.path
        if path is None:
            return
        state_cache, token_req, positions, slots, block_table, weight, cos_sin, k_cache, kv_slots = tensors
        metadata = (token_req, positions, slots, block_table, kv_slots)
        if self.restride:
            metadata = buffers.unit_strides(*metadata)
        device = state_cache.device
        scratch = buffers.planned_scratch(workspace, self.num_tokens, device) if path.scratch else None
        path.launch(self, (state_cache, weight, cos_sin, k_cache, device), metadata, scratch,
                    self.formats(ape) if formats is None else formats)

    def launch_bound(self, held: tuple, metadata: tuple, workspace) -> None:
        """A bound layer's eager call: the launches on ``held`` (the layer's state cache, norm
        weight, cos/sin cache and k_cache as TVM-FFI tensors, then its torch device) and the
        call's per-token arrays as given; the workspace is checked by :func:`.buffers.bound_scratch`.
        SPEC §13: a layer whose compress takes ``ape`` never comes here (its ``ape`` is per call), so
        its formats' launch arguments hold no tensor (:meth:`formats`)."""
        scratch = buffers.bound_scratch(workspace, self.num_tokens, held[4]) if self.path.scratch else None
        self.path.launch(self, held, metadata, scratch, self.formats(None))


def launch_scalars(path: KernelPath, store, grid: tuple = ()) -> tuple:
    """The launches' trailing scalars of a validated store (the front end's ``StoreCall``): eps,
    ``div(1, fp8_scale)`` in binary32 (1.0 without a scale) where the path's kernels take it, then
    the persistent grid."""
    eps = float(store.eps)
    if not path.takes_fp8_inv:
        return (eps, *grid)
    fp8_inv = float(np.float32(1.0) / store.fp8_scale) if store.fp8_scale is not None else 1.0
    return (eps, fp8_inv, *grid)


def _check_choices(options: CompressOptions) -> None:
    if not isinstance(options.pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {options.pdl!r}")
    if not isinstance(options.policy, Policy):
        raise ValueError(f"policy: expected a dispatch Policy, got {type(options.policy).__name__}")


def build_compress_plan(tensors: CompressTensors, workspace, options: CompressOptions, debug: bool,
                        ape=None) -> LaunchPlan:
    """Validate (SPEC §9, then this implementation's constraints), choose the path, compile.

    One pass through the host's modules: the front end's checks, the device facts and the
    workspace (:func:`.buffers.launch_facts`), the path and its request (:func:`.paths.plan`),
    the compiled kernels (:func:`.compile_cache.compile_path`), the persistent grid
    (:func:`.occupancy.persistent_grid`)."""
    _check_choices(options)
    t = tensors
    call = validate_compress_norm_rope_store(
        t.state_cache, t.token_to_req_indices, t.positions, t.slot_mapping, t.block_table, options.block_size,
        t.rms_norm_weight, options.rms_norm_eps, t.cos_sin_cache, t.k_cache, t.kv_slot_mapping,
        compress_ratio=options.compress_ratio, layout=options.layout, fp8_scale=options.fp8_scale,
        hadamard=options.hadamard, debug=debug, head_dims=HEAD_DIMS, ape=ape, ape_at=options.ape_at,
        ring_capacity=options.ring_capacity, state_dtypes=STATE_DTYPES)
    num_tokens = call.pooling.num_tokens
    facts = buffers.launch_facts(t.state_cache, t.k_cache, call.store.layout, workspace, num_tokens)
    path, request = plan(call, options, facts.store_align, t.rms_norm_weight.dtype == torch.bfloat16)
    if num_tokens == 0:
        return LaunchPlan(None, (), (), (), 0, False)
    spec_format = call.pooling.state_format
    formatted = not request.state.is_default
    ring_capacity = (spec_format.ring_capacity or 0) if formatted else None  # any value for a paged state
    from . import compile_cache  # CuTe DSL itself: imported once a call has been validated

    configs = path.configs(request)
    compiled, ffi = compile_cache.compile_path(path, configs)
    grid = (occupancy.persistent_grid(compiled[0], configs[0], request, facts),) if path.persistent else ()
    scalars = launch_scalars(path, call.store, grid)
    restride = any(m.stride(-1) != 1 for m in t.metadata)
    log.debug("cutedsl: compress_norm_rope_store C%d T=%d bs=%d %s -> %s%s", request.ratio, num_tokens,
              request.block_size, options.layout, path.name, f" grid {grid}" if grid else "")
    return LaunchPlan(path, compiled, ffi, scalars, num_tokens, restride, ring_capacity,
                      spec_format.ape_at == "compress")


# ---- save_partial_states --------------------------------------------------------------------
@dataclass(frozen=True)
class SavePlan:
    """A ``save_partial_states`` call's kernel (None for ``T = 0``) and stride fix-up."""

    kernel: object
    restride: bool
    vector_inputs: bool = False  # the kernel of 16-byte aligned kv_score and ape rows
    reads_ape: bool = True  # ape_at="save" (SPEC §13.2: with "compress" the kernel takes None for ape)

    def run(self, kv_score, ape, positions, slot_mapping, state_cache) -> None:
        if self.kernel is None:
            return
        if self.restride:
            positions, slot_mapping = buffers.unit_stride_1d(positions), buffers.unit_stride_1d(slot_mapping)
        self.kernel(kv_score, ape if self.reads_ape else None, positions, slot_mapping, state_cache)


def build_save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug: bool,
                    policy: Policy, pdl: bool, ape_at: str = "save", ring_capacity: int | None = None) -> SavePlan:
    """Validate a ``save_partial_states`` call (SPEC §13: ``ape_at``, ``ring_capacity``, a bf16
    state) and compile its kernel."""
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS,  # 512, and the indexer's 128 (SPEC §12)
                                        ape_at=ape_at, ring_capacity=ring_capacity, state_dtypes=STATE_DTYPES)
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {pdl!r}")
    buffers.require_cuda("state_cache", state_cache)
    restride = positions.stride(0) != 1 or slot_mapping.stride(0) != 1
    if call.num_tokens == 0:
        return SavePlan(None, restride)
    state = state_format(call.state_format)
    reads_ape = state.ape_at == "save"
    vector_inputs = (
        kv_score.data_ptr() % 16 == 0 and (call.num_tokens <= 1 or kv_score.stride(0) % 4 == 0)
        and (not reads_ape or (ape.data_ptr() % 16 == 0 and ape.stride(0) % 4 == 0))
    )
    config = save_config(call.config.ratio, call.block_size, vector_inputs, policy, pdl, call.config.head_dim, state)
    return SavePlan(kernels().compile_kernel("save", config), restride, vector_inputs, reads_ape)
