"""DeepSeek-V4.1's public Triton functions under ``torch.compile(fullgraph=True)``: while Dynamo traces,
each call (``v41_compress_norm``, ``v41_rope_quant_store``, ``v41_compress_norm_rope_store``,
``v41_index_key_store``) becomes its custom op ``torch.ops.dsv4_compressor.triton_v41_*``, one node
and no graph break, and the compiled function writes the spec's bytes (CPU tensors under the
interpreter; CUDA tensors on a GPU). Bad arguments still raise the front end's ``ValueError`` when
the compiled function runs, with nothing written."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.impl import triton as T
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request

from v41_scenarios import assert_identical, build_case, index_key_arguments, run_both, torch_arguments, written

BACKEND = "inductor" if torch.cuda.is_available() else "aot_eager"  # aot_eager: the ops' fake implementations too
MIXED = [Request(3, 1), Request(9, 3), Request(0, 2)]


def _compiled(function):
    """A ``torch.compile(fullgraph=True)`` function calling the public ``function`` with keyword arguments."""

    def step(**arguments):
        function(**arguments)

    return torch.compile(step, fullgraph=True, backend=BACKEND)


def _calls(function, arguments: dict) -> list[str]:
    """The call targets of the one graph Dynamo traces from a function calling ``function`` (no break)."""

    def step(**a):
        function(**a)

    explained = torch._dynamo.explain(step)(**torch_arguments(arguments)[0])
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    return [str(node.target) for node in explained.graphs[0].graph.nodes if node.op == "call_function"]


def _combined_arguments(case, latent: bool) -> dict:
    arguments = case.compress_arguments(case.latent if latent else None)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=case.layout, fp8_scale=case.fp8_scale)
    return arguments


@pytest.mark.parametrize("ratio, layout, latent", [(2, "v41_nvfp4", True), (1, "fp8_per_tensor", False)])
def test_the_combined_call_traces_as_its_op_and_writes_the_spec_bytes(ratio, layout, latent):
    torch._dynamo.reset()
    case = build_case(MIXED, ratio=ratio, seed=1, state=V.vllm_ring(0), layout=layout, bf16_inputs=True,
                      bf16_state=True)
    arguments = _combined_arguments(case, latent)
    assert _calls(T.v41_compress_norm_rope_store, arguments) == ["dsv4_compressor.triton_v41_compress_norm_rope_store"]
    results = run_both(spec.v41_compress_norm_rope_store, _compiled(T.v41_compress_norm_rope_store), arguments,
                       ("latent", "state_cache", "k_cache"))
    written(results)
    assert_identical(results)


@pytest.mark.parametrize("ratio", [1, 2])
def test_compress_norm_then_store_trace_as_their_ops_and_write_the_spec_bytes(ratio):
    """The two-call path, positional arguments as a caller writes them: the latent the first call
    writes is the second's input, both inside one compiled function."""
    torch._dynamo.reset()
    case = build_case([Request(5, 2), Request(0, 4)], ratio=ratio, seed=2, layout="v41_mxfp8")
    arguments = _combined_arguments(case, latent=True)
    arguments.pop("fp8_scale")
    names = ("kv", "score", "positions", "token_to_req", "query_start_loc", "slot_mapping", "save_slot_mapping",
             "block_table", "bs", "state_cache", "rms_norm_weight", "rms_norm_eps", "kv_slot_mapping", "latent")

    def two_calls(**a):
        T.v41_compress_norm(*(a[name] for name in names), compress_ratio=ratio, ring_capacity=a["ring_capacity"])
        T.v41_rope_quant_store(a["latent"], a["positions"], a["kv_slot_mapping"], a["cos_sin_cache"], a["k_cache"],
                               compress_ratio=ratio, layout=a["layout"])

    explained = torch._dynamo.explain(two_calls)(**torch_arguments(arguments)[0])
    assert explained.graph_break_count == 0
    assert [str(n.target) for n in explained.graphs[0].graph.nodes if n.op == "call_function"] == [
        "dsv4_compressor.triton_v41_compress_norm", "dsv4_compressor.triton_v41_rope_quant_store"]

    def spec_two_calls(**a):
        store = ("cos_sin_cache", "k_cache", "layout")
        spec.v41_compress_norm(**{k: v for k, v in a.items() if k not in store})
        spec.v41_rope_quant_store(a["latent"], a["positions"], a["kv_slot_mapping"], a["cos_sin_cache"], a["k_cache"],
                                  compress_ratio=ratio, layout=a["layout"])

    results = run_both(spec_two_calls, torch.compile(two_calls, fullgraph=True, backend=BACKEND), arguments,
                       ("latent", "state_cache", "k_cache"))
    written(results)
    assert_identical(results)


@pytest.mark.parametrize("layout", ["indexer_fp8", "indexer_mxfp4"])
def test_the_index_key_call_traces_as_its_op_and_writes_the_spec_bytes(layout):
    torch._dynamo.reset()
    case = build_case([Request(3, 1), Request(0, 4)], ratio=2, seed=3, layout=None)
    arguments = index_key_arguments(case, layout)
    assert _calls(T.v41_index_key_store, arguments) == ["dsv4_compressor.triton_v41_index_key_store"]
    results = run_both(spec.v41_index_key_store, _compiled(T.v41_index_key_store), arguments, ("k_cache",))
    written(results)
    assert_identical(results)


@pytest.mark.parametrize("operation, change, message", [
    ("v41_compress_norm_rope_store", dict(compress_ratio=4), "compress_ratio: expected one of (1, 2)"),
    ("v41_compress_norm", dict(ape=torch.zeros(2, 512)), "ape: expected None"),
])
def test_bad_arguments_raise_the_front_ends_message_when_the_compiled_function_runs(operation, change, message):
    torch._dynamo.reset()
    case = build_case([Request(3, 1)], ratio=2, seed=4, layout="v41_nvfp4")
    arguments = _combined_arguments(case, latent=True) if operation == "v41_compress_norm_rope_store" else \
        case.compress_arguments(case.latent)
    torch_args, owners = torch_arguments(arguments)
    torch_args.update(change)
    before = {name: owner.clone() for name, owner in owners.items()}
    function = getattr(T, operation)

    def step(**a):
        function(**a)

    with pytest.raises(ValueError, match=re.escape(message)):
        torch.compile(step, fullgraph=True, backend="eager")(**torch_args)
    for name, owner in owners.items():
        assert np.array_equal(owner.cpu().numpy(), before[name].cpu().numpy()), f"{name} was written"
