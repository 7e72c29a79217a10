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
block table), so a row of the chunk never needs a state block. ``kv`` and ``score`` are fp32
``[T, SW]`` with 16-byte aligned rows (SPEC §9), read 16 bytes a thread; ``ape`` one element at a
time (SPEC promises no row alignment there). The names follow V4.1's :mod:`.v41_rows`
(:func:`chunk_of` is its chunk start, :func:`.v41_rows.input_row` with :func:`.v41_rows.as_stored` its chunk row).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from ..config import StateFormat
from .exact_math import bf16_round_fragment, fadd
from .dependent_launch import wait_for_prerequisite_grids
from .memory import element_address, load_fragment, load_if, load_scalar, row_address, window_run_starts
from .state_format import VEC, add_ape, load_state_into, ring_position
from .v41_rows import load_values, to_binary32


def chunk_of(mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor, mPos: cute.Tensor, req,
             state: StateFormat):
    """``None`` unless ``state.rows_from_inputs``; else ``(mKv, mScore, first, P0)``: the chunk's
    inputs (fp32 ``[T, SW]`` each), its first token ``query_start_loc[req]`` and that token's
    position. ``mQsl``: int32 ``[num_reqs + 1]``; ``mPos``: int64 ``[T]``."""
    if not state.rows_from_inputs:
        return None
    first = Int64(load_scalar(mQsl, req))
    return mKv, mScore, first, Int64(load_scalar(mPos, first))


def chunk_of_token(mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor, req, token, position,
                   state: StateFormat):
    """:func:`chunk_of` for a window whose token ``token`` (its index in this call) sits at
    ``position``: under §13.4's caller's contract (a chunk's tokens at consecutive positions) the
    chunk start is ``P0 = position - (token - query_start_loc[req])``, so ``positions`` is not read
    (one dependent load fewer before the rows). ``None`` unless ``state.rows_from_inputs``."""
    if not state.rows_from_inputs:
        return None
    first = Int64(load_scalar(mQsl, req))
    return mKv, mScore, first, Int64(position) - (Int64(token) - first)


def _as_stored(values: cute.Tensor, state: StateFormat) -> cute.Tensor:
    """``R(values)``: bf16-rounded for a bf16 state, else as they are."""
    if cutlass.const_expr(state.dtype == "bfloat16"):
        return bf16_round_fragment(values)
    return values


def _select_fragment(condition, a: cute.Tensor, b: cute.Tensor) -> cute.Tensor:
    """fp32 ``(4,)``: element-wise ``a if condition else b`` (a lane-dependent choice, no branch)."""
    out = cute.make_rmem_tensor((VEC,), Float32)
    for c in range(VEC):
        out[c] = cutlass.select_(condition, a[c], b[c])
    return out


def _as_stored_where(values: cute.Tensor, in_chunk, state: StateFormat) -> cute.Tensor:
    """``R(values)`` where ``in_chunk`` (a chunk row as the save would store it), else ``values``
    (a state row, stored already)."""
    if cutlass.const_expr(state.dtype == "float32"):
        return values
    return _select_fragment(in_chunk, _as_stored(values, state), values)


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

    def load_lane_rows(self, window, q0, first_row, channel, shape: tuple, wait_after_metadata: bool) -> tuple:
        """``(sc, kv)``: a lane's ``R`` consecutive window rows from position ``q0`` at 4 channels
        (two lists of fp32 ``(4,)`` fragments), each row as :meth:`load_row` reads it, without a
        branch. ``window``: the token's :class:`.token_window.TokenWindow` (``chunk`` from
        :func:`chunk_of` or :func:`chunk_of_token`); ``first_row``: ``q0 mod r`` (its ``ape`` row);
        ``shape``: ``(R, rows_per_lookup)``.

        The rows are consecutive positions, so the chunk's are a suffix, from row
        ``chunk_from = clamp(P0 - q0, 0, R)``; the state's take one block-table read per lookup run
        (read wherever the table has the column: a chunk row needs no state block). An fp32 state
        row and a chunk row are read at an address selected between the two; a bf16 state's row
        (8 bytes) and the chunk's (16) by two predicated loads. ``wait_after_metadata``: PDL's wait
        once the metadata and block-table reads are issued (early metadata)."""
        mState, mBlockTable, req, _, mApe, ring_capacity, chunk = window
        mKv, mScore, first, chunk_start = chunk
        rows, rows_per_lookup = shape
        chunk_token = first + (Int64(q0) - chunk_start)  # the chunk token of row 0
        before = chunk_start - Int64(q0)
        chunk_from = Int32(cutlass.select_(before < Int64(0), Int64(0),
                                           cutlass.select_(before > Int64(rows), Int64(rows), before)))
        starts = list(window_run_starts(mState, mBlockTable, req, Int64(q0), rows, rows_per_lookup, self.block_size,
                                        ring_capacity if self.state.ring else None, bounded=True))
        wait_for_prerequisite_grids(wait_after_metadata)
        width = self.state.element_bytes
        row_stride_bytes = Int64(mState.stride[1]) * width
        sc, kv = [], []
        for i in range(rows):  # unrolled at trace time
            in_chunk, in_state = Int32(i) >= chunk_from, Int32(i) < chunk_from
            state_row = starts[i // rows_per_lookup] + row_stride_bytes * (i % rows_per_lookup)
            sources = (state_row + channel * width, element_address(mKv, chunk_token + i, channel))
            row_kv = self._row_values(sources, (in_chunk, in_state))
            sources = (state_row + (self.state_width + channel) * width, element_address(mScore, chunk_token + i, channel))
            row_sc = self._row_values(sources, (in_chunk, in_state))
            kv.append(_as_stored_where(row_kv, in_chunk, self.state))
            sc.append(self._score_as_pooled(row_sc, in_chunk, mApe, first_row + i, channel))
        return sc, kv

    def _row_values(self, sources: tuple, where: tuple):
        """fp32 ``(4,)``: the 4 elements at ``sources = (state byte address, chunk byte address)``, the
        chunk's where ``where = (in_chunk, in_state)`` says so, as read (the chunk's not yet rounded)."""
        state_address, input_address = sources
        in_chunk, in_state = where
        if cutlass.const_expr(self.state.dtype == "float32"):
            return load_fragment(Float32, Int64(cutlass.select_(in_chunk, input_address, state_address)), VEC, 16)
        from_state = to_binary32(load_if(BFloat16, state_address, VEC, in_state))
        from_input = load_if(Float32, input_address, VEC, in_chunk)
        return _select_fragment(in_chunk, from_input, from_state)

    def _score_as_pooled(self, score: cute.Tensor, in_chunk, mApe: cute.Tensor, ape_row, channel) -> cute.Tensor:
        """A row's score as pooling reads it: a chunk row's ``R(add(score, a))`` (``"save"``) or
        ``add(R(score), a)`` (``"compress"``), a state row's as stored (``add(S, a)`` with ``"compress"``)."""
        compress = self.state.ape_at == "compress"
        wanted = True if compress else in_chunk
        bias = cute.make_rmem_tensor((VEC,), Float32)
        for c in range(VEC):  # elements one by one: SPEC promises no ape row alignment
            bias[c] = load_if(Float32, element_address(mApe, ape_row, channel + c), 1, wanted)[0]
        out = cute.make_rmem_tensor((VEC,), Float32)
        if cutlass.const_expr(compress):
            stored = _as_stored_where(score, in_chunk, self.state)
            for c in range(VEC):
                out[c] = fadd(stored[c], bias[c])
        else:
            added = cute.make_rmem_tensor((VEC,), Float32)
            for c in range(VEC):
                added[c] = fadd(score[c], bias[c])
            out.store(_select_fragment(in_chunk, _as_stored(added, self.state), score).load())
        return out


__all__ = ["StepRows", "chunk_of", "chunk_of_token", "chunk_window_row"]
