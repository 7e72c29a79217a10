"""bf16, E4M3 and UE8M0 against independent encoders (torch, ml_dtypes) and exact math."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from dsv4_compressor.spec.constants import AMAX_FLOOR
from dsv4_compressor.spec.formats import (
    E4M3_MAGNITUDES,
    bf16,
    bf16_bits,
    bf16_to_f32,
    e4m3_bits,
    e4m3_to_f32,
    ue8m0_exponent,
    ue8m0_scale_byte,
)

F32 = np.float32


def _finite_f32_patterns(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    values = bits.view(F32)
    return values[np.isfinite(values)]


def _bf16_edge_cases() -> np.ndarray:
    """Ties (low half exactly 0x8000, both parities), carries into the exponent, subnormals, zeros."""
    rng = np.random.default_rng(5)
    high = rng.integers(0, 0x7F7F, 200_000, dtype=np.uint32)
    ties = (high << 16) | 0x8000
    near = np.concatenate([(high << 16) | 0x7FFF, (high << 16) | 0x8001])
    carries = np.array([0x3F7FFFFF, 0x3F7F8000, 0x7F7F7FFF, 0x007FFFFF, 0x00008000, 0x00018000, 0x00000001], dtype=np.uint32)
    patterns = np.concatenate([ties, near, carries, np.array([0, 0x80000000], dtype=np.uint32)])
    signed = np.concatenate([patterns, patterns | 0x80000000])
    values = signed.view(F32)
    return values[np.isfinite(values)]


def test_bf16_matches_torch_and_ml_dtypes_on_millions_of_values():
    rng = np.random.default_rng(0)
    values = np.concatenate([_finite_f32_patterns(rng, 3_000_000), _bf16_edge_cases(),
                             rng.standard_normal(1_000_000).astype(F32)])
    ours = bf16_bits(values)
    via_torch = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    via_ml = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(ours, via_torch)
    assert np.array_equal(ours, via_ml)
    assert np.array_equal(bf16(values), via_ml.view(ml_dtypes.bfloat16).astype(F32))


def test_bf16_round_trip_is_exact():
    bits = np.arange(0, 2**16, dtype=np.uint32).astype(np.uint16)
    values = bf16_to_f32(bits)
    finite = np.isfinite(values)
    assert np.array_equal(bf16_bits(values[finite]), bits[finite])


def _e4m3_cases() -> np.ndarray:
    """Random magnitudes over the whole range, exact codes, midpoints (ties), their neighbours,
    subnormals, saturation (above 448, the 464 tie, huge) and both zeros."""
    rng = np.random.default_rng(1)
    mags = E4M3_MAGNITUDES.astype(np.float64)
    mids = (mags[:-1] + mags[1:]) / 2  # exact in binary32
    mids32 = mids.astype(F32)
    assert np.array_equal(mids32.astype(np.float64), mids)
    neighbours = np.concatenate([np.nextafter(mids32, F32(0)), np.nextafter(mids32, F32(1000))])
    random = np.exp(rng.uniform(np.log(2.0**-14), np.log(600.0), 2_000_000)).astype(F32)
    tiny = rng.uniform(0, 2.0**-8, 200_000).astype(F32)
    saturating = np.array([448.0, 449.0, 463.99, 464.0, 464.01, 479.0, 480.0, 1e6, 3e38], dtype=F32)
    everything = np.concatenate([mags.astype(F32), mids32, neighbours, random, tiny, saturating,
                                 np.array([0.0, 2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-149], dtype=F32)])
    return np.concatenate([everything, -everything])


def test_e4m3_matches_torch_and_ml_dtypes_with_saturation():
    values = _e4m3_cases()
    ours = e4m3_bits(values)
    clamped = np.clip(values, -448.0, 448.0)  # both libraries turn overflow into NaN; SPEC saturates
    via_ml = clamped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    via_torch = torch.from_numpy(clamped).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(ours, via_ml), values[ours != via_ml][:10]
    assert np.array_equal(ours, via_torch), values[ours != via_torch][:10]


def test_e4m3_rules_by_example():
    def enc(v):
        return int(e4m3_bits(np.array([v], F32))[0])

    assert enc(-0.0) == 0x80 and enc(0.0) == 0x00
    assert enc(1.0625) == 0x38  # tie between 1.0 (even) and 1.125 -> 1.0
    assert enc(1.1875) == 0x3A  # tie between 1.125 and 1.25 (even) -> 1.25
    assert enc(1.96875) == 0x40  # mantissa carry: 2.0
    assert enc(500.0) == 0x7E and enc(-1e30) == 0xFE  # saturate to +-448, never NaN (0x7F)
    assert enc(2.0**-9) == 0x01 and enc(2.0**-10) == 0x00 and enc(3 * 2.0**-10) == 0x02
    assert enc(-(2.0**-11)) == 0x80  # underflow keeps the sign


def test_e4m3_decode_inverts_encode():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    assert np.array_equal(e4m3_bits(e4m3_to_f32(codes)), codes)
    assert np.array_equal(e4m3_to_f32(codes), codes.view(ml_dtypes.float8_e4m3fn).astype(F32))


def test_ue8m0_exponent_is_ceil_log2_of_a_over_448():
    rng = np.random.default_rng(2)
    k = np.arange(-30, 120)
    powers = (448.0 * np.ldexp(1.0, k)).astype(F32)
    amax = np.concatenate([
        _finite_f32_patterns(rng, 2_000_000),
        powers, np.nextafter(powers, F32(np.inf)), np.nextafter(powers, F32(0)),
        np.array([0.0, 1e-30, 9.9e-5, 1e-4, 1.0001e-4, float(AMAX_FLOOR)], dtype=F32),
    ])
    amax = np.abs(amax)
    a = np.maximum(amax, AMAX_FLOOR).astype(np.float64)
    # exact reference: smallest k with a <= 448 * 2^k, by exact float64 comparisons around log2
    guess = np.ceil(np.log2(a / 448.0)).astype(np.int64)
    exact = guess.copy()
    exact[a <= 448.0 * np.ldexp(1.0, guess - 1)] -= 1
    exact[a > 448.0 * np.ldexp(1.0, exact)] += 1
    assert np.array_equal(ue8m0_exponent(amax), exact)
    assert np.array_equal(ue8m0_exponent(amax), guess)  # SPEC: equals ceil(log2(div(a, 448)))


def test_ue8m0_examples_and_byte():
    assert int(ue8m0_exponent(np.array([448.0], F32))[0]) == 0
    assert int(ue8m0_exponent(np.array([np.nextafter(F32(448), F32(1e9))], F32))[0]) == 1
    assert int(ue8m0_exponent(np.array([1e-6], F32))[0]) == math.ceil(math.log2(1e-4 / 448)) == -22
    assert int(ue8m0_scale_byte(np.array([-22]))[0]) == 105
    # vLLM's CuTe kernels floor the *scale*: ceil(log2(max(1e-6/448, 1e-4))) = -13 -> byte 114 (SPEC §11)
    assert 127 + math.ceil(math.log2(max(1e-6 / 448, 1e-4))) == 114


@pytest.mark.parametrize("amax", [0.0, 1e-9, 0.027, 1.0, 447.9, 448.0, 449.0, 3e38])
def test_scaled_block_fits_e4m3(amax):
    """Every value of a block scaled by 2^-k lies within +-448 (no saturation in flashmla_fp8)."""
    k = int(ue8m0_exponent(np.array([amax], F32))[0])
    assert F32(amax) * 2.0**-k <= 448.0
