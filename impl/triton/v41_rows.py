"""SPEC §14.3's rows in Triton device code: the projections and ratio 2's state (SPEC §13.1,
§13.3, §13.4), read as pooling reads them and saved after the compress.

A 512-wide row travels as an fp32 ``[8, 64]`` tensor (row-major = channel order, the view of
:mod:`.kv_entry`). bf16 data (``kv``, ``score``, a bf16 state) is addressed through int16 views
and converted exactly (the bit pattern is the top half of the binary32); a bf16 store rounds
once with :func:`.exact_math.bf16_rne_bits`, never ``.to(tl.bfloat16)`` (the interpreter
truncates).

Row strides arrive in 16-byte units (``stride16``) and are multiplied back by the elements per
16 bytes (4 fp32, 8 bf16), so the compiler knows every row starts on 16 bytes.

The argument groups (tuples):

- ``inputs``: ``(kv_ptr, kv_stride16, score_ptr, score_stride16)``: ``kv`` and ``score`` fp32
  or int16 (bf16 patterns) ``[T, 512]``;
- ``state``: ``(state_ptr, block_stride16, row_stride16, block_table_ptr, block_table_stride,
  bs, ring_capacity)``: the state fp32 or int16 ``[num_state_blocks, bs, 1024]`` (kv, then the
  raw score), the block table int32 ``[num_reqs, max_blocks]``, and ``C`` (unused when paged).
"""


import triton
import triton.language as tl

from .exact_math import bf16_rne_bits, bf16_round

ROWS = tl.constexpr(8)  # an entry as [8, 64]: rows 0..6 the NoPE blocks, row 7 RoPE
ROW_W = tl.constexpr(64)
HEAD = tl.constexpr(512)


@triton.jit
def entry_channels():
    """int32 ``[8, 64]``: the channel of each element of an entry's ``[8, 64]`` view."""
    return tl.arange(0, ROWS)[:, None] * ROW_W + tl.arange(0, ROW_W)[None, :]


@triton.jit
def load_values(ptr, offsets, IS_BF16: tl.constexpr):
    """fp32 values of fp32 elements, or of bf16 bit patterns read through an int16 view (exact)."""
    if IS_BF16:
        bits = tl.load(ptr + offsets).to(tl.uint16, bitcast=True).to(tl.uint32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offsets)


@triton.jit
def store_values(ptr, offsets, values, IS_BF16: tl.constexpr):
    """fp32 ``values`` stored as fp32, or rounded once to bf16 (nearest, ties to even) through an int16 view."""
    if IS_BF16:
        tl.store(ptr + offsets, bf16_rne_bits(values).to(tl.uint16).to(tl.int16, bitcast=True))
    else:
        tl.store(ptr + offsets, values)


@triton.jit
def input_row(inputs, token, channels, KV_BF16: tl.constexpr, SCORE_BF16: tl.constexpr):
    """``(kv, score)``: token ``token``'s projections (int64 index) as binary32 ``[8, 64]``, exact."""
    kv_ptr, kv_stride16, score_ptr, score_stride16 = inputs
    KV_PER_16: tl.constexpr = 8 if KV_BF16 else 4  # elements per 16 bytes
    SCORE_PER_16: tl.constexpr = 8 if SCORE_BF16 else 4
    kv = load_values(kv_ptr, token * (kv_stride16 * KV_PER_16) + channels, KV_BF16)
    score = load_values(score_ptr, token * (score_stride16 * SCORE_PER_16) + channels, SCORE_BF16)
    return kv, score


@triton.jit
def chunk_row(inputs, token, channels, KV_BF16: tl.constexpr, SCORE_BF16: tl.constexpr, STATE_BF16: tl.constexpr):
    """SPEC §13.4 step 1: a window row in the chunk, read from token ``token``'s projections as the
    save would store it and pooling read it back: ``R(kv)``, ``R(score)`` with ``R = bf16`` for
    a bf16 state (the identity for an fp32 one, and on values already bf16)."""
    kv, score = input_row(inputs, token, channels, KV_BF16, SCORE_BF16)
    if STATE_BF16 and not KV_BF16:
        kv = bf16_round(kv)
    if STATE_BF16 and not SCORE_BF16:
        score = bf16_round(score)
    return kv, score


@triton.jit
def state_slot(state, request, position, RING: tl.constexpr):
    """``(slot, block, offset)`` of the state row holding ``position`` of block-table row
    ``request`` (int64 scalars): paged ``block_table[request, q // bs]``, ``q mod bs``; in a ring
    (SPEC §13.3) the same with ``q mod C`` in place of ``q``. ``slot = block * bs + offset``
    names the row as ``slot_mapping`` does."""
    _, _, _, table_ptr, table_stride, bs, capacity = state
    index = position % capacity if RING else position
    column = index // bs
    block = tl.load(table_ptr + (request * table_stride + column)).to(tl.int64)
    offset = index - column * bs
    return block * bs + offset, block, offset


@triton.jit
def state_row(state, block, offset, channels, STATE_BF16: tl.constexpr):
    """``(kv, score)``: state row ``[block, offset]`` as binary32 ``[8, 64]`` (a bf16 state read exactly)."""
    state_ptr, block_stride16, row_stride16, _, _, _, _ = state
    PER_16: tl.constexpr = 8 if STATE_BF16 else 4
    base = (block * block_stride16 + offset * row_stride16) * PER_16
    kv = load_values(state_ptr, base + channels, STATE_BF16)
    score = load_values(state_ptr, base + (HEAD + channels), STATE_BF16)
    return kv, score


@triton.jit
def save_row(inputs, state, token, slot, channels, KV_BF16: tl.constexpr, SCORE_BF16: tl.constexpr,
             STATE_BF16: tl.constexpr):
    """SPEC §14.3's save of token ``token`` at state slot ``slot``: ``R(kv[token])`` then
    ``R(score[token])`` (the raw score), each rounded once to bf16 for a bf16 state."""
    state_ptr, block_stride16, row_stride16, _, _, bs, _ = state
    kv, score = input_row(inputs, token, channels, KV_BF16, SCORE_BF16)
    block = slot // bs
    offset = slot - block * bs
    PER_16: tl.constexpr = 8 if STATE_BF16 else 4
    base = (block * block_stride16 + offset * row_stride16) * PER_16
    store_values(state_ptr, base + channels, kv, STATE_BF16)
    store_values(state_ptr, base + (HEAD + channels), score, STATE_BF16)
