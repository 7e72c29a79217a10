"""The public Triton functions under ``torch.compile(fullgraph=True)``: while Dynamo traces, each
call becomes its custom op (``torch.ops.dsv4_compressor.triton_*``), one node and no graph break,
and the compiled step writes the spec's bytes (CPU tensors under the interpreter; CUDA tensors
on a GPU). An option the op cannot take (``config``) is refused by
name, and bad arguments still raise the front end's ``ValueError`` when the step runs."""

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.impl import triton as triton_impl
from dsv4_compressor.impl.triton import FusedConfig
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

from triton_test_scenarios import build_scenario, torch_arguments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _scenario(ratio: int):
    requests = [Request(ratio * 3 - 1, 1), Request(ratio + 2, 2)]  # a boundary token and two that are not
    return build_scenario(requests, ratio=ratio, block_size=4, layout="flashmla_fp8", seed=7, entries_per_page=2,
                          row_pad=4)


def _save_inputs(scenario):
    """kv_score, ape of the scenario's tokens (SPEC §4), as torch tensors."""
    rng = np.random.default_rng(11)
    b = scenario.batch
    kv_score = spec_batch.random_kv_score(b.num_tokens, scenario.ratio, rng)
    return (torch.from_numpy(kv_score).to(DEVICE), torch.from_numpy(spec_batch.random_ape(scenario.ratio, rng)).to(DEVICE))


def step(kv_score, ape, args: dict, ratio: int) -> None:
    """One layer's step through the public functions: save, then compress."""
    triton_impl.save_partial_states(kv_score, ape, args["positions"], args["slot_mapping"], args["state_cache"],
                                    args["block_size"])
    triton_impl.compress_norm_rope_store(*args.values(), compress_ratio=ratio, layout="flashmla_fp8")


def _buffers(scenario, ratio: int, compiled) -> tuple[np.ndarray, np.ndarray]:
    """The whole state and cache allocations after one step (``compiled``: the step to run)."""
    args, raw = torch_arguments(scenario, DEVICE)
    kv_score, ape = _save_inputs(scenario)
    compiled(kv_score, ape, args, ratio)
    return raw["state_cache"].cpu().numpy(), raw["k_cache"].cpu().numpy()


@pytest.mark.parametrize("ratio", [4, 128])
def test_public_functions_trace_as_one_op_each(ratio):
    torch._dynamo.reset()
    args, _ = torch_arguments(_scenario(ratio), DEVICE)
    kv_score, ape = _save_inputs(_scenario(ratio))
    explained = torch._dynamo.explain(step)(kv_score, ape, args, ratio)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = [str(node.target) for node in explained.graphs[0].graph.nodes if node.op == "call_function"]
    assert ops == ["dsv4_compressor.triton_save_partial_states",
                   "dsv4_compressor.triton_compress_norm_rope_store"]


def _spec_buffers(scenario, ratio: int) -> tuple[np.ndarray, np.ndarray]:
    """The spec's whole state and cache allocations after the same step (SPEC §4, then §5-§7)."""
    b = scenario.batch
    kv_score, ape = (t.cpu().numpy() for t in _save_inputs(scenario))
    state_owner, state = Buffer.of(scenario.state_cache).numpy_copy()
    cache_owner, cache = Buffer.of(scenario.k_cache).numpy_copy()
    spec.save_partial_states(kv_score, ape, b.positions, b.slot_mapping, state, b.block_size)
    spec.compress_norm_rope_store(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table,
                                  b.block_size, scenario.weight, scenario.eps, scenario.cos_sin, cache,
                                  b.kv_slot_mapping, compress_ratio=ratio, layout="flashmla_fp8")
    return state_owner, cache_owner


@pytest.mark.parametrize("ratio", [4, 128])
def test_a_fullgraph_compiled_step_writes_the_spec_bytes(ratio):
    torch._dynamo.reset()
    scenario = _scenario(ratio)
    expected_state, expected_cache = _spec_buffers(scenario, ratio)
    state, cache = _buffers(scenario, ratio, torch.compile(step, fullgraph=True, backend="eager"))
    assert np.array_equal(state, expected_state) and np.array_equal(cache, expected_cache)
    assert not np.array_equal(cache, torch_arguments(scenario, DEVICE)[1]["k_cache"].cpu().numpy())  # written


def test_an_option_the_op_cannot_take_is_refused_by_name():
    torch._dynamo.reset()
    args, _ = torch_arguments(_scenario(4), DEVICE)
    config = FusedConfig(block_c=64, num_warps=2)

    @torch.compile(fullgraph=True, backend="eager")
    def configured(args):
        triton_impl.compress_norm_rope_store(*args.values(), compress_ratio=4, config=config)

    with pytest.raises(Exception, match=r"config: expected None under torch.compile \(the custom op "
                                        r"dsv4_compressor::triton_compress_norm_rope_store takes no config\), got "
                                        r"a FusedConfig"):
        configured(args)


def test_bad_arguments_raise_the_front_ends_message_when_the_step_runs():
    torch._dynamo.reset()
    scenario = _scenario(4)
    args, raw = torch_arguments(scenario, DEVICE)
    before = raw["k_cache"].clone()
    args["positions"] = args["positions"].to(torch.int32)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    with pytest.raises(ValueError, match="positions: expected dtype int64"):
        compiled(*_save_inputs(scenario), args, 4)
    assert torch.equal(raw["k_cache"], before)


# ---- SPEC §13's state formats: compress_and_save and the state options through the traced calls -------
def _state_step(ring: bool):
    """A C4 step on a bf16 state with ape added at pooling, in a ring (``ring``) or paged."""
    from triton_state_scenarios import make_step

    requests = [Request(11, 1), Request(5, 4)]  # a decode boundary, a chunk with one inside
    return make_step(requests, ratio=4, layout="flashmla_fp8", seed=23, block_size=4, bf16_state=True,
                     ape_at="compress", ring_capacity=12 if ring else None)


def step_and_save(args: list, options: dict) -> None:
    triton_impl.compress_and_save(*args, **options)


def save_then_compress(args: list, options: dict) -> None:
    """The two calls of a step in its state format (``args``: ``compress_and_save``'s)."""
    kv, _, ape, positions, token_to_req, _, slot_mapping, _, block_table, bs, state, weight, eps, cos_sin, k_cache, \
        kv_slots = args
    kv_score = torch.as_strided(kv, (kv.shape[0], 2 * kv.shape[1]), kv.stride())
    triton_impl.save_partial_states(kv_score, None, positions, slot_mapping, state, bs, ape_at=options["ape_at"],
                                    ring_capacity=options["ring_capacity"])
    triton_impl.compress_norm_rope_store(state, token_to_req, positions, slot_mapping, block_table, bs, weight, eps,
                                         cos_sin, k_cache, kv_slots, ape=ape, **options)


def _state_buffers(step, calls) -> dict[str, np.ndarray]:
    from triton_state_scenarios import step_arguments

    args, options, raw = step_arguments(step, DEVICE)
    calls(args, options)
    return {name: buffer.cpu().numpy() for name, buffer in raw.items()}


@pytest.mark.parametrize("ring", [False, True])
@pytest.mark.parametrize("calls, ops", [
    (step_and_save, ["triton_compress_and_save"]),
    (save_then_compress, ["triton_save_partial_states", "triton_compress_norm_rope_store"])])
def test_the_state_options_pass_through_the_traced_calls(ring, calls, ops):
    """A bf16 state, ``ape`` at pooling and a ring: the compiled calls write the spec's bytes."""
    from triton_state_scenarios import run_save_then_compress, run_step, step_arguments

    torch._dynamo.reset()
    step = _state_step(ring)
    explained = torch._dynamo.explain(calls)(*step_arguments(step, DEVICE)[:2])
    assert explained.graph_break_count == 0
    targets = [str(n.target) for n in explained.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t.split(".")[1] for t in targets if t.startswith("dsv4_compressor.")] == ops
    spec_of = run_step if calls is step_and_save else run_save_then_compress  # the spec's bytes of this form
    expected = {name: spec_bytes for name, (spec_bytes, _) in spec_of(step, DEVICE).items()}
    traced = _state_buffers(step, torch.compile(calls, fullgraph=True, backend="eager"))
    assert all(np.array_equal(traced[name], expected[name]) for name in expected)


def test_a_launch_configuration_of_the_step_is_refused_by_name():
    from triton_state_scenarios import step_arguments

    torch._dynamo.reset()
    args, options, _ = step_arguments(_state_step(False), DEVICE)
    save_knobs = triton_impl.SaveConfig(block=256, num_warps=2)

    @torch.compile(fullgraph=True, backend="eager")
    def configured(args):
        triton_impl.compress_and_save(*args, **options, save_config=save_knobs)

    with pytest.raises(Exception, match=r"save_config: expected None under torch.compile \(the custom op "
                                        r"dsv4_compressor::triton_compress_and_save takes no save_config\), got "
                                        r"a SaveConfig"):
        configured(args)
