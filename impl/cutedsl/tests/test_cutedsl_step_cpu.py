"""SPEC §13.4's step call ``compress_and_save`` in the CuTe DSL family, checked on CPU (no GPU needed).

- the configurations: ``StateFormat(rows_from_inputs=True)`` names its kernels ``..._step``, a save
  refuses it, the C128 pooling refuses late kv rows with it; the split-input save is its own variant;
- the PTX list holds the step's C4, split compress, pipelined and indexer kernels and the split-input
  save, and those compile for sm_90a and pass SPEC §2's PTX rules;
- the call (TVM-FFI stubbed, on the Triton tests' step scenarios): the compress kernel(s) of the
  format with ``rows_from_inputs``, then the save of ``save_slot_mapping``, in that order, with the
  call's tensors where the kernels take them; a repeated call reuses its plan; SPEC §9's refusals
  come before any launch.
"""

from __future__ import annotations

import dataclasses

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "triton" / "tests"))  # the shared scenarios

import triton_state_scenarios as scenarios  # noqa: E402
from dsv4_compressor.impl import ptx_rules  # noqa: E402
from dsv4_compressor.impl.cutedsl import api  # noqa: E402
from dsv4_compressor.impl.cutedsl.config import (C128PoolConfig, SaveConfig, StateFormat)  # noqa: E402
from dsv4_compressor.impl.cutedsl.ptx import compile_variant, kernel_configs, streams_rows  # noqa: E402
from dsv4_compressor.spec.batch import Request  # noqa: E402
from ffi_stub import stubbed_calls  # noqa: E402

STEP = StateFormat(rows_from_inputs=True)


# ---- configurations ---------------------------------------------------------------------------------
def test_the_step_format_names_its_kernels():
    assert STEP.tag == "_sf32_step" and not STEP.is_default
    assert StateFormat("bfloat16", "compress", True, True).tag == "_sbf16_apec_ring_step"
    assert StateFormat("bfloat16", "compress", True, True).stored == StateFormat("bfloat16", "compress")
    assert SaveConfig(4, 4, True, split_inputs=True).tag == "save_r4_bs4_v4_split_tpc1"
    with pytest.raises(ValueError, match="^rows_from_inputs: expected True or False"):
        StateFormat(rows_from_inputs=1)


def test_the_steps_save_reads_its_inputs_before_the_wait_only_where_that_is_safe():
    """The step call's save may read its inputs before the grid-dependency wait only with PDL, two
    input tensors and a token group per token (its predecessor is then the step's own compress)."""
    early = SaveConfig(128, 8, True, 4, pdl=True, split_inputs=True, inputs_before_wait=True)
    assert early.tag == "save_r128_bs8_v4_split_tpc4_pdl_readfirst"
    for changes in ({"pdl": False}, {"split_inputs": False}, {"tokens_per_cta": 1, "token_run": 32}):
        with pytest.raises(ValueError, match="^inputs_before_wait: expected False unless pdl, split_inputs"):
            dataclasses.replace(early, **changes)
    with pytest.raises(ValueError, match="^inputs_before_wait: expected True or False"):
        dataclasses.replace(early, inputs_before_wait=1)


def test_configs_refuse_the_step_where_their_kernels_do_not_take_it():
    with pytest.raises(ValueError, match=r"^state\.rows_from_inputs: expected False"):
        SaveConfig(4, 4, True, state=STEP)
    with pytest.raises(ValueError, match="^kv_after_max: expected False with rows_from_inputs"):
        C128PoolConfig(8, 8, kv_in_smem=True, kv_after_max=True, state=STEP)
    assert C128PoolConfig(8, 8, kv_in_smem=True, state=STEP).kv_in_smem  # the pipelined kernel stages both


# ---- the PTX list ---------------------------------------------------------------------------------------
def _step_variants() -> list:
    return [(kernel, config) for kernel, config in kernel_configs()
            if getattr(getattr(config, "state", None), "rows_from_inputs", False)
            or getattr(config, "split_inputs", False)]


def test_the_ptx_list_has_the_step_kernels():
    found = {(kernel, getattr(config, "ratio", None), config.state) for kernel, config in _step_variants()}
    both = {STEP, StateFormat("bfloat16", "compress", True, True)}
    for kernel, ratio in (("c4", None), ("split_pool", None), ("indexer", 4), ("indexer", 128)):
        assert {state for k, r, state in found if (k, r) == (kernel, ratio)} >= both, kernel
    pipelined = {state for k, _, state in found if k == "fused_pipelined"}
    assert {STEP, StateFormat(ring=True, rows_from_inputs=True)} <= pipelined, pipelined
    assert any(kernel == "save" for kernel, _, _ in found)


def test_step_variants_pass_the_ptx_rules():
    wanted = [(kernel, config) for kernel, config in _step_variants()
              if kernel == "save" or config.state.ring]  # each kernel once (the PTX check compiles them all)
    kinds = set()
    for kernel, config in wanted:
        if (kernel, getattr(config, "ratio", None)) in kinds:
            continue
        kinds.add((kernel, getattr(config, "ratio", None)))
        ptx = compile_variant(kernel, config).__ptx__
        report = ptx_rules.check_ptx("cutedsl", config.tag, ptx, require_target="sm_90a",
                                     require_vector_loads=streams_rows(kernel, config))
        assert report.ok, (config.tag, report.violations)
        assert "ld.local" not in ptx and "st.local" not in ptx, config.tag
    assert len(kinds) == 6


# ---- the call, TVM-FFI stubbed ---------------------------------------------------------------------------
@pytest.fixture
def launches(monkeypatch):
    return stubbed_calls(monkeypatch, api)[0]


REQUESTS = {4: [Request(11, 1), Request(0, 5), Request(9, 11)], 128: [Request(127, 1), Request(250, 10)]}
COMPRESS_KERNELS = {(4, 512): ["c4"], (128, 512): ["fused_pipelined"], (4, 128): ["indexer"],
                    (128, 128): ["indexer"]}  # an fp32 state's; a bf16 state's C128 step: the split path


def _arguments(ratio, head, bf16, ape_at, ring):
    layout, hadamard = scenarios.LAYOUTS[head][0]
    step = scenarios.format_step(ratio, head, layout, hadamard, bf16, ape_at, ring, REQUESTS[ratio], 4)
    args, options, _ = scenarios.step_arguments(step, "cpu")
    return step, args, options


def _ptr(tensor):
    return tensor.data_ptr()


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
@pytest.mark.parametrize("bf16, ape_at, ring", [(False, "save", False), (True, "compress", True)])
def test_the_step_launches_the_compress_then_the_save(launches, ratio, head, bf16, ape_at, ring):
    step, args, options = _arguments(ratio, head, bf16, ape_at, ring)
    kv, score, ape, positions, _, qsl, _, saves, _, bs, state = args[:11]
    api.compress_and_save(*args, **options)
    kinds = [kind for kind, _, _ in launches]
    compress = ["split_pool", "split_store"] if (ratio, head, bf16) == (128, 512, True) else COMPRESS_KERNELS[ratio, head]
    assert kinds == compress + ["save"]
    state_format = StateFormat("bfloat16" if bf16 else "float32", ape_at, ring, True)
    kind, config, call = launches[0]
    assert config.state == state_format
    assert call[-5:] == (_ptr(ape), step.batch.ring_capacity or 0, _ptr(kv), _ptr(score), _ptr(qsl))
    assert call[0] == _ptr(state) and call[2] == _ptr(positions)
    kind, config, call = launches[-1]
    assert config.split_inputs and config.state == state_format.stored and config.block_size == bs
    assert config.inputs_before_wait == (options.get("pdl", True) and config.token_run == 1)
    assert call == (_ptr(kv), _ptr(ape) if ape_at == "save" else None, _ptr(positions), _ptr(saves), _ptr(state),
                    _ptr(score))
    api.compress_and_save(*args, **options)  # the plan again: the same launches (a C128 scratch of its own)
    again = launches[len(kinds):]
    assert [(k, c) for k, c, _ in again] == [(k, c) for k, c, _ in launches[:len(kinds)]]
    assert again[0][2][-5:] == launches[0][2][-5:] and again[-1] == launches[len(kinds) - 1]


def test_a_step_of_no_tokens_launches_nothing(launches):
    _, args, options = _arguments(4, 512, False, "save", False)
    for i in (0, 1):
        args[i] = args[i][:0]
    for i in (3, 4, 6, 7, 15):
        args[i] = args[i][:0]
    args[5] = torch.zeros(1, dtype=torch.int32)
    api.compress_and_save(*args, **options)
    assert launches == []


@pytest.mark.parametrize("index, change, message", [
    (2, lambda a: None, "^ape: expected"),
    (5, lambda a: a.to(torch.int64), "^query_start_loc: expected"),
    (0, lambda a: a[:, :-4], "^kv: expected"),
    (7, lambda a: a.to(torch.int32), "^save_slot_mapping: expected"),
    (1, lambda a: a.to(torch.float64), "^score: expected"),
])
def test_refusals_come_before_any_launch(launches, index, change, message):
    _, args, options = _arguments(128, 512, True, "compress", True)
    args[index] = change(args[index])
    with pytest.raises(ValueError, match=message):
        api.compress_and_save(*args, **options)
    assert launches == []


def test_a_bad_option_is_refused_before_any_launch(launches):
    _, args, options = _arguments(4, 512, False, "save", False)
    with pytest.raises(ValueError, match="^pdl: expected"):
        api.compress_and_save(*args, **options, pdl="yes")
    with pytest.raises(ValueError, match="^ape_at: expected"):
        api.compress_and_save(*args, **dict(options, ape_at="later"))
    assert launches == []


def test_the_family_declares_its_step_call():
    from dsv4_compressor.conformance.implementations import BUILTIN_CAPABILITIES
    from dsv4_compressor.impl import cutedsl

    assert BUILTIN_CAPABILITIES["cutedsl"].step_call and callable(cutedsl.compress_and_save)


@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (128, 128)])
def test_warm_up_compiles_what_the_step_launches(launches, ratio, head):
    step, args, options = _arguments(ratio, head, True, "compress", True)
    b = step.batch
    warmed = api.warm_up(compress_ratio=ratio, block_size=b.block_size, layout=options["layout"],
                         entries_per_page=args[14].shape[1], weight_dtype=args[11].dtype, device="cpu",
                         token_counts=[b.num_tokens], store_align=16, hadamard=options["hadamard"],
                         state_dtype=args[10].dtype, ape_at="compress", ring_capacity=b.ring_capacity, save=False,
                         step=True)
    api.compress_and_save(*args, **options)
    assert {config for _, config, _ in launches} <= set(warmed)
    without = api.warm_up(compress_ratio=ratio, block_size=b.block_size, layout=options["layout"],
                          entries_per_page=args[14].shape[1], weight_dtype=args[11].dtype, device="cpu",
                          token_counts=[b.num_tokens], store_align=16, hadamard=options["hadamard"],
                          state_dtype=args[10].dtype, ape_at="compress", ring_capacity=b.ring_capacity, save=False)
    assert launches[0][1] not in without and launches[-1][1] not in without  # the step's kernels are its own


# ---- torch.compile ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [4, 128])
def test_the_step_traces_as_its_op_and_launches_what_the_eager_call_does(launches, ratio):
    _, args, options = _arguments(ratio, 512, True, "compress", True)

    def step(*tensors):
        api.compress_and_save(*tensors, **options)

    api.compress_and_save(*args, **options)
    eager = [(kind, config) for kind, config, _ in launches]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(*args)
    assert explained.graph_break_count == 0
    assert [str(node.target) for node in explained.graphs[0].graph.nodes if node.op == "call_function"] == [
        "dsv4_compressor.cutedsl_compress_and_save"]
    launches.clear()
    torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    assert [(kind, config) for kind, config, _ in launches] == eager
    launches.clear()
    with pytest.raises(Exception, match="pdl: expected True under torch.compile"):
        torch.compile(lambda *t: api.compress_and_save(*t, **options, pdl=False), fullgraph=True,
                      backend="eager")(*args)
    assert launches == []
