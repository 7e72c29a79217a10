"""SPEC §14.4 (and §14.6's key): RoPE on bf16 values, with bf16 outputs.

DeepSeek-V4.1 rotates values it already holds in bf16 (the latent, the normalized index key)
and holds the rotated pairs in bf16 again. The channels outside the rotated 64 are copied bit
for bit, sign of zero included: they are never passed through a ``(1, 0)`` rotation.
"""

from __future__ import annotations

import numpy as np

from .constants import NOPE_DIM, ROPE_DIM
from .formats import bf16_bits, bf16_to_f32
from .postprocess import apply_rope


def rotate_bf16(
    values: np.ndarray,  # uint16 [n, H]: bf16 bit patterns (the latent, or the index key kappa)
    cos_sin: np.ndarray,  # float32 [n, 64]: each entry's cos_sin_cache row (row cp)
    start: int = NOPE_DIM,  # the first rotated channel: 448 for the latent, 64 for the index key
) -> np.ndarray:
    """The rotated entry ``z`` (uint16 ``[n, H]``): ``z[d] = values[d]`` outside channels
    ``start .. start+63``; inside, pair ``j`` with ``a = values[start+2j]``,
    ``b = values[start+2j+1]`` (binary32, exact) gives ``z[start+2j] = bf16(sub(mul(a, co), mul(b, si)))``
    and ``z[start+2j+1] = bf16(add(mul(a, si), mul(b, co)))``, ``co = cos_sin[j]``, ``si = cos_sin[32+j]``.
    """
    z = np.array(values, dtype=np.uint16, copy=True)
    rotated = apply_rope(bf16_to_f32(values), cos_sin, start=start)
    z[:, start:start + ROPE_DIM] = bf16_bits(rotated)
    return z
