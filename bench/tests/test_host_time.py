"""The host-time breakdown runs off a GPU (launches replaced by a no-op) and reports every part."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")


@pytest.mark.parametrize("ratio", [4, 128])
def test_breakdown_reports_every_part_on_cpu(ratio):
    from dsv4_compressor.bench.host_time import measure

    parts = measure(ratio, 1, 5, torch.device("cpu"))
    for name in ("validate", "key", "run", "bound python", "call", "bound call", "save call", "bound save python",
                 "bound save"):
        assert parts[name] > 0, name
    assert parts["key"] < parts["validate"]  # a plan-cache hit costs less than validating
    assert parts["bound python"] < parts["key"]  # a bound call's eager path costs less than an unbound key
