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

Steps (SPEC §13.4's step call, §14's V4.1 calls; host side in :mod:`.step_floor`):

- :func:`step_floor`: what a step must move and nothing else, in one launch: each token's kv (and
  score) row read once (fp32 or bf16), copied to its save slot (fp32, or truncated to bf16), its
  record's bytes and (V4.1) a bf16 latent row written; then the window rows that come from the
  state, as runs of ``H`` kv and ``H`` score elements listed on the host.
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


# ---- the step floor: SPEC §13's step call and §14's V4.1 calls ---------------------------------------
@triton.jit
def _bf16_values(bits):
    # int16 bf16 bit patterns -> their binary32 values (exact)
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _first(columns, condition, count):
    # the mask of columns[:count] where the scalar condition holds, else of none (a block mask: the
    # interpreter cannot combine a scalar mask with a block one)
    return columns < tl.where(condition, count, 0)


@triton.jit
def _load_row(ptr, columns, mask, BF16: tl.constexpr):
    # fp32 values, or bf16 values held as int16 patterns, widened to binary32
    if BF16:  # one return: Triton types every return of a function, also one after a constexpr branch
        values = _bf16_values(tl.load(ptr + columns, mask=mask, other=0, cache_modifier=".cg"))
    else:
        values = tl.load(ptr + columns, mask=mask, other=0.0, cache_modifier=".cg")
    return values


@triton.jit
def _store_row(ptr, columns, values, mask, BF16: tl.constexpr):
    # binary32 values as fp32, or truncated to bf16 patterns (int16): a copy, no rounding arithmetic
    if BF16:
        tl.store(ptr + columns, (values.to(tl.int32, bitcast=True) >> 16).to(tl.int16), mask=mask)
    else:
        tl.store(ptr + columns, values, mask=mask)


@triton.jit
def _token_floor(t, inputs, tokens, state, outputs, num_tokens, SW: tl.constexpr, INPUT_BF16: tl.constexpr,
                 HAS_SCORE: tl.constexpr, STATE_BF16: tl.constexpr, READS: tl.constexpr, ENTRY_BLOCK: tl.constexpr,
                 ENTRY_BYTES: tl.constexpr, LATENT: tl.constexpr):
    # token t's share of step_floor: read its kv (and score) row, copy it to its save slot, write its record's
    # bytes and (LATENT) its kv as a bf16 latent row; returns the sum of what it read
    kv_ptr, kv_stride, score_ptr, score_stride = inputs
    saves_ptr, entries_ptr = tokens
    state_ptr, state_s0, state_s1, bs = state
    cache_ptr, latent_ptr, latent_stride = outputs
    in_range = t < num_tokens
    row = tl.minimum(t, num_tokens - 1).to(tl.int64)
    entry = tl.load(entries_ptr + row)
    writes_entry = in_range & (entry >= 0)
    total = 0.0
    if READS > 0:
        save = tl.load(saves_ptr + row)
        if READS == 2:
            reads = in_range
        else:
            reads = in_range & ((entry >= 0) | (save >= 0))
        columns = tl.arange(0, SW)
        read_mask = _first(columns, reads, SW)
        save_mask = _first(columns, in_range & (save >= 0), SW)
        kv = _load_row(kv_ptr + row * kv_stride, columns, read_mask, INPUT_BF16)
        total += tl.sum(kv, axis=0)
        slot = tl.maximum(save, 0)
        target = state_ptr + (slot // bs) * state_s0 + (slot % bs) * state_s1
        _store_row(target, columns, kv, save_mask, STATE_BF16)
        if HAS_SCORE:
            score = _load_row(score_ptr + row * score_stride, columns, read_mask, INPUT_BF16)
            total += tl.sum(score, axis=0)
            _store_row(target + SW, columns, score, save_mask, STATE_BF16)
        if LATENT:
            _store_row(latent_ptr + row * latent_stride, columns, kv, _first(columns, writes_entry, SW), True)
    if ENTRY_BYTES > 0:
        record = tl.arange(0, ENTRY_BLOCK)
        tl.store(cache_ptr + tl.maximum(entry, 0) + record, (record & 0xFF).to(tl.uint8),
                 mask=_first(record, writes_entry, ENTRY_BYTES))
    return total


@triton.jit
def step_floor(inputs, tokens, state, runs, outputs, out_ptr, num_tokens, token_programs, SW: tl.constexpr,
               H: tl.constexpr, TOKENS: tl.constexpr, RUNS: tl.constexpr, INPUT_BF16: tl.constexpr,
               HAS_SCORE: tl.constexpr, STATE_BF16: tl.constexpr, READS: tl.constexpr, ENTRY_BLOCK: tl.constexpr,
               ENTRY_BYTES: tl.constexpr, LATENT: tl.constexpr, UNROLL: tl.constexpr):
    # The bytes a step must move, with none of SPEC's arithmetic; programs 0 .. token_programs-1 take TOKENS
    # tokens each (UNROLL: unrolled, their loads issued together), the others RUNS state runs each.
    # inputs: (kv [T, SW] fp32 or int16 bf16 patterns, kv row stride, score (the same; read iff HAS_SCORE),
    #   score row stride), strides in elements; READS: 0 no token reads its row, 1 a token that saves or has a
    #   record reads it, 2 every token does;
    # tokens: (saves int64 [T]: state slot the token's row is copied to, -1 none; entries int64 [T]: byte offset
    #   of the token's record in the cache, -1 none);
    # state: (state fp32 or int16 bf16 patterns [blocks, bs, 2*SW], block stride, row stride (elements), bs);
    # runs: (offsets int64 [num_runs]: element offset of a run's kv in the state, its score SW further;
    #   num_runs): the window rows a step reads from the state, H kv and H score elements each;
    # outputs: (cache uint8 [bytes]: ENTRY_BYTES written per record, latent int16 [T, SW] (LATENT), latent row
    #   stride); out_ptr: fp32 [programs], the sum of what each program read
    pid = tl.program_id(0)
    total = 0.0
    if pid < token_programs:
        if UNROLL:
            for i in tl.static_range(TOKENS):
                total += _token_floor(pid * TOKENS + i, inputs, tokens, state, outputs, num_tokens, SW, INPUT_BF16,
                                      HAS_SCORE, STATE_BF16, READS, ENTRY_BLOCK, ENTRY_BYTES, LATENT)
        else:
            for i in range(TOKENS):
                total += _token_floor(pid * TOKENS + i, inputs, tokens, state, outputs, num_tokens, SW, INPUT_BF16,
                                      HAS_SCORE, STATE_BF16, READS, ENTRY_BLOCK, ENTRY_BYTES, LATENT)
    else:
        state_ptr = state[0]
        offsets_ptr, num_runs = runs
        columns = tl.arange(0, H)
        for i in range(RUNS):
            run = (pid - token_programs) * RUNS + i
            valid = run < num_runs
            start = tl.load(offsets_ptr + run, mask=valid, other=0)
            mask = _first(columns, valid, H)
            total += tl.sum(_load_row(state_ptr + start, columns, mask, STATE_BF16), axis=0)
            total += tl.sum(_load_row(state_ptr + start + SW, columns, mask, STATE_BF16), axis=0)
    tl.store(out_ptr + pid, total)
