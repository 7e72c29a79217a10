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
from cutlass import Float32, Int64

from ..config import StateFormat
from .exact_math import bf16_round_fragment, fadd
from .memory import element_address, load_fragment, load_scalar, row_address
from .state_format import VEC, add_ape, load_state_into, ring_position
from .v41_rows import load_values


def chunk_of(mKv: cute.Tensor, mScore: cute.Tensor, mQsl: cute.Tensor, req, token, position,
             state: StateFormat):
    """``None`` unless ``state.rows_from_inputs``; else ``(mKv, mScore, first, P0)`` for the window of
    token ``token`` (its index in this call) at ``position``: the chunk's inputs (fp32 ``[T, SW]``
    each), its first token ``first = query_start_loc[req]`` (``mQsl``: int32 ``[num_reqs + 1]``) and
    its first position ``P0``, which under §13.4's caller's contract (a chunk's tokens at
    consecutive positions) is ``position - (token - first)``: ``positions`` is not read (one
    dependent load fewer before the rows)."""
    if not state.rows_from_inputs:
        return None
    first = Int64(load_scalar(mQsl, req))
    return mKv, mScore, first, Int64(position) - (Int64(token) - first)


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


__all__ = ["StepRows", "chunk_of", "chunk_window_row"]
