"""Batch builders shared by the tests, the conformance suite and the benchmarks.

From a list of requests (positions already cached, tokens this step) they build the
per-token metadata the way vLLM does: ``positions``, ``token_to_req_indices``, the state
``slot_mapping`` (``block_table[req, p // bs] * bs + p % bs``) and the compressed
``kv_slot_mapping`` (entry ``p // r`` placed through the request's own compressed-cache
block table, ``-1`` for non-boundary tokens), with shuffled, non-identity block tables and
optional padding tokens (slot ``-1``). Buffer builders make state caches with padded
strides and canary-filled compressed caches with padded page strides.

For SPEC §13.4's step call a batch also carries ``query_start_loc`` and ``save_slot_mapping``;
:func:`build_ring_batch` and :func:`as_ring` give the same steps on a per-request ring state
(§13.3) with the tail saves an engine makes, and :func:`speculative_requests` makes
speculative verify groups.

Everything here is NumPy; the torch front ends convert with ``torch.from_numpy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .constants import HEAD_DIM, ROPE_DIM, ratio_config
from .entry_layout import PAGED_LAYOUTS, V41_RECORD_LAYOUTS
from .pooling import active_tokens, is_boundary
from .state import save_partial_states

CANARY_BYTE = 0xA5  # fills untouched memory so that any stray write shows
INDEXER_STATE_BLOCK_SIZE = {4: 16, 128: 8}  # production state block sizes of the indexer (C4: 16 rows)


@dataclass(frozen=True)
class Request:
    """One request of a step: ``context_len`` positions cached before, ``num_tokens`` new ones."""

    context_len: int  # positions 0 .. context_len-1 were saved by earlier steps
    num_tokens: int  # this step: positions context_len .. context_len+num_tokens-1


@dataclass
class Batch:
    """The metadata of one ``compress_norm_rope_store`` / ``save_partial_states`` call."""

    compress_ratio: int  # r
    block_size: int  # bs: rows per state block
    entries_per_page: int  # B: compressed entries per k_cache page
    requests: tuple[Request, ...]
    token_to_req_indices: np.ndarray  # int32 [T]
    positions: np.ndarray  # int64 [T]
    slot_mapping: np.ndarray  # int64 [T], -1 = padding
    block_table: np.ndarray  # int32 [num_reqs, max_blocks], -1 where no block was needed
    kv_block_table: np.ndarray  # int32 [num_reqs, max_pages], -1 where no page was needed
    kv_slot_mapping: np.ndarray  # int64 [T], -1 = no entry
    num_state_blocks: int  # state_cache.shape[0] needed
    num_pages: int  # k_cache.shape[0] needed
    notes: dict = field(default_factory=dict)
    query_start_loc: np.ndarray | None = None  # int32 [num_reqs + 1]; None when padding is scattered among the tokens
    save_slot_mapping: np.ndarray | None = None  # int64 [T]: the slots SPEC §13.4's save writes, -1 = not saved
    ring_capacity: int | None = None  # C: each request's state is a ring of C rows (SPEC §13.3); None: paged

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def active(self) -> np.ndarray:
        """SPEC §5's activity rule for every token."""
        return active_tokens(self.positions, self.slot_mapping, self.kv_slot_mapping, self.compress_ratio)

    @property
    def num_active(self) -> int:
        return int(self.active.sum())


def _allocate(needed: np.ndarray, pool_size: int, rng: np.random.Generator) -> np.ndarray:
    """Give each needed (request, column) a distinct physical id from a shuffled pool; -1 elsewhere."""
    table = np.full(needed.shape, -1, dtype=np.int32)
    count = int(needed.sum())
    table[needed] = rng.permutation(pool_size)[:count].astype(np.int32)
    return table


def build_batch(
    requests: list[Request],
    *,
    compress_ratio: int,
    block_size: int,
    entries_per_page: int,
    rng: np.random.Generator,
    num_padding: int = 0,
    padding_at_end: bool = True,
    spare_state_blocks: int = 3,
    spare_pages: int = 2,
    drop_entry_fraction: float = 0.0,
    unsaved_fraction: float = 0.0,
    slot_for_non_boundary: bool = False,
) -> Batch:
    """Build the metadata for ``requests`` (tokens packed request by request).

    - Each request gets its own state blocks for every block column this step touches (its
      new positions and the window rows of its boundary tokens), drawn from a shuffled pool
      with ``spare_state_blocks`` unused blocks, so block tables are never the identity.
    - Each boundary token's entry ``p // r`` gets a slot on a page of the request's own
      compressed-cache block table (also shuffled, ``spare_pages`` unused pages).
    - ``num_padding`` padding tokens (slot ``-1``, position 0, request 0) are appended, or
      scattered among the others when ``padding_at_end`` is false.
    - ``drop_entry_fraction`` of the boundary tokens get ``kv_slot_mapping = -1`` and
      ``unsaved_fraction`` of all tokens get ``slot_mapping = -1`` (both inactive).
    - ``slot_for_non_boundary`` gives non-boundary tokens the slot of the entry their group
      will fill (inactive all the same: only the boundary token writes it).
    """
    config = ratio_config(compress_ratio)
    if not requests:
        raise ValueError("requests: expected at least one request")
    req_index = np.concatenate([np.full(r.num_tokens, i, dtype=np.int32) for i, r in enumerate(requests)])
    positions = np.concatenate([np.arange(r.context_len, r.context_len + r.num_tokens, dtype=np.int64) for r in requests])
    boundary = is_boundary(positions, compress_ratio)
    has_entry = np.ones_like(boundary) if slot_for_non_boundary else boundary

    # state blocks: every column a new position or a boundary window row lands in
    last_position = max(r.context_len + r.num_tokens for r in requests)
    max_blocks = -(-last_position // block_size)
    needed = np.zeros((len(requests), max_blocks), dtype=bool)
    needed[req_index, positions // block_size] = True
    for t in np.flatnonzero(has_entry):
        first = max(int(positions[t]) - config.window + 1, 0)
        needed[req_index[t], first // block_size: int(positions[t]) // block_size + 1] = True
    num_state_blocks = int(needed.sum()) + spare_state_blocks
    block_table = _allocate(needed, num_state_blocks, rng)
    slot_mapping = block_table[req_index, positions // block_size].astype(np.int64) * block_size + positions % block_size

    # compressed-cache pages: the entry p // r of every boundary token
    entries = positions // compress_ratio
    max_pages = max(int(entries[has_entry].max(initial=0)) // entries_per_page + 1, 1)
    page_needed = np.zeros((len(requests), max_pages), dtype=bool)
    page_needed[req_index[has_entry], entries[has_entry] // entries_per_page] = True
    num_pages = int(page_needed.sum()) + spare_pages
    kv_block_table = _allocate(page_needed, num_pages, rng)
    kv_slot_mapping = np.full(positions.shape, -1, dtype=np.int64)
    kv_slot_mapping[has_entry] = (
        kv_block_table[req_index[has_entry], entries[has_entry] // entries_per_page].astype(np.int64) * entries_per_page
        + entries[has_entry] % entries_per_page
    )
    if drop_entry_fraction > 0:
        kv_slot_mapping[boundary & (rng.random(positions.shape) < drop_entry_fraction)] = -1
    if unsaved_fraction > 0:
        slot_mapping[rng.random(positions.shape) < unsaved_fraction] = -1

    starts = None if num_padding and not padding_at_end else query_start_loc(requests)
    if num_padding:
        where = positions.shape[0] if padding_at_end else rng.integers(0, positions.shape[0] + 1, size=num_padding)
        insert = np.full(num_padding, where) if padding_at_end else np.sort(where)
        req_index = np.insert(req_index, insert, 0)
        positions = np.insert(positions, insert, 0)
        slot_mapping = np.insert(slot_mapping, insert, -1)
        kv_slot_mapping = np.insert(kv_slot_mapping, insert, -1)

    return Batch(
        compress_ratio=compress_ratio,
        block_size=block_size,
        entries_per_page=entries_per_page,
        requests=tuple(requests),
        token_to_req_indices=req_index.astype(np.int32),
        positions=positions.astype(np.int64),
        slot_mapping=slot_mapping.astype(np.int64),
        block_table=block_table,
        kv_block_table=kv_block_table,
        kv_slot_mapping=kv_slot_mapping,
        num_state_blocks=num_state_blocks,
        num_pages=num_pages,
        query_start_loc=starts,
        save_slot_mapping=slot_mapping.astype(np.int64),
    )


# ---- request mixes ---------------------------------------------------------------------
def speculative_requests(num_requests: int, compress_ratio: int, num_drafts: int, rng: np.random.Generator, *,
                         max_entries: int = 16) -> list[Request]:
    """Speculative verify groups: ``num_drafts + 1`` consecutive tokens per request (the last
    accepted token and its drafts), a boundary among them at a random place."""
    group = num_drafts + 1
    if group > compress_ratio * max_entries:
        raise ValueError(f"num_drafts: expected at most {compress_ratio * max_entries - 1} for max_entries {max_entries}, got {num_drafts}")
    requests = []
    for _ in range(num_requests):
        boundary = int(rng.integers(max(1, -(-group // compress_ratio)), max_entries + 1)) * compress_ratio - 1
        inside = int(rng.integers(0, min(group, boundary + 1)))  # the boundary is token `inside` of the group
        requests.append(Request(context_len=boundary - inside, num_tokens=group))
    return requests


def decode_requests(num_requests: int, compress_ratio: int, rng: np.random.Generator, *, boundary: bool = True, max_entries: int = 64) -> list[Request]:
    """One token per request; with ``boundary`` every token closes a window (``p = r*c - 1``)."""
    groups = rng.integers(1, max_entries + 1, size=num_requests)
    if boundary:
        positions = groups * compress_ratio - 1
    else:
        positions = groups * compress_ratio - 1 - rng.integers(1, compress_ratio, size=num_requests)
    return [Request(context_len=int(p), num_tokens=1) for p in positions]


def chunked_prefill(context_len: int, num_tokens: int) -> Request:
    """A prefill chunk: ``num_tokens`` new positions after ``context_len`` cached ones."""
    return Request(context_len=context_len, num_tokens=num_tokens)


def mixed_requests(rng: np.random.Generator, compress_ratio: int, *, num_decode: int, prefill_tokens: tuple[int, ...], max_entries: int = 16) -> list[Request]:
    """Decode tokens of many requests at random positions (boundary or not) plus prefill chunks."""
    decode = [Request(context_len=int(rng.integers(0, compress_ratio * max_entries)), num_tokens=1) for _ in range(num_decode)]
    prefill = [Request(context_len=int(rng.integers(0, compress_ratio * 4)), num_tokens=n) for n in prefill_tokens]
    mixed = decode + prefill
    order = rng.permutation(len(mixed))
    return [mixed[i] for i in order]


# ---- buffers ---------------------------------------------------------------------------
def padded_view(shape: tuple[int, ...], dtype, pad: tuple[int, ...], fill, alignment: int = 64) -> np.ndarray:
    """A C-ordered array of ``shape`` whose dimension ``i`` is padded by ``pad[i]`` elements.

    The view's strides are those of the padded buffer, so every row is a window into larger
    memory; the padding keeps ``fill``, the base is ``alignment``-byte aligned and the
    alignment slack before it holds :data:`CANARY_BYTE`.
    """
    dtype = np.dtype(dtype)
    full_shape = tuple(n + p for n, p in zip(shape, pad))
    nbytes = int(np.prod(full_shape)) * dtype.itemsize
    raw = np.full(nbytes + alignment, CANARY_BYTE, dtype=np.uint8)  # the alignment slack too
    start = (-raw.__array_interface__["data"][0]) % alignment
    full = raw[start:start + nbytes].view(dtype).reshape(full_shape)
    full[...] = fill
    return full[tuple(slice(0, n) for n in shape)]


def random_state_cache(
    num_blocks: int, block_size: int, compress_ratio: int, rng: np.random.Generator, *,
    row_pad: int = 0, block_pad_rows: int = 0, kv_scale: float = 1.0, score_scale: float = 2.0,
    head_dim: int = HEAD_DIM,
) -> np.ndarray:
    """A float32 state cache ``[num_blocks, bs, 2*SW]`` of random rows (kv then score).

    ``row_pad`` extra floats per row (a multiple of 4) and ``block_pad_rows`` extra rows per
    block make the strides padded, as in an engine that allocates larger rows or blocks.
    ``head_dim`` 128 builds the indexer's state (SW = 256 for C4, 128 for C128).
    """
    width = ratio_config(compress_ratio, head_dim).state_row_width
    cache = padded_view((num_blocks, block_size, width), np.float32, (0, block_pad_rows, row_pad), np.float32(np.nan))
    half = width // 2
    cache[:, :, :half] = rng.standard_normal((num_blocks, block_size, half), dtype=np.float32) * np.float32(kv_scale)
    cache[:, :, half:] = rng.standard_normal((num_blocks, block_size, half), dtype=np.float32) * np.float32(score_scale)
    return cache


def random_kv_score(num_tokens: int, compress_ratio: int, rng: np.random.Generator, *, head_dim: int = HEAD_DIM) -> np.ndarray:
    """This step's projections ``[T, 2*SW]`` (kv then score)."""
    width = ratio_config(compress_ratio, head_dim).state_row_width
    return rng.standard_normal((num_tokens, width)).astype(np.float32)


def random_ape(compress_ratio: int, rng: np.random.Generator, *, head_dim: int = HEAD_DIM) -> np.ndarray:
    """The absolute position embedding ``[r, SW]`` added to the scores."""
    config = ratio_config(compress_ratio, head_dim)
    return (rng.standard_normal((config.ratio, config.state_width)) * 0.5).astype(np.float32)


def rope_cos_sin_cache(max_pos: int, base: float = 10000.0) -> np.ndarray:
    """A float32 ``[max_pos, 64]`` table: ``cos(p * f_j)`` for j < 32 then ``sin(p * f_j)``.

    The operator only reads it; any table is valid. This is the usual RoPE frequency ladder,
    computed in float64 and rounded once.
    """
    half = ROPE_DIM // 2
    freqs = base ** (-np.arange(half, dtype=np.float64) / half)
    angles = np.arange(max_pos, dtype=np.float64)[:, None] * freqs[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def random_norm_weight(rng: np.random.Generator, *, bf16: bool, head_dim: int = HEAD_DIM) -> np.ndarray:
    """An RMSNorm weight ``[H]`` near 1: float32, or uint16 bf16 bit patterns when ``bf16``."""
    weight = (1.0 + 0.25 * rng.standard_normal(head_dim)).astype(np.float32)
    if bf16:
        return (weight.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return weight


def canary_k_cache(layout: str, num_pages: int, entries_per_page: int, *, page_pad_bytes: int = 0) -> np.ndarray:
    """A compressed cache filled with :data:`CANARY_BYTE` everywhere (padding included).

    ``flashmla_fp8``: uint8 ``[num_pages, B, 584]`` whose page stride is ``B*584`` rounded up
    to 576 (the engines' rule) plus ``page_pad_bytes`` (a multiple of 16).
    ``bf16``: uint16 ``[num_pages, B, 512]``; ``fp8_per_tensor``: uint8 ``[num_pages, B, 512]``.
    ``indexer_fp8`` / ``indexer_mxfp4`` (and V4.1's ``v41_mxfp8`` / ``v41_nvfp4``): uint8
    ``[num_pages, B, E]`` (E = 132 / 68 / 528 / 288) whose page stride is ``B*E`` rounded up to
    16, plus ``page_pad_bytes``.
    """
    records = {**PAGED_LAYOUTS, **V41_RECORD_LAYOUTS}
    if layout in records:
        entry = records[layout].entry_bytes
        page_bytes = entries_per_page * entry
        granule = 576 if layout == "flashmla_fp8" else 16
        page_stride = -(-page_bytes // granule) * granule + page_pad_bytes
        flat = padded_view((num_pages, page_stride), np.uint8, (0, 0), CANARY_BYTE)
        return np.lib.stride_tricks.as_strided(
            flat, shape=(num_pages, entries_per_page, entry), strides=(page_stride, entry, 1), writeable=True
        )
    if layout == "bf16":
        return padded_view((num_pages, entries_per_page, HEAD_DIM), np.uint16, (0, 0, 0), CANARY_BYTE * 0x0101)
    if layout == "fp8_per_tensor":
        return padded_view((num_pages, entries_per_page, HEAD_DIM), np.uint8, (0, 0, 0), CANARY_BYTE)
    raise ValueError(f"layout: expected 'flashmla_fp8', 'bf16', 'fp8_per_tensor', 'indexer_fp8', 'indexer_mxfp4', 'v41_mxfp8'"
                     f" or 'v41_nvfp4', got {layout!r}")


def save_history(batch: Batch, state_cache: np.ndarray, ape: np.ndarray, rng: np.random.Generator, *,
                 ape_at: str = "save") -> None:
    """Write every row of ``batch``'s state blocks as earlier steps saved it with ``ape_at``
    (fresh projections of the row's position, through ``save_partial_states``): a state whose
    rows are in that format, as an engine keeping it has them (a random state is in none in
    particular once ``ape_at`` matters). ``state_cache``: float32 or uint16 (bf16)
    ``[num_state_blocks, bs, 2*SW]``; ``ape``: float32 ``[r, SW]``."""
    bs = batch.block_size
    req, column = np.nonzero(batch.block_table >= 0)
    offsets = np.arange(bs)
    positions = ((column * bs)[:, None] + offsets[None, :]).reshape(-1).astype(np.int64)
    slots = ((batch.block_table[req, column].astype(np.int64) * bs)[:, None] + offsets[None, :]).reshape(-1)
    kv_score = rng.standard_normal((positions.shape[0], state_cache.shape[2])).astype(np.float32)
    save_partial_states(kv_score, ape, positions, slots, state_cache, bs, ape_at=ape_at)


def relocate_state_blocks(batch: Batch, state_cache: np.ndarray, rng: np.random.Generator) -> tuple[Batch, np.ndarray]:
    """The same logical content on other physical blocks: a permuted block table and cache.

    The slots of ``slot_mapping`` follow their blocks, so every operation must give the
    same bytes on the relocated pair.
    """
    num_blocks = state_cache.shape[0]
    new_id = rng.permutation(num_blocks)  # physical block b moves to new_id[b]
    moved = np.empty_like(state_cache)
    moved[new_id] = state_cache
    table = np.where(batch.block_table >= 0, new_id[np.maximum(batch.block_table, 0)], -1).astype(np.int32)
    slots = batch.slot_mapping
    saved = slots >= 0
    new_slots = slots.copy()
    new_slots[saved] = new_id[slots[saved] // batch.block_size] * batch.block_size + slots[saved] % batch.block_size
    relocated = Batch(**{**batch.__dict__, "block_table": table, "slot_mapping": new_slots,
                         "save_slot_mapping": _relocated_slots(batch.save_slot_mapping, new_id, batch.block_size)})
    return relocated, moved


def _relocated_slots(slots: np.ndarray | None, new_id: np.ndarray, block_size: int) -> np.ndarray | None:
    if slots is None:
        return None
    moved = slots.copy()
    saved = slots >= 0
    moved[saved] = new_id[slots[saved] // block_size] * block_size + slots[saved] % block_size
    return moved


# ---- SPEC §13: step metadata, ring state, tail saves -------------------------------------
def query_start_loc(requests: list[Request] | tuple[Request, ...]) -> np.ndarray:
    """int32 ``[num_reqs + 1]``: the first token of each request's chunk, tokens packed request by request."""
    return np.concatenate([[0], np.cumsum([r.num_tokens for r in requests])]).astype(np.int32)


def ring_slots(block_table: np.ndarray, token_to_req: np.ndarray, positions: np.ndarray, ring_capacity: int,
               block_size: int) -> np.ndarray:
    """int64 ``[T]``: the ring slot of each token (SPEC §13.3), ``block_table[req, (p mod C) // bs] * bs
    + (p mod C) mod bs``. ``block_table``: int32 ``[num_reqs, >= C / bs]``; ``token_to_req``: int32 ``[T]``;
    ``positions``: int64 ``[T]``."""
    index = positions % ring_capacity
    return block_table[token_to_req, index // block_size].astype(np.int64) * block_size + index % block_size


def tail_saves(slot_mapping: np.ndarray, starts: np.ndarray, ring_capacity: int) -> np.ndarray:
    """int64 ``[T]``: ``slot_mapping`` for the last ``C`` tokens of each request's chunk (its tail),
    ``-1`` for the others and for the padding after ``starts[-1]`` (SPEC §13.4's ring saves).
    ``slot_mapping``: int64 ``[T]``; ``starts``: int32 ``[num_reqs + 1]`` (``query_start_loc``)."""
    saves = np.full(slot_mapping.shape, -1, dtype=np.int64)
    for first, end in zip(starts[:-1], starts[1:]):
        tail = slice(max(int(first), int(end) - ring_capacity), int(end))
        saves[tail] = slot_mapping[tail]
    return saves


def _on_ring(batch: Batch, ring_capacity: int, rng: np.random.Generator, spare_state_blocks: int) -> Batch:
    """``batch``'s tokens and compressed-cache slots with ring metadata (see :func:`as_ring`)."""
    if batch.query_start_loc is None:
        raise ValueError("batch: expected tokens packed request by request (padding at the end), got scattered padding")
    bs = batch.block_size
    if ring_capacity % bs or ring_capacity < ratio_config(batch.compress_ratio).window:
        raise ValueError(f"ring_capacity: expected a multiple of block_size {bs} that is at least W, got {ring_capacity}")
    needed = np.ones((len(batch.requests), ring_capacity // bs), dtype=bool)
    num_state_blocks = int(needed.sum()) + spare_state_blocks
    table = _allocate(needed, num_state_blocks, rng)
    slots = ring_slots(table, batch.token_to_req_indices, batch.positions, ring_capacity, bs)
    slots = np.where(batch.slot_mapping >= 0, slots, -1)
    return Batch(**{**batch.__dict__, "block_table": table, "slot_mapping": slots,
                    "save_slot_mapping": tail_saves(slots, batch.query_start_loc, ring_capacity),
                    "num_state_blocks": num_state_blocks, "ring_capacity": ring_capacity})


def as_ring(batch: Batch, state_cache: np.ndarray, ring_capacity: int, rng: np.random.Generator, *,
            spare_state_blocks: int = 3) -> tuple[Batch, np.ndarray]:
    """The same step on a ring state (SPEC §13.3): each request's ring of ``C = ring_capacity`` rows
    in the first ``C / bs`` blocks of its block-table row (distinct blocks of a shuffled pool), every
    token's ``slot_mapping`` its ring slot (``-1`` stays ``-1``), ``save_slot_mapping`` the tail
    saves, and a ring state of ``state_cache``'s dtype (float32, or uint16 bf16 patterns; other
    rows NaN) holding ``state_cache``'s rows of each request's last ``C`` positions before its
    chunk wherever the paged ``batch`` has a block for them. The compressed-cache slots stay.
    ``batch`` must pack its tokens request by request (``query_start_loc``)."""
    ringed = _on_ring(batch, ring_capacity, rng, spare_state_blocks)
    bs, table = batch.block_size, ringed.block_table
    nan = np.uint16(0x7FC0) if state_cache.dtype == np.uint16 else np.float32(np.nan)
    ring = padded_view((ringed.num_state_blocks, bs, state_cache.shape[2]), state_cache.dtype, (0, 0, 0), nan)
    for req, request in enumerate(batch.requests):
        for q in range(max(0, request.context_len - ring_capacity), request.context_len):
            block = batch.block_table[req, q // bs] if q // bs < batch.block_table.shape[1] else -1
            if block >= 0:
                ring[table[req, (q % ring_capacity) // bs], (q % ring_capacity) % bs] = state_cache[block, q % bs]
    return ringed, ring


def build_ring_batch(requests: list[Request], *, compress_ratio: int, ring_capacity: int, block_size: int,
                     entries_per_page: int, rng: np.random.Generator, num_padding: int = 0,
                     spare_state_blocks: int = 3, spare_pages: int = 2) -> Batch:
    """A step on a ring state (SPEC §13.3/§13.4): :func:`build_batch`'s tokens, compressed-cache
    slots and ``query_start_loc`` (padding at the end), each request's ring in the first ``C / bs``
    blocks of its block-table row, ring slots for every token and the tail saves."""
    paged = build_batch(requests, compress_ratio=compress_ratio, block_size=block_size, entries_per_page=entries_per_page,
                        rng=rng, num_padding=num_padding, spare_pages=spare_pages)
    return _on_ring(paged, ring_capacity, rng, spare_state_blocks)
