"""The suite on SPEC §13's state formats: the catalogue covers every option combination and the
cases engines meet, scenarios outside a declaration are unsupported and not called (today's
kernels declare none), the options reach an implementation only where a scenario uses them,
the step call gets ``kv`` and ``score`` as views of one projection output, and the tolerant
verdict reads a window's rows as §13 rounds them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from dsv4_compressor.conformance.capabilities import STATE_FORMATS, Capabilities
from dsv4_compressor.conformance.errors import STATE_CASES, run_error_cases
from dsv4_compressor.conformance.implementations import BUILTIN_CAPABILITIES, LoadedImplementation, load_implementation
from dsv4_compressor.conformance.runner import features, run_scenario, scenario_inputs
from dsv4_compressor.conformance.scenarios import CATALOGUE, scenarios
from dsv4_compressor.conformance.torch_reference import MUTANTS, TorchReference
from dsv4_compressor.spec.formats import bf16_bits, bf16_to_f32

STATE = [s for s in CATALOGUE if "state" in s.tags]
SMALL_STATE = [s for s in STATE if s.size == "small"]
TODAY = Capabilities(devices=("cpu",), head_widths=(512, 128))  # what every kernel declared before SPEC §13


def _options(scenario) -> tuple:
    f = features(scenario_inputs(scenario))
    return f.state_dtype, f.ape_at, f.ring_addressing, f.step_call


def _is_default(scenario) -> bool:
    return _options(scenario) == ("fp32", "save", False, False)


# ---- the catalogue ------------------------------------------------------------------------------
def test_every_option_combination_for_both_ratios_and_head_widths():
    combos = set(itertools.product(("fp32", "bf16"), ("save", "compress"), (False, True), (False, True)))
    for head, ratio in itertools.product((512, 128), (4, 128)):
        found = set()
        for s in SMALL_STATE:
            f = features(scenario_inputs(s))
            if (f.head_width, f.compress_ratio) == (head, ratio):
                found.add((f.state_dtype, f.ape_at, f.ring_addressing, f.step_call))
        assert found == combos, (head, ratio, combos - found)
    layouts = {scenario_inputs(s).layout for s in SMALL_STATE}
    assert layouts == {"flashmla_fp8", "bf16", "fp8_per_tensor", "indexer_fp8", "indexer_mxfp4"}
    assert {s.size for s in STATE} == {"small", "medium", "large"}
    assert all("§13" in s.sections for s in STATE)


def _windows(inputs, ratio_window: int):
    """Positions [n, W] of the active tokens' windows and their requests."""
    b = inputs.batch
    tokens = np.flatnonzero(b.active)
    p = b.positions[tokens]
    return p[:, None] - ratio_window + 1 + np.arange(ratio_window), b.token_to_req_indices[tokens], tokens


def test_the_named_cases_hold_what_their_names_say():
    wrap = scenario_inputs(scenarios(["state_c4_ring_wraparound"])[0])
    pos, _, _ = _windows(wrap, 8)
    index = pos % wrap.ring_capacity
    assert np.any(np.diff(index, axis=1) < 0), "no window crosses the ring's end"
    for name in ("state_c4_chunk_longer_than_ring", "state_c128_chunk_longer_than_ring"):
        inputs = scenario_inputs(scenarios([name])[0])
        b = inputs.batch
        chunks = np.diff(b.query_start_loc)
        assert chunks.max() > inputs.ring_capacity
        assert np.count_nonzero(b.save_slot_mapping >= 0) == np.minimum(chunks, inputs.ring_capacity).sum()
    for name in ("state_c4_verify_ring_step", "state_c128_verify_ring_step"):
        b = scenario_inputs(scenarios([name])[0]).batch
        starts, ends = b.query_start_loc[:-1], b.query_start_loc[1:]
        inside = [np.any(b.active[s:e - 1]) for s, e in zip(starts, ends)]  # a boundary before the group's last token
        assert all(e - s == 4 for s, e in zip(starts, ends)) and any(inside)


@pytest.mark.parametrize("name", [s.name for s in SMALL_STATE if "ties" in s.name])
def test_the_ties_sit_on_bf16_ties(name):
    inputs = scenario_inputs(scenarios([name])[0])
    width = inputs.ape.shape[1]
    kv, score = inputs.kv_score[:, :width], inputs.kv_score[:, width:]
    with_ape = score + inputs.ape[inputs.batch.positions % inputs.batch.compress_ratio]  # exact in binary32
    for values in (kv, score, with_ape):
        assert np.all((values.view(np.uint32) & 0xFFFF) == 0x8000)
        down = bf16_bits(values) == (values.view(np.uint32) >> 16)
        assert 0.3 < down.mean() < 0.7  # rounding to even goes either way


# ---- declarations -----------------------------------------------------------------------------
class NeverCalled:
    """Fails the scenario if the suite calls it."""

    def save_partial_states(self, *args, **kwargs):
        raise AssertionError("called")

    compress_norm_rope_store = compress_and_save = save_partial_states


def test_todays_declarations_leave_section_13_out_and_are_not_called():
    assert TODAY.state_dtypes == ("fp32",) and TODAY.ape_at == ("save",)
    assert not TODAY.ring_addressing and not TODAY.step_call
    cutedsl = BUILTIN_CAPABILITIES["cutedsl"]  # every option, the step call too
    assert all(getattr(cutedsl, name) == value for name, value in STATE_FORMATS.items())
    triton = BUILTIN_CAPABILITIES["triton"]  # every option, the step call too
    assert all(getattr(triton, name) == value for name, value in STATE_FORMATS.items())
    impl = LoadedImplementation("today", NeverCalled(), ("cpu",), TODAY)
    for scenario in SMALL_STATE:
        verdict = run_scenario(impl, scenario)
        if _is_default(scenario):
            assert verdict.status == "error" and "called" in verdict.first_difference
        else:
            assert verdict.status == "unsupported" and "SPEC §13" in verdict.first_difference, scenario.name


def test_declaring_an_option_is_all_a_kernel_changes():
    """A kernel of today's declaration that implements the options passes once it declares them."""
    names = ["state_c4_bf16_compress_ring_step", "state_indexer_c128_fp32_compress_ring_two_call", "state_c4_tail_saves"]
    today = LoadedImplementation("today", TorchReference(), ("cpu",), TODAY)
    declared = LoadedImplementation("declared", TorchReference(), ("cpu",), replace(TODAY, **STATE_FORMATS))
    for scenario in scenarios(names):
        assert run_scenario(today, scenario).status == "unsupported"
        assert run_scenario(declared, scenario).status == "pass"
    only_bf16 = LoadedImplementation("bf16", TorchReference(), ("cpu",), replace(TODAY, state_dtypes=("fp32", "bf16")))
    assert run_scenario(only_bf16, scenarios(["state_c4_bf16_save_paged_two_call"])[0]).status == "pass"
    compress = run_scenario(only_bf16, scenarios(["state_c4_bf16_compress_paged_two_call"])[0])
    assert "ape_at 'compress'" in compress.first_difference


def test_capabilities_check_the_state_options():
    assert Capabilities(state_dtypes="bf16").state_dtypes == ("bf16",)
    for bad in (dict(state_dtypes=("fp16",)), dict(ape_at=()), dict(ape_at=("pool",))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Capabilities(**bad)
    reason = TODAY.unsupported_state("bf16", "compress", True, True)
    assert all(part in reason for part in ("bf16", "'compress'", "ring", "compress_and_save"))


def test_declaring_the_step_call_without_it_is_a_load_error(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(ValueError, match="compress_and_save"):
        load_implementation("example_kernels:StepCallWithoutTheCall")


def test_state_error_cases_are_unsupported_where_undeclared():
    verdicts = run_error_cases(LoadedImplementation("today", NeverCalled(), ("cpu",), TODAY), STATE_CASES, "cpu")
    assert verdicts and all(v.status == "unsupported" and "SPEC §13" in v.detail for v in verdicts)
    assert {"save", "store", "step"} <= {c.operation for c in STATE_CASES}


# ---- how the options reach an implementation -----------------------------------------------------
class Spy(TorchReference):
    """Records the §13 keywords and the kv/score views it is given."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def save_partial_states(self, *args, **kwargs):
        self.seen["save"] = set(kwargs)
        return super().save_partial_states(*args, **kwargs)

    def compress_norm_rope_store(self, *args, **kwargs):
        self.seen["compress"] = set(kwargs) - {"compress_ratio", "layout", "fp8_scale", "hadamard"}
        return super().compress_norm_rope_store(*args, **kwargs)

    def compress_and_save(self, kv, score, *args, **kwargs):
        self.seen["step"] = (kv, score, kwargs)
        return super().compress_and_save(kv, score, *args, **kwargs)


@pytest.mark.parametrize("name, save, compress", [
    ("state_c4_fp32_save_paged_two_call", set(), set()),
    ("state_c4_bf16_save_ring_two_call", {"ring_capacity"}, {"ring_capacity"}),
    ("state_c128_fp32_compress_paged_two_call", {"ape_at"}, {"ape_at", "ape"}),
])
def test_the_two_calls_get_section_13_keywords_only_where_a_scenario_uses_them(name, save, compress):
    spy = Spy()
    verdict = run_scenario(LoadedImplementation("spy", spy, ("cpu",)), scenarios([name])[0])
    assert verdict.status == "pass" and spy.seen == {"save": save, "compress": compress}


@pytest.mark.parametrize("name", ["state_c4_fp32_compress_ring_step", "state_indexer_c4_bf16_save_paged_step"])
def test_the_step_call_gets_kv_and_score_as_views_of_one_projection_output(name):
    spy = Spy()
    scenario = scenarios([name])[0]
    assert run_scenario(LoadedImplementation("spy", spy, ("cpu",)), scenario).status == "pass"
    kv, score, keywords = spy.seen["step"]
    width = kv.shape[1]
    assert kv.untyped_storage().data_ptr() == score.untyped_storage().data_ptr()
    assert score.storage_offset() == kv.storage_offset() + width and kv.stride() == score.stride() == (2 * width, 1)
    inputs = scenario_inputs(scenario)
    assert keywords["ape_at"] == inputs.ape_at and keywords["ring_capacity"] == inputs.ring_capacity
    strided = replace(scenario, name=scenario.name + "[strided]", recipe=replace(scenario.recipe, strided_inputs=True))
    assert run_scenario(LoadedImplementation("spy", spy, ("cpu",)), strided).status == "pass"
    assert spy.seen["step"][0].stride(0) == 2 * width + 4  # a padded projection row, still 16-byte aligned


# ---- verdicts ------------------------------------------------------------------------------------
def test_a_bf16_state_difference_is_shown_as_bf16():
    verdict = run_scenario(LoadedImplementation("m", MUTANTS.bf16_by_truncation, ("cpu",)),
                           scenarios(["state_c4_bf16_ties_compress_step"])[0])
    assert verdict.status == "fail" and verdict.first_difference.startswith("compress_and_save: token")
    assert "region state" in verdict.first_difference and "(bf16 " in verdict.first_difference


class ApeBeforeTheRounding(TorchReference):
    """With a bf16 state and ape at the compress, reads the chunk's scores as bf16(score + ape)
    instead of add(bf16(score), ape) (SPEC §13.4)."""

    def _chunk_rows(self, rows, requests, pos, ape_rows):
        from_chunk, kv, score = super()._chunk_rows(rows, requests, pos, ape_rows)
        if rows.options.ape_at == "compress" and ape_rows is not None:
            _, _, saved_at_save = super()._chunk_rows(replace(rows, options=replace(rows.options, ape_at="save")),
                                                      requests, pos, ape_rows)
            score = saved_at_save
        return from_chunk, kv, score


def test_the_tolerant_verdict_takes_the_rows_as_section_13_rounds_them():
    """Rows carry no tolerance: ape on the wrong side of the bf16 rounding fails both verdicts,
    where the fast-math reference (same rows, other arithmetic) passes the tolerant one."""
    scenario = scenarios(["state_c4_bf16_ties_compress_step"])[0]
    wrong = LoadedImplementation("ape-before", ApeBeforeTheRounding(), ("cpu",))
    assert run_scenario(wrong, scenario).status == "fail"
    tolerant = run_scenario(wrong, scenario, tolerant=True)
    assert tolerant.status == "fail" and any("beyond bound" in kind for kind in tolerant.counts), tolerant.counts
    assert run_scenario(load_implementation("fast-math"), scenario, tolerant=True).status == "pass"


def test_bf16_state_values_read_back_exactly():
    """The suite's bf16 state holds each value rounded once: reading it back and storing again is the identity."""
    inputs = scenario_inputs(scenarios(["state_c4_bf16_save_paged_two_call"])[0])
    _, state = inputs.state_cache.numpy_copy()
    assert state.dtype == np.uint16 and np.array_equal(bf16_bits(bf16_to_f32(state)), state)
    assert torch.equal(torch.from_numpy(state.view(np.int16)).view(torch.bfloat16).float(),
                       torch.from_numpy(bf16_to_f32(state)))


def test_the_combined_call_form_needs_the_steps_keywords_or_a_kwargs_forward():
    """``step_call.forms_of``: a combined call that names SPEC §13's keywords, or passes ``**kwargs``
    on (as a variant does), is offered for a §13 step; one that takes neither is not."""
    from types import SimpleNamespace

    from dsv4_compressor.conformance import step_call
    from dsv4_compressor.conformance.implementations import takes_keywords

    def named(*args, ape_at="save", ring_capacity=None): ...
    def forwarding(*args, **kwargs): ...
    def plain(*args): ...

    inputs = SimpleNamespace(ape_at="compress", ring_capacity=8)  # a step with SPEC §13's options
    noop = SimpleNamespace(save_partial_states=plain, compress_norm_rope_store=plain)
    for combined, offered in ((named, True), (forwarding, True), (plain, False)):
        target = SimpleNamespace(**vars(noop), save_and_compress_norm_rope_store=combined)
        assert ("combined" in step_call.forms_of(target, inputs)) is offered, combined.__name__
        assert "combined" in step_call.forms_of(target)  # no options asked for
    assert not takes_keywords(len, "ape") and takes_keywords(len)
