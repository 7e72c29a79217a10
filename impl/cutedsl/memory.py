"""Global-memory access through raw 64-bit byte addresses with known alignment.

Why raw addresses: the caches exceed 2^31 bytes and may have padded, size-1 or otherwise
unusual strides that SPEC §9 allows. Computing ``base + Int64 offset`` ourselves keeps every
offset 64-bit, and building the pointer with an explicit ``assumed_align`` tells the
compiler exactly the alignment the front end has checked, which is what lets a 4-float
access become one ``ld.global.v4.b32`` (and a bf16 quad one 8-byte store) without any
divisibility contract on the strides themselves (TVM-FFI would enforce those even on
size-1 dimensions, where SPEC lets strides be anything).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

GMEM = cute.AddressSpace.gmem


def gmem_tensor(dtype, byte_address, count: int, align: int) -> cute.Tensor:
    """A 1-D global tensor of ``count`` contiguous ``dtype`` elements at ``byte_address``."""
    ptr = cute.make_ptr(dtype, byte_address, GMEM, assumed_align=align)
    return cute.make_tensor(ptr, cute.make_layout(count))


def load_into(frag: cute.Tensor, byte_address, align: int) -> None:
    """Registers ``frag`` <- contiguous global memory (vectorized up to ``align`` bytes)."""
    cute.autovec_copy(gmem_tensor(frag.element_type, byte_address, cute.size(frag), align), frag)


def load_fragment(dtype, byte_address, count: int, align: int) -> cute.Tensor:
    """A new register fragment of ``count`` contiguous elements."""
    frag = cute.make_rmem_tensor((count,), dtype)
    load_into(frag, byte_address, align)
    return frag


def store_fragment(frag: cute.Tensor, byte_address, align: int) -> None:
    """``frag`` (registers) -> contiguous global memory at ``byte_address``."""
    cute.autovec_copy(frag, gmem_tensor(frag.element_type, byte_address, cute.size(frag), align))


def store_scalar(dtype, byte_address, value) -> None:
    """One element store (e.g. a UE8M0 scale byte)."""
    gmem_tensor(dtype, byte_address, 1, dtype.width // 8)[0] = value


def element_address(tensor: cute.Tensor, *indices) -> Int64:
    """Byte address of ``tensor[indices]`` from its (dynamic) strides, all in Int64."""
    offset = Int64(0)
    for mode, index in enumerate(indices):
        offset = offset + Int64(index) * Int64(tensor.stride[mode])
    return tensor.iterator.toint() + offset * (tensor.element_type.width // 8)


def load_scalar(tensor: cute.Tensor, *indices):
    """``tensor[indices]`` with 64-bit index arithmetic."""
    dtype = tensor.element_type
    return gmem_tensor(dtype, element_address(tensor, *indices), 1, dtype.width // 8)[0]
