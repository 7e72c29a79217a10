"""The CuTe DSL V4.1 operations as torch custom ops: ``torch.ops.dsv4_compressor.cutedsl_v41_*``.

``cutedsl_v41_compress_norm`` (mutates ``latent`` and, for ratio 2, ``state_cache``),
``cutedsl_v41_rope_quant_store`` (mutates ``k_cache``), ``cutedsl_v41_compress_norm_rope_store``
(``k_cache``, ``latent`` when given, ``state_cache``) and ``cutedsl_v41_index_key_store``
(``k_cache``), each with the keyword ``pdl`` and the default thread mappings. See
:mod:`dsv4_compressor.impl.v41_custom_ops`.
"""

from __future__ import annotations

from .. import v41_custom_ops
from . import v41

OPS = v41_custom_ops.register_v41("cutedsl", v41, ", bool pdl=True")
