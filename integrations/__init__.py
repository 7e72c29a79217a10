"""Drop-in adapters for inference engines.

- :mod:`.vllm`: vLLM's DeepSeek V4 compressor entry points (``save_partial_states``,
  ``compress_norm_rope_store_triton``, ``compress_norm_rope_store_cutedsl``), keyword for
  keyword, on this project's kernels.

The engine guide, with the conventions of other engines mapped to the spec's, is
docs/engine.md.
"""
