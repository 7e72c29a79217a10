"""SPEC §13's state formats in the CuTe DSL kernels on a GPU: the bytes of the spec, byte for byte.

The scenarios are the Triton tests' (``impl/triton/tests/triton_state_scenarios.py``): one step's
buffers in a format (fp32 or bf16 state, ``ape_at``, paged or a ring), built once in NumPy, the
spec and the CuTe DSL calls run from identical copies, whole allocations compared (padding and
canaries included). The CuTe DSL family takes the two calls (the save, then the compress), unbound
and through a bound layer (``bind`` with the format), not the step call.
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
from triton_state_scenarios import LAYOUTS  # noqa: E402
from triton_state_scenarios import format_cases as _cases  # noqa: E402
from triton_state_scenarios import format_step as _step  # noqa: E402
from triton_state_scenarios import two_call_requests as _requests  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def run_save(step, *, with_ape: bool) -> tuple[np.ndarray, np.ndarray]:
    """``save_partial_states`` of every token with a slot, spec and CuTe DSL: the two state allocations."""
    return scenarios.run_save(step, DEVICE, family="cutedsl", with_ape=with_ape)


def _bound_calls(c128_path: str):
    """The two calls through a layer bound once, each made twice (validated, then the eager path:
    the same bytes again, the save and the compress are idempotent here)."""
    def calls(step, t, tokens, kv_score, save_ape, pool_ape):
        from dsv4_compressor.impl import cutedsl

        b = step.batch
        layer = cutedsl.bind(t["state_cache"], t["k_cache"], t["rms_norm_weight"], t["cos_sin_cache"],
                             block_size=b.block_size, compress_ratio=b.compress_ratio, rms_norm_eps=1e-6,
                             layout=step.layout, fp8_scale=step.fp8_scale, hadamard=step.hadamard,
                             c128_path=c128_path, ape_at=step.ape_at, ring_capacity=b.ring_capacity)
        for _ in range(2):
            layer.save_partial_states(kv_score, save_ape, tokens["positions"], tokens["slot_mapping"])
            layer.compress_norm_rope_store(tokens["token_to_req_indices"], tokens["positions"], tokens["slot_mapping"],
                                           t["block_table"], tokens["kv_slot_mapping"], ape=pool_ape)
    return calls


def run_save_then_compress(step, *, c128_path: str = "auto", bound: bool = False, **options) -> dict:
    """The two calls in the step's format, spec and CuTe DSL (``bound``: a layer's calls; ``options``:
    the compress's other keywords, e.g. ``policy``): ``{name: (spec, CuTe DSL)}`` allocations."""
    if bound:
        return scenarios.run_save_then_compress(step, DEVICE, family="cutedsl", calls=_bound_calls(c128_path))
    return scenarios.run_save_then_compress(step, DEVICE, family="cutedsl", c128_path=c128_path, **options)


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
@pytest.mark.parametrize("bf16_state, ape_at", [(False, "compress"), (True, "save"), (True, "compress")])
def test_save_writes_the_spec_bytes(ratio, head, bf16_state, ape_at):
    step = _step(ratio, head, LAYOUTS[head][0][0], False, bf16_state, ape_at, False, _requests(ratio, False), 1)
    expected, got = run_save(step, with_ape=ape_at == "save")
    assert np.array_equal(expected, got)


@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_save_then_compress_writes_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _requests(ratio, ring), 3)
    assert step.batch.num_active >= 2
    scenarios.assert_identical(run_save_then_compress(step))


@pytest.mark.parametrize("bf16_state, ape_at, ring", [(True, "compress", True), (False, "save", True)])
def test_the_block8_split_path_takes_the_formats(bf16_state, ape_at, ring):
    step = _step(128, 512, "flashmla_fp8", False, bf16_state, ape_at, ring, _requests(128, ring), 5)
    scenarios.assert_identical(run_save_then_compress(step, c128_path="split_block8"))


@pytest.mark.parametrize("ape_at, ring", [("save", True), ("compress", False), ("compress", True)])
def test_one_cluster_walking_every_token_takes_the_formats(ape_at, ring):
    """An fp32 state's C128 compress on the persistent grid of a single cluster, which walks every
    token: the next active token's rows (a ring's at ``q mod C``) staged while the current one is
    pooled, ``ape`` added to the read-back scores with ``ape_at="compress"``."""
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    step = _step(128, 512, "flashmla_fp8", False, False, ape_at, ring, _requests(128, ring), 8)
    assert step.batch.num_active >= 2
    policy = DEFAULT_POLICY.with_overrides(pipelined_max_clusters=1)
    scenarios.assert_identical(run_save_then_compress(step, c128_path="fused_pipelined", policy=policy))


@pytest.mark.parametrize("ratio", [4, 128])
def test_ring_windows_wrap_around(ratio):
    """A decode boundary whose window crosses the ring's end (C4: a ring of W + 4 rows)."""
    step = _step(ratio, 512, "flashmla_fp8", False, True, "compress", True, _requests(ratio, True)[:1], 4)
    scenarios.assert_identical(run_save_then_compress(step))


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
@pytest.mark.parametrize("bf16_state, ape_at, ring", [(True, "save", True), (False, "compress", False),
                                                      (True, "compress", True)])
def test_a_bound_layer_writes_the_spec_bytes(ratio, head, bf16_state, ape_at, ring):
    layout, hadamard = LAYOUTS[head][0]
    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _requests(ratio, ring), 6)
    scenarios.assert_identical(run_save_then_compress(step, bound=True))
