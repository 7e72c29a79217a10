"""SPEC §13's state formats in V4's CuTe DSL kernels: where a row lives, how it reads, how it is saved.

A kernel's :class:`..config.StateFormat` is fixed per compile; these helpers branch on it at
trace time (``const_expr``), so the default format (fp32, ``ape`` at the save, paged) traces to
exactly the code the kernels had without SPEC §13.

- :func:`ring_position`: SPEC §13.3, the row index of a position (``q mod C`` in a ring);
- :func:`load_state_into`: 4 consecutive state elements as binary32 (a bf16 state widened
  exactly: ``cvt`` of a bf16 to f32 only appends zero bits), one 16-byte (fp32) or 8-byte (bf16)
  access;
- :func:`add_ape`: SPEC §13.2, ``add(S, ape[q mod r, c])`` on 4 channels of a row's stored score
  (``ape_at="compress"``; one binary32 ``add.rn`` each);
- :func:`store_state`: 4 values saved in the state's dtype (bf16: each rounded once, to nearest
  with ties to even, ``cvt.rn.bf16x2.f32``), as :func:`.v41_rows.store_values` saves V4.1's rows.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int64

from ..config import StateFormat
from .exact_math import fadd
from .memory import element_address, load_fragment, load_into
from .v41_rows import store_values

VEC = 4  # channels per access


def state_element(state: StateFormat):
    """The CuTe DSL element type of a state format."""
    return BFloat16 if state.dtype == "bfloat16" else Float32


def ring_position(position, state: StateFormat, ring_capacity):
    """SPEC §13.3: the index whose block-table column and offset hold ``position``'s row:
    ``position`` (paged) or ``position mod C`` (a ring; ``C`` a multiple of ``bs``, so a run of
    rows that starts at a multiple of ``gcd(bs, ·)`` stays in one state block)."""
    if cutlass.const_expr(state.ring):
        return Int64(position) % Int64(ring_capacity)
    return position


def load_state_into(frag: cute.Tensor, byte_address, state: StateFormat) -> None:
    """``frag`` (fp32 ``(4,)``) <- the 4 state elements at ``byte_address`` (16-byte aligned fp32
    or 8-byte aligned bf16), as the binary32 values they represent."""
    if cutlass.const_expr(state.dtype == "float32"):
        load_into(frag, byte_address, 16)
    else:
        raw = load_fragment(BFloat16, byte_address, VEC, 2 * VEC)
        frag.store(raw.load().to(Float32))


def add_ape(score: cute.Tensor, mApe: cute.Tensor, ape_row, first_channel, state: StateFormat) -> None:
    """SPEC §13.2 with ``ape_at="compress"``: ``score[c] = add(score[c], ape[ape_row, first_channel + c])``
    for the 4 channels (nothing with ``"save"``). ``mApe``: fp32 ``[r, SW]``, unit last stride
    (elements read one by one: SPEC promises no row alignment)."""
    if cutlass.const_expr(state.ape_at == "compress"):
        bias = load_fragment(Float32, element_address(mApe, ape_row, first_channel), VEC, 4)
        for c in range(VEC):  # unrolled at trace time
            score[c] = fadd(score[c], bias[c])


def store_state(mState: cute.Tensor, byte_address, values: cute.Tensor) -> None:
    """fp32 ``values`` (4,) saved at ``byte_address`` in ``mState``'s dtype (SPEC §4, §13.1)."""
    store_values(mState, byte_address, values)


__all__ = ["VEC", "add_ape", "load_state_into", "ring_position", "state_element", "store_state"]
