"""GPU checks of the CuTe DSL error cases that need device tensors: a bad argument fails the
call with a ``ValueError`` naming it, before any kernel launches, so no byte of the state cache
or the k_cache changes (whole allocations, padding included)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import Case, DeviceStep, assert_bytes  # noqa: E402

pytestmark = pytest.mark.gpu


def test_save_and_compress_writes_nothing_when_an_argument_is_bad():
    """A bad compress argument fails the combined call before its save kernel runs: the state
    cache and the k_cache keep every byte."""
    from dsv4_compressor.impl import cutedsl

    step = DeviceStep(Case(128, 8, 2).inputs())
    state_before, k_before = step.state_bytes(), step.k_bytes()
    args = step.compress_args()
    for bad, needle in ((dict(layout="fp8"), "layout"), (dict(c128_path="cluster"), "c128_path"),
                        (dict(c128_path="fused_stream"), "c128_path")):
        with pytest.raises(ValueError, match=needle):
            cutedsl.save_and_compress_norm_rope_store(step.kv_score, step.ape, **args, **{"compress_ratio": 128, **bad})
    with pytest.raises(ValueError, match="ape"):
        cutedsl.save_and_compress_norm_rope_store(step.kv_score, step.ape[:, :256], **args, compress_ratio=128)
    assert_bytes("state", step.inputs, "state", step.state_bytes(), state_before)
    assert_bytes("k_cache", step.inputs, "k_cache", step.k_bytes(), k_before)
