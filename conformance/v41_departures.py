"""Naming what explains an implementation's V4.1 bytes (SPEC §14.9, §14.10).

When an implementation's bytes differ from the spec's, the scenario is recomputed with each
combination of the departures SPEC §14.10 lists that can be reproduced bit for bit — the pooled
vector (ratio 1: the projection) normed without its bf16 rounding, the 528/288 B records
quantizing the unrounded RoPE output, the NoPE channels passed through a ``(1, 0)`` rotation —
by :class:`~.v41_variants.V41Variant`. A combination whose bytes equal the implementation's, every
byte of every allocation, names the departure. Approximate ``exp``, ``rsqrt`` and division
cannot be recomputed exactly: bytes that the tolerant verdict's bounds accept are named as that
arithmetic. Failing both, the combination that leaves the fewest bytes unexplained is named when
it explains at least three quarters of the differing bytes (the rest being other arithmetic).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import numpy as np

from .arrays import HostArrays
from .v41_calls import host_bytes, v41_call
from .v41_scenarios import V41Inputs
from .v41_variants import DEPARTURES, EXACT_DEPARTURES, V41Variant

MOSTLY = 0.75  # the share of the differing bytes a closest combination must explain to be named


@lru_cache(maxsize=None)
def _variant(changes: tuple[str, ...]) -> V41Variant:
    return V41Variant(changes)


def variant_bytes(inputs: V41Inputs, changes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Every written allocation after the scenario's call with ``changes`` applied to the spec."""
    arrays = HostArrays()
    call = v41_call(inputs, arrays)
    call.run(_variant(changes))
    return host_bytes(call, arrays)


def relevant_departures(inputs: V41Inputs) -> tuple[str, ...]:
    """The exact departures that can change this scenario's bytes."""
    names = []
    if inputs.operation in ("compress_norm", "compress_norm_rope_store"):
        names.append("unrounded_pooled")
    if inputs.operation in ("rope_quant_store", "compress_norm_rope_store") and inputs.layout in ("v41_mxfp8", "v41_nvfp4"):
        names.append("unrounded_rope_records")
    if inputs.operation in ("rope_quant_store", "compress_norm_rope_store"):
        names.append("nope_rotation")
    return tuple(n for n in EXACT_DEPARTURES if n in names)


def describe(changes: tuple[str, ...]) -> str:
    return " + ".join(DEPARTURES[c] for c in changes)


def _differing(a: dict, b: dict) -> int:
    return sum(int(np.count_nonzero(a[n] != b[n])) for n in a)


ROUNDINGS = ("unrounded_pooled", "unrounded_rope_records")  # departures that leave a bf16 rounding out (SPEC §14.9)


def matching_departures(inputs: V41Inputs, actual: dict[str, np.ndarray]) -> tuple[tuple[str, ...] | None, dict]:
    """The combination of exact departures whose bytes equal ``actual`` in every allocation (or
    ``None``), and the count of bytes each combination tried leaves unexplained."""
    unexplained = {}
    for combo in (c for size in range(1, 4) for c in combinations(relevant_departures(inputs), size)):
        recomputed = variant_bytes(inputs, combo)
        if all(np.array_equal(recomputed[n], actual[n]) for n in actual):
            return combo, unexplained
        unexplained[combo] = _differing(recomputed, actual)
    return None, unexplained


def explain(inputs: V41Inputs, expected: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> str:
    """The SPEC §14.10 departure(s) that explain ``actual`` (differing from the spec's ``expected``),
    or ``""`` when none does."""
    combo, unexplained = matching_departures(inputs, actual)
    if combo:
        return f"explained by SPEC §14.10's departure: {describe(combo)}"
    from .v41_bounds import v41_tolerant_counts

    counts = v41_tolerant_counts(inputs, expected, actual)
    if counts and all("within" in kind for kind in counts):
        return (f"within the tolerant bounds: what {DEPARTURES['fast_math']} (SPEC §14.10) or another summation order "
                f"may write")
    total = _differing(expected, actual)
    if unexplained:
        combo = min(unexplained, key=unexplained.get)
        if total and unexplained[combo] <= (1 - MOSTLY) * total:
            return (f"mostly explained ({total - unexplained[combo]} of {total} differing bytes) by SPEC §14.10's "
                    f"departure: {describe(combo)}; the rest differ otherwise")
    return ""
