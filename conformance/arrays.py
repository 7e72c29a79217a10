"""Where an implementation's arrays live: NumPy arrays on the host, or torch tensors on a device.

One small interface over both, so that every runner of the suite (one step, replays in padded
buckets, batch invariance, multi-step sequences, the soak) builds, loads and reads back an
implementation's buffers the same way, whichever kind of array it takes
(``Capabilities.arrays``).
"""

from __future__ import annotations

import numpy as np

from .buffers import Buffer


def to_numpy(array: np.ndarray, strided: bool = False) -> np.ndarray:
    """A NumPy copy of ``array``.

    ``strided``: the copy is a view into a wider allocation — rows padded by 3 elements and
    the base moved by 1 element (so neither the base nor the row stride is 16-byte aligned),
    with a unit last stride as SPEC §9 requires; the padding holds NaN (-7 for integers).
    """
    if not strided or array.ndim == 0:
        return np.array(array, copy=True, order="C")
    shape = array.shape
    padded = shape[:-1] + (shape[-1] + 3,) if array.ndim > 1 else shape
    fill = np.uint16(0x7FC0) if array.dtype == np.uint16 else (np.nan if array.dtype.kind == "f" else -7)
    wide = np.full(1 + int(np.prod(padded)) + 5, fill, dtype=array.dtype)
    strides = [array.dtype.itemsize] * array.ndim
    for axis in range(array.ndim - 2, -1, -1):
        strides[axis] = strides[axis + 1] * padded[axis + 1]
    view = np.ndarray(shape, dtype=array.dtype, buffer=wide, offset=array.dtype.itemsize, strides=tuple(strides))
    view[...] = array
    return view


def to_torch(array: np.ndarray, device: str, strided: bool = False):
    """:func:`to_numpy`'s copy as a torch tensor on ``device``, laid out alike (uint16 bf16
    patterns become bfloat16)."""
    import torch

    host = to_numpy(array, strided)
    owner = host if host.base is None else host.base  # the wider allocation of a strided view
    if owner.dtype == np.uint16:
        tensor = torch.from_numpy(owner.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(owner)
    if host.base is None:
        return tensor.to(device)
    moved = tensor.to(device)
    return torch.as_strided(moved, host.shape, tuple(s // host.itemsize for s in host.strides), 1)


class HostArrays:
    """NumPy arrays, for an implementation declared with ``Capabilities(arrays="numpy")``."""

    device = "cpu"

    def convert(self, array: np.ndarray, strided: bool = False) -> np.ndarray:
        """A copy of an input array, strided as :func:`to_numpy` says."""
        return to_numpy(array, strided)

    def allocate(self, buffer: Buffer) -> tuple[np.ndarray, np.ndarray]:
        """A fresh copy of a buffer: (uint8 allocation, the view into it)."""
        return buffer.numpy_copy()

    def load(self, destination: np.ndarray, data: np.ndarray) -> None:
        """``destination[...] = data`` in place (same shape; data as NumPy)."""
        destination[...] = data

    def host_bytes(self, owner: np.ndarray) -> np.ndarray:
        """A host copy of a uint8 allocation."""
        return owner.copy()

    def synchronize(self) -> None:
        pass


class TorchArrays:
    """torch tensors on ``device`` ("cpu" or "cuda")."""

    def __init__(self, device: str):
        self.device = device

    def convert(self, array: np.ndarray, strided: bool = False):
        return to_torch(array, self.device, strided)

    def allocate(self, buffer: Buffer):
        return buffer.torch_copy(self.device)

    def load(self, destination, data: np.ndarray) -> None:
        """``destination.copy_(data)`` in place; uint16 data fills a bfloat16 tensor bit for bit."""
        import torch

        source = torch.from_numpy(np.ascontiguousarray(data.view(np.int16) if data.dtype == np.uint16 else data))
        if data.dtype == np.uint16:
            source = source.view(torch.bfloat16)
        destination.copy_(source.to(self.device))

    def host_bytes(self, owner) -> np.ndarray:
        self.synchronize()
        return owner.cpu().numpy().copy()

    def synchronize(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


def arrays_for(takes_numpy: bool, device: str) -> HostArrays | TorchArrays:
    """The arrays an implementation takes: NumPy (``takes_numpy``) or torch on ``device``."""
    return HostArrays() if takes_numpy else TorchArrays(device)
