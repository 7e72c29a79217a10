"""Batch builders shared by the tests, the conformance suite and the benchmarks.

From a list of requests (positions already cached, tokens this step) they build the
per-token metadata the way vLLM does: ``positions``, ``token_to_req_indices``, the state
``slot_mapping`` (``block_table[req, p // bs] * bs + p % bs``) and the compressed
``kv_slot_mapping`` (entry ``p // r`` placed through the request's own compressed-cache
block table, ``-1`` for non-boundary tokens), with shuffled, non-identity block tables and
optional padding tokens (slot ``-1``). Buffer builders make state caches with padded
strides and canary-filled compressed caches with padded page strides.

Everything here is NumPy; the torch front ends convert with ``torch.from_numpy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .constants import HEAD_DIM, PAGED_LAYOUTS, ROPE_DIM, V41_RECORD_LAYOUTS, ratio_config
from .pooling import active_tokens, is_boundary

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
    )


# ---- request mixes ---------------------------------------------------------------------
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
    relocated = Batch(**{**batch.__dict__, "block_table": table, "slot_mapping": new_slots})
    return relocated, moved
