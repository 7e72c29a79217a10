"""The Triton operations as ``torch.ops.dsv4_compressor.triton_*`` custom ops: called from a
function compiled with ``torch.compile(fullgraph=True)`` they write exactly the spec's bytes
(under the interpreter on CPU), and bad arguments raise the front end's ``ValueError`` when
the op runs."""

import numpy as np
import pytest
import torch

import dsv4_compressor.impl.triton  # noqa: F401  (registers the ops)
from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request

from triton_test_scenarios import assert_identical, build_scenario, torch_arguments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "inductor" if DEVICE == "cuda" else "aot_eager"  # inductor's CPU codegen is slow on small CI machines
OPS = torch.ops.dsv4_compressor


def _scenario(ratio, layout):
    requests = [Request(ratio * 3 - 1, 1), Request(ratio + 2, 2)]  # a boundary token and two that are not
    return build_scenario(requests, ratio=ratio, block_size=4, layout=layout, seed=3, entries_per_page=2,
                          fp8_scale=0.25 if layout == "fp8_per_tensor" else None, row_pad=4)


def _compiled_call_matches_spec(scenario):
    """The compress op under ``torch.compile(fullgraph=True)`` writes the spec's bytes for ``scenario``."""
    b = scenario.batch
    state_owner, spec_state = Buffer.of(scenario.state_cache).numpy_copy()
    cache_owner, spec_cache = Buffer.of(scenario.k_cache).numpy_copy()
    spec.compress_norm_rope_store(spec_state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table,
                                  b.block_size, scenario.weight, scenario.eps, scenario.cos_sin, spec_cache,
                                  b.kv_slot_mapping, compress_ratio=scenario.ratio, layout=scenario.layout,
                                  fp8_scale=scenario.fp8_scale, hadamard=scenario.hadamard)
    assert not np.array_equal(cache_owner, Buffer.of(scenario.k_cache).numpy_copy()[0])  # entries are written
    args, raw = torch_arguments(scenario, DEVICE)

    @torch.compile(fullgraph=True, backend=BACKEND)
    def step(state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight, cos_sin_cache,
             k_cache, kv_slot_mapping):
        OPS.triton_compress_norm_rope_store(state_cache, token_to_req_indices, positions, slot_mapping, block_table,
                                            b.block_size, rms_norm_weight, scenario.eps, cos_sin_cache, k_cache,
                                            kv_slot_mapping, scenario.ratio, scenario.layout, scenario.fp8_scale,
                                            hadamard=scenario.hadamard)

    step(*(args[n] for n in ("state_cache", "token_to_req_indices", "positions", "slot_mapping", "block_table",
                             "rms_norm_weight", "cos_sin_cache", "k_cache", "kv_slot_mapping")))
    assert_identical({"k_cache": (cache_owner, raw["k_cache"].cpu().numpy()),
                      "state_cache": (state_owner, raw["state_cache"].cpu().numpy())})


@pytest.mark.parametrize("ratio, layout", [(4, "flashmla_fp8"), (128, "bf16"), (4, "fp8_per_tensor")])
def test_compiled_compress_norm_rope_store_writes_the_spec_bytes(ratio, layout):
    torch._dynamo.reset()
    _compiled_call_matches_spec(_scenario(ratio, layout))


def test_compiled_save_partial_states_writes_the_spec_bytes():
    torch._dynamo.reset()
    rng = np.random.default_rng(5)
    b = spec_batch.build_batch([Request(9, 3), Request(130, 1)], compress_ratio=128, block_size=8, entries_per_page=2,
                               rng=rng)
    state = spec_batch.random_state_cache(b.num_state_blocks, 8, 128, rng, row_pad=4)
    kv_score, ape = spec_batch.random_kv_score(b.num_tokens, 128, rng), spec_batch.random_ape(128, rng)
    owner, spec_state = Buffer.of(state).numpy_copy()
    spec.save_partial_states(kv_score, ape, b.positions, b.slot_mapping, spec_state, 8)
    raw, state_t = Buffer.of(state).torch_copy(DEVICE)

    @torch.compile(fullgraph=True, backend=BACKEND)
    def step(kv_score, ape, positions, slot_mapping, state_cache):
        OPS.triton_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, 8)

    step(*(torch.from_numpy(a).to(DEVICE) for a in (kv_score, ape, b.positions, b.slot_mapping)), state_t)
    assert np.array_equal(owner, raw.cpu().numpy())


def test_op_rejects_bad_arguments_with_the_front_ends_message():
    scenario = _scenario(4, "flashmla_fp8")
    args, raw = torch_arguments(scenario, DEVICE)
    before = raw["k_cache"].clone()
    args["positions"] = args["positions"].to(torch.int32)
    with pytest.raises(ValueError, match="positions: expected dtype int64"):
        OPS.triton_compress_norm_rope_store(*args.values(), 4)
    assert torch.equal(raw["k_cache"], before)


@pytest.mark.parametrize("ratio, layout", [(4, "flashmla_fp8"), (128, "fp8_per_tensor")])
def test_warm_up_launches_a_padding_step(ratio, layout):
    """warm_up compiles (on a GPU) by launching both kernels on a step whose only token is
    padding; it must accept every layout and write nothing a later call depends on."""
    from dsv4_compressor.impl import triton as triton_impl

    triton_impl.warm_up(compress_ratio=ratio, block_size=4, layout=layout, entries_per_page=2, device=DEVICE,
                        fp8_scale=0.5 if layout == "fp8_per_tensor" else None)
    test_compiled_compress_norm_rope_store_writes_the_spec_bytes(ratio, layout)


@pytest.mark.parametrize("ratio, layout", [(4, "flashmla_fp8"), (128, "bf16")])
def test_repeated_calls_reuse_the_plan_and_write_the_spec_bytes(ratio, layout):
    """The second call with a layout reuses its launch plan (on a GPU: the compiled kernel's own
    launcher, without Triton's argument binding) on new tensors: still the spec's bytes."""
    from dsv4_compressor.impl.triton import api
    from triton_test_scenarios import run_spec_and_triton

    scenario = _scenario(ratio, layout)
    assert_identical(run_spec_and_triton(scenario, DEVICE))
    plans = len(api._PLANS)
    for _ in range(2):
        assert_identical(run_spec_and_triton(scenario, DEVICE))
    assert len(api._PLANS) == plans


# ---- the indexer compressor (SPEC §12) through the ops, warm-up and plans ----------------------------
def _indexer_scenario(ratio, layout, hadamard):
    requests = [Request(ratio * 3 - 1, 1), Request(ratio + 2, 2)]  # a boundary token and two that are not
    return build_scenario(requests, ratio=ratio, block_size=4, layout=layout, seed=5, entries_per_page=2,
                          head_dim=128, hadamard=hadamard, row_pad=4)


@pytest.mark.parametrize("ratio, layout, hadamard", [(4, "indexer_fp8", True), (128, "indexer_mxfp4", False)])
def test_compiled_indexer_call_writes_the_spec_bytes(ratio, layout, hadamard):
    """The compress op takes the indexer layouts and ``hadamard`` (its last schema argument)
    under ``torch.compile(fullgraph=True)``, after ``warm_up`` of the same configuration."""
    from dsv4_compressor.impl import triton as triton_impl

    torch._dynamo.reset()
    triton_impl.warm_up(compress_ratio=ratio, block_size=4, layout=layout, entries_per_page=2, device=DEVICE,
                        hadamard=hadamard)
    _compiled_call_matches_spec(_indexer_scenario(ratio, layout, hadamard))


def test_indexer_op_rejects_a_misplaced_hadamard():
    scenario = _scenario(4, "flashmla_fp8")
    args, raw = torch_arguments(scenario, DEVICE)
    before = raw["k_cache"].clone()
    with pytest.raises(ValueError, match="hadamard"):
        OPS.triton_compress_norm_rope_store(*args.values(), 4, "flashmla_fp8", None, False, True)
    assert torch.equal(raw["k_cache"], before)


def test_repeated_indexer_calls_reuse_the_plan():
    from dsv4_compressor.impl.triton import api
    from triton_test_scenarios import run_spec_and_triton

    scenario = _indexer_scenario(4, "indexer_mxfp4", True)
    assert_identical(run_spec_and_triton(scenario, DEVICE))
    plans = len(api._PLANS)
    assert_identical(run_spec_and_triton(scenario, DEVICE))
    assert len(api._PLANS) == plans
