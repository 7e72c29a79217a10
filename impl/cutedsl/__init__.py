"""CuTe DSL (CUTLASS Python DSL 4.8) kernels of the DeepSeek V4 KV compressor for Hopper (sm_90a).

Public API (torch tensors, vLLM's names and dtypes; SPEC §8):

- :func:`save_partial_states` (SPEC §4)
- :func:`compress_norm_rope_store` (SPEC §5-§7; C4 fused kernel; C128 cluster-fused,
  handoff-fused (no cluster) or split compress + store kernels, chosen by ``c128_path``)
- :func:`save_and_compress_norm_rope_store` (SPEC §4 then §5-§7, the two calls back to back:
  with PDL the compress kernel reads its metadata while the save kernel runs)
- :func:`compress` (SPEC §5: the fp32 compressed vector, for tests)
- :func:`bind` (a layer's operator: its fixed tensors validated once, cheaper calls)
- :func:`warm_up` (compile every kernel a layer's configuration can dispatch to)
- :class:`Policy` / :data:`DEFAULT_POLICY` (frozen dispatch thresholds and kernel shapes, ``policy=``)
- ``torch.ops.dsv4_compressor.cutedsl_*`` (:mod:`.ops`: the operations as torch custom ops)

The indexer compressor (SPEC §12, head width 128): ``layout="indexer_fp8"`` or
``"indexer_mxfp4"`` (optionally ``hadamard=True``) runs its own kernels (C4: a warp per
token; C128: a CTA per token); ``save_partial_states`` takes its state widths.

Every kernel follows SPEC §2 bit for bit (separately rounded ``.rn`` operations, the
``exp2s`` polynomial, pairwise trees in index order, the amax-floor UE8M0 rule), so the
bytes written equal the NumPy specification's. Module map:

- :mod:`.exact_math` exact ops, exp2s, trees, format helpers (device side)
- :mod:`.memory` 64-bit byte addressing and vector loads/stores
- :mod:`.activity` which tokens write an entry (SPEC §5), one token or a chunk (device side)
- :mod:`.postprocess` the finishing stage: RMSNorm, RoPE, quantization and the three cache
  layouts, in the two thread mappings the kernels use (device side)
- :mod:`.pooling_c4` C4 window pooling stage, the C4 fused and pooling-only kernels
- :mod:`.pooling_c128` C128 tile pooling stage, the split path's compress kernel (Block8/generic)
- :mod:`.store` C128 split path's store kernel
- :mod:`.fused_c128_cluster` C128 single-launch kernel, a cluster of 8 or 16 CTAs per token
- :mod:`.fused_c128_handoff` C128 single-launch kernel without clusters (the last CTA finishes)
- :mod:`.dependent_launch` programmatic dependent launch (every kernel waits before its first access)
- :mod:`.save_states` save_partial_states (both head widths)
- :mod:`.indexer_config`, :mod:`.indexer_entry`, :mod:`.indexer_kernel`, :mod:`.indexer_launch`
  the indexer compressor: configuration, the warp's finishing stage (norm, RoPE, Hadamard,
  FP8 / MXFP4 stores), the C4 and C128 kernels, compile and launch plans
- :mod:`.config` static configurations (compile-cache keys)
- :mod:`.compile_cache` tensor-free compile functions and the in-process cache
- :mod:`.dispatch` the frozen dispatch policy and the pure choice of path and configuration
- :mod:`.launch` launch plans, their cache, scratch buffers and the handoff counters
- :mod:`.api` the public operations, :func:`bind` and :func:`warm_up`
- :mod:`.ops` the public operations registered as torch custom ops
- :mod:`.variants` named forced paths and policies, for conformance and benchmarks
- :mod:`.ptx` every variant's PTX for the CI rules

Importing this package needs torch only; CuTe DSL is imported on first use, with a clear
``ImportError`` if it is missing.
"""

from .api import (SUPPORTED_DEVICES, BoundLayer, bind, compress, compress_norm_rope_store,
                  save_and_compress_norm_rope_store, save_partial_states, warm_up)
from .dispatch import DEFAULT_POLICY, KernelShapes, Policy, PoolShape
from . import ops  # noqa: E402,F401  (registers torch.ops.dsv4_compressor.cutedsl_*)

__all__ = ["SUPPORTED_DEVICES", "save_partial_states", "compress_norm_rope_store", "save_and_compress_norm_rope_store",
           "compress", "bind", "BoundLayer", "warm_up", "Policy", "KernelShapes", "PoolShape", "DEFAULT_POLICY"]
