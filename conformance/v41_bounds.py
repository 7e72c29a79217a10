"""The tolerant verdict for DeepSeek-V4.1 (SPEC §14.9): §14.3-§14.6 in float64 with error bounds.

V4.1 keeps bf16 rounding points inside the computation (the pooled vector before the norm, the
latent, the rotated values); §14.9 makes them part of the contract. The verdict therefore
propagates *intervals of bf16 values*: a value computed with fast-math arithmetic lies within a
bound of its float64 result, and a rounding point maps that interval onto the bf16 values it can
round to (both ends, binary32 then bf16, are monotone). Every later step starts from the whole
interval, so an implementation is accepted wherever some choice within the bounds gives its bytes,
and an implementation that leaves a rounding point out is not: its values fall between the bf16
values the interval allows (:mod:`.v41_departures` names it). The bounds (``u = 2^-24``; constants
of :class:`~.bounds.ToleranceConstants`, each bound times ``SAFETY``):

- ``e_i = 2^t_i``: relative ``ε_i = APPROX + ARG·|t_i|``; the weights ``w_i = e_i / den``: relative
  ``ε_i + (Σ e_j·ε_j) / den + APPROX + 3u`` (an approximate division too);
- pooled ``x = Σ kv_i·w_i``: ``Σ |kv_i|·w_i·(rel(w_i) + 2u)``, plus ``2^-125·|kv_i|`` for a row whose
  ``t_i`` lies within ``CUTOFF_MARGIN·126`` of exp2s's cut-off;
- ``x' = bf16(x)``: the interval of the bf16 values of ``[x − bound, x + bound]``, as a centre ``c`` and
  a radius ``ρ`` (zero unless the bound crosses a rounding boundary);
- ``ss = Σ c²``: ``Σ (2|c|·ρ + ρ²) + NORM_SUM·H·u·ss``; ``rr = (ss/H + eps)^-1/2``: relative half that
  of ``ss/H + eps``, plus ``APPROX + 2u``; ``y = x'·rr·w``: ``|w|·rr·ρ·(1 + rel(rr)) + |y|·(rel(rr) + 2u)``;
- the latent ``bf16(y)``: the bf16 interval of ``y``'s; the rotation from the latent's interval (the
  given latent of ``v41_rope_quant_store`` exactly): ``|co|·ρ_a + |si|·ρ_b + ROPE·u·(|a·co| + |b·si|)``;
- records encode ``z``'s interval: a scale byte is accepted iff it is the scale of some amax the
  interval allows (NVFP4: ``e4m3(a/6)`` with an approximate division), each code iff it lies between
  the codes of the interval's ends at the written scale (NVFP4: ``v = z/σ`` with an approximate
  division). A zero may carry either sign.

The state, the pad byte and every byte no active token addresses are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..spec.constants import LOG2E, NOPE_DIM, NVFP4_AMAX_FLOOR, E2M1_MAX
from ..spec.entry_layout import INDEXER_FP8, INDEXER_MXFP4, V41_MXFP8, V41_NVFP4
from ..spec.formats import bf16_to_f32, e2m1_bits, e4m3_bits, e4m3_to_f32, mxfp4_exponent
from ..spec.postprocess import norm_weight_f32, rope_row
from ..spec.rows import ChunkInputs, window_rows
from ..spec.state_format import StateFormat
from ..spec.v41_compress import as_binary32
from .bounds import CONSTANTS, U, ToleranceConstants, _f32, bf16_range, block_amax_range, e4m3_at, ue8m0_range, within
from .runner import _entry_bytes, record_indices
from .v41_scenarios import V41Inputs

F32 = np.float32


@dataclass
class Interval:
    """bf16 values as an interval per element: patterns of both ends (uint16 ``[n, H]``)."""

    lo: np.ndarray
    hi: np.ndarray

    @property
    def centre(self) -> np.ndarray:
        return (bf16_to_f32(self.lo).astype(np.float64) + bf16_to_f32(self.hi).astype(np.float64)) / 2

    @property
    def radius(self) -> np.ndarray:
        return (bf16_to_f32(self.hi).astype(np.float64) - bf16_to_f32(self.lo).astype(np.float64)) / 2


def exact(bits: np.ndarray) -> Interval:
    return Interval(bits.copy(), bits.copy())


def rounded(value: np.ndarray, bound: np.ndarray) -> Interval:
    """The bf16 values ``[value − bound, value + bound]`` rounds to."""
    return Interval(*bf16_range(value, bound))


# ---- SPEC §14.3 ---------------------------------------------------------------------------------------
def _pooled(kv: np.ndarray, score: np.ndarray, c: ToleranceConstants) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``x`` [n, 512] and its bound from two fp32 rows per token (``kv``, ``score`` [n, 2, 512])."""
    kv, s = kv.astype(np.float64), score.astype(np.float64)
    t = (s - s.max(axis=1, keepdims=True)) * float(LOG2E)
    e = np.where(t >= -126.0, np.exp2(np.maximum(t, -200.0)), 0.0)
    den = e.sum(axis=1)
    w = e / den[:, None]
    x = (kv * w).sum(axis=1)
    eps_e = c.approx + c.arg * np.abs(t)
    rel_w = eps_e + ((e * eps_e).sum(axis=1) / den)[:, None] + c.approx + 3 * U
    near_cut = np.where(np.abs(t + 126.0) <= c.cutoff_margin * 126.0, 2.0 ** -125, 0.0)
    bound = (np.abs(kv) * (w * (rel_w + 2 * U) + near_cut / den[:, None])).sum(axis=1) + 2 * 2.0 ** -149
    return x, c.safety * bound


def _normed(x: Interval, weight: np.ndarray, eps: float, c: ToleranceConstants) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``y = x'·rr·w`` and its bound for ``x'`` anywhere in the interval."""
    centre, radius = x.centre, x.radius
    head = centre.shape[1]
    ss = (centre * centre).sum(axis=1)
    bss = (2 * np.abs(centre) * radius + radius * radius).sum(axis=1) + c.norm_sum * head * U * ss
    v = ss / head + float(F32(eps))
    rr = 1.0 / np.sqrt(v)
    rel_rr = c.safety * ((bss / (head * v) + U) / 2 + c.approx + 2 * U)
    w = weight.astype(np.float64)[None, :]
    y = centre * rr[:, None] * w
    by = np.abs(w) * rr[:, None] * radius * (1 + rel_rr[:, None]) + np.abs(y) * (rel_rr[:, None] + c.safety * 2 * U)
    return y, by


def latent_interval(inputs: V41Inputs, tokens: np.ndarray, c: ToleranceConstants = CONSTANTS) -> Interval:
    """The bf16 latents the bounds allow for the active ``tokens`` (SPEC §14.3)."""
    s = inputs.step
    kv, score = inputs.kv_score_arrays()
    kv32 = as_binary32(kv)
    if inputs.compress_ratio == 1:
        x, bx = kv32[tokens].astype(np.float64), np.zeros((tokens.size, kv32.shape[1]))
    else:
        score32 = as_binary32(score)
        state = inputs.state_cache.view_of(inputs.state_cache.owner)
        fmt = StateFormat.of(state, "compress", inputs.ring_capacity)
        window = s.positions[tokens, None] - 1 + np.arange(2)[None, :]
        chunk = ChunkInputs(kv=kv32, score=score32, positions=s.positions, query_start_loc=s.query_start_loc)
        rows = window_rows(window, s.token_to_req[tokens], fmt, state, inputs.tables.block_table,
                           inputs.tables.state.block_size, chunk)
        x, bx = _pooled(rows.kv, rows.score, c)
    y, by = _normed(rounded(x, bx), norm_weight_f32(inputs.rms_norm_weight), inputs.rms_norm_eps, c)
    return rounded(y, by)


# ---- SPEC §14.4, §14.6 ------------------------------------------------------------------------------------
def rotated_interval(values: Interval, cos_sin: np.ndarray, start: int, c: ToleranceConstants = CONSTANTS) -> Interval:
    """``z``'s interval: the values outside the 64 rotated channels as they are, the rotated pairs'
    bf16 interval from their inputs' (``cos_sin`` fp32 [n, 64], each token's row)."""
    centre, radius = values.centre, values.radius
    a, b = centre[:, start:start + 64:2], centre[:, start + 1:start + 64:2]
    ra, rb = radius[:, start:start + 64:2], radius[:, start + 1:start + 64:2]
    co, si = cos_sin[:, :32].astype(np.float64), cos_sin[:, 32:].astype(np.float64)
    o0, o1 = a * co - b * si, a * si + b * co
    k = c.safety * c.rope * U
    b0 = np.abs(co) * ra + np.abs(si) * rb + k * (np.abs(a * co) + np.abs(b * si))
    b1 = np.abs(si) * ra + np.abs(co) * rb + k * (np.abs(a * si) + np.abs(b * co))
    out = rounded(np.stack([o0, o1], axis=2).reshape(-1, 64), np.stack([b0, b1], axis=2).reshape(-1, 64))
    z = replace(values, lo=values.lo.copy(), hi=values.hi.copy())
    z.lo[:, start:start + 64], z.hi[:, start:start + 64] = out.lo, out.hi
    return z


def index_key_interval(inputs: V41Inputs, tokens: np.ndarray, c: ToleranceConstants = CONSTANTS) -> Interval:
    x = exact(inputs.k_pre[tokens])
    y, by = _normed(x, norm_weight_f32(inputs.rms_norm_weight), inputs.rms_norm_eps, c)
    cos_sin = inputs.cos_sin_cache[rope_row(inputs.step.positions[tokens], inputs.compress_ratio)]
    return rotated_interval(rounded(y, by), cos_sin, 64, c)


# ---- judging the bytes --------------------------------------------------------------------------------------
class Counts(dict):
    def bump(self, kind: str, n) -> None:
        if int(n):
            self[kind] = self.get(kind, 0) + int(n)


def _value(bits: np.ndarray) -> np.ndarray:
    return bf16_to_f32(bits).astype(np.float64)


def _judge_scales(counts: Counts, ok: np.ndarray, written: np.ndarray, spec: np.ndarray) -> None:
    counts.bump("scale within bound", np.count_nonzero(ok & (written != spec)))
    counts.bump("scale beyond bound", np.count_nonzero(~ok))


def _judge_codes(counts: Counts, name: str, accepted: np.ndarray, written: np.ndarray, spec: np.ndarray) -> None:
    counts.bump(f"{name} within bound", np.count_nonzero(accepted & (written != spec)))
    counts.bump(f"{name} beyond bound", np.count_nonzero(~accepted))


def _ue8m0_ok(z: Interval, k_written: np.ndarray, block: int) -> np.ndarray:
    least, most = block_amax_range(z.lo, z.hi, block)
    return (ue8m0_range(least) <= k_written) & (k_written <= ue8m0_range(most))


def _mxfp8(counts, z: Interval, data, scales, spec_data, spec_scales) -> None:
    """``v41_mxfp8``: written and spec bytes, data uint8 ``[n, 512]``, scales uint8 ``[n, 16]``."""
    k = scales.astype(np.int64) - 127
    _judge_scales(counts, _ue8m0_ok(z, k, 32), scales, spec_scales)
    kk = np.repeat(k, 32, axis=1)
    _judge_codes(counts, "values", within(data, e4m3_at(z.lo, kk), e4m3_at(z.hi, kk), 0x80), data, spec_data)


def _nvfp4(counts, z: Interval, packed, scales, spec_packed, spec_scales, c: ToleranceConstants) -> None:
    """``v41_nvfp4``: written and spec bytes, packed codes uint8 ``[n, 256]``, scales uint8 ``[n, 32]``."""
    delta = c.safety * (c.approx + U)
    least, most = block_amax_range(z.lo, z.hi, 16)
    floor = float(NVFP4_AMAX_FLOOR)
    low = e4m3_bits(_f32(np.maximum(least, floor) / E2M1_MAX * (1 - delta)))
    high = e4m3_bits(_f32(np.maximum(most, floor) / E2M1_MAX * (1 + delta)))
    _judge_scales(counts, (low <= scales) & (scales <= high) & (scales < 0x80), scales, spec_scales)
    sigma = np.repeat(e4m3_to_f32(scales).astype(np.float64), 16, axis=1)
    usable = sigma > 0  # a written scale of zero (or a negative one) leaves no code judgeable
    with np.errstate(divide="ignore", invalid="ignore"):
        v_lo = np.where(usable, _value(z.lo) / np.where(usable, sigma, 1.0), 0.0)
        v_hi = np.where(usable, _value(z.hi) / np.where(usable, sigma, 1.0), 0.0)
    c_lo = e2m1_bits(_f32(v_lo - np.abs(v_lo) * delta))
    c_hi = e2m1_bits(_f32(v_hi + np.abs(v_hi) * delta))

    def codes(p):
        return np.stack([p & 0xF, p >> 4], axis=2).reshape(p.shape[0], -1)

    accepted = within(codes(packed), c_lo, c_hi, 0x8) & usable
    _judge_codes(counts, "values", accepted, codes(packed), codes(spec_packed))


def _indexer(counts, layout: str, z: Interval, data, scales_raw, spec_data, spec_scales) -> None:
    """§12's records: data uint8 ``[n, 128]`` (E4M3) or ``[n, 64]`` (packed E2M1), scale bytes ``[n, 4]``."""
    if layout == INDEXER_FP8.name:
        written = scales_raw.copy().view("<f4")[:, 0].astype(np.float64)
        mantissa, exponent = np.frexp(written)
        power = (mantissa == 0.5) & np.isfinite(written)
        k = np.where(power, exponent - 1, 0).astype(np.int64)[:, None]
        ok = power[:, None] & _ue8m0_ok(z, k, 128)
        counts.bump("scale within bound", np.count_nonzero(ok[:, 0] & (scales_raw != spec_scales).any(axis=1)))
        counts.bump("scale beyond bound", np.count_nonzero(~ok[:, 0]))
        kk = np.repeat(k, 128, axis=1)
        _judge_codes(counts, "values", within(data, e4m3_at(z.lo, kk), e4m3_at(z.hi, kk), 0x80), data, spec_data)
        return
    k = scales_raw.astype(np.int64) - 127
    least, most = block_amax_range(z.lo, z.hi, 32)
    ok = (mxfp4_exponent(_f32(least)) <= k) & (k <= mxfp4_exponent(_f32(most)))
    _judge_scales(counts, ok, scales_raw, spec_scales)
    kk = np.repeat(k, 32, axis=1)

    def codes(p):
        return np.stack([p & 0xF, p >> 4], axis=2).reshape(p.shape[0], -1)

    from .bounds import e2m1_at

    _judge_codes(counts, "values", within(codes(data), e2m1_at(z.lo, kk), e2m1_at(z.hi, kk), 0x8), codes(data),
                 codes(spec_data))


def _records(counts: Counts, inputs: V41Inputs, z: Interval, slots, expected, actual, addressed, c) -> None:
    """Judge the records of ``slots`` (int64 ``[n]``) in the cache allocations ``expected`` / ``actual``
    (uint8), marking the bytes they occupy in ``addressed`` (bool, same shape)."""
    layout = inputs.layout
    if layout in (V41_MXFP8.name, V41_NVFP4.name, INDEXER_FP8.name, INDEXER_MXFP4.name):
        record = {r.name: r for r in (V41_MXFP8, V41_NVFP4, INDEXER_FP8, INDEXER_MXFP4)}[layout]
        data_idx, scale_idx = record_indices(inputs.k_cache, record, slots)
        addressed[data_idx] = addressed[scale_idx] = True
        args = (actual[data_idx], actual[scale_idx], expected[data_idx], expected[scale_idx])
        if layout == V41_MXFP8.name:
            _mxfp8(counts, z, *args)
        elif layout == V41_NVFP4.name:
            _nvfp4(counts, z, *args, c)
        else:
            _indexer(counts, layout, z, *args)
        return
    got, spec = _entry_bytes(inputs, actual, slots), _entry_bytes(inputs, expected, slots)
    addressed[got["index"]] = True
    nope, rope = Interval(z.lo[:, :NOPE_DIM], z.hi[:, :NOPE_DIM]), Interval(z.lo[:, NOPE_DIM:], z.hi[:, NOPE_DIM:])
    if layout == "flashmla_fp8":
        counts.bump("pad byte not 0", np.count_nonzero(got["pad"] != 0))
        k = got["scale"].astype(np.int64) - 127
        _judge_scales(counts, _ue8m0_ok(nope, k, 64), got["scale"], spec["scale"])
        kk = np.repeat(k, 64, axis=1)
        _judge_codes(counts, "NoPE", within(got["nope"], e4m3_at(nope.lo, kk), e4m3_at(nope.hi, kk), 0x80),
                     got["nope"], spec["nope"])
        _judge_codes(counts, "RoPE", within(got["rope"], rope.lo, rope.hi, 0x8000), got["rope"], spec["rope"])
        return
    if layout == "bf16":
        accepted = within(got["values"], z.lo, z.hi, 0x8000)
    else:
        inv = np.float64(F32(1.0) / F32(inputs.fp8_scale))
        accepted = within(got["values"], e4m3_bits(_f32(_value(z.lo) * inv)), e4m3_bits(_f32(_value(z.hi) * inv)), 0x80)
    for name, part in (("NoPE", slice(0, NOPE_DIM)), ("RoPE", slice(NOPE_DIM, 512))):
        _judge_codes(counts, name, accepted[:, part], got["values"][:, part], spec["values"][:, part])


def _latent_rows(inputs: V41Inputs, owner: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte indices ``[n, 1024]`` of the tokens' latent rows and their bf16 patterns ``[n, 512]``."""
    buffer = inputs.latent
    start = buffer.offset + tokens * buffer.strides[0]
    index = start[:, None] + np.arange(2 * 512)[None, :]
    return index, owner[index].copy().view("<u2")


def v41_tolerant_counts(inputs: V41Inputs, expected: dict, actual: dict, c: ToleranceConstants = CONSTANTS) -> dict:
    """SPEC §14.9's tolerant verdict: deviations counted by kind; kinds whose name says "within" are tolerated."""
    counts = Counts()
    if "state_cache" in expected:
        counts.bump("state bytes differ", np.count_nonzero(expected["state_cache"] != actual["state_cache"]))
    tokens = np.flatnonzero(inputs.active)
    positions = inputs.step.positions[tokens]
    op = inputs.operation
    if op == "index_key_store":
        z = index_key_interval(inputs, tokens, c)
    else:
        latent = (exact(inputs.latent.view_of(inputs.latent.owner)[tokens]) if op == "rope_quant_store"
                  else latent_interval(inputs, tokens, c))
        z = rotated_interval(latent, inputs.cos_sin_cache[rope_row(positions, inputs.compress_ratio)], NOPE_DIM, c)
    if "latent" in expected:
        addressed = np.zeros(expected["latent"].shape, dtype=bool)
        if op != "rope_quant_store":
            index, written = _latent_rows(inputs, actual["latent"], tokens)
            _, spec = _latent_rows(inputs, expected["latent"], tokens)
            addressed[index] = True
            _judge_codes(counts, "latent", within(written, latent.lo, latent.hi, 0x8000), written, spec)
        counts.bump("untouched latent bytes written", np.count_nonzero((expected["latent"] != actual["latent"]) & ~addressed))
    if "k_cache" in expected:
        addressed = np.zeros(expected["k_cache"].shape, dtype=bool)
        _records(counts, inputs, z, inputs.step.kv_slot_mapping[tokens], expected["k_cache"], actual["k_cache"],
                 addressed, c)
        counts.bump("untouched bytes written", np.count_nonzero((expected["k_cache"] != actual["k_cache"]) & ~addressed))
    return dict(counts)
