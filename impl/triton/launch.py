"""A Triton kernel's launch for one launch plan, without Triton's per-call argument binding.

Triton's ``kernel[grid](...)`` binds every argument, computes its specialization (dtypes,
16-byte alignment of pointers, integers equal to 1 or divisible by 16) and looks the compiled
kernel up on every call: several times the cost of the launch itself. A plan's key already
holds everything that specialization depends on (dtypes, shapes, strides, base alignment of
every tensor, the integer arguments derived from them), so :class:`Launcher` launches through
Triton the first time (compiling if needed) and then calls the compiled kernel's own launcher
(``CompiledKernel[grid]``) with the same arguments. Under the interpreter (no compiled kernel)
every launch goes through Triton.
"""

from __future__ import annotations


class Launcher:
    """Launch ``kernel`` on ``grid`` with ``constants`` (constexpr parameters and launch options)."""

    def __init__(self, kernel, grid: tuple, constants: dict):
        self.kernel, self.grid, self.constants = kernel, grid, constants
        self.runner = None  # the compiled kernel's launcher, after the first launch
        self.tail = ()  # the constexpr parameters after the runtime arguments, in signature order

    def __call__(self, *args) -> None:
        if self.runner is not None:
            self.runner(*args, *self.tail)
            return
        compiled = self.kernel[self.grid](*args, **self.constants)
        names = getattr(self.kernel, "arg_names", None)
        if compiled is None or not hasattr(compiled, "packed_metadata") or names is None:
            return  # the interpreter, or a Triton without the compiled launcher: keep Triton's path
        rest = names[len(args):]
        if all(name in self.constants for name in rest):
            self.tail = tuple(self.constants[name] for name in rest)
            grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
            self.runner = compiled[grid]
