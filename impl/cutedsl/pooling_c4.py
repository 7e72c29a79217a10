"""C4 kernels: the 8-row overlapped window, pooled and (fused) normalized, rotated, stored.

Thread mapping: a token group is 128 threads (4 warps); thread ``t`` owns channels
``4t..4t+3`` of the 512-channel compressed vector and holds all 8 window rows of them in
registers: row ``i`` (position ``p-7+i``) reads ``kv[h*512 + 4t ..]`` and
``score[h*512 + 4t ..]`` of its state row, ``h = i // 4`` (rows 0..3 the first halves of
group ``c-1``, rows 4..7 the second halves of group ``c``), as two 128-bit loads. A CTA
holds ``tokens_per_cta`` groups, each synchronizing on its own named barrier, so a group
of an inactive token simply skips.

Block lookups: the window starts at ``4*(p//4) - 4`` (``= p - 7`` for a boundary token),
so each half is 4 consecutive positions starting at a multiple of 4; a run of
``gcd(bs, 4)`` of them lies in one state block and shares one ``block_table`` read.

Exactness (SPEC §5): per channel, two passes over the registers: ``M`` = exact max over
the valid rows, then ``e_i = exp2s(mul(sub(s_i, M), L))``, ``u_i = mul(kv_i, e_i)`` and
``x = div(tree(u), tree(e))`` with the 8-leaf trees in row order. At ``p = 3`` rows 0..3
(positions -4..-1) are invalid: they are not loaded, their score is ``-inf`` (so they
drop out of the max and ``exp2s(-inf) = +0``) and their kv ``+0``, so ``e = u = +0`` and
they still take part in the trees, as the spec says.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from .activity import token_activity
from .config import HEAD_DIM, C4Config
from .dependent_launch import wait_for_prerequisite_grids
from .exact_math import fdiv, fmul, softmax_weight, tree_max, tree_sum
from .memory import element_address, load_into, load_scalar, store_fragment
from .pooling_c128 import copy_row_async
from .postprocess import GroupFinish

RATIO = 4
WINDOW = 8
STATE_WIDTH = 2 * HEAD_DIM  # SW: kv[0:1024] then score[0:1024]


def window_weights(sc: list, c: int) -> list:
    """``e_i = exp2s(mul(sub(s_i, M), L))`` of channel ``c`` over the 8 register rows (SPEC §5)."""
    row_max = tree_max([sc[i][c] for i in range(WINDOW)])
    return [softmax_weight(sc[i][c], row_max) for i in range(WINDOW)]


def pooled(kv: list, e: list, c: int):
    """``x[c] = div(tree(u), tree(e))``, ``u_i = mul(kv_i, e_i)`` (SPEC §5), ``kv``: 8 register rows."""
    return pooled_channel([kv[i][c] for i in range(WINDOW)], e)


def pooled_channel(kv_c: list, e: list):
    """``div(tree(u), tree(e))`` of one channel, ``kv_c``: its 8 kv values in row order."""
    return fdiv(tree_sum([fmul(kv_c[i], e[i]) for i in range(WINDOW)]), tree_sum(e))


def staged_kv(sKv: cute.Tensor, group, t, row: int) -> cute.Tensor:
    """Thread ``t``'s 4 kv floats of window row ``row`` in its group's staging area
    (``sKv``: fp32 smem ``[groups, 8, 4 * threads]``, consecutive threads at consecutive 16 bytes)."""
    return cute.local_tile(sKv[group, row, None], (4,), (t,))


@cute.jit
def read_staged_kv(
    kv: list,  # 8 fp32 (4,) fragments, in: the invalid rows' fill
    sKv: cute.Tensor,  # fp32 smem [groups, 8, 4 * threads]
    group: Int32,
    t: Int32,
    window_start: Int64,  # p - 7
):
    """The thread's staged kv back into registers (after its ``cp.async.wait_group``: it reads
    only its own copies, so no barrier); rows 0..3 keep their fill at ``p = 3``."""
    for i in cutlass.range_constexpr(4, WINDOW):
        cute.autovec_copy(staged_kv(sKv, group, t, i), kv[i])
    if window_start >= Int64(0):
        for i in cutlass.range_constexpr(4):
            cute.autovec_copy(staged_kv(sKv, group, t, i), kv[i])


@cute.jit
def staged_channel(
    sKv: cute.Tensor,  # fp32 smem [groups, 8, 4 * threads]
    group: Int32,
    t: Int32,
    c: int,  # channel 4t + c
    window_start: Int64,  # p - 7
) -> list:
    """Channel ``4t + c`` of the thread's 8 staged kv rows (rows 0..3 are ``+0`` at ``p = 3``)."""
    valid_first_half = window_start >= Int64(0)
    values = []
    for i in cutlass.range_constexpr(WINDOW):
        value = sKv[group, i, t * 4 + c]
        if cutlass.const_expr(i < 4):
            value = cutlass.select_(valid_first_half, value, Float32(0.0))
        values.append(value)
    return values


class C4Window:
    """The pooling stage of the C4 kernels: one token's window -> 4 channels of ``x`` per
    thread of a 128-thread token group; with ``kv_in_smem`` the kv rows wait in shared
    memory (``cp.async``) instead of registers."""

    group_threads = 128
    vec = 4

    def __init__(self, config: C4Config):
        self.block_size = config.block_size
        self.rows_per_lookup = config.rows_per_lookup
        self.kv_in_smem = config.kv_in_smem
        self.groups = config.tokens_per_cta

    def allocate_smem(self, smem):
        """With ``kv_in_smem``, each group's kv rows, fp32 ``[groups, 8, 512]`` (16 KiB a group); else None."""
        if not self.kv_in_smem:
            return None
        width = self.vec * self.group_threads
        layout = cute.make_layout((self.groups, WINDOW, width), stride=(WINDOW * width, width, 1))
        return smem.allocate_tensor(Float32, layout, byte_alignment=16)

    @cute.jit
    def pool_window(
        self,
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 2048]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        req: Int32,  # block_table row of the token
        position: Int64,  # p, a boundary position (p % 4 == 3)
        t: Int32,  # thread index in the token group, 0..127
        x: cute.Tensor,  # fp32 (4,) out: channels 4t..4t+3
        sKv: cute.Tensor,  # fp32 smem [groups, 8, 512] (kv_in_smem) or None
        group: Int32,  # this thread's token group in the CTA
    ):
        bs, run = self.block_size, self.rows_per_lookup
        kv = [cute.make_rmem_tensor((self.vec,), Float32) for _ in range(WINDOW)]
        sc = [cute.make_rmem_tensor((self.vec,), Float32) for _ in range(WINDOW)]
        for i in cutlass.range_constexpr(WINDOW):
            kv[i].fill(0.0)  # +0: invalid rows contribute u = +0 ...
            sc[i].fill(-Float32.inf)  # ... and e = exp2s(-inf) = +0, and never win the max
        window_start = (position // RATIO) * RATIO - RATIO  # p - 7 for a boundary token
        row_stride_bytes = Int64(mState.stride[1]) * 4
        for half in cutlass.range_constexpr(2):
            kv_byte = (half * HEAD_DIM + t * self.vec) * 4
            score_byte = kv_byte + STATE_WIDTH * 4
            for r in cutlass.range_constexpr(RATIO // run):
                first_row = half * RATIO + r * run
                pos = window_start + first_row
                if pos >= Int64(0):  # false only for rows 0..3 at p = 3
                    column = pos // bs
                    block = load_scalar(mBlockTable, req, column)
                    row_address = element_address(mState, block, pos - column * bs, 0)
                    for i in cutlass.range_constexpr(run):  # scores first: the max can start earlier
                        load_into(sc[first_row + i], row_address + row_stride_bytes * i + score_byte, 16)
                    for i in cutlass.range_constexpr(run):
                        kv_address = row_address + row_stride_bytes * i + kv_byte
                        if cutlass.const_expr(self.kv_in_smem):
                            copy_row_async(kv_address, staged_kv(sKv, group, t, first_row + i))
                        else:
                            load_into(kv[first_row + i], kv_address, 16)
        if cutlass.const_expr(self.kv_in_smem):  # every exp before the wait for the kv copies
            cute.arch.cp_async_commit_group()
            e = [window_weights(sc, c) for c in range(self.vec)]
            cute.arch.cp_async_wait_group(0)  # the thread's own copies (it reads back only those)
            for c in cutlass.range_constexpr(self.vec):  # a channel's 8 kv at a time: 8 registers, not 32
                x[c] = pooled_channel(staged_channel(sKv, group, t, c, window_start), e[c])
        else:
            for c in cutlass.range_constexpr(self.vec):
                x[c] = pooled(kv, window_weights(sc, c), c)


def occupancy(config: C4Config) -> dict:
    """Launch arguments of ``config.ctas_per_sm`` (``.minnctapersm``: ptxas caps the registers;
    an explicit carveout, or the launch queries the device at compile time)."""
    if not config.ctas_per_sm:
        return {}
    return {"min_blocks_per_mp": config.ctas_per_sm, "preferred_smem_carveout": 100}


class C4PoolKernel:
    """C4 pooling only: writes the fp32 compressed vector of active tokens to ``mOut``."""

    def __init__(self, config: C4Config):
        self.config = config
        self.pdl = config.pdl
        self.tokens_per_cta = config.tokens_per_cta
        self.threads = C4Window.group_threads * self.tokens_per_cta
        self.window = C4Window(config)

    @cute.jit
    def __call__(
        self,
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 2048]
        mTokenReq: cute.Tensor,  # int32 [T]
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        mKvSlot: cute.Tensor,  # int64 [T]
        mOut: cute.Tensor,  # fp32 [S >= T, 512], rows 16-byte aligned
        stream: cuda.CUstream,
    ):
        num_tokens = mPos.shape[0]
        grid = (num_tokens + self.tokens_per_cta - 1) // self.tokens_per_cta
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot, mOut).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl,
            **occupancy(self.config)
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mKvSlot: cute.Tensor, mOut: cute.Tensor):
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        t = tidx % C4Window.group_threads
        group = tidx // C4Window.group_threads
        tok = cta * self.tokens_per_cta + group
        sKv = self.window.allocate_smem(SmemAllocator())
        if tok < mPos.shape[0]:
            position, _, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
            req = mTokenReq[tok]
            if active:
                x = cute.make_rmem_tensor((C4Window.vec,), Float32)
                self.window.pool_window(mState, mBlockTable, req, position, t, x, sKv, group)
                store_fragment(x, element_address(mOut, tok, t * C4Window.vec), 16)


class C4FusedKernel:
    """C4 in one launch: pool, RMSNorm, RoPE, quantize and store each active token's entry."""

    def __init__(self, config: C4Config):
        if config.entry is None:
            raise ValueError("C4FusedKernel: expected a C4Config with an entry format, got entry=None")
        self.config = config
        self.pdl = config.pdl
        self.tokens_per_cta = config.tokens_per_cta
        self.threads = C4Window.group_threads * self.tokens_per_cta
        self.window = C4Window(config)
        self.finishing = GroupFinish(config.entry, RATIO, config.tokens_per_cta)

    @cute.jit
    def __call__(
        self,
        mState: cute.Tensor,  # fp32 [num_blocks, bs, 2048]
        mTokenReq: cute.Tensor,  # int32 [T]
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        mWeight: cute.Tensor,  # fp32 or bf16 [512]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # flashmla_fp8: uint8 [P, B, 584]; bf16: bf16 [P, B, 512]; fp8: e4m3 [P, B, 512]
        mKvSlot: cute.Tensor,  # int64 [T]
        eps: Float32,  # rms_norm_eps as binary32
        fp8_inv: Float32,  # div(1, fp8_scale), fp8_per_tensor only
        stream: cuda.CUstream,
    ):
        num_tokens = mPos.shape[0]
        grid = (num_tokens + self.tokens_per_cta - 1) // self.tokens_per_cta
        self.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, fp8_inv).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl,
            **occupancy(self.config)
        )

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, fp8_inv: Float32):
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        smem = SmemAllocator()
        group, t, tok, sPartial = self.finishing.token_group(smem)
        sKv = self.window.allocate_smem(smem)
        if tok < mPos.shape[0]:
            position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
            req = mTokenReq[tok]
            if active:
                x = cute.make_rmem_tensor((C4Window.vec,), Float32)
                self.window.pool_window(mState, mBlockTable, req, position, t, x, sKv, group)
                self.finishing.finish(x, t, sPartial[group, None], group + 1, mWeight, mCosSin, mCache,
                                      position, kv_slot, eps, fp8_inv)
