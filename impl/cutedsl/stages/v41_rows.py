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
from cutlass import BFloat16, Float32, Int32, Int64

from ..config import HEAD_DIM
from .exact_math import bf16_round_fragment, to_bf16_fragment
from .memory import element_address, load_elements_if, load_fragment, load_if, store_fragment

VEC = 4  # channels per thread


def to_binary32(raw: cute.Tensor) -> cute.Tensor:
    """fp32 ``(4,)``: a fragment of fp32 (itself) or bf16 elements (converted exactly)."""
    if cutlass.const_expr(raw.element_type is Float32):
        return raw
    values = cute.make_rmem_tensor((VEC,), Float32)
    values.store(raw.load().to(Float32))
    return values


def load_values(mRows: cute.Tensor, row, first_channel, align_rows: bool = True) -> cute.Tensor:
    """fp32 ``(4,)``: elements ``first_channel..+3`` of row ``row`` of an fp32 or bf16 ``[rows, n]``
    tensor (bf16 converted exactly). ``align_rows``: rows start on 16 bytes (one vector access),
    else element-aligned accesses (``k_pre``, whose rows SPEC leaves unaligned)."""
    dtype = mRows.element_type
    width = dtype.width // 8
    align = VEC * width if align_rows else width
    return to_binary32(load_fragment(dtype, element_address(mRows, row, first_channel), VEC, align))


def load_values_here(mRows: cute.Tensor, row, first_channel, align_rows: bool = True) -> cute.Tensor:
    """:func:`load_values`, issued where it is traced: a plain load whose value is used only past a
    branch is sunk below it, and waits for the loads that branch tests (:func:`.memory.load_if`)."""
    address = element_address(mRows, row, first_channel)
    return to_binary32(load_elements_if(mRows.element_type, address, VEC, align_rows, True))


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


def input_raw_if(mKv: cute.Tensor, mScore: cute.Tensor, token, t, predicate):
    """``(kv, score)``: thread ``t``'s channels of token ``token``'s row, unconverted (``(4,)`` in
    ``mKv``'s and ``mScore``'s dtypes; :func:`to_binary32` converts), read where ``predicate``
    (:func:`.memory.load_if`). ``mKv``, ``mScore``: fp32 or bf16 ``[T, 512]``, rows 16-byte aligned."""
    kv = load_if(mKv.element_type, element_address(mKv, token, t * VEC), VEC, predicate)
    score = load_if(mScore.element_type, element_address(mScore, token, t * VEC), VEC, predicate)
    return kv, score


def state_raw_if(mState: cute.Tensor, block, offset, t, predicate):
    """``(kv, score)``: thread ``t``'s channels of state row ``[block, offset]``, unconverted
    (``(4,)`` in the state's dtype), read where ``predicate``. ``mState``: fp32 or bf16
    ``[num_state_blocks, bs, 1024]``: kv, then the raw score."""
    dtype = mState.element_type
    address = element_address(mState, block, offset, t * VEC)
    kv = load_if(dtype, address, VEC, predicate)
    score = load_if(dtype, address + HEAD_DIM * (dtype.width // 8), VEC, predicate)
    return kv, score


def lookup_state_row(mBlockTable: cute.Tensor, request, position, block_size: int, ring: bool, ring_capacity, wanted):
    """``(block, offset, listed)`` of the state row of ``position`` of block-table row ``request``:
    paged ``block_table[request, q // bs]``, ``q mod bs``; in a ring (SPEC §13.3) the same with
    ``q mod C`` in place of ``q``. The entry is read only where ``listed``: ``wanted`` (Boolean),
    ``q >= 0`` and its column inside the table's row, so a lookup issued before the caller knows
    whether it reads the row stays in bounds (``block`` is undefined elsewhere).
    ``mBlockTable``: int32 ``[num_reqs, max_blocks]``; ``request`` a valid row."""
    index = Int64(position)
    if cutlass.const_expr(ring):
        index = index % Int64(ring_capacity)
    column = index // block_size
    listed = wanted & (index >= Int64(0)) & (column < Int64(mBlockTable.shape[1]))
    block = Int64(load_if(Int32, element_address(mBlockTable, request, column), 1, listed)[0])
    return block, index - column * block_size, listed


def listed_slot(block, offset, listed, block_size: int):
    """The slot ``block * bs + offset`` (Int64) of a :func:`lookup_state_row`, as ``slot_mapping``
    names the row; -1 (no slot) where the table was not read."""
    return Int64(cutlass.select_(listed, Int64(block) * block_size + Int64(offset), Int64(-1)))


def store_row(mState: cute.Tensor, kv: cute.Tensor, score: cute.Tensor, slot, block_size: int, t) -> None:
    """SPEC §14.3's save of one token's row already in registers (``kv``, ``score``: fp32 ``(4,)``,
    thread ``t``'s channels of the inputs as :func:`input_row` reads them) at state slot ``slot``:
    ``R(kv)`` then ``R(score)`` (the raw score), each rounded once to bf16 for a bf16 state.
    ``mState``: fp32 or bf16 ``[num_state_blocks, bs, 1024]``, written."""
    block = slot // block_size
    address = element_address(mState, block, slot - block * block_size, t * VEC)
    store_values(mState, address, kv)
    store_values(mState, address + HEAD_DIM * (mState.element_type.width // 8), score)


def save_row(mKv: cute.Tensor, mScore: cute.Tensor, mState: cute.Tensor, token, slot, block_size: int, t) -> None:
    """SPEC §14.3's save of token ``token`` at state slot ``slot`` (:func:`store_row` of its
    inputs). ``mKv``, ``mScore``: fp32 or bf16 ``[T, 512]``."""
    kv, score = input_row(mKv, mScore, token, t)
    store_row(mState, kv, score, slot, block_size, t)


__all__ = ["VEC", "as_stored", "input_raw_if", "input_row", "listed_slot", "load_values", "load_values_here",
           "lookup_state_row", "save_row", "state_raw_if", "store_row", "store_values", "to_binary32"]
