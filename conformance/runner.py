"""Run a scenario through the spec and through an implementation; compare every byte.

Both start from identical buffers (canary-filled caches, NaN-filled state padding). The
implementation's ``save_partial_states`` is judged on the state cache; its
``compress_norm_rope_store`` then runs on the *spec's* post-save state, so each operation
is judged on identical inputs.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np

from .. import spec
from ..spec.constants import DATA_RECORD_BYTES, ENTRY_BYTES, NOPE_DIM, QUANT_BLOCK, ratio_config
from ..spec.formats import bf16_to_f32, e4m3_to_f32, E4M3_MAGNITUDES
from ..spec.pooling import pool
from ..spec.postprocess import norm_weight_f32, quantize_nope, rms_norm
from .buffers import Buffer
from .capabilities import Features
from .implementations import LoadedImplementation
from .locate import Place, active_slot_map, locate_k_cache, locate_state
from .scenarios import Scenario, StepInputs

F32 = np.float32


@dataclass
class Expected:
    """The spec's bytes for one scenario."""

    state_after_save: np.ndarray  # uint8: the whole state allocation after save_partial_states
    k_cache_after_store: np.ndarray  # uint8: the whole compressed-cache allocation after the store


@dataclass
class Verdict:
    scenario: str
    implementation: str
    tokens: int
    active: int
    status: str  # "pass", "fail", "error", "unsupported" (declared, not called), "skip" (no device)
    first_difference: str = ""
    region: str | None = None
    counts: dict = field(default_factory=dict)  # deviations by kind (tolerant mode)

    @property
    def passed(self) -> bool:
        """Nothing wrong was seen (a scenario that was not checked did not fail either)."""
        return self.status in ("pass", "unsupported", "skip")

    @property
    def checked(self) -> bool:
        return self.status in ("pass", "fail", "error")


def run_spec(inputs: StepInputs) -> Expected:
    """The spec's result for a step (debug checks on: a scenario bug shows as an error here)."""
    b = inputs.batch
    state_owner, state = inputs.state_cache.numpy_copy()
    spec.save_partial_states(inputs.kv_score, inputs.ape, b.positions, b.slot_mapping, state, b.block_size, debug=True)
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    spec.compress_norm_rope_store(
        state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
        inputs.rms_norm_weight, inputs.rms_norm_eps, inputs.cos_sin_cache, k_cache, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=inputs.layout, fp8_scale=inputs.fp8_scale, debug=True,
    )
    return Expected(state_after_save=state_owner, k_cache_after_store=k_owner)


def to_torch(array: np.ndarray, device: str, strided: bool = False):
    """A torch copy of a NumPy array on ``device`` (uint16 bf16 patterns become bfloat16).

    ``strided``: the copy is a view into a wider allocation — rows padded by 3 elements and
    the base moved by 1 element (so neither the base nor the row stride is 16-byte aligned),
    with a unit last stride as SPEC §9 requires.
    """
    import torch

    if array.dtype == np.uint16:
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(array).copy())
    if not strided or tensor.dim() == 0:
        return tensor.to(device)
    shape = tuple(tensor.shape)
    padded = shape[:-1] + (shape[-1] + 3,) if tensor.dim() > 1 else shape
    wide = torch.full((1 + int(np.prod(padded)) + 5,), 0, dtype=tensor.dtype)
    if tensor.dtype.is_floating_point:
        wide.fill_(float("nan"))
    else:
        wide.fill_(-7)
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * padded[axis + 1]
    view = torch.as_strided(wide, shape, tuple(strides), 1)
    view.copy_(tensor)
    return view.to(device) if device == "cpu" else _strided_on(view, wide, device)


def _strided_on(view, wide, device: str):
    """The same strided view, on another device."""
    import torch

    moved = wide.to(device)
    return torch.as_strided(moved, view.shape, view.stride(), view.storage_offset())


def features(inputs: StepInputs) -> Features:
    """What a step asks of an implementation (checked against its capabilities)."""
    b = inputs.batch
    state = inputs.state_cache
    return Features(
        head_width=int(inputs.rms_norm_weight.shape[0]), compress_ratio=b.compress_ratio, layout=inputs.layout,
        block_size=b.block_size, entries_per_page=b.entries_per_page,
        state_strides=(state.strides[0] // 4, state.strides[1] // 4), strided_inputs=inputs.strided_inputs,
        max_position=int(b.positions.max(initial=0)),
    )


def run_implementation(impl: LoadedImplementation, inputs: StepInputs, expected: Expected, device: str) -> tuple[np.ndarray, np.ndarray]:
    """The implementation's state bytes after save and cache bytes after store."""
    import torch

    b = inputs.batch
    strided = inputs.strided_inputs
    t = {name: to_torch(getattr(b, name), device, strided) for name in
         ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")}
    state_owner, state = inputs.state_cache.torch_copy(device)
    impl.target.save_partial_states(to_torch(inputs.kv_score, device, strided), to_torch(inputs.ape, device, strided),
                                    t["positions"], t["slot_mapping"], state, b.block_size)
    if device == "cuda":
        torch.cuda.synchronize()
    state_after_save = state_owner.cpu().numpy().copy()
    state_owner.copy_(torch.from_numpy(expected.state_after_save).to(device))  # judge the store alone
    k_owner, k_cache = inputs.k_cache.torch_copy(device)
    impl.target.compress_norm_rope_store(
        state, t["token_to_req_indices"], t["positions"], t["slot_mapping"], t["block_table"], b.block_size,
        to_torch(inputs.rms_norm_weight, device, strided), inputs.rms_norm_eps, to_torch(inputs.cos_sin_cache, device, strided),
        k_cache, t["kv_slot_mapping"], compress_ratio=b.compress_ratio, layout=inputs.layout, fp8_scale=inputs.fp8_scale,
    )
    if device == "cuda":
        torch.cuda.synchronize()
    return state_after_save, k_owner.cpu().numpy().copy()


# ---- describing a difference -----------------------------------------------------------------
def _value_text(layout: str, place: Place, owner: np.ndarray, buffer: Buffer, byte: int) -> str:
    """A byte (or the value around it) as a reader wants to see it."""
    value = owner[byte]
    if place.region == "state":
        word = owner[byte - (byte - buffer.offset) % 4: byte - (byte - buffer.offset) % 4 + 4].view(F32)[0]
        return f"{word!r}"
    if layout == "flashmla_fp8" and place.region == "NoPE":
        return f"0x{value:02x} (e4m3 {float(e4m3_to_f32(np.uint8(value))):g})"
    if place.region in ("RoPE",) or layout == "bf16":
        start = byte - (byte - buffer.offset) % 2
        bits = owner[start:start + 2].view("<u2")[0]
        return f"0x{bits:04x} (bf16 {float(bf16_to_f32(np.uint16(bits))):g})"
    if layout == "fp8_per_tensor":
        return f"0x{value:02x} (e4m3 {float(e4m3_to_f32(np.uint8(value))):g})"
    return f"0x{value:02x}"


def first_difference(inputs: StepInputs, expected: np.ndarray, actual: np.ndarray, which: str) -> tuple[str, str]:
    """(description, region) of the first differing byte of the state or k_cache allocation."""
    b = inputs.batch
    byte = int(np.flatnonzero(expected != actual)[0])
    count = int(np.count_nonzero(expected != actual))
    if which == "state":
        saved = {int(s): int(i) for i, s in enumerate(b.slot_mapping) if s >= 0}
        place = locate_state(inputs.state_cache, byte, saved)
        buffer, layout = inputs.state_cache, None
        op = "save_partial_states"
    else:
        place = locate_k_cache(inputs.k_cache, inputs.layout, byte, active_slot_map(b.kv_slot_mapping, b.active))
        buffer, layout = inputs.k_cache, inputs.layout
        op = "compress_norm_rope_store"
    if place.token is not None:
        position = f" (position {int(b.positions[place.token])})"
    else:
        position = ""
    text = (f"{op}: {place.describe()}{position}: expected {_value_text(layout, place, expected, buffer, byte)}, "
            f"got {_value_text(layout, place, actual, buffer, byte)} [{count} bytes differ]")
    return text, place.region


# ---- tolerant comparison (SPEC §10) ----------------------------------------------------------
def _ordered(bits: np.ndarray, sign_bit: int) -> np.ndarray:
    """Sign-magnitude codes as ordered integers (+0 and -0 both 0)."""
    bits = bits.astype(np.int64)
    magnitude = bits & (sign_bit - 1)
    return np.where(bits & sign_bit, -magnitude, magnitude)


def _e4m3_spacing(codes: np.ndarray) -> np.ndarray:
    """The distance from an E4M3 magnitude code to the next one up (the last spacing repeats)."""
    c = np.minimum(codes.astype(np.int64) & 0x7F, 0x7D)
    return (E4M3_MAGNITUDES[c + 1] - E4M3_MAGNITUDES[c]).astype(np.float64)


def _spec_block_amax(inputs: StepInputs, state_after_save: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The spec's bf16 block amax [n, 7] of the given active tokens (from the post-save state)."""
    b = inputs.batch
    state = inputs.state_cache.view_of(state_after_save)
    x = pool(state, b.block_table, b.token_to_req_indices[tokens], b.positions[tokens], ratio_config(b.compress_ratio), b.block_size)
    return quantize_nope(rms_norm(x, norm_weight_f32(inputs.rms_norm_weight), F32(inputs.rms_norm_eps))).amax


def tolerant_counts(inputs: StepInputs, expected: np.ndarray, actual: np.ndarray, state_after_save: np.ndarray) -> dict[str, int]:
    """SPEC §10's tolerant verdict: deviations of the compressed cache counted by kind.

    Tolerated: NoPE within one E4M3 step (at the larger of the two scales), RoPE and bf16
    values within one bf16 ulp, a scale byte one off where the spec's amax lies within one
    ulp of ``448 * 2^k`` (amax is a bf16 value, so the ulp is bf16's). Not tolerated: any
    other difference, the pad byte, and any change to a byte no active token addresses.
    """
    b = inputs.batch
    counts: dict[str, int] = {}

    def bump(kind: str, n: int) -> None:
        if n:
            counts[kind] = counts.get(kind, 0) + int(n)

    differs = expected != actual
    if not differs.any():
        return counts
    addressed = np.zeros(expected.shape, dtype=bool)
    tokens = np.flatnonzero(b.active)
    slots = b.kv_slot_mapping[tokens]
    buffer = inputs.k_cache
    entries = buffer.shape[1]
    if inputs.layout == "flashmla_fp8":
        page_stride = buffer.strides[0] if buffer.shape[0] > 1 else entries * ENTRY_BYTES
        base = buffer.offset + (slots // entries) * page_stride
        data_at = base + (slots % entries) * DATA_RECORD_BYTES
        scale_at = base + entries * DATA_RECORD_BYTES + (slots % entries) * (ENTRY_BYTES - DATA_RECORD_BYTES)
        data_idx = data_at[:, None] + np.arange(DATA_RECORD_BYTES)
        scale_idx = scale_at[:, None] + np.arange(ENTRY_BYTES - DATA_RECORD_BYTES)
        addressed[data_idx] = True
        addressed[scale_idx] = True
        e_scale, a_scale = expected[scale_idx].astype(np.int64), actual[scale_idx].astype(np.int64)
        bump("pad", np.count_nonzero(e_scale[:, 7] != a_scale[:, 7]))
        scale_diff = e_scale[:, :7] != a_scale[:, :7]
        if scale_diff.any():
            amax = _spec_block_amax(inputs, state_after_save, tokens).astype(np.float64)
            k = e_scale[:, :7] - 127
            boundary = np.minimum(np.abs(amax - 448.0 * 2.0 ** k), np.abs(amax - 448.0 * 2.0 ** (k - 1)))
            bf16_ulp = np.ldexp(1.0, np.frexp(np.maximum(amax, 1e-30))[1] - 8)
            at_boundary = boundary <= bf16_ulp
            bump("scale within one ulp of a power-of-two boundary", np.count_nonzero(scale_diff & at_boundary & (np.abs(k - (a_scale[:, :7] - 127)) == 1)))
            bump("scale mismatch", np.count_nonzero(scale_diff & ~(at_boundary & (np.abs(k - (a_scale[:, :7] - 127)) == 1))))
        e_nope, a_nope = expected[data_idx[:, :NOPE_DIM]], actual[data_idx[:, :NOPE_DIM]]
        e_k = np.repeat(e_scale[:, :7] - 127, QUANT_BLOCK, axis=1)
        a_k = np.repeat(a_scale[:, :7] - 127, QUANT_BLOCK, axis=1)
        e_val = e4m3_to_f32(e_nope).astype(np.float64) * np.ldexp(1.0, e_k)
        a_val = e4m3_to_f32(a_nope).astype(np.float64) * np.ldexp(1.0, a_k)
        step = np.maximum(_e4m3_spacing(e_nope) * np.ldexp(1.0, e_k), _e4m3_spacing(a_nope) * np.ldexp(1.0, a_k))
        nope_diff = e_nope != a_nope
        close = np.abs(e_val - a_val) <= step
        bump("NoPE within one E4M3 step", np.count_nonzero(nope_diff & close))
        bump("NoPE beyond one E4M3 step", np.count_nonzero(nope_diff & ~close))
        rope_idx = data_idx[:, NOPE_DIM::2]
        e_rope = expected[rope_idx].astype(np.int64) | (expected[rope_idx + 1].astype(np.int64) << 8)
        a_rope = actual[rope_idx].astype(np.int64) | (actual[rope_idx + 1].astype(np.int64) << 8)
        rope_gap = np.abs(_ordered(e_rope, 0x8000) - _ordered(a_rope, 0x8000))
        bump("RoPE within one bf16 ulp", np.count_nonzero((rope_gap == 1) | ((rope_gap == 0) & (e_rope != a_rope))))
        bump("RoPE beyond one bf16 ulp", np.count_nonzero(rope_gap > 1))
    else:
        itemsize = buffer.dtype.itemsize
        page, offset = slots // entries, slots % entries
        start = buffer.offset + page * buffer.strides[0] + offset * buffer.strides[1]
        element_idx = start[:, None] + np.arange(512)[None, :] * buffer.strides[2]
        byte_idx = (element_idx[:, :, None] + np.arange(itemsize)).reshape(len(tokens), -1)
        addressed[byte_idx] = True
        if inputs.layout == "bf16":
            e_bits = expected[byte_idx].reshape(len(tokens), 512, 2).copy().view("<u2")[..., 0].astype(np.int64)
            a_bits = actual[byte_idx].reshape(len(tokens), 512, 2).copy().view("<u2")[..., 0].astype(np.int64)
            gap = np.abs(_ordered(e_bits, 0x8000) - _ordered(a_bits, 0x8000))
            unit = "bf16 ulp"
        else:
            e_bits, a_bits = expected[byte_idx].astype(np.int64), actual[byte_idx].astype(np.int64)
            gap = np.abs(_ordered(e_bits, 0x80) - _ordered(a_bits, 0x80))
            unit = "E4M3 step"
        differ = e_bits != a_bits
        for name, part in (("NoPE", slice(0, NOPE_DIM)), ("RoPE", slice(NOPE_DIM, 512))):
            bump(f"{name} within one {unit}", np.count_nonzero(differ[:, part] & (gap[:, part] <= 1)))
            bump(f"{name} beyond one {unit}", np.count_nonzero(differ[:, part] & (gap[:, part] > 1)))
    bump("untouched bytes written", np.count_nonzero(differs & ~addressed))
    return counts


def counts_pass(counts: dict[str, int]) -> bool:
    """Tolerant verdict: every deviation is of a tolerated kind (their names say "within one")."""
    return all("within one" in kind for kind in counts)


# ---- one scenario --------------------------------------------------------------------------
_CACHE: dict[str, list] = {}  # scenario name -> [inputs, expected or None]; the last two kept


def scenario_inputs(scenario: Scenario) -> StepInputs:
    """The scenario's inputs (built once; the last two scenarios are kept)."""
    if scenario.name not in _CACHE:
        while len(_CACHE) >= 2:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[scenario.name] = [scenario.build(), None]
    return _CACHE[scenario.name][0]


def spec_result(scenario: Scenario) -> tuple[StepInputs, Expected]:
    """Inputs and the spec's bytes for a scenario."""
    inputs = scenario_inputs(scenario)
    entry = _CACHE[scenario.name]
    if entry[1] is None:
        entry[1] = run_spec(inputs)
    return inputs, entry[1]


def run_scenario(impl: LoadedImplementation, scenario: Scenario, *, tolerant: bool = False, device: str | None = None) -> Verdict:
    """Judge ``impl`` on ``scenario``: exact (every byte) or tolerant (SPEC §10), or report it
    unsupported (outside the implementation's declared capabilities: not called)."""
    device = device or impl.device()
    inputs = scenario_inputs(scenario)
    verdict = Verdict(scenario.name, impl.name, inputs.batch.num_tokens, inputs.batch.num_active, "pass")
    if device is None:
        verdict.status = "skip"
        verdict.first_difference = f"needs one of {impl.devices}; none found here"
        return verdict
    if scenario.device and scenario.device != device:
        verdict.status = "skip"
        verdict.first_difference = f"runs on {scenario.device} only"
        return verdict
    reason = impl.capabilities.unsupported(features(inputs))
    if reason:
        verdict.status = "unsupported"
        verdict.first_difference = f"declared unsupported: {reason}"
        return verdict
    inputs, expected = spec_result(scenario)
    try:
        state_bytes, k_bytes = run_implementation(impl, inputs, expected, device)
    except Exception as error:  # an implementation may fail in any way; report it
        verdict.status = "error"
        verdict.first_difference = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        verdict.counts = {"traceback": traceback.format_exc()}
        return verdict
    state_ok = np.array_equal(state_bytes, expected.state_after_save)
    cache_ok = np.array_equal(k_bytes, expected.k_cache_after_store)
    if state_ok and cache_ok:
        return verdict
    if not state_ok:
        verdict.first_difference, verdict.region = first_difference(inputs, expected.state_after_save, state_bytes, "state")
    else:
        verdict.first_difference, verdict.region = first_difference(inputs, expected.k_cache_after_store, k_bytes, "k_cache")
    if tolerant:
        verdict.counts = tolerant_counts(inputs, expected.k_cache_after_store, k_bytes, expected.state_after_save)
        if not state_ok:
            verdict.counts["state bytes differ"] = int(np.count_nonzero(state_bytes != expected.state_after_save))
        verdict.status = "pass" if counts_pass(verdict.counts) else "fail"
    else:
        verdict.status = "fail"
    return verdict
