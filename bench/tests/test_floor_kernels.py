"""The read-floor kernels read exactly the bytes of a step (C128, C4 at both head widths): each CTA's stored sum equals
a float64 sum of the rows and channels it must cover (Triton interpreter on CPU, or the GPU).

A floor that skipped bytes would flatter the kernels measured against it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

TOKENS = 2
TILE = 64


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _windows(rng) -> np.ndarray:
    return rng.standard_normal((128 * TOKENS, 1024)).astype(np.float32)


def _tile_sums(window_rows: np.ndarray) -> np.ndarray:
    """[T * 8] float64 sums of kv + score over (token, 64-channel tile); window_rows [T, 128, 1024]."""
    kv, score = window_rows[..., :512].astype(np.float64), window_rows[..., 512:].astype(np.float64)
    both = (kv + score).reshape(TOKENS, 128, 512 // TILE, TILE)
    return both.sum(axis=(1, 3)).reshape(-1)


def _close(got: torch.Tensor, want: np.ndarray) -> None:
    np.testing.assert_allclose(got.cpu().numpy().astype(np.float64), want, rtol=0, atol=1e-2)  # a skipped row moves a sum by ~10


def _paged_windows(batch, state: np.ndarray) -> np.ndarray:
    """[T, 128, 1024]: each token's window rows, gathered on the host through the block table."""
    rows = []
    for t in range(TOKENS):
        start = int(batch.positions[t]) // 128 * 128
        req = int(batch.token_to_req_indices[t])
        rows.append([state[batch.block_table[req, p // 8], p % 8] for p in range(start, start + 128)])
    return np.asarray(rows)


def test_contiguous_floors_cover_every_window_byte():
    from dsv4_compressor.bench import floor_kernels as K

    rng = np.random.default_rng(1)
    host = _windows(rng)
    windows = torch.from_numpy(host).to(_device())
    out = torch.full((TOKENS * 8,), float("nan"), device=windows.device)
    K.tile_read[(TOKENS * 8,)](windows, out, TILE=TILE, num_warps=8)
    _close(out, _tile_sums(host.reshape(TOKENS, 128, 1024)))

    out = torch.full((TOKENS,), float("nan"), device=windows.device)
    K.token_read[(TOKENS,)](windows, out, CHUNK_ROWS=32, num_warps=16)
    _close(out, host.reshape(TOKENS, -1).astype(np.float64).sum(axis=1))

    block = 8192
    chunks = host.size // block
    out = torch.full((chunks,), float("nan"), device=windows.device)
    K.stream_read[(chunks,)](windows, out, BLOCK=block, num_warps=8)
    _close(out, host.reshape(chunks, block).astype(np.float64).sum(axis=1))


def test_paged_floor_follows_the_block_table():
    from dsv4_compressor.bench import floor_kernels as K
    from dsv4_compressor.bench.cases import c128_decode_sweep

    rng = np.random.default_rng(2)
    batch = c128_decode_sweep((TOKENS,))[0].batch(rng)
    state = rng.standard_normal((batch.num_state_blocks, 8, 1024)).astype(np.float32)
    device = _device()
    out = torch.full((TOKENS * 8,), float("nan"), device=device)
    block_table = torch.from_numpy(batch.block_table).to(device)
    K.paged_tile_read[(TOKENS * 8,)](torch.from_numpy(state).to(device),
                                     torch.from_numpy(batch.token_to_req_indices).to(device),
                                     torch.from_numpy(batch.positions).to(device), block_table, out,
                                     block_table.stride(0), BLOCK_SIZE=8, TILE=TILE, num_warps=8)
    _close(out, _tile_sums(_paged_windows(batch, state)))


@pytest.mark.gpu
def test_tma_floors_cover_every_window_byte():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from dsv4_compressor.bench import floor_kernels as K
    from dsv4_compressor.bench.cases import c128_decode_sweep

    rng = np.random.default_rng(3)
    host = _windows(rng)
    windows = torch.from_numpy(host).cuda()
    out = torch.full((TOKENS * 8,), float("nan"), device="cuda")
    desc = TensorDescriptor.from_tensor(windows.view(-1, 2, 512), block_shape=[128, 2, TILE])
    K.tile_read_tma[(TOKENS * 8,)](desc, out, TILE=TILE, num_warps=8)
    _close(out, _tile_sums(host.reshape(TOKENS, 128, 1024)))

    batch = c128_decode_sweep((TOKENS,))[0].batch(rng)
    state = rng.standard_normal((batch.num_state_blocks, 8, 1024)).astype(np.float32)
    block_table = torch.from_numpy(batch.block_table).cuda()
    desc = TensorDescriptor.from_tensor(torch.from_numpy(state).cuda().view(-1, 1024), block_shape=[8, TILE])
    K.paged_tile_read_tma[(TOKENS * 8,)](desc, torch.from_numpy(batch.token_to_req_indices).cuda(),
                                         torch.from_numpy(batch.positions).cuda(), block_table, out,
                                         block_table.stride(0), BLOCK_SIZE=8, TILE=TILE, STAGES=8, num_warps=4)
    _close(out, _tile_sums(_paged_windows(batch, state)))


@pytest.mark.parametrize("head", [128, 512])
def test_c4_floor_reads_each_rows_own_half(head):
    """One program per C4 token sums rows p-7..p-4's first halves and p-3..p's second halves
    (kv and score: ``head`` floats each) through the block table; a token at p = 3 skips rows
    before 0."""
    from dsv4_compressor.bench import floor_kernels as K
    from dsv4_compressor.bench.cases import c4_decode_sweep, indexer_decode_sweep

    rng = np.random.default_rng(3)
    case = (c4_decode_sweep if head == 512 else indexer_decode_sweep)((5,))[0]
    batch = case.batch(rng)
    positions, block_table_host = batch.positions.copy(), batch.block_table.copy()
    positions[0] = 3  # the first window: rows 0..3 before position 0
    block_table_host[batch.token_to_req_indices[0], 0] = batch.num_state_blocks - 1  # positions 0..3 mapped
    bs = case.block_size
    state = rng.standard_normal((batch.num_state_blocks, bs, 4 * head)).astype(np.float32)
    want = []
    for t in range(batch.num_tokens):
        p, req, total = int(positions[t]), int(batch.token_to_req_indices[t]), 0.0
        for i in range(8):
            pos = p // 4 * 4 - 4 + i
            if pos < 0:
                continue
            row = state[block_table_host[req, pos // bs], pos % bs].astype(np.float64)
            half = i // 4
            total += (row[half * head:(half + 1) * head].sum()
                      + row[2 * head + half * head:2 * head + (half + 1) * head].sum())
        want.append(total)
    device = _device()
    out = torch.full((batch.num_tokens,), float("nan"), device=device)
    state_t = torch.from_numpy(state).to(device)
    block_table = torch.from_numpy(block_table_host).to(device)
    K.paged_c4_read[(batch.num_tokens,)](
        state_t, torch.from_numpy(batch.token_to_req_indices).to(device), torch.from_numpy(positions).to(device),
        block_table, out, block_table.stride(0), state_t.stride(0), state_t.stride(1), BLOCK_SIZE=bs, HEAD=head,
        num_warps=1)
    _close(out, np.asarray(want))


COMPILE_STEP_FLOOR = """
import itertools, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dsv4_compressor.bench.floor_kernels import step_floor

failed = []
for input_bf16, state_bf16, latent, unroll in itertools.product((False, True), repeat=4):
    values = lambda bf16: "*i16" if bf16 else "*fp32"
    signature = {"inputs": (values(input_bf16), "i64", values(input_bf16), "i64"), "tokens": ("*i64", "*i64"),
                 "state": (values(state_bf16), "i64", "i64", "i32"), "runs": ("*i64", "i32"),
                 "outputs": ("*u8", "*i16", "i64"), "out_ptr": "*fp32", "num_tokens": "i32", "token_programs": "i32"}
    constants = dict(SW=1024, H=512, TOKENS=4, RUNS=4, INPUT_BF16=input_bf16, HAS_SCORE=True, STATE_BF16=state_bf16,
                     READS=1, ENTRY_BLOCK=1024, ENTRY_BYTES=584, LATENT=latent, UNROLL=unroll)
    signature.update(dict.fromkeys(constants, "constexpr"))
    try:
        triton.compile(ASTSource(step_floor, signature=signature, constexprs=constants), target=GPUTarget("cuda", 90, 32))
    except Exception as error:
        failed.append((input_bf16, state_bf16, latent, unroll, str(error).splitlines()[0]))
print(failed)
sys.exit(1 if failed else 0)
"""


def test_the_step_floor_compiles_for_every_dtype():
    """The step floor compiles for Hopper with fp32 and bf16 inputs and state, with and without a
    latent, its token loop unrolled or not (the interpreter does not type-check as the compiler does)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_STEP_FLOOR], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
