"""SPEC §13 inputs of the conformance scenarios: a bf16 state, a projection buffer for the step
call, and this step's values tuned onto bf16 rounding ties of ``kv``, ``score`` and ``score + ape``.

- :func:`bf16_state`: a state's values rounded once to bf16 (``uint16`` patterns) in an allocation
  padded like the fp32 one (the padding holds the bf16 NaN ``0x7FC0`` as a canary);
- :func:`projection_view`: this step's ``[T, 2*SW]`` projections in an allocation whose rows may be
  padded (a multiple of 4 floats, so both halves keep 16-byte aligned rows): the step call takes
  ``kv`` and ``score`` as two views into it, as an engine passes one projection output;
- :func:`tune_bf16_ties`: ``kv``, ``score`` and ``add(score, ape[p mod r])`` all exactly halfway
  between two bf16 values, half of them rounding up to the even neighbour and half down, so a
  bf16 state rounded by truncation, ties away from zero, or ``ape`` added on the wrong side of the
  rounding (SPEC §13.2: ``bf16(add(score, ape))`` at the save, ``add(bf16(score), ape)`` at the
  compress) changes bytes.
"""

from __future__ import annotations

import numpy as np

from ..spec import batch as B
from ..spec.formats import bf16_bits

F32 = np.float32
BF16_NAN = np.uint16(0x7FC0)  # the canary of a bf16 state's padding
TIE_MANTISSAS = (337, 431)  # odd M in this range: M·2^(e-8) is a bf16 tie, and so is M + 2k for |k| <= 40
APE_STEPS = 40  # ape = k·2^(e-7), |k| <= APE_STEPS: score + ape stays a tie in the score's binade


def bf16_state(state: np.ndarray, row_pad: int = 0, block_pad_rows: int = 0) -> np.ndarray:
    """uint16 ``[blocks, bs, 2*SW]``: bf16 patterns of the float32 ``state``'s values (rounded once,
    nearest even), padded by ``row_pad`` elements per row (a multiple of 8: SPEC §13.1's 16-byte
    strides) and ``block_pad_rows`` rows per block."""
    if row_pad % 8:
        raise ValueError(f"row_pad: expected a multiple of 8 elements for a bf16 state (16-byte rows), got {row_pad}")
    out = B.padded_view(state.shape, np.uint16, (0, block_pad_rows, row_pad), BF16_NAN)
    out[...] = bf16_bits(state)
    return out


def projection_view(kv_score: np.ndarray, row_pad: int = 0) -> np.ndarray:
    """float32 ``[T, 2*SW]``: a copy of ``kv_score`` in a 64-byte aligned allocation whose rows are
    ``row_pad`` floats longer (a multiple of 4; the padding holds NaN)."""
    if row_pad % 4:
        raise ValueError(f"row_pad: expected a multiple of 4 floats (16-byte aligned kv and score rows), got {row_pad}")
    view = B.padded_view(kv_score.shape, np.float32, (0, row_pad), F32(np.nan))
    view[...] = kv_score
    return view


def _ties(shape: tuple[int, ...], exponents: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """float32 ``±M·2^(e-8)``, ``M`` odd in :data:`TIE_MANTISSAS`: bf16 rounding ties (a 9-bit
    significand whose last bit is set), ``e`` broadcast from ``exponents``."""
    low, high = TIE_MANTISSAS
    mantissa = 2 * rng.integers((low - 1) // 2, (high - 1) // 2 + 1, size=shape) + 1
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return (sign * mantissa * np.ldexp(1.0, exponents - 8)).astype(F32)


def tune_bf16_ties(kv_score: np.ndarray, ape: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """This step's ``kv_score`` (float32 ``[T, 2*SW]``) and ``ape`` (float32 ``[r, SW]``) moved onto
    bf16 ties: every ``kv[t, d]``, ``score[t, d]`` and ``add(score[t, d], ape[p_t mod r, d])`` (exact
    in binary32) is halfway between two bf16 values.

    Channel ``d`` of the score has an exponent ``e_d`` in ``[-2, 1]``; ``ape[., d] = k·2^(e_d-7)``
    with ``|k| <= 40`` moves a tie ``M·2^(e_d-8)`` (``M`` odd, ``337 <= M <= 431``) to the tie
    ``(M ± 2k)·2^(e_d-8)`` of the same binade, whichever row of ``ape`` a token's position picks.
    """
    width = ape.shape[1]
    kv_score = kv_score.copy()
    num_tokens = kv_score.shape[0]
    exponent = rng.integers(-2, 2, size=width)  # e_d of each score channel
    steps = rng.integers(-APE_STEPS, APE_STEPS + 1, size=ape.shape)
    ape = (steps * np.ldexp(1.0, exponent - 7)[None, :]).astype(F32)
    kv_score[:, :width] = _ties((num_tokens, width), rng.integers(-3, 3, size=width)[None, :], rng)
    kv_score[:, width:] = _ties((num_tokens, width), exponent[None, :], rng)
    return kv_score, ape
