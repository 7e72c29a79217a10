"""The indexer's Hadamard rotation in Triton against the NumPy spec, bit for bit (its E2M1 encoder
and MXFP4 exponent are :mod:`exact_math`'s, tested with the others)."""

import numpy as np
import torch
import triton
import triton.language as tl

from dsv4_compressor.impl.triton.indexer_entry import hadamard_rotate
from dsv4_compressor.spec.indexer import hadamard_rotate as spec_hadamard_rotate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = np.float32


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
