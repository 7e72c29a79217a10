"""The Triton V4.1 operations as torch custom ops: ``torch.ops.dsv4_compressor.triton_v41_*``.

``triton_v41_compress_norm`` (mutates ``latent`` and, for ratio 2, ``state_cache``),
``triton_v41_rope_quant_store`` (mutates ``k_cache``), ``triton_v41_compress_norm_rope_store``
(``k_cache``, ``latent`` when given, ``state_cache``) and ``triton_v41_index_key_store``
(``k_cache``). See :mod:`dsv4_compressor.impl.v41_custom_ops`.
"""

from __future__ import annotations

from .. import v41_custom_ops
from . import v41

OPS = v41_custom_ops.register_v41("triton", v41)
