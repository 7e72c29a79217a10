"""Run a DeepSeek-V4.1 scenario (SPEC §14) through the spec and through an implementation; compare
every byte of every allocation the call may write: the latent (an output, or the store's input
that must stay unchanged), ratio 2's state after the call, and the compressed cache.

Verdicts are V4's (:class:`~.runner.Verdict`): exact, tolerant (:mod:`.v41_bounds`), unsupported
(outside the implementation's ``Capabilities.v41``, or a call answered with
``NotImplementedError`` having written nothing), error. A difference is described by the first
differing byte (buffer, token, region, channel, both values) and, where a departure of SPEC
§14.10 recomputes the implementation's bytes, by that departure's name (:mod:`.v41_departures`).
"""

from __future__ import annotations

import traceback

import numpy as np

from ..spec.formats import bf16_to_f32, e2m1_to_f32, e4m3_to_f32
from .arrays import arrays_for
from .buffers import Buffer
from .implementations import LoadedImplementation
from .locate import Place, active_slot_map, locate_k_cache, locate_state
from .runner import Verdict
from .v41_calls import WRITTEN, host_bytes, spec_bytes, v41_call
from .v41_scenarios import V41Inputs, V41Scenario

_CACHE: dict[str, list] = {}  # scenario name -> [inputs, spec bytes or None]; the last one kept


def v41_inputs(scenario: V41Scenario) -> V41Inputs:
    """The scenario's inputs (built once; the last scenario is kept)."""
    if scenario.name not in _CACHE:
        _CACHE.clear()
        _CACHE[scenario.name] = [scenario.build(), None]
    return _CACHE[scenario.name][0]


def v41_spec_result(scenario: V41Scenario) -> tuple[V41Inputs, dict[str, np.ndarray]]:
    """Inputs and the spec's bytes of every written allocation."""
    inputs = v41_inputs(scenario)
    entry = _CACHE[scenario.name]
    if entry[1] is None:
        entry[1] = spec_bytes(inputs)
    return inputs, entry[1]


def run_v41_implementation(impl: LoadedImplementation, inputs: V41Inputs, device: str) -> dict[str, np.ndarray]:
    """The implementation's bytes of every allocation after its call (host uint8 arrays, by name).
    A ``NotImplementedError`` is raised again with the bytes it left (``error.args[1]``)."""
    arrays = arrays_for(impl.takes_numpy, device)
    call = v41_call(inputs, arrays)
    try:
        call.run(impl.target)
    except NotImplementedError as error:
        raise NotImplementedError(str(error), host_bytes(call, arrays)) from None
    return host_bytes(call, arrays)


# ---- describing a difference ----------------------------------------------------------------------
def _bf16_at(owner: np.ndarray, buffer: Buffer, byte: int) -> str:
    start = byte - (byte - buffer.offset) % 2
    bits = int(owner[start:start + 2].view("<u2")[0])
    return f"0x{bits:04x} (bf16 {float(bf16_to_f32(np.uint16(bits))):g})"


def _record_value(layout: str, region: str, value: int) -> str:
    """A byte of a V4.1 or indexer record as a reader wants it."""
    if layout == "v41_mxfp8":
        return (f"0x{value:02x} (e4m3 {float(e4m3_to_f32(np.uint8(value))):g})" if region == "data"
                else f"0x{value:02x} (2^{value - 127})")
    if layout == "v41_nvfp4":
        if region == "data":
            low, high = e2m1_to_f32(np.uint8(value & 0xF)), e2m1_to_f32(np.uint8(value >> 4))
            return f"0x{value:02x} (e2m1 {float(low):g}, {float(high):g})"
        return f"0x{value:02x} (sigma {float(e4m3_to_f32(np.uint8(value))):g})"
    if layout in ("flashmla_fp8", "fp8_per_tensor") and region == "NoPE":
        return f"0x{value:02x} (e4m3 {float(e4m3_to_f32(np.uint8(value))):g})"
    return f"0x{value:02x}"


def _value_text(inputs: V41Inputs, name: str, place: Place, owner: np.ndarray, byte: int) -> str:
    buffer = getattr(inputs, name)
    if name == "latent" or (name == "state_cache" and buffer.dtype == np.uint16):
        return _bf16_at(owner, buffer, byte)
    if name == "state_cache":
        start = byte - (byte - buffer.offset) % 4
        return repr(owner[start:start + 4].view(np.float32)[0])
    if inputs.layout == "bf16" or (place.region == "RoPE" and inputs.layout != "v41_mxfp8"):
        return _bf16_at(owner, buffer, byte)
    return _record_value(inputs.layout, place.region, int(owner[byte]))


def locate_latent(inputs: V41Inputs, byte: int, active: np.ndarray) -> Place:
    """A byte of the latent allocation: token (row) and channel, or its row padding."""
    buffer = inputs.latent
    rel = byte - buffer.offset
    row, rest = divmod(rel, buffer.strides[0])
    channel = rest // 2
    if rel < 0 or row >= buffer.shape[0]:
        return Place("latent", detail="outside the latent's rows (never written)")
    if channel >= buffer.shape[1]:
        return Place("latent", row, detail="the row's padding (never written)")
    if inputs.operation == "rope_quant_store":
        return Place("latent", row, channel=channel, detail="an input of v41_rope_quant_store (never written)")
    written = "" if active[row] else "; an inactive token: its row is never written"
    return Place("latent", row, channel=channel, detail=f"position {int(inputs.step.positions[row])}{written}")


def _place(inputs: V41Inputs, name: str, byte: int) -> Place:
    active = inputs.active
    if name == "latent":
        return locate_latent(inputs, byte, active)
    if name == "state_cache":
        saved = {int(s): int(i) for i, s in enumerate(inputs.step.save_slot_mapping) if s >= 0}
        return locate_state(inputs.state_cache, byte, saved)
    return locate_k_cache(inputs.k_cache, inputs.layout, byte, active_slot_map(inputs.step.kv_slot_mapping, active))


def first_difference(inputs: V41Inputs, expected: dict, actual: dict) -> tuple[str, str]:
    """(description, region) of the first differing byte, buffers taken in the order state_cache,
    latent, k_cache (a wrong state explains the rest), with how many bytes differ in each."""
    differing = [n for n in ("state_cache", "latent", "k_cache") if n in expected
                 and not np.array_equal(expected[n], actual[n])]
    name = differing[0]
    byte = int(np.flatnonzero(expected[name] != actual[name])[0])
    place = _place(inputs, name, byte)
    counts = ", ".join(f"{n} {int(np.count_nonzero(expected[n] != actual[n]))} bytes" for n in differing)
    text = (f"v41_{inputs.operation}: {name}: {place.describe()}: expected "
            f"{_value_text(inputs, name, place, expected[name], byte)}, got "
            f"{_value_text(inputs, name, place, actual[name], byte)} [differ: {counts}]")
    return text, place.region


# ---- one scenario -----------------------------------------------------------------------------------
def run_v41_scenario(impl: LoadedImplementation, scenario: V41Scenario, *, tolerant: bool = False,
                     device: str | None = None, name_departures: bool = True) -> Verdict:
    """Judge ``impl`` on a V4.1 scenario: exact (every byte) or tolerant (:mod:`.v41_bounds`), or
    unsupported (declared, or ``NotImplementedError`` with nothing written)."""
    device = device or impl.device()
    if device is None:
        return Verdict(scenario.name, impl.name, 0, 0, "skip", f"needs one of {impl.devices}; none found here")
    if scenario.device and impl.takes_numpy:
        return Verdict(scenario.name, impl.name, 0, 0, "unsupported",
                       f"declared unsupported: runs on {scenario.device} only (torch tensors)")
    if scenario.device and scenario.device != device:
        return Verdict(scenario.name, impl.name, 0, 0, "skip", f"runs on {scenario.device} only")
    inputs = v41_inputs(scenario)
    verdict = Verdict(scenario.name, impl.name, inputs.num_tokens, int(inputs.active.sum()), "pass")
    reason = impl.capabilities.unsupported_v41(inputs.features)
    if reason:
        verdict.status, verdict.first_difference = "unsupported", f"declared unsupported: {reason}"
        return verdict
    inputs, expected = v41_spec_result(scenario)
    try:
        actual = run_v41_implementation(impl, inputs, device)
    except NotImplementedError as error:
        message, left = error.args[0], error.args[1]
        untouched = all(np.array_equal(left[n], getattr(inputs, n).owner) for n in left)
        verdict.status = "unsupported" if untouched else "fail"
        verdict.first_difference = (f"NotImplementedError: {message}"[:300] if untouched else
                                    f"raised NotImplementedError after writing: {message}"[:300])
        return verdict
    except Exception as error:  # an implementation may fail in any way; report it
        verdict.status = "error"
        verdict.first_difference = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        verdict.counts = {"traceback": traceback.format_exc()}
        return verdict
    if all(np.array_equal(expected[n], actual[n]) for n in expected):
        return verdict
    verdict.first_difference, verdict.region = first_difference(inputs, expected, actual)
    verdict.status = "fail"
    if tolerant:
        from .v41_bounds import v41_tolerant_counts
        from .v41_departures import ROUNDINGS, describe, matching_departures

        verdict.counts = v41_tolerant_counts(inputs, expected, actual)
        verdict.status = "pass" if all("within" in kind for kind in verdict.counts) else "fail"
        if verdict.status == "pass":  # SPEC §14.9: a left-out bf16 rounding fails even where the bounds allow its bytes
            combo, _ = matching_departures(inputs, actual)
            if combo and set(combo) & set(ROUNDINGS):
                verdict.status = "fail"
                verdict.counts["left-out bf16 rounding (SPEC §14.9)"] = sum(
                    int(np.count_nonzero(expected[n] != actual[n])) for n in expected)
                verdict.departure = f"explained by SPEC §14.10's departure: {describe(combo)}"
                verdict.first_difference += f"; {verdict.departure}"
                return verdict
    if name_departures and verdict.status == "fail":
        from .v41_departures import explain

        verdict.departure = explain(inputs, expected, actual)
        if verdict.departure:
            verdict.first_difference += f"; {verdict.departure}"
    return verdict


__all__ = ["WRITTEN", "first_difference", "run_v41_scenario", "v41_inputs", "v41_spec_result"]
