"""Speculative decoding, as a compressor sees it: request mixes and per-request step plans.

With speculative decoding a request verifies ``k`` draft tokens per step: a *verify group* of
``k + 1`` consecutive positions (the last accepted token and the drafts), all saved and
compressed in one step like a short prefill chunk. When drafts are rejected, the next step
starts again inside the group: the positions of the rejected drafts run again with other
tokens (other ``kv_score`` rows), overwriting the state rows and, at a boundary, the entry
the rejected draft wrote. Nothing in SPEC.md changes; these mixes put window boundaries at
every offset inside a group and rerun positions over several steps.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..spec.batch import Request, decode_requests

GROUP_SIZES = tuple(range(2, 9))  # k + 1 = 2 ... 8 tokens per verify group


def verify_group_requests(group: int, ratio: int, *, num_groups: int, max_entries: int,
                          prefill: tuple[int, ...] = (), num_decode: int = 0) -> Callable[[np.random.Generator], list[Request]]:
    """``num_groups`` requests each verifying ``group`` consecutive tokens, the window boundary
    at a different offset of each group (group ``i`` at offset ``i mod group``; a group of more
    than ``r`` tokens holds several), beside prefill chunks and plain decode tokens, shuffled."""
    if group < 1:
        raise ValueError(f"group: expected at least 1 token, got {group}")

    def requests(rng: np.random.Generator) -> list[Request]:
        mixed = []
        for i in range(num_groups):
            boundary = int(rng.integers(1, max_entries + 1)) * ratio - 1  # a position that closes a window
            mixed.append(Request(context_len=max(boundary - i % group, 0), num_tokens=group))
        mixed += [Request(context_len=int(rng.integers(0, 4 * ratio)), num_tokens=n) for n in prefill]
        mixed += decode_requests(num_decode, ratio, rng, boundary=False, max_entries=max_entries) if num_decode else []
        return [mixed[i] for i in rng.permutation(len(mixed))]

    return requests


def mixed_group_requests(ratio: int, *, max_entries: int) -> Callable[[np.random.Generator], list[Request]]:
    """One verify group of every size 2 ... 8 (the boundary at a random offset), a request
    whose group holds its first window, a prefill chunk and two decode tokens."""

    def requests(rng: np.random.Generator) -> list[Request]:
        mixed = []
        for group in GROUP_SIZES:
            boundary = int(rng.integers(1, max_entries + 1)) * ratio - 1
            mixed.append(Request(context_len=max(boundary - int(rng.integers(0, group)), 0), num_tokens=group))
        mixed.append(Request(context_len=1, num_tokens=5))  # C4: the first window closes inside the group
        mixed.append(Request(context_len=int(rng.integers(0, 2 * ratio)), num_tokens=9))
        mixed += decode_requests(2, ratio, rng, boundary=True, max_entries=max_entries)
        return [mixed[i] for i in rng.permutation(len(mixed))]

    return requests


# ---- plans over several steps -------------------------------------------------------------
Plan = tuple[tuple[int, int] | None, ...]  # per step: (first position, count), or None (not scheduled)


def verify_steps(context: int, group: int, advances: tuple[int, ...]) -> Plan:
    """A request verifying ``group`` tokens per step from position ``context``; after each step
    the next group starts ``advance`` positions further: ``a + 1`` when ``a`` drafts were
    accepted (the rejected drafts' positions run again), less to run accepted tokens again at
    the same positions, ``0`` to run the whole group again."""
    if any(not 0 <= a <= group for a in advances):
        raise ValueError(f"advances: expected values in 0 .. {group}, got {advances}")
    plan, first = [], context
    for advance in advances:
        plan.append((first, group))
        first += advance
    return tuple(plan)


def decode_steps(context: int, steps: int, start: int = 0) -> Plan:
    """One decode token per step from position ``context``, scheduled from step ``start`` on."""
    return (None,) * start + tuple((context + i, 1) for i in range(steps))


def prefill_steps(context: int, chunks: tuple[int, ...], start: int = 0) -> Plan:
    """Prefill chunks of the given sizes, one per step from step ``start`` on."""
    plan, first = [], context
    for chunk in chunks:
        plan.append((first, chunk))
        first += chunk
    return (None,) * start + tuple(plan)
