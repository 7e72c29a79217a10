"""CPU checks of DeepSeek-V4.1's CuTe DSL host (SPEC §14.7-§14.8): no GPU, no launch.

The compiled kernels are replaced by :mod:`ffi_stub`'s stand-ins, built from the real compile
functions' fake tensors: a call passes TVM-FFI's checks (dtypes, ranks, static extents, one
``T``, base alignments, ``None`` where the kernel was compiled without an argument) and is
recorded. What is checked: each operation is one launch of its kernel with the static
configuration its arguments call for, the arguments in the kernel's order; SPEC §14.8's errors
come before anything is compiled or launched and leave every buffer as it was; plans are kept
by argument layout; ``v41_warm_up`` compiles what a layer's calls launch; the custom ops reach
the same launches. The kernels' own bytes are checked on a GPU (``test_cutedsl_v41_gpu``); their
PTX by ``test_cutedsl_cpu`` (every variant of :mod:`dsv4_compressor.impl.cutedsl.v41_ptx`) and
here (the divisions NVFP4 needs).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor.impl.cutedsl import v41  # noqa: E402
from dsv4_compressor.impl.cutedsl.host.v41_paths import V41Shapes  # noqa: E402
from dsv4_compressor.impl.cutedsl.v41_config import V41CompressConfig, V41RecordFormat  # noqa: E402
from dsv4_compressor.impl.triton.tests import v41_scenarios as S  # noqa: E402
from dsv4_compressor.spec import v41_batch as V  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402
from ffi_stub import stubbed_calls  # noqa: E402

MIXED = [Request(3, 1), Request(8, 1), Request(0, 5), Request(9, 3)]
RECORDS = ("flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4")


@pytest.fixture
def recorded(monkeypatch):
    """``(launches, compiled)``: every accepted kernel call as ``(kernel, config, arguments)`` and
    every compile request as ``(kernel, config)``."""
    return stubbed_calls(monkeypatch, v41)


def _combined_arguments(case: S.V41Case, latent: bool = True) -> dict:
    arguments = case.compress_arguments(case.latent if latent else None)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=case.layout, fp8_scale=case.fp8_scale)
    return S.torch_arguments(arguments)[0]


def _pointer(value):
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


def _snapshot(arguments: dict) -> dict:
    return {name: value.clone() for name, value in arguments.items() if isinstance(value, torch.Tensor)}


def _unchanged(arguments: dict, before: dict) -> bool:
    return all(torch.equal(arguments[name].view(torch.uint8) if arguments[name].dtype in (torch.bfloat16,
                                                                                           torch.float8_e4m3fn)
                           else arguments[name], before[name].view(torch.uint8) if before[name].dtype in
                           (torch.bfloat16, torch.float8_e4m3fn) else before[name]) for name in before)


# ---- one launch, the configuration the arguments call for, the kernel's argument order -----------------
@pytest.mark.parametrize("layout", RECORDS)
@pytest.mark.parametrize("ratio", [1, 2])
def test_the_combined_call_is_one_launch_of_the_compress_kernel(recorded, ratio, layout):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=ratio, seed=1, layout=layout, entries_per_page=2, bf16_inputs=ratio == 1)
    arguments = _combined_arguments(case)
    v41.v41_compress_norm_rope_store(**arguments)
    assert len(launches) == 1
    kernel, config, passed = launches[0]
    assert kernel == "v41_compress" and config.ratio == ratio and config.latent
    assert config.record == V41RecordFormat(layout, 2, 8 if layout == "bf16" else 4 if layout == "fp8_per_tensor" else 16)
    assert config.kv_dtype == ("bfloat16" if ratio == 1 else "float32")
    a = arguments
    state = ((a["token_to_req"], a["slot_mapping"], a["save_slot_mapping"], a["query_start_loc"], a["state_cache"],
              a["block_table"]) if ratio == 2 else (None,) * 6)
    expected = (a["kv"], a["score"], a["positions"], a["kv_slot_mapping"], *state, a["rms_norm_weight"], a["latent"],
                a["cos_sin_cache"], a["k_cache"])
    assert passed[:len(expected)] == tuple(_pointer(t) for t in expected)
    eps, fp8_inv, ring_capacity = passed[len(expected):]
    assert eps == float(np.float32(S.EPS))
    assert fp8_inv == (float(np.float32(1) / np.float32(case.fp8_scale)) if layout == "fp8_per_tensor" else 1.0)
    assert ring_capacity == 0  # paged


@pytest.mark.parametrize("state, bf16_state, inputs", [
    ("paged", False, "fp32"), ("reference_ring", True, "bf16"), ("vllm_ring", False, "kv_fp32_score_bf16"),
    ("paged", True, "fp32")])
def test_ratio2_state_options_choose_the_kernel(recorded, state, bf16_state, inputs):
    """The state's dtype, ``bs`` and addressing, ``kv``'s and ``score``'s dtypes are the compress
    kernel's compile-time options; ``ring_capacity`` its scalar."""
    launches, _ = recorded
    layout_state = {"paged": V.paged(4), "reference_ring": V.reference_ring(), "vllm_ring": V.vllm_ring(3)}[state]
    case = S.build_case(MIXED, ratio=2, seed=2, state=layout_state, bf16_state=bf16_state,
                        bf16_inputs=inputs == "bf16", bf16_score=inputs != "fp32", layout="v41_nvfp4")
    v41.v41_compress_norm_rope_store(**_combined_arguments(case))
    (_, config, passed), = launches
    assert config == V41CompressConfig(
        2, "bfloat16" if inputs == "bf16" else "float32", "float32", True, V41RecordFormat("v41_nvfp4", 4),
        "float32" if inputs == "fp32" else "bfloat16", "bfloat16" if bf16_state else "float32",
        layout_state.block_size, layout_state.ring_capacity is not None, 1, True, V41Shapes().ratio2_ctas_per_sm)
    assert passed[-1] == (layout_state.ring_capacity or 0)


def test_without_a_latent_the_kernel_is_compiled_and_called_without_one(recorded):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=2, seed=3, layout="v41_mxfp8")
    v41.v41_compress_norm_rope_store(**_combined_arguments(case, latent=False))
    (_, config, passed), = launches
    assert not config.latent and passed[11] is None


@pytest.mark.parametrize("ratio", [1, 2])
def test_compress_norm_is_the_compress_kernel_without_a_record(recorded, ratio):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=ratio, seed=4, layout=None, state=V.vllm_ring(0))
    arguments = S.torch_arguments(case.compress_arguments(case.latent))[0]
    v41.v41_compress_norm(**arguments)
    (kernel, config, passed), = launches
    assert kernel == "v41_compress" and config.record is None and config.latent
    assert passed[12:14] == (None, None)  # no cos/sin cache, no k_cache
    assert passed[-1] == (8 if ratio == 2 else 0)  # vllm_ring(0): C = 8


@pytest.mark.parametrize("layout, align", [("bf16", 2), ("fp8_per_tensor", 1), ("v41_nvfp4", 16)])
def test_rope_quant_store_takes_the_rows_alignment_of_its_cache(recorded, layout, align):
    """Rows of ``bf16`` / ``fp8_per_tensor`` caches may have any strides: an odd entry stride makes
    the kernel store element by element (the record layouts' pages are always 16-byte aligned)."""
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=2, seed=5, layout=layout, entries_per_page=3)
    latent = torch.zeros((case.step.num_tokens, 512), dtype=torch.bfloat16)
    k_cache = torch.from_numpy(case.k_cache.copy())
    if layout in ("bf16", "fp8_per_tensor"):  # entries 513 elements apart
        dtype = torch.bfloat16 if layout == "bf16" else torch.float8_e4m3fn
        pages = case.tables.num_pages
        k_cache = torch.zeros((pages, 3, 513), dtype=dtype)[:, :, :512]
    v41.v41_rope_quant_store(latent, torch.from_numpy(case.step.positions), torch.from_numpy(case.step.kv_slot_mapping),
                             torch.from_numpy(case.cos_sin), k_cache, compress_ratio=2, layout=layout,
                             fp8_scale=0.5 if layout == "fp8_per_tensor" else None)
    (kernel, config, passed), = launches
    assert kernel == "v41_store" and config.record == V41RecordFormat(layout, 3, align)
    assert passed[-1] == (2.0 if layout == "fp8_per_tensor" else 1.0)


@pytest.mark.parametrize("layout, weight", [("indexer_fp8", torch.bfloat16), ("indexer_mxfp4", torch.float32)])
def test_index_key_store_launches_its_kernel(recorded, layout, weight):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=1, seed=6, layout=None)
    arguments = S.torch_arguments(S.index_key_arguments(case, layout, bf16_weight=weight == torch.bfloat16,
                                                        k_pre_row_pad=3))[0]
    v41.v41_index_key_store(**arguments)
    (kernel, config, passed), = launches
    assert kernel == "v41_index_key" and config.layout == layout and config.weight_dtype == str(weight)[6:]
    assert passed[0] == arguments["k_pre"].data_ptr() and passed[-1] == float(np.float32(S.EPS))


def test_thread_mappings_and_pdl_reach_the_configurations(recorded):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=1, seed=7, layout="v41_nvfp4")
    v41.v41_compress_norm_rope_store(**_combined_arguments(case), pdl=False,
                                     shapes=V41Shapes(compress_tokens_per_cta=4))
    (_, config, _), = launches
    assert config.tokens_per_cta == 4 and not config.pdl


# ---- plans --------------------------------------------------------------------------------------------
def test_a_repeated_call_reuses_its_plan(recorded, monkeypatch):
    """The second call with the same argument layout is validated no more and compiles nothing; a
    call with another layout (here a bf16 state) builds its own plan."""
    launches, compiled = recorded
    case = S.build_case(MIXED, ratio=2, seed=8, layout="v41_nvfp4")
    arguments = _combined_arguments(case)
    v41.v41_compress_norm_rope_store(**arguments)
    validations = []
    monkeypatch.setattr(v41, "validate_v41_compress_norm_rope_store",
                        lambda *a, **k: validations.append(1) or pytest.fail("validated again"))
    v41.v41_compress_norm_rope_store(**arguments)
    assert len(launches) == 2 and launches[0][2] == launches[1][2] and len(compiled) == 1 and not validations
    bf16_state = dict(arguments, state_cache=arguments["state_cache"].to(torch.bfloat16))
    with pytest.raises(pytest.fail.Exception, match="validated again"):
        v41.v41_compress_norm_rope_store(**bf16_state)


@pytest.mark.parametrize("operation", ["v41_compress_norm", "v41_rope_quant_store", "v41_index_key_store"])
def test_no_tokens_launch_nothing(recorded, operation):
    launches, compiled = recorded
    empty = torch.zeros(0, dtype=torch.int64)
    latent = torch.zeros((0, 512), dtype=torch.bfloat16)
    cos_sin = torch.zeros((4, 64))
    if operation == "v41_compress_norm":
        v41.v41_compress_norm(torch.zeros((0, 512)), None, empty, None, None, None, None, None, None, None,
                              torch.ones(512), 1e-6, empty, latent, compress_ratio=1)
    elif operation == "v41_rope_quant_store":
        v41.v41_rope_quant_store(latent, empty, empty, cos_sin, torch.zeros((1, 2, 288), dtype=torch.uint8),
                                 compress_ratio=2, layout="v41_nvfp4")
    else:
        v41.v41_index_key_store(torch.zeros((0, 128), dtype=torch.bfloat16), empty, empty, torch.ones(128), 1e-6, cos_sin,
                                torch.zeros((1, 2, 68), dtype=torch.uint8), compress_ratio=1, layout="indexer_mxfp4")
    assert launches == [] and compiled == []


# ---- SPEC §14.8: errors before any compile or launch, nothing written ------------------------------------
def _spoil(name: str):
    """A change to the combined call's arguments that SPEC §14.8 rejects, naming ``name``."""
    return {
        "ape": lambda a: dict(a, ape=torch.zeros((2, 512))),
        "score": lambda a: dict(a, score=a["kv"].clone()),  # ratio 1 takes no score
        "latent": lambda a: dict(a, latent=a["latent"].to(torch.float32)),
        "kv": lambda a: dict(a, kv=a["kv"].to(torch.float16)),
        "layout": lambda a: dict(a, layout="indexer_fp8"),
        "compress_ratio": lambda a: dict(a, compress_ratio=4),
        "fp8_scale": lambda a: dict(a, fp8_scale=0.5),  # a layout with no per-tensor scale
        "k_cache": lambda a: dict(a, k_cache=a["k_cache"][:, :, :100]),
    }[name]


@pytest.mark.parametrize("name", ["ape", "score", "latent", "kv", "layout", "compress_ratio", "fp8_scale", "k_cache"])
def test_errors_come_before_any_compile_or_launch(recorded, name):
    launches, compiled = recorded
    case = S.build_case(MIXED, ratio=1, seed=9, layout="v41_nvfp4")
    arguments = _spoil(name)(_combined_arguments(case))
    before = _snapshot(arguments)
    with pytest.raises(ValueError, match=name):
        v41.v41_compress_norm_rope_store(**arguments)
    assert launches == [] and compiled == [] and _unchanged(arguments, before)


def test_ratio2_state_errors_come_before_any_launch(recorded):
    launches, compiled = recorded
    case = S.build_case(MIXED, ratio=2, seed=10, layout="v41_nvfp4", state=V.paged(4))
    arguments = _combined_arguments(case)
    for change, needle in ((dict(ring_capacity=1), "ring_capacity"), (dict(ring_capacity=6), "ring_capacity"),
                           (dict(state_cache=arguments["state_cache"].to(torch.float16)), "state_cache"),
                           (dict(save_slot_mapping=None), "save_slot_mapping"), (dict(bs=3), "bs|block_size")):
        spoiled = dict(arguments, **change)
        before = _snapshot(spoiled)
        with pytest.raises(ValueError, match=needle):
            v41.v41_compress_norm_rope_store(**spoiled)
        assert _unchanged(spoiled, before)
    assert launches == [] and compiled == []


def test_debug_checks_the_callers_contract_before_the_launch(recorded):
    """``debug=True``: two storing tokens naming one cache slot is the caller's error (SPEC §9)."""
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=1, seed=11, layout="v41_nvfp4")
    arguments = _combined_arguments(case)
    slots = arguments["kv_slot_mapping"]
    stores = torch.nonzero(slots >= 0).flatten()
    slots[stores[1]] = slots[stores[0]]
    v41.v41_compress_norm_rope_store(**arguments)  # not checked without debug
    with pytest.raises(ValueError, match="more than one token"):
        v41.v41_compress_norm_rope_store(**arguments, debug=True)
    assert len(launches) == 1


def test_index_key_layout_must_be_an_indexer_record(recorded):
    launches, compiled = recorded
    case = S.build_case(MIXED, ratio=2, seed=12, layout=None)
    arguments = S.torch_arguments(S.index_key_arguments(case, "indexer_fp8"))[0]
    with pytest.raises(ValueError, match="layout"):
        v41.v41_index_key_store(**dict(arguments, layout="v41_mxfp8"))
    assert launches == [] and compiled == []


@pytest.mark.parametrize("change, needle", [(dict(pdl=1), "pdl"), (dict(shapes=(1, 1, 4)), "shapes"),
                                           (dict(shapes=V41Shapes(compress_tokens_per_cta=3)), "tokens_per_cta")])
def test_bad_choices_are_refused_by_name(recorded, change, needle):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=1, seed=13, layout="bf16")
    with pytest.raises(ValueError, match=needle):
        v41.v41_compress_norm_rope_store(**_combined_arguments(case), **change)
    assert launches == []


# ---- warm-up, custom ops ----------------------------------------------------------------------------------
def test_warm_up_compiles_what_the_calls_launch(recorded):
    launches, compiled = recorded
    configs = v41.v41_warm_up(compress_ratio=2, layout="v41_nvfp4", entries_per_page=4, block_size=4,
                              kv_dtype=torch.float32, weight_dtype=torch.bfloat16, index_key_layout="indexer_mxfp4",
                              index_weight_dtype=torch.bfloat16)
    assert [kernel for kernel, _ in compiled] == ["v41_compress", "v41_index_key"] and launches == []
    case = S.build_case(MIXED, ratio=2, seed=14, layout="v41_nvfp4", bf16_weight=True)
    v41.v41_compress_norm_rope_store(**_combined_arguments(case))
    index = S.torch_arguments(S.index_key_arguments(case, "indexer_mxfp4", bf16_weight=True))[0]
    index["k_cache"] = torch.zeros((2, 4, 68), dtype=torch.uint8)
    v41.v41_index_key_store(**index)
    assert [config for _, config, _ in launches] == configs


def test_warm_up_of_a_split_layer(recorded):
    _, compiled = recorded
    configs = v41.v41_warm_up(compress_ratio=1, layout="bf16", entries_per_page=64, split=True)
    assert [kernel for kernel, _ in compiled] == ["v41_compress", "v41_store"]
    assert configs[0].record is None and configs[1].record == V41RecordFormat("bf16", 64, 8)
    with pytest.raises(ValueError, match="compress_ratio"):
        v41.v41_warm_up(compress_ratio=4, layout=None, entries_per_page=1)


def test_the_custom_ops_launch_what_the_functions_do(recorded):
    launches, _ = recorded
    case = S.build_case(MIXED, ratio=2, seed=15, layout="v41_mxfp8")
    arguments = _combined_arguments(case)
    v41.v41_compress_norm_rope_store(**arguments)
    torch.ops.dsv4_compressor.cutedsl_v41_compress_norm_rope_store(**arguments)
    assert len(launches) == 2 and launches[0][1:] == launches[1][1:]
    with pytest.raises(ValueError, match="ape"):
        torch.ops.dsv4_compressor.cutedsl_v41_compress_norm_rope_store(**dict(arguments, ape=torch.zeros((2, 512))))


# ---- PTX: what only the V4.1 kernels must show ----------------------------------------------------------
def test_nvfp4_records_divide_and_the_ratio2_softmax_divides():
    """SPEC §14.5: ``v41_nvfp4`` divides (``div.rn``: one for sigma, one per channel a thread), a
    rounded reciprocal would change codes; ratio 2 normalizes its two weights by division (two per
    channel), and the norm's ``rr`` is one more."""
    from dsv4_compressor.impl.cutedsl import v41_ptx
    from dsv4_compressor.impl.cutedsl.ptx import compile_variant

    counts = {}
    for kernel, config in v41_ptx.kernel_configs():
        if kernel != "v41_index_key" and getattr(config, "tokens_per_cta", 1) == 1:
            counts[(kernel, getattr(config, "ratio"), config.record.layout if config.record else None)] = \
                compile_variant(kernel, config).__ptx__.count("div.rn.f32")
    assert counts[("v41_store", 1, "v41_nvfp4")] == 1 + 4 and counts[("v41_store", 1, "v41_mxfp8")] == 0
    assert counts[("v41_compress", 1, "v41_nvfp4")] == 1 + 1 + 4 and counts[("v41_compress", 1, None)] == 1
    assert counts[("v41_compress", 2, None)] == 2 * 4 + 1


# ---- the declaration -----------------------------------------------------------------------------------------
def test_every_declared_option_is_one_launch(recorded):
    """The family's DeepSeek-V4.1 declaration in the conformance suite (every ratio with every
    layout, every projection and state dtype, rings, no latent and both index-key layouts) names
    calls the host takes, one launch each."""
    from dsv4_compressor.conformance.implementations import BUILTIN_CAPABILITIES
    from dsv4_compressor.spec.entry_layout import V41_INDEX_KEY_LAYOUTS, V41_STORE_LAYOUTS

    declared = BUILTIN_CAPABILITIES["cutedsl"].v41
    layouts = declared.layouts or V41_STORE_LAYOUTS + V41_INDEX_KEY_LAYOUTS
    launches, _ = recorded
    calls = 0
    for ratio in declared.ratios:
        for layout in [name for name in layouts if name in V41_STORE_LAYOUTS]:
            v41.v41_compress_norm_rope_store(**_combined_arguments(S.build_case(MIXED, ratio=ratio, seed=20,
                                                                                layout=layout)))
            calls += 1
        for index_layout in [name for name in layouts if name in V41_INDEX_KEY_LAYOUTS]:
            case = S.build_case(MIXED, ratio=ratio, seed=21, layout=None)
            v41.v41_index_key_store(**S.torch_arguments(S.index_key_arguments(case, index_layout))[0])
            calls += 1
    states = {False: V.paged(4), True: V.vllm_ring(0)} if declared.ring_state else {False: V.paged(4)}
    for state_dtype in declared.state_dtypes:
        for kv_dtype in declared.input_dtypes:
            for ring, state in states.items():
                case = S.build_case(MIXED, ratio=2, seed=22, layout="v41_nvfp4", state=state,
                                    bf16_state=state_dtype == "bf16", bf16_inputs=kv_dtype == "bf16")
                v41.v41_compress_norm_rope_store(**_combined_arguments(case, latent=False))
                calls += 1
    rings = {config.ring for kernel, config, _ in launches if kernel == "v41_compress" and config.ratio == 2}
    assert len(launches) == calls and rings == {False, True}


def test_the_launch_bound_reaches_the_ptx():
    """A compress configuration's ``ctas_per_sm=n``: the kernel's ``.minnctapersm n`` (ptxas then caps
    its registers so that n CTAs fit an SM); without it, no bound. Out-of-range counts are refused."""
    from dsv4_compressor.impl.cutedsl.ptx import compile_variant

    base = V41CompressConfig(2, "float32", "float32", True, V41RecordFormat("v41_nvfp4", 64), "float32", "float32", 8,
                             False, 1, True)
    bounded = V41CompressConfig(**{**base.__dict__, "ctas_per_sm": 10})
    assert ".minnctapersm 10" in compile_variant("v41_compress", bounded).__ptx__
    assert ".minnctapersm" not in compile_variant("v41_compress", base).__ptx__
    assert bounded.tag == base.tag + "_occ10"
    for wrong in (0, 17, 2.5, True):
        with pytest.raises(ValueError, match="ctas_per_sm"):
            V41CompressConfig(**{**base.__dict__, "ctas_per_sm": wrong})


def test_only_ratio2_is_bounded_ten_ctas_an_sm_by_default(recorded):
    """``V41Shapes(ratio2_ctas_per_sm=n)`` bounds the ratio-2 compress kernel (10 by default, None:
    unbounded); ratio 1's kernel, at 32 registers, is never bounded."""
    launches, _ = recorded
    for ratio, shapes, expected in ((2, V41Shapes(), 10), (2, V41Shapes(ratio2_ctas_per_sm=None), None),
                                    (2, V41Shapes(ratio2_ctas_per_sm=8), 8), (1, V41Shapes(ratio2_ctas_per_sm=8), None)):
        case = S.build_case(MIXED, ratio=ratio, seed=5, layout="v41_mxfp8")
        v41.v41_compress_norm_rope_store(**_combined_arguments(case), shapes=shapes)
        assert launches[-1][1].ctas_per_sm == expected, (ratio, shapes)
