"""SPEC §13.4's step call ``compress_and_save`` of the CuTe DSL family on a GPU: the spec's bytes.

The scenarios are the Triton step tests' (``impl/triton/tests/triton_state_scenarios.py``): one step's
buffers in a format (fp32 or bf16 state, ``ape_at``, paged or a ring), built once in NumPy, the spec
and the CuTe DSL call run from identical copies, whole allocations compared (padding and canaries
included).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "triton" / "tests"))  # the shared scenarios

import triton_state_scenarios as scenarios  # noqa: E402
from triton_state_scenarios import format_cases as _cases  # noqa: E402
from triton_state_scenarios import format_step as _step  # noqa: E402
from triton_state_scenarios import step_requests as _requests  # noqa: E402
from dsv4_compressor.conformance.buffers import Buffer  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def run_step(step, *, save_slot_mapping: np.ndarray | None = None) -> dict:
    """``compress_and_save``, spec and CuTe DSL: ``{name: (spec, CuTe DSL)}`` allocations of
    ``state_cache`` and ``k_cache``."""
    return scenarios.run_step(step, DEVICE, family="cutedsl", save_slot_mapping=save_slot_mapping)


@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_compress_and_save_writes_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _requests(ratio, ring), 4)
    assert step.batch.num_active >= 2
    scenarios.assert_identical(run_step(step))


@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_token_runs_write_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    """Every format with the split kernels (and a ring's save, ``step_save_runs``) on runs of tokens
    found by a ballot (``split_runs=1``: runs of up to 32 tokens from ``T = 2``), not only on large steps."""
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _requests(ratio, ring), 4)
    scenarios.assert_identical(scenarios.run_step(step, DEVICE, family="cutedsl",
                                                  policy=DEFAULT_POLICY.with_overrides(split_runs=1,
                                                                                      step_save_runs=True)))


@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_one_save_group_a_cta_writes_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    """Every format with the step's save taking one token a CTA (``step_save_tokens_per_cta=1``; the
    default's four run in every other test of this module)."""
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _requests(ratio, ring), 4)
    scenarios.assert_identical(scenarios.run_step(step, DEVICE, family="cutedsl",
                                                  policy=DEFAULT_POLICY.with_overrides(step_save_tokens_per_cta=1)))


def test_the_step_reads_its_chunk_from_the_inputs_not_the_state():
    """Nothing saved: the windows inside the chunks still pool the chunk's rows, and the state is
    untouched."""
    step = _step(4, 512, "flashmla_fp8", False, True, "save", False, [Request(9, 11), Request(0, 5)], 5)
    results = run_step(step, save_slot_mapping=np.full(step.batch.num_tokens, -1, np.int64))
    scenarios.assert_identical(results)
    assert np.array_equal(results["state_cache"][1], Buffer.of(step.state).owner)


@pytest.mark.parametrize("ratio", [4, 128])
def test_ring_windows_wrap_around(ratio):
    """A decode boundary whose window crosses the ring's end."""
    step = _step(ratio, 512, "flashmla_fp8", False, True, "compress", True, _requests(ratio, True)[:1], 6)
    scenarios.assert_identical(run_step(step))


@pytest.mark.parametrize("clusters", [1, 2])
@pytest.mark.parametrize("ape_at, ring", [("save", True), ("save", False), ("compress", True), ("compress", False)])
def test_a_cluster_walking_many_tokens_writes_the_spec_bytes(ape_at, ring, clusters):
    """The C128 fp32 step on a persistent grid of one or two clusters: a cluster walks several active
    tokens, each window's rows from the state (paged or the ring) and the chunk in another proportion,
    the next token's rows staged while the current one is pooled."""
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    step = _step(128, 512, "flashmla_fp8", False, False, ape_at, ring, _requests(128, ring), 7)
    assert step.batch.num_active >= 2
    policy = DEFAULT_POLICY.with_overrides(pipelined_max_clusters=clusters)
    scenarios.assert_identical(scenarios.run_step(step, DEVICE, family="cutedsl", policy=policy))
