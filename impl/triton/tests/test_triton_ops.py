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


# ---- SPEC §13's state formats through the ops, warm-up and plans ----------------------------------------
def _state_step(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    from triton_state_scenarios import make_step

    requests = [Request(3 * ratio - 1, 1), Request(2 * ratio - 3, 4)]  # a decode boundary, a chunk with one inside
    block_size = 16 if (ratio, head) == (4, 128) else 4 if ratio == 4 else 8
    capacity = (16 if head == 128 else 12) if ratio == 4 else 136
    return make_step(requests, ratio=ratio, layout=layout, seed=21, head_dim=head, block_size=block_size,
                     bf16_state=bf16_state, ape_at=ape_at, ring_capacity=capacity if ring else None, hadamard=hadamard)


STATE_OPS_CASES = [(4, 512, "flashmla_fp8", False, True, "compress", True), (128, 128, "indexer_mxfp4", True, False, "save", False)]
STATE_OPS_IDS = ["c4_flashmla_bf16_state_ape_at_compress_ring", "c128_indexer_mxfp4_hadamard_fp32_paged"]


@pytest.mark.parametrize("case", STATE_OPS_CASES, ids=STATE_OPS_IDS)
def test_compiled_compress_and_save_writes_the_spec_bytes(case):
    """``triton_compress_and_save`` under ``torch.compile(fullgraph=True)``, after ``warm_up`` of the
    same configuration (``step=True``): the spec's bytes in both caches."""
    from dsv4_compressor.impl import triton as triton_impl
    from triton_state_scenarios import run_step, step_arguments

    torch._dynamo.reset()
    ratio, head, layout, hadamard, bf16_state, ape_at, ring = case
    step = _state_step(*case)
    triton_impl.warm_up(compress_ratio=ratio, block_size=step.batch.block_size, layout=layout, entries_per_page=2,
                        device=DEVICE, hadamard=hadamard, state_dtype=torch.bfloat16 if bf16_state else torch.float32,
                        ape_at=ape_at, ring_capacity=step.batch.ring_capacity, step=True)
    expected = run_step(step, DEVICE)  # the spec's bytes (and an eager Triton run)
    args, options, raw = step_arguments(step, DEVICE)

    @torch.compile(fullgraph=True, backend=BACKEND)
    def layer_step(kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table,
                   state_cache, rms_norm_weight, cos_sin_cache, k_cache, kv_slot_mapping):
        OPS.triton_compress_and_save(kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping,
                                     save_slot_mapping, block_table, args[9], state_cache, rms_norm_weight, 1e-6,
                                     cos_sin_cache, k_cache, kv_slot_mapping, ratio, layout, None, ape_at=ape_at,
                                     ring_capacity=options["ring_capacity"], hadamard=hadamard)

    layer_step(*args[:9], *args[10:12], *args[13:])
    for name, (spec_bytes, _) in expected.items():
        assert np.array_equal(spec_bytes, raw[name].cpu().numpy()), name


def test_the_step_op_declares_both_caches_written():
    schema = OPS.triton_compress_and_save.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["state_cache", "k_cache"]
    assert [a.name for a in schema.returns] == []
    save = OPS.triton_save_partial_states.default._schema
    assert [a.name for a in save.arguments if a.alias_info is not None and a.alias_info.is_write] == ["state_cache"]
    assert str(save.arguments[1].type) == "Optional[Tensor]"  # ape: not needed with ape_at="compress"


def test_the_fake_step_op_traces_without_data():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from triton_state_scenarios import step_arguments

    args, options, _ = step_arguments(_state_step(4, 512, "flashmla_fp8", False, False, "save", False), DEVICE)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        assert OPS.triton_compress_and_save(*fake, options["compress_ratio"]) is None


@pytest.mark.parametrize("case", STATE_OPS_CASES, ids=STATE_OPS_IDS)
def test_compiled_two_call_ops_take_the_state_options(case):
    """``triton_save_partial_states`` (``ape`` None with ape_at="compress") then
    ``triton_compress_norm_rope_store`` with ``ape``, ``ape_at`` and ``ring_capacity``."""
    from triton_state_scenarios import _store_tensors, _tensor, _tokens, run_save_then_compress

    torch._dynamo.reset()
    ratio, head, layout, hadamard, bf16_state, ape_at, ring = case
    step = _state_step(*case)
    b = step.batch
    expected = run_save_then_compress(step, DEVICE)
    t, raw = _store_tensors(step, DEVICE)
    tokens = _tokens(step, DEVICE)
    save_ape = _tensor(step.ape, DEVICE) if ape_at == "save" else None
    pool_ape = _tensor(step.ape, DEVICE) if ape_at == "compress" else None

    @torch.compile(fullgraph=True, backend=BACKEND)
    def layer_step(kv_score, state_cache, k_cache):
        OPS.triton_save_partial_states(kv_score, save_ape, tokens["positions"], tokens["slot_mapping"], state_cache,
                                       b.block_size, ape_at=ape_at, ring_capacity=b.ring_capacity)
        OPS.triton_compress_norm_rope_store(state_cache, tokens["token_to_req_indices"], tokens["positions"],
                                            tokens["slot_mapping"], t["block_table"], b.block_size, t["rms_norm_weight"],
                                            1e-6, t["cos_sin_cache"], k_cache, tokens["kv_slot_mapping"], ratio, layout,
                                            hadamard=hadamard, ape=pool_ape, ape_at=ape_at, ring_capacity=b.ring_capacity)

    layer_step(_tensor(step.kv_score, DEVICE), t["state_cache"], t["k_cache"])
    for name, (spec_bytes, _) in expected.items():
        assert np.array_equal(spec_bytes, raw[name].cpu().numpy()), name


def test_the_state_options_key_their_own_plans():
    """A step call reuses its plan; another ape_at or ring capacity is another plan (another kernel)."""
    from dsv4_compressor.impl.triton import api
    from triton_state_scenarios import run_step

    step = _state_step(4, 512, "bf16", False, True, "save", True)
    assert_identical(run_step(step, DEVICE))
    plans = len(api._PLANS)
    assert_identical(run_step(step, DEVICE))
    assert len(api._PLANS) == plans
    other = _state_step(4, 512, "bf16", False, True, "compress", True)
    assert_identical(run_step(other, DEVICE))
    assert len(api._PLANS) == plans + 1


def test_op_rejects_a_bad_state_option_with_the_front_ends_message():
    from triton_state_scenarios import step_arguments

    args, options, raw = step_arguments(_state_step(4, 512, "flashmla_fp8", False, False, "save", False), DEVICE)
    before = {name: tensor.clone() for name, tensor in raw.items()}
    with pytest.raises(ValueError, match="ring_capacity: expected"):
        OPS.triton_compress_and_save(*args, 4, ring_capacity=6)
    assert all(torch.equal(tensor, before[name]) for name, tensor in raw.items())
