"""Triton implementation of the DeepSeek V4 KV compressor (SPEC §4-§7, §12, §13), bit-exact with ``spec``.

- :func:`save_partial_states`: SPEC §4, one launch.
- :func:`compress_norm_rope_store`: SPEC §5-§7 (pool, RMSNorm, RoPE, quantize, store) for C4 and
  C128, every state block size and all three cache layouts: C4 fused into one launch, C128 on the
  split path (a pool kernel per channel tile and run of tokens, then a store kernel); for a
  128-wide state, the lightning indexer's compressor (SPEC §12: ``indexer_fp8`` /
  ``indexer_mxfp4``, ``hadamard=True`` for the rotation).
- SPEC §13's state formats in both: a bf16 state (the state tensor's dtype), ``ape_at``
  (``"save"`` or ``"compress"``, where ``ape`` is added) and ``ring_capacity`` (a ring of rows
  per request), each a compile-time option of the same kernels.
- :func:`compress_and_save`: SPEC §13.4's step call, the compress reading each chunk's own
  rows from ``kv`` / ``score``, then the save (on one stream: C4 two launches, C128 three).
- :data:`SUPPORTED_DEVICES`: ``("cpu",)`` when ``TRITON_INTERPRET=1`` was set at import, else
  ``("cuda",)``.
- :class:`FusedConfig` / :class:`SplitConfig` / :class:`SaveConfig`: speed knobs (``config=`` keyword of
  the calls; a ``FusedConfig`` at C128 runs the fused kernel there).
- :func:`warm_up`: compile a layer's kernels before CUDA-graph capture.
- DeepSeek-V4.1 (SPEC §14): :func:`v41_compress_norm`, :func:`v41_rope_quant_store`,
  :func:`v41_compress_norm_rope_store` (one launch), :func:`v41_index_key_store` and
  :func:`v41_warm_up` (:mod:`.v41`; kernels in :mod:`.v41_kernels`).

Module map: :mod:`.exact_math` (exp2s, encoders, UE8M0, trees), :mod:`.window` (a token's activity
and where its window's rows come from: the state, paged or a ring, or the step's inputs),
:mod:`.rows` (SPEC §13's row format, and a tile of rows as pooling reads them), :mod:`.pooling`
(the pooled vector, one channel tile at a time),
:mod:`.postprocess` (what both head widths share: RMSNorm, the RoPE row and pairs),
:mod:`.kv_entry` (the 512-wide entry: RoPE part, NoPE quantization, three layouts' stores),
:mod:`.indexer_entry` (the indexer's: RoPE rows, the rotation, the FP8 / MXFP4 entries),
:mod:`.finish` (a pooled vector to its stored entry, either head),
:mod:`.fused`, :mod:`.split_pool`, :mod:`.split_store` and :mod:`.save_states` (the kernels: one fused
kernel and C128's split pair for both head widths, the save),
:mod:`.launch` (a plan's fast launcher), :mod:`.split_launch` (the split pair's launch, its runs and scratch), :mod:`.api` (validation, launch plans, warm-up), :mod:`.ops`
(the operations as ``torch.ops.dsv4_compressor.triton_*`` custom ops), :mod:`.ptx` (PTX of every
variant for the SPEC §2 instruction rules; :mod:`.ptx_variant` is the record of one). DeepSeek-V4.1:
:mod:`.v41_rows` (the projections and ratio 2's state rows), :mod:`.v41_latent` (pooling, norm,
latent), :mod:`.v41_records` (RoPE and the five records), :mod:`.v41_index_key`, :mod:`.v41_save`
(the save after the compress),
:mod:`.v41_kernels` (three kernels and their static configurations), :mod:`.v41` (the API),
:mod:`.v41_ops` (``torch.ops.dsv4_compressor.triton_v41_*``), :mod:`.v41_ptx` (their PTX variants).
"""

from .api import SUPPORTED_DEVICES, compress_and_save, compress_norm_rope_store, save_partial_states, warm_up
from .config import FusedConfig, SaveConfig, SplitConfig
from .v41 import v41_compress_norm, v41_compress_norm_rope_store, v41_index_key_store, v41_rope_quant_store, v41_warm_up
from . import ops  # noqa: E402,F401  (registers torch.ops.dsv4_compressor.triton_*)
from . import v41_ops  # noqa: E402,F401  (registers torch.ops.dsv4_compressor.triton_v41_*)

__all__ = ["SUPPORTED_DEVICES", "compress_and_save", "compress_norm_rope_store", "save_partial_states", "warm_up",
           "FusedConfig", "SaveConfig", "SplitConfig", "v41_compress_norm", "v41_rope_quant_store", "v41_compress_norm_rope_store",
           "v41_index_key_store", "v41_warm_up"]
