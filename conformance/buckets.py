"""Steps padded into the buckets of captured graphs, and the buffers such a graph keeps.

An engine captures one graph per bucket (a token count) and replays it for every step that
fits, padded with tokens of slot ``-1``: the metadata, the projections and the caches are
written *into* the captured tensors before each replay. A graph bakes in the tensors'
addresses, shapes and strides and the scalar arguments, so steps share a graph when they
share a *static configuration* (:class:`StaticKey`: ratio, layout, block size, strides,
dtypes, ...). An :class:`ArenaPlan` lays out buffers that hold every step of such a group:
as many state blocks, pages, block-table rows and columns and RoPE rows as the largest step
needs, each step's own allocation copied in at the same view offset, the rest left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..spec.batch import CANARY_BYTE, Batch
from .buffers import Buffer
from .scenarios import StepInputs

DEFAULT_BUCKETS = (1, 8, 64, 512, 4096)
VIEW_OFFSET = 64  # bytes: where an arena's cache views start inside their allocations (16-byte aligned)
OWN_GROUP_BYTES = 64 << 20  # a step with a larger allocation or RoPE table gets a graph of its own
STATE_FILL = 0xFF  # arena state bytes no step owns: NaN in every float32
TOKEN_ARRAYS = ("token_to_req_indices", "positions", "slot_mapping", "kv_slot_mapping")


def buckets_holding(tokens: int, buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The buckets a step of ``tokens`` tokens fits into, smallest first."""
    return tuple(sorted(b for b in buckets if b >= tokens))


def pad_batch(batch: Batch, bucket: int) -> Batch:
    """``batch`` followed by padding tokens up to ``bucket`` tokens (position 0, row 0, slots -1)."""
    extra = bucket - batch.num_tokens
    if extra < 0:
        raise ValueError(f"bucket: expected at least the step's {batch.num_tokens} tokens, got {bucket}")
    fill = {"token_to_req_indices": 0, "positions": 0, "slot_mapping": -1, "kv_slot_mapping": -1}
    return replace(batch, **{name: np.concatenate([getattr(batch, name), np.full(extra, fill[name], getattr(batch, name).dtype)])
                             for name in TOKEN_ARRAYS})


def padding_only(batch: Batch, tokens: int) -> Batch:
    """A step of ``tokens`` tokens with ``batch``'s block table, every token padding (it writes nothing)."""
    return pad_batch(replace(batch, **{name: getattr(batch, name)[:0] for name in TOKEN_ARRAYS}), tokens)


def pad_kv_score(kv_score: np.ndarray, bucket: int) -> np.ndarray:
    """fp32 ``[bucket, 2*SW]``: the step's rows, then NaN rows for the padding (never read)."""
    padded = np.full((bucket, kv_score.shape[1]), np.nan, dtype=np.float32)
    padded[:kv_score.shape[0]] = kv_score
    return padded


@dataclass(frozen=True)
class StaticKey:
    """What a captured graph bakes in besides the token count: steps with equal keys share one."""

    head_width: int
    compress_ratio: int
    layout: str
    block_size: int
    entries_per_page: int
    state_shape: tuple[int, ...]  # state_cache.shape[1:]
    state_strides: tuple[int, ...]  # bytes
    k_shape: tuple[int, ...]  # k_cache.shape[1:]
    k_strides: tuple[int, ...]  # bytes
    k_logical: str
    weight_dtype: str
    rms_norm_eps: float
    fp8_scale: float | None
    hadamard: bool
    strided_inputs: bool
    state_dtype: str = "float32"  # SPEC §13.1: the state's dtype (NumPy uint16 patterns: bf16)
    ape_at: str = "save"  # SPEC §13.2
    ring_capacity: int | None = None  # SPEC §13.3
    own: str = ""  # a step of its own (large allocations): its name

    @classmethod
    def of(cls, inputs: StepInputs, name: str) -> "StaticKey":
        b, state, k = inputs.batch, inputs.state_cache, inputs.k_cache
        large = max(state.nbytes, k.nbytes, inputs.cos_sin_cache.nbytes) > OWN_GROUP_BYTES
        return cls(int(inputs.rms_norm_weight.shape[0]), b.compress_ratio, inputs.layout, b.block_size,
                   b.entries_per_page, state.shape[1:], state.strides, k.shape[1:], k.strides, k.logical,
                   str(inputs.rms_norm_weight.dtype), float(inputs.rms_norm_eps), inputs.fp8_scale, inputs.hadamard,
                   inputs.strided_inputs, str(state.dtype), inputs.ape_at, inputs.ring_capacity, name if large else "")


def _arena_buffer(buffers: list[Buffer], count: int, fill: int) -> Buffer:
    """One allocation whose view (``count`` blocks or pages, the buffers' strides) starts at
    :data:`VIEW_OFFSET` and holds each buffer's allocation copied in at the same view offset."""
    first = buffers[0]
    if max(b.offset for b in buffers) > VIEW_OFFSET:
        raise ValueError(f"buffers: expected view offsets of at most {VIEW_OFFSET} bytes, got {[b.offset for b in buffers]}")
    extent = sum((n - 1) * s for n, s in zip((count,) + first.shape[1:], first.strides)) + first.dtype.itemsize
    size = max([VIEW_OFFSET + extent] + [VIEW_OFFSET - b.offset + b.nbytes for b in buffers])
    owner = np.full(-(-size // 64) * 64, fill, dtype=np.uint8)
    return Buffer(owner=owner, offset=VIEW_OFFSET, shape=(count,) + first.shape[1:], strides=first.strides,
                  dtype=first.dtype, logical=first.logical)


@dataclass
class ArenaPlan:
    """The buffers of one group's graph: sized for its largest step, on the host (NumPy)."""

    state: Buffer  # float32 [max blocks, bs, 2*SW] view, STATE_FILL elsewhere
    k_cache: Buffer  # the layout's view over max pages, canary elsewhere
    table_shape: tuple[int, int]  # block_table [max rows, max columns], -1 where no step writes
    cos_sin_rows: int  # cos_sin_cache [max rows, 64], NaN past a step's own rows

    @classmethod
    def of(cls, steps: list[StepInputs]) -> "ArenaPlan":
        return cls(
            state=_arena_buffer([s.state_cache for s in steps], max(s.state_cache.shape[0] for s in steps), STATE_FILL),
            k_cache=_arena_buffer([s.k_cache for s in steps], max(s.k_cache.shape[0] for s in steps), CANARY_BYTE),
            table_shape=(max(s.batch.block_table.shape[0] for s in steps), max(s.batch.block_table.shape[1] for s in steps)),
            cos_sin_rows=max(s.cos_sin_cache.shape[0] for s in steps))


def placement(arena: Buffer, buffer: Buffer) -> slice:
    """Where ``buffer``'s allocation goes in ``arena``'s so that both views start at the same byte."""
    start = arena.offset - buffer.offset
    return slice(start, start + buffer.nbytes)
