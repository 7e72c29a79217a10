"""SPEC §13's state formats in the Triton kernels against the NumPy spec, byte for byte over whole
allocations: a bf16 state, ``ape`` added at the save or at pooling, paged or ring addressing, each
combination on both ratios and both head widths, through the two-call path (``save_partial_states``
then ``compress_norm_rope_store``) and §13.4's ``compress_and_save``; ring wrap-around, chunks
longer than the ring with tail saves, verify groups with a boundary inside, bf16 ties of
``score + ape``, and the §9 checks of every new argument before any launch.

Under ``TRITON_INTERPRET=1`` on CPU with few tokens; the ``gpu`` tests repeat the comparisons at
engine-like sizes on a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.impl import triton as triton_impl
from dsv4_compressor.impl.triton import FusedConfig, SaveConfig
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.formats import bf16_bits

from triton_state_scenarios import (FORMATS, LAYOUTS, RING, Step, assert_identical, run_save, run_save_then_compress,
                                    run_step, step_arguments)
from triton_state_scenarios import format_cases as _cases
from triton_state_scenarios import format_step as _step
from triton_state_scenarios import step_requests as _step_requests
from triton_state_scenarios import two_call_requests as _two_call_requests

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32 = np.float32


# ---- save_partial_states ----------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, head", [(4, 512), (128, 512), (4, 128), (128, 128)])
@pytest.mark.parametrize("bf16_state, ape_at", [(False, "compress"), (True, "save"), (True, "compress")])
def test_save_writes_the_spec_bytes(ratio, head, bf16_state, ape_at):
    """A bf16 state rounds each value once; ape_at "compress" stores the raw score and takes no ape."""
    step = _step(ratio, head, LAYOUTS[head][0][0], False, bf16_state, ape_at, False, _two_call_requests(ratio, False), 1)
    expected, got = run_save(step, DEVICE, with_ape=ape_at == "save")
    assert np.array_equal(expected, got)


@pytest.mark.parametrize("config", [None, SaveConfig(block=64, num_warps=1)], ids=["default", "block64_w1"])
def test_save_with_ring_capacity_writes_what_it_writes_without(config):
    """SPEC §13.3: the save's slots already name ring slots; ring_capacity is only checked."""
    step = _step(4, 512, "flashmla_fp8", False, True, "compress", True, _step_requests(4, True)[:1] + [Request(6, 3)], 2)
    expected, got = run_save(step, DEVICE, with_ape=False, config=config)
    assert np.array_equal(expected, got)


# ---- the two-call path and the step call, every format ------------------------------------------------
@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_save_then_compress_writes_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _two_call_requests(ratio, ring), 3)
    assert step.batch.num_active >= 2
    assert_identical(run_save_then_compress(step, DEVICE))


@pytest.mark.parametrize("ratio, head, layout, hadamard, bf16_state, ape_at, ring", _cases())
def test_compress_and_save_writes_the_spec_bytes(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, _step_requests(ratio, ring), 4)
    assert step.batch.num_active >= 2
    assert_identical(run_step(step, DEVICE))


# ---- rows from both places, the ring, verify groups ----------------------------------------------------
def test_the_step_reads_its_chunk_from_the_inputs_not_the_state():
    """With no token saved, the state is never written; the entries still need the chunk's rows
    (their state rows hold other values), so they come from kv / score."""
    step = _step(4, 512, "flashmla_fp8", False, True, "save", False, [Request(9, 11), Request(0, 5)], 5)
    results = run_step(step, DEVICE, save_slot_mapping=np.full(step.batch.num_tokens, -1, np.int64))
    assert_identical(results)
    assert np.array_equal(results["state_cache"][1], Buffer.of(step.state).owner)


@pytest.mark.parametrize("ratio", [4, 128])
def test_ring_windows_wrap_around(ratio):
    """Decode boundaries far past the ring's size: the window's rows wrap from the ring's end to its start."""
    capacity = RING[ratio, 512]
    positions = [39, 59] if ratio == 4 else [255, 1151]
    requests = [Request(p, 1) for p in positions]
    w = 2 * ratio if ratio == 4 else ratio
    assert all((p + 1) % ratio == 0 for p in positions)
    assert any((p - w + 1) % capacity > p % capacity for p in positions)  # some window wraps
    for bf16_state, ape_at in ((False, "save"), (True, "compress")):
        step = _step(ratio, 512, "flashmla_fp8", False, bf16_state, ape_at, True, requests, 6)
        assert step.batch.num_active == len(requests)
        assert_identical(run_save_then_compress(step, DEVICE))
        assert_identical(run_step(step, DEVICE))


@pytest.mark.parametrize("head", [512, 128])
def test_a_chunk_longer_than_the_ring_saves_its_tail(head):
    """A C4 chunk of 3 rings' length: every boundary inside is compressed from the chunk, only the last
    C tokens are saved (the others' slots would be overwritten)."""
    layout = "flashmla_fp8" if head == 512 else "indexer_fp8"
    capacity = RING[4, head]
    step = _step(4, head, layout, False, True, "save", True, [Request(5, 3 * capacity), Request(23, 1)], 7)
    b = step.batch
    assert np.count_nonzero(b.save_slot_mapping >= 0) == capacity + 1 and b.num_active >= 9
    assert_identical(run_step(step, DEVICE))


@pytest.mark.parametrize("ratio, ring", [(4, False), (4, True), (128, False), (128, True)])
def test_verify_groups_with_a_boundary_inside(ratio, ring):
    """Speculative verify groups (the last accepted token and its drafts, a boundary at a random
    place among them) in one step, every token saved (paged) or the tail (a ring)."""
    rng = np.random.default_rng(ratio + ring)
    num_drafts = 3 if ratio == 4 else 7
    requests = spec_batch.speculative_requests(3 if ratio == 4 else 2, ratio, num_drafts, rng, max_entries=4)
    head = 512 if ratio == 128 else 128
    layout = "bf16" if head == 512 else "indexer_mxfp4"
    step = _step(ratio, head, layout, head == 128, ring, "compress" if ring else "save", ring, requests, 8)
    assert step.batch.num_active >= 2
    assert_identical(run_step(step, DEVICE))


# ---- bf16 ties ---------------------------------------------------------------------------------------
def _tie_step(ape_at: str, head: int) -> Step:
    """A C4 step whose scores and ape make ``add(score, ape)`` a bf16 tie in most channels (and the raw
    scores ties too): ``ape`` in [0.5, 1) on the bf16 grid, ``score = t - ape`` for ties ``t`` in [1, 2)
    halfway between bf16 neighbours (both exact in binary32)."""
    layout = "flashmla_fp8" if head == 512 else "indexer_fp8"
    step = _step(4, head, layout, False, True, ape_at, False, [Request(7, 9), Request(0, 4)], 9)
    rng = np.random.default_rng(10)
    grid = lambda low, n: (low * (1 + rng.integers(0, 128, n) / 128)).astype(F32)  # noqa: E731  (8 significant bits)
    step.ape[...] = grid(0.5, step.ape.size).reshape(step.ape.shape)
    ties = grid(1.0, step.score.size).reshape(step.score.shape) + F32(2.0**-8)
    positions = step.batch.positions
    step.score[...] = ties - step.ape[positions % 4]
    return step


@pytest.mark.parametrize("head", [512, 128])
@pytest.mark.parametrize("ape_at", ["save", "compress"])
def test_bf16_ties_of_score_plus_ape_round_to_even(ape_at, head):
    step = _tie_step(ape_at, head)
    sums = step.score + step.ape[step.batch.positions % 4]
    assert np.mean(bf16_bits(sums) & 1 == 0) == 1.0 and np.mean((sums.view(np.uint32) & 0xFFFF) == 0x8000) > 0.99
    expected, got = run_save(step, DEVICE, with_ape=ape_at == "save")
    assert np.array_equal(expected, got)
    assert_identical(run_step(step, DEVICE))
    assert_identical(run_save_then_compress(step, DEVICE))


# ---- launch knobs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, config", [
    (4, FusedConfig(block_c=16, num_warps=4)), (4, FusedConfig(block_c=512, num_warps=8)),
    (4, FusedConfig(block_c=64, num_warps=4, unroll_tiles=False, tile_stages=2)),
    (128, FusedConfig(block_c=32, num_warps=4, unroll_tiles=False)),
    (128, FusedConfig(block_c=64, num_warps=8, unroll_tiles=False, tile_stages=2)),
], ids=["c4_bc16_w4", "c4_bc512_w8", "c4_bc64_loop2", "c128_bc32_loop", "c128_bc64_w8_loop2"])
def test_knobs_do_not_change_bytes(ratio, config):
    step = _step(ratio, 512, "flashmla_fp8", False, True, "compress", True, _step_requests(ratio, True)[:2], 11)
    assert_identical(run_step(step, DEVICE, config=config))
    step = _step(ratio, 512, "flashmla_fp8", False, True, "compress", True, _two_call_requests(ratio, True), 11)
    assert_identical(run_save_then_compress(step, DEVICE, config=config))


# ---- SPEC §9: every new check, before anything is launched -------------------------------------------------
@pytest.fixture
def no_launch(monkeypatch):
    """Fails the test if a kernel is launched."""
    from dsv4_compressor.impl.triton import api

    def launched(self, *args):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(api.Launcher, "__call__", launched)


def _bf16_state_with_row_stride(state: torch.Tensor, row_stride: int) -> torch.Tensor:
    blocks, bs, width = state.shape
    return torch.zeros(blocks * bs * row_stride, dtype=torch.bfloat16, device=state.device).as_strided(
        (blocks, bs, width), (bs * row_stride, row_stride, 1))


def _misaligned(tensor: torch.Tensor) -> torch.Tensor:
    """A view of ``tensor``'s shape and strides one element into a copy (not 16-byte aligned)."""
    flat = torch.zeros(tensor.numel() * 4 + 8, dtype=tensor.dtype, device=tensor.device)
    return flat[1:].as_strided(tensor.shape, tensor.stride())


STEP_ERRORS = {
    "kv float64": (lambda a, o: a.__setitem__(0, a[0].double()), "kv"),
    "kv of width 2*SW": (lambda a, o: a.__setitem__(0, torch.cat([a[0], a[1]], 1)), "kv"),
    "kv row stride not 16-byte aligned": (lambda a, o: a.__setitem__(0, torch.zeros(a[0].shape[0], a[0].shape[1] + 2, device=a[0].device)[:, :a[0].shape[1]]), "kv"),
    "kv base not 16-byte aligned": (lambda a, o: a.__setitem__(0, _misaligned(a[0])), "kv"),
    "kv with a non-unit last stride": (lambda a, o: a.__setitem__(0, torch.zeros(a[0].shape[0], 2 * a[0].shape[1], device=a[0].device)[:, ::2]), "kv"),
    "score of T - 1 rows": (lambda a, o: a.__setitem__(1, a[1][:-1]), "score"),
    "score int32": (lambda a, o: a.__setitem__(1, a[1].int()), "score"),
    "ape None": (lambda a, o: a.__setitem__(2, None), "ape"),
    "ape of r - 1 rows": (lambda a, o: a.__setitem__(2, a[2][:-1]), "ape"),
    "ape float64": (lambda a, o: a.__setitem__(2, a[2].double()), "ape"),
    "query_start_loc int64": (lambda a, o: a.__setitem__(5, a[5].long()), "query_start_loc"),
    "query_start_loc longer than the block table": (lambda a, o: a.__setitem__(5, torch.arange(a[8].shape[0] + 2, dtype=torch.int32, device=a[5].device)), "query_start_loc"),
    "query_start_loc of rank 2": (lambda a, o: a.__setitem__(5, a[5][None]), "query_start_loc"),
    "save_slot_mapping of T - 1": (lambda a, o: a.__setitem__(7, a[7][:-1]), "save_slot_mapping"),
    "save_slot_mapping int32": (lambda a, o: a.__setitem__(7, a[7].int()), "save_slot_mapping"),
    "state_cache float16": (lambda a, o: a.__setitem__(10, a[10].half()), "state_cache"),
    "bf16 state row stride not a multiple of 8": (lambda a, o: a.__setitem__(10, _bf16_state_with_row_stride(a[10], a[10].shape[2] + 4)), "state_cache"),
    "ape_at 'both'": (lambda a, o: o.update(ape_at="both"), "ape_at"),
    "ring_capacity not a multiple of bs": (lambda a, o: o.update(ring_capacity=10), "ring_capacity"),
    "ring_capacity below W": (lambda a, o: o.update(ring_capacity=4), "ring_capacity"),
    "ring_capacity True": (lambda a, o: o.update(ring_capacity=True), "ring_capacity"),
    "block table narrower than the ring": (lambda a, o: o.update(ring_capacity=4 * (a[8].shape[1] + 1)), "block_table"),
    "token_to_req int64": (lambda a, o: a.__setitem__(4, a[4].long()), "token_to_req"),
    "layout of the other head": (lambda a, o: o.update(layout="indexer_fp8"), "layout"),
    "hadamard on a 512-wide layout": (lambda a, o: o.update(hadamard=True), "hadamard"),
}


@pytest.mark.parametrize("name", list(STEP_ERRORS))
def test_compress_and_save_rejects_before_any_launch(name, no_launch):
    mutate, argument = STEP_ERRORS[name]
    step = _step(4, 512, "flashmla_fp8", False, True, "save", False, [Request(11, 1), Request(0, 5)], 12)
    args, options, raw = step_arguments(step, DEVICE)
    before = {k: v.clone() for k, v in raw.items()}
    mutate(args, options)
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        triton_impl.compress_and_save(*args, **options)
    for k, v in raw.items():
        assert torch.equal(v, before[k]), f"{k} was written"


def test_the_step_contract_is_checked_in_debug_mode(no_launch):
    step = _step(4, 512, "flashmla_fp8", False, False, "save", False, [Request(11, 1), Request(0, 5)], 13)
    args, options, _ = step_arguments(step, DEVICE)
    args[3] = args[3].clone()
    args[3][1] += 1  # request 1's chunk positions are no longer consecutive
    with pytest.raises(ValueError, match="debug check: .*consecutive"):
        triton_impl.compress_and_save(*args, **options, debug=True)


def test_debug_mode_accepts_a_valid_step():
    step = _step(4, 128, "indexer_mxfp4", True, True, "compress", True, _step_requests(4, True), 18)
    assert_identical(run_step(step, DEVICE, debug=True))


def test_debug_mode_looks_a_ring_row_up_in_the_ring(no_launch):
    """With a ring, the debug checks read the block-table column of ``q mod C``: a bad entry there is
    reported, before anything is launched."""
    step = _step(4, 512, "flashmla_fp8", False, False, "save", True, [Request(39, 1)], 19)
    compress, _, _, _ = _two_call_arguments(step)
    compress[4] = compress[4].clone()
    compress[4][0, (39 - 7) % RING[4, 512] // 4] = 10_000  # the ring block of the window's first row
    with pytest.raises(ValueError, match=r"debug check: block_table\[0, 2\] = 10000"):
        triton_impl.compress_norm_rope_store(*compress, compress_ratio=4, ring_capacity=RING[4, 512], debug=True)


def _two_call_arguments(step: Step):
    from triton_state_scenarios import _store_tensors, _tensor, _tokens

    t, raw = _store_tensors(step, DEVICE)
    tokens = _tokens(step, DEVICE)
    b = step.batch
    compress = [t["state_cache"], tokens["token_to_req_indices"], tokens["positions"], tokens["slot_mapping"],
                t["block_table"], b.block_size, t["rms_norm_weight"], 1e-6, t["cos_sin_cache"], t["k_cache"],
                tokens["kv_slot_mapping"]]
    kv_score = _tensor(step.kv_score, DEVICE)
    save = [kv_score, _tensor(step.ape, DEVICE), tokens["positions"], tokens["slot_mapping"], t["state_cache"], b.block_size]
    return compress, save, _tensor(step.ape, DEVICE), raw


COMPRESS_ERRORS = {
    "ape missing with ape_at 'compress'": (dict(ape_at="compress"), None, "ape"),
    "ape of the wrong width": (dict(ape_at="compress"), lambda ape: ape[:, :-4], "ape"),
    "ape float64": (dict(ape_at="compress"), lambda ape: ape.double(), "ape"),
    "ape_at 'none'": (dict(ape_at="none"), lambda ape: ape, "ape_at"),
    "ring_capacity not a multiple of bs": (dict(ring_capacity=9), None, "ring_capacity"),
    "ring_capacity below W": (dict(ring_capacity=4), None, "ring_capacity"),
    "ring_capacity 8.0": (dict(ring_capacity=8.0), None, "ring_capacity"),
    "block table narrower than the ring": (dict(ring_capacity=4000), None, "block_table"),
}


@pytest.mark.parametrize("name", list(COMPRESS_ERRORS))
def test_compress_norm_rope_store_rejects_before_any_launch(name, no_launch):
    options, ape_of, argument = COMPRESS_ERRORS[name]
    step = _step(4, 512, "flashmla_fp8", False, True, "compress", False, [Request(11, 1)], 14)
    compress, _, ape, raw = _two_call_arguments(step)
    before = {k: v.clone() for k, v in raw.items()}
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        triton_impl.compress_norm_rope_store(*compress, compress_ratio=4, ape=None if ape_of is None else ape_of(ape),
                                             **options)
    assert all(torch.equal(v, before[k]) for k, v in raw.items())


SAVE_ERRORS = {
    "ape missing with ape_at 'save'": (dict(), lambda a: a.__setitem__(1, None), "ape"),
    "ape_at 'compress ' (a typo)": (dict(ape_at="compress "), None, "ape_at"),
    "ring_capacity below W": (dict(ring_capacity=4), None, "ring_capacity"),
    "ring_capacity not a multiple of bs": (dict(ring_capacity=18), None, "ring_capacity"),
    "state_cache float16": (dict(), lambda a: a.__setitem__(4, a[4].half()), "state_cache"),
    "bf16 state row stride not a multiple of 8": (
        dict(), lambda a: a.__setitem__(4, _bf16_state_with_row_stride(a[4], a[4].shape[2] + 4)), "state_cache"),
}


@pytest.mark.parametrize("name", list(SAVE_ERRORS))
def test_save_partial_states_rejects_before_any_launch(name, no_launch):
    options, mutate, argument = SAVE_ERRORS[name]
    step = _step(4, 512, "flashmla_fp8", False, True, "save", False, [Request(11, 1)], 15)
    _, save, _, raw = _two_call_arguments(step)
    before = raw["state_cache"].clone()
    if mutate is not None:
        mutate(save)
    with pytest.raises(ValueError, match=rf"^{argument}: expected"):
        triton_impl.save_partial_states(*save, **options)
    assert torch.equal(raw["state_cache"], before)


def test_save_with_ape_at_compress_takes_no_ape():
    step = _step(128, 128, "indexer_fp8", False, False, "compress", False, [Request(120, 8)], 16)
    expected, got = run_save(step, DEVICE, with_ape=False)
    assert np.array_equal(expected, got)


# ---- GPU: engine-like sizes -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("bf16_state, ape_at, ring", FORMATS)
@pytest.mark.parametrize("ratio, head, layout, hadamard", [
    (4, 512, "flashmla_fp8", False), (128, 512, "flashmla_fp8", False), (4, 512, "fp8_per_tensor", False),
    (128, 512, "bf16", False), (4, 128, "indexer_mxfp4", True), (128, 128, "indexer_fp8", False),
])
def test_gpu_engine_sized_steps(ratio, head, layout, hadamard, bf16_state, ape_at, ring):
    rng = np.random.default_rng(ratio * 7 + head)
    decode = spec_batch.decode_requests(256 if ratio == 4 else 48, ratio, rng, max_entries=64 if ratio == 4 else 8)
    verify = spec_batch.speculative_requests(32, ratio, 3, rng, max_entries=16 if ratio == 4 else 4)
    chunks = [Request(int(rng.integers(0, 4 * ratio)), n) for n in ((300, 37) if ratio == 4 else (200, 150))]
    if ring:  # the two-call path keeps a ring's windows for chunks of at most C - W + 1 tokens
        two_call = decode + verify
    else:
        two_call = decode + verify + chunks
    for requests, run in ((decode + verify + chunks, run_step), (two_call, run_save_then_compress)):
        step = _step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, requests, 17)
        assert_identical(run(step, "cuda"))
