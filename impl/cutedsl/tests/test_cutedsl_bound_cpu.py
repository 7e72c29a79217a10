"""The eager path of bound CuTe DSL calls on CPU (kernels: ffi_stub.FfiStub, TVM-FFI's checks then a record).

What is checked: a bound call with a prepared token count launches exactly what the unbound
call does without validating again; every bad per-token argument, block table or workspace
raises SPEC §9's ``ValueError`` naming it, with nothing launched, also where TVM-FFI alone
would accept it (uint dtypes); the layouts SPEC allows and TVM-FFI takes as given run on the
eager path; ``T = 0``, ``debug`` and misaligned save inputs take the validated path.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is first imported (the PTX tests' target)
pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")

from dsv4_compressor.impl.cutedsl import api  # noqa: E402
from dsv4_compressor.impl.cutedsl.host import buffers, plans  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.paths import PATHS  # noqa: E402

from test_cutedsl_host import _indexer_arguments, _layer, indexer_recorded, recorded  # noqa: E402,F401
from test_cutedsl_launch_plans import _arguments  # noqa: E402
from cutedsl_test_calls import BAD_SAVES, strided, unsigned, unvalidated  # noqa: E402,F401


def _workspaces(tokens: int) -> dict:
    return {"none": None, "2d": torch.empty(tokens + 3, 512), "1d": torch.empty((tokens + 1) * 512)}


_SCRATCH_ARGUMENT = {"fused_handoff": 9, "split_pool": 6, "split_store": 0}


def _without_scratch(kind, config, args):
    index = _SCRATCH_ARGUMENT.get(kind)
    return (kind, config, args if index is None else args[:index] + args[index + 1:])


CASES = [("c4_decode_boundary", "auto"), ("c128_decode_boundary", "fused_cluster"),
         ("c128_decode_boundary", "fused_handoff"), ("c128_chunked_prefill", "auto"), ("c128_bs4_b64", "split_generic")]


@pytest.mark.parametrize("workspace_kind", ["none", "2d", "1d"])
@pytest.mark.parametrize("name, path", CASES)
def test_a_prepared_call_launches_what_the_unbound_call_does_unvalidated(recorded, unvalidated, name, path,
                                                                          workspace_kind):
    launches, _ = recorded
    args, kwargs = _arguments(name)
    workspace = _workspaces(len(args[2]))[workspace_kind]
    api.compress_norm_rope_store(*args, **kwargs, c128_path=path, workspace=workspace)
    unbound = list(launches)
    layer, per_token = _layer(args, kwargs, c128_path=path)
    layer.compress_norm_rope_store(*per_token, workspace=workspace)  # validated: prepares T
    launches.clear()
    unvalidated()
    layer.compress_norm_rope_store(*per_token, workspace=workspace)
    layer.compress_norm_rope_store(*per_token, workspace=workspace)
    if workspace is None:  # a fresh scratch per call: compare all but its pointer
        assert [_without_scratch(*r) for r in launches] == [_without_scratch(*r) for r in unbound * 2]
    else:
        assert launches == unbound * 2
    assert {kind for kind, _, _ in unbound} <= {"c4", "fused_cluster", "fused_handoff",
                                                "fused_pipelined", "split_pool", "split_store"}


BAD = [  # (argument index among the per-token arguments, change, the ValueError's start)
    (0, unsigned, "token_to_req_indices: expected dtype int32"),
    (1, unsigned, "positions: expected dtype int64"),
    (2, unsigned, "slot_mapping: expected dtype int64"),
    (4, unsigned, "kv_slot_mapping: expected dtype int64"),
    (3, unsigned, "block_table: expected dtype int32"),
    (1, lambda t: t.int(), "positions: expected dtype int64"),
    (2, lambda t: t[:-1], "slot_mapping: expected length T"),
    (0, lambda t: t[:-1], "token_to_req_indices: expected length T"),
    (4, lambda t: t[None], "kv_slot_mapping: expected 1 dimensions"),
    (1, strided, "positions: expected last stride 1"),
    (2, strided, "slot_mapping: expected last stride 1"),
    (4, lambda t: t.to("meta"), "kv_slot_mapping: expected a tensor on cpu"),
    (3, lambda t: t[0], "block_table: expected 2 dimensions"),
    (3, strided, "block_table: expected last stride 1"),
    (3, lambda t: t.to("meta"), "block_table: expected a tensor on cpu"),
    (2, lambda t: t.tolist(), "slot_mapping: expected a torch.Tensor, got list"),
]


@pytest.mark.parametrize("name, path", [("c128_decode_boundary", "fused_handoff"), ("c128_chunked_prefill", "auto"),
                                        ("c4_decode_boundary", "auto")])
@pytest.mark.parametrize("argument, change, needle", BAD)
def test_a_bad_per_token_argument_is_named_and_nothing_launched(recorded, name, path, argument, change, needle):
    launches, _ = recorded
    args, kwargs = _arguments(name)
    layer, per_token = _layer(args, kwargs, c128_path=path)
    workspace = torch.empty(len(args[2]), 512)
    layer.compress_norm_rope_store(*per_token, workspace=workspace)  # validated: prepares T
    good = list(launches)
    launches.clear()
    bad = list(per_token)
    bad[argument] = change(per_token[argument])
    with pytest.raises(ValueError, match=needle):
        layer.compress_norm_rope_store(*bad, workspace=workspace)
    assert launches == []
    layer.compress_norm_rope_store(*per_token, workspace=workspace)  # the layer keeps working
    assert launches == good


BAD_WORKSPACES = [
    (lambda t: torch.empty(t - 1, 512), "workspace: expected float32 \\[S >= "),
    (lambda t: torch.empty(t, 514)[:, :512], "workspace: expected strides \\(multiple of 4, 1\\)"),
    (lambda t: torch.empty(t * 512 + 4)[1:1 + t * 512].view(t, 512), "workspace: expected a 16-byte aligned base"),
    (lambda t: torch.empty(t, 512, dtype=torch.float64), "workspace: expected dtype float32"),
    (lambda t: torch.empty(t, 256), "workspace: expected float32 \\[S >= "),
    (lambda t: torch.empty(t * 512 - 1), "workspace: expected float32 \\[S >= "),
    (lambda t: torch.empty(t, 512, device="meta"), "workspace: expected a tensor on cpu"),
    (lambda t: [0.0] * 512, "workspace: expected a torch.Tensor or None, got list"),
]


@pytest.mark.parametrize("name, path", [("c128_decode_boundary", "fused_handoff"), ("c128_chunked_prefill", "split_generic")])
@pytest.mark.parametrize("make, needle", BAD_WORKSPACES)  # the paths with a scratch
def test_a_bad_workspace_is_named_and_nothing_launched(recorded, name, path, make, needle):
    launches, _ = recorded
    args, kwargs = _arguments(name)
    layer, per_token = _layer(args, kwargs, c128_path=path)
    layer.compress_norm_rope_store(*per_token)  # validated: prepares T
    launches.clear()
    with pytest.raises(ValueError, match=needle):
        layer.compress_norm_rope_store(*per_token, workspace=make(len(args[2])))
    assert launches == []


def test_a_path_without_scratch_ignores_the_workspace_as_the_unbound_call_does(recorded, unvalidated):
    launches, _ = recorded
    args, kwargs = _arguments("c4_decode_boundary")
    layer, per_token = _layer(args, kwargs)
    layer.compress_norm_rope_store(*per_token)
    unvalidated()
    layer.compress_norm_rope_store(*per_token, workspace=torch.empty(1, 3))
    assert launches[0] == launches[1]


def test_layouts_spec_allows_and_tvm_ffi_takes_run_unvalidated(recorded, unvalidated):
    """A single token's arrays with any stride, a block table with one column and any last
    stride: TVM-FFI ignores the stride of an extent of 1, and so does the kernel."""
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    one = [args[1][:1], args[2][:1], args[3][:1], args[4][:, :1], args[10][:1]]
    odd = [strided(t, 3) for t in one]
    assert odd[3].shape[1] == 1 and odd[3].stride(1) == 3 and odd[1].stride(0) == 3
    unbound_args = [args[0], *odd[:4], *args[5:10], odd[4]]
    api.compress_norm_rope_store(*unbound_args, **kwargs)
    unbound = list(launches)
    layer, _ = _layer(args, kwargs)
    layer.compress_norm_rope_store(*one)  # validated: prepares T = 1
    launches.clear()
    unvalidated()
    layer.compress_norm_rope_store(*odd)
    assert launches == unbound


def test_no_tokens_take_the_validated_path(recorded):
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    layer, per_token = _layer(args, kwargs)
    empty = [t[:0] for t in per_token[:3]] + [per_token[3], per_token[4][:0]]
    layer.compress_norm_rope_store(*empty)
    layer.compress_norm_rope_store(*empty)
    assert launches == [] and 0 not in layer._launches
    with pytest.raises(ValueError, match="positions: expected dtype int64"):
        layer.compress_norm_rope_store(empty[0], unsigned(empty[1]), *empty[2:])


def test_debug_calls_validate_every_time(recorded, monkeypatch):
    """``debug=True`` validates (and checks values) every call, a prepared token count too."""
    launches, _ = recorded
    args, kwargs = _arguments("c4_decode_boundary")
    layer, per_token = _layer(args, kwargs)
    layer.compress_norm_rope_store(*per_token)
    seen = []
    real = plans.build_compress_plan
    monkeypatch.setattr(plans, "build_compress_plan", lambda *a: seen.append(a[3]) or real(*a))
    layer.compress_norm_rope_store(*per_token, debug=True)
    layer.compress_norm_rope_store(*per_token, debug=True)
    layer.compress_norm_rope_store(*per_token)
    assert seen == [True, True] and len(launches) == 4


def test_layers_of_one_layout_share_the_prepared_launches_with_their_own_caches(recorded, unvalidated):
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    first, per_token = _layer(args, kwargs)
    other = [a.clone() if isinstance(a, torch.Tensor) and a.is_contiguous() else a for a in args]
    second, _ = _layer(other, kwargs)
    first.compress_norm_rope_store(*per_token)
    assert second._launches is first._launches and len(first._launches) == 1
    second.compress_norm_rope_store(*per_token)  # prepared by the first layer, held here at the first call
    unvalidated()
    first.compress_norm_rope_store(*per_token)
    second.compress_norm_rope_store(*per_token)
    assert launches[2] == launches[0] and launches[3] == launches[1] and launches[0][2] != launches[1][2]


# ---- save_partial_states -------------------------------------------------------------------------
def _save_inputs(args, kwargs):
    tokens, ratio = len(args[2]), kwargs["compress_ratio"]
    width = 2048 if ratio == 4 else 1024
    return torch.randn(tokens, width), torch.randn(ratio, width // 2)


def _prepared_save():
    """``(args, kv_score, ape, layer)``: a bound C128 layer whose save kernel one call prepared."""
    args, kwargs = _arguments("c128_decode_boundary")
    kv_score, ape = _save_inputs(args, kwargs)
    layer, _ = _layer(args, kwargs)
    layer.save_partial_states(kv_score, ape, args[2], args[3])
    return args, kv_score, ape, layer


def test_a_bound_save_runs_unvalidated_once_prepared(recorded, unvalidated):
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    kv_score, ape = _save_inputs(args, kwargs)
    api.save_partial_states(kv_score, ape, args[2], args[3], args[0], args[5])
    layer, _ = _layer(args, kwargs)
    layer.save_partial_states(kv_score, ape, args[2], args[3])
    unvalidated()
    layer.save_partial_states(kv_score, ape, args[2], args[3])
    layer.save_partial_states(kv_score[:1], ape, args[2][:1], args[3][:1])  # any T: one kernel
    assert launches[0] == launches[1] == launches[2] and launches[0][1].vector_inputs
    assert launches[3][2][0] == kv_score.data_ptr() and launches[3][0] == "save"


@pytest.mark.parametrize("change, needle", BAD_SAVES + [
    (lambda kv, ape, pos, slots: (kv, ape, pos, slots.to("meta")), "slot_mapping: expected a tensor on cpu"),
])
def test_a_bad_save_argument_is_named_and_nothing_launched(recorded, change, needle):
    launches, _ = recorded
    args, kv_score, ape, layer = _prepared_save()
    launches.clear()
    with pytest.raises(ValueError, match=needle):
        layer.save_partial_states(*change(kv_score, ape, args[2], args[3]))
    assert launches == []
    layer.save_partial_states(kv_score, ape, args[2], args[3])
    assert len(launches) == 1


def test_a_save_of_misaligned_rows_takes_the_validated_path_and_its_kernel(recorded):
    launches, _ = recorded
    args, kv_score, ape, layer = _prepared_save()
    shifted = torch.empty(kv_score.numel() + 1)[1:].view(kv_score.shape).copy_(kv_score)  # 4-byte aligned base
    padded = torch.empty(kv_score.shape[0], kv_score.shape[1] + 1)[:, :-1].copy_(kv_score)  # rows 4 bytes apart
    layer.save_partial_states(shifted, ape, args[2], args[3])
    layer.save_partial_states(padded, ape, args[2], args[3])
    assert [c.vector_inputs for _, c, _ in launches] == [True, False, False]
    assert launches[1][2][0] == shifted.data_ptr() and launches[2][2][0] == padded.data_ptr()


def test_a_bound_save_of_no_tokens_launches_nothing(recorded):
    launches, _ = recorded
    args, kv_score, ape, layer = _prepared_save()
    launches.clear()
    layer.save_partial_states(kv_score[:0], ape, args[2][:0], args[3][:0])
    assert launches == []
    with pytest.raises(ValueError, match="positions: expected dtype int64"):
        layer.save_partial_states(kv_score[:0], ape, unsigned(args[2][:0]), args[3][:0])


# ---- the indexer layouts ----------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, layout", [(4, "indexer_fp8"), (128, "indexer_mxfp4")])
def test_an_indexer_layer_runs_unvalidated_and_rejects_uint(indexer_recorded, unvalidated, ratio, layout):
    launches, _ = indexer_recorded
    args = _indexer_arguments(ratio, layout)
    api.compress_norm_rope_store(*args, compress_ratio=ratio, layout=layout)
    layer = api.bind(args[0], args[9], args[6], args[8], block_size=args[5], compress_ratio=ratio,
                     rms_norm_eps=args[7], layout=layout)
    per_token = [args[1], args[2], args[3], args[4], args[10]]
    layer.compress_norm_rope_store(*per_token)
    bad = list(per_token)
    bad[4] = unsigned(per_token[4])
    with pytest.raises(ValueError, match="kv_slot_mapping: expected dtype int64"):
        layer.compress_norm_rope_store(*bad)
    unvalidated()
    layer.compress_norm_rope_store(*per_token)
    assert launches == [launches[0]] * 3 and launches[0][0] == "indexer"


# ---- the TVM-FFI function under a compiled kernel ----------------------------------------------------
class _Compiled:
    """A compiled kernel's shape as CuTe DSL builds it: ``__tvm_ffi_object__`` and its argument specs."""

    def __init__(self, takes_pointers):
        self.function = object()
        if takes_pointers is not None:
            self.execution_args = type("ExecutionArgs", (), {"has_pointer_address_arg_specs": takes_pointers})()

    def __tvm_ffi_object__(self):
        return self.function


def test_the_bound_path_calls_the_tvm_ffi_function_where_every_argument_is_positional():
    plain = _Compiled(False)
    assert buffers.ffi_function(plain) is plain.function
    for kernel in (_Compiled(True), _Compiled(None), lambda *args: None):
        assert buffers.ffi_function(kernel) is kernel
    plan = plans.LaunchPlan(PATHS["c4"], (plain,), (buffers.ffi_function(plain),), (1e-6, 1.0), 1, False)
    assert plan.ffi == (plain.function,) and plan.kernels == (plain,)


def test_fixed_tensors_that_tvm_ffi_cannot_hold_are_passed_as_torch_tensors(recorded, unvalidated, monkeypatch):
    launches, _ = recorded

    def refuse(*tensors):
        raise BufferError("no DLPack export")

    monkeypatch.setattr(buffers, "held_tensors", refuse)
    args, kwargs = _arguments("c4_decode_boundary")
    layer, per_token = _layer(args, kwargs)
    layer.compress_norm_rope_store(*per_token)
    unvalidated()
    layer.compress_norm_rope_store(*per_token)
    assert layer._held[0] is args[0] and launches[0] == launches[1]
