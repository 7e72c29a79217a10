"""The Triton device helpers of :mod:`exact_math` and :mod:`pooling` against the NumPy spec (and
torch / ml_dtypes where they implement the same rounding), bit for bit, on many values:
ties, mantissa carries, subnormals, signed zeros, saturation, the exp2s underflow edge; the
indexer's E2M1 encoder over every 7th binary32 of a range and the MXFP4 exponent around every
boundary."""

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from dsv4_compressor.impl.triton.exact_math import (bf16_rne_bits, e2m1_code, e4m3_code, exp2s, mxfp4_scale,
                                                    tree_sum_of_squares, ue8m0_scale)
from dsv4_compressor.impl.triton.pooling import RowPlan, row_plan, tree_sum_window_rows, window_row_of
from dsv4_compressor.spec import arithmetic, formats
from dsv4_compressor.spec.constants import AMAX_FLOOR

DEVICE = "cpu" if not torch.cuda.is_available() else "cuda"
F32 = np.float32
BLOCK = 4096


@triton.jit
def _elementwise_kernel(x_ptr, out_ptr, out2_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if OP == 0:
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + offsets, exp2s(x), mask=mask)
    elif OP == 1:
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + offsets, bf16_rne_bits(x).to(tl.int32, bitcast=True), mask=mask)
    elif OP == 2:
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + offsets, e4m3_code(x).to(tl.int32, bitcast=True), mask=mask)
    elif OP == 3:
        amax_bits = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.int32, bitcast=True)
        scale_byte, inv_scale = ue8m0_scale(amax_bits)
        tl.store(out_ptr + offsets, scale_byte, mask=mask)
        tl.store(out2_ptr + offsets, inv_scale, mask=mask)
    elif OP == 4:
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + offsets, e2m1_code(x).to(tl.int32, bitcast=True), mask=mask)
    else:
        amax_bits = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.int32, bitcast=True)
        scale_byte, inv_scale = mxfp4_scale(amax_bits)
        tl.store(out_ptr + offsets, scale_byte, mask=mask)
        tl.store(out2_ptr + offsets, inv_scale, mask=mask)


def _run(op: int, values: np.ndarray, out_dtype=torch.int32):
    x = torch.from_numpy(np.ascontiguousarray(values, dtype=F32)).to(DEVICE)
    out = torch.empty(x.shape, dtype=out_dtype, device=DEVICE)
    out2 = torch.empty(x.shape, dtype=torch.float32, device=DEVICE)
    _elementwise_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, out2, x.numel(), OP=op, BLOCK=BLOCK, enable_fp_fusion=False)
    return out.cpu().numpy(), out2.cpu().numpy()


def _from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(F32)


def _bits(values) -> np.ndarray:
    return np.asarray(values, dtype=F32).view(np.uint32)


def test_exp2s_matches_spec_on_a_dense_sample_and_edges():
    rng = np.random.default_rng(0)
    dense = -rng.uniform(0.0, 130.0, 150_000).astype(F32)
    near_zero = -np.exp(rng.uniform(-90, 0, 20_000)).astype(F32)  # tiny magnitudes down to subnormal
    half_integers = -(np.arange(0, 254, dtype=F32) / F32(2))  # rint ties: -0.5, -1.5, ...
    neighbours = np.concatenate([np.nextafter(half_integers, F32(0)), np.nextafter(half_integers, F32(-200))])
    edges = np.array([0.0, -0.0, -126.0, -125.5, -126.5, -127.0, -1e30, -np.inf, -1e-45, -125.0, -149.0], dtype=F32)
    edges = np.concatenate([edges, np.nextafter(F32(-126), F32(0)), np.nextafter(F32(-126), F32(-200))], axis=None)
    x = np.concatenate([dense, near_zero, half_integers, neighbours.astype(F32), edges]).astype(F32)
    got, _ = _run(0, x, torch.float32)
    expected = arithmetic.exp2s(x)
    mismatch = np.flatnonzero(_bits(got) != _bits(expected))
    assert mismatch.size == 0, f"exp2s({x[mismatch[0]]!r}) = {got[mismatch[0]]!r}, spec {expected[mismatch[0]]!r}"
    assert got[x == F32(-126.0)][0] == np.finfo(F32).tiny and np.all(got[x < F32(-126.0)] == 0)


def _bf16_cases(rng) -> np.ndarray:
    random_bits = rng.integers(0, 0x7F7FFFFF, 100_000, dtype=np.uint32) | (rng.integers(0, 2, 100_000, dtype=np.uint32) << 31)
    # ties (low half 0x8000) with even and odd kept LSB, and their neighbours; carries into the exponent
    highs = rng.integers(0, 0x7F7F, 4000, dtype=np.uint32) << 16
    ties = np.concatenate([highs | 0x8000, highs | 0x18000, highs | 0x7FFF, highs | 0x8001, highs | 0xFFFF])
    carries = np.array([0x3F7FFFFF, 0x3F7F8000, 0x3FFF8000, 0x007F8000, 0x00008000, 0x00018000, 0x7F7F7FFF,
                        0x80000000, 0x00000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF], dtype=np.uint32)
    return _from_bits(np.concatenate([random_bits, ties, ties | 0x80000000, carries]))


def test_bf16_encoder_matches_spec_and_torch():
    x = _bf16_cases(np.random.default_rng(1))
    got, _ = _run(1, x)
    got = got.astype(np.uint32)
    assert np.array_equal(got, formats.bf16_bits(x).astype(np.uint32))
    torch_bits = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    assert np.array_equal(got, torch_bits)


def _e4m3_cases(rng) -> np.ndarray:
    mags = formats.E4M3_MAGNITUDES.astype(np.float64)
    midpoints = ((mags[:-1] + mags[1:]) / 2).astype(F32)  # exact in binary32: every tie of E4M3
    around = np.concatenate([np.nextafter(midpoints, F32(0)), np.nextafter(midpoints, F32(1000)), mags.astype(F32)])
    log_spread = np.exp(rng.uniform(np.log(1e-12), np.log(600.0), 100_000)).astype(F32)
    f32_subnormals = _from_bits(rng.integers(1, 0x800000, 2000, dtype=np.uint32))
    saturating = np.array([448.0, 449.0, 463.999, 464.0, 464.001, 480.0, 500.0, 1e6, 3.4e38, np.inf, 2.0**-10,
                           2.0**-10 * 1.0000001, 2.0**-9, 2.0**-6, 0.0], dtype=F32)
    magnitudes = np.concatenate([midpoints, around, log_spread, f32_subnormals, saturating])
    return np.concatenate([magnitudes, -magnitudes]).astype(F32)


def test_e4m3_encoder_matches_spec_torch_and_ml_dtypes():
    x = _e4m3_cases(np.random.default_rng(2))
    got, _ = _run(2, x)
    got = got.astype(np.uint8)
    expected = formats.e4m3_bits(x)
    mismatch = np.flatnonzero(got != expected)
    assert mismatch.size == 0, f"e4m3({x[mismatch[0]]!r}) = 0x{got[mismatch[0]]:02x}, spec 0x{expected[mismatch[0]]:02x}"
    # torch and ml_dtypes do not saturate (overflow gives NaN): compare where no saturation happens
    in_range = np.abs(x) < F32(464.0)
    torch_codes = torch.from_numpy(x[in_range]).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(got[in_range], torch_codes)
    ml_codes = x[in_range].astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(got[in_range], ml_codes)


def test_e4m3_keeps_the_sign_of_zero():
    got, _ = _run(2, np.array([0.0, -0.0, -1e-30, 1e-30, -2.0**-11], dtype=F32))
    assert list(got.astype(np.uint8)) == [0x00, 0x80, 0x80, 0x00, 0x80]


def test_ue8m0_matches_spec_on_boundaries_and_random_amax():
    rng = np.random.default_rng(3)
    k = np.arange(-30, 120)
    boundaries = (F32(448.0) * np.exp2(k)).astype(F32)  # a = 448 * 2^k exactly: k itself
    around = np.concatenate([np.nextafter(boundaries, F32(0)), np.nextafter(boundaries, F32(np.inf))])
    floor = np.array([0.0, AMAX_FLOOR, np.nextafter(AMAX_FLOOR, F32(0)), np.nextafter(AMAX_FLOOR, F32(1)), 1e-30, 1.4e-45], dtype=F32)
    powers = np.exp2(np.arange(-20, 100)).astype(F32)
    random = np.exp(rng.uniform(np.log(1e-8), np.log(1e30), 50_000)).astype(F32)
    amax = np.concatenate([boundaries, around, floor, powers, random]).astype(F32)
    scale_byte, inv_scale = _run(3, amax)
    expected_k = formats.ue8m0_exponent(amax)
    assert np.array_equal(scale_byte, (expected_k + 127).astype(np.int32))
    assert np.array_equal(_bits(inv_scale), _bits(np.ldexp(F32(1.0), (-expected_k).astype(np.int32)).astype(F32)))


@triton.jit
def _tree_1d_kernel(x_ptr, out_ptr, N: tl.constexpr, LOG2_N: tl.constexpr):
    row = tl.program_id(0)
    v = tl.load(x_ptr + row * N + tl.arange(0, N))
    tl.store(out_ptr + row, tree_sum_of_squares(v, N, LOG2_N))


@triton.jit
def _window_tree_kernel(x_ptr, y_ptr, num_ptr, den_ptr, W: tl.constexpr, C: tl.constexpr, LANE_BITS: tl.constexpr,
                        WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    window_row = window_row_of(tl.arange(0, W), LANE_BITS, WARP_BITS, REG_BITS)
    offsets = window_row[:, None] * C + tl.arange(0, C)[None, :]
    num, den = tree_sum_window_rows(tl.load(x_ptr + offsets), tl.load(y_ptr + offsets), W, C, LANE_BITS, WARP_BITS, REG_BITS)
    tl.store(num_ptr + tl.arange(0, C), num)
    tl.store(den_ptr + tl.arange(0, C), den)


def _order_sensitive(rng, shape) -> np.ndarray:
    """Values whose sum depends on the order of the adds (mixed magnitudes and signs)."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(F32)


def test_tree_sum_of_squares_is_the_spec_tree():
    rng = np.random.default_rng(4)
    for n in (2, 8, 512):
        x = _order_sensitive(rng, (16, n))
        out = torch.empty(16, dtype=torch.float32, device=DEVICE)
        _tree_1d_kernel[(16,)](torch.from_numpy(x).to(DEVICE), out, N=n, LOG2_N=n.bit_length() - 1, enable_fp_fusion=False)
        expected = arithmetic.tree(x, axis=1)
        assert np.array_equal(_bits(out.cpu().numpy()), _bits(expected)), f"n = {n}"
        sequential = np.add.accumulate(x, axis=1, dtype=F32)[:, -1]
        assert n == 2 or not np.array_equal(_bits(expected), _bits(sequential)), "the data must be order-sensitive"


PLANS = [RowPlan(0, 0, 3), RowPlan(3, 0, 0), RowPlan(1, 1, 1), RowPlan(2, 1, 0), RowPlan(0, 2, 1),
         RowPlan(1, 3, 3), RowPlan(3, 2, 2), RowPlan(5, 0, 2), RowPlan(0, 0, 7)]


def _window(plan: RowPlan) -> int:
    return 1 << (plan.lane_bits + plan.warp_bits + plan.reg_bits)


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"lane{p.lane_bits}_warp{p.warp_bits}_reg{p.reg_bits}")
def test_window_row_trees_are_the_spec_trees_for_every_plan(plan):
    window = _window(plan)
    channels = 4
    rng = np.random.default_rng(window + plan.lane_bits)
    x, y = _order_sensitive(rng, (window, channels)), _order_sensitive(rng, (window, channels))
    num = torch.empty(channels, dtype=torch.float32, device=DEVICE)
    den = torch.empty(channels, dtype=torch.float32, device=DEVICE)
    _window_tree_kernel[(1,)](torch.from_numpy(x).to(DEVICE), torch.from_numpy(y).to(DEVICE), num, den, W=window, C=channels,
                              LANE_BITS=plan.lane_bits, WARP_BITS=plan.warp_bits, REG_BITS=plan.reg_bits,
                              enable_fp_fusion=False)
    # num is the tree of y (u), den the tree of x (e): tree_sum_window_rows returns (tree(u), tree(e))
    assert np.array_equal(_bits(num.cpu().numpy()), _bits(arithmetic.tree(y, axis=0)))
    assert np.array_equal(_bits(den.cpu().numpy()), _bits(arithmetic.tree(x, axis=0)))


def test_window_row_permutation_is_a_bijection_and_matches_the_host_mirror():
    for window, block_c, num_warps in [(8, 512, 4), (8, 16, 4), (128, 64, 8), (128, 16, 1), (128, 32, 4), (128, 512, 4)]:
        plan = row_plan(window, block_c, num_warps)
        assert plan.lane_bits + plan.warp_bits + plan.reg_bits == window.bit_length() - 1
        rows = [plan.window_row(p) for p in range(window)]
        assert sorted(rows) == list(range(window))


def test_row_plan_follows_the_triton_default_layout():
    assert row_plan(8, 512, 4) == RowPlan(0, 0, 3)  # [8, 512]: every row in each thread's registers
    assert row_plan(128, 64, 8) == RowPlan(1, 3, 3)  # 16 lanes on channels, 2 on rows, 8 warps on rows
    assert row_plan(128, 16, 1) == RowPlan(3, 0, 4)
    assert row_plan(8, 512, 8) == RowPlan(0, 1, 2)  # 4 warps cover 512 channels, the other factor 2 goes to rows


def test_e2m1_encoder_matches_spec_on_a_dense_range_and_edges():
    rng = np.random.default_rng(4)
    step = 7  # every 7th binary32 in [2^-3, 8); the ties and boundaries themselves are added below
    first, last = int(np.array(0.125, F32).view(np.uint32)), int(np.array(8.0, F32).view(np.uint32))
    dense = np.arange(first, last, step, dtype=np.uint32)
    grid = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0], F32)
    around = np.concatenate([grid, np.nextafter(grid, F32(0)), np.nextafter(grid, F32(np.inf))])
    edges = np.array([0.0, 1e-45, 1e-38, 2.0**-126, 6.5, 1e30, 3.4e38], F32)
    randoms = rng.integers(0, 0x7F800000, 100_000, dtype=np.uint64).astype(np.uint32).view(F32)
    values = np.concatenate([dense.view(F32), around, edges, randoms]).astype(F32)
    values = np.concatenate([values, -values])
    got, _ = _run(4, values)
    expected = formats.e2m1_bits(values)
    bad = np.flatnonzero(got.astype(np.uint8) != expected)
    assert bad.size == 0, f"e2m1({values[bad[0]]!r}): triton {got[bad[0]]:#x}, spec {expected[bad[0]]:#x}"
    assert _run(4, np.array([-0.0, 0.0], F32))[0].tolist() == [0x8, 0x0]


def test_mxfp4_exponent_matches_spec_on_boundaries_and_random_amax():
    rng = np.random.default_rng(5)
    k = np.arange(-126, 126)  # 6 * 2^126 is beyond binary32
    boundaries = (6.0 * np.exp2(k.astype(np.float64))).astype(F32)  # 6 * 2^k exactly
    around = np.concatenate([np.nextafter(boundaries, F32(0)), np.nextafter(boundaries, F32(np.inf))])
    floor = np.array([0.0, 1.4e-45, 1e-40, 2.0**-126, 3.4e38], F32)
    random = rng.integers(0, 0x7F800000, 100_000, dtype=np.uint64).astype(np.uint32).view(F32)
    amax = np.concatenate([boundaries, around, floor, random]).astype(F32)
    amax = amax[np.isfinite(amax)]
    scale_byte, inv_scale = _run(5, amax)
    expected_k = formats.mxfp4_exponent(amax)
    assert np.array_equal(scale_byte, (expected_k + 127).astype(np.int32))
    assert np.array_equal(inv_scale.view(np.uint32), ((127 - expected_k).astype(np.uint32) << np.uint32(23)))
