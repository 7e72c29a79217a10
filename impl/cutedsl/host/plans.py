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
from .paths import KernelPath, PathRequest, check_c128_path, choose, pipelined_clusters, save_config
from .policy import Policy

log = logging.getLogger("dsv4_compressor")


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


@dataclass(frozen=True)
class LaunchPlan:
    """A ``compress_norm_rope_store`` call's path, compiled kernels and scalars."""

    path: KernelPath | None  # None: no tokens, nothing to launch
    kernels: tuple  # compiled TVM-FFI callables, in launch order
    scalars: tuple  # the launches' trailing scalars: eps[, fp8_inv][, clusters]
    num_tokens: int
    restride: bool  # a per-token array or the block table needs its unit stride restored
    ffi: tuple = field(init=False, repr=False, compare=False)  # the kernels' TVM-FFI functions

    def __post_init__(self):
        object.__setattr__(self, "ffi", tuple(buffers.ffi_function(kernel) for kernel in self.kernels))

    def run(self, tensors: tuple, workspace) -> None:
        """A validated call (``tensors`` in :class:`.arguments.CompressTensors`' order): unit
        strides restored where needed, the scratch taken from the workspace whose layout the
        plan's key holds, then the path's launches."""
        path = self.path
        if path is None:
            return
        state_cache, token_req, positions, slots, block_table, weight, cos_sin, k_cache, kv_slots = tensors
        metadata = (token_req, positions, slots, block_table, kv_slots)
        if self.restride:
            metadata = buffers.unit_strides(*metadata)
        device = state_cache.device
        scratch = buffers.planned_scratch(workspace, self.num_tokens, device) if path.scratch else None
        path.launch(self, (state_cache, weight, cos_sin, k_cache, device), metadata, scratch)

    def launch_bound(self, held: tuple, metadata: tuple, workspace) -> None:
        """A bound layer's eager call: the launches on ``held`` (the layer's state cache, norm
        weight, cos/sin cache and k_cache as TVM-FFI tensors, then its torch device) and the
        call's per-token arrays as given; the workspace is checked by :func:`.buffers.bound_scratch`."""
        scratch = buffers.bound_scratch(workspace, self.num_tokens, held[4]) if self.path.scratch else None
        self.path.launch(self, held, metadata, scratch)


def _check_choices(options: CompressOptions) -> None:
    check_c128_path(options.c128_path)  # also for C4, where it has no effect: a typo is still an error
    if not isinstance(options.pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {options.pdl!r}")
    if not isinstance(options.policy, Policy):
        raise ValueError(f"policy: expected a dispatch Policy, got {type(options.policy).__name__}")


def path_request(call, options: CompressOptions, weight_dtype: torch.dtype, store_align: int) -> PathRequest:
    """The :class:`.paths.PathRequest` of a validated call."""
    pooling, store = call.pooling, call.store
    return PathRequest(
        pooling.config.ratio, pooling.block_size, pooling.num_tokens, store.layout, store.entries_per_page,
        "bfloat16" if weight_dtype == torch.bfloat16 else "float32", store_align, store.hadamard, options.policy,
        options.pdl, options.early_metadata and options.pdl)  # without PDL there is no wait to read ahead of


def compile_path(path: KernelPath, request: PathRequest, device: torch.device) -> tuple[tuple, tuple]:
    """``(compiled kernels, grid)`` of a path for a request; a persistent path's grid is as many
    clusters as ``device`` holds at once (asked of the driver once per kernel)."""
    configs = path.configs(request)
    compile_cache = kernels()
    compiled = tuple(compile_cache.compile_kernel(kernel, config) for kernel, config in zip(path.kernels, configs))
    if not path.persistent:
        return compiled, ()
    return compiled, (persistent_grid(compiled[0], configs[0], request, device),)


def persistent_grid(compiled, config, request: PathRequest, device: torch.device) -> int:
    """Clusters of the pipelined kernel for the request's token count (:func:`.paths.pipelined_clusters`)."""
    from ..kernels.fused_pipelined import FusedPipelinedKernel

    kernel = FusedPipelinedKernel(config)
    resident = occupancy.resident_clusters(compiled, device, kernel.threads, kernel.smem_bytes, kernel.tiles)
    return pipelined_clusters(request.num_tokens, resident, buffers.sm_count(device), request.policy)


def build_compress_plan(tensors: CompressTensors, workspace, options: CompressOptions, debug: bool) -> LaunchPlan:
    """Validate (SPEC §9 and this implementation's constraints), choose the path, compile."""
    t = tensors
    call = validate_compress_norm_rope_store(
        t.state_cache, t.token_to_req_indices, t.positions, t.slot_mapping, t.block_table, options.block_size,
        t.rms_norm_weight, options.rms_norm_eps, t.cos_sin_cache, t.k_cache, t.kv_slot_mapping,
        compress_ratio=options.compress_ratio, layout=options.layout, fp8_scale=options.fp8_scale,
        hadamard=options.hadamard, debug=debug, head_dims=HEAD_DIMS)
    _check_choices(options)
    num_tokens, config = call.pooling.num_tokens, call.pooling.config
    path = choose(options.c128_path, config.ratio, config.head_dim, num_tokens, call.pooling.block_size,
                  options.policy)
    device = tensors.state_cache.device
    if path.scratch:
        buffers.x_buffer(workspace, num_tokens, device, "workspace")  # raises on a bad workspace
    buffers.require_cuda("state_cache", tensors.state_cache)
    if num_tokens == 0:
        return LaunchPlan(None, (), (), 0, False)
    request = path_request(call, options, tensors.rms_norm_weight.dtype,
                           buffers.store_align(tensors.k_cache, call.store.layout))
    compiled, grid = compile_path(path, request, device)
    eps = float(call.store.eps)
    fp8_inv = float(np.float32(1.0) / call.store.fp8_scale) if call.store.fp8_scale is not None else 1.0
    scalars = (eps, fp8_inv, *grid) if path.takes_fp8_inv else (eps, *grid)
    restride = any(t.stride(-1) != 1 for t in tensors.metadata)
    log.debug("cutedsl: compress_norm_rope_store C%d T=%d bs=%d %s -> %s%s", config.ratio, num_tokens,
              request.block_size, options.layout, path.name, f" grid {grid}" if grid else "")
    return LaunchPlan(path, compiled, scalars, num_tokens, restride)


# ---- save_partial_states --------------------------------------------------------------------
@dataclass(frozen=True)
class SavePlan:
    """A ``save_partial_states`` call's kernel (None for ``T = 0``) and stride fix-up."""

    kernel: object
    restride: bool
    vector_inputs: bool = False  # the kernel of 16-byte aligned kv_score and ape rows

    def run(self, kv_score, ape, positions, slot_mapping, state_cache) -> None:
        if self.kernel is None:
            return
        if self.restride:
            positions, slot_mapping = buffers.unit_stride_1d(positions), buffers.unit_stride_1d(slot_mapping)
        self.kernel(kv_score, ape, positions, slot_mapping, state_cache)


def build_save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug: bool,
                    policy: Policy, pdl: bool) -> SavePlan:
    """Validate a ``save_partial_states`` call and compile its kernel."""
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS)  # 512, and the indexer's 128 (SPEC §12)
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {pdl!r}")
    buffers.require_cuda("state_cache", state_cache)
    restride = positions.stride(0) != 1 or slot_mapping.stride(0) != 1
    if call.num_tokens == 0:
        return SavePlan(None, restride)
    vector_inputs = (
        kv_score.data_ptr() % 16 == 0 and (call.num_tokens <= 1 or kv_score.stride(0) % 4 == 0)
        and ape.data_ptr() % 16 == 0 and ape.stride(0) % 4 == 0
    )
    config = save_config(call.config.ratio, call.block_size, vector_inputs, policy, pdl, call.config.head_dim)
    return SavePlan(kernels().compile_kernel("save", config), restride, vector_inputs)
