"""SPEC §13.4 step 1 in V4's CuTe DSL kernels: a window row from this call's inputs or from the state.

A kernel compiled with ``StateFormat(rows_from_inputs=True)`` pools a window row at position ``q``
of request ``req`` from the chunk when ``q >= P0`` (``P0 = positions[query_start_loc[req]]``, the
chunk's first position), else from the state (paged, or the ring of SPEC §13.3), as
:mod:`.state_format` reads it. A chunk row is token ``u = query_start_loc[req] + (q - P0)``'s
projections as the save would store them and pooling read them back, with ``R`` the bf16
rounding of a bf16 state (the identity for fp32) and ``a = ape[q mod r]``:

- ``kv_i = R(kv[u])``;
- ``s_i = R(add(score[u], a))`` with ``ape_at="save"``, ``add(R(score[u]), a)`` with ``"compress"``.

Each row is one decision and its own block-table lookup (read for a state row only), so a row of
the chunk never needs a state block. The decision is a select, not a branch: both sources' loads
are predicated, so a lane's rows are read in two rounds whatever their sources. ``kv`` and ``score`` are fp32
``[T, SW]`` with 16-byte aligned rows (SPEC §9), read 16 bytes a thread; ``ape`` one element at a
time (SPEC promises no row alignment there). The names follow V4.1's :mod:`.v41_rows`
(:func:`chunk_of` is its chunk start, :func:`.v41_rows.to_binary32` widens a bf16 state row).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from ..config import StateFormat
from .exact_math import bf16_round_fragment, fadd
from .memory import element_address, load_if, load_scalar
from .state_format import VEC, ring_position
from .v41_rows import to_binary32


def chunk_of(mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor, mPos: cute.Tensor, req,
             state: StateFormat):
    """``None`` unless ``state.rows_from_inputs``; else ``(mKv, mScore, first, P0)``: the chunk's
    inputs (fp32 ``[T, SW]`` each), its first token ``query_start_loc[req]`` and that token's
    position. ``mQsl``: int32 ``[num_reqs + 1]``; ``mPos``: int64 ``[T]``."""
    if not state.rows_from_inputs:
        return None
    first = Int64(load_scalar(mQsl, req))
    return mKv, mScore, first, Int64(load_scalar(mPos, first))


def _as_stored(values: cute.Tensor, state: StateFormat) -> cute.Tensor:
    """``R(values)``: bf16-rounded for a bf16 state, else as they are."""
    if cutlass.const_expr(state.dtype == "bfloat16"):
        return bf16_round_fragment(values)
    return values


class StepRows:
    """The window rows of a ``rows_from_inputs`` kernel: ``state``, ``block_size`` and the state's
    width ``SW`` (a row holds ``kv[0:SW]`` then ``score[0:SW]``) fixed per compile."""

    def __init__(self, state: StateFormat, block_size: int, state_width: int):
        self.state = state
        self.block_size = block_size
        self.state_width = state_width

    @cute.jit
    def load_row(
        self,
        kv: cute.Tensor,  # fp32 (4,) out (kept where not wanted)
        sc: cute.Tensor,  # fp32 (4,) out (kept where not wanted)
        mState: cute.Tensor,  # fp32 or bf16 [num_blocks, bs, 2*SW]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        req,  # block_table row of the token
        position,  # Int64 q, the row's position
        channel,  # the first of the 4 channels (within SW)
        ape_row,  # q mod r
        mApe: cute.Tensor,  # fp32 [r, SW]
        ring_capacity,  # Int32 C (read only in a ring)
        chunk,  # chunk_of(...)
        wanted=None,  # Boolean: the row is in the window (q >= 0), kv and sc kept elsewhere; None: every row
    ):
        """Row ``q`` of the window at 4 channels: the chunk's when ``q >= P0`` (token
        ``query_start_loc[req] + q - P0``, as the module docstring says), else the state's as pooling
        reads it (SPEC §13.1-§13.3: one block-table read, a ring's row at ``q mod C``, ``ape`` added to
        its score with ``ape_at="compress"``).

        No branch: both sources' loads are predicated (:func:`.memory.load_if`) and the values selected,
        so a lane's rows are read in one round of loads (a chunk row or a block-table entry) and a second
        (a state row), whichever source each row takes."""
        mKv, mScore, first, chunk_start = chunk
        q = Int64(position)
        from_chunk, from_state = q >= chunk_start, q < chunk_start
        if cutlass.const_expr(wanted is not None):
            from_chunk, from_state = wanted & from_chunk, wanted & from_state
        every = wanted if cutlass.const_expr(wanted is not None) else True
        width = self.state.element_bytes
        index = ring_position(q, self.state, ring_capacity)
        column = index // self.block_size
        block = Int64(load_if(Int32, element_address(mBlockTable, req, column), 1, from_state)[0])
        row = element_address(mState, block, index - column * self.block_size, 0)
        token = first + (q - chunk_start)
        chunk_kv, chunk_sc = element_address(mKv, token, channel), element_address(mScore, token, channel)
        state_kv, state_sc = row + channel * width, row + (self.state_width + channel) * width
        bias = cute.make_rmem_tensor((VEC,), Float32)
        ape_wanted = from_chunk if cutlass.const_expr(self.state.ape_at == "save") else every
        for c in cutlass.range_constexpr(VEC):
            bias[c] = load_if(Float32, element_address(mApe, ape_row, channel + c), 1, ape_wanted)[0]
        if cutlass.const_expr(self.state.dtype == "float32"):  # one source a row: select the address
            kv_in = load_if(Float32, select_address(from_chunk, chunk_kv, state_kv), VEC, every)
            sc_in = load_if(Float32, select_address(from_chunk, chunk_sc, state_sc), VEC, every)
            kv_chunk, kv_state, sc_chunk, sc_state = kv_in, kv_in, sc_in, sc_in
        else:  # fp32 chunk rows, bf16 state rows: both loads, each predicated
            kv_chunk = load_if(Float32, chunk_kv, VEC, from_chunk)
            sc_chunk = load_if(Float32, chunk_sc, VEC, from_chunk)
            kv_state = to_binary32(load_if(BFloat16, state_kv, VEC, from_state))
            sc_state = to_binary32(load_if(BFloat16, state_sc, VEC, from_state))
        if cutlass.const_expr(self.state.ape_at == "save"):  # the chunk's raw score takes ape; the state's has it
            added = cute.make_rmem_tensor((VEC,), Float32)  # a new fragment: sc_chunk may be sc_state's registers
            for c in cutlass.range_constexpr(VEC):
                added[c] = fadd(sc_chunk[c], bias[c])
            sc_chunk = added
        kv_chunk, sc_chunk = _as_stored(kv_chunk, self.state), _as_stored(sc_chunk, self.state)
        for c in cutlass.range_constexpr(VEC):
            score = cutlass.select_(from_chunk, sc_chunk[c], sc_state[c])
            if cutlass.const_expr(self.state.ape_at == "compress"):
                score = fadd(score, bias[c])
            value = cutlass.select_(from_chunk, kv_chunk[c], kv_state[c])
            if cutlass.const_expr(wanted is not None):
                value, score = cutlass.select_(wanted, value, kv[c]), cutlass.select_(wanted, score, sc[c])
            kv[c], sc[c] = value, score


def select_address(condition, a, b):
    """``a`` where ``condition`` (Boolean) else ``b``: two Int64 byte addresses."""
    return Int64(cutlass.select_(condition, Int64(a), Int64(b)))


__all__ = ["StepRows", "chunk_of", "select_address"]
