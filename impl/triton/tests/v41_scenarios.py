"""Scenarios for the Triton V4.1 tests: one step's NumPy buffers from ``spec.v41_batch``, the spec
and Triton run from identical copies, and whole allocations compared byte for byte.

Every buffer is built once in NumPy (padded rows and pages, canary bytes). The spec runs on one
copy, Triton on a torch twin of another with the same allocation layout
(:class:`~dsv4_compressor.conformance.buffers.Buffer`), so comparing whole allocations also
catches writes into padding, into rows of inactive tokens and into untouched entries.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dsv4_compressor import spec
from dsv4_compressor.conformance.buffers import Buffer
from dsv4_compressor.impl.triton.tests.triton_test_scenarios import assert_identical  # noqa: F401  (the V4 tests' comparison)
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec import v41_batch as V
from dsv4_compressor.spec.batch import Request

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
CACHE_DTYPES = {"bf16": "bfloat16", "fp8_per_tensor": "float8_e4m3fn"}  # every other layout: uint8


def padded_rows(values: np.ndarray, row_pad: int) -> np.ndarray:
    """``values`` ``[T, W]`` copied into rows padded by ``row_pad`` elements (a multiple of 16 bytes), canary-filled."""
    out = B.padded_view(values.shape, values.dtype, (0, row_pad), B.CANARY_BYTE * (0x0101 if values.dtype == np.uint16 else 1))
    out[...] = values
    return out


@dataclass
class V41Case:
    """One V4.1 step's arguments as NumPy arrays (the spec's view: bf16 as uint16 patterns)."""

    ratio: int
    tables: V.V41Tables
    step: V.V41Step
    kv: np.ndarray  # float32 or uint16 [T, 512]
    score: np.ndarray | None  # ratio 2
    state_cache: np.ndarray | None  # ratio 2: float32 or uint16 [num_state_blocks, bs, 1024]
    weight: np.ndarray  # float32 or uint16 [512]
    cos_sin: np.ndarray  # float32 [max_pos, 64]
    k_cache: np.ndarray | None
    latent: np.ndarray  # uint16 [T, 512], canary-filled
    layout: str | None
    fp8_scale: float | None = None
    eps: float = EPS
    notes: dict = field(default_factory=dict)

    @property
    def state(self) -> V.StateLayout:
        return self.tables.state

    def compress_arguments(self, latent) -> dict:
        """``spec.v41_compress_norm``'s arguments (ratio 1: the state arguments ``None``)."""
        s, t = self.step, self.tables
        arguments = dict(kv=self.kv, score=self.score, positions=s.positions, token_to_req=s.token_to_req,
                         query_start_loc=s.query_start_loc, slot_mapping=s.slot_mapping,
                         save_slot_mapping=s.save_slot_mapping, block_table=t.block_table, bs=t.state.block_size,
                         state_cache=self.state_cache, rms_norm_weight=self.weight, rms_norm_eps=self.eps,
                         kv_slot_mapping=s.kv_slot_mapping, latent=latent, compress_ratio=self.ratio,
                         ring_capacity=t.state.ring_capacity)
        if self.ratio == 1:
            arguments.update(score=None, token_to_req=None, query_start_loc=None, slot_mapping=None, save_slot_mapping=None,
                             block_table=None, bs=None, state_cache=None, ring_capacity=None)
        return arguments


def build_case(requests: list[Request], *, ratio: int, seed: int, state: V.StateLayout | None = None,
               layout: str | None = "v41_nvfp4", entries_per_page: int = 4, bf16_inputs: bool = False,
               bf16_score: bool | None = None, bf16_state: bool = False, bf16_weight: bool = False, num_padding: int = 1,
               drop_entry_fraction: float = 0.0, unslotted_fraction: float = 0.0, page_pad_bytes: int = 0,
               input_row_pad: int = 0, state_row_pad: int = 16, latent_row_pad: int = 8, fp8_scale: float | None = None,
               cos_sin_row_pad: int = 0) -> V41Case:
    """A step of ``requests`` (request ``i`` = block-table row ``i``) with random projections and state."""
    rng = np.random.default_rng(seed)
    state = state or V.paged(4)
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=ratio, state=state,
                          entries_per_page=entries_per_page, rng=rng)
    step = V.v41_step(tables, requests, rng=rng, num_padding=num_padding, drop_entry_fraction=drop_entry_fraction,
                      unslotted_fraction=unslotted_fraction)
    kv32, score32 = V.projections(step.num_tokens, rng)
    kv = V.bf16_patterns(kv32) if bf16_inputs else kv32
    score = V.bf16_patterns(score32) if (bf16_inputs if bf16_score is None else bf16_score) else score32
    state_cache = V.state_cache(tables.num_state_blocks, state.block_size, rng, bf16=bf16_state, row_pad=state_row_pad)
    weight = B.random_norm_weight(rng, bf16=bf16_weight)
    max_pos = int(step.positions.max()) + 2
    cos_sin = B.padded_view((max_pos, 64), np.float32, (0, cos_sin_row_pad), np.float32(np.nan))
    cos_sin[...] = B.rope_cos_sin_cache(max_pos)
    k_cache = None if layout is None else B.canary_k_cache(layout, tables.num_pages, entries_per_page,
                                                           page_pad_bytes=page_pad_bytes)
    if layout == "fp8_per_tensor" and fp8_scale is None:
        fp8_scale = 0.0123
    return V41Case(ratio=ratio, tables=tables, step=step, kv=padded_rows(kv, input_row_pad),
                   score=padded_rows(score, input_row_pad) if ratio == 2 else None,
                   state_cache=state_cache if ratio == 2 else None, weight=weight, cos_sin=cos_sin, k_cache=k_cache,
                   latent=V.latent_buffer(step.num_tokens, row_pad=latent_row_pad), layout=layout, fp8_scale=fp8_scale)


@contextmanager
def programs_in_reverse_order():
    """Under ``TRITON_INTERPRET=1``, run every launch's programs from the last to the first.

    The interpreter runs programs one after another in program-id order, which hides every
    dependence of a program on another's writes that happens to follow that order. A GPU runs
    them in any order and at once: a launch whose bytes change when its programs run backwards
    depends on an order the GPU does not keep.
    """
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    forward = builder.set_grid_idx

    def backward(x, y, z):
        nx, ny, nz = builder.grid_dim
        forward(nx - 1 - x, ny - 1 - y, nz - 1 - z)

    builder.set_grid_idx = backward
    try:
        yield
    finally:
        del builder.set_grid_idx


# ---- torch twins ------------------------------------------------------------------------------------
def torch_twin(array: np.ndarray | None, logical: str | None = None):
    """``(allocation uint8 tensor, view tensor)`` of a NumPy buffer on the test device (None for None)."""
    if array is None:
        return None, None
    return Buffer.of(array, logical).torch_copy(DEVICE)


def torch_metadata(array: np.ndarray | None):
    return None if array is None else torch.from_numpy(np.ascontiguousarray(array)).to(DEVICE)


def spec_copy(array: np.ndarray | None):
    """``(allocation, view)`` NumPy copies of a buffer (None for None)."""
    return (None, None) if array is None else Buffer.of(array).numpy_copy()


def torch_arguments(arguments: dict) -> tuple[dict, dict]:
    """The spec's keyword arguments as torch tensors (buffers through :func:`torch_twin`) and the
    allocations behind the written ones (``latent``, ``state_cache``, ``k_cache``)."""
    layout = arguments.get("layout")
    out, owners = {}, {}
    for name, value in arguments.items():
        if not isinstance(value, np.ndarray):
            out[name] = value
        elif name in ("kv", "score", "state_cache", "latent", "k_cache", "rms_norm_weight", "cos_sin_cache", "k_pre"):
            logical = CACHE_DTYPES.get(layout) if name == "k_cache" else None
            owners[name], out[name] = torch_twin(value, logical)
        else:
            out[name] = torch_metadata(value)
    return out, owners


def run_both(spec_function, family_function, arguments: dict, written: tuple[str, ...]) -> dict:
    """Run ``spec_function`` on NumPy copies and ``family_function`` on torch twins of ``arguments``;
    ``{name: (spec allocation bytes, the family's allocation bytes)}`` of every written buffer."""
    spec_arguments, spec_owners = dict(arguments), {}
    for name in written:
        if arguments.get(name) is not None:
            spec_owners[name], spec_arguments[name] = spec_copy(arguments[name])
    spec_function(**spec_arguments)
    torch_args, owners = torch_arguments(arguments)
    family_function(**torch_args)
    return {name: (spec_owners[name], owners[name].cpu().numpy()) for name in spec_owners}


# ---- the four operations, spec against a kernel family ----------------------------------------------------
RECORDS = ("flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4")
# decode at odd positions (row p - 1 from the state) and an even one, prefill chunks from 0 and from an odd position
MIXED = [Request(3, 1), Request(8, 1), Request(0, 5), Request(9, 3)]


def operation(family: str, name: str):
    """The kernel family's (``"triton"`` or ``"cutedsl"``) operation ``v41_<name>``."""
    return getattr(importlib.import_module(f"dsv4_compressor.impl.{family}"), f"v41_{name}")


def written(results: dict) -> None:
    """The call wrote something: latent rows and a record (guards against comparing two untouched buffers)."""
    for name in ("latent", "k_cache"):
        if name in results:
            assert np.count_nonzero(results[name][0] != B.CANARY_BYTE) > 0, f"{name}: nothing was written"


def combined(case: V41Case, *, latent: bool = True, family: str = "triton", **options) -> dict:
    """``v41_compress_norm_rope_store`` (``latent=None`` when not ``latent``); ``options``: the
    family's own keywords."""
    arguments = case.compress_arguments(case.latent if latent else None)
    arguments.update(cos_sin_cache=case.cos_sin, k_cache=case.k_cache, layout=case.layout, fp8_scale=case.fp8_scale)
    run = operation(family, "compress_norm_rope_store")
    return run_both(spec.v41_compress_norm_rope_store, lambda **a: run(**a, **options), arguments,
                    ("latent", "state_cache", "k_cache"))


def compress_norm(case: V41Case, *, family: str = "triton", **options) -> dict:
    run = operation(family, "compress_norm")
    return run_both(spec.v41_compress_norm, lambda **a: run(**a, **options), case.compress_arguments(case.latent),
                    ("latent", "state_cache"))


def rope_quant_store(case: V41Case, latent: np.ndarray | None = None, *, family: str = "triton", **options) -> dict:
    """``v41_rope_quant_store`` of ``latent`` (default: random bf16 rows for every token)."""
    if latent is None:
        latent = padded_rows(V.bf16_patterns(np.random.default_rng(1).standard_normal((case.step.num_tokens, 512))), 8)
    arguments = dict(latent=latent, positions=case.step.positions, kv_slot_mapping=case.step.kv_slot_mapping,
                     cos_sin_cache=case.cos_sin, k_cache=case.k_cache, compress_ratio=case.ratio, layout=case.layout,
                     fp8_scale=case.fp8_scale)
    run = operation(family, "rope_quant_store")
    return run_both(spec.v41_rope_quant_store, lambda **a: run(**a, **options), arguments, ("k_cache",))


def index_key_arguments(case: V41Case, layout: str, *, bf16_weight: bool = True, k_pre_row_pad: int = 0,
                        seed: int = 2) -> dict:
    rng = np.random.default_rng(seed)
    k_pre = V.k_pre(case.step.num_tokens, rng)
    return dict(k_pre=padded_rows(k_pre, k_pre_row_pad) if k_pre_row_pad else k_pre, positions=case.step.positions,
                kv_slot_mapping=case.step.kv_slot_mapping,
                rms_norm_weight=B.random_norm_weight(rng, bf16=bf16_weight, head_dim=128), rms_norm_eps=EPS,
                cos_sin_cache=case.cos_sin, k_cache=B.canary_k_cache(layout, case.tables.num_pages,
                                                                     case.tables.entries_per_page, page_pad_bytes=16),
                compress_ratio=case.ratio, layout=layout)


def index_key_store(arguments: dict, *, family: str = "triton", **options) -> dict:
    run = operation(family, "index_key_store")
    return run_both(spec.v41_index_key_store, lambda **a: run(**a, **options), arguments, ("k_cache",))


def run_steps(plan: list[list[tuple[int, int]]], layout_state: V.StateLayout, *, bf16_state: bool, seed: int,
              family: str = "triton") -> None:
    """Runs ``plan`` (per step, ``(context_len, num_tokens)`` of each request) through the spec and
    the kernel family, each on its own buffers carried across the steps, comparing every buffer
    after every step."""
    run = operation(family, "compress_norm_rope_store")
    rng = np.random.default_rng(seed)
    reach = [max(c + n for c, n in (step[i] for step in plan)) for i in range(len(plan[0]))]
    tables = V.v41_tables(reach, compress_ratio=2, state=layout_state, entries_per_page=4, rng=rng)
    state = V.state_cache(tables.num_state_blocks, layout_state.block_size, rng, bf16=bf16_state, row_pad=8)
    k_cache = B.canary_k_cache("v41_nvfp4", tables.num_pages, 4, page_pad_bytes=16)
    weight, cos_sin = B.random_norm_weight(rng, bf16=True), B.rope_cos_sin_cache(max(reach) + 2)
    spec_state, spec_cache = spec_copy(state), spec_copy(k_cache)
    ours_state, ours_cache = torch_twin(state), torch_twin(k_cache)
    for number, requests in enumerate(plan):
        step = V.v41_step(tables, [Request(c, n) for c, n in requests], num_padding=1)
        kv, score = V.projections(step.num_tokens, rng, bf16=number % 2 == 1)
        latent = V.latent_buffer(step.num_tokens)
        arguments = dict(kv=kv, score=score, positions=step.positions, token_to_req=step.token_to_req,
                         query_start_loc=step.query_start_loc, slot_mapping=step.slot_mapping,
                         save_slot_mapping=step.save_slot_mapping, block_table=tables.block_table,
                         bs=layout_state.block_size, rms_norm_weight=weight, rms_norm_eps=EPS, cos_sin_cache=cos_sin,
                         kv_slot_mapping=step.kv_slot_mapping, compress_ratio=2, layout="v41_nvfp4",
                         ring_capacity=layout_state.ring_capacity)
        spec_latent = spec_copy(latent)
        spec.v41_compress_norm_rope_store(**arguments, state_cache=spec_state[1], k_cache=spec_cache[1],
                                          latent=spec_latent[1])
        torch_args, _ = torch_arguments(arguments)
        ours_latent = torch_twin(latent)
        run(**torch_args, state_cache=ours_state[1], k_cache=ours_cache[1], latent=ours_latent[1])
        assert_identical({f"step {number} {name}": (expected[0], actual[0].cpu().numpy()) for name, expected, actual in (
            ("latent", spec_latent, ours_latent), ("state_cache", spec_state, ours_state),
            ("k_cache", spec_cache, ours_cache))})


def with_step(case: V41Case, **changes) -> V41Case:
    """``case`` with some of its step's arrays replaced."""
    return replace(case, step=replace(case.step, **changes))
