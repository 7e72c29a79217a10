"""DeepSeek-V4.1's operations (SPEC §14) in NumPy with named changes: the departures SPEC §14.10
lists and plausible mistakes (mutants).

:class:`V41Variant` takes the spec's arguments and makes the spec's checks (SPEC §14.8, before
anything is written), then runs SPEC §14.3-§14.6 from the spec's own building blocks, each
change switching one step. With no change its bytes are the spec's. The suite uses it twice:

- :mod:`.v41_departures` recomputes a scenario with §14.10's departures applied, to name the
  departure that explains an implementation's bytes;
- ``V41_MUTANTS.<name>`` are implementations with one change each
  (``--impl dsv4_compressor.conformance.v41_variants:V41_MUTANTS.<name>``); the suite's tests
  check that the default (exact) run fails every one.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from ..spec.arithmetic import add, div, exp2s, mul, sqrt, sub, tree
from ..spec.constants import LOG2E, NOPE_DIM, NVFP4_AMAX_FLOOR, ROPE_DIM, E2M1_MAX
from ..spec.entry_layout import V41_MXFP8, V41_NVFP4
from ..spec.formats import E2M1_MAGNITUDES, bf16, bf16_bits, bf16_to_f32, e2m1_bits, e4m3_bits, e4m3_to_f32
from ..spec.layouts import store_records
from ..spec.postprocess import INV_HEAD_DIMS, norm_weight_f32, rope_row
from ..spec.rows import ChunkInputs, window_rows
from ..spec.state_format import StateFormat
from ..spec.v41_compress import active_tokens, as_binary32, save_ratio2, stored_tokens
from ..spec.v41_index_key import store_index_keys
from ..spec.v41_operator import _check_compress, _k_cache_info
from ..spec.v41_records import pack_e2m1, quantize_mxfp8, store_rotated_entries
from ..spec.v41_validation import check_v41_index_key, check_v41_store, describe_numpy, describe_optional
from ..spec.v41_compress import StateArguments
from .capabilities import V41_EVERYTHING, Capabilities

F32 = np.float32
APPROX = 2.0 ** -21  # relative error of the fast-math exp, rsqrt and division

DEPARTURES = {  # SPEC §14.10 (vLLM's deepseek_v41 kernels): name -> what the report says
    "unrounded_pooled": "norm of the unrounded pooled vector (ratio 1: of the unrounded fp32 projection)",
    "unrounded_rope_records": "528/288 B records quantizing the unrounded RoPE output",
    "nope_rotation": "NoPE through a (1, 0) rotation (-0 may become +0)",
    "fast_math": "approximate exp, rsqrt and division",
}
EXACT_DEPARTURES = ("unrounded_pooled", "unrounded_rope_records", "nope_rotation")  # reproducible bit for bit
MUTATIONS = {  # plausible mistakes: name -> what it gets wrong
    "rope_first_half": "RoPE on channels 0..63 (the wrong half) instead of the last 64",
    "rope_split_halves": "RoPE pairs (j, j + 32) instead of the interleaved (2j, 2j + 1)",
    "e2m1_ties_away": "E2M1 ties rounded away from zero instead of to even",
    "nvfp4_reciprocal": "NVFP4 values multiplied by fl(1/sigma) instead of divided by sigma",
    "latent_not_written": "the latent is not written",
    "latent_for_non_boundary": "latent rows written for ratio 2's non-boundary tokens too",
    "save_before_compress_on_ring": "ratio 2 on a ring saves the chunk's tail before the compress reads the ring",
    "ring_without_modulo": "a ring position q looked up at q rows past the ring's first block, not q mod C",
    "nibbles_swapped": "v41_nvfp4 codes packed with the odd channel in the low nibble",
    "scales_per_page": "v41_mxfp8 / v41_nvfp4 scales after the page's data (per page), not after each token's",
}


def perturb(v: np.ndarray, salt: int) -> np.ndarray:
    """``v·(1 + δ)`` rounded to binary32, ``|δ| <= 2^-21`` a hash of v's bits (deterministic)."""
    v = np.asarray(v, dtype=F32)
    bits = v.view(np.int32).astype(np.int64)
    h = ((bits * 2654435761 + salt * 40503) >> 7) & 0xFFFF
    delta = (h.astype(np.float64) / 32768.0 - 1.0) * APPROX
    return (v.astype(np.float64) * (1.0 + delta)).astype(F32)


class _RingWithoutModulo(StateFormat):
    """A ring read at ``first block + q // bs`` (q rows past the ring's start), not ``q mod C``;
    blocks past the allocation wrap (the instance's ``num_blocks`` is the state's)."""

    num_blocks = 1

    def row_of(self, block_table, requests, positions, block_size):
        first = block_table[requests, 0].astype(np.int64)
        blocks = first + positions // block_size
        return blocks % self.num_blocks, positions % block_size


class V41Variant:
    """SPEC §14's four operations on NumPy arrays with the named ``changes``; the operations take
    the spec's arguments with the spec's shapes and dtypes (:mod:`dsv4_compressor.spec.v41_operator`)."""

    def __init__(self, changes: tuple[str, ...] = ()):
        unknown = set(changes) - set(DEPARTURES) - set(MUTATIONS)
        if unknown:
            raise ValueError(f"changes: expected names from {sorted(DEPARTURES) + sorted(MUTATIONS)}, got {sorted(unknown)}")
        self.changes = frozenset(changes)
        self.name = "+".join(sorted(changes)) or "spec"
        self.CAPABILITIES = Capabilities(devices=("cpu",), arrays="numpy", v4=False, v41=V41_EVERYTHING)

    def _has(self, change: str) -> bool:
        return change in self.changes

    # ---- SPEC §14.3 ------------------------------------------------------------------------
    def _softmax_then_sum(
        self,
        kv: np.ndarray,  # float32 [n, 2, 512]: rows i = 0, 1 (positions p - 1, p)
        score: np.ndarray,  # float32 [n, 2, 512]: their raw scores
    ) -> np.ndarray:
        """SPEC §14.3's ``x`` (float32 ``[n, 512]``)."""
        m = np.maximum(score[:, 0], score[:, 1])
        t0, t1 = mul(sub(score[:, 0], m), LOG2E), mul(sub(score[:, 1], m), LOG2E)
        e0, e1 = exp2s(t0), exp2s(t1)
        if self._has("fast_math"):
            e0 = np.where(t0 < -126, F32(0), perturb(np.exp2(t0.astype(np.float64)).astype(F32), 1))
            e1 = np.where(t1 < -126, F32(0), perturb(np.exp2(t1.astype(np.float64)).astype(F32), 1))
        den = add(e0, e1)
        w0, w1 = div(e0, den), div(e1, den)
        if self._has("fast_math"):
            w0, w1 = perturb(w0, 3), perturb(w1, 3)
        return add(mul(kv[:, 0], w0), mul(kv[:, 1], w1))

    def _norm(
        self,
        x: np.ndarray,  # float32 [n, 512]: the pooled vectors
        weight: np.ndarray,  # float32 [512]: the norm weight's binary32 value
        eps,  # binary32 rms_norm_eps
    ) -> np.ndarray:
        """``y`` (fp32) of the pooled ``x``: bf16-rounded first unless ``unrounded_pooled``."""
        return self._norm_key(x if self._has("unrounded_pooled") else bf16(x), weight, eps)

    def _state_format(self, state_call, state: StateArguments) -> StateFormat:
        fmt = state_call.state_format
        if self._has("ring_without_modulo") and fmt.ring_capacity is not None:
            ring = _RingWithoutModulo(fmt.dtype, fmt.ape_at, fmt.ring_capacity)
            object.__setattr__(ring, "num_blocks", state.state_cache.shape[0])
            return ring
        return fmt

    def _pooled(
        self,
        kv32: np.ndarray,  # float32 [T, 512]
        score32: np.ndarray,  # float32 [T, 512]
        positions: np.ndarray,  # int64 [T]
        tokens: np.ndarray,  # int64 [n]: the active tokens
        state: StateArguments,
        fmt: StateFormat,  # where rows are read (a broken ring for ring_without_modulo)
    ) -> np.ndarray:
        """Ratio 2's ``x`` (float32 ``[n, 512]``) from the rows at ``p - 1`` and ``p``."""
        window = positions[tokens, None] - 1 + np.arange(2, dtype=np.int64)[None, :]
        chunk = ChunkInputs(kv=kv32, score=score32, positions=positions, query_start_loc=state.query_start_loc)
        rows = window_rows(window, state.token_to_req[tokens], fmt, state.state_cache, state.block_table, state.bs, chunk)
        return self._softmax_then_sum(rows.kv, rows.score)

    def _compress(self, call, state_call, kv, score, positions, state: StateArguments, weight, kv_slot_mapping):
        """(tokens, latent bits uint16 ``[n, 512]``, extra latent rows {token: bits}) and ratio 2's save."""
        r = call.config.ratio
        w = norm_weight_f32(weight)
        tokens = np.flatnonzero(active_tokens(positions, state.slot_mapping, kv_slot_mapping, r))
        kv32 = as_binary32(kv)
        if r == 1:
            return tokens, bf16_bits(self._norm(kv32[tokens], w, call.eps)), {}
        score32 = as_binary32(score)
        state = replace(state, bs=state_call.block_size)
        fmt = self._state_format(state_call, state)
        save_first = self._has("save_before_compress_on_ring") and fmt.ring_capacity is not None
        if save_first:
            save_ratio2(kv32, score32, positions, state, state_call.state_format)
        bits = bf16_bits(self._norm(self._pooled(kv32, score32, positions, tokens, state, fmt), w, call.eps))
        extra = {}
        if self._has("latent_for_non_boundary"):
            others = np.flatnonzero((state.slot_mapping >= 0) & (positions % 2 == 0))
            extra = dict(zip(others.tolist(), bf16_bits(self._norm(kv32[others], w, call.eps))))
        if not save_first:
            save_ratio2(kv32, score32, positions, state, state_call.state_format)
        return tokens, bits, extra

    def _write_latent(self, latent, tokens, bits, extra) -> None:
        if latent is None or self._has("latent_not_written"):
            return
        latent[tokens] = bits
        for token, row in extra.items():
            latent[token] = row

    # ---- SPEC §14.4 ----------------------------------------------------------------------------
    def _rotate(
        self,
        values: np.ndarray,  # uint16 [n, H]: bf16 patterns (the latent, or the index key kappa)
        cos_sin: np.ndarray,  # float32 [n, 64]: each token's cos_sin_cache row
        start: int,  # the first rotated channel: 448, or 64 for the index key
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """(z bits uint16 ``[n, H]``, the unrounded rotated fp32 ``[n, 64]``, the first rotated channel)."""
        if self._has("rope_first_half"):
            start = 0
        x = bf16_to_f32(values)
        part = x[:, start:start + ROPE_DIM]
        if self._has("rope_split_halves"):
            a, b = part[:, :ROPE_DIM // 2], part[:, ROPE_DIM // 2:]
        else:
            a, b = part[:, 0::2], part[:, 1::2]
        co, si = cos_sin[:, :32], cos_sin[:, 32:]
        if self._has("fast_math"):  # products fused into the sum (one rounding)
            a64, b64, c64, s64 = (v.astype(np.float64) for v in (a, b, co, si))
            o0, o1 = (a64 * c64 - b64 * s64).astype(F32), (a64 * s64 + b64 * c64).astype(F32)
        else:
            o0, o1 = sub(mul(a, co), mul(b, si)), add(mul(a, si), mul(b, co))
        if self._has("rope_split_halves"):
            rotated = np.concatenate([o0, o1], axis=1)
        else:
            rotated = np.stack([o0, o1], axis=-1).reshape(x.shape[0], ROPE_DIM)
        z = np.array(values, dtype=np.uint16, copy=True)
        z[:, start:start + ROPE_DIM] = bf16_bits(rotated)
        if self._has("nope_rotation"):
            outside = np.ones(x.shape[1], dtype=bool)
            outside[start:start + ROPE_DIM] = False
            pairs = x[:, outside].reshape(x.shape[0], -1, 2)
            one, zero = F32(1.0), F32(0.0)
            p0 = sub(mul(pairs[..., 0], one), mul(pairs[..., 1], zero))
            p1 = add(mul(pairs[..., 0], zero), mul(pairs[..., 1], one))
            z[:, outside] = bf16_bits(np.stack([p0, p1], axis=-1).reshape(x.shape[0], -1))
        return z, rotated, start

    # ---- SPEC §14.5 ----------------------------------------------------------------------------
    def _e2m1(self, v: np.ndarray) -> np.ndarray:  # float32 [...] -> uint8 [...] codes
        if not self._has("e2m1_ties_away"):
            return e2m1_bits(v)
        magnitude = np.abs(v).astype(np.float64)
        distance = np.abs(magnitude[..., None] - E2M1_MAGNITUDES.astype(np.float64))
        code = distance.shape[-1] - 1 - np.argmin(distance[..., ::-1], axis=-1)  # the larger magnitude on a tie
        return (code | np.where(np.signbit(v), 8, 0)).astype(np.uint8)

    def _nvfp4(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``z`` float32 ``[n, 512]`` -> (packed codes uint8 ``[n, 256]``, scale bytes uint8 ``[n, 32]``)."""
        n = z.shape[0]
        tiles = z.reshape(n, -1, 16)
        a = np.maximum(np.max(np.abs(tiles), axis=-1), F32(NVFP4_AMAX_FLOOR))
        quotient = div(a, F32(E2M1_MAX))
        if self._has("fast_math"):
            quotient = perturb(quotient, 4)
        scale_bytes = e4m3_bits(quotient)
        sigma = e4m3_to_f32(scale_bytes)[:, :, None]
        if self._has("nvfp4_reciprocal"):
            v = mul(tiles, div(F32(1.0), sigma))
        else:
            v = div(tiles, sigma)
            if self._has("fast_math"):
                v = perturb(v, 5)
        codes = self._e2m1(v).reshape(n, -1)
        packed = (codes[:, 1::2] | (codes[:, 0::2] << np.uint8(4))) if self._has("nibbles_swapped") else pack_e2m1(codes)
        return packed.astype(np.uint8), scale_bytes

    def _store(
        self,
        k_cache: np.ndarray,  # the layout's cache, written in place
        slots: np.ndarray,  # int64 [n]
        z_bits: np.ndarray,  # uint16 [n, 512]: the rotated entries
        rotated: np.ndarray,  # float32 [n, 64]: the unrounded rotated values
        start: int,  # their first channel
        layout: str,
        fp8_scale,  # binary32 or None
    ) -> None:
        if layout not in (V41_MXFP8.name, V41_NVFP4.name):
            store_rotated_entries(k_cache, slots, z_bits, layout, fp8_scale)
            return
        z = bf16_to_f32(z_bits)
        if self._has("unrounded_rope_records"):
            z[:, start:start + ROPE_DIM] = rotated
        record = V41_MXFP8 if layout == V41_MXFP8.name else V41_NVFP4
        if layout == V41_MXFP8.name:
            entries = quantize_mxfp8(z)
            data, scales = entries.codes, entries.scale_bytes
        else:
            data, scales = self._nvfp4(z)
        if self._has("scales_per_page"):
            record = replace(record, placement="paged")
        store_records(k_cache, record, slots, data, scales)

    def _rotate_and_store(self, bits, tokens, positions, kv_slot_mapping, cos_sin_cache, k_cache, ratio, layout,
                          fp8_scale) -> None:
        if tokens.size == 0:
            return
        z, rotated, start = self._rotate(bits, cos_sin_cache[rope_row(positions[tokens], ratio)], NOPE_DIM)
        self._store(k_cache, kv_slot_mapping[tokens], z, rotated, start, layout, fp8_scale)

    # ---- SPEC §14.7 -------------------------------------------------------------------------------
    def v41_compress_norm(self, kv, score, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping,
                          block_table, bs, state_cache, rms_norm_weight, rms_norm_eps, kv_slot_mapping, latent, *,
                          compress_ratio, ring_capacity=None, ape=None):
        state = StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs,
                               state_cache, ring_capacity)
        call, state_call = _check_compress(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping,
                                           latent, compress_ratio, ape)
        tokens, bits, extra = self._compress(call, state_call, kv, score, positions, state, rms_norm_weight,
                                             kv_slot_mapping)
        self._write_latent(latent, tokens, bits, extra)

    def v41_rope_quant_store(self, latent, positions, kv_slot_mapping, cos_sin_cache, k_cache, *, compress_ratio, layout,
                             fp8_scale=None):
        call = check_v41_store(describe_numpy("latent", latent), describe_numpy("positions", positions),
                               describe_numpy("kv_slot_mapping", kv_slot_mapping),
                               describe_numpy("cos_sin_cache", cos_sin_cache), _k_cache_info(k_cache, layout),
                               compress_ratio, layout, fp8_scale)
        tokens = np.flatnonzero(stored_tokens(positions, kv_slot_mapping, call.config.ratio))
        self._rotate_and_store(latent[tokens], tokens, positions, kv_slot_mapping, cos_sin_cache, k_cache,
                               call.config.ratio, call.layout, call.fp8_scale)

    def v41_compress_norm_rope_store(self, kv, score, positions, token_to_req, query_start_loc, slot_mapping,
                                     save_slot_mapping, block_table, bs, state_cache, rms_norm_weight, rms_norm_eps,
                                     cos_sin_cache, k_cache, kv_slot_mapping, latent, *, compress_ratio, layout,
                                     ring_capacity=None, fp8_scale=None, ape=None):
        state = StateArguments(token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs,
                               state_cache, ring_capacity)
        call, state_call = _check_compress(kv, score, positions, state, rms_norm_weight, rms_norm_eps, kv_slot_mapping,
                                           latent, compress_ratio, ape, latent_optional=True)
        store = check_v41_store(describe_optional("latent", latent), describe_numpy("positions", positions),
                                describe_numpy("kv_slot_mapping", kv_slot_mapping),
                                describe_numpy("cos_sin_cache", cos_sin_cache), _k_cache_info(k_cache, layout),
                                compress_ratio, layout, fp8_scale)
        tokens, bits, extra = self._compress(call, state_call, kv, score, positions, state, rms_norm_weight,
                                             kv_slot_mapping)
        self._write_latent(latent, tokens, bits, extra)
        self._rotate_and_store(bits, tokens, positions, kv_slot_mapping, cos_sin_cache, k_cache, call.config.ratio,
                               store.layout, store.fp8_scale)

    def v41_index_key_store(self, k_pre, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps, cos_sin_cache,
                            k_cache, *, compress_ratio, layout):
        call = check_v41_index_key(describe_numpy("k_pre", k_pre), describe_numpy("positions", positions),
                                   describe_numpy("kv_slot_mapping", kv_slot_mapping),
                                   describe_numpy("rms_norm_weight", rms_norm_weight), rms_norm_eps,
                                   describe_numpy("cos_sin_cache", cos_sin_cache), describe_numpy("k_cache", k_cache),
                                   compress_ratio, layout)
        tokens = np.flatnonzero(stored_tokens(positions, kv_slot_mapping, call.config.ratio))
        if tokens.size == 0:
            return
        x = bf16_to_f32(k_pre[tokens])
        kappa = bf16_bits(self._norm_key(x, norm_weight_f32(rms_norm_weight), call.eps))
        z, _, _ = self._rotate(kappa, cos_sin_cache[rope_row(positions[tokens], call.config.ratio)], 64)
        store_index_keys(k_cache, kv_slot_mapping[tokens], z, call.layout)

    def _norm_key(
        self,
        x: np.ndarray,  # float32 [n, 128]: k_pre's values, or [n, 512]: the pooled vectors as normed
        weight: np.ndarray,  # float32 [128] or [512]
        eps,  # binary32 rms_norm_eps
    ) -> np.ndarray:
        """The RMSNorm of SPEC §14.4 and §14.6 (the latent's and the index key's); ``fast_math`` perturbs its
        reciprocal square root."""
        ss = tree(mul(x, x), axis=-1)
        v = add(mul(ss, INV_HEAD_DIMS[x.shape[-1]]), F32(eps))
        rr = div(F32(1.0), sqrt(v))
        if self._has("fast_math"):
            rr = perturb((1.0 / np.sqrt(v.astype(np.float64))).astype(F32), 2)
        return mul(mul(x, rr[..., None]), weight)


V41_MUTANTS = SimpleNamespace(**{name: V41Variant((name,)) for name in (*DEPARTURES, *MUTATIONS)})
"""One implementation per departure and mutation: ``--impl dsv4_compressor.conformance.v41_variants:V41_MUTANTS.<name>``."""
