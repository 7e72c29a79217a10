"""SPEC §14.6 in CuTe DSL device code: DeepSeek-V4.1's indexer key from ``k_pre = wk(latent)``.

One warp per token, lane ``l`` holding channels ``4l..4l+3`` (the mapping of
:mod:`.indexer_entry`, whose finishing warp stores the records): §12's norm over 128 channels
on the bf16 inputs (the lane's 4-leaf tree, then the xor butterfly 1..16: SPEC's tree),
``kappa = bf16(mul(mul(x, rr), w))``; RoPE on channels 64..127 (lanes 16..31, pairs
``2(l - 16)`` and ``2(l - 16) + 1``) with bf16 outputs, channels 0..63 copied bit for bit; no
Hadamard rotation; then §12's ``indexer_fp8`` or ``indexer_mxfp4`` record of those bf16 values
(``q = z``).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32

from .exact_math import bf16_round_fragment, butterfly_sum
from .indexer_entry import INV_INDEXER_HEAD_DIM, ROPE_FIRST_LANE, VEC, select_fragment
from .postprocess import normalize, rms_scale, rotate_pairs, sum_of_squares
from .v41_rows import load_values_here


def load_index_key_row(
    mKPre: cute.Tensor,  # bf16 [T, 128]: k_pre, rows with any (unaligned) stride
    token,  # the token (row of k_pre)
    lane: Int32,  # 0..31
) -> cute.Tensor:
    """The lane's channels ``4l..4l+3`` of ``k_pre``'s row ``token`` (fp32 ``(4,)``, bf16 values),
    read where it is traced (the kernel's per-token round)."""
    return load_values_here(mKPre, token, lane * VEC, align_rows=False)


def index_key_entry(
    x: cute.Tensor,  # fp32 (4,): the lane's channels of k_pre (load_index_key_row)
    lane: Int32,  # 0..31
    w: cute.Tensor,  # fp32 (4,): the norm weights of the lane's channels
    cos: cute.Tensor,  # fp32 (2,): cos of the lane's RoPE pairs (lanes 16..31)
    sin: cute.Tensor,  # fp32 (2,): their sin
    eps: Float32,
) -> cute.Tensor:
    """The lane's channels of the rotated key ``z`` (fp32 ``(4,)`` holding bf16 values). Every lane
    of the warp calls it (the sum of squares is a butterfly)."""
    ss = butterfly_sum(sum_of_squares(x, VEC), 1, 16)
    kappa = bf16_round_fragment(normalize(x, rms_scale(ss, eps, INV_INDEXER_HEAD_DIM), w, VEC))
    rotated = bf16_round_fragment(rotate_pairs(kappa, VEC, cos, sin))
    return select_fragment(lane >= ROPE_FIRST_LANE, rotated, kappa, VEC)


__all__ = ["index_key_entry", "load_index_key_row"]
