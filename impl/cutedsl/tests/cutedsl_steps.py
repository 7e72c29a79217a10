"""The CuTe DSL GPU tests' steps, on the conformance suite's buffers and runner.

A :class:`Case` is a conformance :class:`~dsv4_compressor.conformance.scenarios.StepRecipe`
(a vLLM-style batch: shuffled block tables, padding tokens, non-boundary and dropped tokens,
padded state rows and blocks, canary-filled caches with padded pages or entries, a value
profile of the suite; the indexer layouts at head width 128, with or without the rotation).
Its inputs are built by the suite's ``build_step`` and the spec's bytes
by the suite's ``run_spec``; a :class:`DeviceStep` holds CUDA copies of the same allocations
(:meth:`Buffer.torch_copy`, padding included), so every comparison covers a whole allocation
and a stray write shows as a changed canary; :func:`assert_bytes` names the first differing
byte the way the conformance report does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from dsv4_compressor import spec
from dsv4_compressor.conformance.runner import Expected, first_difference, run_spec, to_torch
from dsv4_compressor.conformance.scenarios import StepInputs, StepRecipe, build_step
from dsv4_compressor.spec import batch as B
from dsv4_compressor.spec.constants import INDEXER_HEAD_DIM
from dsv4_compressor.spec.entry_layout import INDEXER_LAYOUTS

METADATA = ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")
FP8_SCALE = 0.0371  # fp8_per_tensor's scale in every case


def mixed_requests(ratio: int, rng) -> list[B.Request]:
    """Decode requests at and off a boundary, the first window (C4 ``p = 3``: invalid rows 0..3)
    and a prefill chunk."""
    if ratio == 4:
        return (B.decode_requests(6, 4, rng, boundary=True, max_entries=40)
                + B.decode_requests(3, 4, rng, boundary=False, max_entries=40)
                + [B.Request(0, 13), B.Request(21, 30)])  # p = 3 (invalid rows 0..3) and a prefill chunk
    return (B.decode_requests(5, 128, rng, boundary=True, max_entries=8)
            + B.decode_requests(2, 128, rng, boundary=False, max_entries=8)
            + [B.Request(100, 300), B.Request(0, 128)])


@dataclass(frozen=True)
class Case:
    """One step of :func:`mixed_requests`, as a conformance recipe."""

    ratio: int
    block_size: int
    entries: int  # B
    layout: str = "flashmla_fp8"
    bf16_weight: bool = True
    values: str = "normal"  # a value profile of the conformance suite (scenarios.VALUE_PROFILES)
    odd_cache_stride: bool = False  # bf16 / fp8_per_tensor: entry stride 513 (no vector stores)
    seed: int = 0
    strided_inputs: bool = False  # inputs as views whose base and rows are not 16-byte aligned
    unsaved_fraction: float = 0.0  # tokens whose state is not saved (slot -1)
    row_pad: int = 4  # floats after each state row
    block_pad_rows: int = 1  # rows after each state block
    hadamard: bool = False  # SPEC §12's rotation (indexer layouts)
    slots_for_all: bool = False  # non-boundary tokens carry their group's kv slot too (they still write nothing)

    @property
    def name(self) -> str:
        return (f"r{self.ratio}-bs{self.block_size}-B{self.entries}-{self.layout}{'-hadamard' if self.hadamard else ''}-"
                f"{'wbf16' if self.bf16_weight else 'wf32'}-{self.values}{'-odd' if self.odd_cache_stride else ''}"
                f"{'-strided' if self.strided_inputs else ''}{'-slots' if self.slots_for_all else ''}")

    def recipe(self) -> StepRecipe:
        indexer = self.layout in INDEXER_LAYOUTS
        return StepRecipe(
            requests=partial(mixed_requests, self.ratio), compress_ratio=self.ratio, block_size=self.block_size,
            entries_per_page=self.entries, layout=self.layout, bf16_weight=self.bf16_weight,
            fp8_scale=FP8_SCALE if self.layout == "fp8_per_tensor" else None, num_padding=3, padding_at_end=False,
            row_pad=self.row_pad, block_pad_rows=self.block_pad_rows,
            page_pad_bytes=32 if self.layout == "flashmla_fp8" or indexer else 0, drop_entry_fraction=0.15,
            unsaved_fraction=self.unsaved_fraction, slot_for_non_boundary=self.slots_for_all, values=self.values,
            strided_inputs=self.strided_inputs, entry_pad=1 if self.odd_cache_stride else 0,
            **(dict(head_dim=INDEXER_HEAD_DIM, hadamard=self.hadamard) if indexer else {}),
        )

    def inputs(self) -> StepInputs:
        return build_step(self.recipe(), np.random.default_rng(self.seed))


class DeviceStep:
    """Device copies of one step's inputs: the state and k_cache allocations whole (``*_owner``:
    uint8, padding included) with their views, and the other arrays as the suite hands them
    to an implementation."""

    def __init__(self, inputs: StepInputs, device: str = "cuda"):
        self.inputs = inputs
        self.device = device
        self.state_owner, self.state = inputs.state_cache.torch_copy(device)
        self.k_owner, self.k_cache = inputs.k_cache.torch_copy(device)
        strided = inputs.strided_inputs
        self.meta = {name: to_torch(getattr(inputs.batch, name), device, strided) for name in METADATA}
        self.kv_score = to_torch(inputs.kv_score, device, strided)
        self.ape = to_torch(inputs.ape, device, strided)
        self.weight = to_torch(inputs.rms_norm_weight, device, strided)
        self.cos_sin = to_torch(inputs.cos_sin_cache, device, strided)

    @property
    def batch(self) -> B.Batch:
        return self.inputs.batch

    def compress_args(self) -> dict:
        """``compress_norm_rope_store``'s tensor and metadata arguments (all but ratio and layout)."""
        return dict(state_cache=self.state, **self.meta, block_size=self.batch.block_size,
                    rms_norm_weight=self.weight, rms_norm_eps=self.inputs.rms_norm_eps, cos_sin_cache=self.cos_sin,
                    k_cache=self.k_cache)

    def layout_kwargs(self) -> dict:
        return dict(compress_ratio=self.batch.compress_ratio, layout=self.inputs.layout,
                    fp8_scale=self.inputs.fp8_scale, **({"hadamard": True} if self.inputs.hadamard else {}))

    def save_args(self) -> tuple:
        """``save_partial_states``'s arguments."""
        return (self.kv_score, self.ape, self.meta["positions"], self.meta["slot_mapping"], self.state,
                self.batch.block_size)

    def state_bytes(self) -> np.ndarray:
        return self._host(self.state_owner)

    def k_bytes(self) -> np.ndarray:
        return self._host(self.k_owner)

    def _host(self, owner) -> np.ndarray:
        if self.device == "cuda":
            torch.cuda.synchronize()
        return owner.cpu().numpy().copy()

    def load_state(self, owner: np.ndarray) -> None:
        """The whole state allocation from host bytes (the spec's post-save state, say)."""
        self.state_owner.copy_(torch.from_numpy(owner).to(self.device))

    def move_metadata(self, seed: int = 123) -> B.Batch:
        """New metadata for a graph replay, written into the CUDA tensors in place: the same
        logical rows on relocated state blocks (the state moved with them) and other kv slots;
        returns the moved batch for the spec."""
        rng = np.random.default_rng(seed)
        state = self.inputs.state_cache.view_of(self.state_bytes())
        moved, moved_state = B.relocate_state_blocks(self.batch, state, rng)
        kv_slots = moved.kv_slot_mapping.copy()
        used = kv_slots >= 0
        kv_slots[used] = rng.permutation(self.batch.num_pages * self.batch.entries_per_page)[: used.sum()]
        moved = replace(moved, kv_slot_mapping=kv_slots)
        self.state.copy_(torch.from_numpy(np.ascontiguousarray(moved_state)).to(self.device))
        for name in ("slot_mapping", "block_table", "kv_slot_mapping"):
            self.meta[name].copy_(torch.from_numpy(getattr(moved, name)).to(self.device))
        return moved


def spec_store(inputs: StepInputs, state_owner: np.ndarray, batch: B.Batch) -> np.ndarray:
    """The spec's k_cache allocation after ``compress_norm_rope_store`` of ``batch`` on the
    state allocation ``state_owner`` (bytes), from the step's canary cache."""
    state = inputs.state_cache.view_of(state_owner.copy())
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    spec.compress_norm_rope_store(state, batch.token_to_req_indices, batch.positions, batch.slot_mapping,
                                  batch.block_table, batch.block_size, inputs.rms_norm_weight, inputs.rms_norm_eps,
                                  inputs.cos_sin_cache, k_cache, batch.kv_slot_mapping,
                                  compress_ratio=batch.compress_ratio, layout=inputs.layout, fp8_scale=inputs.fp8_scale,
                                  debug=True, **({"hadamard": True} if inputs.hadamard else {}))
    return k_owner


def assert_bytes(label: str, inputs: StepInputs, which: str, got: np.ndarray, expected: np.ndarray) -> None:
    """Every byte of the ``which`` allocation ("state" or "k_cache") equal, or the first
    difference described as the conformance report does (token, entry, region, values)."""
    assert got.shape == expected.shape, (label, got.shape, expected.shape)
    if not np.array_equal(got, expected):
        text, _ = first_difference(inputs, expected, got, which)
        raise AssertionError(f"{label}: {text}")


def run_step(case: Case, *, impl=None, device: str = "cuda", **choices) -> tuple[DeviceStep, Expected]:
    """``save_partial_states`` then ``compress_norm_rope_store`` (the latter on the spec's
    post-save state, so each is judged alone), every byte of both allocations compared with
    the spec's: the state after the save, the k_cache after the store, and the state again
    (the store must not write it). ``choices``: keywords of the compress call (``policy`` and
    ``pdl`` go to the save call too). ``impl``: the CuTe DSL operations unless given (the
    harness's own CPU test passes the suite's torch reference)."""
    if impl is None:
        from dsv4_compressor.impl import cutedsl as impl

    inputs = case.inputs()
    assert inputs.batch.num_active > 0
    expected = run_spec(inputs)
    step = DeviceStep(inputs, device)
    impl.save_partial_states(*step.save_args(), **{k: v for k, v in choices.items() if k in ("policy", "pdl")})
    assert_bytes(f"{case.name} state after save", inputs, "state", step.state_bytes(), expected.state_after_save)
    step.load_state(expected.state_after_save)
    impl.compress_norm_rope_store(**step.compress_args(), **step.layout_kwargs(), **choices)
    assert_bytes(f"{case.name} k_cache", inputs, "k_cache", step.k_bytes(), expected.k_cache_after_store)
    assert_bytes(f"{case.name} state after store", inputs, "state", step.state_bytes(), expected.state_after_save)
    return step, expected


C4_CASES = [
    Case(4, 4, 64),
    Case(4, 8, 1, bf16_weight=False, values="spread_scores"),
    Case(4, 16, 2, layout="bf16", values="signed_zeros"),
    Case(4, 4, 2, layout="fp8_per_tensor", bf16_weight=False),
    Case(4, 3, 64, layout="bf16", bf16_weight=False, values="tiny_amax", odd_cache_stride=True),
    Case(4, 4, 1, layout="fp8_per_tensor", bf16_weight=False, values="huge", odd_cache_stride=True),
    Case(4, 1, 64, values="signed_zeros"),
]
C128_CASES = [  # each with the C128 paths that can take its block size
    (Case(128, 8, 64), ("fused_cluster", "fused_handoff", "fused_pipelined", "split_block8", "split_generic")),
    (Case(128, 8, 1, bf16_weight=False, values="spread_scores"), ("fused_cluster", "fused_handoff", "fused_pipelined", "split_block8")),
    (Case(128, 4, 2, layout="bf16", values="signed_zeros"), ("fused_cluster", "fused_handoff", "fused_pipelined", "split_generic")),
    (Case(128, 16, 2, layout="fp8_per_tensor", bf16_weight=False), ("fused_cluster", "fused_handoff", "fused_pipelined", "split_block8")),
    (Case(128, 5, 64, bf16_weight=False, values="huge"), ("fused_cluster", "fused_handoff", "fused_pipelined", "split_generic")),
    (Case(128, 8, 2, layout="bf16", bf16_weight=False, values="tiny_amax", odd_cache_stride=True),
     ("fused_cluster", "fused_handoff", "fused_pipelined", "split_block8")),
    (Case(128, 8, 3, layout="fp8_per_tensor", values="normal", odd_cache_stride=True), ("fused_cluster", "fused_handoff", "fused_pipelined")),
]

INDEXER_FP8, INDEXER_MXFP4 = "indexer_fp8", "indexer_mxfp4"
INDEXER_C4_CASES = [  # SPEC §12, C4
    Case(4, 16, 64, INDEXER_FP8),  # production: bs 16
    Case(4, 16, 64, INDEXER_FP8, hadamard=True),
    Case(4, 16, 64, INDEXER_MXFP4),
    Case(4, 16, 7, INDEXER_MXFP4, hadamard=True),
    Case(4, 4, 1, INDEXER_FP8, bf16_weight=False, values="spread_scores"),  # most exp2s arguments below -126 or subnormal
    Case(4, 3, 2, INDEXER_FP8, hadamard=True, values="spread_scores", seed=1),
    Case(4, 1, 64, INDEXER_MXFP4, values="signed_zeros"),  # every value and code a signed zero
    Case(4, 2, 64, INDEXER_FP8, hadamard=True, values="signed_zeros"),
    Case(4, 6, 3, INDEXER_FP8, bf16_weight=False, values="indexer_tiny"),  # amax below the FP8 floor, MXFP4 blocks below 6*2^-126
    Case(4, 5, 64, INDEXER_MXFP4, hadamard=True, bf16_weight=False, values="indexer_tiny"),
    Case(4, 8, 2, INDEXER_MXFP4, bf16_weight=False, values="huge"),  # large scale bytes
    Case(4, 12, 64, INDEXER_FP8, hadamard=True, bf16_weight=False, values="huge"),
    Case(4, 16, 4, INDEXER_MXFP4, slots_for_all=True, seed=2),
    Case(4, 16, 4, INDEXER_MXFP4, hadamard=True, values="hadamard_cancel"),  # the rotation's stage order shows
]
INDEXER_C128_CASES = [  # SPEC §12, C128
    Case(128, 8, 64, INDEXER_FP8),  # production: bs 8
    Case(128, 8, 2, INDEXER_MXFP4, hadamard=True),
    Case(128, 5, 3, INDEXER_FP8, hadamard=True, bf16_weight=False, values="spread_scores"),
    Case(128, 16, 1, INDEXER_MXFP4, values="signed_zeros"),
    Case(128, 12, 64, INDEXER_MXFP4, bf16_weight=False, values="indexer_tiny"),
    Case(128, 4, 2, INDEXER_FP8, hadamard=True, bf16_weight=False, values="huge"),
    Case(128, 8, 3, INDEXER_FP8, slots_for_all=True, seed=2),
]


def case_id(value) -> str:
    """A readable pytest id for a :class:`Case` or a path name."""
    return value.name if isinstance(value, Case) else str(value)
