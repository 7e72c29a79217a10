"""A serving engine's block bookkeeping in miniature: block pools, each request's blocks, and
the metadata of a step with vLLM's names and dtypes.

An engine keeps, per request and per cache, the list of its state blocks (rows ``[i·bs,
(i+1)·bs)``) and of its compressed-cache pages (entries ``[i·B, (i+1)·B)``), taken from
shuffled free lists as positions reach them. A step is a *plan*: for each scheduled request
its block-table row, the first position and the number of tokens (a prefill chunk, one decode
token, a speculative verify group of ``k + 1``, or positions run again after drafts were
rejected). :func:`step_metadata` turns a plan into a :class:`~dsv4_compressor.spec.batch.Batch`:
``positions``, ``token_to_req_indices``, the state ``slot_mapping``, the ``block_table`` and
the ``kv_slot_mapping`` (a slot only for the token that closes a window), padded with tokens
of slot ``-1`` to a fixed count when asked (a captured graph's bucket).

Shared by the multi-step conformance sequences, the soak and ``docs/examples/engine_loop.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..spec.batch import Batch, Request

PADDING_SLOT = -1  # slot_mapping / kv_slot_mapping of a token that writes nothing


class BlockPool:
    """A free list of block numbers, handed out in a shuffled order (as after a while of serving)."""

    def __init__(self, num_blocks: int, rng: np.random.Generator):
        self.size = int(num_blocks)
        self.free = [int(b) for b in rng.permutation(num_blocks)]

    def take(self) -> int:
        if not self.free:
            raise RuntimeError(f"out of blocks: all {self.size} are in use")
        return self.free.pop()

    def give_back(self, blocks: list[int]) -> None:
        """Blocks of a request that left, free again (their rows keep what they held)."""
        self.free.extend(blocks)


@dataclass
class BlockLists:
    """One request's blocks in one cache: state blocks and compressed-cache pages, in position order."""

    state_blocks: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Geometry:
    """A cache's addressing: the ratio, rows per state block, entries per page, and paged or ring state."""

    compress_ratio: int  # r
    block_size: int  # bs
    entries_per_page: int  # B
    ring_capacity: int | None = None  # SPEC §13.3: each request's state a ring of C rows (None: paged)

    def __post_init__(self):
        c = self.ring_capacity
        if c is not None and (c <= 0 or c % self.block_size):
            raise ValueError(f"ring_capacity: expected a positive multiple of block_size {self.block_size}, got {c}")

    def state_row(self, position: int) -> int:
        """The row of the request's state that ``position`` is saved in: the position itself
        (paged), or its place in the ring (``position mod C``), where rows of rejected drafts
        overwrite the rows ``C`` positions earlier."""
        return position if self.ring_capacity is None else position % self.ring_capacity


def grow_state_blocks(owner, end: int, block_size: int, pool: BlockPool) -> None:
    """Give ``owner`` (anything with a ``state_blocks`` list) blocks for positions ``0 .. end-1``."""
    while len(owner.state_blocks) * block_size < end:
        owner.state_blocks.append(pool.take())


def state_slot(owner, position: int, geometry: Geometry, pool: BlockPool) -> int:
    """The state slot of ``position`` (its block taken from ``pool`` when first reached)."""
    row, bs = geometry.state_row(position), geometry.block_size
    grow_state_blocks(owner, row + 1, bs, pool)
    return owner.state_blocks[row // bs] * bs + row % bs


def entry_slot(owner, entry: int, entries_per_page: int, pool: BlockPool) -> int:
    """The compressed-cache slot of entry ``entry`` (its page taken from ``pool`` when first reached)."""
    while len(owner.pages) <= entry // entries_per_page:
        owner.pages.append(pool.take())
    return owner.pages[entry // entries_per_page] * entries_per_page + entry % entries_per_page


def step_metadata(plan: list[tuple[int, int, int]], owners, geometry: Geometry, state_pool: BlockPool,
                  page_pool: BlockPool, *, padded_tokens: int | None = None,
                  table_shape: tuple[int, int] | None = None) -> Batch:
    """The batch of one step: ``plan`` lists ``(row, first position, count)`` per scheduled request,
    ``owners[row]`` holds that request's :class:`BlockLists` (blocks are taken as positions
    reach them). ``padded_tokens``: padding tokens (position 0, row 0, slots -1) fill the step to
    that many tokens. ``table_shape``: a fixed ``[rows, max_blocks]`` block table (a captured
    graph's); by default one row per owner, as wide as the longest list. Unused table entries
    hold 0 (in range, never read)."""
    r, bs, entries_per_page = geometry.compress_ratio, geometry.block_size, geometry.entries_per_page
    positions, rows, slots, kv_slots, requests = [], [], [], [], []
    for row, first, count in plan:
        owner = owners[row]
        for p in range(first, first + count):
            positions.append(p)
            rows.append(row)
            slots.append(state_slot(owner, p, geometry, state_pool))
            # p closes window p // r: the one token that writes that entry
            kv_slots.append(entry_slot(owner, p // r, entries_per_page, page_pool) if (p + 1) % r == 0 else PADDING_SLOT)
        requests.append(Request(context_len=first, num_tokens=count))
    num_padding = 0 if padded_tokens is None else padded_tokens - len(positions)
    if num_padding < 0:
        raise ValueError(f"padded_tokens: expected at least the plan's {len(positions)} tokens, got {padded_tokens}")
    width = max([len(o.state_blocks) for o in owners] + [1])
    shape = table_shape or (len(owners), width)
    if shape[0] < len(owners) or shape[1] < width:
        raise ValueError(f"table_shape: expected at least {(len(owners), width)}, got {shape}")
    block_table = np.zeros(shape, dtype=np.int32)
    kv_block_table = np.full((shape[0], max([len(o.pages) for o in owners] + [1])), -1, dtype=np.int32)
    for row, owner in enumerate(owners):
        block_table[row, :len(owner.state_blocks)] = owner.state_blocks
        kv_block_table[row, :len(owner.pages)] = owner.pages
    pad = [0] * num_padding
    return Batch(
        compress_ratio=r, block_size=bs, entries_per_page=entries_per_page, requests=tuple(requests),
        token_to_req_indices=np.array(rows + pad, dtype=np.int32),
        positions=np.array(positions + pad, dtype=np.int64),
        slot_mapping=np.array(slots + [PADDING_SLOT] * num_padding, dtype=np.int64),
        block_table=block_table,
        kv_block_table=kv_block_table,
        kv_slot_mapping=np.array(kv_slots + [PADDING_SLOT] * num_padding, dtype=np.int64),
        num_state_blocks=state_pool.size, num_pages=page_pool.size,
    )
