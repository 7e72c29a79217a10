"""Run a scenario through the spec and through an implementation; compare every byte.

Both start from identical buffers (canary-filled caches, NaN-filled state padding). The
implementation's ``save_partial_states`` is judged on the state cache; its
``compress_norm_rope_store`` then runs on the *spec's* post-save state, so each operation
is judged on identical inputs. A step-call scenario (SPEC §13.4) makes one
``compress_and_save`` call, judged on the state and ``k_cache`` after it (:mod:`.state_calls`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np

from .. import spec
from ..spec.constants import NOPE_DIM, QUANT_BLOCK
from ..spec.entry_layout import FLASHMLA_FP8, INDEXER_LAYOUTS, PAGED_LAYOUTS, EntryLayout
from ..spec.formats import bf16_to_f32, e4m3_bits, e4m3_to_f32
from ..spec.batch import Batch
from ..spec.rows import ChunkInputs
from ..spec.state_format import StateFormat
from . import bounds, state_calls, step_call
from .arrays import HostArrays, TorchArrays, arrays_for, to_numpy, to_torch  # noqa: F401  (to_numpy, to_torch: re-exported)
from .buffers import Buffer
from .capabilities import Features
from .implementations import LoadedImplementation
from .locate import Place, active_slot_map, locate_k_cache, locate_state
from .scenarios import Scenario, StepInputs
from .step_call import StaticArgs, StepArrays

METADATA = ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")  # a batch's per-step arrays

F32 = np.float32


@dataclass
class Expected:
    """The spec's bytes for one scenario."""

    state_after_save: np.ndarray  # uint8: the whole state allocation after save_partial_states
    k_cache_after_store: np.ndarray  # uint8: the whole compressed-cache allocation after the store


class StatusVerdict:
    """What a verdict's ``status`` says ("pass", "fail", "error", "unsupported": declared, not
    called, "skip": no device), for the verdict dataclasses that have one."""

    @property
    def passed(self) -> bool:
        """Nothing wrong was seen (a scenario that was not checked did not fail either)."""
        return self.status in ("pass", "unsupported", "skip")

    @property
    def checked(self) -> bool:
        return self.status in ("pass", "fail", "error")


@dataclass
class Verdict(StatusVerdict):
    scenario: str
    implementation: str
    tokens: int
    active: int
    status: str  # "pass", "fail", "error", "unsupported" (declared, not called), "skip" (no device)
    first_difference: str = ""
    region: str | None = None
    counts: dict = field(default_factory=dict)  # deviations by kind (tolerant mode)
    departure: str = ""  # the known departure (SPEC §14.10) that explains the bytes, where one does


def spec_step(inputs: StepInputs, state: np.ndarray, k_cache: np.ndarray) -> None:
    """The spec's two calls of a step on the given views, in place (debug checks on: a
    scenario bug shows as an error here); SPEC §13's keywords where the scenario uses them."""
    b = inputs.batch
    spec.save_partial_states(inputs.kv_score, inputs.ape, b.positions, b.slot_mapping, state, b.block_size, debug=True,
                             **state_calls.save_keywords(inputs))
    spec.compress_norm_rope_store(
        state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, b.block_size,
        inputs.rms_norm_weight, inputs.rms_norm_eps, inputs.cos_sin_cache, k_cache, b.kv_slot_mapping,
        compress_ratio=b.compress_ratio, layout=inputs.layout, fp8_scale=inputs.fp8_scale, debug=True,
        **({"hadamard": True} if inputs.hadamard else {}), **state_calls.compress_keywords(inputs, inputs.ape),
    )


def run_spec(inputs: StepInputs) -> Expected:
    """The spec's result for a step, from the step's own buffers (for the step call of SPEC
    §13.4, the state after the whole step)."""
    if inputs.step_call:
        return Expected(*state_calls.spec_step_call(inputs))
    state_owner, state = inputs.state_cache.numpy_copy()
    k_owner, k_cache = inputs.k_cache.numpy_copy()
    spec_step(inputs, state, k_cache)  # the store does not write the state: its bytes are those after the save
    return Expected(state_after_save=state_owner, k_cache_after_store=k_owner)


def features(inputs: StepInputs) -> Features:
    """What a step asks of an implementation (checked against its capabilities)."""
    b = inputs.batch
    state = inputs.state_cache
    return Features(
        head_width=int(inputs.rms_norm_weight.shape[0]), compress_ratio=b.compress_ratio, layout=inputs.layout,
        block_size=b.block_size, entries_per_page=b.entries_per_page,
        state_strides=(state.strides[0] // 4, state.strides[1] // 4), strided_inputs=inputs.strided_inputs,
        hadamard=inputs.hadamard, max_position=int(b.positions.max(initial=0)),
        large_offsets=max(inputs.state_cache.nbytes, inputs.k_cache.nbytes) > 2 ** 31,
        state_dtype="bf16" if state.dtype == np.uint16 else "fp32", ape_at=inputs.ape_at,
        ring_addressing=inputs.ring_capacity is not None, step_call=inputs.step_call,
    )


def implementation_arrays(arrays: HostArrays | TorchArrays, inputs: StepInputs, batch: Batch | None = None,
                          kv_score: np.ndarray | None = None) -> tuple[StepArrays, object, object]:
    """A step's arrays as an implementation takes them, with fresh copies of both cache
    allocations: ``(arrays, state allocation, k_cache allocation)``. ``batch`` and ``kv_score``
    replace the step's own (a part of it, say)."""
    b = inputs.batch if batch is None else batch
    kv_score = inputs.kv_score if kv_score is None else kv_score
    strided = inputs.strided_inputs
    state_owner, state = arrays.allocate(inputs.state_cache)
    k_owner, k_cache = arrays.allocate(inputs.k_cache)
    step = StepArrays(
        kv_score=arrays.convert(kv_score, strided), ape=arrays.convert(inputs.ape, strided),
        **{name: arrays.convert(getattr(b, name), strided) for name in METADATA},
        rms_norm_weight=arrays.convert(inputs.rms_norm_weight, strided),
        cos_sin_cache=arrays.convert(inputs.cos_sin_cache, strided), state_cache=state, k_cache=k_cache)
    return step, state_owner, k_owner


def run_implementation(impl: LoadedImplementation, inputs: StepInputs, expected: Expected, device: str) -> tuple[np.ndarray, np.ndarray]:
    """The implementation's state bytes after save and cache bytes after store (NumPy arrays
    on the host for an implementation that takes them, else torch tensors on ``device``).
    The store runs on the spec's post-save state, so each operation is judged alone; the step
    call of SPEC §13.4 is judged as one."""
    arrays = arrays_for(impl.takes_numpy, device)
    if inputs.step_call:
        return _run_step_call(impl, inputs, arrays)
    step, state_owner, k_owner = implementation_arrays(arrays, inputs)
    static = StaticArgs.of(inputs)
    step_call.save(impl.target, step, static)
    state_after_save = arrays.host_bytes(state_owner)
    arrays.load(state_owner, expected.state_after_save)  # judge the store alone
    step_call.compress(impl.target, step, static)
    return state_after_save, arrays.host_bytes(k_owner)


def _run_step_call(impl: LoadedImplementation, inputs: StepInputs,
                   arrays: HostArrays | TorchArrays) -> tuple[np.ndarray, np.ndarray]:
    """SPEC §13.4: the implementation's ``compress_and_save`` on fresh copies of the step's
    allocations (``kv`` and ``score`` two views of one projection output); the state and
    ``k_cache`` bytes after it."""
    state_owner, state = arrays.allocate(inputs.state_cache)
    k_owner, k_cache = arrays.allocate(inputs.k_cache)
    _, projections = arrays.allocate(inputs.projections)
    positional, keywords = state_calls.step_call_arguments(
        inputs, lambda array: arrays.convert(array, inputs.strided_inputs), projections, state, k_cache)
    impl.target.compress_and_save(*positional, **keywords)
    return arrays.host_bytes(state_owner), arrays.host_bytes(k_owner)


# ---- describing a difference -----------------------------------------------------------------
def _value_text(layout: str, place: Place, owner: np.ndarray, buffer: Buffer, byte: int) -> str:
    """A byte (or the value around it) as a reader wants to see it."""
    value = owner[byte]
    if place.region == "state" and buffer.dtype == np.uint16:  # a bf16 state (SPEC §13.1)
        start = byte - (byte - buffer.offset) % 2
        bits = owner[start:start + 2].view("<u2")[0]
        return f"0x{bits:04x} (bf16 {float(bf16_to_f32(np.uint16(bits))):g})"
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
        saves = b.save_slot_mapping if inputs.step_call else b.slot_mapping
        saved = {int(s): int(i) for i, s in enumerate(saves) if s >= 0}
        place = locate_state(inputs.state_cache, byte, saved)
        buffer, layout = inputs.state_cache, None
        op = "save_partial_states"
    else:
        place = locate_k_cache(inputs.k_cache, inputs.layout, byte, active_slot_map(b.kv_slot_mapping, b.active))
        buffer, layout = inputs.k_cache, inputs.layout
        op = "compress_norm_rope_store"
    if inputs.step_call:  # one call wrote both
        op = "compress_and_save"
    if place.token is not None:
        position = f" (position {int(b.positions[place.token])})"
    else:
        position = ""
    text = (f"{op}: {place.describe()}{position}: expected {_value_text(layout, place, expected, buffer, byte)}, "
            f"got {_value_text(layout, place, actual, buffer, byte)} [{count} bytes differ]")
    return text, place.region


# ---- tolerant comparison (SPEC §10) ----------------------------------------------------------
def record_indices(buffer, layout: EntryLayout, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte indices (into ``buffer.owner``) of the data and scale records of the given slots'
    entries, by the layout's descriptor: int ``[n, data_bytes]`` and ``[n, scale_bytes]``."""
    entries = buffer.shape[1]
    page_stride = buffer.strides[0] if buffer.shape[0] > 1 else entries * layout.entry_bytes
    base = buffer.offset + (slots // entries) * page_stride
    offset = slots % entries
    data_idx = (base + layout.data_offset(offset, entries))[:, None] + np.arange(layout.data_bytes)
    scale_idx = (base + layout.scale_offset(offset, entries))[:, None] + np.arange(layout.scale_bytes)
    return data_idx, scale_idx


def _entry_bytes(inputs: StepInputs, owner: np.ndarray, slots: np.ndarray) -> dict[str, np.ndarray]:
    """The written fields of the given slots' entries (and the byte indices they occupy)."""
    buffer = inputs.k_cache
    entries = buffer.shape[1]
    page, offset = slots // entries, slots % entries
    if inputs.layout == "flashmla_fp8":
        data_idx, scale_idx = record_indices(buffer, FLASHMLA_FP8, slots)
        rope = owner[data_idx[:, NOPE_DIM::2]].astype(np.uint16) | (owner[data_idx[:, NOPE_DIM + 1::2]].astype(np.uint16) << 8)
        return {"index": np.concatenate([data_idx, scale_idx], axis=1), "nope": owner[data_idx[:, :NOPE_DIM]],
                "rope": rope, "scale": owner[scale_idx[:, :7]], "pad": owner[scale_idx[:, 7]]}
    itemsize = buffer.dtype.itemsize
    start = buffer.offset + page * buffer.strides[0] + offset * buffer.strides[1]
    element_idx = start[:, None] + np.arange(512)[None, :] * buffer.strides[2]
    byte_idx = (element_idx[:, :, None] + np.arange(itemsize)).reshape(len(slots), -1)
    values = owner[byte_idx]
    if itemsize == 2:
        values = values.reshape(len(slots), 512, 2).copy().view("<u2")[..., 0]
    return {"index": byte_idx, "values": values}


def tolerant_counts(inputs: StepInputs, expected: np.ndarray, actual: np.ndarray, state_after_save: np.ndarray) -> dict[str, int]:
    """SPEC §10's tolerant verdict: written values counted by kind (docs/conformance.md).

    Each written value is accepted iff some real value within the error bound of the float64
    result (:mod:`.bounds`) converts to it, a zero with either sign; kinds whose name says
    "within" are tolerated.
    A scale byte outside its bound that equals SPEC §11's scale-floor formula is reported as
    "scale floor (SPEC §11)". Not tolerated: the pad byte, a byte no active token addresses.
    """
    b = inputs.batch
    counts: dict[str, int] = {}

    def bump(kind: str, n) -> None:
        if int(n):
            counts[kind] = counts.get(kind, 0) + int(n)

    if np.array_equal(expected, actual):
        return counts
    tokens = np.flatnonzero(b.active)
    slots = b.kv_slot_mapping[tokens]
    weight = inputs.rms_norm_weight
    weight = bf16_to_f32(weight) if weight.dtype == np.uint16 else weight.astype(F32)
    ref = bounds.reference(pooled_rows(inputs, state_after_save), b.token_to_req_indices[tokens], b.positions[tokens],
                           b.compress_ratio, weight, inputs.rms_norm_eps, inputs.cos_sin_cache)
    if inputs.layout in INDEXER_LAYOUTS:
        return _indexer_counts(inputs, expected, actual, slots, ref, bump, counts)
    got = _entry_bytes(inputs, actual, slots)
    addressed = np.zeros(expected.shape, dtype=bool)
    addressed[got["index"]] = True
    nope_lo, nope_hi = bounds.bf16_range(ref.y[:, :NOPE_DIM], ref.y_bound[:, :NOPE_DIM])
    rope_lo, rope_hi = bounds.bf16_range(ref.rope, ref.rope_bound)
    if inputs.layout == "flashmla_fp8":
        bump("pad byte not 0", np.count_nonzero(got["pad"] != 0))
        k_written = got["scale"].astype(np.int64) - 127
        least, most = bounds.block_amax_range(nope_lo, nope_hi)
        ok = (bounds.ue8m0_range(least) <= k_written) & (k_written <= bounds.ue8m0_range(most))
        floor = (bounds.scale_floor_exponent(least) <= k_written) & (k_written <= bounds.scale_floor_exponent(most))
        spec_entries = _entry_bytes(inputs, expected, slots)
        spec_k = spec_entries["scale"]
        differs = k_written != spec_k.astype(np.int64) - 127
        bump("scale within bound", np.count_nonzero(ok & differs))
        bump("scale floor (SPEC §11)", np.count_nonzero(~ok & floor))
        bump("scale beyond bound", np.count_nonzero(~ok & ~floor))
        k = np.repeat(k_written, QUANT_BLOCK, axis=1)
        low, high = bounds.e4m3_at(nope_lo, k), bounds.e4m3_at(nope_hi, k)
        accepted = bounds.within(got["nope"], low, high, 0x80)
        spec_nope = spec_entries["nope"]
        bump("NoPE within bound", np.count_nonzero(accepted & (got["nope"] != spec_nope)))
        bump("NoPE beyond bound", np.count_nonzero(~accepted))
        accepted = bounds.within(got["rope"], rope_lo, rope_hi, 0x8000)
        spec_rope = spec_entries["rope"]
        bump("RoPE within bound", np.count_nonzero(accepted & (got["rope"] != spec_rope)))
        bump("RoPE beyond bound", np.count_nonzero(~accepted))
    else:
        lo = np.concatenate([nope_lo, rope_lo], axis=1)
        hi = np.concatenate([nope_hi, rope_hi], axis=1)
        written = got["values"]
        spec_values = _entry_bytes(inputs, expected, slots)["values"]
        if inputs.layout == "bf16":
            accepted = bounds.within(written, lo, hi, 0x8000)
        else:
            inv = np.float64(np.float32(1.0) / np.float32(inputs.fp8_scale))
            low = e4m3_bits(bounds._f32(bf16_to_f32(lo).astype(np.float64) * inv))
            high = e4m3_bits(bounds._f32(bf16_to_f32(hi).astype(np.float64) * inv))
            accepted = bounds.within(written, low, high, 0x80)
        for name, part in (("NoPE", slice(0, NOPE_DIM)), ("RoPE", slice(NOPE_DIM, 512))):
            bump(f"{name} within bound", np.count_nonzero(accepted[:, part] & (written[:, part] != spec_values[:, part])))
            bump(f"{name} beyond bound", np.count_nonzero(~accepted[:, part]))
    bump("untouched bytes written", np.count_nonzero((expected != actual) & ~addressed))
    return counts


def pooled_rows(inputs: StepInputs, state_after_save: np.ndarray) -> bounds.StateRows:
    """Where the compress of a step reads its rows (SPEC §5, §13): the spec's state after the save,
    or for the step call the state before it and the call's own ``kv``/``score``."""
    b = inputs.batch
    chunk = None
    if inputs.step_call:
        state = inputs.state_cache.view_of(inputs.state_cache.owner)
        _, projections = inputs.projections.numpy_copy()
        kv, score = state_calls.projection_halves(projections)
        chunk = ChunkInputs(kv=kv, score=score, positions=b.positions, query_start_loc=b.query_start_loc)
    else:
        state = inputs.state_cache.view_of(state_after_save)
    state_format = StateFormat.of(state, inputs.ape_at, inputs.ring_capacity)
    return bounds.StateRows(state, b.block_table, b.block_size, state_format, inputs.ape, chunk)


def _indexer_counts(inputs: StepInputs, expected, actual, slots, ref, bump, counts) -> dict[str, int]:
    """SPEC §12's entries judged by the bounds (the scale at its written value)."""
    from ..spec.formats import mxfp4_exponent

    data_idx, scale_idx = record_indices(inputs.k_cache, PAGED_LAYOUTS[inputs.layout], slots)
    addressed = np.zeros(expected.shape, dtype=bool)
    addressed[data_idx] = True
    addressed[scale_idx] = True
    z, bz = bounds.indexer_values(ref, inputs.hadamard)
    lo, hi = bounds.bf16_range(z, bz)
    if inputs.layout == "indexer_fp8":
        written = actual[scale_idx].copy().view("<f4")[:, 0].astype(np.float64)
        mantissa, exponent = np.frexp(written)
        power_of_two = (mantissa == 0.5) & np.isfinite(written)
        k_written = np.where(power_of_two, exponent - 1, 0).astype(np.int64)
        least, most = bounds.block_amax_range(lo, hi, 128)
        ok = power_of_two[:, None] & (bounds.ue8m0_range(least) <= k_written[:, None]) & (k_written[:, None] <= bounds.ue8m0_range(most))
        differs = actual[scale_idx] != expected[scale_idx]
        bump("scale within bound", np.count_nonzero(ok[:, 0] & differs.any(axis=1)))
        bump("scale beyond bound", np.count_nonzero(~ok[:, 0]))
        k = np.repeat(k_written[:, None], 128, axis=1)
        accepted = bounds.within(actual[data_idx], bounds.e4m3_at(lo, k), bounds.e4m3_at(hi, k), 0x80)
        bump("values within bound", np.count_nonzero(accepted & (actual[data_idx] != expected[data_idx])))
        bump("values beyond bound", np.count_nonzero(~accepted))
    else:
        k_written = actual[scale_idx].astype(np.int64) - 127  # [n, 4]
        least, most = bounds.block_amax_range(lo, hi, 32)
        ok = (mxfp4_exponent(bounds._f32(least)) <= k_written) & (k_written <= mxfp4_exponent(bounds._f32(most)))
        bump("scale within bound", np.count_nonzero(ok & (actual[scale_idx] != expected[scale_idx])))
        bump("scale beyond bound", np.count_nonzero(~ok))
        k = np.repeat(k_written, 32, axis=1)
        packed = actual[data_idx]
        codes = np.stack([packed & 0xF, packed >> 4], axis=2).reshape(len(slots), 128)
        spec_packed = expected[data_idx]
        spec_codes = np.stack([spec_packed & 0xF, spec_packed >> 4], axis=2).reshape(len(slots), 128)
        accepted = bounds.within(codes, bounds.e2m1_at(lo, k), bounds.e2m1_at(hi, k), 0x8)
        bump("values within bound", np.count_nonzero(accepted & (codes != spec_codes)))
        bump("values beyond bound", np.count_nonzero(~accepted))
    bump("untouched bytes written", np.count_nonzero((expected != actual) & ~addressed))
    return counts


def counts_pass(counts: dict[str, int]) -> bool:
    """Tolerant verdict: every deviation is of a tolerated kind (their names say "within")."""
    return all("within" in kind for kind in counts)


# ---- one scenario --------------------------------------------------------------------------
_CACHE: dict[str, list] = {}  # scenario name -> [inputs, expected or None]; the last one kept


def scenario_inputs(scenario: Scenario) -> StepInputs:
    """The scenario's inputs (built once; the last scenario is kept: the CLI runs every
    implementation on a scenario before the next)."""
    if scenario.name not in _CACHE:
        while _CACHE:
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
    if device is None:
        return Verdict(scenario.name, impl.name, 0, 0, "skip", f"needs one of {impl.devices}; none found here")
    if scenario.device and impl.takes_numpy:  # decided before building its (large) buffers
        return Verdict(scenario.name, impl.name, 0, 0, "unsupported",
                       f"declared unsupported: runs on {scenario.device} only (torch tensors); this implementation takes NumPy arrays")
    if scenario.device and scenario.device != device:
        return Verdict(scenario.name, impl.name, 0, 0, "skip", f"runs on {scenario.device} only")
    inputs = scenario_inputs(scenario)
    verdict = Verdict(scenario.name, impl.name, inputs.batch.num_tokens, inputs.batch.num_active, "pass")
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
