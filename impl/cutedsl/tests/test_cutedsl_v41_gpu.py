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

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor import spec  # noqa: E402
from dsv4_compressor.impl.triton.tests import v41_scenarios as S  # noqa: E402
from dsv4_compressor.impl.triton.tests.v41_family_checks import (  # noqa: E402,F401  (collected here, run on CuTe DSL)
    test_a_step_without_active_tokens_writes_only_the_saves, test_combined_call_bytes_identical_to_spec,
    test_combined_call_without_a_latent_writes_the_same_cache_and_no_latent, test_compress_norm_alone,
    test_entries_per_page, test_index_key_store, test_prefill_decode_run_on_the_reference_ring, test_ring_wraps_around_many_times, test_rope_quant_store_alone,
    test_saving_every_token_equals_the_spec_save_then_compress,
    test_verify_steps_with_a_boundary_inside_and_rejected_drafts,
)
from dsv4_compressor.impl.triton.tests.v41_scenarios import (  # noqa: E402
    MIXED, RECORDS, assert_identical, build_case, index_key_arguments, run_both,
)
from dsv4_compressor.spec import v41_batch as V  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402

pytestmark = pytest.mark.gpu

STATES = {"paged4": V.paged(4), "paged2": V.paged(2), "reference_ring": V.reference_ring(), "vllm_ring": V.vllm_ring(3)}
INPUTS = ("fp32", "bf16", "kv_fp32_score_bf16")


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
run_steps = partial(S.run_steps, family="cutedsl")
_written = S.written


# ---- ratio 2's state: dtypes, addressing, inputs, the save after the compress ------------------------------
@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
@pytest.mark.parametrize("state", list(STATES))
def test_ratio2_state_options(state, bf16_state, inputs):
    bf16_inputs = inputs == "bf16"
    case = build_case([Request(3, 1), Request(7, 1), Request(0, 4), Request(9, 5)], ratio=2,
                      seed=100 + 10 * list(STATES).index(state) + 3 * bf16_state + INPUTS.index(inputs),
                      state=STATES[state], bf16_state=bf16_state, bf16_inputs=bf16_inputs,
                      bf16_score=bf16_inputs or inputs == "kv_fp32_score_bf16", layout="v41_nvfp4",
                      unslotted_fraction=0.15, bf16_weight=bf16_state)
    results = combined(case)
    _written(results)
    assert_identical(results)


@pytest.mark.parametrize("state, requests", [
    ("reference_ring", [Request(9, 2), Request(5, 7)]),  # C = 2: positions 10, 12 land on the slot of 8 and 4
    ("vllm_ring", [Request(5, 9), Request(1, 20)]),  # C = 8: position 12 on the slot of 4; 24 (the tail's) on 0's
])
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
def test_ring_chunks_longer_than_the_ring_save_after_the_compress_reads(state, requests, bf16_state):
    """A chunk from an odd position reads row ``P0 - 1`` from the ring while a token of its tail
    saves onto that slot: the first token's group saves that row after its compress. Repeated:
    CTAs run in any order."""
    case = build_case(requests, ratio=2, seed=7, state=STATES[state], bf16_state=bf16_state, layout="bf16")
    for _ in range(3):
        assert_identical(combined(case))
        assert_identical(compress_norm(case))


def test_chunk_rows_are_read_from_the_inputs_not_the_state():
    """Every state row but the one before each chunk holds NaN (SPEC §13.4 step 1)."""
    case = build_case([Request(3, 4), Request(10, 6), Request(1, 1)], ratio=2, seed=9, state=V.paged(2),
                      layout="v41_nvfp4")
    s, t = case.step, case.tables
    keep = np.zeros(case.state_cache.shape[:2], bool)
    for req in range(s.query_start_loc.size - 1):
        p = int(s.positions[s.query_start_loc[req]]) - 1
        keep[t.block_table[req, p // 2], p % 2] = True
    case.state_cache[~keep] = np.float32(np.nan)
    assert_identical(combined(case))


# ---- multi-step runs -----------------------------------------------------------------------------------------
def test_verify_run_on_vllms_ring():
    verify = V.verify_requests(list(range(1, 130, 2)), 3)
    after = V.after_verify(verify, [i % 4 for i in range(len(verify))])
    plan = [[(0, c) for c in range(1, 130, 2)], [(r.context_len, r.num_tokens) for r in verify], [(c, 4) for c in after]]
    run_steps(plan, V.vllm_ring(3), bf16_state=False, seed=21)


# ---- pages, padding, empty calls, this family's options ----------------------------------------------------


@pytest.mark.parametrize("options", [
    dict(pdl=False),
    dict(shapes_compress=2), dict(shapes_compress=4), dict(shapes_store=4), dict(shapes_index_key=1),
    dict(shapes_index_key=8),
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("ratio", [1, 2])
def test_thread_mappings_and_pdl_keep_the_bytes(ratio, options):
    """Other tokens per CTA (a partial last CTA included) and ``pdl=False`` write the spec's bytes."""
    from dsv4_compressor.impl.cutedsl import V41Shapes

    options = dict(options)
    shapes = V41Shapes(compress_tokens_per_cta=options.pop("shapes_compress", 1),
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


# ---- engine-like sizes -------------------------------------------------------------------------------------------
def _engine_requests(rng: np.random.Generator) -> list[Request]:
    decode = [Request(int(rng.integers(1, 4000)), 1) for _ in range(200)]
    verify = V.verify_requests([int(c) for c in rng.integers(1, 4000, size=24)], 3)
    prefill = [Request(0, 300), Request(int(rng.integers(1, 100)) * 2 + 1, 77)]
    return decode + verify + prefill


@pytest.mark.parametrize("layout", RECORDS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_engine_sized_batches(ratio, layout):
    rng = np.random.default_rng(ratio * 10 + RECORDS.index(layout))
    for state, bf16 in ((V.vllm_ring(3), True), (V.paged(8), False), (V.reference_ring(), True)):
        case = build_case(_engine_requests(rng), ratio=ratio, seed=int(rng.integers(1000)), state=state,
                          layout=layout, entries_per_page=64, page_pad_bytes=64, bf16_inputs=bf16, bf16_state=not bf16,
                          bf16_weight=bf16, num_padding=5, drop_entry_fraction=0.05, unslotted_fraction=0.02)
        assert_identical(combined(case))
        assert_identical(rope_quant_store(case))
        if ratio == 1:
            break


@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_engine_sized_index_keys(ratio, layout):
    case = build_case(_engine_requests(np.random.default_rng(ratio)), ratio=ratio, seed=3, layout=None,
                      entries_per_page=64)
    assert_identical(index_key_store(index_key_arguments(case, layout, k_pre_row_pad=8)))
