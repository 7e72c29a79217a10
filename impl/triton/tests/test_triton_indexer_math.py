"""The indexer's Triton device functions against the NumPy spec: the E2M1 encoder over every
binary32 of a range and the edges, the MXFP4 exponent around every boundary, the Hadamard
butterflies bit for bit."""

import numpy as np
import torch
import triton
import triton.language as tl

from dsv4_compressor.impl.triton.exact_math import e2m1_code, mxfp4_scale
from dsv4_compressor.impl.triton.indexer_entry import hadamard_rotate
from dsv4_compressor.spec import formats
from dsv4_compressor.spec.indexer import hadamard_rotate as spec_hadamard_rotate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = np.float32
BLOCK = 4096


@triton.jit
def _elementwise_kernel(x_ptr, out_ptr, out2_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    if OP == 0:
        tl.store(out_ptr + offsets, e2m1_code(x).to(tl.int32, bitcast=True), mask=mask)
    else:
        scale_byte, inv_scale = mxfp4_scale(x.to(tl.int32, bitcast=True))
        tl.store(out_ptr + offsets, scale_byte, mask=mask)
        tl.store(out2_ptr + offsets, inv_scale, mask=mask)


def _run(op: int, values: np.ndarray):
    x = torch.from_numpy(np.ascontiguousarray(values, dtype=F32)).to(DEVICE)
    out = torch.empty(x.shape, dtype=torch.int32, device=DEVICE)
    out2 = torch.empty(x.shape, dtype=torch.float32, device=DEVICE)
    _elementwise_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, out2, x.numel(), OP=op, BLOCK=BLOCK, enable_fp_fusion=False)
    return out.cpu().numpy(), out2.cpu().numpy()


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
    got, _ = _run(0, values)
    expected = formats.e2m1_bits(values)
    bad = np.flatnonzero(got.astype(np.uint8) != expected)
    assert bad.size == 0, f"e2m1({values[bad[0]]!r}): triton {got[bad[0]]:#x}, spec {expected[bad[0]]:#x}"
    assert _run(0, np.array([-0.0, 0.0], F32))[0].tolist() == [0x8, 0x0]


def test_mxfp4_exponent_matches_spec_on_boundaries_and_random_amax():
    rng = np.random.default_rng(5)
    k = np.arange(-126, 126)  # 6 * 2^126 is beyond binary32
    boundaries = (6.0 * np.exp2(k.astype(np.float64))).astype(F32)  # 6 * 2^k exactly
    around = np.concatenate([np.nextafter(boundaries, F32(0)), np.nextafter(boundaries, F32(np.inf))])
    floor = np.array([0.0, 1.4e-45, 1e-40, 2.0**-126, 3.4e38], F32)
    random = rng.integers(0, 0x7F800000, 100_000, dtype=np.uint64).astype(np.uint32).view(F32)
    amax = np.concatenate([boundaries, around, floor, random]).astype(F32)
    amax = amax[np.isfinite(amax)]
    scale_byte, inv_scale = _run(1, amax)
    expected_k = formats.mxfp4_exponent(amax)
    assert np.array_equal(scale_byte, (expected_k + 127).astype(np.int32))
    assert np.array_equal(inv_scale.view(np.uint32), ((127 - expected_k).astype(np.uint32) << np.uint32(23)))


@triton.jit
def _hadamard_kernel(z_ptr, out_ptr):
    rows = tl.program_id(0) * 128 + tl.arange(0, 4)[:, None] * 32 + tl.arange(0, 32)[None, :]
    tl.store(out_ptr + rows, hadamard_rotate(tl.load(z_ptr + rows)))


def test_hadamard_butterflies_are_the_spec_bit_for_bit():
    rng = np.random.default_rng(6)
    z = (rng.standard_normal((64, 128)) * np.exp2(rng.integers(-20, 20, (64, 1)))).astype(F32)
    z[0] = np.where(rng.random(128) < 0.5, F32(-0.0), F32(0.0))  # signed zeros: -0 + -0 stays -0
    z[1] = np.eye(128, dtype=F32)[5]
    x = torch.from_numpy(z).to(DEVICE)
    out = torch.empty_like(x)
    _hadamard_kernel[(z.shape[0],)](x, out, enable_fp_fusion=False)
    assert np.array_equal(out.cpu().numpy().view(np.uint32), spec_hadamard_rotate(z).view(np.uint32))
