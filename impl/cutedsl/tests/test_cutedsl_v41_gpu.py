"""DeepSeek-V4.1's operations (SPEC §14.7) in CuTe DSL against the NumPy spec, byte for byte over
whole allocations, on a CUDA GPU: the latent (rows of inactive tokens and row padding untouched),
ratio 2's state and the compressed cache (untouched entries and page padding included).

The steps are the Triton family's V4.1 scenarios (``impl/triton/tests/v41_scenarios.py``, from
``spec.v41_batch``): every record at both ratios, paged states, the reference's ring of 2,
vLLM's ring, fp32 and bf16 inputs and states, padding, tokens without a cache slot or a state
slot, decode, prefill chunks longer than the ring (whose tail saves onto the row the chunk's
first token reads), verify steps over several steps, and engine-sized batches; plus this
family's own options (thread mappings, PDL off). Each buffer is built once in NumPy; the spec
runs on one copy, the kernels on a CUDA twin of another with the same allocation layout.
"""

from __future__ import annotations

import os
from functools import partial

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor import spec  # noqa: E402
from dsv4_compressor.impl.triton.tests import v41_scenarios as S  # noqa: E402
from dsv4_compressor.impl.triton.tests.v41_family_checks import *  # noqa: E402,F401,F403  (the shared checks, run on CuTe DSL)
from dsv4_compressor.impl.triton.tests.v41_family_checks import RING_CHUNKS, ring_chunk_case  # noqa: E402
from dsv4_compressor.impl.triton.tests.v41_scenarios import (  # noqa: E402
    MIXED, assert_identical, build_case, index_key_arguments, run_both,
)
from dsv4_compressor.spec.batch import Request  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def v41_family() -> str:
    """The kernel family the shared checks (``v41_family_checks``) run on."""
    return "cutedsl"


def _cutedsl():
    from dsv4_compressor.impl import cutedsl

    return cutedsl


# the four operations, spec against CuTe DSL (``options``: this family's keywords, ``shapes``, ``pdl``)
combined = partial(S.combined, family="cutedsl")
compress_norm = partial(S.compress_norm, family="cutedsl")
rope_quant_store = partial(S.rope_quant_store, family="cutedsl")
index_key_store = partial(S.index_key_store, family="cutedsl")


# ---- this family alone: CTAs in any order ------------------------------------------------------------------
@pytest.mark.parametrize("state, requests", RING_CHUNKS)
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
def test_ring_chunks_longer_than_the_ring_save_after_the_compress_reads(state, requests, bf16_state):
    """A chunk from an odd position reads row ``P0 - 1`` from the ring while a token of its tail
    saves onto that slot: the first token's group saves that row after its compress. Repeated:
    CTAs run in any order."""
    case = ring_chunk_case(state, requests, bf16_state)
    for _ in range(3):
        assert_identical(combined(case))
        assert_identical(compress_norm(case))


# ---- pages, padding, empty calls, this family's options ----------------------------------------------------
@pytest.mark.parametrize("options", [
    dict(pdl=False),
    dict(shapes_compress=2), dict(shapes_compress=4), dict(shapes_store=4), dict(shapes_index_key=1),
    dict(shapes_index_key=8), dict(shapes_bound=None),
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("ratio", [1, 2])
def test_thread_mappings_and_pdl_keep_the_bytes(ratio, options):
    """Other tokens per CTA (a partial last CTA included), no launch bound and ``pdl=False`` write the
    spec's bytes."""
    from dsv4_compressor.impl.cutedsl import V41Shapes

    options = dict(options)
    shapes = V41Shapes(compress_tokens_per_cta=options.pop("shapes_compress", 1),
                       ratio2_ctas_per_sm=options.pop("shapes_bound", 10),
                       store_tokens_per_cta=options.pop("shapes_store", 1),
                       index_key_warps=options.pop("shapes_index_key", 4))
    case = build_case(MIXED + [Request(20, 2)], ratio=ratio, seed=16 + ratio, layout="v41_mxfp8", num_padding=2)
    assert_identical(combined(case, shapes=shapes, **options))
    assert_identical(rope_quant_store(case, shapes=shapes, **options))
    assert_identical(index_key_store(index_key_arguments(case, "indexer_mxfp4", k_pre_row_pad=1), shapes=shapes,
                                     **options))


def test_the_custom_ops_write_the_functions_bytes():
    case = build_case(MIXED, ratio=2, seed=17, layout="v41_nvfp4", bf16_inputs=True)
    arguments = case.compress_arguments(case.latent)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=case.layout, fp8_scale=None)
    results = run_both(spec.v41_compress_norm_rope_store,
                       lambda **a: torch.ops.dsv4_compressor.cutedsl_v41_compress_norm_rope_store(**a), arguments,
                       ("latent", "state_cache", "k_cache"))
    assert_identical(results)
