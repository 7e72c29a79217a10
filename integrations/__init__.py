"""Drop-in adapters for inference engines.

- :mod:`.vllm`: vLLM's DeepSeek V4 compressor entry points (``save_partial_states``,
  ``compress_norm_rope_store_triton``, ``compress_norm_rope_store_cutedsl``), keyword for
  keyword, on this project's kernels.
- :mod:`.vllm_ring`: vLLM's newer compressor call (``kv=``, ``score=``, ``ape=``,
  ``query_start_loc=``, ``is_circular=``) on a per-request C128 ring state, mapped onto
  SPEC §13 (``compress_and_save`` with ``ring_capacity``), and the tail save after it.

The engine guide, with the conventions of other engines mapped to the spec's, is
docs/engine.md.
"""
