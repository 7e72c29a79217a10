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
from dsv4_compressor import spec  # noqa: E402
from dsv4_compressor.conformance.buffers import Buffer  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def _requests(ratio: int, ring: bool) -> list[Request]:
    """Decode boundaries, a first window, chunks with a boundary inside; on a ring a chunk longer
    than the ring (its tail saved), as the Triton step tests."""
    if ratio == 4:
        return ([Request(35, 1), Request(2, 15), Request(0, 4)] if ring
                else [Request(11, 1), Request(0, 5), Request(9, 11)])
    return [Request(383, 1), Request(250, 6), Request(100, 140)] if ring else [Request(127, 1), Request(250, 10)]


def run_step(step, *, save_slot_mapping: np.ndarray | None = None) -> dict:
    """``compress_and_save``, spec and CuTe DSL: ``{name: (spec, CuTe DSL)}`` allocations of
    ``state_cache`` and ``k_cache``."""
    from dsv4_compressor.impl import cutedsl

    b = step.batch
    saves = b.save_slot_mapping if save_slot_mapping is None else save_slot_mapping
    state_owner, spec_state = Buffer.of(step.state).numpy_copy()
    cache_owner, spec_cache = Buffer.of(step.k_cache).numpy_copy()
    spec.compress_and_save(
        step.kv, step.score, step.ape, b.positions, b.token_to_req_indices, b.query_start_loc, b.slot_mapping, saves,
        b.block_table, b.block_size, spec_state, step.weight, 1e-6, step.cos_sin, spec_cache, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=step.layout, fp8_scale=step.fp8_scale, ape_at=step.ape_at,
        ring_capacity=b.ring_capacity, hadamard=step.hadamard, debug=True)
    args, options, raw = scenarios.step_arguments(step, DEVICE)
    if save_slot_mapping is not None:
        args[7] = torch.from_numpy(save_slot_mapping.copy()).to(DEVICE)
    cutedsl.compress_and_save(*args, **options)
    torch.cuda.synchronize()
    return {"state_cache": (state_owner, raw["state_cache"].cpu().numpy()),
            "k_cache": (cache_owner, raw["k_cache"].cpu().numpy())}


@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_compress_and_save_writes_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _requests(ratio, ring), 4)
    assert step.batch.num_active >= 2
    scenarios.assert_identical(run_step(step))


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
