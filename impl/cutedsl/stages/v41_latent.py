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

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64

from .exact_math import (bf16_round_fragment, butterfly_sum, fadd, fdiv, fmax, fmul, fsub, to_bf16_fragment,
                         tree_sum, weight_of_difference)
from .indexer_entry import select_fragment
from .memory import element_address, store_fragment
from .postprocess import normalize, rms_scale, sum_of_squares
from .v41_rows import (VEC, as_stored, input_raw_if, load_values, load_values_here, lookup_state_row, state_raw_if,
                       to_binary32)

GROUP_THREADS = 128  # threads per token: 4 channels each
GROUP_WARPS = GROUP_THREADS // 32


def softmax_then_sum(kv0: cute.Tensor, score0: cute.Tensor, kv1: cute.Tensor, score1: cute.Tensor) -> cute.Tensor:
    """Ratio 2's ``x`` per channel: ``M = max(s0, s1)``, ``e_i = exp2s(mul(sub(s_i, M), L))``,
    ``den = add(e0, e1)``, ``w_i = div(e_i, den)``, ``x = add(mul(kv0, w0), mul(kv1, w1))``: the
    weights normalized before the sum, as the reference's ``(kv * softmax(score)).sum()``.

    One ``exp2s`` a channel, not two: a row whose ``d_i = sub(s_i, M)`` is zero has ``e_i =
    exp2s(+-0) = 1``, and at most one row's ``d`` is non-zero unless a score is NaN or infinite,
    where both ``x`` are NaN either way (:func:`one_exp_weights`)."""
    x = cute.make_rmem_tensor((VEC,), Float32)
    for c in range(VEC):  # traced unrolled (a plain function)
        e0, e1 = one_exp_weights(score0[c], score1[c])
        den = fadd(e0, e1)
        x[c] = fadd(fmul(kv0[c], fdiv(e0, den)), fmul(kv1[c], fdiv(e1, den)))
    return x


def one_exp_weights(s0: Float32, s1: Float32) -> tuple:
    """``(e0, e1)`` of two scores, ``e_i = exp2s(mul(d_i, L))`` with ``d_i = sub(s_i, max(s0, s1))``,
    from one ``exp2s``: of ``d1`` where ``d0`` is zero, else of ``d0``; a zero ``d_i`` gives 1."""
    m = fmax(s0, s1)
    d0, d1 = fsub(s0, m), fsub(s1, m)
    first_is_max = d0 == Float32(0.0)
    e = weight_of_difference(Float32(cutlass.select_(first_is_max, d1, d0)))
    one = Float32(1.0)
    return (Float32(cutlass.select_(first_is_max, one, e)),
            Float32(cutlass.select_(d1 == Float32(0.0), one, e)))


def pooled_ratio1(mKv: cute.Tensor, token, t) -> cute.Tensor:
    """Ratio 1's ``x``: thread ``t``'s channels of the token's ``kv`` row (fp32 or bf16 ``[T, 512]``),
    read where it is traced (the kernel's per-token round)."""
    return load_values_here(mKv, token, t * VEC)


@dataclass(frozen=True)
class Ratio2Window:
    """Ratio 2's two window rows (SPEC §13.4 step 1) for a state of ``block_size`` rows a block,
    paged or a ring (``ring``), both fixed per compile. The kernel reads row ``p - 1`` of the chunk
    with the token's own row (:meth:`load_chunk_row_before`), its state lookup next to
    ``query_start_loc`` (:meth:`row_before`), then the state row where the chunk does not hold it
    (:meth:`load_state_row_before`), both unconverted; :meth:`pooled` converts and combines. Their
    loads are predicated, not branched around (:func:`.memory.load_if`)."""

    block_size: int
    ring: bool

    def row_before(
        self,
        mBlockTable: cute.Tensor,  # int32 [num_reqs, max_blocks]
        request: Int64,  # the token's block-table row (valid: a token of a chunk)
        position: Int64,  # p
        active: Boolean,  # the token pools (else no lookup)
        ring_capacity: Int32,  # C (read only in a ring)
    ):
        """``(block, offset, listed)`` of row ``p - 1`` in the state (:func:`.v41_rows.lookup_state_row`),
        read before the caller knows whether the chunk holds that row: it depends on the request
        and the position only."""
        return lookup_state_row(mBlockTable, request, position - 1, self.block_size, self.ring, ring_capacity, active)

    def load_chunk_row_before(
        self,
        mKv: cute.Tensor,  # fp32 or bf16 [T, 512]
        mScore: cute.Tensor,  # fp32 or bf16 [T, 512]: the raw scores
        token: Int64,  # the token (odd position p where active)
        active: Boolean,  # the token pools (else nothing is read)
        t: Int32,  # thread index in the token's group
    ) -> tuple:
        """Row ``token - 1`` of the chunk, unconverted (``(kv, score)``, ``(4,)`` in the inputs'
        dtypes). Pooling takes token ``first + (p - 1 - P0)``'s row when ``p - 1 >= P0``; a
        chunk's positions are consecutive (SPEC §13.4's contract), so that token is ``token - 1``
        and the chunk holds the row iff ``token > first``. The row is read whether or not the chunk
        holds it, so its load waits for no ``query_start_loc``: the caller issues it first, with the
        token's own row."""
        return input_raw_if(mKv, mScore, token - 1, t, active & (token > Int64(0)))

    def load_state_row_before(
        self,
        mState: cute.Tensor,  # fp32 or bf16 [num_state_blocks, bs, 1024]
        lookup: tuple,  # (block, offset, listed) of row p - 1 (:meth:`row_before`)
        wanted: Boolean,  # the token pools and the chunk does not hold row p - 1 (token == first)
        t: Int32,  # thread index in the token's group
    ) -> tuple:
        """Row ``p - 1`` of the state, unconverted (``(kv, score)``, ``(4,)`` in the state's dtype),
        read only where ``wanted`` and the table lists it (a chunk's first token)."""
        block, offset, listed = lookup
        return state_raw_if(mState, block, offset, t, wanted & listed)

    def pooled(
        self,
        raw: tuple,  # row p - 1: (chunk kv, chunk score, state kv, state score), unconverted
        kv: cute.Tensor,  # fp32 (4,): the token's own kv, as input_row reads it
        score: cute.Tensor,  # fp32 (4,): the token's own raw scores, as input_row reads them
        in_chunk: Boolean,  # token > first: row p - 1 is the chunk's
        state_dtype,  # the state's element type
    ) -> cute.Tensor:
        """Ratio 2's ``x`` (fp32 ``(4,)``) of an active token: a row from the chunk as the save
        would store it and pooling read it back (``R``), row ``p - 1`` from the state as stored."""
        chunk_kv, chunk_score, state_kv, state_score = raw
        kv0 = select_fragment(in_chunk, as_stored(to_binary32(chunk_kv), chunk_kv.element_type, state_dtype),
                              to_binary32(state_kv), VEC)
        score0 = select_fragment(in_chunk, as_stored(to_binary32(chunk_score), chunk_score.element_type, state_dtype),
                                 to_binary32(state_score), VEC)
        kv1 = as_stored(kv, chunk_kv.element_type, state_dtype)
        score1 = as_stored(score, chunk_score.element_type, state_dtype)
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


__all__ = ["GROUP_THREADS", "Ratio2Window", "latent_of", "load_latent", "one_exp_weights", "pooled_ratio1",
           "softmax_then_sum", "store_latent"]
