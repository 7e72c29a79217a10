"""DeepSeek-V4.1's operations (SPEC §14.7) in Triton against the NumPy spec, byte for byte over whole
allocations: the latent (rows of inactive tokens and row padding untouched), ratio 2's state and
the compressed cache (untouched entries and page padding included).

Under ``TRITON_INTERPRET=1`` on CPU (a few tokens per call); the ``gpu`` tests repeat the
comparison at engine-like sizes on a CUDA device. The checks both families run are
``v41_family_checks``'s; this module adds the interpreter's reversed program order. Steps come from ``spec.v41_batch``: paged
states, the reference's ring of 2, vLLM's ring, padding, tokens without a cache slot or a state
slot, decode, prefill chunks longer than the ring and verify steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dsv4_compressor import spec
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec.batch import Request

from v41_family_checks import *  # noqa: F401,F403  (the shared checks, collected here, run on the Triton family)
from v41_family_checks import RING_CHUNKS, ratio2_case, ring_chunk_case
from v41_scenarios import (
    EPS, assert_identical, build_case, combined, compress_norm, programs_in_reverse_order, run_both,
)

INTERPRETER = not torch.cuda.is_available()
CANARY16 = B.CANARY_BYTE * 0x0101


@pytest.fixture
def v41_family() -> str:
    """The kernel family the shared checks (``v41_family_checks``) run on."""
    return "triton"


# ---- this family alone: programs in reverse order under the interpreter ------------------------------------------
@pytest.mark.skipif(not INTERPRETER, reason="the interpreter's program order")
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
@pytest.mark.parametrize("state", ["reference_ring", "vllm_ring"])
def test_ratio2_rings_in_reverse_program_order(state, bf16_state):
    """``test_ratio2_state_options``' ring steps with bf16 inputs, their programs run backwards: the
    bytes do not depend on the order programs run in."""
    with programs_in_reverse_order():
        assert_identical(combined(ratio2_case(state, bf16_state, "bf16")))


@pytest.mark.parametrize("state, requests", RING_CHUNKS)
@pytest.mark.parametrize("bf16_state", [False, True], ids=["fp32_state", "bf16_state"])
def test_ring_chunks_longer_than_the_ring_save_after_the_compress_reads(state, requests, bf16_state):
    """A chunk from an odd position ``P0`` reads row ``P0 - 1`` from the ring, and its tail saves a
    token at ``P0 - 1 + k*C`` onto that very slot: the save must wait for the read (one launch:
    the first token's program saves that row after its compress)."""
    case = ring_chunk_case(state, requests, bf16_state)
    assert_identical(combined(case))
    assert_identical(compress_norm(case))
    if INTERPRETER:  # the interpreter runs programs in order: backwards, the saving token's program runs first
        with programs_in_reverse_order():
            assert_identical(combined(case))
            assert_identical(compress_norm(case))


# ---- empty calls ---------------------------------------------------------------------------------------------------
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
