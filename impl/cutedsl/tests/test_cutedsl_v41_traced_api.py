"""DeepSeek-V4.1's public CuTe DSL functions under ``torch.compile(fullgraph=True)``, on CPU.

While Dynamo traces, each call (``v41_compress_norm``, ``v41_rope_quant_store``,
``v41_compress_norm_rope_store``, ``v41_index_key_store``) becomes its custom op
``torch.ops.dsv4_compressor.cutedsl_v41_*``: one node, no graph break. The compiled kernels are
:mod:`ffi_stub`'s recorders (``test_cutedsl_v41_cpu``'s fixture), so a compiled function runs here
and must make the one launch the eager call makes, with the configuration its arguments call for
(``pdl`` passed through); thread mappings other than the default (``shapes``, which the op does not
take) are refused by name; bad arguments raise the front end's ``ValueError`` when the compiled
function runs, before any launch.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor.impl.cutedsl import v41  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.v41_paths import V41Shapes  # noqa: E402
from dsv4_compressor.impl.triton.tests import v41_scenarios as S  # noqa: E402
from dsv4_compressor.spec import v41_batch as V  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402

from test_cutedsl_v41_cpu import recorded  # noqa: E402,F401  (a fixture: kernels replaced by recorders)

MIXED = [Request(3, 1), Request(8, 1), Request(0, 5), Request(9, 3)]


def _combined(case) -> dict:
    arguments = case.compress_arguments(case.latent)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=case.layout, fp8_scale=case.fp8_scale)
    return arguments


def _compress(case) -> dict:
    return case.compress_arguments(case.latent)


def _store(case) -> dict:
    return dict(latent=case.latent, positions=case.step.positions, kv_slot_mapping=case.step.kv_slot_mapping,
                cos_sin_cache=case.cos_sin, k_cache=case.k_cache, compress_ratio=case.ratio, layout=case.layout,
                fp8_scale=case.fp8_scale)


# (operation, the kernel it launches, the step's arguments)
CALLS = {
    "v41_compress_norm": ("v41_compress", lambda: _compress(S.build_case(MIXED, ratio=2, seed=21, layout=None,
                                                                          state=V.vllm_ring(0)))),
    "v41_rope_quant_store": ("v41_store", lambda: _store(S.build_case(MIXED, ratio=1, seed=22, layout="fp8_per_tensor"))),
    "v41_compress_norm_rope_store": ("v41_compress", lambda: _combined(S.build_case(MIXED, ratio=2, seed=23,
                                                                                    layout="v41_nvfp4"))),
    "v41_index_key_store": ("v41_index_key", lambda: S.index_key_arguments(
        S.build_case(MIXED, ratio=2, seed=24, layout=None), "indexer_mxfp4")),
}


def _arguments(operation: str) -> dict:
    """The operation's torch arguments (CPU tensors)."""
    return S.torch_arguments(CALLS[operation][1]())[0]


def _caller(operation: str, **options):
    function = getattr(v41, operation)

    def step(**arguments):
        function(**arguments, **options)

    return step


@pytest.mark.parametrize("operation", list(CALLS))
def test_each_function_traces_as_its_op(recorded, operation):
    launches, _ = recorded
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_caller(operation))(**_arguments(operation))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    targets = [str(node.target) for node in explained.graphs[0].graph.nodes if node.op == "call_function"]
    assert targets == [f"dsv4_compressor.cutedsl_{operation}"]
    assert [kernel for kernel, _, _ in launches] == [CALLS[operation][0]]  # explain runs the graph once: one launch


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("operation", list(CALLS))
def test_a_compiled_call_launches_what_the_eager_call_does(recorded, operation, backend):
    """One launch of the operation's kernel, with the eager call's configuration; ``pdl=False``
    reaches it through the op. Under ``eager`` the very tensors reach the kernel (aot_eager's
    functionalization may hand the op copies of the buffers it writes)."""
    launches, _ = recorded
    torch._dynamo.reset()
    arguments = _arguments(operation)
    _caller(operation, pdl=False)(**arguments)
    (kernel, config, passed), = launches
    assert kernel == CALLS[operation][0] and not config.pdl
    launches.clear()
    torch.compile(_caller(operation, pdl=False), fullgraph=True, backend=backend)(**arguments)
    (traced_kernel, traced_config, traced_passed), = launches
    assert (traced_kernel, traced_config) == (kernel, config)
    if backend == "eager":
        assert traced_passed == passed


def test_thread_mappings_other_than_the_default_are_refused_by_name(recorded):
    launches, _ = recorded
    torch._dynamo.reset()
    step = _caller("v41_compress_norm_rope_store", shapes=V41Shapes(compress_tokens_per_cta=4))
    with pytest.raises(Exception, match=r"shapes: expected the default thread mappings \(DEFAULT_V41_SHAPES\) under "
                                        r"torch.compile \(the custom op dsv4_compressor::cutedsl_v41_compress_norm_rope_"
                                        r"store takes no shapes\), got a V41Shapes"):
        torch.compile(step, fullgraph=True, backend="eager")(**_arguments("v41_compress_norm_rope_store"))
    assert launches == []
    torch._dynamo.reset()
    default = _caller("v41_index_key_store", shapes=V41Shapes())  # equal to the default: accepted
    torch.compile(default, fullgraph=True, backend="eager")(**_arguments("v41_index_key_store"))
    assert len(launches) == 1


@pytest.mark.parametrize("operation, change, message", [
    ("v41_compress_norm_rope_store", dict(layout="indexer_fp8"), "layout: expected one of"),
    ("v41_compress_norm", dict(ape=torch.zeros(2, 512)), "ape: expected None"),
    ("v41_index_key_store", dict(compress_ratio=4), "compress_ratio: expected one of (1, 2)"),
])
def test_bad_arguments_raise_the_front_ends_message_when_the_compiled_function_runs(recorded, operation, change,
                                                                                     message):
    launches, compiled = recorded
    torch._dynamo.reset()
    arguments = dict(_arguments(operation), **change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        torch.compile(_caller(operation), fullgraph=True, backend="eager")(**arguments)
    assert launches == [] and compiled == []
