"""The launch-plan cache of the CuTe DSL API (CPU: the compiled kernels are replaced by
recorders, so what is checked is the host-side dispatch, not the kernels)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is first imported (the PTX tests' target)
pytest.importorskip("cutlass")

from dsv4_compressor.conformance.runner import to_torch  # noqa: E402
from dsv4_compressor.conformance.scenarios import scenarios  # noqa: E402
from dsv4_compressor.impl.plan_cache import PlanCache  # noqa: E402
from dsv4_compressor.impl.cutedsl import api  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.policy import Policy  # noqa: E402
from ffi_stub import host_only, stub_kernels  # noqa: E402


class Recorder:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __call__(self, *args):
        self.log.append((self.name, tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)))


@pytest.fixture
def launches(monkeypatch):
    log = []
    stub_kernels(monkeypatch, lambda name, _: lambda config, **_: Recorder(name, log))
    host_only(monkeypatch)
    monkeypatch.setattr(api, "_PLANS", PlanCache())
    return log


def _arguments(name):
    inputs = scenarios([name])[0].build()
    b = inputs.batch
    _, state = inputs.state_cache.torch_copy("cpu")
    _, k_cache = inputs.k_cache.torch_copy("cpu")
    meta = [to_torch(getattr(b, n), "cpu") for n in ("token_to_req_indices", "positions", "slot_mapping", "block_table")]
    args = [state, *meta, b.block_size, to_torch(inputs.rms_norm_weight, "cpu"), 1e-6,
            to_torch(inputs.cos_sin_cache, "cpu"), k_cache, to_torch(b.kv_slot_mapping, "cpu")]
    return args, {"compress_ratio": b.compress_ratio}


def _fresh_copies(args):
    return [a.clone() if isinstance(a, torch.Tensor) and a.is_contiguous() else a for a in args]


@pytest.mark.parametrize("name, path", [("c4_decode_boundary", "auto"), ("c128_decode_boundary", "fused_cluster"),
                                        ("c128_decode_boundary", "fused_handoff"),
                                        ("c128_decode_boundary", "split_block8"), ("c128_bs4_b64", "split_generic")])
def test_a_cached_plan_launches_exactly_what_a_fresh_one_does(launches, name, path):
    args, kwargs = _arguments(name)
    workspace = torch.empty((len(args[2]), 512))
    api.compress_norm_rope_store(*args, **kwargs, c128_path=path, workspace=workspace)
    assert len(api._PLANS) == 1
    first = list(launches)
    launches.clear()
    api.compress_norm_rope_store(*args, **kwargs, c128_path=path, workspace=workspace)
    assert launches == first  # same kernels, same tensors, same scalars
    moved = _fresh_copies(args)  # other tensors with the same layout: same plan, their pointers
    launches.clear()
    api.compress_norm_rope_store(*moved, **kwargs, c128_path=path, workspace=workspace)
    assert len(api._PLANS) == 1
    assert [n for n, _ in launches] == [n for n, _ in first]
    assert moved[0].data_ptr() in launches[0][1]


def test_a_changed_layout_is_validated_again(launches):
    args, kwargs = _arguments("c4_decode_boundary")
    api.compress_norm_rope_store(*args, **kwargs)
    bad = list(args)
    bad[2] = args[2].to(torch.int32)  # positions int32
    launches.clear()
    with pytest.raises(ValueError, match="positions"):
        api.compress_norm_rope_store(*bad, **kwargs)
    assert launches == []
    with pytest.raises(ValueError, match="c128_path"):
        api.compress_norm_rope_store(*args, **kwargs, c128_path="fastest")


def test_debug_calls_and_policy_changes_bypass_the_cache(launches):
    args, kwargs = _arguments("c128_decode_boundary")
    api.compress_norm_rope_store(*args, **kwargs)
    assert len(api._PLANS) == 1
    api.compress_norm_rope_store(*args, **kwargs, debug=True)
    assert len(api._PLANS) == 1
    launches.clear()
    api.compress_norm_rope_store(*args, **kwargs, policy=Policy(cluster_max_tokens=0, handoff_max_tokens=0))
    assert len(api._PLANS) == 2
    assert [n for n, _ in launches] == ["fused_pipelined"]


def test_save_and_compress_launches_the_save_then_an_early_metadata_compress(launches, monkeypatch):
    """The combined call: every argument validated before the first launch, the save kernel
    first, then a compress kernel compiled with early metadata; a plain compress call with
    the same layout keeps its own plan, which waits first."""
    configs = []

    def recorder(name, _):  # the compress kernels' pooling configurations
        if name == "save":
            return lambda config, **_: Recorder(name, launches)
        return lambda config, **_: configs.append(getattr(config, "pool", config)) or Recorder(name, launches)

    stub_kernels(monkeypatch, recorder)
    args, kwargs = _arguments("c128_decode_boundary")
    tokens = len(args[2])
    kv_score, ape = torch.zeros(tokens, 1024), torch.zeros(128, 512)
    workspace = torch.empty((tokens, 512))
    api.save_and_compress_norm_rope_store(kv_score, ape, *args, **kwargs, workspace=workspace)
    assert [n for n, _ in launches][0] == "save" and len(launches) == 2
    assert configs[-1].early_metadata and configs[-1].pdl
    launches.clear()
    for bad_ape, bad_kwargs, needle in ((ape[:, :256], {}, "ape"), (ape, {"layout": "fp8"}, "layout")):
        with pytest.raises(ValueError, match=needle):
            api.save_and_compress_norm_rope_store(kv_score, bad_ape, *args, **kwargs, **bad_kwargs)
    assert launches == []
    api.compress_norm_rope_store(*args, **kwargs, workspace=workspace)
    assert not configs[-1].early_metadata
    # no wait to read ahead of: an ordinary compress plan
    api.save_and_compress_norm_rope_store(kv_score, ape, *args, **kwargs, workspace=workspace, pdl=False)
    assert not configs[-1].early_metadata and not configs[-1].pdl
