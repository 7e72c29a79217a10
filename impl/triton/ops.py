"""The Triton operations as torch custom ops: ``torch.ops.dsv4_compressor.triton_*``.

``triton_save_partial_states`` (mutates ``state_cache``), ``triton_compress_norm_rope_store``
(mutates ``k_cache``) and ``triton_compress_and_save`` (SPEC §13.4; mutates ``state_cache`` and
``k_cache``), with SPEC §13's state options (``ape``, ``ape_at``, ``ring_capacity``; a bf16 state
by its dtype) and the default launch configurations. See :mod:`dsv4_compressor.impl.custom_ops`.
"""

from __future__ import annotations

from .. import custom_ops
from . import api

OPS = custom_ops.register("triton", api, cutedsl=False)
