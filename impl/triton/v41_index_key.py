"""SPEC §14.6 in Triton device code: DeepSeek-V4.1's indexer key from ``k_pre = wk(latent)``.

A key travels as ``x4``: fp32 ``[4, 32]`` (row-major = channel order; rows 2 and 3 are the RoPE
channels 64..127), the view of :mod:`.indexer_entry`, whose RoPE and stores it reuses: §12's
norm over 128 channels on the bf16 inputs, ``kappa = bf16(y)``, RoPE on channels 64..127 (the
pairs rounded to bf16 by the store, NoPE copied), no Hadamard rotation, then §12's
``indexer_fp8`` or ``indexer_mxfp4`` record.
"""


import triton
import triton.language as tl

from .exact_math import bf16_round
from .indexer_entry import LOG2_INDEXER_HEAD, ROW_W, ROWS, indexer_rope
from .postprocess import load_norm_weight, rms_norm
from .v41_rows import load_values


@triton.jit
def index_key_entry(k_pre, token, norm, cos_sin_row_ptr, WEIGHT_BF16: tl.constexpr):
    """The rotated key ``z`` (fp32 ``[4, 32]``; rows 2, 3 unrounded: the store rounds them) of
    token ``token`` (int64). ``k_pre``: ``(k_pre_ptr, k_pre_stride)``, int16 ``[T, 128]`` of bf16
    patterns (row stride in elements); ``norm``: ``(weight_ptr, eps)``, the weight fp32 or int16
    (bf16) ``[128]``; ``cos_sin_row_ptr``: the fp32 ``cos_sin_cache`` row ``cp``."""
    k_pre_ptr, k_pre_stride = k_pre
    weight_ptr, eps = norm
    channels = tl.arange(0, ROWS)[:, None] * ROW_W + tl.arange(0, ROW_W)[None, :]
    x = load_values(k_pre_ptr, token * k_pre_stride + channels, True)
    weight = load_norm_weight(weight_ptr, ROWS, ROW_W, WEIGHT_BF16)
    kappa = bf16_round(rms_norm(x, weight, eps, ROWS * ROW_W, LOG2_INDEXER_HEAD))
    return indexer_rope(kappa, cos_sin_row_ptr)
