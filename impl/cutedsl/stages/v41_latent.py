"""SPEC §14.3 in CuTe DSL device code: the pooled vector (ratio 1: ``kv`` itself; ratio 2: the
reference's softmax-then-sum over the rows at ``p - 1`` and ``p``), the norm and the bf16 latent.

Thread ``t`` of a token's 128 holds channels ``4t..4t+3`` (fp32 fragments of 4,
:mod:`.v41_rows`). Every operation is one of SPEC §2's, through :mod:`.exact_math`
(``add.rn``/``mul.rn``/``div.rn``/``sqrt.rn``, never contracted; the ``exp2s`` polynomial).
The sum of squares is SPEC's tree over the 512 channels: the thread's 4-leaf tree, the xor
butterfly over the 32 lanes of a warp (consecutive aligned chunks), then the tree of the 4 warps'
partials through shared memory, as :class:`.postprocess.GroupFinish` builds it for V4.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .exact_math import bf16_round_fragment, butterfly_sum, fadd, fdiv, fmax, fmul, softmax_weight, to_bf16_fragment, tree_sum
from .memory import element_address, store_fragment
from .postprocess import normalize, rms_scale, sum_of_squares
from .v41_rows import VEC, chunk_row, load_values, state_row, state_slot

GROUP_THREADS = 128  # threads per token: 4 channels each
GROUP_WARPS = GROUP_THREADS // 32


def softmax_then_sum(kv0: cute.Tensor, score0: cute.Tensor, kv1: cute.Tensor, score1: cute.Tensor) -> cute.Tensor:
    """Ratio 2's ``x`` per channel: ``M = max(s0, s1)``, ``e_i = exp2s(mul(sub(s_i, M), L))``,
    ``den = add(e0, e1)``, ``w_i = div(e_i, den)``, ``x = add(mul(kv0, w0), mul(kv1, w1))``: the
    weights normalized before the sum, as the reference's ``(kv * softmax(score)).sum()``. (The
    sign of a zero ``M`` does not matter: ``exp2s(+-0) = 1``.)"""
    x = cute.make_rmem_tensor((VEC,), Float32)
    for c in range(VEC):  # traced unrolled (a plain function)
        m = fmax(score0[c], score1[c])
        e0 = softmax_weight(score0[c], m)
        e1 = softmax_weight(score1[c], m)
        den = fadd(e0, e1)
        x[c] = fadd(fmul(kv0[c], fdiv(e0, den)), fmul(kv1[c], fdiv(e1, den)))
    return x


def pooled_ratio1(mKv: cute.Tensor, token, t) -> cute.Tensor:
    """Ratio 1's ``x``: thread ``t``'s channels of the token's ``kv`` row (fp32 or bf16 ``[T, 512]``)."""
    return load_values(mKv, token, t * VEC)


@dataclass(frozen=True)
class Ratio2Window:
    """Ratio 2's two window rows (SPEC §13.4 step 1) for a state of ``block_size`` rows a block,
    paged or a ring (``ring``), both fixed per compile."""

    block_size: int
    ring: bool

    @cute.jit
    def pooled(
        self,
        mKv: cute.Tensor,  # fp32 or bf16 [T, 512]
        mScore: cute.Tensor,  # fp32 or bf16 [T, 512]: the raw scores
        mState: cute.Tensor,  # fp32 or bf16 [num_state_blocks, bs, 1024]
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        token: Int64,  # the active token (odd position)
        position: Int64,  # p
        request: Int64,  # its block-table row
        first: Int64,  # the chunk's first token
        chunk_start: Int64,  # P0, the first token's position
        ring_capacity: Int32,  # C (read only in a ring)
        t: Int32,  # thread index in the token's group
    ) -> cute.Tensor:
        """Ratio 2's ``x`` (fp32 ``(4,)``) of an active token: row ``p`` is the token's own; row
        ``p - 1`` is token ``first + (p - 1 - P0)``'s when the chunk holds it, else the state's
        (paged or the ring), as pooling reads it."""
        state_dtype = mState.element_type
        kv1, score1 = chunk_row(mKv, mScore, state_dtype, token, t)
        kv0 = cute.make_rmem_tensor((VEC,), Float32)
        score0 = cute.make_rmem_tensor((VEC,), Float32)
        if position - 1 >= chunk_start:
            chunk_kv, chunk_score = chunk_row(mKv, mScore, state_dtype, first + (position - 1 - chunk_start), t)
            kv0.store(chunk_kv.load())
            score0.store(chunk_score.load())
        else:
            _, block, offset = state_slot(mBlockTable, request, position - 1, self.block_size, self.ring,
                                          ring_capacity)
            state_kv, state_score = state_row(mState, block, offset, t)
            kv0.store(state_kv.load())
            score0.store(state_score.load())
        return softmax_then_sum(kv0, score0, kv1, score1)


@cute.jit
def latent_of(
    x: cute.Tensor,  # fp32 (4,): thread t's channels of the pooled vector
    w: cute.Tensor,  # fp32 (4,): their norm weights
    t: Int32,  # thread index in the token's group, 0..127
    sPartial: cute.Tensor,  # fp32 smem (4,): the group's per-warp sums of squares
    barrier_id: Int32,  # named barrier of the group's 128 threads
    eps: Float32,
) -> cute.Tensor:
    """The latent ``l = bf16(y)`` (fp32 ``(4,)`` holding bf16 values), ``y`` SPEC §6's RMSNorm of
    ``x' = bf16(x)``: ``ss = tree(mul(x', x'))`` over the 512 channels, ``rr = div(1,
    sqrt(add(mul(ss, 2^-9), eps)))``, ``y = mul(mul(x', rr), w)``. Every thread of the group
    calls it (shuffles and a barrier)."""
    rounded = bf16_round_fragment(x)
    sq = butterfly_sum(sum_of_squares(rounded, VEC), 1, 16)
    lane = t % 32
    if lane == 0:
        sPartial[t // 32] = sq
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=GROUP_THREADS)
    ss = tree_sum([sPartial[w_] for w_ in range(GROUP_WARPS)])
    return bf16_round_fragment(normalize(rounded, rms_scale(ss, eps), w, VEC))


def store_latent(mLatent: cute.Tensor, token, t, values: cute.Tensor) -> None:
    """``latent[token, 4t..4t+3] = values`` (fp32 ``(4,)`` holding bf16 values; the conversion is
    exact). ``mLatent``: bf16 ``[T, 512]``, rows 16-byte aligned."""
    store_fragment(to_bf16_fragment(values), element_address(mLatent, token, t * VEC), 2 * VEC)


def load_latent(mLatent: cute.Tensor, token, t) -> cute.Tensor:
    """``latent[token, 4t..4t+3]`` as fp32 ``(4,)`` (exact)."""
    return load_values(mLatent, token, t * VEC)


__all__ = ["GROUP_THREADS", "Ratio2Window", "latent_of", "load_latent", "pooled_ratio1", "softmax_then_sum",
           "store_latent"]
