"""CuTe DSL (CUTLASS Python DSL 4.8) kernels of the DeepSeek V4 KV compressor for Hopper (sm_90a);
they compile for Blackwell (sm_100a, sm_103a: ``ptx-check --arch``) but have not run there.

Public API (torch tensors, vLLM's names and dtypes; SPEC §8):

- :func:`save_partial_states` (SPEC §4)
- :func:`compress_norm_rope_store` (SPEC §5-§7; C4 fused kernel; C128 cluster-fused,
  handoff-fused (no cluster), pipelined-fused or split compress + store kernels, chosen by
  ``c128_path``)
- :func:`save_and_compress_norm_rope_store` (SPEC §4 then §5-§7, the two calls back to back:
  with PDL the compress kernel reads its metadata while the save kernel runs)
- :func:`compress_and_save` (SPEC §13.4's step call: the compress kernel of the call's state
  format reading the chunk's window rows from ``kv``/``score``, then the save of
  ``save_slot_mapping``, one stream, the Triton family's signature plus ``pdl`` and ``policy``)
- :func:`compress` (SPEC §5: the fp32 compressed vector, for tests)
- :func:`bind` (a layer's operator: its fixed tensors validated once, cheaper calls)
- :func:`warm_up` (compile every kernel a layer's configuration can dispatch to)
- :class:`Policy` / :data:`DEFAULT_POLICY` (frozen dispatch thresholds and kernel shapes, ``policy=``)
- ``torch.ops.dsv4_compressor.cutedsl_*`` (:mod:`.ops`: the operations as torch custom ops; the
  functions above call them while ``torch.compile`` traces)
- DeepSeek-V4.1 (SPEC §14, :mod:`.v41`): :func:`v41_compress_norm`, :func:`v41_rope_quant_store`,
  :func:`v41_compress_norm_rope_store` (one launch), :func:`v41_index_key_store` and
  :func:`v41_warm_up`, with the Triton family's signatures; ``torch.ops.dsv4_compressor.cutedsl_v41_*``
  (:mod:`.v41_ops`); every DeepSeek-V4.1 call runs (the conformance suite's declaration of this
  family says so); what has run on a GPU is in ``bench/RESULTS.md``.

The indexer compressor (SPEC §12, head width 128): ``layout="indexer_fp8"`` or
``"indexer_mxfp4"`` (optionally ``hadamard=True``) runs its own kernels (C4: a warp per
token; C128: a CTA per token); ``save_partial_states`` takes its state widths.

Every kernel follows SPEC §2 bit for bit (separately rounded ``.rn`` operations, the
``exp2s`` polynomial, pairwise trees in index order, the amax-floor UE8M0 rule), so the
bytes written equal the NumPy specification's.

The package has three floors, each importing only the ones below it:

- the face: :mod:`.api` (the operations, :func:`bind`, :func:`warm_up`), :mod:`.ops` (torch
  custom ops), :mod:`.variants` (named forced paths and contract variants, for conformance and
  tests), :mod:`.ptx` (every kernel's PTX for the CI rules);
- ``host/``: :mod:`.host.paths` (the registry: one :class:`~.host.paths.KernelPath` record per
  way of running a call, and :func:`~.host.paths.choose`), :mod:`.host.policy` (the frozen
  :class:`Policy`), :mod:`.host.arguments` (the argument record and the plan keys),
  :mod:`.host.plans` (validate, choose, compile: the launch plans), :mod:`.host.buffers`
  (scratch, counters, stride fix-ups), :mod:`.host.compile_cache` (tensor-free compiles, one
  function per kernel), :mod:`.host.occupancy` (resident clusters);
- ``kernels/``, one module per kernel, named as its path: :mod:`.kernels.c4`,
  :mod:`.kernels.split_pool`, :mod:`.kernels.split_store`, :mod:`.kernels.fused_cluster`,
  :mod:`.kernels.fused_handoff`, :mod:`.kernels.fused_pipelined`, :mod:`.kernels.indexer`,
  :mod:`.kernels.save`; composed from
- ``stages/``, the device stages, named as the spec's: :mod:`.stages.pooling_c4`,
  :mod:`.stages.pooling_c128` (window pooling, of a :mod:`.stages.token_window`: where a token's
  rows are and what SPEC §13's formats add), :mod:`.stages.state_format` and
  :mod:`.stages.step_rows` (SPEC §13's rows), :mod:`.stages.postprocess` (RMSNorm, RoPE,
  quantization, the stores), :mod:`.stages.indexer_entry` (SPEC §12's finishing warp),
  :mod:`.stages.cluster_smem`, :mod:`.stages.handoff_stage`, :mod:`.stages.pipelined_walk`
  (how the fused C128 kernels share a token's tiles), :mod:`.stages.activity`,
  :mod:`.stages.memory`, :mod:`.stages.exact_math`, :mod:`.stages.dependent_launch`;

and :mod:`.config`, the static configurations (compile keys) that host and kernels share.

DeepSeek-V4.1's kernels sit on the same floors: :mod:`.v41` and :mod:`.v41_ops` (the face),
:mod:`.v41_ptx` (their PTX variants), :mod:`.host.v41_paths` (their registry: one record per
kernel), :mod:`.kernels.v41_compress`, :mod:`.kernels.v41_store`, :mod:`.kernels.v41_index_key`,
composed from :mod:`.stages.v41_rows`, :mod:`.stages.v41_latent`, :mod:`.stages.v41_records`,
:mod:`.stages.v41_save` and :mod:`.stages.v41_index_key` (named as the Triton family's modules);
:mod:`.v41_config` holds their static configurations.

Importing this package needs torch only; CuTe DSL is imported on first use, with a clear
``ImportError`` if it is missing.
"""

from .api import (SUPPORTED_DEVICES, BoundLayer, bind, compress, compress_and_save, compress_norm_rope_store,
                  save_and_compress_norm_rope_store, save_partial_states, warm_up)
from .host.policy import DEFAULT_POLICY, KernelShapes, Policy, PoolShape
from .host.v41_paths import DEFAULT_V41_SHAPES, V41Shapes
from .v41 import (v41_compress_norm, v41_compress_norm_rope_store, v41_index_key_store,
                  v41_rope_quant_store, v41_warm_up)
from . import ops  # noqa: E402,F401  (registers torch.ops.dsv4_compressor.cutedsl_*)
from . import v41_ops  # noqa: E402,F401  (registers torch.ops.dsv4_compressor.cutedsl_v41_*)

__all__ = ["SUPPORTED_DEVICES", "save_partial_states", "compress_norm_rope_store", "save_and_compress_norm_rope_store",
           "compress", "compress_and_save", "bind", "BoundLayer", "warm_up", "Policy", "KernelShapes", "PoolShape", "DEFAULT_POLICY",
           "v41_compress_norm", "v41_rope_quant_store", "v41_compress_norm_rope_store", "v41_index_key_store",
           "v41_warm_up", "V41Shapes", "DEFAULT_V41_SHAPES"]
