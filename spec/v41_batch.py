"""Batch builders for DeepSeek-V4.1's compressors (SPEC §14), shared by tests and the demo.

A layer's requests keep two block tables across steps: the ratio-2 state (paged: a block per
``bs`` positions; a ring: ``C / bs`` blocks holding positions ``q mod C``) and the compressed
cache (entry ``p // r`` on page ``(p // r) // B`` of the request's pages). A step's metadata is
built from them the way engines do: tokens packed request by request (``query_start_loc``),
the state ``slot_mapping`` of every token, the ``save_slot_mapping`` (every token when paged;
in a ring only each chunk's last ``C`` tokens, SPEC §13.4), the ``kv_slot_mapping`` of boundary
tokens, and padding tokens (every slot ``-1``) after the last request's.

State layouts engines keep (SPEC §14.2):

- :func:`reference_ring` DeepSeek's reference: a ring of ``C = 2`` rows per request (``bs = 2``);
- :func:`vllm_ring` vLLM: one block of ``C = max(8, 2^ceil(log2(S + 2)))`` rows (``bs = C``) for
  ``S`` speculative tokens;
- :func:`paged` paged rows (``bs`` rows per block, one block per ``bs`` positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import CANARY_BYTE, Request, padded_view, query_start_loc, ring_slots, tail_saves
from .constants import HEAD_DIM, INDEXER_HEAD_DIM, V41_STATE_ROW_WIDTH
from .formats import bf16_bits
from .pooling import is_boundary


@dataclass(frozen=True)
class StateLayout:
    """Where a request's ratio-2 state rows live: ``bs`` rows per block, paged or a ring of ``C`` rows."""

    block_size: int  # bs
    ring_capacity: int | None = None  # C (a multiple of bs, >= 2), or None: paged


def reference_ring() -> StateLayout:
    """DeepSeek's reference model: one ring of 2 rows per request, slot ``p mod 2`` (``bs = 2``)."""
    return StateLayout(block_size=2, ring_capacity=2)


def vllm_ring(num_speculative: int = 0) -> StateLayout:
    """vLLM: one block of ``C = max(8, 2^ceil(log2(S + 2)))`` rows per request (``bs = C``)."""
    capacity = max(8, 1 << int(np.ceil(np.log2(num_speculative + 2))))
    return StateLayout(block_size=capacity, ring_capacity=capacity)


def paged(block_size: int = 8) -> StateLayout:
    """Paged rows: position ``q`` at ``block_table[req, q // bs]``, offset ``q mod bs``."""
    return StateLayout(block_size=block_size)


@dataclass(frozen=True)
class V41Tables:
    """One layer's block tables for a fixed set of requests, kept across steps."""

    compress_ratio: int  # r: 1 or 2
    state: StateLayout
    entries_per_page: int  # B
    block_table: np.ndarray  # int32 [num_reqs, max_blocks]: state blocks (shuffled, never the identity)
    kv_block_table: np.ndarray  # int32 [num_reqs, max_pages]: compressed-cache pages
    num_state_blocks: int  # state_cache.shape[0] needed (spare blocks included)
    num_pages: int  # k_cache.shape[0] needed (spare pages included)


def _shuffled_table(num_reqs: int, columns: int, spare: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    total = num_reqs * columns + spare
    ids = rng.permutation(total)[:num_reqs * columns].astype(np.int32)
    return ids.reshape(num_reqs, columns), total


def v41_tables(
    max_positions: list[int], *, compress_ratio: int, state: StateLayout, entries_per_page: int,
    rng: np.random.Generator, spare_blocks: int = 2, spare_pages: int = 2,
) -> V41Tables:
    """Block tables for requests that reach positions ``0 .. max_positions[req] - 1``, drawn from
    shuffled pools with ``spare_blocks`` state blocks and ``spare_pages`` pages no request owns.
    The pages are drawn first, so one seed gives every state layout the same compressed-cache pages."""
    num_reqs = len(max_positions)
    last = max(max(max_positions), 1)
    pages = (last // compress_ratio) // entries_per_page + 1
    kv_block_table, num_pages = _shuffled_table(num_reqs, pages, spare_pages, rng)  # first: the same for every state layout
    rows = state.ring_capacity if state.ring_capacity is not None else last  # a ring's C rows, or every position
    columns = -(-rows // state.block_size)
    block_table, num_blocks = _shuffled_table(num_reqs, columns, spare_blocks, rng)
    return V41Tables(compress_ratio=compress_ratio, state=state, entries_per_page=entries_per_page, block_table=block_table,
                     kv_block_table=kv_block_table, num_state_blocks=num_blocks, num_pages=num_pages)


@dataclass(frozen=True)
class V41Step:
    """The per-token metadata of one V4.1 call (SPEC §14.2, §13.4)."""

    positions: np.ndarray  # int64 [T]
    token_to_req: np.ndarray  # int32 [T]
    query_start_loc: np.ndarray  # int32 [num_reqs + 1]
    slot_mapping: np.ndarray  # int64 [T]: the state slot of each token, -1 = padding
    save_slot_mapping: np.ndarray  # int64 [T]: saved after the compress, -1 = not saved
    kv_slot_mapping: np.ndarray  # int64 [T]: boundary tokens' entry slots, -1 = none

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def v41_step(
    tables: V41Tables, requests: list[Request], *, rng: np.random.Generator | None = None, num_padding: int = 0,
    drop_entry_fraction: float = 0.0, unslotted_fraction: float = 0.0,
) -> V41Step:
    """The metadata of a step in which request ``i`` (block-table row ``i``) brings
    ``requests[i].num_tokens`` tokens at positions ``context_len, context_len + 1, ...``.

    - ``slot_mapping``: ``block_table[i, idx // bs] * bs + idx % bs`` with ``idx = q`` (paged)
      or ``q mod C`` (ring, :func:`.batch.ring_slots`); ``save_slot_mapping``: the same for every
      token when paged, for the last ``C`` tokens of each chunk in a ring (:func:`.batch.tail_saves`);
    - ``kv_slot_mapping``: entry ``p // r`` through the request's pages, boundary tokens only;
    - ``drop_entry_fraction`` of the boundary tokens get no cache slot and
      ``unslotted_fraction`` of all tokens no state slot (``slot_mapping = -1``, saved all the
      same): both are then inactive; ``num_padding`` padding tokens follow the requests'.
    """
    starts = query_start_loc(requests)
    token_to_req = np.repeat(np.arange(len(requests), dtype=np.int32), np.diff(starts))
    positions = np.concatenate([np.arange(r.context_len, r.context_len + r.num_tokens, dtype=np.int64) for r in requests])
    layout, bs = tables.state, tables.state.block_size
    if layout.ring_capacity is None:
        slot_mapping = tables.block_table[token_to_req, positions // bs].astype(np.int64) * bs + positions % bs
        save_slot_mapping = slot_mapping.copy()
    else:  # only each chunk's tail of C tokens is kept
        slot_mapping = ring_slots(tables.block_table, token_to_req, positions, layout.ring_capacity, bs)
        save_slot_mapping = tail_saves(slot_mapping, starts, layout.ring_capacity)
    r, per_page = tables.compress_ratio, tables.entries_per_page
    entries = positions // r
    kv_slot_mapping = np.where(
        is_boundary(positions, r),
        tables.kv_block_table[token_to_req, entries // per_page].astype(np.int64) * per_page + entries % per_page, -1)
    if rng is not None and drop_entry_fraction > 0:
        kv_slot_mapping[rng.random(positions.shape) < drop_entry_fraction] = -1
    if rng is not None and unslotted_fraction > 0:
        slot_mapping[rng.random(positions.shape) < unslotted_fraction] = -1
    pad = np.full(num_padding, -1, dtype=np.int64)
    return V41Step(
        positions=np.concatenate([positions, np.zeros(num_padding, np.int64)]),
        token_to_req=np.concatenate([token_to_req, np.zeros(num_padding, np.int32)]),
        query_start_loc=starts,
        slot_mapping=np.concatenate([slot_mapping, pad]),
        save_slot_mapping=np.concatenate([save_slot_mapping, pad]),
        kv_slot_mapping=np.concatenate([kv_slot_mapping, pad]),
    )


def verify_requests(context_lens: list[int], num_speculative: int) -> list[Request]:
    """A speculative verify step: each request brings its last token and ``S`` drafts (``S + 1`` tokens)."""
    return [Request(context_len=c, num_tokens=num_speculative + 1) for c in context_lens]


def after_verify(requests: list[Request], accepted: list[int]) -> list[int]:
    """The next step's ``context_len`` of each request after a verify step that accepted
    ``accepted[i]`` drafts: its rows for the rejected drafts are stale and will be overwritten."""
    return [r.context_len + a + 1 for r, a in zip(requests, accepted)]


# ---- buffers ---------------------------------------------------------------------------------
def bf16_patterns(values: np.ndarray) -> np.ndarray:
    """binary32 values rounded to bf16 (nearest, ties to even), as ``uint16`` bit patterns."""
    return bf16_bits(np.asarray(values, dtype=np.float32))


def projections(num_tokens: int, rng: np.random.Generator, *, bf16: bool = False, score_scale: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """This step's ``kv`` and raw ``score`` ``[T, 512]``: float32, or bf16 patterns (``uint16``)."""
    kv = rng.standard_normal((num_tokens, HEAD_DIM)).astype(np.float32)
    score = (rng.standard_normal((num_tokens, HEAD_DIM)) * score_scale).astype(np.float32)
    return (bf16_patterns(kv), bf16_patterns(score)) if bf16 else (kv, score)


def state_cache(num_blocks: int, block_size: int, rng: np.random.Generator, *, bf16: bool = False, row_pad: int = 0) -> np.ndarray:
    """A ratio-2 state ``[num_blocks, bs, 1024]`` of random rows (kv, then a raw score): float32,
    or bf16 patterns (``uint16``); ``row_pad`` extra elements per row (a multiple of 16 bytes)."""
    dtype = np.uint16 if bf16 else np.float32
    cache = padded_view((num_blocks, block_size, V41_STATE_ROW_WIDTH), dtype, (0, 0, row_pad), 0)
    rows = rng.standard_normal((num_blocks, block_size, V41_STATE_ROW_WIDTH)).astype(np.float32)
    cache[...] = bf16_patterns(rows) if bf16 else rows
    return cache


def latent_buffer(num_tokens: int, *, row_pad: int = 8) -> np.ndarray:
    """A canary-filled bf16 latent ``[T, 512]`` (``uint16``) with 16-byte aligned padded rows."""
    return padded_view((num_tokens, HEAD_DIM), np.uint16, (0, row_pad), CANARY_BYTE * 0x0101)


def k_pre(num_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """The indexer's ``wk(latent)`` ``[T, 128]`` as bf16 patterns."""
    return bf16_patterns(rng.standard_normal((num_tokens, INDEXER_HEAD_DIM)))
