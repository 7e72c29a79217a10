"""Where the persistent C128 kernel's staged window rows come from, in SPEC §13's fp32 formats.

The persistent kernel (:mod:`..kernels.fused_pipelined`) copies each lane's ``R`` consecutive
window rows of a token into shared memory, 16 bytes a row (``cp.async``), and reads them back once
they land. :class:`StagedRows` gives those 16 bytes' addresses and what a row needs once read back:

- **the state's rows**: one block-table read per lookup run, at position ``q`` (paged) or ``q mod C``
  (a ring, SPEC §13.3);
- **the chunk's rows** (``rows_from_inputs``, SPEC §13.4's step): a row at or after the request's
  chunk start ``P0`` is token ``query_start_loc[req] + (q - P0)`` of this call's ``kv``/``score``,
  which by §13.4's caller's contract (a chunk's tokens at consecutive positions) is ``u - (p - q)``
  for the pooled token ``u`` at position ``p``: the chunk start's position is never read. A lane's
  rows are consecutive positions, so its chunk rows are a suffix: rows ``i >= chunk_from``,
  ``chunk_from = clamp(query_start_loc[req] - (u - (p - q0)), 0, R)`` (``q0`` its first row's
  position). Each row's address is selected between its two sources, without a branch. A chunk
  row needs no state block, so a run's block-table entry is read wherever the table has its
  column (a paged table may end before the chunk), beside ``query_start_loc`` rather than after;
- **the score once read back**: ``add(S, ape[q mod 128])`` for every row with ``ape_at="compress"``,
  and for every chunk row with ``"save"`` (the save would have stored ``add(score, ape)``; an fp32
  state stores values as they are, so a chunk row's ``kv`` needs nothing). The window starts at a
  multiple of 128, so a lane's row ``i`` takes ``ape`` row ``first_row + i``.

A bf16 state's rows are 8 bytes a lane, which no 16-byte ``cp.async`` stages: the pipelined kernel
takes fp32 states only (:class:`..config.FusedPipelinedConfig`). SPEC §3's state traces to the plain
lookups, with no chunk and no fix-up.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..config import StateFormat
from .exact_math import fadd
from .memory import element_address, load_fragment, load_scalar, window_run_starts
from .state_format import VEC


class StagedRows:
    """The row sources of one lane of a persistent C128 CTA: the state format, ``bs``, ``R`` rows per
    lane and ``rows_per_lookup`` fixed per compile. ``sources`` is the kernel's tuple ``(mState,
    mBlockTable, ring_capacity, chunk)``: fp32 ``[num_blocks, bs, 1024]``, int32 ``[num_reqs,
    max_blocks]``, ``C`` (read only in a ring), and ``(mKv, mScore, mQsl)`` with
    ``rows_from_inputs`` (fp32 ``[T, 512]`` twice, int32 ``[num_reqs + 1]``), else None."""

    def __init__(self, state: StateFormat, block_size: int, rows_per_lane: int, rows_per_lookup: int):
        if state.dtype != "float32":
            raise ValueError(f"state: expected a float32 state (rows staged 16 bytes a lane), got {state}")
        self.state = state
        self.block_size = block_size
        self.rows_per_lane = rows_per_lane
        self.rows_per_lookup = rows_per_lookup

    def lane_rows(self, sources: tuple, req: Int32, token: tuple, first_position: Int64) -> tuple:
        """``(starts, chunk_token, chunk_from)`` of this lane's rows from position ``first_position``
        (``q0``) of the window of ``token = (p, u)`` (its position and index) of request ``req``: the
        byte addresses of the state's lookup runs' first rows, the chunk token of row 0
        (``u - (p - q0)``; 0 without a chunk) and the lane's first chunk row (``R`` without a chunk)."""
        mState, mBlockTable, ring_capacity, chunk = sources
        rows = self.rows_per_lane
        chunk_token, chunk_from = Int64(0), Int32(rows)
        if self.state.rows_from_inputs:
            position, index = token
            chunk_token = Int64(index) - (Int64(position) - Int64(first_position))
            before = Int64(load_scalar(chunk[2], req)) - chunk_token  # P0 - q0: the lane's rows before the chunk
            chunk_from = Int32(cutlass.select_(before < Int64(0), Int64(0),
                                               cutlass.select_(before > Int64(rows), Int64(rows), before)))
        starts = list(window_run_starts(mState, mBlockTable, req, Int64(first_position), rows, self.rows_per_lookup,
                                        self.block_size, ring_capacity if self.state.ring else None,
                                        bounded=self.state.rows_from_inputs))
        return starts, chunk_token, chunk_from

    def staged_address(self, sources: tuple, lane_rows: tuple, i: int, state_byte, input_index: int, channel):
        """Byte address of the 16 bytes of this lane's row ``i``: at ``state_byte`` of its state row,
        or, a chunk row, at channel ``channel`` of the chunk's ``kv`` (``input_index`` 0) or ``score``
        (1) row."""
        mState = sources[0]
        starts, chunk_token, chunk_from = lane_rows
        row_stride_bytes = Int64(mState.stride[1]) * 4
        in_state = starts[i // self.rows_per_lookup] + row_stride_bytes * (i % self.rows_per_lookup) + state_byte
        if not self.state.rows_from_inputs:
            return in_state
        mInput = sources[3][input_index]
        in_chunk = element_address(mInput, chunk_token + i, channel)
        return Int64(cutlass.select_(Int32(i) >= chunk_from, in_chunk, in_state))

    def adds_ape(self) -> bool:
        """Whether some read-back score takes ``ape`` (every row with ``ape_at="compress"``, the chunk's
        rows with ``rows_from_inputs``)."""
        return self.state.ape_at == "compress" or self.state.rows_from_inputs

    def ape_rows(
        self,
        mApe: cute.Tensor,  # fp32 [128, 512], or None where no row takes ape
        first_row,  # the lane's first row in the window (its ape row)
        channel,  # the lane's first channel
    ) -> list | None:
        """The lane's ``ape`` rows ``first_row + i`` at its 4 channels (fp32 ``(4,)`` fragments, elements
        read one by one: SPEC promises no row alignment), or None where no read-back score takes them."""
        if not self.adds_ape():
            return None
        return [load_fragment(Float32, element_address(mApe, first_row + i, channel), VEC, 4)
                for i in range(self.rows_per_lane)]

    def fix_scores(
        self,
        sc: list,  # R fp32 (4,) fragments: the lane's read-back scores, fixed in place
        ape: list | None,  # ape_rows(...)
        chunk_from: Int32,  # the lane's first chunk row (R without a chunk)
    ) -> None:
        """The read-back scores as pooling reads them: ``add(S, ape[first_row + i])`` where row ``i``
        takes it (see the module docstring; nothing where no row does)."""
        if ape is None:
            return
        for i in range(self.rows_per_lane):  # unrolled at trace time
            takes = Int32(i) >= chunk_from
            for c in range(VEC):
                added = fadd(sc[i][c], ape[i][c])
                if self.state.ape_at == "compress":
                    sc[i][c] = added
                else:
                    sc[i][c] = Float32(cutlass.select_(takes, added, sc[i][c]))


__all__ = ["StagedRows"]
