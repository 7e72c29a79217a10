"""The soak's randomized scheduler: requests arrive and leave, prefill in chunks, decode one
token a step or verify speculative drafts in groups of ``k + 1``, and run positions again after
drafts are rejected.

It decides *which positions* each step runs (a plan of ``(row, first position, count)``, the
row being the request's block-table row); :class:`LayerBlocks` turns a plan into one cache's
metadata with :mod:`.engine`'s block bookkeeping, giving a leaving request's blocks back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..spec.batch import Batch
from .engine import BlockLists, BlockPool, Geometry, step_metadata


@dataclass(frozen=True)
class ScheduleConfig:
    """How busy the engine is (a step's tokens stay within ``step_tokens``)."""

    rows: int  # requests at once (block-table rows)
    max_len: int  # positions a request reaches at most
    max_prompt: int
    max_decode: int  # tokens a request decodes after its prompt, at most
    chunk: int  # prefill tokens of one request per step, at most
    step_tokens: int  # tokens of one step, at most (the largest bucket)
    arrival: float = 0.5  # chance that a request arrives in a step with a free row
    speculative: float = 0.6  # share of requests that verify drafts (k = 1 ... 7 per request)
    rerun: float = 0.1  # chance that a verify step runs accepted tokens again


@dataclass
class LiveRequest:
    row: int
    prompt_len: int
    total_len: int
    drafts: int  # k: drafts verified per step (0: plain decode)
    computed: int = 0  # positions 0 .. computed-1 are final


class Scheduler:
    """Random arrivals and departures, chunked prefill, decode and verify groups with rollback."""

    def __init__(self, config: ScheduleConfig, rng: np.random.Generator):
        self.config, self.rng = config, rng
        self.live: dict[int, LiveRequest] = {}
        self.arrived = self.finished = 0
        self.verify_groups = 0  # steps of a request that verified drafts
        self.rerun_positions = 0  # positions run again: rejected drafts, and accepted tokens rerun

    def _arrive(self) -> None:
        c, rng = self.config, self.rng
        free = [row for row in range(c.rows) if row not in self.live]
        while free and (not self.live or rng.random() < c.arrival):
            row = free.pop(int(rng.integers(len(free))))
            prompt = int(rng.integers(1, min(c.max_prompt, c.max_len - 1) + 1))
            total = min(prompt + int(rng.integers(1, c.max_decode + 1)), c.max_len)
            drafts = int(rng.integers(1, 8)) if rng.random() < c.speculative else 0
            self.live[row] = LiveRequest(row, prompt, total, drafts)
            self.arrived += 1

    def plan(self) -> list[tuple[int, int, int]]:
        """This step's ``(row, first position, count)``, requests arriving first."""
        self._arrive()
        plan, budget = [], self.config.step_tokens
        for row in self.rng.permutation(sorted(self.live)):
            request = self.live[int(row)]
            left = request.total_len - request.computed
            if request.computed < request.prompt_len:
                count = min(int(self.rng.integers(1, self.config.chunk + 1)), request.prompt_len - request.computed)
            else:
                count = min(request.drafts + 1, left)
            count = min(count, budget)
            if count <= 0:
                continue
            plan.append((request.row, request.computed, count))
            budget -= count
        return plan

    def finish(self, plan: list[tuple[int, int, int]]) -> list[int]:
        """Advance each request past what it ran (verify groups: the accepted drafts and the
        bonus token, or fewer when accepted tokens run again); the rows of requests done."""
        done = []
        for row, first, count in plan:
            request = self.live[row]
            if first >= request.prompt_len and request.drafts and count > 1:
                accepted = int(self.rng.integers(0, count))  # drafts accepted of count - 1
                advance = accepted + 1
                if self.rng.random() < self.config.rerun:
                    advance = int(self.rng.integers(0, advance + 1))
                request.computed = first + advance
                self.verify_groups += 1
                self.rerun_positions += count - advance
            else:
                request.computed = first + count
            if request.computed >= request.total_len:
                del self.live[row]
                done.append(row)
                self.finished += 1
        return done


@dataclass
class LayerBlocks:
    """One cache's blocks: pools, each row's lists, and the step metadata of a plan."""

    geometry: Geometry
    rows: int
    max_len: int
    rng: np.random.Generator
    owners: list[BlockLists] = field(init=False)

    def __post_init__(self):
        g = self.geometry
        self.width = -(-self.max_len // g.block_size)
        self.state_pool = BlockPool(self.rows * self.width + 1, self.rng)
        self.page_pool = BlockPool(self.rows * (-(-self.max_len // (g.compress_ratio * g.entries_per_page))) + 1, self.rng)
        self.owners = [BlockLists() for _ in range(self.rows)]

    def batch(self, plan: list[tuple[int, int, int]]) -> Batch:
        """The plan's metadata (unpadded; a fixed ``[rows, width]`` block table)."""
        return step_metadata(plan, self.owners, self.geometry, self.state_pool, self.page_pool,
                             table_shape=(self.rows, self.width))

    def release(self, row: int) -> None:
        """A request left: its blocks and pages are free again (their bytes stay)."""
        owner = self.owners[row]
        self.state_pool.give_back(owner.state_blocks)
        self.page_pool.give_back(owner.pages)
        self.owners[row] = BlockLists()
