"""Read floors: Triton kernels that only read what a step must read (C128, and C4 at both head widths).

Every kernel reads T windows of 128 state rows (kv ``[0:512]`` and score ``[512:1024]``,
fp32) and stores one float per CTA (the sum of what it read, so no load is dropped); none
does any of SPEC's arithmetic. Their CUDA-graph time is what no conforming kernel with the
same access pattern can beat, which makes them the yardstick for the C128 kernels' design
choices (:mod:`.probe` ``floors`` runs them):

Contiguous windows (window ``t`` is rows ``128t .. 128t+127`` of a ``[128 T, 1024]`` buffer):

- :func:`stream_read`: 32 KiB of consecutive floats per CTA, the plain bandwidth floor;
- :func:`tile_read`: one CTA per (token, 64-channel tile), ``[128, 64]`` kv and score with
  16-byte loads: the access pattern of the fused kernels (8 CTAs per token);
- :func:`tile_read_tma`: the same through one TMA box load of ``[128, 2, 64]`` (kv, score);
- :func:`token_read`: one 512-thread CTA per token reading its whole 512 KiB window;

Paged windows (the benchmark case's own state cache, block table and metadata):

- :func:`paged_tile_read`: position and request, the 16 block-table entries, then the
  gather: every dependent load of the fused kernels, no arithmetic;
- :func:`paged_tile_read_tma`: the same with one ``[8, 64]`` TMA box per state block
  (block size 8) for kv and for score, in a software-pipelined loop;
- :func:`paged_c4_read`: a C4 window, one program per token: position and request, the 8 rows'
  block-table entries, then each row's own half of kv and of score (head width ``HEAD``: 512
  for the attention compressor, 32 KiB a token as two 2 KiB runs of every 8 KiB row; 128 for the
  indexer's (SPEC §12), 8 KiB a token as two 512-byte runs of every 2 KiB row).
"""

from __future__ import annotations

import triton
import triton.language as tl

ROWS = tl.constexpr(128)  # window rows of a C128 token
WIDTH = tl.constexpr(1024)  # state row: kv[0:512], score[512:1024]
HALF = tl.constexpr(512)


@triton.jit
def stream_read(src_ptr, out_ptr, BLOCK: tl.constexpr):
    # src_ptr: fp32 [n]; out_ptr: fp32 [n / BLOCK]; one CTA sums BLOCK consecutive floats
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + pid, tl.sum(tl.load(src_ptr + offsets, cache_modifier=".cg"), axis=0))


@triton.jit
def _tile_sum(state_ptr, rows, tile, TILE: tl.constexpr):
    # the sum of kv + score over rows (int64 [128] state row indices) and channels tile*TILE ..
    columns = tile * TILE + tl.arange(0, TILE)
    offsets = rows[:, None] * WIDTH + columns[None, :]
    kv = tl.load(state_ptr + offsets, cache_modifier=".cg")
    score = tl.load(state_ptr + offsets + HALF, cache_modifier=".cg")
    return tl.sum(tl.sum(kv + score, axis=1), axis=0)


@triton.jit
def tile_read(state_ptr, out_ptr, TILE: tl.constexpr):
    # state_ptr: fp32 [128 T, 1024] contiguous windows; out_ptr: fp32 [T * 512 / TILE]
    pid = tl.program_id(0)
    token = pid // (HALF // TILE)
    tile = pid % (HALF // TILE)
    rows = token.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    tl.store(out_ptr + pid, _tile_sum(state_ptr, rows, tile, TILE))


@triton.jit
def tile_read_tma(state_desc, out_ptr, TILE: tl.constexpr):
    # state_desc: TMA descriptor of the state viewed as fp32 [128 T, 2, 512], box [128, 2, TILE]
    # (kv and score of the tile in one load); out_ptr: fp32 [T * 512 / TILE]
    pid = tl.program_id(0)
    token = pid // (HALF // TILE)
    tile = pid % (HALF // TILE)
    both = state_desc.load([token * ROWS, 0, tile * TILE])
    tl.store(out_ptr + pid, tl.sum(tl.sum(tl.sum(both, axis=2), axis=1), axis=0))


@triton.jit
def token_read(state_ptr, out_ptr, CHUNK_ROWS: tl.constexpr):
    # state_ptr: fp32 [128 T, 1024] contiguous windows; out_ptr: fp32 [T]; 16 warps per CTA
    token = tl.program_id(0)
    columns = tl.arange(0, WIDTH)
    total = tl.zeros((CHUNK_ROWS, WIDTH), tl.float32)
    for chunk in tl.static_range(ROWS // CHUNK_ROWS):
        rows = token.to(tl.int64) * ROWS + chunk * CHUNK_ROWS + tl.arange(0, CHUNK_ROWS)
        total += tl.load(state_ptr + rows[:, None] * WIDTH + columns[None, :], cache_modifier=".cg")
    tl.store(out_ptr + token, tl.sum(tl.sum(total, axis=1), axis=0))


@triton.jit
def paged_tile_read(state_ptr, token_req_ptr, positions_ptr, block_table_ptr, out_ptr, block_table_stride,
                    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    # state_ptr: fp32 [num_blocks, BLOCK_SIZE, 1024] contiguous; token_req_ptr: int32 [T];
    # positions_ptr: int64 [T] (boundary positions); block_table_ptr: int32 [num_reqs, max_blocks];
    # out_ptr: fp32 [T * 512 / TILE]
    pid = tl.program_id(0)
    token = pid // (HALF // TILE)
    tile = pid % (HALF // TILE)
    position = tl.load(positions_ptr + token)
    request = tl.load(token_req_ptr + token)
    window = (position // ROWS) * ROWS + tl.arange(0, ROWS)
    blocks = tl.load(block_table_ptr + request.to(tl.int64) * block_table_stride + window // BLOCK_SIZE)
    rows = blocks.to(tl.int64) * BLOCK_SIZE + window % BLOCK_SIZE
    tl.store(out_ptr + pid, _tile_sum(state_ptr, rows, tile, TILE))


@triton.jit
def paged_tile_read_tma(state_desc, token_req_ptr, positions_ptr, block_table_ptr, out_ptr, block_table_stride,
                        BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, STAGES: tl.constexpr):
    # state_desc: TMA descriptor of fp32 [num_blocks * BLOCK_SIZE, 1024], box [BLOCK_SIZE, TILE];
    # the other arguments as paged_tile_read
    pid = tl.program_id(0)
    token = pid // (HALF // TILE)
    tile = pid % (HALF // TILE)
    position = tl.load(positions_ptr + token)
    request = tl.load(token_req_ptr + token)
    first_block = (position // ROWS) * ROWS // BLOCK_SIZE
    total = tl.zeros((BLOCK_SIZE, TILE), tl.float32)
    for b in tl.range(0, ROWS // BLOCK_SIZE, num_stages=STAGES):
        block = tl.load(block_table_ptr + request.to(tl.int64) * block_table_stride + first_block + b)
        total += state_desc.load([block * BLOCK_SIZE, tile * TILE])
        total += state_desc.load([block * BLOCK_SIZE, HALF + tile * TILE])
    tl.store(out_ptr + pid, tl.sum(tl.sum(total, axis=1), axis=0))


@triton.jit
def paged_c4_read(state_ptr, token_req_ptr, positions_ptr, block_table_ptr, out_ptr, block_table_stride,
                  block_stride, row_stride, BLOCK_SIZE: tl.constexpr, HEAD: tl.constexpr):
    # state_ptr: fp32 [num_blocks, BLOCK_SIZE, 4*HEAD] (block_stride, row_stride in floats; a row is
    # kv[0:2*HEAD] then score[2*HEAD:4*HEAD], each two halves of HEAD); token_req_ptr: int32 [T];
    # positions_ptr: int64 [T] (boundary positions p); block_table_ptr: int32 [num_reqs, max_blocks];
    # out_ptr: fp32 [T]. Rows p-7..p-4 read half 0, rows p-3..p half 1; rows before position 0 are not read.
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token)
    request = tl.load(token_req_ptr + token)
    row = tl.arange(0, 8)
    pos = (position // 4) * 4 - 4 + row
    valid = pos >= 0
    pos = tl.where(valid, pos, 0)
    blocks = tl.load(block_table_ptr + request.to(tl.int64) * block_table_stride + pos // BLOCK_SIZE)
    starts = blocks.to(tl.int64) * block_stride + (pos % BLOCK_SIZE) * row_stride + (row // 4) * HEAD
    offsets = starts[:, None] + tl.arange(0, HEAD)[None, :]
    kv = tl.load(state_ptr + offsets, mask=valid[:, None], other=0.0, cache_modifier=".cg")
    score = tl.load(state_ptr + offsets + 2 * HEAD, mask=valid[:, None], other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + token, tl.sum(tl.sum(kv + score, axis=1), axis=0))
