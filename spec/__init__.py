"""The executable NumPy specification of the DeepSeek V4 KV compressor (SPEC.md).

One module per concept, in SPEC.md's order:

- :mod:`.constants`    §1 notation and constants
- :mod:`.arithmetic`   §2 binary32 operations, ``tree``, ``exp2s``
- :mod:`.formats`      §2 bf16, E4M3 and the UE8M0 exponent; §12 E2M1 and the MXFP4 exponent
- :mod:`.state`        §4 ``save_partial_states``
- :mod:`.pooling`      §5 the activity rule, window rows, softmax pooling
- :mod:`.postprocess`  §6 RMSNorm, NoPE quantization, RoPE
- :mod:`.indexer`      §12 the indexer's RoPE, Hadamard rotation and whole-entry quantizations
- :mod:`.layouts`      §7 the three cache layouts and the store; §12 the two indexer layouts
- :mod:`.operator`     §8 the public operations
- :mod:`.validation`   §9 errors (shared with the GPU front ends) and the debug checks

:mod:`.batch` builds vLLM-style batches for tests, conformance and benchmarks. The spec
imports nothing but NumPy.
"""

from .operator import compress, compress_norm_rope_store
from .state import save_partial_states

__all__ = ["save_partial_states", "compress", "compress_norm_rope_store"]
