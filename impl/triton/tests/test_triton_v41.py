"""DeepSeek-V4.1's operations (SPEC §14.7) in Triton against the NumPy spec, byte for byte over whole
allocations: the latent (rows of inactive tokens and row padding untouched), ratio 2's state and
the compressed cache (untouched entries and page padding included).

Under ``TRITON_INTERPRET=1`` on CPU (a few tokens per call); the ``gpu`` tests repeat the
comparison at engine-like sizes on a CUDA device. Steps come from ``spec.v41_batch``: paged
states, the reference's ring of 2, vLLM's ring, padding, tokens without a cache slot or a state
slot, decode, prefill chunks longer than the ring and verify steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dsv4_compressor import spec
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request

from v41_family_checks import (  # noqa: F401  (collected here, run on the Triton family)
    test_a_step_without_active_tokens_writes_only_the_saves, test_combined_call_bytes_identical_to_spec,
    test_combined_call_without_a_latent_writes_the_same_cache_and_no_latent, test_compress_norm_alone,
    test_entries_per_page, test_index_key_store, test_prefill_decode_run_on_the_reference_ring, test_ring_wraps_around_many_times, test_rope_quant_store_alone,
    test_saving_every_token_equals_the_spec_save_then_compress,
    test_verify_steps_with_a_boundary_inside_and_rejected_drafts,
)
from v41_scenarios import (
    EPS, RECORDS, assert_identical, build_case, combined, compress_norm, index_key_arguments, index_key_store,
    programs_in_reverse_order, rope_quant_store, run_both, run_steps,
)
from v41_scenarios import written as _written

INTERPRETER = not torch.cuda.is_available()
CANARY16 = B.CANARY_BYTE * 0x0101


@pytest.fixture
def v41_family() -> str:
    """The kernel family the shared checks (``v41_family_checks``) run on."""
    return "triton"


# ---- ratio 2's state: dtypes, addressing, inputs -----------------------------------------------------------------
STATES = {"paged4": V.paged(4), "paged2": V.paged(2), "reference_ring": V.reference_ring(), "vllm_ring": V.vllm_ring(3)}


INPUTS = ("fp32", "bf16", "kv_fp32_score_bf16")


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
@pytest.mark.parametrize("state", list(STATES))
def test_ratio2_state_options(state, bf16_state, inputs):
    """Paged (bs 4, 2), the reference's ring and vLLM's, fp32 or bf16 states and inputs (``kv`` and
    ``score`` may differ), chunks from an odd position longer than a ring of 2, tokens without a
    state slot (saved all the same)."""
    bf16_inputs = inputs == "bf16"
    case = build_case([Request(3, 1), Request(7, 1), Request(0, 4), Request(9, 5)], ratio=2,
                      seed=100 + 10 * list(STATES).index(state) + 3 * bf16_state + INPUTS.index(inputs), state=STATES[state], bf16_state=bf16_state,
                      bf16_inputs=bf16_inputs, bf16_score=bf16_inputs or inputs == "kv_fp32_score_bf16",
                      layout="v41_nvfp4", unslotted_fraction=0.15, bf16_weight=bf16_state)
    results = combined(case)
    _written(results)
    assert_identical(results)
    if INTERPRETER and STATES[state].ring_capacity is not None and inputs == "bf16":
        with programs_in_reverse_order():  # the bytes do not depend on the order programs run in
            assert_identical(combined(case))


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


@pytest.mark.parametrize("state, requests", [
    ("reference_ring", [Request(9, 2), Request(5, 7)]),  # C = 2: positions 10, 12 land on the slot of 8 and 4
    ("vllm_ring", [Request(5, 9), Request(1, 20)]),  # C = 8: position 12 on the slot of 4; 24 (the tail's) on 0's
])
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
def test_ring_chunks_longer_than_the_ring_save_after_the_compress_reads(state, requests, bf16_state):
    """A chunk from an odd position ``P0`` reads row ``P0 - 1`` from the ring, and its tail saves a
    token at ``P0 - 1 + k*C`` onto that very slot: the save must wait for the read (one launch:
    the first token's program saves that row after its compress)."""
    case = build_case(requests, ratio=2, seed=7, state=STATES[state], bf16_state=bf16_state, layout="bf16")
    assert _chunk_overwrites_a_row_it_reads(case)
    assert_identical(combined(case))
    assert_identical(compress_norm(case))
    if INTERPRETER:  # the interpreter runs programs in order: backwards, the saving token's program runs first
        with programs_in_reverse_order():
            assert_identical(combined(case))
            assert_identical(compress_norm(case))


def test_chunk_rows_are_read_from_the_inputs_not_the_state():
    """Every state row a window could read but the one before each chunk holds NaN: a kernel that
    read a chunk row from the state would write NaN-derived bytes (SPEC §13.4 step 1)."""
    case = build_case([Request(3, 4), Request(10, 6), Request(1, 1)], ratio=2, seed=9, state=V.paged(2), layout="v41_nvfp4")
    s, t = case.step, case.tables
    keep = np.zeros(case.state_cache.shape[:2], bool)
    for req in range(s.query_start_loc.size - 1):
        p = int(s.positions[s.query_start_loc[req]]) - 1
        keep[t.block_table[req, p // 2], p % 2] = True
    case.state_cache[~keep] = np.float32(np.nan)
    assert_identical(combined(case))


# ---- multi-step runs: decode, prefill and verify steps on one state --------------------------------------------
# ---- entries per page, padding, empty calls ----------------------------------------------------------------------


def test_an_empty_call_launches_nothing():
    from dsv4_compressor.impl import triton as T

    case = build_case([Request(3, 1)], ratio=1, seed=16, num_padding=0)
    empty = lambda a: a[:0]  # noqa: E731
    arguments = dict(kv=empty(case.kv), positions=empty(case.step.positions), kv_slot_mapping=empty(case.step.kv_slot_mapping),
                     latent=empty(case.latent), rms_norm_weight=case.weight, rms_norm_eps=EPS, cos_sin_cache=case.cos_sin,
                     k_cache=case.k_cache, compress_ratio=1, layout="v41_nvfp4", score=None, token_to_req=None,
                     query_start_loc=None, slot_mapping=None, save_slot_mapping=None, block_table=None, bs=None,
                     state_cache=None)
    results = run_both(spec.v41_compress_norm_rope_store, T.v41_compress_norm_rope_store, arguments, ("k_cache",))
    assert_identical(results)
    assert np.all(results["k_cache"][1] == B.CANARY_BYTE)


# ---- GPU: engine-like sizes ----------------------------------------------------------------------------------------
def _engine_requests(rng: np.random.Generator, ratio: int) -> list[Request]:
    decode = [Request(int(rng.integers(1, 4000)), 1) for _ in range(200)]
    verify = V.verify_requests([int(c) for c in rng.integers(1, 4000, size=24)], 3)
    prefill = [Request(0, 300), Request(int(rng.integers(1, 100)) * 2 + 1, 77)]
    return decode + verify + prefill


@pytest.mark.gpu
@pytest.mark.parametrize("layout", RECORDS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_gpu_engine_sized_batches(ratio, layout):
    rng = np.random.default_rng(ratio * 10 + RECORDS.index(layout))
    for state, bf16 in ((V.vllm_ring(3), True), (V.paged(8), False), (V.reference_ring(), True)):
        case = build_case(_engine_requests(rng, ratio), ratio=ratio, seed=int(rng.integers(1000)), state=state,
                          layout=layout, entries_per_page=64, page_pad_bytes=64, bf16_inputs=bf16, bf16_state=not bf16,
                          bf16_weight=bf16, num_padding=5, drop_entry_fraction=0.05, unslotted_fraction=0.02)
        assert_identical(combined(case))
        assert_identical(rope_quant_store(case))
        if ratio == 1:
            break


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_gpu_engine_sized_index_keys(ratio, layout):
    case = build_case(_engine_requests(np.random.default_rng(ratio), ratio), ratio=ratio, seed=3, layout=None,
                      entries_per_page=64)
    assert_identical(index_key_store(index_key_arguments(case, layout, k_pre_row_pad=8)))


@pytest.mark.gpu
def test_gpu_verify_run_on_vllms_ring():
    verify = V.verify_requests(list(range(1, 130, 2)), 3)
    after = V.after_verify(verify, [i % 4 for i in range(len(verify))])
    plan = [[(0, c) for c in range(1, 130, 2)], [(r.context_len, r.num_tokens) for r in verify], [(c, 4) for c in after]]
    run_steps(plan, V.vllm_ring(3), bf16_state=False, seed=21)
