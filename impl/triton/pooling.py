"""SPEC §5 pooling of one token's window, exact, as Triton device code: one channel tile
(:func:`pool_channel_tile`) and the whole pooled vector, tile by tile (:func:`pool_window_tiles`).

A program pools a ``[W, BLOCK_C]`` tile (W window rows, BLOCK_C channels) per step. The row
trees of SPEC §5 must add window rows in index order, level by level; *which* tensor row holds
*which* window row is free, so we choose it to make the cheap levels come first.

Triton lays a ``[W, BLOCK_C]`` fp32 load out as: 4 consecutive channels per thread (a 128-bit
load), ``min(32, BLOCK_C/4)`` lanes along channels, the remaining lanes along rows, the warps
along rows (after the channels have used up their threads), and the rest of the rows in
registers. So tensor row ``p`` has its low ``LANE_BITS`` bits on lanes, the next ``WARP_BITS``
bits on warps and the top ``REG_BITS`` bits in registers. We put window-row bits 0.. on the
register bits, then on the lane bits, then on the warp bits. Tree level k (window bit k) is then
an in-thread add for the first ``REG_BITS`` levels, where most of the work is. For the remaining
``LANE_BITS + WARP_BITS`` levels each add needs both operands in one thread (:func:`add_pairs`
splits a size-2 axis), so Triton converts the few remaining partial sums
(``2^(LANE_BITS+WARP_BITS) x BLOCK_C``) once per tree and tile through shared memory and finishes
in registers (seen in the TTGIR of Triton 3.6 and 3.9: one ``convert_layout`` per tree).

The plan only affects speed: the trees reduce window bit k at level k whatever the layout
Triton actually picks, so the result is SPEC's tree for every plan (the tests run several).
"""


from dataclasses import dataclass

import triton
import triton.language as tl

from .exact_math import LOG2E_F32, add_pairs, exp2s
from .rows import window_tile

VECTOR_WIDTH = 4  # fp32 per 128-bit load
THREADS_PER_WARP = 32


@dataclass(frozen=True)
class RowPlan:
    """How the window rows of a ``[W, BLOCK_C]`` tile map to lanes, warps and registers."""

    lane_bits: int  # low tensor-row bits held by lanes
    warp_bits: int  # next tensor-row bits held by warps
    reg_bits: int  # top tensor-row bits held in each thread's registers

    def window_row(self, tensor_row: int) -> int:
        """Host mirror of :func:`window_row_of` (used by the tests)."""
        lanes = tensor_row & ((1 << self.lane_bits) - 1)
        warps = (tensor_row >> self.lane_bits) & ((1 << self.warp_bits) - 1)
        regs = tensor_row >> (self.lane_bits + self.warp_bits)
        return regs | (lanes << self.reg_bits) | (warps << (self.reg_bits + self.lane_bits))


def _log2(n: int) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"expected a power of two, got {n}")
    return n.bit_length() - 1


def row_plan(window: int, block_c: int, num_warps: int) -> RowPlan:
    """Mirror Triton's default blocked layout for a ``[window, block_c]`` fp32 load.

    Triton (``BlockedEncodingAttr::get``) fills the contiguous channel dimension first: up to
    ``block_c/4`` threads, lanes before warps; the row dimension takes the remaining lanes and
    warps; whatever rows are left sit in registers.
    """
    channel_threads = min(num_warps * THREADS_PER_WARP, max(1, block_c // VECTOR_WIDTH))
    channel_lanes = min(THREADS_PER_WARP, channel_threads)
    channel_warps = max(1, min(num_warps, channel_threads // channel_lanes))
    row_lanes = THREADS_PER_WARP // channel_lanes
    row_warps = num_warps // channel_warps
    rows = _log2(window)
    lane_bits = min(_log2(row_lanes), rows)
    warp_bits = min(_log2(row_warps), rows - lane_bits)
    return RowPlan(lane_bits=lane_bits, warp_bits=warp_bits, reg_bits=rows - lane_bits - warp_bits)


@triton.jit
def window_row_of(tensor_row, LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """Window row held by tensor row ``tensor_row`` (int32 tensor): register bits carry the
    low window bits, then lanes, then warps (see the module docstring)."""
    lanes = tensor_row & ((1 << LANE_BITS) - 1)
    warps = (tensor_row >> LANE_BITS) & ((1 << WARP_BITS) - 1)
    regs = tensor_row >> (LANE_BITS + WARP_BITS)
    return regs | (lanes << REG_BITS) | (warps << (REG_BITS + LANE_BITS))


@triton.jit
def tree_sum_window_rows(e, u, W: tl.constexpr, BLOCK_C: tl.constexpr,
                         LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """SPEC's row trees of ``e`` and ``u`` (``[W, BLOCK_C]``, rows permuted by :func:`window_row_of`).

    Level k adds the tensor rows whose window rows differ in bit k only: first the register
    bits (the lowest remaining register bit sits above the ``LANE_BITS + WARP_BITS`` low bits),
    then the lane bits and the warp bits (always the lowest remaining bit). Each level is one
    add per output element (:func:`add_pairs`). Returns ``(tree(u), tree(e))``.
    """
    LOW_BITS: tl.constexpr = LANE_BITS + WARP_BITS
    # (shapes are written inline: a plain ``rows = ...`` would become a tensor in the interpreter)
    for level in tl.static_range(REG_BITS):
        e = tl.reshape(add_pairs(e, W >> (level + LOW_BITS + 1), BLOCK_C << LOW_BITS), (W >> (level + 1), BLOCK_C))
        u = tl.reshape(add_pairs(u, W >> (level + LOW_BITS + 1), BLOCK_C << LOW_BITS), (W >> (level + 1), BLOCK_C))
    for level in tl.static_range(LOW_BITS):
        e = add_pairs(e, W >> (REG_BITS + level + 1), BLOCK_C)
        u = add_pairs(u, W >> (REG_BITS + level + 1), BLOCK_C)
    return tl.reshape(u, (BLOCK_C, )), tl.reshape(e, (BLOCK_C, ))


@triton.jit
def pool_channel_tile(rows, channel0, STATE_WIDTH: tl.constexpr, W: tl.constexpr, BLOCK_C: tl.constexpr,
                      MAY_HAVE_INVALID_ROWS: tl.constexpr, ROW_FORMAT: tl.constexpr,
                      LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """SPEC §5's ``x[c]`` for channels ``channel0 .. channel0 + BLOCK_C - 1`` of one token.

    ``rows``: the window's rows (:func:`.rows.window_tile`: the state base, each tensor row's
    int64 element offset of its kv half, multiples of 4 so the loads are 128-bit, int1 ``[W]``
    validity, and SPEC §13.4's chunk rows and the ``ape`` rows where ``ROW_FORMAT`` has them). Only C4 at p = 3 has
    invalid rows: they are left out of the max and enter both trees as ``+0``.
    """
    kv, score = window_tile(rows, channel0, STATE_WIDTH, BLOCK_C, MAY_HAVE_INVALID_ROWS, ROW_FORMAT)
    if MAY_HAVE_INVALID_ROWS:
        valid = rows[2][:, None]
        row_max = tl.max(tl.where(valid, score, float("-inf")), axis=0)  # max is exact in any order
        e = exp2s((tl.where(valid, score, row_max[None, :]) - row_max[None, :]) * LOG2E_F32)
        e = tl.where(valid, e, 0.0)
        u = tl.where(valid, kv * e, 0.0)
    else:
        row_max = tl.max(score, axis=0)
        e = exp2s((score - row_max[None, :]) * LOG2E_F32)
        u = kv * e
    numerator, denominator = tree_sum_window_rows(e, u, W, BLOCK_C, LANE_BITS, WARP_BITS, REG_BITS)
    return tl.div_rn(numerator, denominator)


@triton.jit
def pool_window_tiles(rows, complete, HEAD: tl.constexpr, RATIO: tl.constexpr, BLOCK_C: tl.constexpr,
                      UNROLL_TILES: tl.constexpr, TILE_STAGES: tl.constexpr, ROW_FORMAT: tl.constexpr,
                      LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """SPEC §5's pooled vector of one token, fp32 ``[HEAD / BLOCK_C, BLOCK_C]`` (row-major = channel
    order), from its window rows (``rows``: see :func:`pool_channel_tile`), one ``[W, BLOCK_C]``
    channel tile at a time. ``complete`` (int1): every window row is valid; a C4 window that is not
    (the first of a request, ``p = 3``) takes the masked pooling, every other window the same
    arithmetic without the masks (equal results on valid rows)."""
    if RATIO == 4:
        if complete:
            pooled = pool_tiles(rows, HEAD, RATIO, BLOCK_C, False, UNROLL_TILES, TILE_STAGES, ROW_FORMAT, LANE_BITS,
                                WARP_BITS, REG_BITS)
        else:
            pooled = pool_tiles(rows, HEAD, RATIO, BLOCK_C, True, UNROLL_TILES, TILE_STAGES, ROW_FORMAT, LANE_BITS,
                                WARP_BITS, REG_BITS)
    else:  # a C128 window is never incomplete
        pooled = pool_tiles(rows, HEAD, RATIO, BLOCK_C, False, UNROLL_TILES, TILE_STAGES, ROW_FORMAT, LANE_BITS,
                            WARP_BITS, REG_BITS)
    return pooled


@triton.jit
def pool_tiles(rows, HEAD: tl.constexpr, RATIO: tl.constexpr, BLOCK_C: tl.constexpr,
               MAY_HAVE_INVALID_ROWS: tl.constexpr, UNROLL_TILES: tl.constexpr, TILE_STAGES: tl.constexpr,
               ROW_FORMAT: tl.constexpr, LANE_BITS: tl.constexpr, WARP_BITS: tl.constexpr, REG_BITS: tl.constexpr):
    """The tiles of :func:`pool_window_tiles`: a static unrolled loop, or a runtime loop with
    ``TILE_STAGES`` software-pipelining stages."""
    OVERLAP: tl.constexpr = 2 if RATIO == 4 else 1
    STATE_WIDTH: tl.constexpr = OVERLAP * HEAD
    W: tl.constexpr = OVERLAP * RATIO
    NUM_TILES: tl.constexpr = HEAD // BLOCK_C
    tile_index = tl.arange(0, NUM_TILES)[:, None]
    pooled = tl.zeros((NUM_TILES, BLOCK_C), tl.float32)
    if UNROLL_TILES:
        for tile in tl.static_range(NUM_TILES):
            x_tile = pool_channel_tile(rows, tile * BLOCK_C, STATE_WIDTH, W, BLOCK_C, MAY_HAVE_INVALID_ROWS, ROW_FORMAT,
                                       LANE_BITS, WARP_BITS, REG_BITS)
            pooled = tl.where(tile_index == tile, x_tile[None, :], pooled)
    else:
        for tile in tl.range(0, NUM_TILES, num_stages=TILE_STAGES):
            x_tile = pool_channel_tile(rows, tile * BLOCK_C, STATE_WIDTH, W, BLOCK_C, MAY_HAVE_INVALID_ROWS, ROW_FORMAT,
                                       LANE_BITS, WARP_BITS, REG_BITS)
            pooled = tl.where(tile_index == tile, x_tile[None, :], pooled)
    return pooled
