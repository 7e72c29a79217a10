"""Compile and plan the indexer compressor's kernels (SPEC §12).

:func:`dsv4_compressor.impl.cutedsl.compress_norm_rope_store` (and the bound layers, the
combined call and the custom ops) take ``layout="indexer_fp8"`` and ``"indexer_mxfp4"``: the
shared front end validates every argument first (SPEC §9, ``ValueError`` before anything is
compiled or launched), then :func:`.launch.build_compress_plan` compiles the kernel of
:func:`config_of` into a :class:`.launch.IndexerLaunch`, a launch plan like the 512-wide
paths' and cached with them, so a repeated call costs one key, one dictionary lookup and one
TVM-FFI launch (CUDA-graph capturable; :func:`.api.warm_up` before capture). The kernel's
mapping comes from the :class:`.dispatch.Policy` (``KernelShapes.indexer_c4_warps``,
``indexer_c128_warps``) and ``pdl`` from the call. ``save_partial_states`` needs no code
here: the shared save kernel takes the indexer's state widths (:class:`.config.SaveConfig`
``head_dim``).
"""

from __future__ import annotations

import torch

from . import dispatch
from .indexer_config import INDEXER_HEAD_DIM, IndexerConfig


# ---- compile ----------------------------------------------------------------------------------
def compile_indexer(config: IndexerConfig, *, keep_ptx: bool = False):
    """The TVM-FFI callable of one indexer kernel configuration (compiled once, cached)."""
    from . import compile_cache

    def build():
        import cutlass.cute as cute
        from cutlass import BFloat16, Float32, Int32, Int64, Uint8

        from .indexer_kernel import indexer_kernel

        T = cute.sym_int()
        weight_dtype = BFloat16 if config.weight_dtype == "bfloat16" else Float32
        weight = cute.runtime.make_fake_tensor(weight_dtype, (INDEXER_HEAD_DIM,), stride=(1,),
                                               assumed_align=weight_dtype.width // 8)
        k_cache = cute.runtime.make_fake_tensor(  # page stride dynamic (padded pages), 16-byte aligned base
            Uint8, (cute.sym_int(), config.entries_per_page, config.entry_bytes),
            stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=16)
        return cute.compile(
            indexer_kernel(config), compile_cache.fake_state_cache(config.block_size, 2 * config.state_width),
            compile_cache.fake_per_token(Int32, T), compile_cache.fake_per_token(Int64, T),
            compile_cache.fake_per_token(Int64, T), compile_cache.fake_block_table(), weight,
            compile_cache.fake_cos_sin(), k_cache, compile_cache.fake_per_token(Int64, T), Float32(1e-6),
            compile_cache.fake_stream(), options=compile_cache._options(keep_ptx),
        )

    return compile_cache.cached(("indexer", config, keep_ptx), build)


# ---- plan ------------------------------------------------------------------------------------
def config_of(call, rms_norm_weight_dtype: torch.dtype, policy: dispatch.Policy, pdl: bool) -> IndexerConfig:
    """The kernel configuration of a validated indexer call (the front end's
    :class:`~dsv4_compressor.impl.frontend.CompressStoreCall`)."""
    return dispatch.indexer_config(
        call.pooling.config.ratio, call.pooling.block_size, call.store.layout, call.store.hadamard,
        call.store.entries_per_page, "bfloat16" if rms_norm_weight_dtype == torch.bfloat16 else "float32", policy, pdl)
