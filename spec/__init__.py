"""The executable NumPy specification of the DeepSeek V4 KV compressor (SPEC.md).

One module per concept, in SPEC.md's order:

- :mod:`.constants`    §1 notation and constants
- :mod:`.arithmetic`   §2 binary32 operations, ``tree``, ``exp2s``
- :mod:`.formats`      §2 bf16, E4M3 and the UE8M0 exponent; §12 E2M1 and the MXFP4 exponent
- :mod:`.state`        §4 ``save_partial_states`` (with §13's options)
- :mod:`.state_format` §13.1-§13.3 the state formats: bf16 state, where ``ape`` is added, ring addressing
- :mod:`.rows`         §5/§13.4 where a window's rows come from: the state (paged or a ring) or the call's inputs
- :mod:`.pooling`      §5 the activity rule, window positions and halves, softmax pooling
- :mod:`.postprocess`  §6 RMSNorm, NoPE quantization, RoPE
- :mod:`.indexer`      §12 the indexer's RoPE, Hadamard rotation and whole-entry quantizations
- :mod:`.layouts`      §7 the three cache layouts and the store; §12 the two indexer layouts
- :mod:`.operator`     §8 the public operations
- :mod:`.step`         §13.4 ``compress_and_save``, the step call that reads the chunk's rows from its inputs
- :mod:`.validation`   §9 errors (shared with the GPU front ends) and the debug checks

:mod:`.batch` builds vLLM-style batches for tests, conformance and benchmarks. The spec
imports nothing but NumPy.
"""

from .operator import compress, compress_norm_rope_store
from .state import save_partial_states
from .state_format import StateFormat
from .step import compress_and_save

__all__ = ["save_partial_states", "compress", "compress_norm_rope_store", "compress_and_save", "StateFormat"]
