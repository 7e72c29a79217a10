"""Values where a rounding decides the bytes, in Triton against the spec: bf16 ties in the pooled
vector, in the latent and in the RoPE outputs; E2M1 and E4M3 ties (the NVFP4 scale whose
reciprocal would change a code included); all-zero and ``-0`` tiles; scales at their floors and
saturated. Each test checks that its inputs really hit what it names before comparing bytes."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.formats import bf16_bits, bf16_to_f32, e4m3_bits, e4m3_to_f32

from v41_scenarios import assert_identical, build_case, combined, padded_rows, rope_quant_store

F32 = np.float32
RECORDS = ("flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4")
TIE_EPS = 2.0**-30  # ms + eps rounds to ms = 1: rr = 1 exactly


def _ties(rng: np.random.Generator, shape) -> np.ndarray:
    """fp32 values exactly halfway between two neighbouring bf16 values (both parities of the lower one)."""
    bits = (bf16_bits(rng.standard_normal(shape).astype(F32)).astype(np.uint32) << np.uint32(16)) | np.uint32(0x8000)
    return bits.view(F32)


def _is_tie(values: np.ndarray) -> np.ndarray:
    return (values.view(np.uint32) & np.uint32(0xFFFF)) == 0x8000


def _ones_with_signs(rng: np.random.Generator, shape) -> np.ndarray:
    """+-1: ``ss = 512``, so ``ms = 1`` and with ``eps = 2^-30`` the RMSNorm's ``rr`` is 1 exactly."""
    return np.where(rng.random(shape) < 0.5, F32(-1.0), F32(1.0))


# ---- bf16 ties before and after the norm -----------------------------------------------------------------------
def test_ratio1_pooled_vector_ties():
    """fp32 ``kv`` halfway between bf16 values: ``x' = bf16(x)`` rounds each to the even neighbour."""
    case = build_case([Request(0, 3), Request(7, 1)], ratio=1, seed=1, layout="v41_nvfp4")
    case.kv[...] = _ties(np.random.default_rng(1), case.kv.shape)
    assert _is_tie(case.kv).all()
    assert_identical(combined(case))


@pytest.mark.parametrize("state", [V.paged(4), V.reference_ring()], ids=["paged", "reference_ring"])
def test_ratio2_pooled_vector_ties(state):
    """Equal scores weigh 1/2 each: ``x = add(mul(v, 0.5), mul(v, 0.5)) = v``, halfway between bf16
    values; the row ``p - 1`` of the decode token comes from an fp32 state holding ``v`` too."""
    case = build_case([Request(0, 4), Request(5, 1)], ratio=2, seed=2, layout="v41_mxfp8", state=state)
    v = _ties(np.random.default_rng(2), (512,))
    case.kv[...] = v
    case.score[...] = F32(0.75)
    s, t = case.step, case.tables
    index = 4 % state.ring_capacity if state.ring_capacity else 4  # request 1's row p - 1 = 4, in the state
    row = case.state_cache[t.block_table[1, index // state.block_size], index % state.block_size]
    row[:512], row[512:] = v, F32(0.75)
    assert_identical(combined(case))


def test_latent_ties():
    """``x' = +-1`` and ``rr = 1``, so ``y = +-w``: an fp32 weight halfway between bf16 values makes
    every latent value a tie."""
    rng = np.random.default_rng(3)
    case = build_case([Request(0, 4)], ratio=1, seed=3, layout="bf16")
    case.kv[...] = _ones_with_signs(rng, case.kv.shape)
    case.weight = _ties(rng, (512,))
    case.eps = TIE_EPS
    assert _is_tie(case.weight).all()
    results = combined(case)
    assert_identical(results)


# ---- RoPE outputs at bf16 ties ---------------------------------------------------------------------------------------
def _tie_cos_sin(cos_sin: np.ndarray) -> None:
    """Rows whose products with powers of two are bf16 ties: ``1 + 2^-8`` (rounds down to even),
    ``1 + 3 * 2^-8`` (up), and ``1 + 17 * 2^-8``, whose even neighbour ``1.0625`` is an E4M3 tie
    itself (so a record that quantized the unrounded value, ``1.125``, differs from one of the
    bf16 value, ``1``); as cos with sin 0 and as sin with cos 0, in turn by pair."""
    tie = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 1 + 17 * 2.0**-8], F32)
    j = np.arange(32)
    cos_first = j % 2 == 0
    cos_sin[:, :32] = np.where(cos_first, tie[(j // 2) % 4], F32(0.0))
    cos_sin[:, 32:] = np.where(cos_first, F32(0.0), tie[(j // 2) % 4])


def _powers_of_two(rng: np.random.Generator, shape) -> np.ndarray:
    return (np.ldexp(1.0, rng.integers(-6, 7, size=shape)) * np.where(rng.random(shape) < 0.5, -1, 1)).astype(F32)


@pytest.mark.parametrize("layout", RECORDS)
def test_rope_output_ties_from_the_store(layout):
    """Latent RoPE channels that are powers of two times ``1 + 2^-8`` or ``1 + 3 * 2^-8``: every
    ``o0`` and ``o1`` is halfway between bf16 values."""
    rng = np.random.default_rng(4)
    case = build_case([Request(0, 4)], ratio=1, seed=4, layout=layout, fp8_scale=1.0 if layout == "fp8_per_tensor" else None)
    _tie_cos_sin(case.cos_sin)
    latent = bf16_to_f32(V.bf16_patterns(rng.standard_normal((case.step.num_tokens, 512))))
    latent[:, 448:] = _powers_of_two(rng, (case.step.num_tokens, 64))
    rotated = latent[:, 448::2] * case.cos_sin[0, :32] - latent[:, 449::2] * case.cos_sin[0, 32:]
    assert _is_tie(rotated.astype(F32)).all()
    assert_identical(rope_quant_store(case, padded_rows(bf16_bits(latent), 8)))


@pytest.mark.parametrize("layout", ["v41_mxfp8", "v41_nvfp4"])
def test_rope_output_ties_in_the_combined_call(layout):
    """The same through the latent: ``x' = +-1``, ``rr = 1``, the weight powers of two on the RoPE channels."""
    rng = np.random.default_rng(5)
    case = build_case([Request(0, 4)], ratio=1, seed=5, layout=layout)
    case.kv[...] = _ones_with_signs(rng, case.kv.shape)
    case.weight = np.concatenate([rng.standard_normal(448).astype(F32), np.abs(_powers_of_two(rng, (64,)))])
    case.eps = TIE_EPS
    _tie_cos_sin(case.cos_sin)
    assert_identical(combined(case))


# ---- quantization ties, zero tiles, floors and saturation --------------------------------------------------------------
def _special_tiles() -> np.ndarray:
    """One latent row (fp32 [512], bf16 values) of sixteen-channel tiles chosen for the records
    (tile ``g`` = channels ``16g .. 16g+15``; a 32-channel MXFP8 block is two tiles)."""
    z = bf16_to_f32(V.bf16_patterns(np.random.default_rng(6).standard_normal(512)))
    tiles = z.reshape(32, 16)
    # amax 6: sigma 1 (0x38), the codes e2m1(z) at every tie, signed zeros
    tiles[0] = [6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.0, 0.0, 1.0, -0.5, 4.0, 3.0]
    # amax 11.25: sigma = e4m3(1.875); 2.34375 / 1.875 = 1.25 is a tie (code 2) a rounded reciprocal misses
    tiles[1] = [11.25, 2.34375, -2.34375, 0.0, 1.875, 0.9375, 4.6875, -7.5] * 2
    tiles[2] = 0.0  # an all +0 tile: sigma 2^-9 (0x01), codes 0; MXFP8 block 1 (tiles 2, 3) takes the AMIN floor
    tiles[3] = -0.0  # all -0: codes 0x8, E4M3 0x80
    tiles[4] = np.array([30720.0, -3.0e4, 1.0, 2.0] * 4, F32)  # amax > 6 * 448: sigma saturates at 448 (0x7E)
    tiles[5] = np.array([2.0**-20, -2.0**-22] * 8, F32)  # far below 6 * 2^-9 and AMIN: the floors
    tiles[6] = np.array([0.046875, 0.0078125, -0.01171875, 2.0**-9] * 4, F32)  # sigma an E4M3 subnormal
    tiles[7] = np.array([6.1875, 3.09375, -6.1875, 1.0] * 4, F32)  # sigma rounded below a / 6: the top code saturates
    # an MXFP8 block (tiles 8, 9) with amax 448 (k = 0): E4M3 ties, normal and subnormal, and their negatives
    tiles[8] = [448.0, 1.0625, 1.1875, -1.0625, 272.0, 304.0, -272.0, 0.0, 2.0**-10, 3 * 2.0**-10, -(2.0**-10), 5 * 2.0**-10,
                -0.0, 17.0, 19.0, -17.0]
    tiles[9] = tiles[8] * F32(0.5)
    tiles[10] = tiles[8] * F32(2.0**-20)  # the same pattern below AMIN * 2^k
    tiles[11] = np.array([3.0e38, -1.0, 2.0**-30, 0.0] * 4, F32)  # a huge amax: k = 120, the small values to +-0
    return bf16_to_f32(bf16_bits(z.astype(F32)))


@pytest.mark.parametrize("layout", RECORDS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_quantization_ties_zero_tiles_and_scale_limits(ratio, layout):
    """Rows of :func:`_special_tiles`, negated and scaled by powers of two, through the store with
    ``cos = 1, sin = 0`` (the RoPE channels' values kept)."""
    rng = np.random.default_rng(7)
    case = build_case([Request(0, 8)], ratio=ratio, seed=7, layout=layout, entries_per_page=2,
                      fp8_scale=1.0 if layout == "fp8_per_tensor" else None, num_padding=0)
    case.cos_sin[:, :32], case.cos_sin[:, 32:] = F32(1.0), F32(0.0)
    row = _special_tiles()
    rows = np.stack([row, -row, row * F32(2.0**-8), row * F32(0.5), row[rng.permutation(512)], row, -row, row])
    assert np.array_equal(bf16_to_f32(bf16_bits(rows)), rows)  # bf16 values: the store's input exactly
    sigma = e4m3_to_f32(e4m3_bits(np.maximum(np.abs(row.reshape(32, 16)).max(axis=1), F32(6 * 2.0**-9)) / F32(6)))
    assert sigma[0] == 1.0 and sigma[1] == 1.875 and sigma[4] == 448.0 and sigma[6] < 2.0**-6
    assert F32(2.34375) / F32(1.875) == F32(1.25) and F32(2.34375) * (F32(1.0) / F32(1.875)) != F32(1.25)
    assert_identical(rope_quant_store(case, padded_rows(bf16_bits(rows), 8)))
