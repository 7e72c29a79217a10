"""SPEC §5/§13 in Triton device code: a window's rows as pooling reads them (``spec.rows``), one
``[W, BLOCK_C]`` channel tile at a time.

A window row is read from the state cache or, in SPEC §13.4's step call, from the call's own
``kv`` / ``score`` when the request's chunk holds it (position ``q >= P0``, the chunk's first
position); :mod:`.window` resolves which, and the offsets, once per token. :class:`RowFormat`
is the compile-time description of both (one ``tl.constexpr`` of the fused kernel):

- ``state_bf16`` (SPEC §13.1): the state holds bf16 bit patterns (read as int16 and widened
  exactly: the pattern is the top half of the binary32);
- ``ape_at_compress`` (SPEC §13.2): pooling adds ``ape[pos_i mod r, h*H + c]`` to every row's
  score, one rounded binary32 add after the row is read;
- ``ring_capacity`` (SPEC §13.3): 0 paged, ``C`` a ring of ``C`` rows per request;
- ``chunk`` (SPEC §13.4): rows at or after the chunk's start come from ``kv`` / ``score`` as the
  save would store them and pooling read them back: ``R(kv)``, and ``R(add(score, a))`` with
  ``ape_at = "save"`` or ``add(R(score), a)`` with ``"compress"`` (``R`` = bf16 rounding for a
  bf16 state, else the identity).

The defaults (``PAGED_FP32_ROWS``) are SPEC §3-§5 exactly and compile to the kernel without
§13: every branch below is on a constexpr.

"""

from typing import NamedTuple

import triton
import triton.language as tl

from .exact_math import bf16_round


class RowFormat(NamedTuple):
    """The SPEC §13 options of a window's rows, one constexpr of the fused kernel (field access in
    device code: ``ROW_FORMAT.state_bf16``)."""

    state_bf16: bool = False  # SPEC §13.1: a bf16 state (int16 bit patterns in the kernel)
    ape_at_compress: bool = False  # SPEC §13.2: pooling adds ape to every row's score
    ring_capacity: int = 0  # SPEC §13.3: 0 paged; C a ring of C rows per request
    chunk: bool = False  # SPEC §13.4: rows at or after the chunk's start come from kv / score


PAGED_FP32_ROWS = RowFormat()  # SPEC §3-§5


def row_format(state_bf16: bool, ape_at: str, ring_capacity: int | None, chunk: bool) -> RowFormat:
    """The :class:`RowFormat` of validated options (``ape_at`` ``"save"`` / ``"compress"``,
    ``ring_capacity`` None for paged)."""
    return RowFormat(bool(state_bf16), ape_at == "compress", 0 if ring_capacity is None else int(ring_capacity), bool(chunk))


@triton.jit
def load_state(pointers, mask, STATE_BF16: tl.constexpr):
    """State elements as binary32: fp32 loaded as is, bf16 patterns (int16) widened exactly;
    ``mask`` None loads every element (masked-off elements read +0)."""
    if STATE_BF16:
        if mask is None:
            bits = tl.load(pointers)
        else:
            bits = tl.load(pointers, mask=mask, other=0)
        values = (bits.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        if mask is None:
            values = tl.load(pointers)
        else:
            values = tl.load(pointers, mask=mask, other=0.0)
    return values


@triton.jit
def window_tile(rows, channel0, STATE_WIDTH: tl.constexpr, BLOCK_C: tl.constexpr,
                MAY_HAVE_INVALID_ROWS: tl.constexpr, ROW_FORMAT: tl.constexpr):
    """``(kv, score)``: fp32 ``[W, BLOCK_C]`` of channels ``channel0 ..`` as pooling reads them
    (SPEC §5 ``kv_i[c]``, ``s_i[c]`` with §13's formats); invalid rows hold +0 (pooling masks them).

    ``rows``: ``(state_ptr, kv_row_offsets int64 [W], row_valid int1 [W], chunk, ape)``: the state
    base (fp32, or int16 bf16 patterns) and each row's offset of its kv half (:func:`.window.
    window_row_offsets`, the score half ``STATE_WIDTH`` further); ``chunk`` from
    :func:`.window.chunk_rows` (with ``ROW_FORMAT.chunk``, else a placeholder); ``ape`` from
    :func:`.window.ape_rows` (with ``ROW_FORMAT.ape_at_compress`` or ``chunk``, else a placeholder).
    """
    state_ptr, kv_row_offsets, row_valid, chunk, ape = rows
    channels = channel0 + tl.arange(0, BLOCK_C)
    offsets = kv_row_offsets[:, None] + channels[None, :]
    state_mask = None
    if MAY_HAVE_INVALID_ROWS:
        state_mask = row_valid[:, None]
    if ROW_FORMAT.chunk:
        from_chunk = chunk[2]
        if MAY_HAVE_INVALID_ROWS:
            state_mask = (row_valid & (from_chunk == 0))[:, None]
        else:
            state_mask = (from_chunk == 0)[:, None]
    kv = load_state(state_ptr + offsets, state_mask, ROW_FORMAT.state_bf16)
    score = load_state(state_ptr + (offsets + STATE_WIDTH), state_mask, ROW_FORMAT.state_bf16)
    if ROW_FORMAT.ape_at_compress or ROW_FORMAT.chunk:
        ape_tile = tl.load(ape[0] + (ape[1][:, None] + channels[None, :]))
    if ROW_FORMAT.chunk:
        kv_ptr, score_ptr, from_chunk, kv_offsets, score_offsets = chunk
        in_chunk = from_chunk[:, None]
        chunk_kv = tl.load(kv_ptr + (kv_offsets[:, None] + channels[None, :]), mask=in_chunk, other=0.0)
        chunk_score = tl.load(score_ptr + (score_offsets[:, None] + channels[None, :]), mask=in_chunk, other=0.0)
        if not ROW_FORMAT.ape_at_compress:
            chunk_score = chunk_score + ape_tile  # the save's add (SPEC §4), before the state's rounding
        if ROW_FORMAT.state_bf16:
            chunk_kv = bf16_round(chunk_kv)
            chunk_score = bf16_round(chunk_score)
        kv = tl.where(in_chunk, chunk_kv, kv)
        score = tl.where(in_chunk, chunk_score, score)
    if ROW_FORMAT.ape_at_compress:
        score = score + ape_tile  # SPEC §13.2: add(S_i[SW + h*H + c], ape[pos_i mod r, h*H + c])
    return kv, score
