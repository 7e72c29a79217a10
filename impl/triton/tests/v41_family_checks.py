"""DeepSeek-V4.1's checks both kernel families run (SPEC §14.7): each test takes the fixture
``v41_family`` (``"triton"`` or ``"cutedsl"``, defined by the test module that imports it) and
compares that family's bytes with the spec's over whole allocations.

``test_triton_v41.py`` runs them under ``TRITON_INTERPRET=1`` on CPU and on a GPU;
``impl/cutedsl/tests/test_cutedsl_v41_gpu.py`` runs them on a GPU. The checks a family needs
alone (Triton's program order, CuTe DSL's thread mappings) stay in its own module.
"""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor.impl.triton.tests.v41_scenarios import (
    MIXED, RECORDS, assert_identical, build_case, combined, compress_norm, index_key_arguments, index_key_store,
    rope_quant_store, run_steps, spec_copy, with_step, written,
)
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request


# ---- every record at both ratios, each operation alone ------------------------------------------------------
@pytest.mark.parametrize("layout, options", [
    ("flashmla_fp8", dict(entries_per_page=2, page_pad_bytes=32, bf16_weight=True)),
    ("bf16", dict(entries_per_page=1, input_row_pad=8, cos_sin_row_pad=8)),
    ("fp8_per_tensor", dict(entries_per_page=64, bf16_inputs=True, fp8_scale=0.037)),
    ("v41_mxfp8", dict(entries_per_page=2, page_pad_bytes=16, bf16_inputs=True, bf16_weight=True)),
    ("v41_nvfp4", dict(entries_per_page=3, page_pad_bytes=48, drop_entry_fraction=0.3, num_padding=3)),
])
@pytest.mark.parametrize("ratio", [1, 2])
def test_combined_call_bytes_identical_to_spec(ratio, layout, options, v41_family):
    case = build_case(MIXED, ratio=ratio, seed=10 * ratio + RECORDS.index(layout), layout=layout, **options)
    results = combined(case, family=v41_family)
    written(results)
    assert_identical(results)


@pytest.mark.parametrize("ratio", [1, 2])
def test_combined_call_without_a_latent_writes_the_same_cache_and_no_latent(ratio, v41_family):
    """``latent=None``: nothing is written there, and the cache and state are those of a call with a latent."""
    case = build_case(MIXED, ratio=ratio, seed=3, layout="v41_nvfp4", bf16_inputs=True)
    with_latent = combined(case, family=v41_family)
    without = combined(case, latent=False, family=v41_family)
    assert set(without) == ({"k_cache"} if ratio == 1 else {"k_cache", "state_cache"})
    assert_identical(without)
    for name, (_, family_bytes) in without.items():
        assert np.array_equal(family_bytes, with_latent[name][1])


@pytest.mark.parametrize("ratio", [1, 2])
def test_compress_norm_alone(ratio, v41_family):
    case = build_case(MIXED, ratio=ratio, seed=4, layout=None, state=V.vllm_ring(0), bf16_inputs=ratio == 1,
                      unslotted_fraction=0.2)
    results = compress_norm(case, family=v41_family)
    written(results)
    assert_identical(results)


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("layout", RECORDS)
def test_rope_quant_store_alone(ratio, layout, v41_family):
    """Every token with a cache slot at a boundary stores the record of its latent row (at ratio 2
    whatever its state slot), from a random bf16 latent with padded rows."""
    case = build_case([Request(3, 1), Request(5, 4), Request(0, 2)], ratio=ratio, seed=5, layout=layout,
                      entries_per_page=2, page_pad_bytes=16, drop_entry_fraction=0.2)
    results = rope_quant_store(case, family=v41_family)
    written(results)
    assert_identical(results)


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("layout, bf16_weight", [("indexer_fp8", True), ("indexer_mxfp4", False), ("indexer_mxfp4", True)])
def test_index_key_store(ratio, layout, bf16_weight, v41_family):
    """SPEC §14.6 into both of §12's records; ``k_pre``'s rows padded by an odd number of elements
    (its rows need no alignment)."""
    case = build_case(MIXED, ratio=ratio, seed=6, layout=None, drop_entry_fraction=0.2)
    arguments = index_key_arguments(case, layout, bf16_weight=bf16_weight, k_pre_row_pad=3)
    results = index_key_store(arguments, family=v41_family)
    written(results)
    assert_identical(results)


# ---- multi-step runs: decode, prefill and verify steps on one state ------------------------------------------
def test_prefill_decode_run_on_the_reference_ring(v41_family):
    """Prefill chunks (one from an odd position), then decode steps that read row ``p - 1`` from the ring of 2."""
    plan = [[(0, 5), (0, 3)], [(5, 4), (3, 1)], [(9, 1), (4, 1)], [(10, 1), (5, 6)]]
    run_steps(plan, V.reference_ring(), bf16_state=False, seed=12, family=v41_family)


@pytest.mark.parametrize("layout_state", [V.vllm_ring(3), V.paged(4)], ids=["vllm_ring", "paged4"])
def test_verify_steps_with_a_boundary_inside_and_rejected_drafts(layout_state, v41_family):
    """Verify groups of S + 1 = 4 tokens (two boundaries inside each), some drafts rejected: the next
    step starts after the accepted ones and overwrites the rows of the rejected."""
    verify = V.verify_requests([6, 9], 3)
    after = V.after_verify(verify, [2, 3])  # request 0 keeps 2 drafts (positions 8, 9 rejected), request 1 all 3
    assert after == [9, 13]  # odd: the next chunk reads row P0 - 1 from the state
    plan = [[(0, 6), (0, 9)], [(r.context_len, r.num_tokens) for r in verify], [(c, 4) for c in after],
            [(c + 4, 1) for c in after]]
    run_steps(plan, layout_state, bf16_state=True, seed=13, family=v41_family)


# ---- ratio 2's state: rings, saves, pages, steps without active tokens ---------------------------------------
def test_ring_wraps_around_many_times(v41_family):
    """Positions far past the ring's capacity (ring slot ``q mod C``), a decode on each side of a wrap."""
    requests = [Request(8 * 37 + 7, 1), Request(8 * 12 + 8, 3), Request(8 * 5 + 1, 10)]
    case = build_case(requests, ratio=2, seed=8, state=V.vllm_ring(0), layout="v41_mxfp8", bf16_state=True)
    assert_identical(combined(case, family=v41_family))


def test_saving_every_token_equals_the_spec_save_then_compress(v41_family):
    """``save_slot_mapping = slot_mapping`` (paged): every token is saved after the compress."""
    case = build_case([Request(0, 7), Request(5, 4), Request(30, 1)], ratio=2, seed=11, state=V.paged(4))
    assert_identical(combined(with_step(case, save_slot_mapping=case.step.slot_mapping.copy()), family=v41_family))


@pytest.mark.parametrize("entries_per_page", [1, 2, 64])
def test_entries_per_page(entries_per_page, v41_family):
    case = build_case(MIXED + [Request(40, 2)], ratio=2, seed=14, layout="v41_nvfp4", entries_per_page=entries_per_page,
                      page_pad_bytes=16 * (entries_per_page % 3))
    assert_identical(combined(case, family=v41_family))


def test_a_step_without_active_tokens_writes_only_the_saves(v41_family):
    """Even positions and padding: no latent row, no record; ratio 2 saves its rows."""
    case = build_case([Request(4, 1), Request(10, 1)], ratio=2, seed=15, num_padding=2)
    results = combined(case, family=v41_family)
    assert_identical(results)
    assert np.all(results["latent"][1] == B.CANARY_BYTE)
    assert np.all(results["k_cache"][1] == B.CANARY_BYTE)
    assert np.any(results["state_cache"][0] != spec_copy(case.state_cache)[0])
