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

SPEC §13 (``config.state``, :mod:`.state_format`): a bf16 state's rows are read 8 bytes a thread
and widened exactly; with ``ape_at="compress"`` each valid row's score gets
``add(S, ape[q mod 4, h*512 + 4t + c])`` right after its load (the row's position ``q`` is
``window_start + i`` with ``window_start`` a multiple of 4, so its ``ape`` row is ``i mod 4``, known
at compile time); in a ring, row ``q`` lives at ``q mod C`` (a run of ``gcd(bs, 4)`` rows from a
multiple of it stays in one block, ``C`` being a multiple of ``bs``). With ``rows_from_inputs``
(SPEC §13.4's step, :mod:`.step_rows`) each valid row is read from the chunk's ``kv``/``score`` when
its position is at or after the chunk start, else from the state, a block-table read per row.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..config import HEAD_DIM, C4Config
from .exact_math import fdiv, fmul, softmax_weight, tree_max, tree_sum
from .memory import row_address
from .activity import token_activity
from .postprocess import rope_row
from .state_format import VEC, add_ape, load_state_into, ring_position
from .step_rows import StepRows, chunk_of
from .token_window import TokenWindow

RATIO = 4
WINDOW = 8
STATE_WIDTH = 2 * HEAD_DIM  # SW: kv[0:1024] then score[0:1024]


def window_weights(sc: list, c: int) -> list:
    """``e_i = exp2s(mul(sub(s_i, M), L))`` of channel ``c`` over the 8 register rows (SPEC §5)."""
    row_max = tree_max([sc[i][c] for i in range(WINDOW)])
    return [softmax_weight(sc[i][c], row_max) for i in range(WINDOW)]


def pooled(kv: list, e: list, c: int):
    """``x[c] = div(tree(u), tree(e))``, ``u_i = mul(kv_i, e_i)`` (SPEC §5)."""
    return fdiv(tree_sum([fmul(kv[i][c], e[i]) for i in range(WINDOW)]), tree_sum(e))


def empty_window() -> tuple:
    """``(kv, sc)``: the 8 window rows' fp32 ``(4,)`` register fragments, kv ``+0`` and scores
    ``-inf``, as an invalid row stays: it contributes ``u = +0`` and ``e = exp2s(-inf) = +0`` to the
    trees and never wins the max."""
    kv = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(WINDOW)]
    sc = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(WINDOW)]
    for i in range(WINDOW):
        kv[i].fill(0.0)
        sc[i].fill(-Float32.inf)
    return kv, sc


def pool_into(x: cute.Tensor, kv: list, sc: list) -> None:
    """``x`` (fp32 ``(4,)``) <- SPEC §5's pooling of the 8 register rows, channel by channel."""
    for c in range(VEC):
        x[c] = pooled(kv, window_weights(sc, c), c)


class C4Window:
    """The pooling stage of the C4 kernels: one token's window -> 4 channels of ``x`` per
    thread of a 128-thread token group."""

    group_threads = 128
    vec = 4

    def __init__(self, config: C4Config):
        self.block_size = config.block_size
        self.rows_per_lookup = config.rows_per_lookup
        self.state = config.state
        self.step_rows = StepRows(config.state, config.block_size, STATE_WIDTH)

    @cute.jit
    def pool_token(
        self,
        tables: tuple,  # (mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot): the kernel's launch arguments
        formats: tuple,  # (mApe, ring_capacity, mKv, mScore, mQsl): SPEC §13's, see pool_window and chunk_of
        tok: Int32,  # this thread's token (any index: past T it does nothing)
        t: Int32,  # thread index in the token group, 0..127
        finish,  # Python callable (x, position, kv_slot): what the kernel does with an active token's x
    ):
        """Token ``tok`` of ``T`` (SPEC §5): if active, pool its window into ``x`` (fp32 ``(4,)``:
        channels ``4t..4t+3``) and ``finish`` it; an inactive token (or one past ``T``) does nothing."""
        mState, mTokenReq, mPos, mSlot, mBlockTable, mKvSlot = tables
        mApe, ring_capacity, mKv, mScore, mQsl = formats
        if tok < mPos.shape[0]:
            position, kv_slot, active = token_activity(mPos, mSlot, mKvSlot, tok, RATIO)
            req = mTokenReq[tok]
            if active:
                x = cute.make_rmem_tensor((self.vec,), Float32)
                chunk = chunk_of(mKv, mScore, mQsl, req, tok, position, self.state)
                self.pool_window(TokenWindow(mState, mBlockTable, req, position, mApe, ring_capacity, chunk), t, x)
                finish(x, position, kv_slot)

    @cute.jit
    def pool_window(
        self,
        window: TokenWindow,  # state [num_blocks, bs, 2048]; ape fp32 [4, 1024] with ape_at="compress"
        t: Int32,  # thread index in the token group, 0..127
        x: cute.Tensor,  # fp32 (4,) out: channels 4t..4t+3
    ):
        mState, mBlockTable, req, position, mApe, ring_capacity, chunk = window
        kv, sc = empty_window()
        window_start = rope_row(position, RATIO) - RATIO  # the previous group's first position, p - 7
        if cutlass.const_expr(self.state.rows_from_inputs):
            self.load_step_rows(mState, mBlockTable, req, window_start, t, kv, sc, mApe, ring_capacity, chunk)
        else:
            self.load_state_rows(mState, mBlockTable, req, window_start, t, kv, sc, mApe, ring_capacity)
        pool_into(x, kv, sc)

    @cute.jit
    def load_state_rows(self, mState: cute.Tensor, mBlockTable: cute.Tensor, req, window_start, t, kv: list,
                        sc: list, mApe: cute.Tensor, ring_capacity):
        """The valid window rows of the state into ``kv``/``sc`` (fp32 ``(4,)`` fragments, the invalid
        rows left as filled), a run of ``gcd(bs, 4)`` rows a block-table read, scores first (the max can
        start earlier): ``mState`` fp32 (SPEC §3) or, in a SPEC §13 format, bf16
        ``[num_blocks, bs, 2048]``, a row at ``q mod C`` in a ring, ``ape[q mod 4]`` added to each score
        with ``ape_at="compress"``."""
        bs, run = self.block_size, self.rows_per_lookup
        width = self.state.element_bytes
        row_stride_bytes = Int64(mState.stride[1]) * width
        for half in cutlass.range_constexpr(2):
            channel = half * HEAD_DIM + t * self.vec
            kv_byte = channel * width
            score_byte = kv_byte + STATE_WIDTH * width
            for r in cutlass.range_constexpr(RATIO // run):
                first_row = half * RATIO + r * run
                pos = window_start + first_row
                if pos >= Int64(0):  # false only for rows 0..3 at p = 3
                    start = row_address(mState, mBlockTable, req, ring_position(pos, self.state, ring_capacity), bs)
                    for i in cutlass.range_constexpr(run):  # scores first: the max can start earlier
                        load_state_into(sc[first_row + i], start + row_stride_bytes * i + score_byte, self.state)
                        add_ape(sc[first_row + i], mApe, (first_row + i) % RATIO, channel, self.state)
                    for i in cutlass.range_constexpr(run):
                        load_state_into(kv[first_row + i], start + row_stride_bytes * i + kv_byte, self.state)

    @cute.jit
    def load_step_rows(self, mState: cute.Tensor, mBlockTable: cute.Tensor, req, window_start, t, kv: list, sc: list,
                       mApe: cute.Tensor, ring_capacity, chunk):
        """SPEC §13.4 step 1: the valid window rows (``q >= 0``) into ``kv``/``sc``, each from the chunk
        (``q >= P0``) or the state (:class:`.step_rows.StepRows`); ``ape`` row ``q mod 4 = i mod 4``."""
        for i in cutlass.range_constexpr(WINDOW):
            pos = window_start + i
            if pos >= Int64(0):  # false only for rows 0..3 at p = 3
                channel = (i // RATIO) * HEAD_DIM + t * self.vec
                self.step_rows.load_row(kv[i], sc[i], mState, mBlockTable, req, pos, channel, i % RATIO, mApe,
                                        ring_capacity, chunk)
