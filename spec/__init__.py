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
- :mod:`.v41_compress`    §14.3 DeepSeek-V4.1's compress: activity, ratio-2 pooling, the bf16 latent
- :mod:`.v41_rope`        §14.4 RoPE on bf16 values with bf16 outputs (the latent, the index key)
- :mod:`.v41_records`     §14.5 the ``v41_mxfp8`` and ``v41_nvfp4`` records, and V4's records of ``z``
- :mod:`.v41_index_key`   §14.6 the indexer key derived from the latent
- :mod:`.v41_operator`    §14.7 the four V4.1 operations
- :mod:`.v41_validation`  §14.8 their argument checks

:mod:`.batch` builds vLLM-style batches for tests, conformance and benchmarks. The spec
imports nothing but NumPy.
"""

from .operator import compress, compress_norm_rope_store
from .state import save_partial_states
from .state_format import StateFormat
from .step import compress_and_save
from .v41_operator import v41_compress_norm, v41_compress_norm_rope_store, v41_index_key_store, v41_rope_quant_store

__all__ = [
    "save_partial_states", "compress", "compress_norm_rope_store", "compress_and_save", "StateFormat",
    "v41_compress_norm", "v41_rope_quant_store", "v41_compress_norm_rope_store", "v41_index_key_store",
]
