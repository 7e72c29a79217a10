"""SPEC §13 scenarios for the Triton tests: one step's buffers in a state format (fp32 or bf16 state,
``ape_at``, paged or a ring), built once in NumPy from ``spec.batch``'s builders, and the spec and
the Triton implementation run from identical copies of them (whole allocations compared byte by
byte, padding and canaries included).

A step's state holds rows as earlier steps saved them in its format (``batch.save_history``); a
ring state holds each request's last ``C`` rows before its chunk (``batch.as_ring``). ``kv`` and
``score`` are two ``[T, SW]`` views of one padded projection array, as an engine's are.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.spec import batch as spec_batch
from dsv4_compressor.spec.batch import Request
from dsv4_compressor.spec.constants import ratio_config
from dsv4_compressor.spec.formats import bf16_bits

from triton_test_scenarios import first_difference

STATE_ROW_PAD = 8  # elements: a padded row stride that is a multiple of 16 bytes in fp32 and in bf16
PROJECTION_PAD = 4  # floats past each projection row (16-byte aligned rows, not contiguous)


@dataclass
class Step:
    """One step's metadata and buffers (NumPy, the spec's view)."""

    batch: spec_batch.Batch  # ring_capacity set for a ring
    state: np.ndarray  # float32, or uint16 bf16 patterns, [num_state_blocks, bs, 2*SW]
    kv: np.ndarray  # float32 [T, SW]: a view of the projections
    score: np.ndarray  # float32 [T, SW]: the next SW floats of each projection row
    ape: np.ndarray  # float32 [r, SW]
    weight: np.ndarray  # float32 [H] or uint16 [H] (bf16 patterns)
    cos_sin: np.ndarray  # float32 [max_pos, 64]
    k_cache: np.ndarray  # the layout's canary-filled cache
    layout: str
    ape_at: str = "save"
    hadamard: bool = False
    fp8_scale: float | None = None

    @property
    def ratio(self) -> int:
        return self.batch.compress_ratio

    @property
    def kv_score(self) -> np.ndarray:
        """float32 [T, 2*SW]: kv then score, as ``save_partial_states`` takes them (a view)."""
        return np.lib.stride_tricks.as_strided(self.kv, (self.kv.shape[0], 2 * self.kv.shape[1]), self.kv.strides)


def _bf16_state(state: np.ndarray) -> np.ndarray:
    """A bf16 state (uint16 patterns, 64-byte aligned, rows padded like ``state``) with ``state``'s values rounded."""
    out = spec_batch.padded_view(state.shape, np.uint16, (0, 0, STATE_ROW_PAD), np.uint16(0x7FC0))
    out[...] = bf16_bits(state)
    return out


def make_step(requests: list[Request], *, ratio: int, layout: str, seed: int, head_dim: int = 512, block_size: int = 4,
              entries_per_page: int = 2, bf16_state: bool = False, ape_at: str = "save", ring_capacity: int | None = None,
              num_padding: int = 2, hadamard: bool = False, bf16_weight: bool = True) -> Step:
    """A step of ``requests`` on a state in the given format (rows saved in it by earlier steps)."""
    rng = np.random.default_rng(seed)
    b = spec_batch.build_batch(requests, compress_ratio=ratio, block_size=block_size, entries_per_page=entries_per_page,
                               rng=rng, num_padding=num_padding)
    state = spec_batch.random_state_cache(b.num_state_blocks, block_size, ratio, rng, row_pad=STATE_ROW_PAD,
                                          head_dim=head_dim)
    state = _bf16_state(state) if bf16_state else state
    config = ratio_config(ratio, head_dim)
    ape = spec_batch.random_ape(ratio, rng, head_dim=head_dim)
    spec_batch.save_history(b, state, ape, rng, ape_at=ape_at)
    if ring_capacity is not None:
        b, state = spec_batch.as_ring(b, state, ring_capacity, rng)
    projections = spec_batch.padded_view((b.num_tokens, config.state_row_width), np.float32, (0, PROJECTION_PAD),
                                         np.float32(np.nan))
    projections[...] = spec_batch.random_kv_score(b.num_tokens, ratio, rng, head_dim=head_dim)
    width = config.state_width
    max_pos = int(b.positions.max()) + ratio + 1
    return Step(
        batch=b, state=state, kv=projections[:, :width], score=projections[:, width:], ape=ape,
        weight=spec_batch.random_norm_weight(rng, bf16=bf16_weight, head_dim=head_dim),
        cos_sin=spec_batch.rope_cos_sin_cache(max_pos), k_cache=spec_batch.canary_k_cache(layout, b.num_pages, entries_per_page),
        layout=layout, ape_at=ape_at, hadamard=hadamard, fp8_scale=0.0173 if layout == "fp8_per_tensor" else None,
    )


# ---- the format combinations both kernel families are checked on ----------------------------------------
BLOCK_SIZE = {(4, 512): 4, (128, 512): 8, (4, 128): 16, (128, 128): 8}
# C4: W + 4 rows (512-wide, bs 4), one block of 16 rows (the indexer, bs 16); C128: vLLM's ring for 8 drafts
RING = {(4, 512): 12, (4, 128): 16, (128, 512): 136, (128, 128): 136}
LAYOUTS = {512: [("flashmla_fp8", False), ("bf16", False), ("fp8_per_tensor", False)],
           128: [("indexer_fp8", False), ("indexer_mxfp4", True), ("indexer_mxfp4", False), ("indexer_fp8", True)]}
FORMATS = list(itertools.product((False, True), ("save", "compress"), (False, True)))  # bf16 state, ape_at, ring


def format_cases():
    """Every format (bf16 state x ape_at x ring) on both ratios and head widths, the layouts (and
    the indexer's rotation) taking turns so that each appears in every ratio and head width."""
    cases = []
    for ratio, head in itertools.product((4, 128), (512, 128)):
        for i, (bf16_state, ape_at, ring) in enumerate(FORMATS):
            layout, hadamard = LAYOUTS[head][i % len(LAYOUTS[head])]
            cases.append(pytest.param(ratio, head, layout, hadamard, bf16_state, ape_at, ring,
                                      id=f"c{ratio}-h{head}-{layout}{'-hadamard' if hadamard else ''}"
                                         f"-{'bf16' if bf16_state else 'fp32'}-ape_at_{ape_at}{'-ring' if ring else ''}"))
    return cases


def two_call_requests(ratio: int, ring: bool) -> list[Request]:
    """Decode boundaries (one whose window wraps around a ring), a first window, a chunk with a
    boundary inside; on a ring the chunks stay within C - W + 1 tokens (the two-call path's limit)."""
    if ratio == 4:
        return [Request(35, 1), Request(6, 3), Request(0, 4)] if ring else [Request(11, 1), Request(0, 5), Request(9, 11)]
    return [Request(383, 1), Request(250, 6)] if ring else [Request(127, 1), Request(250, 10)]


def step_requests(ratio: int, ring: bool) -> list[Request]:
    """As :func:`two_call_requests`; on a ring also a chunk longer than the ring (its tail saved)."""
    if ratio == 4:
        return [Request(35, 1), Request(2, 15), Request(0, 4)] if ring else [Request(11, 1), Request(0, 5), Request(9, 11)]
    return [Request(383, 1), Request(250, 6), Request(100, 140)] if ring else [Request(127, 1), Request(250, 10)]


def format_step(ratio, head, layout, hadamard, bf16_state, ape_at, ring, requests, seed) -> Step:
    return make_step(requests, ratio=ratio, layout=layout, seed=seed, head_dim=head, block_size=BLOCK_SIZE[ratio, head],
                     bf16_state=bf16_state, ape_at=ape_at, ring_capacity=RING[ratio, head] if ring else None,
                     hadamard=hadamard, bf16_weight=not bf16_state)


def _tensor(array: np.ndarray, device: str) -> torch.Tensor:
    return Buffer.of(array).torch_copy(device)[1]


def _tokens(step: Step, device: str) -> dict:
    b = step.batch
    return {name: torch.from_numpy(np.ascontiguousarray(getattr(b, name))).to(device)
            for name in ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping", "save_slot_mapping",
                         "query_start_loc")}


def _projections(step: Step, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv`` and ``score`` as two views of one torch copy of the projections (strides kept)."""
    owner = Buffer.of(step.kv_score)
    _, kv_score = owner.torch_copy(device)
    width = step.kv.shape[1]
    return kv_score[:, :width], kv_score[:, width:]


def save_input(step: Step, device: str) -> torch.Tensor:
    """The save's ``kv_score [T, 2*SW]``: a view over the step's kv and score projections."""
    kv, _ = _projections(step, device)
    return torch.as_strided(kv, (kv.shape[0], 2 * kv.shape[1]), kv.stride())


def run_save(step: Step, device: str, *, family: str = "triton", with_ape: bool = True,
             **options) -> tuple[np.ndarray, np.ndarray]:
    """``save_partial_states`` of every token with a slot, spec and a kernel family (``options``: the
    family's own keywords): (spec, family) state allocations."""
    family_impl = importlib.import_module(f"dsv4_compressor.impl.{family}")
    b = step.batch
    ape = step.ape if with_ape else None
    state_buffer = Buffer.of(step.state)
    owner, spec_state = state_buffer.numpy_copy()
    spec.save_partial_states(step.kv_score, ape, b.positions, b.slot_mapping, spec_state, b.block_size,
                             ape_at=step.ape_at, ring_capacity=b.ring_capacity)
    raw, state = state_buffer.torch_copy(device)
    tokens = _tokens(step, device)
    family_impl.save_partial_states(save_input(step, device), None if ape is None else _tensor(ape, device),
                                    tokens["positions"], tokens["slot_mapping"], state, b.block_size,
                                    ape_at=step.ape_at, ring_capacity=b.ring_capacity, **options)
    return owner, raw.cpu().numpy()


def _store_tensors(step: Step, device: str) -> tuple[dict, dict]:
    """The store's torch arguments and the raw allocations behind ``state_cache`` and ``k_cache``."""
    cache_dtype = {"bf16": "bfloat16", "fp8_per_tensor": "float8_e4m3fn"}.get(step.layout, "uint8")
    state_raw, state = Buffer.of(step.state).torch_copy(device)
    cache_raw, cache = Buffer.of(step.k_cache, cache_dtype).torch_copy(device)
    tensors = dict(state_cache=state, k_cache=cache, rms_norm_weight=_tensor(step.weight, device),
                   cos_sin_cache=_tensor(step.cos_sin, device), block_table=_tensor(step.batch.block_table, device))
    return tensors, {"state_cache": state_raw, "k_cache": cache_raw}


def run_save_then_compress(step: Step, device: str, *, family: str = "triton", calls=None,
                           **options) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The two-call path in the step's format, spec and a kernel family: ``save_partial_states`` of
    every token with a slot, then ``compress_norm_rope_store`` (``options``: the family's own
    keywords of the compress). ``calls(step, tensors, tokens, kv_score, save_ape, pool_ape)``, when
    given, makes the family's two calls instead (e.g. through a bound layer). Returns
    ``{name: (spec, family)}`` allocations of ``state_cache`` and ``k_cache``."""
    b = step.batch
    state_owner, spec_state = Buffer.of(step.state).numpy_copy()
    cache_owner, spec_cache = Buffer.of(step.k_cache).numpy_copy()
    save_ape = step.ape if step.ape_at == "save" else None
    pool_ape = step.ape if step.ape_at == "compress" else None
    spec.save_partial_states(step.kv_score, save_ape, b.positions, b.slot_mapping, spec_state, b.block_size,
                             ape_at=step.ape_at, ring_capacity=b.ring_capacity)
    spec.compress_norm_rope_store(
        spec_state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size, step.weight, 1e-6,
        step.cos_sin, spec_cache, b.kv_slot_mapping, compress_ratio=b.compress_ratio, layout=step.layout,
        fp8_scale=step.fp8_scale, hadamard=step.hadamard, ape=pool_ape, ape_at=step.ape_at, ring_capacity=b.ring_capacity)
    t, raw = _store_tensors(step, device)
    tokens = _tokens(step, device)
    save_ape_t = None if save_ape is None else _tensor(save_ape, device)
    pool_ape_t = None if pool_ape is None else _tensor(pool_ape, device)
    if calls is not None:
        calls(step, t, tokens, save_input(step, device), save_ape_t, pool_ape_t)
    else:
        family_impl = importlib.import_module(f"dsv4_compressor.impl.{family}")
        family_impl.save_partial_states(save_input(step, device), save_ape_t, tokens["positions"],
                                        tokens["slot_mapping"], t["state_cache"], b.block_size, ape_at=step.ape_at,
                                        ring_capacity=b.ring_capacity)
        family_impl.compress_norm_rope_store(
            t["state_cache"], tokens["token_to_req_indices"], tokens["positions"], tokens["slot_mapping"],
            t["block_table"], b.block_size, t["rms_norm_weight"], 1e-6, t["cos_sin_cache"], t["k_cache"],
            tokens["kv_slot_mapping"], compress_ratio=b.compress_ratio, layout=step.layout, fp8_scale=step.fp8_scale,
            hadamard=step.hadamard, ape=pool_ape_t, ape_at=step.ape_at, ring_capacity=b.ring_capacity, **options)
    return {"state_cache": (state_owner, raw["state_cache"].cpu().numpy()),
            "k_cache": (cache_owner, raw["k_cache"].cpu().numpy())}


def step_arguments(step: Step, device: str) -> tuple[list, dict, dict]:
    """``compress_and_save``'s positional torch arguments, its keyword options and the raw allocations
    behind ``state_cache`` and ``k_cache``."""
    b = step.batch
    t, raw = _store_tensors(step, device)
    tokens = _tokens(step, device)
    kv, score = _projections(step, device)
    args = [kv, score, _tensor(step.ape, device), tokens["positions"], tokens["token_to_req_indices"],
            tokens["query_start_loc"], tokens["slot_mapping"], tokens["save_slot_mapping"], t["block_table"], b.block_size,
            t["state_cache"], t["rms_norm_weight"], 1e-6, t["cos_sin_cache"], t["k_cache"], tokens["kv_slot_mapping"]]
    options = dict(compress_ratio=b.compress_ratio, layout=step.layout, fp8_scale=step.fp8_scale, ape_at=step.ape_at,
                   ring_capacity=b.ring_capacity, hadamard=step.hadamard)
    return args, options, raw


def run_step(step: Step, device: str, *, family: str = "triton", save_slot_mapping: np.ndarray | None = None,
             **options) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``compress_and_save``, spec and a kernel family (``"triton"`` or ``"cutedsl"``; ``options``: the
    family's own keywords, e.g. Triton's ``config``, ``debug``): ``{name: (spec, family)}`` allocations
    of ``state_cache`` and ``k_cache``."""
    family_impl = importlib.import_module(f"dsv4_compressor.impl.{family}")
    b = step.batch
    saves = b.save_slot_mapping if save_slot_mapping is None else save_slot_mapping
    state_owner, spec_state = Buffer.of(step.state).numpy_copy()
    cache_owner, spec_cache = Buffer.of(step.k_cache).numpy_copy()
    spec.compress_and_save(
        step.kv, step.score, step.ape, b.positions, b.token_to_req_indices, b.query_start_loc, b.slot_mapping, saves,
        b.block_table, b.block_size, spec_state, step.weight, 1e-6, step.cos_sin, spec_cache, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=step.layout, fp8_scale=step.fp8_scale, ape_at=step.ape_at,
        ring_capacity=b.ring_capacity, hadamard=step.hadamard, debug=True)
    args, keywords, raw = step_arguments(step, device)
    if save_slot_mapping is not None:
        args[7] = torch.from_numpy(save_slot_mapping.copy()).to(device)
    family_impl.compress_and_save(*args, **keywords, **options)
    return {"state_cache": (state_owner, raw["state_cache"].cpu().numpy()),
            "k_cache": (cache_owner, raw["k_cache"].cpu().numpy())}


def assert_identical(results: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    for name, (expected, actual) in results.items():
        assert expected.shape == actual.shape, f"{name}: allocation sizes differ"
        assert np.array_equal(expected, actual), f"{name}: {first_difference(expected, actual)}"
