"""Buffers as they are in memory: the owning allocation plus the strided view an API sees.

Conformance compares *whole allocations*, padding included, so a write outside the view
(past a padded row, into a page's tail) is caught. A :class:`Buffer` remembers where its
view sits inside its allocation, and can be copied to NumPy or to torch on any device
with the same offsets and strides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _torch_dtype(logical: str):
    import torch

    return {
        "float32": torch.float32, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
        "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
    }[logical]


@dataclass
class Buffer:
    """An owning byte allocation and one strided view into it."""

    owner: np.ndarray  # uint8 [nbytes], C-contiguous: the whole allocation
    offset: int  # byte offset of view element [0, ..., 0] in owner
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in bytes
    dtype: np.dtype  # NumPy element type of the view (uint16 = bf16 bits)
    logical: str  # "float32", "bfloat16", "float8_e4m3fn", ... (the torch dtype)

    @classmethod
    def of(cls, view: np.ndarray, logical: str | None = None) -> "Buffer":
        """Wrap a view; its allocation is the array that owns the memory (``view.base``)."""
        owner = view
        while getattr(owner, "base", None) is not None:  # also through as_strided's wrapper
            owner = owner.base
        if not isinstance(owner, np.ndarray) or not owner.flags.c_contiguous:
            raise ValueError("Buffer.of: the owning array must be C-contiguous")
        owner_bytes = owner.reshape(-1).view(np.uint8)
        offset = view.__array_interface__["data"][0] - owner_bytes.__array_interface__["data"][0]
        if logical is None:
            logical = "bfloat16" if view.dtype == np.uint16 else str(view.dtype)
        return cls(owner=owner_bytes.copy(), offset=offset, shape=tuple(view.shape), strides=tuple(view.strides),
                   dtype=view.dtype, logical=logical)

    def view_of(self, owner: np.ndarray) -> np.ndarray:
        """This buffer's view into ``owner``, an allocation of the same size (e.g. a result)."""
        return np.ndarray(self.shape, dtype=self.dtype, buffer=owner, offset=self.offset, strides=self.strides)

    def numpy_copy(self) -> tuple[np.ndarray, np.ndarray]:
        """A fresh copy of the allocation and the view into it."""
        owner = self.owner.copy()
        return owner, self.view_of(owner)

    def torch_copy(self, device: str):
        """A fresh torch copy on ``device``: ``(owner uint8 tensor, view tensor of the logical dtype)``."""
        import torch

        itemsize = self.dtype.itemsize
        if self.offset % itemsize or any(s % itemsize for s in self.strides):
            raise ValueError("Buffer.torch_copy: view offset and strides must be whole elements")
        owner = torch.from_numpy(self.owner.copy()).to(device)
        usable = (owner.numel() // itemsize) * itemsize
        typed = owner[:usable].view(_torch_dtype(self.logical))  # storage offset 0
        view = torch.as_strided(typed, self.shape, tuple(s // itemsize for s in self.strides), self.offset // itemsize)
        return owner, view

    @property
    def nbytes(self) -> int:
        return int(self.owner.nbytes)
