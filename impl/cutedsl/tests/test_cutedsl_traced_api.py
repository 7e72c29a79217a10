"""The public CuTe DSL functions under ``torch.compile(fullgraph=True)``, on CPU.

While Dynamo traces, each public call (``save_partial_states``, ``compress_norm_rope_store``,
``save_and_compress_norm_rope_store``, ``compress``, and the named variants through them)
becomes its custom op ``torch.ops.dsv4_compressor.cutedsl_*``: one node each, no graph break.
The kernels are replaced by recorders (``test_cutedsl_host``'s fixture), so a compiled step
runs here and must launch exactly what the eager calls launch, with the keyword options
passed through; an option the op cannot take (a policy other than the default, ``out``) is
refused by name; bad arguments raise the front end's ``ValueError`` when the step runs, before
any launch, and eagerly as before.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is first imported (the PTX tests' target)
pytest.importorskip("cutlass")

from dsv4_compressor.impl.cutedsl import api, variants  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY  # noqa: E402

from test_cutedsl_host import recorded  # noqa: E402,F401  (a fixture: kernels replaced by recorders)
from test_cutedsl_launch_plans import _arguments  # noqa: E402


def _step_inputs():
    """A C128 decode step's arguments, its save inputs and a workspace (CPU tensors)."""
    args, _ = _arguments("c128_decode_boundary")
    tokens = len(args[2])
    return args, torch.zeros(tokens, 1024), torch.zeros(128, 512), torch.empty(tokens, 512)


def step(args, kv_score, ape, workspace):
    """Every public function once, with keyword options the ops take."""
    state, token_req, positions, slots, table, bs, weight, eps, cos_sin, k_cache, kv_slots = args
    api.save_partial_states(kv_score, ape, positions, slots, state, bs, pdl=False)
    api.compress_norm_rope_store(*args, compress_ratio=128, workspace=workspace, c128_path="fused_handoff", pdl=False)
    api.save_and_compress_norm_rope_store(kv_score, ape, *args, compress_ratio=128, c128_path="split_block8",
                                          workspace=workspace, policy=DEFAULT_POLICY)
    variants.fused_cluster.compress_norm_rope_store(*args, compress_ratio=128, layout="flashmla_fp8")
    return api.compress(state, token_req, positions, slots, table, bs, kv_slots, compress_ratio=128,
                        c128_path="split_generic")


def test_public_functions_trace_as_one_op_each(recorded):
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(*_step_inputs())
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = [str(node.target) for node in explained.graphs[0].graph.nodes if node.op == "call_function"]
    assert ops == [f"dsv4_compressor.cutedsl_{name}" for name in (
        "save_partial_states", "compress_norm_rope_store", "save_and_compress_norm_rope_store",
        "compress_norm_rope_store", "compress")]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_fullgraph_compiled_step_launches_what_the_eager_calls_do(recorded, backend):
    launches, _ = recorded
    torch._dynamo.reset()
    inputs = _step_inputs()
    x = step(*inputs)
    eager = [(kind, config) for kind, config, _ in launches]
    assert [kind for kind, _ in eager] == ["save", "fused_handoff", "save", "split_pool", "split_store",
                                           "fused_cluster", "split_pool"]
    assert not eager[0][1].pdl and not eager[1][1].pool.pdl  # pdl=False reached the kernels
    launches.clear()
    traced = torch.compile(step, fullgraph=True, backend=backend)(*inputs)
    assert [(kind, config) for kind, config, _ in launches] == eager
    assert traced.shape == x.shape == (len(inputs[0][2]), 512) and traced.dtype == torch.float32


TUNED = DEFAULT_POLICY.with_overrides(handoff_max_tokens=8)


@pytest.mark.parametrize("call, message", [
    (lambda args: api.compress_norm_rope_store(*args, compress_ratio=128, policy=TUNED),
     r"policy: expected the default policy \(DEFAULT_POLICY\) under torch.compile \(the custom op "
     r"dsv4_compressor::cutedsl_compress_norm_rope_store takes no policy\), got a Policy"),
    (lambda args: variants.cluster16.compress_norm_rope_store(*args, compress_ratio=128), r"policy: expected the default"),
    (lambda args: api.compress(*args[:6], args[10], compress_ratio=128, out=torch.empty(len(args[2]), 512)),
     r"out: expected None under torch.compile \(the custom op dsv4_compressor::cutedsl_compress takes no out\), "
     r"got a Tensor"),
])
def test_an_option_the_op_cannot_take_is_refused_by_name(recorded, call, message):
    launches, _ = recorded
    torch._dynamo.reset()
    args = _step_inputs()[0]
    with pytest.raises(Exception, match=message):  # Dynamo's error, quoting the ValueError
        torch.compile(call, fullgraph=True, backend="eager")(args)
    assert launches == []


def test_bad_arguments_raise_the_front_ends_message_eagerly_and_when_the_step_runs(recorded):
    launches, _ = recorded
    torch._dynamo.reset()
    args, kv_score, _, workspace = _step_inputs()
    bad_ape = torch.zeros(128, 256)  # the wrong width: the front end names ape
    with pytest.raises(ValueError, match="ape"):
        step(args, kv_score, bad_ape, workspace)
    assert launches == []
    with pytest.raises(ValueError, match="ape"):
        torch.compile(step, fullgraph=True, backend="eager")(args, kv_score, bad_ape, workspace)
    assert launches == []


# ---- SPEC §13's state formats: the ops take ape, ape_at and ring_capacity ---------------------------------
def _formatted_inputs(ratio: int):
    """A C4 or C128 step on a bf16 ring state with ``ape`` added at the compress (CPU tensors)."""
    from test_cutedsl_state_formats_cpu import _call

    args, kwargs, _ = _call(ratio, bf16=True, ape_at="compress", ring={4: 8, 128: 128}[ratio])
    sw = args[0].shape[2] // 2
    return args, kwargs, torch.zeros(len(args[2]), 2 * sw)


def formatted_step(args, kwargs, kv_score):
    """The save, the compress and both back to back, each with SPEC §13's options."""
    state, token_req, positions, slots, table, bs = args[:6]
    options = dict(ape_at=kwargs["ape_at"], ring_capacity=kwargs["ring_capacity"])
    api.save_partial_states(kv_score, None, positions, slots, state, bs, **options)
    api.compress_norm_rope_store(*args, **kwargs)
    both = {name: value for name, value in kwargs.items() if name != "ape"}  # ape: the save's positional one
    api.save_and_compress_norm_rope_store(kv_score, kwargs["ape"], *args, **both)


@pytest.mark.parametrize("ratio", [4, 128])
def test_a_fullgraph_compiled_formatted_step_launches_what_the_eager_calls_do(recorded, ratio):
    launches, _ = recorded
    torch._dynamo.reset()
    args, kwargs, kv_score = _formatted_inputs(ratio)
    formatted_step(args, kwargs, kv_score)
    eager = list(launches)
    assert [kind for kind, _, _ in eager] == {4: ["save", "c4", "save", "c4"],
                                              128: ["save", "split_pool", "split_store", "save", "split_pool",
                                                    "split_store"]}[ratio]
    for kind, config, call in eager:  # the options reached the kernels (the save's state has no ring)
        if kind != "split_store":
            assert (config.state.dtype, config.state.ape_at, config.state.ring) == ("bfloat16", "compress",
                                                                                    kind != "save"), kind
        if kind in ("c4", "split_pool"):
            ape, ring_capacity = call[-5:-3]  # then the step call's kv, score and query_start_loc: None
            assert ring_capacity == kwargs["ring_capacity"] and ape is not None and call[-3:] == (None,) * 3
    launches.clear()
    explained = torch._dynamo.explain(formatted_step)(args, kwargs, kv_score)
    assert explained.graph_break_count == 0
    launches.clear()
    torch.compile(formatted_step, fullgraph=True, backend="aot_eager")(args, kwargs, kv_score)
    # aot_eager may hand a mutated tensor's copy to the op: compare all but the pointers
    def scalars(records):  # the save's: whether it got an ape; the compress kernels': ring_capacity
        return [(kind, config, len(call), call[1] is None if kind == "save" else call[-1])
                for kind, config, call in records]

    assert scalars(launches) == scalars(eager)
