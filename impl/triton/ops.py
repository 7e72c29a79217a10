"""The Triton operations as torch custom ops: ``torch.ops.dsv4_compressor.triton_*``.

``triton_save_partial_states`` (mutates ``state_cache``) and ``triton_compress_norm_rope_store``
(mutates ``k_cache``), with the default launch configurations. See
:mod:`dsv4_compressor.impl.custom_ops`.
"""

from __future__ import annotations

from .. import custom_ops
from . import api

OPS = custom_ops.register("triton", api, cutedsl=False)
