"""What a launch needs besides the call's tensors, and the host-side argument fix-ups.

- the fp32 ``x`` scratch of the paths that keep ``x`` between stages (a given ``workspace``,
  checked, or one allocated per call);
- the ``fused_handoff`` kernel's per-token arrival counters, one array per (device, stream);
- the device's multiprocessor count;
- unit strides restored on per-token arrays of length <= 1 (SPEC §9 allows any stride there;
  TVM-FFI wants 1);
- a compiled kernel's TVM-FFI function, and a bound layer's fixed tensors as TVM-FFI tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ....spec.constants import HEAD_DIM
from ....spec.entry_layout import ENTRY_LAYOUTS
from ..config import store_alignments

SUPPORTED_DEVICES = ("cuda",)


# ---- argument helpers -----------------------------------------------------------------------
def require_cuda(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type not in SUPPORTED_DEVICES:
        raise ValueError(f"{name}: expected a tensor on one of {SUPPORTED_DEVICES}, got a tensor on {tensor.device}")


def unit_stride_1d(tensor: torch.Tensor) -> torch.Tensor:
    """A per-token array of length <= 1 may carry any stride (SPEC §9); TVM-FFI wants 1."""
    if tensor.stride(0) != 1:
        return tensor.as_strided(tuple(tensor.shape), (1,))
    return tensor


def unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """Same for a 2-D table whose last extent is 1."""
    if tensor.stride(-1) != 1:
        return tensor.as_strided(tuple(tensor.shape), tuple(tensor.stride()[:-1]) + (1,))
    return tensor


def unit_strides(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping):
    return (unit_stride_1d(token_to_req_indices), unit_stride_1d(positions), unit_stride_1d(slot_mapping),
            unit_last_stride(block_table), unit_stride_1d(kv_slot_mapping))


def store_align(k_cache: torch.Tensor, layout: str) -> int:
    """Byte alignment of every 4-channel store: paged records always 16 (validated: 16-byte
    aligned base and page stride, records at multiples of 8); rows allow any strides."""
    aligns = store_alignments(ENTRY_LAYOUTS[layout])
    if len(aligns) == 1:
        return aligns[0]
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
        return planned_scratch(None, num_tokens, device)
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
        return unit_last_stride(buffer)
    if buffer.dim() == 1 and buffer.is_contiguous() and buffer.numel() >= num_tokens * HEAD_DIM:
        return planned_scratch(buffer, num_tokens, device)
    raise ValueError(
        f"{name}: expected float32 [S >= {num_tokens}, {HEAD_DIM}] (rows 16-byte aligned) or a contiguous "
        f"float32 tensor of >= {num_tokens * HEAD_DIM} elements, got shape {list(buffer.shape)}"
    )


def planned_scratch(workspace, num_tokens: int, device: torch.device) -> torch.Tensor:
    """The x scratch of a planned call: the plan's key holds the workspace's layout, which
    :func:`x_buffer` checked when the plan was built."""
    if workspace is None:
        return torch.empty((num_tokens, HEAD_DIM), dtype=torch.float32, device=device)
    if workspace.dim() == 2:
        return unit_last_stride(workspace)
    return workspace[: num_tokens * HEAD_DIM].view(num_tokens, HEAD_DIM)


def bound_scratch(workspace, num_tokens: int, device: torch.device) -> torch.Tensor:
    """The x scratch of a bound layer's eager call, checked here only where TVM-FFI does not
    check it: the rows (``S >= T``, a row stride that keeps rows 16-byte aligned) of a 2-D
    workspace, the length of a 1-D one; dtype, width, unit last stride, base alignment and
    device are the kernel's TVM-FFI checks. Raises ``ValueError`` for anything else: the
    caller then validates the call the long way (:func:`x_buffer` names what is wrong)."""
    if workspace is None or (workspace.dim() == 1 and workspace.numel() >= num_tokens * HEAD_DIM
                             and workspace.is_contiguous()):
        return planned_scratch(workspace, num_tokens, device)
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
@dataclass(frozen=True)
class LaunchFacts:
    """What a plan learns of the device and the destination before it compiles."""

    device: torch.device
    store_align: int  # bytes every 4-channel store of the entry may assume
    sm_count: int | None  # multiprocessors (None off CUDA)


def launch_facts(state_cache: torch.Tensor, k_cache: torch.Tensor, layout: str, workspace,
                 num_tokens: int) -> LaunchFacts:
    """This implementation's own checks of a validated call, and the facts a plan needs: CUDA
    tensors, a usable ``workspace`` when one is given (fp32 ``[S >= T, 512]`` or a long enough
    flat one: :func:`x_buffer`), the store alignment of ``k_cache`` and the device's SM count."""
    device = state_cache.device
    if workspace is not None:
        x_buffer(workspace, num_tokens, device, "workspace")  # raises on a bad workspace
    require_cuda("state_cache", state_cache)
    multiprocessors = sm_count(device)
    return LaunchFacts(device, store_align(k_cache, layout), multiprocessors)



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


def device_index(device: torch.device) -> int:
    """The CUDA ordinal of ``device`` (the current device when it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _current_stream(device: torch.device) -> int:
    try:
        return torch._C._cuda_getCurrentRawStream(device_index(device))
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
