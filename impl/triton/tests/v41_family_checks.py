"""DeepSeek-V4.1's checks both kernel families run (SPEC §14.7): each test takes the fixture
``v41_family`` (``"triton"`` or ``"cutedsl"``, defined by the test module that imports them all
with ``import *``) and compares that family's bytes with the spec's over whole allocations.

``test_triton_v41.py`` runs them under ``TRITON_INTERPRET=1`` on CPU and on a GPU (those marked
``gpu`` on a GPU only); ``impl/cutedsl/tests/test_cutedsl_v41_gpu.py`` runs them on a GPU. The
checks a family needs alone (Triton's program order, CuTe DSL's thread mappings and repeated
launches) stay in its own module, on the steps built here (:func:`ratio2_case`,
:func:`ring_chunk_case`).
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


# ---- ratio 2's state: dtypes, addressing, inputs, the save after the compress ----------------------------------
STATES = {"paged4": V.paged(4), "paged2": V.paged(2), "reference_ring": V.reference_ring(), "vllm_ring": V.vllm_ring(3)}
INPUTS = ("fp32", "bf16", "kv_fp32_score_bf16")


def ratio2_case(state: str, bf16_state: bool, inputs: str):
    """The step of :func:`test_ratio2_state_options` in the state ``STATES[state]`` with ``INPUTS`` ``inputs``."""
    bf16_inputs = inputs == "bf16"
    return build_case([Request(3, 1), Request(7, 1), Request(0, 4), Request(9, 5)], ratio=2,
                      seed=100 + 10 * list(STATES).index(state) + 3 * bf16_state + INPUTS.index(inputs),
                      state=STATES[state], bf16_state=bf16_state, bf16_inputs=bf16_inputs,
                      bf16_score=bf16_inputs or inputs == "kv_fp32_score_bf16", layout="v41_nvfp4",
                      unslotted_fraction=0.15, bf16_weight=bf16_state)


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
@pytest.mark.parametrize("state", list(STATES))
def test_ratio2_state_options(state, bf16_state, inputs, v41_family):
    """Paged (bs 4, 2), the reference's ring and vLLM's, fp32 or bf16 states and inputs (``kv`` and
    ``score`` may differ), chunks from an odd position longer than a ring of 2, tokens without a
    state slot (saved all the same)."""
    results = combined(ratio2_case(state, bf16_state, inputs), family=v41_family)
    written(results)
    assert_identical(results)


def _chunk_overwrites_a_row_it_reads(case) -> bool:
    """Whether a saved token's slot is the state slot the chunk's first token reads (SPEC §13.4: the
    save must come after that read)."""
    s, t = case.step, case.tables
    for req in range(s.query_start_loc.size - 1):
        first, end = int(s.query_start_loc[req]), int(s.query_start_loc[req + 1])
        p0 = int(s.positions[first])
        if end - first < 2 or p0 % 2 == 0 or s.kv_slot_mapping[first] < 0 or s.slot_mapping[first] < 0:
            continue
        index = (p0 - 1) % t.state.ring_capacity if t.state.ring_capacity else p0 - 1
        read = int(t.block_table[req, index // t.state.block_size]) * t.state.block_size + index % t.state.block_size
        if np.any(s.save_slot_mapping[first + 1:end] == read):
            return True
    return False


RING_CHUNKS = [  # (state, requests) of the chunks longer than the ring
    ("reference_ring", [Request(9, 2), Request(5, 7)]),  # C = 2: positions 10, 12 land on the slot of 8 and 4
    ("vllm_ring", [Request(5, 9), Request(1, 20)]),  # C = 8: position 12 on the slot of 4; 24 (the tail's) on 0's
]


def ring_chunk_case(state: str, requests: list[Request], bf16_state: bool):
    """A step whose chunk from an odd position ``P0`` reads row ``P0 - 1`` from the ring while its
    tail saves a token at ``P0 - 1 + k*C`` onto that very slot (the save must wait for the read)."""
    case = build_case(requests, ratio=2, seed=7, state=STATES[state], bf16_state=bf16_state, layout="bf16")
    assert _chunk_overwrites_a_row_it_reads(case)
    return case


def test_chunk_rows_are_read_from_the_inputs_not_the_state(v41_family):
    """Every state row a window could read but the one before each chunk holds NaN: a kernel that
    read a chunk row from the state would write NaN-derived bytes (SPEC §13.4 step 1)."""
    case = build_case([Request(3, 4), Request(10, 6), Request(1, 1)], ratio=2, seed=9, state=V.paged(2), layout="v41_nvfp4")
    s, t = case.step, case.tables
    keep = np.zeros(case.state_cache.shape[:2], bool)
    for req in range(s.query_start_loc.size - 1):
        p = int(s.positions[s.query_start_loc[req]]) - 1
        keep[t.block_table[req, p // 2], p % 2] = True
    case.state_cache[~keep] = np.float32(np.nan)
    assert_identical(combined(case, family=v41_family))


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


# ---- GPU: engine-like sizes ------------------------------------------------------------------------------------
def _engine_requests(rng: np.random.Generator) -> list[Request]:
    decode = [Request(int(rng.integers(1, 4000)), 1) for _ in range(200)]
    verify = V.verify_requests([int(c) for c in rng.integers(1, 4000, size=24)], 3)
    prefill = [Request(0, 300), Request(int(rng.integers(1, 100)) * 2 + 1, 77)]
    return decode + verify + prefill


@pytest.mark.gpu
@pytest.mark.parametrize("layout", RECORDS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_engine_sized_batches(ratio, layout, v41_family):
    rng = np.random.default_rng(ratio * 10 + RECORDS.index(layout))
    for state, bf16 in ((V.vllm_ring(3), True), (V.paged(8), False), (V.reference_ring(), True)):
        case = build_case(_engine_requests(rng), ratio=ratio, seed=int(rng.integers(1000)), state=state,
                          layout=layout, entries_per_page=64, page_pad_bytes=64, bf16_inputs=bf16, bf16_state=not bf16,
                          bf16_weight=bf16, num_padding=5, drop_entry_fraction=0.05, unslotted_fraction=0.02)
        assert_identical(combined(case, family=v41_family))
        assert_identical(rope_quant_store(case, family=v41_family))
        if ratio == 1:
            break


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_engine_sized_index_keys(ratio, layout, v41_family):
    case = build_case(_engine_requests(np.random.default_rng(ratio)), ratio=ratio, seed=3, layout=None,
                      entries_per_page=64)
    assert_identical(index_key_store(index_key_arguments(case, layout, k_pre_row_pad=8), family=v41_family))


@pytest.mark.gpu
def test_verify_run_on_vllms_ring(v41_family):
    verify = V.verify_requests(list(range(1, 130, 2)), 3)
    after = V.after_verify(verify, [i % 4 for i in range(len(verify))])
    plan = [[(0, c) for c in range(1, 130, 2)], [(r.context_len, r.num_tokens) for r in verify], [(c, 4) for c in after]]
    run_steps(plan, V.vllm_ring(3), bf16_state=False, seed=21, family=v41_family)


# What a family's test module collects with ``from v41_family_checks import *``: every check above.
__all__ = [name for name in dict(globals()) if name.startswith("test_")]
