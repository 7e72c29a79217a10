"""Drop-in adapters for inference engines.

- :mod:`.vllm`: vLLM's DeepSeek V4 compressor entry points (``save_partial_states``,
  ``compress_norm_rope_store_triton``, ``compress_norm_rope_store_cutedsl``), keyword for
  keyword, on this project's kernels.
- :mod:`.vllm_ring`: vLLM's newer compressor call (``kv=``, ``score=``, ``ape=``,
  ``query_start_loc=``, ``is_circular=``) on a per-request C128 ring state, mapped onto
  SPEC §13 (``compress_and_save`` with ``ring_capacity``), and the tail save after it.
- :mod:`.vllm_v41`: vLLM's DeepSeek-V4.1 compressor entry points (``fused_save_compress_norm``,
  ``save_ring_rows``, ``rope_quant_insert``, ``indexer_k_norm_rope_store``) on the Triton kernels
  of SPEC §14, and ``fused_save_compress_norm_rope_quant_insert``: the compress and the insert in
  one launch.
- :mod:`.vllm_impl`: :mod:`.vllm`'s entry points behind the interface the bench and the
  conformance suite take (``cutedsl``, ``triton``), called as vLLM's layer calls them.

The engine guide, with the conventions of other engines mapped to the spec's, is
docs/engine.md.
"""
