"""SPEC §14.3: DeepSeek-V4.1's compress, from the projections to the bf16 latent.

- **Activity.** Every position is a boundary for ratio 1; for ratio 2 the odd positions are,
  and each pools positions ``p - 1`` and ``p``. A token is active iff it has a cache slot
  (``kv_slot_mapping >= 0``), its position is a boundary and, for ratio 2, it has a state slot.
- **Pooled vector** ``x``: ratio 1 takes ``kv`` itself; ratio 2 finds its two rows with SPEC
  §13.4's row function (:func:`.rows.window_rows`: the chunk's own rows from ``kv``/``score``,
  earlier ones from the state, paged or a ring), normalizes their softmax weights first, then
  sums, as the reference's ``(kv * softmax(score)).sum()`` does.
- **Norm.** ``x' = bf16(x)``, §6's RMSNorm of ``x'``, and the latent ``bf16(y)``.
- **Save** (ratio 2), after the compress: ``kv`` and the raw score of every token with
  ``save_slot_mapping >= 0``, through the state format (bf16-rounded for a bf16 state).

``kv`` and ``score`` arrive in fp32 or bf16 (``uint16`` bit patterns) and are converted to
binary32 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arithmetic import add, div, exp2s, mul, sub
from .constants import LOG2E
from .formats import bf16, bf16_bits, bf16_to_f32
from .pooling import is_boundary
from .postprocess import rms_norm
from .rows import ChunkInputs, window_rows
from .state import save_rows
from .state_format import StateFormat

F32 = np.float32


@dataclass(frozen=True)
class StateArguments:
    """Ratio 2's state arguments of one call (SPEC §14.2, §13.3, §13.4); ratio 1 reads none of them."""

    token_to_req: np.ndarray | None  # int32 [T]: block_table row (request) of each token
    query_start_loc: np.ndarray | None  # int32 [num_reqs + 1]: first token of each request's chunk
    slot_mapping: np.ndarray | None  # int64 [T]: state slot, -1 = padding (activity)
    save_slot_mapping: np.ndarray | None  # int64 [T]: slot saved after the compress, -1 = not saved
    block_table: np.ndarray | None  # int32 [num_reqs, max_blocks]: state blocks per request
    bs: int | None  # rows per state block
    state_cache: np.ndarray | None  # float32 or uint16 (bf16) [num_state_blocks, bs, 1024]: kv then raw score
    ring_capacity: int | None = None  # None: paged rows; C: a ring of C rows per request


def as_binary32(
    values: np.ndarray,  # float32 [...], or uint16 [...] (bf16 bit patterns)
) -> np.ndarray:
    """fp32 values as they are, or bf16 bit patterns (``uint16``) as the binary32 they represent (exact)."""
    return bf16_to_f32(values) if values.dtype == np.uint16 else np.asarray(values, dtype=F32)


def stored_tokens(
    positions: np.ndarray,  # int64 [T]
    kv_slot_mapping: np.ndarray,  # int64 [T]: compressed-cache slot, -1 = none
    compress_ratio: int,  # 1 or 2
) -> np.ndarray:
    """The tokens that write a record (SPEC §14.7's ``v41_rope_quant_store``): a cache slot and a
    boundary position (every position for ratio 1, the odd ones for ratio 2). bool ``[T]``."""
    return (kv_slot_mapping >= 0) & is_boundary(positions, compress_ratio)


def active_tokens(
    positions: np.ndarray,  # int64 [T]
    slot_mapping: np.ndarray | None,  # int64 [T]: state slots (ratio 2); not read for ratio 1
    kv_slot_mapping: np.ndarray,  # int64 [T]
    compress_ratio: int,  # 1 or 2
) -> np.ndarray:
    """SPEC §14.3's activity rule, bool ``[T]``: :func:`stored_tokens`, and for ratio 2 also
    ``slot_mapping >= 0``. Inactive tokens write nothing anywhere."""
    active = stored_tokens(positions, kv_slot_mapping, compress_ratio)
    return active & (slot_mapping >= 0) if compress_ratio == 2 else active


def softmax_then_sum(
    kv: np.ndarray,  # float32 [n, 2, 512]: rows i = 0, 1 (positions p - 1, p)
    score: np.ndarray,  # float32 [n, 2, 512]: their raw scores
) -> np.ndarray:
    """Ratio 2's pooled vector ``x`` (fp32 ``[n, 512]``), per channel: ``M = max(s_0, s_1)``,
    ``e_i = exp2s(mul(sub(s_i, M), L))``, ``den = add(e_0, e_1)``, ``w_i = div(e_i, den)``,
    ``x = add(mul(kv_0, w_0), mul(kv_1, w_1))``."""
    m = np.maximum(score[:, 0], score[:, 1])
    e0 = exp2s(mul(sub(score[:, 0], m), LOG2E))
    e1 = exp2s(mul(sub(score[:, 1], m), LOG2E))
    den = add(e0, e1)
    return add(mul(kv[:, 0], div(e0, den)), mul(kv[:, 1], div(e1, den)))


def pooled_ratio2(
    kv: np.ndarray,  # float32 [T, 512]: this call's kv (binary32 values)
    score: np.ndarray,  # float32 [T, 512]: this call's raw scores
    positions: np.ndarray,  # int64 [T]
    tokens: np.ndarray,  # int64 [n]: the active tokens (odd positions)
    state: StateArguments,
    state_format: StateFormat,  # the state's dtype ("compress": no ape) and addressing
) -> np.ndarray:
    """Ratio 2's ``x`` (fp32 ``[n, 512]``) of each active token: its rows at positions ``p - 1``
    and ``p`` by :func:`.rows.window_rows` (a row in the request's chunk from ``kv``/``score``
    as the state would hold it, an earlier row from the state), then :func:`softmax_then_sum`."""
    window = positions[tokens, None] - 1 + np.arange(2, dtype=np.int64)[None, :]
    chunk = ChunkInputs(kv=kv, score=score, positions=positions, query_start_loc=state.query_start_loc)
    rows = window_rows(window, state.token_to_req[tokens], state_format, state.state_cache, state.block_table, state.bs,
                       chunk)
    return softmax_then_sum(rows.kv, rows.score)


def save_ratio2(
    kv: np.ndarray,  # float32 [T, 512]
    score: np.ndarray,  # float32 [T, 512]: raw
    positions: np.ndarray,  # int64 [T]
    state: StateArguments,
    state_format: StateFormat,
) -> None:
    """Ratio 2's save (SPEC §14.3, §13.4 step 2): ``R(kv[t])`` then ``R(score[t])`` at
    ``save_slot_mapping[t] >= 0`` (slot ``block * bs + offset``, a ring slot in a ring)."""
    save_rows(kv, score, None, positions, state.save_slot_mapping, state.state_cache, state.bs, state_format)


def latent_of(
    x: np.ndarray,  # float32 [n, 512]: the pooled vectors
    weight: np.ndarray,  # float32 [512]: the norm weight's binary32 value
    eps: np.float32,
) -> np.ndarray:
    """The latent ``bf16(y)`` (uint16 ``[n, 512]``) with ``y`` §6's RMSNorm of ``x' = bf16(x)``:
    ``ss = tree(mul(x', x'))``, ``rr = div(1, sqrt(add(mul(ss, 2^-9), eps)))``,
    ``y = mul(mul(x', rr), w)``."""
    return bf16_bits(rms_norm(bf16(x), weight, eps))
