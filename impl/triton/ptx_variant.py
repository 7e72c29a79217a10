"""One static configuration of a Triton kernel, as :mod:`.ptx` compiles and checks it (V4's kernels
and, through :mod:`.v41_ptx`, DeepSeek-V4.1's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One static configuration of a kernel."""

    name: str
    kernel: str  # "fused" (both head widths), "split_pool", "split_store", "save", or one of v41_ptx.V41_KERNELS
    constexprs: dict
    signature_types: dict  # non-constexpr argument -> Triton type string (a tuple of them for a tuple argument)
    num_warps: int
    require_vector_loads: bool
    divisible_ints: tuple = ()  # integer arguments assumed multiples of 16 (Triton's JIT specializes such values)
    max_registers: int | None = None  # the launch's maxnreg (FusedConfig.max_registers)
