"""SPEC §13.4 step 1 in V4's CuTe DSL kernels: a window row from this call's inputs or from the state.

A kernel compiled with ``StateFormat(rows_from_inputs=True)`` pools a window row at position ``q``
of request ``req`` from the chunk when ``q >= P0`` (``P0 = positions[query_start_loc[req]]``, the
chunk's first position), else from the state (paged, or the ring of SPEC §13.3), as
:mod:`.state_format` reads it. A chunk row is token ``u = query_start_loc[req] + (q - P0)``'s
projections as the save would store them and pooling read them back, with ``R`` the bf16
rounding of a bf16 state (the identity for fp32) and ``a = ape[q mod r]``:

- ``kv_i = R(kv[u])``;
- ``s_i = R(add(score[u], a))`` with ``ape_at="save"``, ``add(R(score[u]), a)`` with ``"compress"``.

Each row is one decision and its own block-table lookup (a state row only: a chunk row reads no
block table), so a row of the chunk never needs a state block. For an fp32 state the C128
kernels read a lane's consecutive rows together (:meth:`StepRows.load_rows`): the decision is a
select of addresses, not a branch. ``kv`` and ``score`` are fp32
``[T, SW]`` with 16-byte aligned rows (SPEC §9), read 16 bytes a thread; ``ape`` one element at a
time (SPEC promises no row alignment there). The names follow V4.1's :mod:`.v41_rows`
(:func:`chunk_of` is its chunk start, :func:`.v41_rows.input_row` with :func:`.v41_rows.as_stored` its chunk row).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..config import StateFormat
from .exact_math import bf16_round_fragment, fadd
from .memory import element_address, load_fragment, load_if, load_scalar, row_address
from .state_format import VEC, add_ape, load_state_into, ring_position
from .v41_rows import load_values


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


def chunk_window_row(
    kv: cute.Tensor,  # fp32 (4,) out
    sc: cute.Tensor,  # fp32 (4,) out
    chunk,  # chunk_of(...): (kv fp32 [T, SW], score fp32 [T, SW], first token, P0)
    mApe: cute.Tensor,  # fp32 [r, SW]
    position,  # Int64 q >= P0
    channel,  # the first of the 4 channels (within SW)
    ape_row,  # q mod r
    state: StateFormat,
) -> None:
    """``kv``, ``sc`` (fp32 ``(4,)``) <- channels ``channel..+3`` of the chunk's row at ``position``
    (SPEC §13.4 step 1; ``chunk`` from :func:`chunk_of`, ``mApe`` fp32 ``[r, SW]``, ``ape_row`` =
    ``position mod r``)."""
    mKv, mScore, first, chunk_start = chunk
    token = first + (Int64(position) - chunk_start)
    kv.store(_as_stored(load_values(mKv, token, channel), state).load())
    score = load_values(mScore, token, channel)
    bias = load_fragment(Float32, element_address(mApe, ape_row, channel), VEC, 4)
    if cutlass.const_expr(state.ape_at == "save"):
        for c in range(VEC):  # unrolled at trace time
            score[c] = fadd(score[c], bias[c])
        sc.store(_as_stored(score, state).load())
    else:
        stored = _as_stored(score, state)
        for c in range(VEC):
            sc[c] = fadd(stored[c], bias[c])


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
        kv: cute.Tensor,  # fp32 (4,) out
        sc: cute.Tensor,  # fp32 (4,) out
        mState: cute.Tensor,  # fp32 or bf16 [num_blocks, bs, 2*SW]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        req,  # block_table row of the token
        position,  # Int64 q >= 0, the row's position
        channel,  # the first of the 4 channels (within SW)
        ape_row,  # q mod r
        mApe: cute.Tensor,  # fp32 [r, SW]
        ring_capacity,  # Int32 C (read only in a ring)
        chunk,  # chunk_of(...)
    ):
        """Row ``q`` of the window at 4 channels: the chunk's when ``q >= P0`` (:func:`chunk_window_row`),
        else the state's as pooling reads it (SPEC §13.1-§13.3): one block-table read, a ring's row at
        ``q mod C``, ``ape`` added to its score with ``ape_at="compress"``."""
        if Int64(position) >= chunk[3]:
            chunk_window_row(kv, sc, chunk, mApe, position, channel, ape_row, self.state)
        else:
            width = self.state.element_bytes
            start = row_address(mState, mBlockTable, req, ring_position(Int64(position), self.state, ring_capacity),
                                self.block_size)
            load_state_into(sc, start + (self.state_width + channel) * width, self.state)
            add_ape(sc, mApe, ape_row, channel, self.state)
            load_state_into(kv, start + channel * width, self.state)


    @cute.jit
    def load_rows(
        self,
        kv: list,  # R fp32 (4,) fragments out
        sc: list,  # R fp32 (4,) fragments out
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 2*SW]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        req,  # block_table row of the token
        first_position,  # Int64 q0 >= 0: rows q0 .. q0 + R - 1
        channel,  # the first of the 4 channels (within SW)
        first_ape_row,  # q0 mod r (the R rows' ape rows follow it)
        mApe: cute.Tensor,  # fp32 [r, SW]
        ring_capacity,  # Int32 C (read only in a ring)
        chunk,  # chunk_of(...)
        rows_per_lookup: int,  # rows of one block-table read (divides bs and R; q0 a multiple of it)
    ):
        """:meth:`load_row` for ``R = len(kv)`` consecutive rows of an fp32 state, without a branch.

        Each row's source is a select: the chunk's row (``kv``/``score`` rows of consecutive tokens)
        or the state's (one block-table read per run of ``rows_per_lookup`` rows, read only where the
        run holds a state row; a ring's ``q0 mod C`` once, each run stepped from it). One 16-byte load
        of the chosen address per row and operand, so the lane's rows are one round of loads after
        the block-table round, where a branch a row would wait for each row's loads in turn."""
        mKv, mScore, first, chunk_start = chunk
        q0 = Int64(first_position)
        token0 = first + (q0 - chunk_start)  # the chunk token of row 0 (meaningful where q >= P0)
        chunk_kv, chunk_sc = element_address(mKv, token0, channel), element_address(mScore, token0, channel)
        kv_step, sc_step = Int64(mKv.stride[0]) * 4, Int64(mScore.stride[0]) * 4
        row_stride = Int64(mState.stride[1]) * 4
        index0 = q0
        if cutlass.const_expr(self.state.ring):
            index0 = q0 % Int64(ring_capacity)  # SPEC §13.3; C >= R, so each run wraps at most once
        starts = []
        for r in cutlass.range_constexpr(len(kv) // rows_per_lookup):
            index = index0 + r * rows_per_lookup
            if cutlass.const_expr(self.state.ring):
                index = Int64(cutlass.select_(index >= Int64(ring_capacity), index - Int64(ring_capacity), index))
            column = index // self.block_size
            wanted = q0 + r * rows_per_lookup < chunk_start  # the run's first row is the state's
            block = Int64(load_if(Int32, element_address(mBlockTable, req, column), 1, wanted)[0])
            starts.append(element_address(mState, block, index - column * self.block_size, 0))
        for i in cutlass.range_constexpr(len(kv)):
            from_chunk = q0 + i >= chunk_start
            state_row = starts[i // rows_per_lookup] + row_stride * (i % rows_per_lookup)
            kv_address = select_address(from_chunk, chunk_kv + kv_step * i, state_row + channel * 4)
            sc_address = select_address(from_chunk, chunk_sc + sc_step * i, state_row + (self.state_width + channel) * 4)
            kv[i].store(load_if(Float32, kv_address, VEC, True).load())  # issued here, not sunk to their use
            sc[i].store(load_if(Float32, sc_address, VEC, True).load())
        for i in cutlass.range_constexpr(len(kv)):
            from_chunk = q0 + i >= chunk_start
            ape_wanted = from_chunk if cutlass.const_expr(self.state.ape_at == "save") else True
            address = element_address(mApe, first_ape_row + i, channel)
            for c in cutlass.range_constexpr(VEC):
                bias = load_if(Float32, address + 4 * c, 1, ape_wanted)[0]
                if cutlass.const_expr(self.state.ape_at == "save"):  # the chunk's raw score takes ape
                    sc[i][c] = cutlass.select_(from_chunk, fadd(sc[i][c], bias), sc[i][c])
                else:
                    sc[i][c] = fadd(sc[i][c], bias)


def select_address(condition, a, b):
    """``a`` where ``condition`` (Boolean) else ``b``: two Int64 byte addresses."""
    return Int64(cutlass.select_(condition, Int64(a), Int64(b)))


__all__ = ["StepRows", "chunk_of", "chunk_window_row", "select_address"]
