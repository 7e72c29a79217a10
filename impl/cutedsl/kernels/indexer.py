"""The indexer compressor's ``compress_norm_rope_store`` kernels (SPEC §12, head width 128).

**C4** (:class:`IndexerC4Kernel`): one warp per token, ``warps`` tokens per CTA (4 by
default). Lane ``l`` owns channels ``4l..4l+3`` of all 8 window rows: row ``i`` (position
``p-7+i``, half ``h = i // 4``) holds them at ``kv[h*128 + 4l ..]`` and
``score[256 + h*128 + 4l ..]`` of its 512-float state row, 16 bytes each, so a warp reads each
half-row as two contiguous 512-byte runs. As in :mod:`.pooling_c4`, each half is 4 positions
from a multiple of 4, and runs of ``gcd(bs, 4)`` of them share one block-table read. The
token's request index is read with its metadata (a load the compilers keep ahead of the
activity test, one dependent round trip fewer); every block-table read is issued before any
state row, so the rows wait for one table round trip (the norm weights and the cos/sin row
too in the PTX, but ptxas sinks those loads to their use after the pooling). The scores come
into registers (8 ``ld.global.v4`` a lane); the kv rows go by ``cp.async`` into the warp's own
shared memory, requests ptxas cannot hold back to save registers as it does plain loads of
late-used values; each lane reads back only its own copies after ``cp.async.wait_group``, so
no barrier. At ``p = 3`` rows 0..3 are invalid (their lookup reads column 0, they are not
loaded; score ``-inf`` and kv ``+0``, so ``e = u = +0`` in the trees).
Per channel: the exact max, ``exp2s``, and the 8-leaf trees in row order (SPEC §5). The whole
token lives in one warp, so there is no barrier: a warp whose token is inactive (or past
``T``) does nothing.

**C128** (:class:`IndexerC128Kernel`): one CTA of ``warps`` warps per token. Warp ``w`` pools
window rows ``w*R .. w*R+R-1`` (``R = 128 / warps``) of lane ``l``'s 4 channels: row maxima
in registers, the window max through shared memory (exact, any order), then ``e``, ``u`` and
their ``R``-leaf trees per warp; threads 0..255 tree the per-warp partials of one channel of
``tree(u)`` or ``tree(e)`` each, in warp order (SPEC's 128-leaf tree: the warps hold
consecutive aligned row ranges), and warp 0 divides. Runs of ``gcd(bs, R)`` rows share a
lookup, all issued before the rows. The CTA's activity test is uniform, so its barriers are
reached by all threads or none.

SPEC §13 (``config.state`` not the default; :mod:`..stages.state_format`): the rows of a bf16
state are read 8 bytes a lane and widened exactly, a ring's row of position ``q`` is found at
``q mod C``, and with ``ape_at="compress"`` each valid row's score gets ``add(S, ape[q mod r])``
after its load (C4: ``ape`` row ``i mod 4`` of window row ``i``; C128: row ``i``, the window
starting at a multiple of 128). C4 then loads its kv rows into registers (no ``cp.async``).
Such a kernel takes ``ape`` (or ``None``) and ``ring_capacity`` after the stream. With
``rows_from_inputs`` (SPEC §13.4's step, :mod:`..stages.step_rows`) ``ape`` always, then ``kv`` and
``score`` (fp32 ``[T, SW]``) and ``query_start_loc`` (int32 ``[num_reqs + 1]``): each window row is the
chunk's at or after the chunk start, else the state's (a block-table read per row).

Both hold the finishing stage :class:`..stages.indexer_entry.WarpFinish` and call it in one warp
(norm, RoPE, the optional Hadamard rotation, FP8 or MXFP4 quantization, the store).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

try:  # 4.8+
    from cutlass.memory import SmemAllocator
except ImportError:  # pragma: no cover - 4.0..4.7
    from cutlass.utils import SmemAllocator

from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.activity import token_activity
from ..stages.exact_math import fdiv, fmul, softmax_weight, tree_max, tree_sum
from ..config import INDEXER_HEAD_DIM, IndexerConfig
from ..stages.indexer_entry import VEC, WarpFinish
from ..stages.memory import element_address, load_into, row_address, window_row_addresses
from ..stages.pooling_c4 import WINDOW, empty_window, pool_into, pooled, window_weights
from ..stages.pooling_c128 import copy_row_async, load_smem, store_smem
from ..stages.state_format import add_ape, load_state_into, ring_position
from ..stages.step_rows import StepRows, chunk_of
from ..stages.token_window import TokenWindow


def shared_stages(config: IndexerConfig) -> tuple[WarpFinish, StepRows]:
    """The stages both indexer kernels compose: the warp's finishing (SPEC §6-§7, §12) and SPEC
    §13.4's row source (``rows_from_inputs``)."""
    return WarpFinish(config), StepRows(config.state, config.block_size, config.state_width)


class IndexerC4Kernel:
    """Grid ``ceil(T / warps)``, one warp per token."""

    def __init__(self, config: IndexerConfig):
        self.config = config
        self.finishing, self.step_rows = shared_stages(config)

    def num_ctas(self, num_tokens):
        return (num_tokens + self.config.warps - 1) // self.config.warps

    def allocate_smem(self, smem):
        """Per warp, the kv of the 8 window rows: ``[warps, 8, 128]`` fp32 (4 KiB a warp)."""
        layout = cute.make_layout((self.config.warps, 8, INDEXER_HEAD_DIM),
                                  stride=(8 * INDEXER_HEAD_DIM, INDEXER_HEAD_DIM, 1))
        return smem.allocate_tensor(Float32, layout, byte_alignment=16)

    @cute.jit
    def pool_window(
        self,
        window: TokenWindow,  # state [num_blocks, bs, 512]; ape fp32 [4, 256] with ape_at="compress"
        lane: Int32,  # 0..31
        sKv: cute.Tensor,  # fp32 smem [warps, 8, 128]: the staged kv rows
        warp: Int32,  # 0..warps-1
        x: cute.Tensor,  # fp32 (4,) out: channels 4*lane..4*lane+3
    ):
        mState, mBlockTable, req, position, mApe, ring_capacity, chunk = window
        if cutlass.const_expr(self.config.state.rows_from_inputs):
            self.pool_step_window(mState, mBlockTable, req, position, lane, x, mApe, ring_capacity, chunk)
        elif cutlass.const_expr(not self.config.state.is_default):
            self.pool_formatted_window(mState, mBlockTable, req, position, lane, x, mApe, ring_capacity)
        else:
            self.pool_default_window(mState, mBlockTable, req, position, lane, sKv, warp, x)

    @cute.jit
    def pool_default_window(self, mState: cute.Tensor, mBlockTable: cute.Tensor, req: Int32, position: Int64,
                            lane: Int32, sKv: cute.Tensor, warp: Int32, x: cute.Tensor):
        """SPEC §3's state (fp32, paged, ``ape`` in the scores): kv staged by ``cp.async``."""
        run = self.config.rows_per_lookup
        kv, sc = empty_window()
        window_start = (position // 4) * 4 - 4  # p - 7 for a boundary token
        row_stride_bytes = Int64(mState.stride[1]) * 4
        runs = self.window_runs(mState, mBlockTable, req, window_start)
        for kind in cutlass.range_constexpr(2):  # scores first (the max can start earlier), then the kv copies
            for first_row, pos, start in runs:
                score_offset = self.config.state_width * 4 if kind == 0 else 0
                byte = (lane * VEC + (first_row // 4) * INDEXER_HEAD_DIM) * 4 + score_offset
                if cutlass.const_expr(first_row >= 4):
                    for i in cutlass.range_constexpr(run):
                        issue_row(kind, sc[first_row + i], start + row_stride_bytes * i + byte, sKv, warp, lane,
                                  first_row + i)
                else:
                    if pos >= Int64(0):  # false only for rows 0..3 at p = 3
                        for i in cutlass.range_constexpr(run):
                            issue_row(kind, sc[first_row + i], start + row_stride_bytes * i + byte, sKv, warp,
                                      lane, first_row + i)
        cute.arch.cp_async_commit_group()
        e = [window_weights(sc, c) for c in range(VEC)]
        cute.arch.cp_async_wait_group(0)  # the lane's own copies (it reads back only those)
        read_staged_kv(kv, sKv, warp, lane, window_start)
        for c in cutlass.range_constexpr(VEC):
            x[c] = pooled(kv, e[c], c)

    def window_runs(self, mState: cute.Tensor, mBlockTable: cute.Tensor, req: Int32, window_start: Int64,
                    ring_capacity=None) -> list:
        """Every block-table read of the window first (one round trip, not one per half):
        ``(first window row, position, row address)`` per lookup run of ``gcd(bs, 4)`` rows (a ring's
        at ``q mod C``). The first half's positions are clamped to 0 at ``p = 3``, whose rows 0..3
        (positions -4..-1) are then not loaded."""
        bs, run = self.config.block_size, self.config.rows_per_lookup
        runs = []
        for half in range(2):
            for r in range(4 // run):
                first_row = half * 4 + r * run
                pos = window_start + first_row
                looked_up = Int64(cutlass.select_(pos >= Int64(0), pos, Int64(0))) if half == 0 else pos
                ring_row = ring_position(looked_up, self.config.state, ring_capacity)
                runs.append((first_row, pos, row_address(mState, mBlockTable, req, ring_row, bs)))
        return runs

    @cute.jit
    def pool_step_window(self, mState: cute.Tensor, mBlockTable: cute.Tensor, req: Int32, position: Int64,
                         lane: Int32, x: cute.Tensor, mApe: cute.Tensor, ring_capacity, chunk):
        """SPEC §13.4 step 1: each valid row (``q >= 0``) from the chunk or the state
        (:class:`..stages.step_rows.StepRows`; ``mState`` fp32 or bf16 ``[num_blocks, bs, 512]``,
        ``ape`` fp32 ``[4, 256]``), then SPEC §5's pooling."""
        kv, sc = empty_window()
        window_start = (position // 4) * 4 - 4  # p - 7 for a boundary token
        for i in cutlass.range_constexpr(8):
            pos = window_start + i
            if pos >= Int64(0):  # false only for rows 0..3 at p = 3
                channel = lane * VEC + (i // 4) * INDEXER_HEAD_DIM
                self.step_rows.load_row(kv[i], sc[i], mState, mBlockTable, req, pos, channel, i % 4, mApe,
                                        ring_capacity, chunk)
        pool_into(x, kv, sc)

    @cute.jit
    def pool_formatted_window(self, mState: cute.Tensor, mBlockTable: cute.Tensor, req: Int32, position: Int64,
                              lane: Int32, x: cute.Tensor, mApe: cute.Tensor, ring_capacity):
        """A SPEC §13 state (``mState``: fp32 or bf16 ``[num_blocks, bs, 512]``): every block-table
        read first, then the scores (``ape`` added at the compress when asked), then the kv rows,
        all into registers."""
        state = self.config.state
        run = self.config.rows_per_lookup
        width = state.element_bytes
        kv, sc = empty_window()
        window_start = (position // 4) * 4 - 4  # p - 7 for a boundary token
        row_stride_bytes = Int64(mState.stride[1]) * width
        runs = self.window_runs(mState, mBlockTable, req, window_start, ring_capacity)
        for kind in cutlass.range_constexpr(2):  # scores first (the max can start earlier), then kv
            for first_row, pos, start in runs:
                channel = lane * VEC + (first_row // 4) * INDEXER_HEAD_DIM
                byte = (channel + (self.config.state_width if kind == 0 else 0)) * width
                if pos >= Int64(0):  # false only for rows 0..3 at p = 3
                    for i in cutlass.range_constexpr(run):
                        row = first_row + i
                        if cutlass.const_expr(kind == 0):
                            load_state_into(sc[row], start + row_stride_bytes * i + byte, state)
                            add_ape(sc[row], mApe, row % 4, channel, state)
                        else:
                            load_state_into(kv[row], start + row_stride_bytes * i + byte, state)
        pool_into(x, kv, sc)

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, mApe: cute.Tensor, ring_capacity, mKv: cute.Tensor,
               mScore: cute.Tensor, mQsl: cute.Tensor):
        wait_for_prerequisite_grids(self.config.pdl)  # first: before any global access
        cta, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        sKv = self.allocate_smem(SmemAllocator())
        tok = cta * self.config.warps + warp
        if tok < mPos.shape[0]:
            req = load_int32_unsunk(element_address(mTokenReq, tok))  # with the metadata, never sunk past the test
            position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, 4)
            if active:
                w, cos, sin = self.finishing.inputs(mWeight, mCosSin, lane, position)
                x = cute.make_rmem_tensor((VEC,), Float32)
                chunk = chunk_of(mKv, mScore, mQsl, req, tok, position, self.config.state)
                window = TokenWindow(mState, mBlockTable, req, position, mApe, ring_capacity, chunk)
                self.pool_window(window, lane, sKv, warp, x)
                self.finishing.finish(x, lane, w, cos, sin, mCache, kv_slot, eps)


class IndexerC128Kernel:
    """Grid ``T``, one CTA of ``warps`` warps per token."""

    def __init__(self, config: IndexerConfig):
        self.config = config
        self.finishing, self.step_rows = shared_stages(config)

    def num_ctas(self, num_tokens):
        return num_tokens

    def allocate_smem(self, smem):
        """``(partials, sums)``: the per-warp partials, three ``[warps, 128]`` fp32 (the row maxima,
        tree(u), tree(e)), and the window sums ``[2, 128]`` (tree(u), tree(e))."""
        layout = cute.make_layout((self.config.warps, INDEXER_HEAD_DIM), stride=(INDEXER_HEAD_DIM, 1))
        partials = [smem.allocate_tensor(Float32, layout, byte_alignment=16) for _ in range(3)]
        sums = smem.allocate_tensor(Float32, cute.make_layout((2, INDEXER_HEAD_DIM), stride=(INDEXER_HEAD_DIM, 1)),
                                    byte_alignment=16)
        return tuple(partials), sums

    @cute.jit
    def pool_rows(
        self,
        window: TokenWindow,  # state [num_blocks, bs, 256]; ape fp32 [128, 128] with ape_at="compress"
        lane: Int32,  # 0..31
        warp: Int32,  # 0..warps-1
        partials: tuple,  # (sMax, sNum, sDen): fp32 smem [warps, 128] each, the warps' max, tree(u), tree(e)
        sSum: cute.Tensor,  # fp32 smem [2, 128]
        x: cute.Tensor,  # fp32 (4,) out, valid in warp 0: channels 4*lane..4*lane+3
    ):
        mState, mBlockTable, req, position, mApe, ring_capacity, chunk = window
        sMax, sNum, sDen = partials
        R, run, bs = self.config.rows_per_warp, self.config.rows_per_lookup, self.config.block_size
        state = self.config.state
        width = state.element_bytes
        window_start = (position // 128) * 128  # p - 127 for a boundary token
        first_row = warp * R
        kv_byte = lane * (VEC * width)
        score_byte = kv_byte + self.config.state_width * width
        row_stride_bytes = Int64(mState.stride[1]) * width
        if cutlass.const_expr(state.rows_from_inputs):  # SPEC §13.4 step 1: the chunk's rows or the state's
            sc = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(R)]
            kv = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(R)]
            for i in cutlass.range_constexpr(R):
                self.step_rows.load_row(kv[i], sc[i], mState, mBlockTable, req, window_start + first_row + i,
                                        lane * VEC, first_row + i, mApe, ring_capacity, chunk)
        else:
            rows = window_row_addresses(mState, mBlockTable, req, window_start + first_row, row_stride_bytes, R, run,
                                        bs, ring_capacity if state.ring else None)
            sc = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(R)]
            kv = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(R)]
            for i in cutlass.range_constexpr(R):  # scores first: the max can start earlier
                load_state_into(sc[i], rows[i] + score_byte, state)
                add_ape(sc[i], mApe, first_row + i, lane * VEC, state)
            for i in cutlass.range_constexpr(R):
                load_state_into(kv[i], rows[i] + kv_byte, state)

        # the window max per channel (exact, any order)
        lane_max = cute.make_rmem_tensor((VEC,), Float32)
        for c in cutlass.range_constexpr(VEC):
            lane_max[c] = tree_max([sc[i][c] for i in range(R)])
        store_smem(sMax, warp, lane * VEC, lane_max)
        cute.arch.sync_threads()
        row_max = load_smem(sMax, 0, lane * VEC, VEC)
        for w in cutlass.range(1, self.config.warps):  # a loop, not unrolled: 4 registers in flight, not 4 * warps
            other = load_smem(sMax, w, lane * VEC, VEC)
            for c in cutlass.range_constexpr(VEC):
                row_max[c] = cute.arch.fmax(row_max[c], other[c])

        # e, u and this warp's R-leaf trees (consecutive rows), then the tree over the warps
        den = cute.make_rmem_tensor((VEC,), Float32)
        num = cute.make_rmem_tensor((VEC,), Float32)
        for c in cutlass.range_constexpr(VEC):
            for i in cutlass.range_constexpr(R):  # e in place of the scores
                sc[i][c] = softmax_weight(sc[i][c], row_max[c])
            den[c] = tree_sum([sc[i][c] for i in range(R)])
            num[c] = tree_sum([fmul(kv[i][c], sc[i][c]) for i in range(R)])
        store_smem(sNum, warp, lane * VEC, num)
        store_smem(sDen, warp, lane * VEC, den)
        cute.arch.sync_threads()
        # the trees over the warps: thread t < 128 sums channel t of tree(u), 128 <= t < 256
        # channel t - 128 of tree(e) (one leaf per warp in a register, not 4 * 2 * warps)
        tidx = warp * 32 + lane
        if tidx < INDEXER_HEAD_DIM:
            sSum[0, tidx] = tree_sum([sNum[w, tidx] for w in range(self.config.warps)])
        elif tidx < 2 * INDEXER_HEAD_DIM:
            sSum[1, tidx - INDEXER_HEAD_DIM] = tree_sum([sDen[w, tidx - INDEXER_HEAD_DIM]
                                                         for w in range(self.config.warps)])
        cute.arch.sync_threads()
        if warp == 0:
            num = load_smem(sSum, 0, lane * VEC, VEC)
            den = load_smem(sSum, 1, lane * VEC, VEC)
            for c in cutlass.range_constexpr(VEC):
                x[c] = fdiv(num[c], den[c])

    @cute.kernel
    def kernel(self, mState: cute.Tensor, mTokenReq: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mBlockTable: cute.Tensor, mWeight: cute.Tensor, mCosSin: cute.Tensor, mCache: cute.Tensor,
               mKvSlot: cute.Tensor, eps: Float32, mApe: cute.Tensor, ring_capacity, mKv: cute.Tensor,
               mScore: cute.Tensor, mQsl: cute.Tensor):
        wait_for_prerequisite_grids(self.config.pdl)  # first: before any global access
        tok, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        partials, sSum = self.allocate_smem(SmemAllocator())
        position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, 128)
        req = mTokenReq[tok]
        if active:
            w, cos, sin = self.finishing.inputs(mWeight, mCosSin, lane, position)  # every warp: no branch around it
            x = cute.make_rmem_tensor((VEC,), Float32)
            chunk = chunk_of(mKv, mScore, mQsl, req, tok, position, self.config.state)
            window = TokenWindow(mState, mBlockTable, req, position, mApe, ring_capacity, chunk)
            self.pool_rows(window, lane, warp, partials, sSum, x)
            if warp == 0:
                self.finishing.finish(x, lane, w, cos, sin, mCache, kv_slot, eps)


def staged_kv(sKv: cute.Tensor, warp, lane, row: int) -> cute.Tensor:
    """The lane's 4 kv floats of window row ``row`` in its warp's staging area
    (``sKv``: fp32 smem ``[warps, 8, 128]``, consecutive lanes at consecutive 16 bytes)."""
    return cute.local_tile(sKv[warp, row, None], (VEC,), (lane,))


@cute.jit
def read_staged_kv(
    kv: list,  # 8 fp32 (4,) fragments, in: the invalid rows' fill
    sKv: cute.Tensor,  # fp32 smem [warps, 8, 128]
    warp: Int32,
    lane: Int32,
    window_start: Int64,  # p - 7
):
    """The lane's staged kv back into registers (after its ``cp.async.wait_group``: it reads
    only its own copies, so no barrier); rows 0..3 keep their fill at ``p = 3``."""
    for i in cutlass.range_constexpr(4, WINDOW):
        cute.autovec_copy(staged_kv(sKv, warp, lane, i), kv[i])
    if window_start >= Int64(0):
        for i in cutlass.range_constexpr(4):
            cute.autovec_copy(staged_kv(sKv, warp, lane, i), kv[i])


@cute.jit
def issue_row(
    kind: int,  # 0 scores, 1 kv
    frag: cute.Tensor,  # fp32 (4,): the score row's registers
    byte_address: Int64,  # the lane's 16 bytes of the row in global memory
    sKv: cute.Tensor,  # fp32 smem [warps, 8, 128]
    warp: Int32,
    lane: Int32,
    row: int,  # window row 0..7
):
    """One row's 16 bytes: scores by a 128-bit load into ``frag``, kv by ``cp.async`` into ``sKv``."""
    if cutlass.const_expr(kind == 1):
        copy_row_async(byte_address, staged_kv(sKv, warp, lane, row))
    else:
        load_into(frag, byte_address, 16)


@dsl_user_op
def load_int32_unsunk(byte_address, *, loc=None, ip=None) -> Int32:
    """A 4-byte global load the compilers keep where it is written (a side-effecting
    ``ld.relaxed.gpu.global.b32``: LLVM and ptxas sink a plain load into the branch that
    uses it), so that it is in flight with the loads beside it. The value was written before
    this grid's dependencies resolved, so relaxed ordering reads it as a plain load would."""
    value = llvm.inline_asm(Int32.mlir_type, [Int64(byte_address).ir_value(loc=loc, ip=ip)],
                            "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", has_side_effects=True, is_align_stack=False,
                            asm_dialect=llvm.AsmDialect.AD_ATT)
    return Int32(value)


class IndexerLauncher:
    """The host entry of either indexer kernel: one launch of ``body.num_ctas(T)`` CTAs of
    ``32 * warps`` threads on the given stream, with programmatic dependent launch when
    configured (the kernels differ only in their grid)."""

    def __init__(self, body: IndexerC4Kernel | IndexerC128Kernel):
        self.body = body

    @cute.jit
    def __call__(
        self,
        mState: cute.Tensor,  # fp32 or bf16 (config.state) [num_blocks, bs, 2*SW] (C4: 512 a row, C128: 256)
        mTokenReq: cute.Tensor,  # int32 [T]
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        mWeight: cute.Tensor,  # fp32 or bf16 [128]
        mCosSin: cute.Tensor,  # fp32 [max_pos, 64]
        mCache: cute.Tensor,  # uint8 [num_pages, B, E] (E = 132 indexer_fp8, 68 indexer_mxfp4)
        mKvSlot: cute.Tensor,  # int64 [T]
        eps: Float32,  # rms_norm_eps as binary32
        stream: cuda.CUstream,
        mApe: cute.Tensor = None,  # SPEC §13.2: fp32 [r, SW] (ape_at="compress"), else None
        ring_capacity=None,  # Int32 C (SPEC §13.3), a non-default state format only
        mKv: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, SW], else None
        mScore: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): fp32 [T, SW], else None
        mQsl: cute.Tensor = None,  # SPEC §13.4 (rows_from_inputs): int32 [num_reqs + 1], else None
    ):
        body = self.body
        body.kernel(mState, mTokenReq, mPos, mSlot, mBlockTable, mWeight, mCosSin, mCache, mKvSlot, eps, mApe,
                    ring_capacity, mKv, mScore, mQsl).launch(
            grid=(body.num_ctas(mPos.shape[0]), 1, 1), block=(32 * body.config.warps, 1, 1), stream=stream,
            use_pdl=body.config.pdl
        )


def indexer_kernel(config: IndexerConfig) -> IndexerLauncher:
    """The launcher of a configuration's kernel (C4 or C128)."""
    return IndexerLauncher(IndexerC4Kernel(config) if config.ratio == 4 else IndexerC128Kernel(config))
