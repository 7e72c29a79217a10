"""GPU checks of the indexer compressor's CuTe DSL kernels (SPEC §12): byte-identical to the spec.

Every case is a conformance step at head width 128 (:mod:`cutedsl_steps`: vLLM-style batches
with shuffled block tables, scattered padding tokens, non-boundary and dropped tokens, the
``p = 3`` window with invalid rows, padded state rows and blocks, canary-filled caches with
padded pages, a value profile of the suite), run by the spec and by the kernels on CUDA
copies of the same allocations; every comparison covers a whole allocation, so a stray write
shows as a changed canary and an inactive token's write as a changed entry. The MXFP4
encoders (E2M1 code, scale byte, ``2^-k``) are also checked element by element against the
spec's. CUDA graphs, PDL chains, bound layers and the torch custom ops take these cases in the
files that test them for the 512-wide layouts (``test_cutedsl_graphs_gpu``, ``test_cutedsl_host_gpu``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from cutedsl_steps import (INDEXER_C4_CASES, INDEXER_C128_CASES, INDEXER_FP8, Case, DeviceStep,  # noqa: E402
                           assert_bytes, case_id, run_step)

pytestmark = pytest.mark.gpu

F32 = np.float32
def _store_matches_spec(case: Case, **choices):
    """:func:`cutedsl_steps.run_step` (the save, then the store on the spec's post-save state;
    both allocations compared whole) on a batch with active and inactive tokens."""
    step, _ = run_step(case, **choices)
    assert step.batch.num_active > 0 and (~step.batch.active).any()


@pytest.mark.parametrize("case", INDEXER_C4_CASES + INDEXER_C128_CASES, ids=case_id)
def test_indexer_matches_spec(case):
    _store_matches_spec(case)


@pytest.mark.parametrize("choices, case", [
    (dict(indexer_c4_warps=1), INDEXER_C4_CASES[1]),
    (dict(indexer_c4_warps=2), INDEXER_C4_CASES[3]),
    (dict(indexer_c4_warps=8), INDEXER_C4_CASES[5]),  # a partial last CTA
    (dict(indexer_c4_warps=8), INDEXER_C4_CASES[10]),
    (dict(indexer_c128_warps=8), INDEXER_C128_CASES[0]),
    (dict(indexer_c128_warps=8), INDEXER_C128_CASES[2]),
    (dict(pdl=False), INDEXER_C4_CASES[0]),
    (dict(pdl=False), INDEXER_C128_CASES[1]),
], ids=lambda v: "-".join(f"{k}={w}" for k, w in v.items()) if isinstance(v, dict) else case_id(v))
def test_indexer_mapping_knobs_keep_the_bytes(choices, case):
    """Other mappings (a frozen policy's indexer shapes) and ``pdl=False`` write the same bytes."""
    from dsv4_compressor.impl import cutedsl

    choices = dict(choices)
    pdl = choices.pop("pdl", True)
    _store_matches_spec(case, pdl=pdl, policy=cutedsl.DEFAULT_POLICY.with_overrides(**choices))


def _argument_bytes(args: dict) -> dict:
    """Host bytes of every tensor argument (whole, contiguous tensors)."""
    torch.cuda.synchronize()
    return {k: v.contiguous().view(torch.uint8).cpu().numpy().copy() for k, v in args.items()
            if isinstance(v, torch.Tensor)}


def test_indexer_bad_arguments_write_nothing():
    """Bad calls raise ValueError naming the argument, and no byte of any buffer changes."""
    from dsv4_compressor.impl import cutedsl

    case = INDEXER_C4_CASES[0]
    step = DeviceStep(case.inputs())
    args = step.compress_args()
    state_before, k_before, before = step.state_bytes(), step.k_bytes(), _argument_bytes(args)
    bad_calls = [
        (dict(layout="flashmla_fp8"), {}, "layout"),  # a 512-wide layout on the 128-wide state
        (dict(layout="indexer_mxfp4"), {}, "k_cache"),  # 132-byte entries given for a 68-byte layout
        (dict(hadamard=1), {}, "hadamard"),
        (dict(fp8_scale=1.0), {}, "fp8_scale"),
        (dict(c128_path="cluster"), {}, "c128_path"),
        ({}, dict(rms_norm_weight=args["rms_norm_weight"][:64]), "rms_norm_weight"),
        ({}, dict(positions=args["positions"].int()), "positions"),
        ({}, dict(kv_slot_mapping=args["kv_slot_mapping"][:-1]), "kv_slot_mapping"),
        ({}, dict(rms_norm_eps=0.0), "rms_norm_eps"),
    ]
    for kwargs, changed, needle in bad_calls:
        call = {**args, **changed}
        keywords = {"compress_ratio": 4, "layout": case.layout, **kwargs}
        with pytest.raises(ValueError, match=needle):
            cutedsl.compress_norm_rope_store(**call, **keywords)
    with pytest.raises(ValueError, match="hadamard"):
        cutedsl.compress_norm_rope_store(**args, compress_ratio=4, layout="indexer_fp8", hadamard="yes")
    assert_bytes("bad calls: state", step.inputs, "state", step.state_bytes(), state_before)
    assert_bytes("bad calls: k_cache", step.inputs, "k_cache", step.k_bytes(), k_before)
    for key, value in _argument_bytes(args).items():
        assert np.array_equal(value, before[key]), f"bad calls: {key} changed"


def test_indexer_empty_call_writes_nothing():
    from dsv4_compressor.impl import cutedsl

    case = INDEXER_C4_CASES[0]
    step = DeviceStep(case.inputs())
    args = step.compress_args()
    for key in ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping"):
        args[key] = args[key][:0]
    before = step.k_bytes()
    cutedsl.compress_norm_rope_store(**args, compress_ratio=4, layout=case.layout)
    assert_bytes("T = 0", step.inputs, "k_cache", step.k_bytes(), before)


# ---- the MXFP4 device encoders, element by element ---------------------------------------------
def _compile_mxfp4_encoders():
    """A CuTe kernel: element ``i`` of fp32 ``x [n]`` gives ``code[i] = e2m1_code(x[i])``,
    ``byte[i] = e2m1_scale_byte(|x[i]|)`` (int32 ``[n]`` each) and ``inv[i] = pow2_neg_k(byte[i])``
    (fp32 ``[n]``), compiled for TVM-FFI (torch tensors, the current stream)."""
    from cutlass import Float32, Int32

    from dsv4_compressor.impl.cutedsl.host import compile_cache
    from dsv4_compressor.impl.cutedsl.stages.exact_math import e2m1_code, e2m1_scale_byte, pow2_neg_k

    threads = 128

    class Mxfp4Encoders:
        @cute.jit
        def __call__(self, mX: cute.Tensor, mCode: cute.Tensor, mByte: cute.Tensor, mInv: cute.Tensor,
                     stream: cuda.CUstream):
            n = mX.shape[0]
            self.kernel(mX, mCode, mByte, mInv).launch(grid=((n + threads - 1) // threads, 1, 1),
                                                       block=(threads, 1, 1), stream=stream)

        @cute.kernel
        def kernel(self, mX: cute.Tensor, mCode: cute.Tensor, mByte: cute.Tensor, mInv: cute.Tensor):
            tidx, _, _ = cute.arch.thread_idx()
            cta, _, _ = cute.arch.block_idx()
            i = cta * threads + tidx
            if i < mX.shape[0]:
                x = mX[i]
                byte = e2m1_scale_byte(cute.math.absf(x))
                mCode[i] = e2m1_code(x).to(Int32)
                mByte[i] = byte.to(Int32)
                mInv[i] = pow2_neg_k(byte)

    def build():
        n = cute.sym_int()
        fake = [cute.runtime.make_fake_compact_tensor(dtype, (n,), assumed_align=4)
                for dtype in (Float32, Int32, Int32, Float32)]
        return cute.compile(Mxfp4Encoders(), *fake, compile_cache.fake_stream(), options=compile_cache._options(False))

    return compile_cache.cached(("test", "mxfp4_encoders"), build)


def test_mxfp4_encoders_match_spec_element_by_element():
    """``e2m1_code`` on every grid value, midpoint and their neighbours, a dense range, signed
    zeros and random binary32 (beyond 6 included: saturation); ``e2m1_scale_byte`` and
    ``pow2_neg_k`` around every ``6 * 2^k`` and at the floor: SPEC §12's ``e2m1`` and ``k``."""
    from dsv4_compressor.spec import formats

    rng = np.random.default_rng(21)
    first, last = (int(np.array(v, F32).view(np.uint32)) for v in (0.125, 8.0))
    dense = np.arange(first, last, 7, dtype=np.uint32).view(F32)
    grid = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0], F32)
    boundaries = (6.0 * np.exp2(np.arange(-126, 126, dtype=np.float64))).astype(F32)  # 6 * 2^k, exact
    marks = np.concatenate([grid, boundaries])
    near = np.concatenate([marks, np.nextafter(marks, F32(0)), np.nextafter(marks, F32(np.inf))])
    edges = np.array([1e-45, 1e-40, 2.0**-126, 6 * 2.0**-126, 3.4028235e38], F32)
    randoms = rng.integers(0, 0x7F800000, 100_000, dtype=np.uint64).astype(np.uint32).view(F32)
    values = np.concatenate([dense, near, edges, randoms]).astype(F32)
    values = np.concatenate([values, -values])  # -0.0 included
    x = torch.from_numpy(values).cuda()
    code, byte = (torch.empty(x.shape, dtype=torch.int32, device="cuda") for _ in range(2))
    inv = torch.empty_like(x)
    _compile_mxfp4_encoders()(x, code, byte, inv)
    torch.cuda.synchronize()
    code, byte, inv = code.cpu().numpy(), byte.cpu().numpy(), inv.cpu().numpy()

    expected_code = formats.e2m1_bits(values).astype(np.int32)
    bad = np.flatnonzero(code != expected_code)
    assert bad.size == 0, f"e2m1({values[bad[0]]!r}): cutedsl {code[bad[0]]:#x}, spec {expected_code[bad[0]]:#x}"
    minus_zero = values.view(np.uint32) == np.uint32(0x80000000)
    assert minus_zero.any() and (code[minus_zero] == 0x8).all()  # -0 keeps its sign
    k = formats.mxfp4_exponent(np.abs(values))
    bad = np.flatnonzero(byte != k + 127)
    assert bad.size == 0, f"scale byte of {abs(values[bad[0]])!r}: cutedsl {byte[bad[0]]}, spec {k[bad[0]] + 127}"
    assert np.array_equal(inv.view(np.uint32), (127 - k).astype(np.uint32) << np.uint32(23))


# ---- save_partial_states at the indexer's state widths ------------------------------------------------
@pytest.mark.parametrize("ratio, block_size, misaligned", [(4, 16, False), (128, 8, False), (4, 3, True), (128, 5, True)])
def test_indexer_save_partial_states_matches_spec(ratio, block_size, misaligned):
    """The save kernel at the indexer's state widths (512 and 256 floats a row): the spec's
    bytes in a padded state cache, padding untouched, some tokens unsaved; ``misaligned``:
    every input a view whose base and rows are not 16-byte aligned (the scalar-load variant)."""
    run_step(Case(ratio, block_size, 4, INDEXER_FP8, unsaved_fraction=0.1, row_pad=8, block_pad_rows=2,
                  strided_inputs=misaligned))
