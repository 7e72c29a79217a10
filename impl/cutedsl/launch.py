"""Launch plans of the CuTe DSL kernels: how they are built and run, scratch buffers, counters.

A *plan* holds everything a call decides before its launches: the compiled TVM-FFI
callables, the path, the scalars and the grid. It depends only on what SPEC §9 validates
(dtypes, shapes, strides, devices, base alignment, the scalars), on the C128 path, the
workspace's layout, the :class:`.dispatch.Policy` and ``pdl``; the tensors themselves change
every step. So a plan is built once per argument layout and token count (validation,
dispatch, compile-cache lookups), and :mod:`.api` keeps it in a
:class:`dsv4_compressor.impl.frontend.PlanCache` keyed by the tensors' metadata: later calls
pay that key, a dictionary lookup and the FFI launches. The indexer layouts (SPEC §12) get
:mod:`.indexer_launch`'s kernel in an :class:`IndexerLaunch`, after the same validation.
Both ``run`` (a validated call) and ``launch_bound`` (a bound layer's eager call: its held
fixed tensors, :func:`held_tensors`, and the call's per-token arrays as given, TVM-FFI checking
them; see :class:`.api.BoundLayer`) end in one ``launch_kernels`` per path, which calls the
kernels' TVM-FFI functions (:func:`ffi_function`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ...spec.constants import HEAD_DIMS
from ..frontend import validate_compress_norm_rope_store, validate_save_partial_states
from . import dispatch, indexer_launch, occupancy
from .config import ClusterConfig, EntryFormat, HandoffConfig, PipelinedConfig

SUPPORTED_DEVICES = ("cuda",)
HEAD_DIM = 512

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


# ---- argument helpers -----------------------------------------------------------------------
def _require_cuda(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type not in SUPPORTED_DEVICES:
        raise ValueError(f"{name}: expected a tensor on one of {SUPPORTED_DEVICES}, got a tensor on {tensor.device}")


def _unit_stride_1d(tensor: torch.Tensor) -> torch.Tensor:
    """A per-token array of length <= 1 may carry any stride (SPEC §9); TVM-FFI wants 1."""
    if tensor.stride(0) != 1:
        return tensor.as_strided(tuple(tensor.shape), (1,))
    return tensor


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """Same for a 2-D table whose last extent is 1."""
    if tensor.stride(-1) != 1:
        return tensor.as_strided(tuple(tensor.shape), tuple(tensor.stride()[:-1]) + (1,))
    return tensor


def _metadata(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping):
    return (_unit_stride_1d(token_to_req_indices), _unit_stride_1d(positions), _unit_stride_1d(slot_mapping),
            _unit_last_stride(block_table), _unit_stride_1d(kv_slot_mapping))


def store_align(k_cache: torch.Tensor, layout: str) -> int:
    """Byte alignment of every 4-channel store (the bf16/fp8 layouts allow any strides)."""
    if layout == "flashmla_fp8":
        return 16  # validated: 16-byte aligned base and page stride, records at multiples of 8
    item = k_cache.element_size()
    vector = 4 * item
    pages, entries, _ = k_cache.shape
    aligned = (
        k_cache.data_ptr() % vector == 0
        and (pages <= 1 or (k_cache.stride(0) * item) % vector == 0)
        and (entries <= 1 or (k_cache.stride(1) * item) % vector == 0)
    )
    return vector if aligned else item


def x_buffer(buffer, num_tokens: int, device: torch.device, name: str) -> torch.Tensor:
    """An fp32 ``[S >= T, 512]`` buffer with 16-byte aligned rows (given, checked, or allocated)."""
    if buffer is None:
        return _scratch(None, num_tokens, device)
    if not isinstance(buffer, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor or None, got {type(buffer).__name__}")
    if buffer.dtype != torch.float32:
        raise ValueError(f"{name}: expected dtype float32, got {str(buffer.dtype).removeprefix('torch.')}")
    if buffer.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like state_cache), got a tensor on {buffer.device}")
    if buffer.data_ptr() % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned base address, got address 0x{buffer.data_ptr():x}")
    if buffer.dim() == 2 and buffer.shape[1] == HEAD_DIM and buffer.shape[0] >= num_tokens:
        if buffer.stride(1) != 1 or (buffer.shape[0] > 1 and buffer.stride(0) % 4):
            raise ValueError(f"{name}: expected strides (multiple of 4, 1), got strides {list(buffer.stride())}")
        return _unit_last_stride(buffer)
    if buffer.dim() == 1 and buffer.is_contiguous() and buffer.numel() >= num_tokens * HEAD_DIM:
        return _scratch(buffer, num_tokens, device)
    raise ValueError(
        f"{name}: expected float32 [S >= {num_tokens}, {HEAD_DIM}] (rows 16-byte aligned) or a contiguous "
        f"float32 tensor of >= {num_tokens * HEAD_DIM} elements, got shape {list(buffer.shape)}"
    )


def _scratch(workspace, num_tokens: int, device: torch.device) -> torch.Tensor:
    """The x scratch of a planned call: the plan's key holds the workspace's layout, which
    :func:`x_buffer` checked when the plan was built."""
    if workspace is None:
        return torch.empty((num_tokens, HEAD_DIM), dtype=torch.float32, device=device)
    if workspace.dim() == 2:
        return _unit_last_stride(workspace)
    return workspace[: num_tokens * HEAD_DIM].view(num_tokens, HEAD_DIM)


def bound_scratch(workspace, num_tokens: int, device: torch.device) -> torch.Tensor:
    """The x scratch of a bound layer's eager call, checked here only where TVM-FFI does not
    check it: the rows (``S >= T``, a row stride that keeps rows 16-byte aligned) of a 2-D
    workspace, the length of a 1-D one; dtype, width, unit last stride, base alignment and
    device are the kernel's TVM-FFI checks. Raises ``ValueError`` for anything else: the
    caller then validates the call the long way (:func:`x_buffer` names what is wrong)."""
    if workspace is None or (workspace.dim() == 1 and workspace.numel() >= num_tokens * HEAD_DIM
                             and workspace.is_contiguous()):
        return _scratch(workspace, num_tokens, device)
    if workspace.dim() == 2 and workspace.shape[0] >= num_tokens and (
            workspace.shape[0] == 1 or workspace.stride(0) % 4 == 0):
        return workspace
    raise ValueError("workspace: not a scratch the bound path takes as it is")


def ffi_function(kernel):
    """The positional TVM-FFI function under a compiled CuTe DSL kernel: the compiled object's
    own ``__call__`` runs two Python frames (its pointer-argument check and a keyword wrapper)
    before it; the plans pass every argument positionally and no raw pointer, so they call
    the function itself (which keeps the kernel's module alive). Anything else (a kernel
    without that function, one that takes raw pointers) is returned as it is."""
    function = getattr(kernel, "__tvm_ffi_object__", None)
    takes_pointers = getattr(getattr(kernel, "execution_args", None), "has_pointer_address_arg_specs", True)
    if function is None or takes_pointers:
        return kernel
    return function() or kernel


def held_tensors(*tensors: torch.Tensor) -> tuple:
    """TVM-FFI tensors of a bound layer's fixed tensors, made once: a call then converts only
    its per-token arrays (each kernel still gets at least one torch tensor per call, from
    which TVM-FFI takes the device's current stream)."""
    import tvm_ffi

    return tuple(tvm_ffi.from_dlpack(tensor) for tensor in tensors)


# ---- device facts and the handoff kernel's counters -------------------------------------------
_SM_COUNTS: dict = {}
_COUNTERS: dict = {}  # (device, stream) -> _CounterArray: the handoff kernel's arrival counters
_OUTGROWN: list = []  # replaced counter arrays stay allocated: a captured CUDA graph may still use them


def sm_count(device: torch.device) -> int | None:
    """Multiprocessors of a CUDA device (None for another device: no grid to size)."""
    if device.type != "cuda":
        return None
    if device not in _SM_COUNTS:
        _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device]


def _current_stream(device: torch.device) -> int:
    try:
        return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())
    except AttributeError:  # pragma: no cover - older torch
        return torch.cuda.current_stream(device).cuda_stream


@dataclass
class _CounterArray:
    tensor: torch.Tensor  # int32, zero between calls once zeroed
    zeroed: bool = False  # a zero-fill has run outside any graph capture
    filled_captures: set = field(default_factory=set)  # ids of the captures that recorded a zero-fill


def handoff_counters(device: torch.device, num_tokens: int) -> torch.Tensor:
    """The ``fused_handoff`` kernel's per-token arrival counters for the current stream: an
    int32 array of at least ``num_tokens`` zeros (the kernel leaves them zero again).

    One array per (device, stream), so calls on different streams never share counters. A
    CUDA graph keeps the array of the stream it was captured on: graphs captured on one
    stream must not be replayed concurrently on several.

    A new array is zero-filled on the stream before its first use. A fill issued inside a
    graph capture exists only in that graph, so until a fill has run outside capture, each
    capture that uses the array records one fill of its own (at its first call: later calls
    of the same graph follow in stream order and find the zeros the kernel left), and the
    first call outside capture fills it again. Once filled outside capture, nothing more.
    """
    key = (device, _current_stream(device))
    entry = _COUNTERS.get(key)
    if entry is None or entry.tensor.numel() < num_tokens:
        if entry is not None:
            _OUTGROWN.append(entry.tensor)
        size = max(4096, 1 << (num_tokens - 1).bit_length())
        entry = _COUNTERS[key] = _CounterArray(torch.empty(size, dtype=torch.int32, device=device))
    if not entry.zeroed:
        capture = _capture_id(device)
        if capture is None:
            entry.tensor.zero_()
            entry.zeroed = True
        elif capture not in entry.filled_captures:
            entry.tensor.zero_()  # recorded into this graph only
            entry.filled_captures.add(capture)
    return entry.tensor


def _capture_id(device: torch.device) -> int | None:
    """The id of the CUDA graph capture running on the current stream (unique over the
    process's lifetime), or None outside capture."""
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return None
    import cuda.bindings.driver as driver

    result = driver.cuStreamGetCaptureInfo(driver.CUstream(_current_stream(device)))
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuStreamGetCaptureInfo failed: {result[0]}")
    return int(result[2])  # (error, status, id, graph, ...)


# ---- compress_norm_rope_store ---------------------------------------------------------------
@dataclass(frozen=True)
class LaunchPlan:
    """Everything a ``compress_norm_rope_store`` call decides before its launches; ``run``
    launches them (the subclasses below: one per kind of path)."""

    kernels: tuple  # compiled TVM-FFI callables, launched in order
    path: str  # "c4", "indexer" or a C128 path (dispatch.C128_PATHS but "auto")
    eps: float
    fp8_inv: float
    num_tokens: int
    restride: bool  # a per-token array or the block table needs its unit stride restored
    grid: tuple = ()  # fused_pipelined: (clusters,)
    ffi: tuple = field(init=False, repr=False, compare=False)  # the kernels' TVM-FFI functions (launch_kernels)

    def __post_init__(self):
        object.__setattr__(self, "ffi", tuple(ffi_function(kernel) for kernel in self.kernels))

    uses_scratch = False  # the path's kernels take the x scratch (a ClassVar: not a field)

    def run(self, state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
            cos_sin_cache, k_cache, kv_slot_mapping, workspace) -> None:
        """A validated call: restore the unit strides where needed, take the scratch from the
        workspace whose layout the plan's key holds, then :meth:`launch_kernels`."""
        if self.restride:
            token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping = _metadata(
                token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping)
        device = state_cache.device
        scratch = _scratch(workspace, self.num_tokens, device) if self.uses_scratch else None
        self.launch_kernels((state_cache, rms_norm_weight, cos_sin_cache, k_cache, device), token_to_req_indices,
                            positions, slot_mapping, block_table, kv_slot_mapping, scratch)

    def launch_bound(self, held, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                     workspace) -> None:
        """A bound layer's eager call: the kernels on ``held`` (the layer's state cache, norm
        weight, cos/sin cache and k_cache as TVM-FFI tensors, then its torch device) and the
        call's per-token arrays as given, checked by TVM-FFI at the launch (see
        :mod:`.api`'s ``BoundLayer``); the workspace is checked by :func:`bound_scratch`."""
        if not self.kernels:
            raise ValueError("a plan without tokens has no bound launch")
        scratch = bound_scratch(workspace, self.num_tokens, held[4]) if self.uses_scratch else None
        self.launch_kernels(held, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping, scratch)

    def launch_kernels(self, fixed, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                       scratch) -> None:
        """The kernels' TVM-FFI functions on ``fixed`` (state cache, norm weight, cos/sin cache,
        k_cache, then the torch device), the per-token arrays and ``scratch`` (fp32 ``[T, 512]``
        where the path uses one). No tokens: nothing to launch."""


@dataclass(frozen=True)
class SingleLaunch(LaunchPlan):
    """C4 and ``fused_cluster``: one kernel on the call's tensors."""

    def launch_kernels(self, fixed, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                       scratch) -> None:
        state_cache, rms_norm_weight, cos_sin_cache, k_cache, _ = fixed
        self.ffi[0](state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                    cos_sin_cache, k_cache, kv_slot_mapping, self.eps, self.fp8_inv, *self.grid)


@dataclass(frozen=True)
class HandoffLaunch(LaunchPlan):
    """``fused_handoff``: one kernel, plus the x scratch and this stream's arrival counters."""

    uses_scratch = True

    def launch_kernels(self, fixed, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                       scratch) -> None:
        state_cache, rms_norm_weight, cos_sin_cache, k_cache, device = fixed
        self.ffi[0](state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                    cos_sin_cache, k_cache, kv_slot_mapping, scratch, handoff_counters(device, self.num_tokens),
                    self.eps, self.fp8_inv, *self.grid)


@dataclass(frozen=True)
class SplitLaunch(LaunchPlan):
    """``split_block8`` / ``split_generic``: the compress kernel into the x scratch, then the
    store kernel. The store kernel takes nothing the compress kernel has not checked already
    (the same per-token arrays and scratch, the layer's fixed tensors): once the first launch
    passed TVM-FFI's checks, the second passes them too."""

    uses_scratch = True

    def launch_kernels(self, fixed, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                       scratch) -> None:
        state_cache, rms_norm_weight, cos_sin_cache, k_cache, _ = fixed
        pool, store = self.ffi
        pool(state_cache, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping, scratch)
        store(scratch, positions, slot_mapping, kv_slot_mapping, rms_norm_weight, cos_sin_cache, k_cache, self.eps,
              self.fp8_inv)


@dataclass(frozen=True)
class IndexerLaunch(LaunchPlan):
    """The indexer compressor (SPEC §12): one kernel on the call's tensors (no ``fp8_inv``, no scratch)."""

    def launch_kernels(self, fixed, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping,
                       scratch) -> None:
        state_cache, rms_norm_weight, cos_sin_cache, k_cache, _ = fixed
        self.ffi[0](state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                    cos_sin_cache, k_cache, kv_slot_mapping, self.eps)


def uses_scratch(path: str) -> bool:
    """Whether the kernels of ``path`` keep ``x`` in the fp32 scratch (the call's ``workspace``)."""
    return _plan_class(path).uses_scratch


def _plan_class(path: str) -> type:
    if path == "fused_handoff":
        return HandoffLaunch
    if path == "indexer":
        return IndexerLaunch
    return SplitLaunch if path.startswith("split") else SingleLaunch


def entry_format(layout: str, entries_per_page: int, weight_dtype: torch.dtype, align: int) -> EntryFormat:
    return EntryFormat(layout=layout, entries_per_page=entries_per_page,
                       weight_dtype="bfloat16" if weight_dtype == torch.bfloat16 else "float32", store_align=align)


def compress_configs(path: str, block_size: int, num_tokens: int, entry: EntryFormat, policy: dispatch.Policy,
                     pdl: bool, early_metadata: bool) -> tuple:
    """``((compile function name, static config), ...)`` of one C4 (``path="c4"``) or C128 path
    at ``num_tokens``, in launch order."""
    if path == "c4":
        return (("compile_c4", dispatch.c4_config(block_size, entry, policy, pdl)),)
    pool = dispatch.c128_pool_config(path, block_size, policy, num_tokens=num_tokens, pdl=pdl,
                                     early_metadata=early_metadata)
    if path == "fused_cluster":
        return (("compile_c128_cluster", ClusterConfig(pool, entry)),)
    if path == "fused_handoff":
        return (("compile_c128_handoff", HandoffConfig(pool, entry)),)
    if path == "fused_pipelined":
        return (("compile_c128_pipelined", PipelinedConfig(pool, entry, policy.shapes.pipelined_ctas_per_sm)),)
    return (("compile_c128_pool", pool), ("compile_c128_store", dispatch.store_config(entry, policy, pdl)))


def compress_kernels(path: str, block_size: int, num_tokens: int, entry: EntryFormat, policy: dispatch.Policy,
                     pdl: bool, early_metadata: bool, device: torch.device) -> tuple[tuple, tuple]:
    """``(compiled kernels, grid)`` of :func:`compress_configs` (compiled on first use); the
    pipelined kernel's grid is as many clusters as ``device`` holds at once
    (:func:`pipelined_grid`), the other kernels' grids follow from the tensors."""
    configs = compress_configs(path, block_size, num_tokens, entry, policy, pdl, early_metadata)
    compile_cache = kernels()
    compiled = tuple(getattr(compile_cache, name)(config) for name, config in configs)
    if path != "fused_pipelined":
        return compiled, ()
    return compiled, (pipelined_grid(compiled[0], configs[0][1], num_tokens, policy, device),)


def pipelined_grid(compiled, config: PipelinedConfig, num_tokens: int, policy: dispatch.Policy,
                   device: torch.device) -> int:
    """Clusters of the pipelined kernel for ``num_tokens`` (:func:`.dispatch.pipelined_clusters`)
    from the driver's count of the compiled kernel's resident clusters (asked once per kernel)."""
    from .fused_c128_pipelined import C128PipelinedKernel

    kernel = C128PipelinedKernel(config)
    resident = occupancy.resident_clusters(compiled, device, kernel.threads, kernel.smem_bytes, kernel.tiles)
    return dispatch.pipelined_clusters(num_tokens, resident, sm_count(device), policy)


def build_compress_plan(tensors: tuple, block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, debug, workspace,
                        c128_path, policy: dispatch.Policy, pdl: bool, early_metadata: bool,
                        hadamard=False) -> LaunchPlan:
    """Validate (SPEC §9 and this implementation's constraints), dispatch and compile; the
    indexer layouts (SPEC §12, head width 128, ``hadamard``) take the path ``"indexer"``, one
    :mod:`.indexer_launch` kernel (``workspace`` and ``early_metadata`` do not apply there;
    ``c128_path`` is checked)."""
    state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight, cos_sin_cache, \
        k_cache, kv_slot_mapping = tensors
    call = validate_compress_norm_rope_store(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
        rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
        fp8_scale=fp8_scale, hadamard=hadamard, debug=debug, head_dims=HEAD_DIMS,  # a 128-wide state names its layouts
    )
    num_tokens, block_size = call.pooling.num_tokens, call.pooling.block_size
    dispatch.check_c128_path(c128_path)  # also for C4, where it has no effect: a typo is still an error
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {pdl!r}")
    if not isinstance(policy, dispatch.Policy):
        raise ValueError(f"policy: expected a dispatch.Policy, got {type(policy).__name__}")
    device = state_cache.device
    early = early_metadata and pdl  # without PDL there is no wait to read ahead of
    if call.pooling.config.head_dim != HEAD_DIM:  # the indexer compressor (SPEC §12)
        path = "indexer"
    elif call.pooling.config.ratio == 128:
        path = dispatch.choose(c128_path, num_tokens, block_size, policy)
    else:
        path = "c4"
    if uses_scratch(path):
        x_buffer(workspace, num_tokens, device, "workspace")  # raises on a bad workspace
    _require_cuda("state_cache", state_cache)
    eps = float(call.store.eps)
    fp8_inv = float(np.float32(1.0) / call.store.fp8_scale) if call.store.layout == "fp8_per_tensor" else 1.0
    restride = any(t.stride(-1) != 1 for t in (token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping))
    if num_tokens == 0:
        return LaunchPlan((), path, eps, fp8_inv, 0, False)  # nothing to launch, nothing to restride
    if path == "indexer":
        config = indexer_launch.config_of(call, rms_norm_weight.dtype, policy, pdl)
        compiled, grid = (indexer_launch.compile_indexer(config),), ()
    else:
        entry = entry_format(call.store.layout, call.store.entries_per_page, rms_norm_weight.dtype,
                             store_align(k_cache, call.store.layout))
        compiled, grid = compress_kernels(path, block_size, num_tokens, entry, policy, pdl, early, device)
    log.debug("cutedsl: compress_norm_rope_store C%d T=%d bs=%d %s -> %s%s", call.pooling.config.ratio, num_tokens,
              block_size, layout, path, f" grid {grid}" if grid else "")
    return _plan_class(path)(compiled, path, eps, fp8_inv, num_tokens, restride, grid)


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
            positions, slot_mapping = _unit_stride_1d(positions), _unit_stride_1d(slot_mapping)
        self.kernel(kv_score, ape, positions, slot_mapping, state_cache)


def build_save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug: bool,
                    policy: dispatch.Policy, pdl: bool) -> SavePlan:
    """Validate a ``save_partial_states`` call and compile its kernel."""
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS)  # 512, and the indexer's 128 (SPEC §12)
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl: expected True or False, got {pdl!r}")
    _require_cuda("state_cache", state_cache)
    restride = positions.stride(0) != 1 or slot_mapping.stride(0) != 1
    if call.num_tokens == 0:
        return SavePlan(None, restride)
    vector_inputs = (
        kv_score.data_ptr() % 16 == 0 and (call.num_tokens <= 1 or kv_score.stride(0) % 4 == 0)
        and ape.data_ptr() % 16 == 0 and ape.stride(0) % 4 == 0
    )
    config = dispatch.save_config(call.config.ratio, call.block_size, vector_inputs, policy, pdl, call.config.head_dim)
    return SavePlan(kernels().compile_save(config), restride, vector_inputs)
