"""C128 pooling: one CTA pools one channel tile of one token's 128-row window.

:class:`C128TilePooling` is the stage every C128 kernel pools with: the split path's
compress kernel (:class:`SplitPoolKernel`; Block8 and generic share the code, they differ
only in how many rows one block-table lookup serves) and the first half of the fused
kernels (:mod:`..kernels.fused_cluster`, :mod:`..kernels.fused_handoff`).

Thread mapping (``warps`` warps; ``tile`` channels; defaults 8 and 64): a warp's lanes form
``32 / (tile/4)`` row groups of ``tile/4`` lanes; lane ``(g, l)`` of warp ``w`` owns
channels ``tile0 + 4l .. +3`` of the window rows ``((w * groups + g) * R) .. + R - 1`` with
``R = 128 / (warps * groups)`` rows per lane (default: lanes 0-15 rows ``16w..16w+7``,
lanes 16-31 rows ``16w+8..16w+15``), two 128-bit loads (kv, score) per row, all in
registers.

Block lookups: the window of a boundary token ``p = 128c + 127`` is positions
``128c .. 128c + 127``; a lane's ``R`` rows start at a multiple of ``R``. When ``bs`` is a
multiple of ``R`` they are ``R`` consecutive rows of one state block: one ``block_table``
read per lane (**Block8**: for ``bs = 8`` each half-warp reads exactly one block, a warp
two consecutive blocks, 8 warps the 16 blocks of the window; no per-row lookup, and C128
never has invalid rows, so no masking). Otherwise runs of ``rows_per_lookup`` rows
(``gcd(bs, R)``, or 1) each take one lookup (**generic**, any ``bs``).

Exactness (SPEC §5), two passes:

1. max: per lane over its rows, xor-butterfly over the row groups, per-warp maxima in
   shared memory, then every lane takes the max over the warps (max is exact, any order);
2. ``e = exp2s(mul(sub(s, M), L))``, ``u = mul(kv, e)``; sums as SPEC's 128-leaf tree:
   per-lane tree over its ``R`` consecutive rows, xor-butterfly over the row groups
   (offsets ``tile/4 .. 16``: row groups are consecutive and aligned), per-warp partials
   in shared memory, tree over the warps in warp order;
3. warp 0 finishes: lane ``l`` takes channels ``tile0 + (tile/32) l ..``, trees the warp
   partials and divides ``x = div(tree(u), tree(e))`` (``tree(e) >= 1``: the max row
   contributes ``exp2s(0) = 1``).

Overlap: each lane issues its score loads first, then its kv loads; pass 1 and the
``exp2s`` of pass 2 (the bulk of the arithmetic) need only the scores, so they run while
the kv loads are in flight. With ``kv_in_smem`` the kv rows go to shared memory through
``cp.async`` (each thread reads back only its own rows after ``cp.async.wait_group``, so no
barrier is needed): 64 instead of 80 registers per thread. With ``kv_after_max`` the kv
loads are issued only once pass 1 has the window max: when a wave of CTAs starts together,
HBM then serves every CTA's scores (which gate the exps) before any kv row, and the exps
overlap the kv transfer instead of waiting behind it.

SPEC §13 (``pool.state`` not the default, the split compress kernel only; :mod:`.state_format`):
a bf16 state's rows are read 8 bytes a lane and widened exactly (kv in registers); a ring's run
of rows is looked up at its first position ``mod C``; with ``ape_at="compress"`` each score gets
``add(S, ape[q mod 128])``, the window starting at a multiple of 128, so the lane's row ``i`` takes
``ape`` row ``first_row + i``. With ``rows_from_inputs`` (SPEC §13.4's step, :mod:`.step_rows`)
a lane whose rows all precede the chunk start reads them from the state as above (one block-table
read per lookup run; a decode step's window is such rows but for its last); another lane reads
each row from the chunk's ``kv``/``score`` when its position is at or after the chunk start, else
from the state (a block-table read per row); kv and score go together into registers (no
``kv_in_smem``, no ``kv_after_max``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync

from ..config import HEAD_DIM, C128PoolConfig
from .dependent_launch import wait_for_prerequisite_grids
from .exact_math import butterfly_max, butterfly_sum, fdiv, fmul, softmax_weight, tree_max, tree_sum
from .memory import gmem_tensor, load_into, window_row_addresses
from .postprocess import rope_row
from .state_format import add_ape, load_state_into
from .step_rows import StepRows
from .token_window import TokenWindow

RATIO = 128
STATE_WIDTH = HEAD_DIM  # SW: kv[0:512] then score[0:512]


class C128TilePooling:
    """The pooling stage of the C128 kernels: one CTA, one channel tile of one token's window
    (see the module docstring); the kernels hold one and call it."""

    vec = 4

    def __init__(self, pool: C128PoolConfig):
        self.pool = pool
        self.block_size = pool.block_size
        self.warps = pool.warps
        self.threads = 32 * pool.warps
        self.tile = pool.tile
        self.num_tiles = HEAD_DIM // pool.tile
        self.lanes_per_group = pool.lanes_per_row_group
        self.groups_per_warp = pool.row_groups_per_warp
        self.rows_per_lane = pool.rows_per_lane
        self.rows_per_lookup = pool.rows_per_lookup
        self.final_channels = pool.tile // 32  # channels per lane of warp 0 in step 3
        self.kv_in_smem = pool.kv_in_smem
        self.state = pool.state
        self.step_rows = StepRows(pool.state, pool.block_size, STATE_WIDTH)

    def wait_at_start(self) -> None:
        """A C128 kernel's first statement: PDL's wait for the grids it depends on
        (:mod:`.dependent_launch`), unless ``early_metadata`` puts it after the metadata and
        block-table reads (in :meth:`pool_tile`, or the pipelined walk's first rows)."""
        wait_for_prerequisite_grids(self.pool.pdl and not self.pool.early_metadata)

    def allocate_smem(self, smem):
        """Per-warp partials ``[warps, tile]`` fp32 for max, tree(u), tree(e); with
        ``kv_in_smem`` also each thread's kv rows, ``[rows, threads, 4]`` (consecutive threads
        at consecutive 16 bytes: no bank conflicts)."""
        layout = cute.make_layout((self.warps, self.tile), stride=(self.tile, 1))
        partials = [smem.allocate_tensor(Float32, layout, byte_alignment=16) for _ in range(3)]
        kv = None
        if self.kv_in_smem:
            R, n = self.rows_per_lane, self.threads
            kv = smem.allocate_tensor(Float32, cute.make_layout((R, n, self.vec), stride=(n * self.vec, self.vec, 1)),
                                      byte_alignment=16)
        return (*partials, kv)

    @cute.jit
    def pool_tile(
        self,
        window: TokenWindow,  # state [num_blocks, bs, 1024]; ape fp32 [128, 512] with ape_at="compress"
        tile: Int32,  # channel tile index
        partials: tuple,  # (sMax, sNum, sDen): fp32 smem [warps, tile] each, the warps' max, tree(u), tree(e)
        sKv: cute.Tensor,  # fp32 smem [rows_per_lane, threads, 4] (kv_in_smem) or None
        x: cute.Tensor,  # fp32 (tile/32,) out, valid in warp 0: channels tile0 + (tile/32)*lane ..
    ):
        """SPEC §5 for one channel tile of the token's window: the state's rows, or with
        ``rows_from_inputs`` (SPEC §13.4 step 1) a lane's rows from the state alone where all of
        them precede the chunk (:meth:`load_state_rows`), else the chunk's or the state's row by row
        (:class:`.step_rows.StepRows`: ``ape`` row ``first_row + i``), kv and score together into
        registers; then :meth:`reduce_rows`."""
        mState, mBlockTable, req, position, mApe, ring_capacity, chunk = window
        sMax, sNum, sDen = partials
        if cutlass.const_expr(self.state.rows_from_inputs):
            if cutlass.const_expr(self.pool.early_metadata):
                wait_for_prerequisite_grids(True)
            lane = cute.arch.lane_idx()
            window_start, first_row = self.lane_window(position, lane)
            channel = self.lane_channel(tile, lane)
            sc = self.row_fragments()
            kv = self.row_fragments()
            first_position = window_start + first_row
            if chunk[3] >= Int64(first_position) + self.rows_per_lane:  # every row of the lane is in the state
                self.load_state_rows(window, first_position, (first_row, channel), self.channel_bytes(tile, lane),
                                     (sc, kv))
            else:
                for i in cutlass.range_constexpr(self.rows_per_lane):
                    self.step_rows.load_row(kv[i], sc[i], mState, mBlockTable, req, first_position + i, channel,
                                            first_row + i, mApe, ring_capacity, chunk)

            def kv_rows():
                return kv

            self.reduce_rows(sc, kv_rows, sMax, sNum, sDen, x)
        else:
            # this lane's R window rows: their byte addresses, and its kv and score channels' offsets in a row
            lane = cute.arch.lane_idx()
            window_start, first_row = self.lane_window(position, lane)
            kv_byte, score_byte = self.channel_bytes(tile, lane)
            row_stride_bytes = Int64(mState.stride[1]) * self.state.element_bytes
            rows = window_row_addresses(mState, mBlockTable, req, window_start + first_row, row_stride_bytes,
                                        self.rows_per_lane, self.rows_per_lookup, self.block_size,
                                        ring_capacity if self.state.ring else None)
            if cutlass.const_expr(self.pool.early_metadata):  # metadata and block table read: now the state
                wait_for_prerequisite_grids(True)
            # scores are loaded first so that pass 1 and the exps of pass 2 can run while the kv
            # loads are still in flight (only u = kv * e waits for them)
            sc = self.row_fragments()
            if cutlass.const_expr(self.state.is_default):
                for i in cutlass.range_constexpr(self.rows_per_lane):
                    load_into(sc[i], rows[i] + score_byte, 16)
            else:
                channel = self.lane_channel(tile, lane)
                for i in cutlass.range_constexpr(self.rows_per_lane):
                    load_state_into(sc[i], rows[i] + score_byte, self.state)
                    add_ape(sc[i], mApe, first_row + i, channel, self.state)
            kv = self.row_fragments()

            def issue_kv():
                if cutlass.const_expr(self.kv_in_smem):  # cp.async: kv waits in shared memory, not registers
                    tidx, _, _ = cute.arch.thread_idx()
                    for i in cutlass.range_constexpr(self.rows_per_lane):
                        copy_row_async(rows[i] + kv_byte, sKv[i, tidx, None])
                    cute.arch.cp_async_commit_group()
                else:
                    for i in cutlass.range_constexpr(self.rows_per_lane):
                        load_state_into(kv[i], rows[i] + kv_byte, self.state)

            def staged_kv_rows():
                if cutlass.const_expr(self.kv_in_smem):
                    cute.arch.cp_async_wait_group(0)  # this thread's own copies: no barrier needed
                    tidx, _, _ = cute.arch.thread_idx()
                    read_staged_rows(sKv, tidx, kv)
                return kv

            if cutlass.const_expr(self.pool.kv_after_max):
                self.reduce_rows(sc, staged_kv_rows, sMax, sNum, sDen, x, after_max=issue_kv)
            else:
                issue_kv()
                self.reduce_rows(sc, staged_kv_rows, sMax, sNum, sDen, x)

    def load_state_rows(self, window: TokenWindow, first_position, lane_columns: tuple, row_bytes: tuple,
                        rows: tuple) -> None:
        """A step's lane whose rows all precede the chunk: its ``R`` state rows from ``first_position``
        as the default compress reads them (one block-table read per lookup run, every load issued
        before any is used), into ``rows = (sc, kv)`` (fp32 ``(4,)`` fragments); ``ape`` added with
        ``ape_at="compress"``. ``lane_columns``: ``(first_row, channel)``, the lane's ``ape`` row and
        first channel; ``row_bytes``: :meth:`channel_bytes`."""
        mState, mBlockTable, req, _, mApe, ring_capacity, _ = window
        first_row, channel = lane_columns
        kv_byte, score_byte = row_bytes
        sc, kv = rows
        row_stride_bytes = Int64(mState.stride[1]) * self.state.element_bytes
        addresses = window_row_addresses(mState, mBlockTable, req, first_position, row_stride_bytes,
                                         self.rows_per_lane, self.rows_per_lookup, self.block_size,
                                         ring_capacity if self.state.ring else None)
        for i in range(self.rows_per_lane):  # unrolled at trace time
            load_state_into(sc[i], addresses[i] + score_byte, self.state)
            load_state_into(kv[i], addresses[i] + kv_byte, self.state)
        for i in range(self.rows_per_lane):  # unrolled at trace time
            add_ape(sc[i], mApe, first_row + i, channel, self.state)

    def row_fragments(self) -> list:
        """One fp32 ``(4,)`` register fragment per row of this lane (its 4 channels of each)."""
        return [cute.make_rmem_tensor((self.vec,), Float32) for _ in range(self.rows_per_lane)]

    def lane_window(self, position, lane) -> tuple:
        """``(window_start, first_row)``: the first position of the window of ``position``, and lane
        ``lane``'s first row in it (its ``R`` rows follow; ``R``-row groups of lanes, warp by warp)."""
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        group = lane // self.lanes_per_group
        first_row = (warp * self.groups_per_warp + group) * self.rows_per_lane
        return rope_row(position, RATIO), first_row  # the group's first position, p - 127 for a boundary token

    def lane_channel(self, tile, lane):
        """The first of lane ``lane``'s 4 channels (within ``SW``) in channel tile ``tile``."""
        return tile * self.tile + (lane % self.lanes_per_group) * self.vec

    def channel_bytes(self, tile, lane) -> tuple:
        """Byte offsets within a state row of lane ``lane``'s 4 kv and 4 score channels of channel
        tile ``tile``."""
        width = self.state.element_bytes  # 4, or 2 for a bf16 state
        kv_byte = self.lane_channel(tile, lane) * width
        return kv_byte, kv_byte + STATE_WIDTH * width

    def byte_channel(self, kv_byte):
        """The channel whose kv element starts at byte ``kv_byte`` of a state row: the inverse of
        :meth:`channel_bytes`' first offset."""
        return kv_byte // self.state.element_bytes

    @cute.jit
    def reduce_rows(
        self,
        sc: list,  # R fp32 (4,) fragments: the lane's scores (overwritten with e)
        kv_rows,  # Python callable -> R fp32 (4,) fragments of kv, called after the exps
        sMax: cute.Tensor,  # fp32 smem [warps, tile]
        sNum: cute.Tensor,  # fp32 smem [warps, tile]
        sDen: cute.Tensor,  # fp32 smem [warps, tile]
        x: cute.Tensor,  # fp32 (tile/32,) out, valid in warp 0
        after_max=None,  # Python callable run once the window max is known (issues late kv loads)
        after_products=None,  # Python callable run once every u = kv * e is formed (kv rows no longer read)
    ):
        """SPEC §5 on the window held by the CTA's lanes (passes 1-3 of the module docstring)."""
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        group = lane // self.lanes_per_group
        column = lane % self.lanes_per_group
        R = self.rows_per_lane

        # pass 1: the window max per channel
        lane_max = cute.make_rmem_tensor((self.vec,), Float32)
        for c in cutlass.range_constexpr(self.vec):
            lane_max[c] = butterfly_max(tree_max([sc[i][c] for i in range(R)]), self.lanes_per_group, 16)
        if group == 0:
            store_smem(sMax, warp, column * self.vec, lane_max)
        cute.arch.sync_threads()
        row_max = cute.make_rmem_tensor((self.vec,), Float32)
        row_max.store(load_smem(sMax, 0, column * self.vec, self.vec).load())
        for w in cutlass.range_constexpr(1, self.warps):
            other = load_smem(sMax, w, column * self.vec, self.vec)
            for c in cutlass.range_constexpr(self.vec):
                row_max[c] = cute.arch.fmax(row_max[c], other[c])
        if cutlass.const_expr(after_max is not None):
            after_max()

        # pass 2: e (in place of the scores), tree(e); then u = kv * e, tree(u), in row order
        den = cute.make_rmem_tensor((self.vec,), Float32)
        for c in cutlass.range_constexpr(self.vec):
            for i in cutlass.range_constexpr(R):
                sc[i][c] = softmax_weight(sc[i][c], row_max[c])
            den[c] = butterfly_sum(tree_sum([sc[i][c] for i in range(R)]), self.lanes_per_group, 16)
        kv = kv_rows()
        num = cute.make_rmem_tensor((self.vec,), Float32)
        for c in cutlass.range_constexpr(self.vec):
            num[c] = butterfly_sum(tree_sum([fmul(kv[i][c], sc[i][c]) for i in range(R)]), self.lanes_per_group, 16)
        if cutlass.const_expr(after_products is not None):
            after_products()
        if group == 0:
            store_smem(sNum, warp, column * self.vec, num)
            store_smem(sDen, warp, column * self.vec, den)
        cute.arch.sync_threads()

        # step 3 (warp 0): tree over the warps, then the division
        if warp == 0:
            first = lane * self.final_channels
            nums = [load_smem(sNum, w, first, self.final_channels) for w in range(self.warps)]
            dens = [load_smem(sDen, w, first, self.final_channels) for w in range(self.warps)]
            for k in cutlass.range_constexpr(self.final_channels):
                x[k] = fdiv(tree_sum([nums[w][k] for w in range(self.warps)]),
                            tree_sum([dens[w][k] for w in range(self.warps)]))

    def tile_and_token(self, cta):
        """CTAs ``8t .. 8t+7`` (for 64-channel tiles) are the tiles of token ``t``: a 1-D grid
        (no 65535 limit on T), and the CTAs that read the same state rows run together."""
        return cta % self.num_tiles, cta // self.num_tiles


def copy_row_async(byte_address, dst: cute.Tensor) -> None:
    """``cp.async`` of 4 fp32 (16 bytes, L2 only) from global ``byte_address`` to ``dst`` (smem)."""
    g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Float32,
                              num_bits_per_copy=128)
    cute.copy(g2s, gmem_tensor(Float32, byte_address, 4, 16), dst)


def read_staged_rows(sStage: cute.Tensor, tidx, frags: list) -> list:
    """Thread ``tidx``'s staged rows of ``sStage`` (fp32 smem ``[rows, threads, 4]``) into ``frags``
    (fp32 ``(4,)`` fragments), once its own copies have landed (its ``cp.async.wait_group``: no
    barrier); returns ``frags``."""
    for i, frag in enumerate(frags):
        cute.autovec_copy(sStage[i, tidx, None], frag)
    return frags


def load_smem(sBuf: cute.Tensor, row, first, count: int) -> cute.Tensor:
    """Registers <- ``sBuf[row, first:first+count]`` (one vector shared-memory load)."""
    frag = cute.make_rmem_tensor((count,), Float32)
    cute.autovec_copy(cute.local_tile(sBuf[row, None], (count,), (first // count,)), frag)
    return frag


def store_smem(sBuf: cute.Tensor, row, first, frag: cute.Tensor) -> None:
    """``sBuf[row, first:first+len]`` <- registers (one vector shared-memory store)."""
    count = cute.size(frag)
    cute.autovec_copy(frag, cute.local_tile(sBuf[row, None], (count,), (first // count,)))
