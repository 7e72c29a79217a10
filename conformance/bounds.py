"""SPEC §10's tolerant verdict: §5–§7 in float64 with a bound on each value's error.

An implementation that does not follow §2 (approximate ``exp2``/``rsqrt``, FMA contraction,
another summation order) writes values that differ from the spec's near rounding ties. The
bound of each step follows its condition, so cancellation is allowed for:

- pooled ``x[c]``: ``(Σ e_i·ε_i·|kv_i − x| + POOL_SUM·W·u·Σ e_i·|kv_i|) / Σ e_i + u·|x|`` —
  a multiple of ``(Σ e_i·|kv_i|) / (Σ e_i)``, where ``ε_i = APPROX + ARG·|t_i|`` is the
  relative error of ``e_i = 2^t_i`` (an approximate ``exp2`` plus the rounding of its
  argument ``t_i``, which grows with ``|t_i|``);
- norm: relative, ``|w|·rr·bound(x) + |y|·(rel(rr) + 2u)`` with ``rel(rr)`` half the
  relative error of ``ms + eps`` plus ``APPROX`` plus ``2u``;
- RoPE: ``|co|·bound(a) + |si|·bound(b) + ROPE·u·(|a·co| + |b·si|)``;

each multiplied by ``SAFETY``. A written value is accepted iff some real value within the
bound of the float64 result converts to it by the spec's own conversions: the interval
``[ref − bound, ref + bound]`` is rounded to binary32 and then to bf16 (monotone), then to
E4M3 at the *written* scale; the written code must lie between the codes of the interval's
ends (with a bound of zero, the code itself). ``+0`` and ``-0`` are one point of that order:
where a zero is allowed, either sign is accepted (a reduction that starts its accumulator at
``+0`` turns a sum of ``-0`` into ``+0``); a nonzero code where only a zero is allowed is not.
A scale byte is accepted iff its exponent is that of some amax in the interval the channels'
bf16 values allow. The constants are published in ``docs/conformance.md``.

The window rows themselves carry no tolerance: pooling reads each row exactly as SPEC §13 says
(:class:`StateRows`: a bf16 state's elements are exact binary32 values, ``add(score, ape)`` is
rounded once, at the save or at the compress, and the step call's chunk rows are rounded as the
save would store them), so the bounds start from those binary32 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec.constants import QUANT_BLOCK, RatioConfig, ratio_config
from ..spec.formats import bf16_bits, bf16_to_f32, e4m3_bits
from ..spec.pooling import gather_window
from ..spec.rows import ChunkInputs
from ..spec.state_format import PAGED_FP32, StateFormat

F32 = np.float32
U = 2.0 ** -24  # binary32 unit roundoff


@dataclass(frozen=True)
class ToleranceConstants:
    """The published constants of the tolerant verdict (docs/conformance.md)."""

    approx: float = 2.0 ** -20  # relative error allowed to exp2 and to rsqrt (2^-21 plus the spec's own)
    arg: float = 4 * U  # relative error of the exp2 argument t_i (s_i - M rounded, times L rounded)
    pool_sum: float = 2.0  # summation error: pool_sum * W * u * sum e_i |kv_i| (any order, products included)
    norm_sum: float = 2.0  # sum of squares: norm_sum * H * u * ss
    rope: float = 4.0  # RoPE products and difference: rope * u * (|a co| + |b si|)
    safety: float = 2.0  # every bound is multiplied by this
    cutoff_margin: float = 2.0 ** -16  # |t_i + 126| below this * |t_i|: exp2s's cut-off may fall either way


CONSTANTS = ToleranceConstants()


@dataclass
class Reference:
    """Float64 results and bounds of the active tokens (rows in the order given)."""

    y: np.ndarray  # float64 [n, H]: normalized values
    y_bound: np.ndarray  # float64 [n, H]
    rope: np.ndarray  # float64 [n, 64]: o0, o1 interleaved as stored
    rope_bound: np.ndarray  # float64 [n, 64]


@dataclass(frozen=True)
class StateRows:
    """Where a compress reads its window rows (SPEC §5, §13): the state it sees, in its format,
    and for the step call (§13.4) the call's own projections."""

    state: np.ndarray  # float32, or uint16 bf16 patterns, [num_state_blocks, bs, 2*SW]
    block_table: np.ndarray  # int32 [num_reqs, max_blocks]
    block_size: int  # bs
    state_format: StateFormat = PAGED_FP32  # dtype, ape_at, ring_capacity
    ape: np.ndarray | None = None  # float32 [r, SW]: added where the format or the chunk's save adds it
    chunk: ChunkInputs | None = None  # the step call's kv, score, positions and query_start_loc

    def window(self, requests: np.ndarray, positions: np.ndarray, config: RatioConfig):
        """float32 ``kv``, ``score`` ``[n, W, H]`` (each row's half) and bool ``valid`` ``[n, W]`` of the
        windows of the given tokens (``requests`` int ``[n]``, ``positions`` int64 ``[n]``), as pooling
        reads them; invalid rows hold +0."""
        return gather_window(self.state, self.block_table, requests, positions, config, self.block_size,
                             state_format=self.state_format, chunk=self.chunk, ape=self.ape)


def _ieee_sum(v: np.ndarray) -> np.ndarray:
    """Sum over axis 1 by elementwise adds, so the sign of a zero sum is IEEE's (-0 only when
    every term is -0); NumPy's reductions may start from +0."""
    acc = v[:, 0].copy()
    for i in range(1, v.shape[1]):
        acc += v[:, i]
    return acc


def _pool_bounds(kv: np.ndarray, score: np.ndarray, valid: np.ndarray, c: ToleranceConstants):
    """Float64 pooled x [n, H] and its bound, from fp32 windows kv/score [n, W, H]."""
    kv = kv.astype(np.float64)
    s = np.where(valid[:, :, None], score.astype(np.float64), -np.inf)
    m = s.max(axis=1, keepdims=True)
    log2e = float(np.array(0x3FB8AA3B, dtype=np.uint32).view(F32))
    t = np.where(valid[:, :, None], (s - m) * log2e, -np.inf)
    e = np.where(t >= -126.0, np.exp2(np.maximum(t, -200.0)), 0.0)
    ambiguous = np.abs(t + 126.0) <= c.cutoff_margin * 126.0
    den = e.sum(axis=1)
    x = _ieee_sum(e * kv) / den
    eps_e = c.approx + c.arg * np.abs(np.where(np.isfinite(t), t, 0.0))
    window = kv.shape[1]
    spread = (e * eps_e * np.abs(kv - x[:, None, :])).sum(axis=1)
    magnitude = (e * np.abs(kv)).sum(axis=1)
    near_cut = (np.where(ambiguous, 2.0 ** -125, 0.0) * np.abs(kv)).sum(axis=1)
    tiny = window * 2.0 ** -149  # subnormal products lose absolute precision only
    bound = (spread + c.pool_sum * window * U * magnitude + near_cut + tiny) / den + U * np.abs(x)
    return x, c.safety * bound


def reference(rows: StateRows, requests: np.ndarray, positions: np.ndarray, compress_ratio: int, weight: np.ndarray,
              eps: float, cos_sin_cache: np.ndarray, c: ToleranceConstants = CONSTANTS, chunk: int = 64) -> Reference:
    """Float64 §5–§6 with bounds for the given active tokens (a chunk of tokens at a time).

    ``rows``: where the compress reads its windows (the state after the save, or SPEC §13.4's
    state before the step call and its chunk); ``requests`` int32 [n], ``positions`` int64 [n],
    ``weight`` fp32 [H], ``cos_sin_cache`` fp32 [max_pos, 64].
    """
    head = weight.shape[0]
    rope_start = head - 64
    config = ratio_config(compress_ratio, head)
    w = weight.astype(np.float64)
    out = [[], [], [], []]
    for start in range(0, len(positions), chunk):
        p = positions[start:start + chunk]
        q = requests[start:start + chunk]
        kv, score, valid = rows.window(q, p, config)
        x, bx = _pool_bounds(kv, score, valid, c)
        # RMSNorm: relative
        ss = (x * x).sum(axis=1)
        v = ss / head + float(F32(eps))
        rr = 1.0 / np.sqrt(v)
        rel_v = ((2.0 * np.abs(x) * bx).sum(axis=1) + c.norm_sum * head * U * ss) / (head * v) + U
        rel_rr = c.safety * (rel_v / 2.0 + c.approx + 2 * U)
        y = x * rr[:, None] * w[None, :]
        by = np.abs(w)[None, :] * rr[:, None] * bx + np.abs(y) * (rel_rr[:, None] + c.safety * 2 * U)
        # RoPE at the group's first position
        cs = cos_sin_cache[(p // compress_ratio) * compress_ratio].astype(np.float64)
        co, si = cs[:, :32], cs[:, 32:]
        a, b = y[:, rope_start::2], y[:, rope_start + 1::2]
        ba, bb = by[:, rope_start::2], by[:, rope_start + 1::2]
        o0 = a * co - b * si
        o1 = a * si + b * co
        b0 = np.abs(co) * ba + np.abs(si) * bb + c.safety * c.rope * U * (np.abs(a * co) + np.abs(b * si))
        b1 = np.abs(si) * ba + np.abs(co) * bb + c.safety * c.rope * U * (np.abs(a * si) + np.abs(b * co))
        out[0].append(y)
        out[1].append(by)
        out[2].append(np.stack([o0, o1], axis=2).reshape(-1, 64))
        out[3].append(np.stack([b0, b1], axis=2).reshape(-1, 64))
    return Reference(*(np.concatenate(parts) if parts else np.zeros((0, 64)) for parts in out))


# ---- interval conversions ---------------------------------------------------------------
def _f32(v: np.ndarray) -> np.ndarray:
    """Round float64 to binary32 (nearest even), saturating to the largest finite value."""
    big = float(np.finfo(F32).max)
    return np.clip(v, -big, big).astype(F32)


def bf16_range(ref: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bf16 bit patterns of the interval's ends (real -> binary32 -> bf16, monotone)."""
    return bf16_bits(_f32(ref - bound)), bf16_bits(_f32(ref + bound))


def ordered(bits: np.ndarray, sign_bit: int) -> np.ndarray:
    """Sign-magnitude codes as ordered integers (+0 and -0 both 0)."""
    bits = bits.astype(np.int64)
    magnitude = bits & (sign_bit - 1)
    return np.where(bits & sign_bit, -magnitude, magnitude)


def within(written: np.ndarray, low: np.ndarray, high: np.ndarray, sign_bit: int) -> np.ndarray:
    """Whether each written code lies between the codes of the interval's ends, in the order of
    :func:`ordered` (codes of one shape, any integer dtype). Where the bound is zero the ends are
    one code and the written code must equal it, except that a zero may carry either sign."""
    w = ordered(written, sign_bit)
    return (ordered(low, sign_bit) <= w) & (w <= ordered(high, sign_bit))


def e4m3_at(bf16_patterns: np.ndarray, k: np.ndarray) -> np.ndarray:
    """SPEC ``e4m3(q · 2^-k)`` for bf16 ``q`` (the scaling is exact)."""
    q = bf16_to_f32(bf16_patterns).astype(np.float64)
    return e4m3_bits(_f32(np.clip(q * np.ldexp(1.0, -k), -448.0, 448.0)))


def ue8m0_range(amax: np.ndarray) -> np.ndarray:
    """SPEC §2's exponent: the smallest k with max(amax, AMIN) <= 448·2^k (float64 amax)."""
    from ..spec.formats import ue8m0_exponent

    return ue8m0_exponent(_f32(amax))


def scale_floor_exponent(amax: np.ndarray) -> np.ndarray:
    """SPEC §11's deviation: k from max(amax / 448, 1e-4) (vLLM's CuTe DSL kernels)."""
    scale = np.maximum(_f32(amax).astype(np.float64) / 448.0, float(F32(1e-4)))
    return np.ceil(np.log2(scale)).astype(np.int64)


def block_amax_range(low: np.ndarray, high: np.ndarray, block: int = QUANT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Per block of ``block`` channels, the least and greatest amax the bf16 intervals
    [low, high] allow (patterns [n, C] -> float64 [n, C / block]; NoPE blocks by default)."""
    lo = bf16_to_f32(low).astype(np.float64)
    hi = bf16_to_f32(high).astype(np.float64)
    least = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    most = np.maximum(np.abs(lo), np.abs(hi))
    n = low.shape[0]
    return least.reshape(n, -1, block).max(axis=2), most.reshape(n, -1, block).max(axis=2)


# ---- SPEC §12: the indexer's values -------------------------------------------------------
HADAMARD_H = float(np.array(0x3DB504F3, dtype=np.uint32).view(F32))


def indexer_values(ref: Reference, hadamard: bool, c: ToleranceConstants = CONSTANTS) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``z`` [n, 128] (y[0:64] then the RoPE pairs, rotated when ``hadamard``) and its bound.

    The rotation's output ``i`` is ``h·Σ ±z_j``: its bound is ``h·(Σ bound(z_j) + 8u·Σ |z_j|)``
    (seven stages of sums and the final product, in any order) times ``SAFETY``.
    """
    z = np.concatenate([ref.y[:, :64], ref.rope], axis=1)
    bz = np.concatenate([ref.y_bound[:, :64], ref.rope_bound], axis=1)
    if not hadamard:
        return z, bz
    n = z.shape[0]
    out = z.copy()
    for span in (64, 32, 16, 8, 4, 2, 1):  # exact in float64 up to its own rounding, far below the bound
        pairs = out.reshape(n, 128 // (2 * span), 2, span)
        out = np.stack([pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]], axis=2).reshape(n, 128)
    total = bz.sum(axis=1, keepdims=True) + 8 * U * np.abs(z).sum(axis=1, keepdims=True)
    return out * HADAMARD_H, np.broadcast_to(c.safety * total * HADAMARD_H, out.shape) + U * np.abs(out * HADAMARD_H)


def e2m1_at(bf16_patterns: np.ndarray, k: np.ndarray) -> np.ndarray:
    """SPEC §12 ``e2m1(mul(q, 2^-k))`` for bf16 ``q``."""
    from ..spec.formats import e2m1_bits

    q = bf16_to_f32(bf16_patterns).astype(np.float64)
    return e2m1_bits(_f32(q * np.ldexp(1.0, -k)))
