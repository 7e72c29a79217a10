"""Compile and launch the indexer compressor's kernels (SPEC §12), with a small plan cache.

:func:`compress_norm_rope_store` is what :func:`dsv4_compressor.impl.cutedsl.compress_norm_rope_store`
calls for ``layout="indexer_fp8"`` and ``"indexer_mxfp4"``: the shared front end validates
every argument first (SPEC §9, ``ValueError`` before anything is compiled or launched), then
a :class:`IndexerPlan` keyed by the arguments' layouts holds the compiled kernel, so a
repeated call costs one key, one dictionary lookup and one TVM-FFI launch (CUDA-graph
capturable; warm it before capture). ``save_partial_states`` needs no code here: the shared
save kernel takes the indexer's state widths (:class:`.config.SaveConfig` ``head_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...spec.constants import HEAD_DIMS
from ..frontend import layout_key, validate_compress_norm_rope_store
from .indexer_config import INDEXER_HEAD_DIM, INDEXER_LAYOUTS, IndexerConfig


@dataclass
class IndexerTuning:
    """Mapping knobs of the indexer kernels (each value compiles its own kernel once)."""

    c4_warps: int = 4  # C4: tokens (one warp each) per CTA: 1, 2, 4, 8
    c128_warps: int = 16  # C128: warps per token's CTA: 8 (16 rows each) or 16 (8 rows each)
    pdl: bool = True  # programmatic dependent launch (see .dependent_launch)


INDEXER_TUNING = IndexerTuning()


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
    """A validated, compiled ``compress_norm_rope_store`` call of the indexer compressor."""

    kernel: object  # compiled TVM-FFI callable (None when T = 0)
    eps: float
    num_tokens: int

    def run(self, state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
            cos_sin_cache, k_cache, kv_slot_mapping) -> None:
        if self.num_tokens == 0:
            return
        self.kernel(state_cache, _unit_stride(token_to_req_indices), _unit_stride(positions),
                    _unit_stride(slot_mapping), _unit_stride(block_table), rms_norm_weight, cos_sin_cache, k_cache,
                    _unit_stride(kv_slot_mapping), self.eps)


_PLANS: dict[tuple, IndexerPlan] = {}
_PLANS_MAX = 256


def _build_plan(tensors: tuple, scalars: tuple, debug: bool) -> IndexerPlan:
    """Validate (SPEC §9, §12), then compile."""
    state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight, cos_sin_cache, \
        k_cache, kv_slot_mapping = tensors
    block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard = scalars
    call = validate_compress_norm_rope_store(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
        rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
        fp8_scale=fp8_scale, hadamard=hadamard, debug=debug, head_dims=HEAD_DIMS,  # so a mismatch names the layout
    )
    if call.store.layout not in INDEXER_LAYOUTS:
        raise ValueError(f"hadamard: expected False for layout {layout!r} (only {' and '.join(INDEXER_LAYOUTS)} "
                         f"rotate), got {hadamard!r}")
    if state_cache.device.type != "cuda":
        raise ValueError(f"state_cache: expected a tensor on one of ('cuda',), got a tensor on {state_cache.device}")
    num_tokens = call.pooling.num_tokens
    eps = float(call.store.eps)
    if num_tokens == 0:
        return IndexerPlan(None, eps, 0)
    ratio = call.pooling.config.ratio
    config = IndexerConfig(
        ratio=ratio, block_size=call.pooling.block_size, layout=call.store.layout, hadamard=bool(hadamard),
        entries_per_page=call.store.entries_per_page,
        weight_dtype="bfloat16" if rms_norm_weight.dtype == torch.bfloat16 else "float32",
        warps=INDEXER_TUNING.c4_warps if ratio == 4 else INDEXER_TUNING.c128_warps, pdl=INDEXER_TUNING.pdl,
    )
    return IndexerPlan(compile_indexer(config), eps, num_tokens)


def compress_norm_rope_store(
    state_cache,  # fp32 [num_state_blocks, bs, 2*SW]: C4 512 floats a row, C128 256
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    rms_norm_weight,  # bf16 or fp32 [128]
    rms_norm_eps,  # python float (rounded to binary32)
    cos_sin_cache,  # fp32 [max_pos, 64]
    k_cache,  # uint8 [num_pages, B, E]: E = 132 (indexer_fp8) or 68 (indexer_mxfp4)
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    layout: str,  # "indexer_fp8" | "indexer_mxfp4"
    hadamard: bool = False,
    fp8_scale: float | None = None,  # must be None (no per-tensor scale); passed on to be checked
    debug: bool = False,
) -> None:
    """SPEC §12: pool, normalize, rotate (RoPE, optionally Hadamard), quantize and store one
    128-wide indexer entry per active token; the first call with a given argument layout
    validates and compiles, later ones reuse that :class:`IndexerPlan` (``debug=True``
    always validates, and checks values)."""
    tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
               cos_sin_cache, k_cache, kv_slot_mapping)
    scalars = (block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard)
    indexer_plan(tensors, scalars, debug).run(*tensors)


def indexer_plan(tensors: tuple, scalars: tuple, debug: bool) -> IndexerPlan:
    """The cached plan of a call: ``tensors`` are the nine tensor arguments in signature
    order, ``scalars`` ``(block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard)``."""
    key = None
    if not debug:
        key = (*map(layout_key, tensors), *scalars, *map(type, scalars), tuple(INDEXER_TUNING.__dict__.values()))
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: validate (and reject) it the long way
        key = plan = None
    if plan is None:
        plan = _build_plan(tensors, scalars, debug)
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan
