"""Compile and plan the indexer compressor's kernels (SPEC §12).

:func:`dsv4_compressor.impl.cutedsl.compress_norm_rope_store` (and the bound layers, the
combined call and the custom ops) take ``layout="indexer_fp8"`` and ``"indexer_mxfp4"``: the
shared front end validates every argument first (SPEC §9, ``ValueError`` before anything is
compiled or launched), then :func:`.launch.build_compress_plan` hands the validated call to
:func:`build_plan`, whose :class:`IndexerPlan` holds the compiled kernel; the plan is cached
with the other launch plans, so a repeated call costs one key, one dictionary lookup and one
TVM-FFI launch (CUDA-graph capturable; :func:`.api.warm_up` before capture). The kernel's
mapping comes from the :class:`.dispatch.Policy` (``KernelShapes.indexer_c4_warps``,
``indexer_c128_warps``) and ``pdl`` from the call. ``save_partial_states`` needs no code
here: the shared save kernel takes the indexer's state widths (:class:`.config.SaveConfig`
``head_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass

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


# ---- plan and launch -----------------------------------------------------------------------------
def _unit_stride(tensor: torch.Tensor) -> torch.Tensor:
    """A per-token array of length <= 1 (or a table whose last extent is 1) may carry any
    last stride (SPEC §9); TVM-FFI wants 1."""
    if tensor.stride(-1) != 1:
        return tensor.as_strided(tuple(tensor.shape), tuple(tensor.stride()[:-1]) + (1,))
    return tensor


@dataclass(frozen=True)
class IndexerPlan:
    """A validated, compiled ``compress_norm_rope_store`` call of the indexer compressor; ``run``
    takes the arguments of :class:`.launch.LaunchPlan` (``workspace`` does not apply)."""

    kernel: object  # compiled TVM-FFI callable (None when T = 0)
    eps: float
    num_tokens: int
    restride: bool  # a per-token array or the block table needs its unit stride restored

    def run(self, state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
            cos_sin_cache, k_cache, kv_slot_mapping, workspace=None) -> None:
        if self.num_tokens == 0:
            return
        if self.restride:
            token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping = map(
                _unit_stride, (token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping))
        self.kernel(state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                    cos_sin_cache, k_cache, kv_slot_mapping, self.eps)


def config_of(call, rms_norm_weight_dtype: torch.dtype, policy: dispatch.Policy, pdl: bool) -> IndexerConfig:
    """The kernel configuration of a validated indexer call (the front end's
    :class:`~dsv4_compressor.impl.frontend.CompressStoreCall`)."""
    return dispatch.indexer_config(
        call.pooling.config.ratio, call.pooling.block_size, call.store.layout, bool(call.store.hadamard),
        call.store.entries_per_page, "bfloat16" if rms_norm_weight_dtype == torch.bfloat16 else "float32", policy, pdl)


def build_plan(call, tensors: tuple, policy: dispatch.Policy, pdl: bool) -> IndexerPlan:
    """Compile the kernel of a validated indexer call (``tensors``: the nine tensor arguments in
    signature order, already checked to be CUDA tensors)."""
    token_to_req_indices, positions, slot_mapping, block_table = tensors[1:5]
    restride = any(t.stride(-1) != 1 for t in (token_to_req_indices, positions, slot_mapping, block_table, tensors[8]))
    eps, num_tokens = float(call.store.eps), call.pooling.num_tokens
    if num_tokens == 0:
        return IndexerPlan(None, eps, 0, restride)
    return IndexerPlan(compile_indexer(config_of(call, tensors[5].dtype, policy, pdl)), eps, num_tokens, restride)
