"""save_partial_states (SPEC §4): write this step's projections into the paged state cache.

One group of ``G = min(128, SW/4)`` threads per token (128; the indexer's 64 for C4 and 32
for C128); thread ``t`` moves the 4-float chunks ``t, t+G, ...`` of
the kv half (copied) and of the score half (``add(score, ape[p mod r])``, one ``add.rn``
per element, so the stored score is exactly SPEC's). Tokens with ``slot_mapping < 0`` write
nothing. Loads are 128-bit when the front end found ``kv_score``'s and ``ape``'s rows
16-byte aligned (``vector_inputs``), scalar otherwise (SPEC only promises unit last
strides there); the state cache rows are always 16-byte aligned (SPEC §3).

SPEC §13 (``config.state``): with ``ape_at="compress"`` the score is stored raw (``ape`` is not
read, and may be ``None``); a bf16 state stores each value rounded once to bf16 (to nearest,
ties to even: ``cvt.rn.bf16x2.f32``), 8 bytes a chunk. A ring saves exactly as a paged state
(``slot_mapping`` names ring slots already).

SPEC §13.4's step saves from ``kv`` and ``score`` given as two fp32 ``[T, SW]`` tensors
(``config.split_inputs``): the launch's first tensor is then ``kv`` and ``score`` follows the stream.
Its predecessor on the stream is the step's own compress, which writes none of the save's inputs
and waits for its own predecessor before it lets its dependents start; so with
``config.inputs_before_wait`` a token's slot, position and rows are read (predicated loads, no
branch) before the grid-dependency wait, and only the stores, which overwrite rows the compress
may still read, wait for it.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..config import SaveConfig
from ..stages.activity import ballot_run, group_token, run_end, take_lowest
from ..stages.dependent_launch import wait_for_prerequisite_grids
from ..stages.exact_math import fadd
from ..stages.memory import element_address, load_elements_if, load_fragment, load_if, store_fragment
from ..stages.state_format import store_state


class SavePartialStatesKernel:
    """Grid ``ceil(T / tokens_per_cta)``, ``group_threads * tokens_per_cta`` threads; with ``token_run``
    above 1, ``ceil(T / token_run)`` CTAs of one group, each saving the rows of its run of ``token_run``
    consecutive tokens that have a slot (one ballot finds them), one after the other."""

    vec = 4

    def __init__(self, config: SaveConfig):
        self.config = config
        self.pdl = config.pdl
        self.ratio = config.compress_ratio
        self.block_size = config.block_size
        self.state_width = config.state_width
        self.tokens_per_cta = config.tokens_per_cta
        self.token_run = config.token_run
        self.group_threads = config.group_threads
        self.threads = self.group_threads * self.tokens_per_cta
        self.chunks_per_thread = self.state_width // (self.vec * self.group_threads)  # 2 (C4), else 1
        self.input_align = 16 if config.vector_inputs else 4
        self.state = config.state
        self.state_bytes = config.state.element_bytes  # 4, or 2 for a bf16 state

    @cute.jit
    def __call__(
        self,
        mKvScore: cute.Tensor,  # fp32 [T, 2*SW]: kv then score (score without ape)
        mApe: cute.Tensor,  # fp32 [r, SW]; None with ape_at="compress"
        mPos: cute.Tensor,  # int64 [T]
        mSlot: cute.Tensor,  # int64 [T]: state slot, -1 = padding
        mState: cute.Tensor,  # fp32 or bf16 (config.state) [num_blocks, bs, 2*SW], written in place
        stream: cuda.CUstream,
        mScore: cute.Tensor = None,  # split_inputs: fp32 [T, SW] (then mKvScore is kv, fp32 [T, SW]), else None
    ):
        num_tokens = mPos.shape[0]
        per_cta = self.tokens_per_cta * self.token_run
        grid = (num_tokens + per_cta - 1) // per_cta
        self.kernel(mKvScore, mApe, mPos, mSlot, mState, mScore).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )

    @cute.kernel
    def kernel(self, mKvScore: cute.Tensor, mApe: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
               mState: cute.Tensor, mScore: cute.Tensor):
        if cutlass.const_expr(self.config.inputs_before_wait):
            self.save_inputs_first(mKvScore, mApe, mPos, mSlot, mState, mScore)
        else:
            self.save_after_wait(mKvScore, mApe, mPos, mSlot, mState, mScore)

    @cute.jit
    def save_after_wait(self, mKvScore: cute.Tensor, mApe: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
                        mState: cute.Tensor, mScore: cute.Tensor):
        """Every token's save after the grid-dependency wait (the kernel's arguments)."""
        wait_for_prerequisite_grids(self.pdl)  # first: before any global access
        t, tok = group_token(self.group_threads, self.tokens_per_cta)
        if cutlass.const_expr(self.token_run == 1):
            if tok < mPos.shape[0]:
                slot = mSlot[tok]
                if slot >= Int64(0):
                    self.save_token(mKvScore, mApe, mPos, mState, mScore, tok, slot, t)
        else:
            first = tok * self.token_run  # one group per CTA: tok is the CTA index
            mask, lane_pos, lane_slot, lane_req = ballot_run(mSlot, first, run_end(first, self.token_run, mPos.shape[0]))
            while mask != Int32(0):
                saved, _, slot, _, mask = take_lowest(mask, first, lane_pos, lane_slot, lane_req)
                self.save_token(mKvScore, mApe, mPos, mState, mScore, saved, slot, t)

    @cute.jit
    def save_inputs_first(self, mKvScore: cute.Tensor, mApe: cute.Tensor, mPos: cute.Tensor, mSlot: cute.Tensor,
                          mState: cute.Tensor, mScore: cute.Tensor):
        """``inputs_before_wait`` (the step's save; the kernel's arguments, ``mKvScore`` its ``kv``): a
        token's slot, position, ``kv``, ``score`` and ``ape`` rows read where it saves, then the wait,
        then its state row."""
        t, tok = group_token(self.group_threads, self.tokens_per_cta)
        in_range = tok < mPos.shape[0]
        slot = load_if(Int64, element_address(mSlot, tok), 1, in_range)[0]
        saves = in_range & (slot >= Int64(0))
        rows = []
        for k in cutlass.range_constexpr(self.chunks_per_thread):
            kv_byte = (t + k * self.group_threads) * (self.vec * 4)
            kv = self.load_input(element_address(mKvScore, tok, 0) + kv_byte, saves)
            score = self.load_input(element_address(mScore, tok, 0) + kv_byte, saves)
            rows.append((kv, score))
        if cutlass.const_expr(self.state.ape_at == "save"):
            position = load_if(Int64, element_address(mPos, tok), 1, saves)[0]
            ape = element_address(mApe, position % self.ratio, 0)
            for k in cutlass.range_constexpr(self.chunks_per_thread):
                bias = self.load_input(ape + (t + k * self.group_threads) * (self.vec * 4), saves)
                for i in cutlass.range_constexpr(self.vec):
                    rows[k][1][i] = fadd(rows[k][1][i], bias[i])
        wait_for_prerequisite_grids(True)  # the compress may still read the rows these stores overwrite
        if saves:
            dst = self.state_row(mState, slot)
            for k in cutlass.range_constexpr(self.chunks_per_thread):
                state_kv_byte = (t + k * self.group_threads) * (self.vec * self.state_bytes)
                store_state(mState, dst + state_kv_byte, rows[k][0])
                store_state(mState, dst + state_kv_byte + self.state_width * self.state_bytes, rows[k][1])

    def state_row(self, mState: cute.Tensor, slot: Int64):
        """The byte address of the state row at ``slot`` (``mState``: fp32 or bf16 ``[num_blocks, bs,
        2*SW]``): row ``slot mod bs`` of block ``slot // bs``."""
        block = slot // self.block_size
        return element_address(mState, block, slot - block * self.block_size, 0)

    def load_input(self, address, predicate) -> cute.Tensor:
        """fp32 ``(4,)``: 4 input elements at ``address`` where ``predicate`` (undefined elsewhere):
        one 128-bit predicated load with ``vector_inputs``, else four scalar ones."""
        return load_elements_if(Float32, address, self.vec, self.input_align == 16, predicate)

    @cute.jit
    def save_token(
        self,
        mKvScore: cute.Tensor,  # fp32 [T, 2*SW] (or kv, fp32 [T, SW], with split_inputs)
        mApe: cute.Tensor,  # fp32 [r, SW], or None
        mPos: cute.Tensor,  # int64 [T]
        mState: cute.Tensor,  # fp32 or bf16 [num_blocks, bs, 2*SW], written in place
        mScore: cute.Tensor,  # fp32 [T, SW] with split_inputs, else None
        tok,  # a token with a slot
        slot: Int64,  # its slot_mapping entry, >= 0
        t,  # thread index in the token group
    ):
        """SPEC §4 (§13.1/§13.2's formats) for token ``tok``: its state row at ``slot``."""
        dst = self.state_row(mState, slot)
        src = element_address(mKvScore, tok, 0)
        if cutlass.const_expr(self.state.is_default):
            ape = element_address(mApe, mPos[tok] % self.ratio, 0)
            for k in cutlass.range_constexpr(self.chunks_per_thread):
                kv_byte = (t + k * self.group_threads) * (self.vec * 4)
                score_byte = kv_byte + self.state_width * 4
                kv = load_fragment(Float32, src + kv_byte, self.vec, self.input_align)
                store_fragment(kv, dst + kv_byte, 16)
                score = load_fragment(Float32, self.score_address(src, mScore, tok, kv_byte, score_byte),
                                      self.vec, self.input_align)
                bias = load_fragment(Float32, ape + kv_byte, self.vec, self.input_align)
                out = cute.make_rmem_tensor((self.vec,), Float32)
                for i in cutlass.range_constexpr(self.vec):
                    out[i] = fadd(score[i], bias[i])
                store_fragment(out, dst + score_byte, 16)
        else:
            self.save_formatted(mScore, mApe, mPos, mState, tok, src, dst, t)

    def score_address(self, src, mScore: cute.Tensor, tok, kv_byte, score_byte):
        """The byte address of a token's 4 score inputs: in its ``kv_score`` row (``src`` + the score
        half's offset), or in ``mScore`` (``split_inputs``: fp32 ``[T, SW]``) at the kv chunk's offset."""
        if cutlass.const_expr(self.config.split_inputs):
            return element_address(mScore, tok, 0) + kv_byte
        return src + score_byte

    @cute.jit
    def save_formatted(self, mScore: cute.Tensor, mApe: cute.Tensor, mPos: cute.Tensor, mState: cute.Tensor, tok,
                       src, dst, t):
        """SPEC §13.1/§13.2's save of token ``tok`` (``src``, ``dst``: its input and state rows'
        byte addresses): ``R(kv)``, then ``R(add(score, ape[p mod r]))`` or ``R(score)``, ``R`` the
        bf16 rounding of a bf16 state (the identity for fp32)."""
        for k in cutlass.range_constexpr(self.chunks_per_thread):
            chunk = t + k * self.group_threads
            kv_byte = chunk * (self.vec * 4)
            score_byte = kv_byte + self.state_width * 4
            state_kv_byte = chunk * (self.vec * self.state_bytes)
            state_score_byte = state_kv_byte + self.state_width * self.state_bytes
            kv = load_fragment(Float32, src + kv_byte, self.vec, self.input_align)
            store_state(mState, dst + state_kv_byte, kv)
            score = load_fragment(Float32, self.score_address(src, mScore, tok, kv_byte, score_byte), self.vec,
                                  self.input_align)
            if cutlass.const_expr(self.state.ape_at == "save"):
                ape = element_address(mApe, mPos[tok] % self.ratio, 0)
                bias = load_fragment(Float32, ape + kv_byte, self.vec, self.input_align)
                out = cute.make_rmem_tensor((self.vec,), Float32)
                for i in cutlass.range_constexpr(self.vec):
                    out[i] = fadd(score[i], bias[i])
                store_state(mState, dst + state_score_byte, out)
            else:
                store_state(mState, dst + state_score_byte, score)
