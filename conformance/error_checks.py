"""What every error case (SPEC §9, §14.8) checks with: its verdict, the array operations it breaks
arguments with (torch tensors or NumPy arrays), and whether an exception names the argument.

Shared by :mod:`.errors` (V4's cases, and the worker that runs every case) and
:mod:`.v41_errors` (DeepSeek-V4.1's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .runner import StatusVerdict


@dataclass
class ErrorVerdict(StatusVerdict):
    case: str
    implementation: str
    status: str  # pass / fail / skip
    detail: str = ""


class TorchArrays:
    """The few array operations the cases need, on torch tensors of one device."""

    bf16 = "bfloat16"  # the dtype name of a bf16 state

    def __init__(self, device: str):
        import torch

        self.torch, self.device = torch, device
        self.Array = torch.Tensor

    def zeros(self, shape, dtype: str):
        return self.torch.zeros(shape, dtype=getattr(self.torch, dtype), device=self.device)

    def as_strided(self, owner, shape, strides, offset: int = 0):  # strides and offset in elements
        return self.torch.as_strided(owner, shape, strides, offset)

    def cast(self, tensor, dtype: str):
        return tensor.to(getattr(self.torch, dtype))

    def reinterpret(self, tensor, dtype: str):
        return tensor.view(getattr(self.torch, dtype))

    def every_other(self, tensor):
        """The same values as a view with last stride 2."""
        wide = self.torch.zeros(tensor.shape[:-1] + (2 * tensor.shape[-1],), dtype=tensor.dtype, device=tensor.device)
        view = wide[..., ::2]
        view.copy_(tensor)
        return view

    def aligned_copy(self, tensor):
        """A copy in a fresh (64-byte aligned) allocation."""
        return tensor.clone(memory_format=self.torch.contiguous_format)

    def storage_bytes(self, tensor):
        """A host copy of every byte of the allocation behind ``tensor`` (its padding included)."""
        whole = self.torch.empty(0, dtype=self.torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
        return whole.cpu().clone()

    def equal(self, a, b) -> bool:
        return self.torch.equal(a, b)

    def synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()


class NumpyArrays:
    """The same operations on NumPy arrays (the host; bf16 as uint16 bit patterns)."""

    Array = np.ndarray
    device = "cpu"
    bf16 = "uint16"  # the spec's bf16 containers

    def zeros(self, shape, dtype: str):
        """Zeros in a fresh 64-byte-aligned allocation (as torch's), so alignment cases mean the same."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        raw = np.zeros(count * dtype.itemsize + 64, dtype=np.uint8)
        start = -raw.__array_interface__["data"][0] % 64
        return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)

    def as_strided(self, owner, shape, strides, offset: int = 0):  # strides and offset in elements
        size = owner.dtype.itemsize
        return np.ndarray(shape, dtype=owner.dtype, buffer=owner, offset=offset * size, strides=tuple(s * size for s in strides))

    def cast(self, array, dtype: str):
        return array.astype(dtype)

    def reinterpret(self, array, dtype: str):
        return array.view(dtype)

    def every_other(self, array):
        wide = self.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype.name)
        view = wide[..., ::2]
        view[...] = array
        return view

    def aligned_copy(self, array):
        """A copy in a fresh 64-byte aligned allocation."""
        copy = self.zeros(array.shape, array.dtype.name)
        copy[...] = array
        return copy

    def storage_bytes(self, array):
        owner = array
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        return owner.reshape(-1).view(np.uint8).copy()

    def equal(self, a, b) -> bool:
        return np.array_equal(a, b)

    def synchronize(self) -> None:
        pass


def names_argument(error: BaseException, argument: str) -> bool:
    """The message leads with the argument's name (``"<name>: ..."``, ``"<name> ..."``), or the
    exception carries it as an attribute (``argument``, ``arg``, ``name`` or ``param``). A
    message that merely contains the name somewhere (a whole signature, say) does not count."""
    for attribute in ("argument", "arg", "name", "param"):
        if getattr(error, attribute, None) == argument:
            return True
    text = str(error).lstrip(" '\"`")
    return text.startswith(argument) and (len(text) == len(argument) or not (text[len(argument)].isalnum() or text[len(argument)] == "_"))
