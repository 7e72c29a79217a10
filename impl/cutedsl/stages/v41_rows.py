"""SPEC §14.3's rows in CuTe DSL device code: the projections and ratio 2's state (SPEC §13.1,
§13.3, §13.4), read as pooling reads them and saved after the compress.

Thread mapping: thread ``t`` of a token's 128 holds channels ``4t..4t+3`` of a 512-wide row
(fp32 fragments of 4). ``kv``, ``score`` and a state are fp32 or bf16; bf16 elements convert
exactly to binary32 (``cvt`` of a bf16 to f32 only appends zero bits). A bf16 state stores a
value rounded once to bf16 (``cvt.rn.bf16x2.f32``, :func:`.exact_math.to_bf16_fragment`).

Alignment: ``kv``/``score`` rows and state rows start on 16 bytes (SPEC §14.8, §3, §13.1), so a
thread's 4 channels are one 16-byte (fp32) or 8-byte (bf16) access. Every address is a 64-bit
byte address (:mod:`.memory`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int64

from ..config import HEAD_DIM
from .exact_math import bf16_round_fragment, to_bf16_fragment
from .memory import element_address, load_fragment, load_scalar, store_fragment

VEC = 4  # channels per thread


def load_values(mRows: cute.Tensor, row, first_channel, align_rows: bool = True) -> cute.Tensor:
    """fp32 ``(4,)``: elements ``first_channel..+3`` of row ``row`` of an fp32 or bf16 ``[rows, n]``
    tensor (bf16 converted exactly). ``align_rows``: rows start on 16 bytes (one vector access),
    else element-aligned accesses (``k_pre``, whose rows SPEC leaves unaligned)."""
    dtype = mRows.element_type
    width = dtype.width // 8
    align = VEC * width if align_rows else width
    raw = load_fragment(dtype, element_address(mRows, row, first_channel), VEC, align)
    if cutlass.const_expr(dtype is Float32):
        return raw
    values = cute.make_rmem_tensor((VEC,), Float32)
    values.store(raw.load().to(Float32))
    return values


def store_values(mRows: cute.Tensor, address, values: cute.Tensor) -> None:
    """fp32 ``values`` (4,) at ``address`` in ``mRows``' dtype: as they are (fp32), or each
    rounded once to bf16 (nearest, ties to even)."""
    if cutlass.const_expr(mRows.element_type is Float32):
        store_fragment(values, address, 4 * VEC)
    else:
        store_fragment(to_bf16_fragment(values), address, 2 * VEC)


def input_row(mKv: cute.Tensor, mScore: cute.Tensor, token, t):
    """``(kv, score)``: token ``token``'s projections at thread ``t``'s channels, binary32, exact.

    ``mKv``, ``mScore``: fp32 or bf16 ``[T, 512]``."""
    return load_values(mKv, token, t * VEC), load_values(mScore, token, t * VEC)


def as_stored(values: cute.Tensor, input_dtype, state_dtype) -> cute.Tensor:
    """``R(values)``: the value a save stores and pooling reads back: ``bf16`` for an fp32 input
    saved in a bf16 state; the identity otherwise (an fp32 state, or values already bf16)."""
    if cutlass.const_expr(state_dtype is BFloat16 and input_dtype is Float32):
        return bf16_round_fragment(values)
    return values


def chunk_row(mKv: cute.Tensor, mScore: cute.Tensor, state_dtype, token, t):
    """SPEC §13.4 step 1: a window row in the chunk, from token ``token``'s projections as the save
    would store it and pooling read it back: ``(R(kv), R(score))``."""
    kv, score = input_row(mKv, mScore, token, t)
    return as_stored(kv, mKv.element_type, state_dtype), as_stored(score, mScore.element_type, state_dtype)


def state_slot(mBlockTable: cute.Tensor, request, position, block_size: int, ring: bool, ring_capacity):
    """``(slot, block, offset)`` (Int64) of the state row of ``position`` of block-table row
    ``request``: paged ``block_table[request, q // bs]``, ``q mod bs``; in a ring (SPEC §13.3)
    the same with ``q mod C`` in place of ``q``. ``slot = block * bs + offset`` names the row as
    ``slot_mapping`` does. ``mBlockTable``: int32 ``[num_reqs, max_blocks]``."""
    index = Int64(position)
    if cutlass.const_expr(ring):
        index = index % Int64(ring_capacity)
    column = index // block_size
    block = Int64(load_scalar(mBlockTable, request, column))
    offset = index - column * block_size
    return block * block_size + offset, block, offset


def state_row(mState: cute.Tensor, block, offset, t):
    """``(kv, score)``: thread ``t``'s channels of state row ``[block, offset]`` as binary32 (a bf16
    state read exactly). ``mState``: fp32 or bf16 ``[num_state_blocks, bs, 1024]``: kv, then the
    raw score."""
    address = element_address(mState, block, offset, t * VEC)
    dtype = mState.element_type
    width = dtype.width // 8
    kv = load_fragment(dtype, address, VEC, VEC * width)
    score = load_fragment(dtype, address + HEAD_DIM * width, VEC, VEC * width)
    if cutlass.const_expr(dtype is Float32):
        return kv, score
    kv32 = cute.make_rmem_tensor((VEC,), Float32)
    kv32.store(kv.load().to(Float32))
    score32 = cute.make_rmem_tensor((VEC,), Float32)
    score32.store(score.load().to(Float32))
    return kv32, score32


def save_row(mKv: cute.Tensor, mScore: cute.Tensor, mState: cute.Tensor, token, slot, block_size: int, t) -> None:
    """SPEC §14.3's save of token ``token`` at state slot ``slot``: thread ``t``'s channels of
    ``R(kv[token])`` then ``R(score[token])`` (the raw score), each rounded once to bf16 for a
    bf16 state."""
    kv, score = input_row(mKv, mScore, token, t)
    block = slot // block_size
    address = element_address(mState, block, slot - block * block_size, t * VEC)
    store_values(mState, address, kv)
    store_values(mState, address + HEAD_DIM * (mState.element_type.width // 8), score)


__all__ = ["VEC", "as_stored", "chunk_row", "input_row", "load_values", "save_row", "state_row", "state_slot",
           "store_values"]
