"""SPEC §14.6: DeepSeek-V4.1's indexer key, derived from the latent (no indexer compressor).

``k_pre = wk(latent)`` (a bf16 GEMM 512 -> 128, outside the spec) arrives as bf16. Per active
token: §12's RMSNorm over 128 on the bf16 inputs, the result held in bf16 (``kappa``); RoPE on
channels 64..127 at the group's first position with bf16 outputs; no Hadamard rotation; then
§12's ``indexer_fp8`` or ``indexer_mxfp4`` record of those bf16 values.
"""

from __future__ import annotations

import numpy as np

from .constants import INDEXER_ROPE_START
from .entry_layout import INDEXER_FP8
from .formats import bf16_bits, bf16_to_f32
from .indexer import quantize_fp8, quantize_mxfp4
from .layouts import store_indexer_fp8, store_indexer_mxfp4
from .postprocess import rms_norm
from .v41_rope import rotate_bf16


def normalized_key(
    k_pre: np.ndarray,  # uint16 [n, 128]: bf16 bit patterns of the wk projection
    weight: np.ndarray,  # float32 [128]: the norm weight's binary32 value
    eps: np.float32,
) -> np.ndarray:
    """``kappa[d] = bf16(mul(mul(x[d], rr), w[d]))`` with ``x = k_pre`` and §12's ``rr``
    (``ss`` a tree over the 128 channels, ``ms = mul(ss, 2^-7)``); uint16 ``[n, 128]``."""
    return bf16_bits(rms_norm(bf16_to_f32(k_pre), weight, eps))


def index_key_entries(
    k_pre: np.ndarray,  # uint16 [n, 128]
    weight: np.ndarray,  # float32 [128]
    eps: np.float32,
    cos_sin: np.ndarray,  # float32 [n, 64]: each entry's cos_sin_cache row (row cp)
) -> np.ndarray:
    """The rotated key ``z`` (uint16 ``[n, 128]``): ``kappa[0:64]`` copied, the RoPE pairs of
    ``kappa[64:128]`` rounded to bf16."""
    return rotate_bf16(normalized_key(k_pre, weight, eps), cos_sin, start=INDEXER_ROPE_START)


def store_index_keys(
    k_cache: np.ndarray,  # uint8 [num_pages, B, 132] (indexer_fp8) or [num_pages, B, 68] (indexer_mxfp4)
    slots: np.ndarray,  # int64 [n]: the indexer cache's slots of the active tokens
    z_bits: np.ndarray,  # uint16 [n, 128]: the rotated keys
    layout: str,  # indexer_fp8 or indexer_mxfp4
) -> None:
    """SPEC §12's records with ``q[d] = z[d]``; no other byte changes."""
    q = bf16_to_f32(z_bits)
    if layout == INDEXER_FP8.name:
        store_indexer_fp8(k_cache, slots, quantize_fp8(q))
    else:
        store_indexer_mxfp4(k_cache, slots, quantize_mxfp4(q))
