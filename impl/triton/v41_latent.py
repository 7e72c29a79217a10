"""SPEC §14.3 in Triton device code: the pooled vector (ratio 1: ``kv`` itself; ratio 2: the
reference's softmax-then-sum over the rows at ``p - 1`` and ``p``), the norm and the bf16 latent.

Vectors are fp32 ``[8, 64]`` (row-major = channel order, :mod:`.v41_rows`). Every operation is
one of SPEC §2's: the kernels compile with ``enable_fp_fusion=False``, divisions are
``tl.div_rn``, ``exp2s`` is SPEC's polynomial, the RMSNorm is :mod:`.postprocess`'s.
"""


import triton
import triton.language as tl

from .exact_math import LOG2E_F32, bf16_round, exp2s
from .postprocess import load_norm_weight, rms_norm
from .exact_math import load_values
from .v41_rows import ROW_W, ROWS, chunk_row, state_row, state_slot

LOG2_HEAD = tl.constexpr(9)


@triton.jit
def softmax_then_sum(kv0, score0, kv1, score1):
    """Ratio 2's ``x`` per channel: ``M = max(s0, s1)``, ``e_i = exp2s(mul(sub(s_i, M), L))``,
    ``den = add(e0, e1)``, ``w_i = div(e_i, den)``, ``x = add(mul(kv0, w0), mul(kv1, w1))``: the
    weights normalized before the sum, as the reference's ``(kv * softmax(score)).sum()``.

    One ``exp2s`` a channel, not two: a row whose ``d_i = sub(s_i, M)`` is zero has ``e_i =
    exp2s(+-0) = 1``, and at most one row's ``d`` is non-zero unless a score is NaN or infinite,
    where both ``x`` are NaN either way (:func:`one_exp_weights`)."""
    e0, e1 = one_exp_weights(score0, score1)
    den = e0 + e1
    return kv0 * tl.div_rn(e0, den) + kv1 * tl.div_rn(e1, den)


@triton.jit
def one_exp_weights(s0, s1):
    """``(e0, e1)`` of two scores, ``e_i = exp2s(mul(d_i, L))`` with ``d_i = sub(s_i, max(s0, s1))``,
    from one ``exp2s``: of ``d1`` where ``d0`` is zero, else of ``d0``; a zero ``d_i`` gives 1."""
    m = tl.maximum(s0, s1)
    d0 = s0 - m
    d1 = s1 - m
    e = exp2s(tl.where(d0 == 0.0, d1, d0) * LOG2E_F32)
    return tl.where(d0 == 0.0, 1.0, e), tl.where(d1 == 0.0, 1.0, e)


@triton.jit
def pooled_ratio2(inputs, state, token, position, request, first, chunk_start, channels, KV_BF16: tl.constexpr,
                  SCORE_BF16: tl.constexpr, STATE_BF16: tl.constexpr, RING: tl.constexpr):
    """Ratio 2's ``x`` (fp32 ``[8, 64]``) of the active token ``token`` at (odd) ``position`` of
    block-table row ``request``, whose chunk starts with token ``first`` at ``chunk_start``
    (SPEC §13.4): row ``p`` is the token's own; row ``p - 1`` is token
    ``first + (p - 1 - chunk_start)``'s when the chunk holds it, else the state's (paged or the
    ring), as pooling reads it (:mod:`.v41_rows`)."""
    kv1, score1 = chunk_row(inputs, token, channels, KV_BF16, SCORE_BF16, STATE_BF16)
    if position - 1 >= chunk_start:
        kv0, score0 = chunk_row(inputs, first + (position - 1 - chunk_start), channels, KV_BF16, SCORE_BF16, STATE_BF16)
    else:
        _, block, offset = state_slot(state, request, position - 1, RING)
        kv0, score0 = state_row(state, block, offset, channels, STATE_BF16)
    return softmax_then_sum(kv0, score0, kv1, score1)


@triton.jit
def pooled_ratio1(inputs, token, channels, KV_BF16: tl.constexpr):
    """Ratio 1's ``x``: the token's ``kv`` row as binary32 ``[8, 64]``. ``inputs``:
    ``(kv_ptr, kv_stride16)``, ``kv`` fp32 or int16 (bf16 patterns) ``[T, 512]``."""
    kv_ptr, kv_stride16 = inputs
    KV_PER_16: tl.constexpr = 8 if KV_BF16 else 4  # elements per 16 bytes
    return load_values(kv_ptr, token * (kv_stride16 * KV_PER_16) + channels, KV_BF16)


@triton.jit
def latent_of(x, norm, WEIGHT_BF16: tl.constexpr):
    """The latent ``l = bf16(y)`` (fp32 ``[8, 64]`` holding bf16 values), ``y`` SPEC §6's RMSNorm
    of ``x' = bf16(x)``. ``norm``: ``(weight_ptr, eps)``, the weight fp32 ``[512]`` or int16
    ``[512]`` of bf16 patterns."""
    weight_ptr, eps = norm
    weight = load_norm_weight(weight_ptr, ROWS, ROW_W, WEIGHT_BF16)
    return bf16_round(rms_norm(bf16_round(x), weight, eps, ROWS * ROW_W, LOG2_HEAD))


@triton.jit
def store_latent(latent, token, channels, values):
    """``latent[token, 0:512] = values`` (fp32 ``[8, 64]`` holding bf16 values, stored as their
    bit patterns). ``latent``: ``(latent_ptr, latent_stride16)``, int16 ``[T, 512]`` of bf16 patterns."""
    latent_ptr, latent_stride16 = latent
    bits = (values.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)
    tl.store(latent_ptr + (token * (latent_stride16 * 8) + channels), bits)


@triton.jit
def load_latent(latent, token, channels):
    """``latent[token, 0:512]`` as fp32 ``[8, 64]`` (exact)."""
    latent_ptr, latent_stride16 = latent
    return load_values(latent_ptr, token * (latent_stride16 * 8) + channels, True)
