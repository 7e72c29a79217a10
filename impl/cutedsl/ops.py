"""The CuTe DSL operations as torch custom ops: ``torch.ops.dsv4_compressor.cutedsl_*``.

``cutedsl_save_partial_states`` (mutates ``state_cache``), ``cutedsl_compress_norm_rope_store``
(mutates ``k_cache`` and ``workspace``), ``cutedsl_save_and_compress_norm_rope_store`` (all
three) and ``cutedsl_compress`` (returns a new fp32 ``[T, 512]``; no ``out``; SPEC §3's state),
with the default :class:`.host.policy.Policy`. The first three take SPEC §13's ``ape_at`` and
``ring_capacity`` (the compress also ``ape``; a bf16 state by its dtype); ``cutedsl_compress_and_save``
(SPEC §13.4's step call, mutates ``state_cache`` and ``k_cache``) has the Triton family's schema. See
:mod:`dsv4_compressor.impl.custom_ops`.
"""

from __future__ import annotations

from .. import custom_ops
from . import api

OPS = custom_ops.register("cutedsl", api, cutedsl=True)
