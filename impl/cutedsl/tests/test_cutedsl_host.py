"""The CuTe DSL host path on CPU: bound operators, warm-up and the torch custom ops.

The compiled kernels are replaced by recorders (as in ``test_cutedsl_launch_plans``), so what
is checked is the host side: validation before any launch, which kernels a call launches with
which tensors and scalars, and what warm-up compiles.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is first imported (the PTX tests' target)
pytest.importorskip("cutlass")

from dsv4_compressor.impl.cutedsl import api  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.policy import Policy  # noqa: E402

from ffi_stub import stubbed_calls  # noqa: E402
from test_cutedsl_launch_plans import _arguments  # noqa: E402

@pytest.fixture
def recorded(monkeypatch):
    """``(launches, compiled)``: every launch as (kernel kind, config, tensor pointers and scalars),
    and every static configuration handed to a compile function. The kernels are
    ffi_stub.FfiStub objects (TVM-FFI's checks, then the record)."""
    launches, compiled = stubbed_calls(monkeypatch, api)
    monkeypatch.setattr(api, "_BOUND_LAUNCHES", {})
    return launches, compiled


def _layer(args, kwargs, **extra):
    state, token_req, positions, slots, table, bs, weight, eps, cos_sin, k_cache, kv_slots = args
    return api.bind(state, k_cache, weight, cos_sin, block_size=bs, compress_ratio=kwargs["compress_ratio"],
                    rms_norm_eps=eps, **extra), (token_req, positions, slots, table, kv_slots)


@pytest.mark.parametrize("name, path", [("c4_decode_boundary", "auto"), ("c128_decode_boundary", "auto"),
                                        ("c128_decode_boundary", "fused_handoff"), ("c128_bs4_b64", "split_generic")])
def test_a_bound_layer_launches_what_the_unbound_call_does(recorded, name, path):
    launches, _ = recorded
    args, kwargs = _arguments(name)
    workspace = torch.empty((len(args[2]), 512))
    api.compress_norm_rope_store(*args, **kwargs, c128_path=path, workspace=workspace)
    kv_score = torch.zeros(len(args[2]), 2048 if kwargs["compress_ratio"] == 4 else 1024)
    ape = torch.zeros(kwargs["compress_ratio"], 1024 if kwargs["compress_ratio"] == 4 else 512)
    api.save_partial_states(kv_score, ape, args[2], args[3], args[0], args[5])
    unbound = list(launches)
    launches.clear()
    layer, per_token = _layer(args, kwargs, c128_path=path)
    layer.compress_norm_rope_store(*per_token, workspace=workspace)
    layer.save_partial_states(kv_score, ape, args[2], args[3])
    assert launches == unbound and launches
    launches.clear()
    layer.compress_norm_rope_store(*per_token, workspace=workspace)  # from the layer's plan cache
    assert launches == unbound[:-1]


def test_bind_validates_the_fixed_arguments_at_once(recorded):
    launches, compiled = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    bad_weight = list(args)
    bad_weight[6] = args[6].to(torch.float16)
    with pytest.raises(ValueError, match="rms_norm_weight: expected dtype bfloat16 or float32"):
        _layer(bad_weight, kwargs)
    with pytest.raises(ValueError, match="layout"):
        _layer(args, kwargs, layout="fp8")
    with pytest.raises(ValueError, match="fp8_scale"):
        _layer(args, kwargs, fp8_scale=0.5)
    with pytest.raises(ValueError, match="c128_path"):
        _layer(args, kwargs, c128_path="fastest")
    assert launches == [] and compiled == []


@pytest.mark.parametrize("argument, change, needle", [
    (1, lambda t: t.int(), "positions: expected dtype int64"),
    (2, lambda t: t[:-1], "slot_mapping: expected length T"),
    (0, lambda t: t.long(), "token_to_req_indices: expected dtype int32"),
    (3, lambda t: t.long(), "block_table: expected dtype int32"),
    (4, lambda t: t.int(), "kv_slot_mapping: expected dtype int64"),
])
def test_bound_calls_check_the_per_token_arrays_before_any_launch(recorded, argument, change, needle):
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    layer, per_token = _layer(args, kwargs, c128_path="fused_handoff")  # a path with a scratch workspace
    layer.compress_norm_rope_store(*per_token)  # a valid call first: its plan is cached
    launches.clear()
    bad = list(per_token)
    bad[argument] = change(per_token[argument])
    with pytest.raises(ValueError, match=needle):
        layer.compress_norm_rope_store(*bad)
    with pytest.raises(ValueError, match="workspace"):
        layer.compress_norm_rope_store(*per_token, workspace=torch.empty(1, 256))
    with pytest.raises(ValueError, match="slot_mapping: expected a torch.Tensor, got list"):
        layer.compress_norm_rope_store(per_token[0], per_token[1], per_token[2].tolist(), *per_token[3:])
    with pytest.raises(ValueError, match="k_cache: expected a torch.Tensor, got NoneType"):
        api.compress_norm_rope_store(*args[:9], None, args[10], **kwargs)
    assert launches == []


def test_warm_up_compiles_what_the_calls_then_use(recorded, caplog):
    launches, compiled = recorded
    counts = (1, 4, 5, 16, 17, 64, 65, 1056, 1057)
    with caplog.at_level(logging.INFO, logger="dsv4_compressor"):
        configs = api.warm_up(compress_ratio=128, block_size=8, layout="flashmla_fp8", entries_per_page=2,
                              device="cpu", token_counts=counts)
    assert any("warm_up" in r.getMessage() for r in caplog.records)
    kinds = [kind for kind, _ in compiled]
    assert sorted(set(kinds)) == ["fused_cluster", "fused_handoff", "fused_pipelined",
                                  "save"]
    assert len(configs) == len(compiled) == len(set(configs))  # each configuration compiled once
    assert {c.pool.tile for k, c in compiled if k == "fused_cluster"} == {32, 64}
    every = api.warm_up(compress_ratio=128, block_size=8, layout="flashmla_fp8", entries_per_page=2, device="cpu",
                        save=False)
    assert set(every) == set(configs) - {c for k, c in compiled if k == "save"}
    early = api.warm_up(compress_ratio=128, block_size=8, layout="flashmla_fp8", entries_per_page=2, device="cpu",
                        token_counts=(1,), save=False, save_and_compress=True)
    assert [c.pool.early_metadata for c in early] == [False, True]
    c4 = api.warm_up(compress_ratio=4, block_size=4, layout="bf16", entries_per_page=64, device="cpu",
                     weight_dtype=torch.float32, token_counts=None, policy=Policy(), pdl=False)
    assert [type(c).__name__ for c in c4] == ["C4Config", "SaveConfig"] and not c4[0].pdl
    assert c4[0].entry.weight_dtype == "float32" and c4[0].entry.store_align == 8
    assert launches == []  # compiled, nothing launched


def test_warm_up_covers_every_plan_of_a_layer(recorded):
    """After a layer's warm-up, calls of any token count compile nothing new."""
    _, compiled = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    layer, per_token = _layer(args, kwargs)
    layer.warm_up(token_counts=(len(per_token[1]),))
    before = set(compiled)
    layer.compress_norm_rope_store(*per_token)
    layer.save_partial_states(torch.zeros(len(per_token[1]), 1024), torch.zeros(128, 512), per_token[1], per_token[2])
    assert set(compiled) <= before


# ---- torch custom ops ------------------------------------------------------------------------
def _written(op) -> set:
    return {a.name for a in op.default._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def test_ops_are_registered_with_their_mutations():
    ops = torch.ops.dsv4_compressor
    assert _written(ops.cutedsl_compress_norm_rope_store) == {"k_cache", "workspace"}
    assert _written(ops.cutedsl_save_partial_states) == {"state_cache"}
    assert _written(ops.cutedsl_save_and_compress_norm_rope_store) == {"state_cache", "k_cache", "workspace"}
    assert _written(ops.cutedsl_compress) == set()
    assert str(ops.cutedsl_compress.default._schema).endswith("-> Tensor")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_fullgraph_compiled_step_runs_the_ops(recorded, backend):
    launches, _ = recorded
    torch._dynamo.reset()
    args, kwargs = _arguments("c128_decode_boundary")
    tokens = len(args[2])
    kv_score, ape = torch.zeros(tokens, 1024), torch.zeros(128, 512)
    api.save_partial_states(kv_score, ape, args[2], args[3], args[0], args[5])
    api.compress_norm_rope_store(*args, **kwargs)
    direct = [(kind, config) for kind, config, _ in launches]
    launches.clear()
    ops = torch.ops.dsv4_compressor

    @torch.compile(fullgraph=True, backend=backend)
    def step(kv_score, ape, state, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots):
        ops.cutedsl_save_partial_states(kv_score, ape, positions, slots, state, args[5])
        ops.cutedsl_compress_norm_rope_store(state, token_req, positions, slots, table, args[5], weight, args[7],
                                             cos_sin, k_cache, kv_slots, 128)

    tensors = (args[0], *args[1:5], args[6], args[8], args[9], args[10])
    step(kv_score, ape, *tensors)
    assert [(kind, config) for kind, config, _ in launches] == direct
    bad = torch.zeros(128, 256)  # ape of the wrong width: the op's real implementation rejects it
    launches.clear()
    with pytest.raises(ValueError, match="ape"):
        step(kv_score, bad, *tensors)
    assert launches == []


def test_every_op_launches_what_its_direct_call_does(recorded):
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    tokens = len(args[2])
    kv_score, ape, workspace = torch.zeros(tokens, 1024), torch.zeros(128, 512), torch.empty(tokens, 512)
    ops = torch.ops.dsv4_compressor
    api.save_and_compress_norm_rope_store(kv_score, ape, *args, **kwargs, workspace=workspace, c128_path="fused_handoff",
                                          pdl=False)
    direct = list(launches)
    launches.clear()
    ops.cutedsl_save_and_compress_norm_rope_store(kv_score, ape, *args, 128, workspace=workspace,
                                                  c128_path="fused_handoff", pdl=False)
    assert launches == direct and len(direct) == 2
    launches.clear()
    api.compress_norm_rope_store(*args, **kwargs, workspace=workspace, c128_path="split_block8")
    direct = list(launches)
    launches.clear()
    ops.cutedsl_compress_norm_rope_store(*args, 128, "flashmla_fp8", None, False, workspace, "split_block8")
    assert launches == direct and len(direct) == 2
    pooling = (args[0], *args[1:6], args[10])
    x = ops.cutedsl_compress(*pooling, 128)
    assert x.shape == (tokens, 512) and x.dtype == torch.float32
    assert launches[-1][0] == "split_pool"


def _same(a, b) -> bool:
    """The same arguments: tensors by identity, everything else by value and type."""
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b if isinstance(a, torch.Tensor) else (type(a) is type(b) and a == b)


@pytest.mark.parametrize("options", [
    {},  # every trailing argument left to the schema's default
    {"layout": "bf16", "fp8_scale": 0.5, "debug": True, "workspace": "given", "c128_path": "split_block8",
     "pdl": False, "hadamard": True, "ape": "given", "ape_at": "compress", "ring_capacity": 256},
])
def test_the_compress_op_hands_its_plan_what_the_call_does(monkeypatch, options):
    """The compress op's own kernel (the schema's arguments in order, the left-out ones filled
    from a table) asks for the plan with the tensors and options the public call does."""
    seen = []

    class NoPlan:
        def run(self, *arguments):
            seen.append(("run", arguments))

    monkeypatch.setattr(api, "_compress_plan", lambda *a, **k: seen.append(("plan", a, k)) or NoPlan())
    args, kwargs = _arguments("c128_decode_boundary")
    given = {"workspace": torch.empty((len(args[2]), 512)), "ape": torch.zeros(128, 512)}
    options = {name: given[name] if value == "given" else value for name, value in options.items()}
    api.compress_norm_rope_store(*args, **kwargs, **options)
    direct = list(seen)
    seen.clear()
    torch.ops.dsv4_compressor.cutedsl_compress_norm_rope_store(*args, kwargs["compress_ratio"], **options)
    assert len(direct) == 2 and _same(seen, direct)


@pytest.mark.parametrize("operation, first", [("compress_norm_rope_store", 12),
                                               ("save_and_compress_norm_rope_store", 14)])
def test_the_ops_trailing_defaults_are_their_registered_schemas(operation, first):
    """The defaults an op's kernel appends (the dispatcher leaves trailing defaults out) are those
    of the op torch registered, from the argument after compress_ratio on, and they are the public
    function's own defaults for those arguments (what a direct call would take)."""
    import inspect

    from dsv4_compressor.impl import custom_ops

    schema = getattr(torch.ops.dsv4_compressor, f"cutedsl_{operation}").default._schema
    assert [a.name for a in schema.arguments[first - 1:first + 1]] == ["compress_ratio", "layout"]
    expected = tuple(a.default_value for a in schema.arguments[first:])
    assert custom_ops.trailing_defaults(operation, first, cutedsl=True) == expected
    if operation == "compress_norm_rope_store":
        assert api._OP_TRAILING_DEFAULTS == expected
    public = inspect.signature(getattr(api, operation)).parameters
    assert {a.name: a.default_value for a in schema.arguments[first:]} == {
        a.name: public[a.name].default for a in schema.arguments[first:]}


def test_trailing_defaults_refuse_a_position_before_an_argument_without_one():
    from dsv4_compressor.impl import custom_ops

    with pytest.raises(ValueError, match=r"first: .* got 11 \(no default: compress_ratio\)"):
        custom_ops.trailing_defaults("compress_norm_rope_store", 11, cutedsl=True)


def test_layers_with_the_same_layout_share_their_plans(recorded):
    launches, _ = recorded
    args, kwargs = _arguments("c128_decode_boundary")
    first, per_token = _layer(args, kwargs)
    other_args = [a.clone() if isinstance(a, torch.Tensor) and a.is_contiguous() else a for a in args]
    second, _ = _layer(other_args, kwargs)  # another layer's caches, the same layout
    first.compress_norm_rope_store(*per_token)
    plans = len(api._PLANS)
    second.compress_norm_rope_store(*per_token)
    assert len(api._PLANS) == plans
    assert launches[0][1] == launches[1][1] and launches[0][2] != launches[1][2]  # same kernel, its own caches
    third, _ = _layer(args, kwargs, pdl=False)
    third.compress_norm_rope_store(*per_token)
    assert len(api._PLANS) == plans + 1 and not launches[-1][1].pool.pdl


# ---- the indexer compressor (SPEC §12) on the same host path ---------------------------------------
@pytest.fixture
def indexer_recorded(recorded, monkeypatch):
    """``recorded``: the indexer kernel's compile function is one of the registry's, recorded too."""
    return recorded


def _indexer_arguments(ratio=4, layout="indexer_fp8"):
    from test_cutedsl_indexer_cpu import _indexer_call

    call = _indexer_call(ratio, 16 if ratio == 4 else 8, layout)
    names = ("state_cache", "token_to_req_indices", "positions", "slot_mapping", "block_table", "block_size",
             "rms_norm_weight", "rms_norm_eps", "cos_sin_cache", "k_cache", "kv_slot_mapping")
    return [call[n] for n in names]


@pytest.mark.parametrize("ratio, layout, hadamard", [(4, "indexer_fp8", False), (4, "indexer_mxfp4", True),
                                                     (128, "indexer_fp8", True)])
def test_an_indexer_layer_launches_what_the_unbound_call_does(indexer_recorded, ratio, layout, hadamard):
    launches, _ = indexer_recorded
    args = _indexer_arguments(ratio, layout)
    kwargs = dict(compress_ratio=ratio, layout=layout, hadamard=hadamard)
    width = 256 if ratio == 4 else 128  # the indexer's SW
    kv_score, ape = torch.zeros(len(args[2]), 2 * width), torch.zeros(ratio, width)
    api.compress_norm_rope_store(*args, **kwargs)
    api.save_partial_states(kv_score, ape, args[2], args[3], args[0], args[5])
    unbound = list(launches)
    (kind, config, _), (save_kind, save_config, _) = unbound
    assert (kind, config.ratio, config.layout, config.hadamard, config.pdl) == ("indexer", ratio, layout,
                                                                                  hadamard, True)
    assert (save_kind, save_config.head_dim, save_config.state_width) == ("save", 128, width)
    launches.clear()
    layer = api.bind(args[0], args[9], args[6], args[8], block_size=args[5], compress_ratio=ratio,
                     rms_norm_eps=args[7], layout=layout, hadamard=hadamard)
    per_token = (args[1], args[2], args[3], args[4], args[10])
    layer.compress_norm_rope_store(*per_token)
    layer.save_partial_states(kv_score, ape, args[2], args[3])
    assert launches == unbound
    launches.clear()
    api.save_and_compress_norm_rope_store(kv_score, ape, *args, **kwargs, pdl=False)
    assert [(k, c.pdl) for k, c, _ in launches] == [("save", False), ("indexer", False)]


def test_indexer_policy_and_pdl_reach_the_kernel(indexer_recorded):
    launches, _ = indexer_recorded
    args = _indexer_arguments(4)
    from dsv4_compressor.impl.cutedsl.variants import indexer_c4_w1, indexer_nopdl

    indexer_c4_w1.compress_norm_rope_store(*args, compress_ratio=4, layout="indexer_fp8")
    indexer_nopdl.compress_norm_rope_store(*args, compress_ratio=4, layout="indexer_fp8")
    api.compress_norm_rope_store(*args, compress_ratio=4, layout="indexer_fp8",
                                 policy=Policy().with_overrides(indexer_c4_warps=8))
    assert [(c.warps, c.pdl) for _, c, _ in launches] == [(1, True), (4, False), (8, True)]


def test_indexer_bind_and_warm_up_validate_first(indexer_recorded):
    launches, compiled = indexer_recorded
    args = _indexer_arguments(4)
    with pytest.raises(ValueError, match="layout: expected one of 'indexer_fp8', 'indexer_mxfp4' for head width 128"):
        api.bind(args[0], args[9], args[6], args[8], block_size=args[5], compress_ratio=4, rms_norm_eps=args[7])
    with pytest.raises(ValueError, match="hadamard"):
        api.bind(args[0], args[9], args[6], args[8], block_size=args[5], compress_ratio=4, rms_norm_eps=args[7],
                 layout="indexer_fp8", hadamard="yes")
    with pytest.raises(ValueError, match="hadamard"):
        api.warm_up(compress_ratio=4, block_size=16, layout="flashmla_fp8", entries_per_page=4, device="cpu",
                    hadamard=True)
    assert launches == [] and compiled == []


def test_indexer_warm_up_covers_every_call_of_a_layer(indexer_recorded, caplog):
    _, compiled = indexer_recorded
    with caplog.at_level(logging.INFO, logger="dsv4_compressor"):
        configs = api.warm_up(compress_ratio=128, block_size=8, layout="indexer_mxfp4", entries_per_page=4,
                              device="cpu", hadamard=True, pdl=False)
    assert any("indexer" in r.getMessage() for r in caplog.records)
    assert [type(c).__name__ for c in configs] == ["IndexerConfig", "SaveConfig"]
    assert (configs[0].hadamard, configs[0].pdl, configs[0].warps, configs[1].head_dim) == (True, False, 16, 128)
    args = _indexer_arguments(4, "indexer_fp8")
    layer = api.bind(args[0], args[9], args[6], args[8], block_size=args[5], compress_ratio=4, rms_norm_eps=args[7],
                     layout="indexer_fp8", hadamard=True)
    layer.warm_up()
    before = set(compiled)
    layer.compress_norm_rope_store(args[1], args[2], args[3], args[4], args[10])
    layer.save_partial_states(torch.zeros(len(args[2]), 512), torch.zeros(4, 256), args[2], args[3])
    assert set(compiled) <= before


@pytest.mark.parametrize("hadamard", [False, True])
def test_the_ops_take_the_indexer_layouts(indexer_recorded, hadamard):
    """The custom ops (eager and under ``torch.compile(fullgraph=True)``) pass the indexer
    layout and ``hadamard`` (the schema's last argument) to the same kernels as the calls."""
    launches, _ = indexer_recorded
    torch._dynamo.reset()
    args = _indexer_arguments(4, "indexer_mxfp4")
    kv_score, ape = torch.zeros(len(args[2]), 512), torch.zeros(4, 256)
    api.save_and_compress_norm_rope_store(kv_score, ape, *args, compress_ratio=4, layout="indexer_mxfp4",
                                          hadamard=hadamard)
    direct = list(launches)
    launches.clear()
    ops = torch.ops.dsv4_compressor
    ops.cutedsl_save_and_compress_norm_rope_store(kv_score, ape, *args, 4, "indexer_mxfp4", hadamard=hadamard)
    assert launches == direct and len(direct) == 2
    launches.clear()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(kv_score, ape, state, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots):
        ops.cutedsl_save_partial_states(kv_score, ape, positions, slots, state, args[5])
        ops.cutedsl_compress_norm_rope_store(state, token_req, positions, slots, table, args[5], weight, args[7],
                                             cos_sin, k_cache, kv_slots, 4, "indexer_mxfp4", hadamard=hadamard)

    step(kv_score, ape, *args[:5], args[6], args[8], args[9], args[10])
    assert [(k, c) for k, c, _ in launches] == [(k, c) for k, c, _ in direct]


def test_an_indexer_plan_restores_unit_strides_and_passes_eps(indexer_recorded, monkeypatch):
    """A one-token indexer call whose per-token arrays carry stride 2 (SPEC §9 allows any stride
    at length 1) reaches the kernel with unit strides on the same memory, and eps rounded to binary32."""
    from dsv4_compressor.impl.cutedsl.host import compile_cache

    seen = []
    monkeypatch.setitem(compile_cache.KERNELS, "indexer", lambda config, **_: lambda *a: seen.append(a))
    args = _indexer_arguments(4)
    for i in (1, 2, 3, 10):  # token_to_req_indices, positions, slot_mapping, kv_slot_mapping
        args[i] = args[i][:1].repeat_interleave(2)[::2]
        assert args[i].stride() == (2,)
    api.compress_norm_rope_store(*args, compress_ratio=4, layout="indexer_fp8")
    (launched,) = seen
    assert len(launched) == 15 and launched[9] == float(np.float32(args[7]))  # then SPEC §13's five, None
    assert launched[10:] == (None,) * 5
    for position, i in zip((1, 2, 3, 8), (1, 2, 3, 10)):
        assert launched[position].stride() == (1,) and launched[position].data_ptr() == args[i].data_ptr()


@pytest.mark.parametrize("name", ["c4_decode_boundary", "c128_decode_boundary"])
def test_compress_writes_into_the_given_out_or_a_nan_filled_one(recorded, name):
    """``compress`` hands its pooling kernel ``out`` itself (a 2-D buffer), the first ``T*512``
    elements of a flat one, or, without ``out``, a fresh NaN-filled fp32 ``[T, 512]`` that it returns."""
    launches, _ = recorded
    args, kwargs = _arguments(name)
    state, token_req, positions, slots, table, bs, _, _, _, _, kv_slots = args
    pooling = (state, token_req, positions, slots, table, bs, kv_slots)
    num_tokens = len(positions)
    rows, flat = torch.empty((num_tokens + 3, 512)), torch.empty(num_tokens * 512 + 7)
    assert api.compress(*pooling, **kwargs, out=rows) is rows
    assert api.compress(*pooling, **kwargs, out=flat) is flat
    fresh = api.compress(*pooling, **kwargs)
    assert fresh.shape == (num_tokens, 512) and fresh.dtype == torch.float32 and bool(fresh.isnan().all())
    out_index = 6  # state, token_req, positions, slots, block_table, kv_slots, out (then SPEC §13's Nones)
    assert [launched[out_index] for _, _, launched in launches] == [rows.data_ptr(), flat.data_ptr(), fresh.data_ptr()]


@pytest.mark.parametrize("hadamard", [True, 1, "yes"])
def test_warm_up_rejects_hadamard_as_the_calls_do(recorded, hadamard):
    """``warm_up`` refuses a non-bool ``hadamard``, or True outside the indexer layouts, with the calls' message."""
    launches, compiled = recorded
    args, kwargs = _arguments("c4_decode_boundary")
    with pytest.raises(ValueError, match="hadamard") as call:
        api.compress_norm_rope_store(*args, **kwargs, hadamard=hadamard)
    with pytest.raises(ValueError, match="hadamard") as warm:
        api.warm_up(compress_ratio=4, block_size=args[5], entries_per_page=args[9].shape[1], device="cpu",
                    hadamard=hadamard)
    assert str(warm.value) == str(call.value)
    assert launches == [] and compiled == []
