"""Stand-ins for the compiled TVM-FFI functions on CPU: the checks TVM-FFI makes before a launch.

:func:`stub_compiler` wraps a compile function of :mod:`dsv4_compressor.impl.cutedsl.host.compile_cache`:
the real compile function runs, building its fake tensors, but
``cute.compile`` is replaced, so nothing is compiled and the fake tensors become the
parameter list of an :class:`FfiStub` (through CuTe DSL's own converter to TVM-FFI
parameters). A call of the stub checks its arguments as the wrapper TVM-FFI generates does
(``tvm_ffi_builder.decode_param_tensor``) and only then records the launch:

- a tensor where one is expected (``TypeError`` otherwise), then per tensor: base alignment,
  device index (one per call), rank, device type, dtype (int and uint of one width alike),
  static extents, one value per shared symbol (the per-token length ``T``), static strides
  except where the extent is 1;
- scalars: a Python number; an argument compiled as ``None`` (an optional tensor left out):
  ``None``.

CPU tensors stand for CUDA ones here (``device_type``); a ``meta`` tensor is one on the wrong
device type. The GPU tests run the real checks.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from dsv4_compressor.impl.cutedsl.host import compile_cache
from dsv4_compressor.impl.plan_cache import PlanCache

_WIDTHLESS = {"uint": "int"}  # TVM-FFI accepts int and uint of the same width alike


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    for prefix, same in _WIDTHLESS.items():
        if name.startswith(prefix):
            return same + name[len(prefix):]
    return name


def _as_torch(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    import tvm_ffi

    if isinstance(value, tvm_ffi.Tensor):
        return torch.from_dlpack(value)
    return None


class FfiStub:
    """One compiled kernel's TVM-FFI checks, then ``record(args)`` (tensors as data pointers).

    Two faces, as a compiled kernel has: the TVM-FFI function (``__tvm_ffi_object__()``, what
    :func:`..host.buffers.ffi_function` hands the plans) takes every parameter of the kernel's
    jitted entry positionally, the ones left at their ``None`` default at compile time too; the
    compiled object itself (calling the stub) fills those trailing defaults in."""

    execution_args = type("ExecutionArgs", (), {"has_pointer_address_arg_specs": False})()

    def __init__(self, fake_args: tuple, record, device_type: str = "cpu", defaults: int = 0):
        from cutlass.base_dsl.tvm_ffi_builder import spec
        from cutlass.cute._tvm_ffi_args_spec_converter import ConverterContext, _convert_single_arg

        context = ConverterContext()
        params = [_convert_single_arg(a, f"arg{i}", inspect.Parameter.empty, context) for i, a in enumerate(fake_args)]
        self.params = [p for p in params if not isinstance(p, spec.EnvStream)]  # the stream is not an argument
        self.defaults = defaults  # trailing parameters left at their None default (last in self.params)
        self.tensor_type, self.none_type = spec.Tensor, spec.ConstNone
        self.record, self.device_type = record, device_type

    def __tvm_ffi_object__(self):
        return self.call_all

    def __call__(self, *args):
        missing = len(self.params) - len(args)
        self.call_all(*args, *(None,) * (missing if 0 < missing <= self.defaults else 0))

    def call_all(self, *args):
        if len(args) != len(self.params):
            raise TypeError(f"Expects {len(self.params)} parameters, got {len(args)}")
        bound: dict = {}
        for index, (param, value) in enumerate(zip(self.params, args)):
            if isinstance(param, self.tensor_type):
                self._check_tensor(index, param, value, bound)
            elif isinstance(param, self.none_type):  # compiled with None: the call must pass None
                if value is not None:
                    raise TypeError(f"argument {index}: expected None, got {type(value).__name__}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"argument {index}: expected a number, got {type(value).__name__}")
        self.record(tuple(_as_torch(a).data_ptr() if _as_torch(a) is not None else a for a in args))

    def _check_tensor(self, index: int, param, value, bound: dict) -> None:
        tensor = _as_torch(value)
        if tensor is None:
            raise TypeError(f"argument {index}: Mismatched type {type(value).__name__}, expected Tensor")
        align = param.data_alignment
        if align is not None and tensor.device.type != "meta" and tensor.data_ptr() % align:
            raise ValueError(f"argument {index}: Misaligned Tensor data, expected {param.data_alignment} bytes")
        self._bind(bound, param.device_id, tensor.device.index, f"argument {index} device index")
        if tensor.dim() != len(param.shape):
            raise ValueError(f"argument {index}: Mismatched Tensor, expected ndim={len(param.shape)}")
        if tensor.device.type != self.device_type:
            raise ValueError(f"argument {index}: Mismatched Tensor, expected device_type={self.device_type}")
        if _dtype_name(tensor.dtype) != _dtype_name(param.dtype):
            raise ValueError(f"argument {index}: Mismatched Tensor, expected dtype={param.dtype}")
        for axis, (extent, given) in enumerate(zip(param.shape, tensor.shape)):
            self._bind(bound, extent, given, f"argument {index} shape[{axis}]")
        for axis, (stride, given, extent) in enumerate(zip(param.strides, tensor.stride(), tensor.shape)):
            if isinstance(stride, int) and extent != 1 and stride != given:
                raise ValueError(f"argument {index}: Mismatched strides[{axis}], expected to be {stride}")

    @staticmethod
    def _bind(bound: dict, variable, value, what: str) -> None:
        if variable is None:
            return
        if isinstance(variable, int):
            if variable != value:
                raise ValueError(f"Mismatched {what}, expected to be {variable}")
        elif bound.setdefault(id(variable), value) != value:
            raise ValueError(f"Mismatched {what}, expected to match {bound[id(variable)]}")


def _defaulted_parameters(kernel, given: int) -> int:
    """How many parameters of ``kernel``'s jitted entry come after the ``given`` compile arguments
    (each must have a ``None`` default): TVM-FFI lists them as parameters that take ``None``."""
    entry = inspect.signature(type(kernel).__call__)
    rest = list(entry.parameters.values())[1 + given:]  # after self and the given arguments
    assert all(p.default is None for p in rest), f"{type(kernel).__name__}: parameters without a default: {rest}"
    return len(rest)


@contextlib.contextmanager
def _fake_compile(record):
    """``cute.compile`` replaced by :class:`FfiStub` construction, and a private compile cache."""
    import cutlass.cute as cute

    saved, saved_cache = cute.compile, compile_cache._CACHE

    def compile_stub(kernel, *fake_args, options=None):
        defaults = _defaulted_parameters(kernel, len(fake_args))
        return FfiStub(fake_args + (None,) * defaults, record, defaults=defaults)

    cute.compile = compile_stub
    compile_cache._CACHE = {}
    try:
        yield
    finally:
        cute.compile, compile_cache._CACHE = saved, saved_cache


def stub_compiler(compile_function, kind: str, launches: list, compiled: list):
    """A compile function that returns an :class:`FfiStub` appending ``(kind, config, args)``
    to ``launches`` per accepted call, and ``(kind, config)`` to ``compiled`` per compilation."""
    stubs: dict = {}

    def compile_fn(config, **_):
        compiled.append((kind, config))
        if config not in stubs:
            with _fake_compile(lambda args: launches.append((kind, config, args))):
                stubs[config] = compile_function(config)
        return stubs[config]

    return compile_fn


def stub_kernels(monkeypatch, make) -> None:
    """Replace every kernel's compile function in the registry's table (``compile_cache.KERNELS``)
    by ``make(kernel name, real compile function)``."""
    for name, compile_function in list(compile_cache.KERNELS.items()):
        monkeypatch.setitem(compile_cache.KERNELS, name, make(name, compile_function))


def stubbed_calls(monkeypatch, module) -> tuple[list, list]:
    """Every kernel a stub (:func:`stub_compiler`), the host's device facts CPU's (:func:`host_only`)
    and ``module``'s plans (its ``_PLANS``) fresh; returns ``(launches, compiled)``: every accepted
    kernel call as ``(kernel, config, arguments)``, every compile request as ``(kernel, config)``."""
    launches, compiled = [], []
    stub_kernels(monkeypatch, lambda name, real: stub_compiler(real, name, launches, compiled))
    host_only(monkeypatch)
    monkeypatch.setattr(module, "_PLANS", PlanCache())
    return launches, compiled


def host_only(monkeypatch) -> None:
    """The host's device facts for CPU tests: no CUDA check, 132 SMs, stream 0, fresh counters."""
    from dsv4_compressor.impl.cutedsl.host import buffers

    monkeypatch.setattr(buffers, "require_cuda", lambda name, tensor: None)
    monkeypatch.setattr(buffers, "sm_count", lambda device: 132)  # the pipelined kernel's grid
    monkeypatch.setattr(buffers, "_current_stream", lambda device: 0)  # the handoff counters' key
    monkeypatch.setattr(buffers, "_COUNTERS", {})
