"""DeepSeek-V4.1's kernel paths (SPEC §14.7): one record per kernel, in one registry.

A :class:`V41KernelPath` is everything the host needs to run one of the three V4.1 kernels: its
name (the compile cache's kernel name, the prefix of its PTX variants' tags), the operations it
runs, its static configuration for a validated call (:mod:`..v41_config`) and the order of its
TVM-FFI arguments. :mod:`..v41` (the API, its plans and ``v41_warm_up``) and :mod:`..v41_ptx`
(the PTX list) iterate :data:`V41_PATHS`. There is one way to run each operation:

- ``v41_compress``: ``v41_compress_norm`` and ``v41_compress_norm_rope_store``, one launch;
- ``v41_store``: ``v41_rope_quant_store``;
- ``v41_index_key``: ``v41_index_key_store``.

Nothing here touches the GPU: the configurations come from a :class:`V41Request` (what a
validated call fixes) and the frozen :class:`V41Shapes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import store_alignments
from ..v41_config import V41_LAYOUTS, V41CompressConfig, V41IndexKeyConfig, V41RecordFormat, V41StoreConfig


@dataclass(frozen=True)
class V41Shapes:
    """The V4.1 kernels' thread mappings (compile-time; the bytes do not depend on them)."""

    compress_tokens_per_cta: int = 1  # 128 threads per token: 1, 2 or 4 tokens per CTA
    ratio2_ctas_per_sm: int | None = 10  # the ratio-2 compress kernel's .minnctapersm (48 registers instead of 72:
    #                                      more CTAs and loads an SM), or None; ratio 1's fits 32 unbounded
    store_tokens_per_cta: int = 1  # the same for v41_rope_quant_store
    index_key_warps: int = 4  # a warp per token: 1, 2, 4 or 8 tokens per CTA


DEFAULT_V41_SHAPES = V41Shapes()


@dataclass(frozen=True)
class V41Request:
    """What the static configuration of a V4.1 call depends on (dtypes as torch's names without
    the ``torch.`` prefix: ``"float32"``, ``"bfloat16"``)."""

    ratio: int  # 1 or 2
    layout: str | None = None  # the record (None: no store)
    entries_per_page: int = 1  # B
    store_align: int | None = None  # bytes every 4-channel store may assume; None: the aligned rows' (records: 16)
    kv_dtype: str = "bfloat16"
    score_dtype: str | None = None  # ratio 2
    state_dtype: str | None = None  # ratio 2
    block_size: int | None = None  # ratio 2
    ring: bool = False  # ratio 2
    weight_dtype: str = "bfloat16"
    latent: bool = True
    shapes: V41Shapes = DEFAULT_V41_SHAPES
    pdl: bool = True

    @property
    def record(self) -> V41RecordFormat | None:
        if self.layout is None:
            return None
        align = self.store_align
        if align is None and self.layout in V41_LAYOUTS:
            align = max(store_alignments(V41_LAYOUTS[self.layout]))
        return V41RecordFormat(self.layout, self.entries_per_page, 16 if align is None else align)


def record_store_align(layout: str, data_ptr: int, shape: tuple, strides: tuple, element_size: int) -> int:
    """The byte alignment of every 4-channel store of ``layout`` into a ``k_cache`` of this base,
    shape and strides (elements): 16 for the record layouts (validated pages); for ``bf16`` and
    ``fp8_per_tensor`` rows, 4 elements when the base and every stride of an extent above 1 allow
    it, else one element."""
    aligns = store_alignments(V41_LAYOUTS[layout])
    if len(aligns) == 1:
        return aligns[0]
    vector = 4 * element_size
    aligned = data_ptr % vector == 0 and all(
        extent <= 1 or (stride * element_size) % vector == 0 for extent, stride in zip(shape[:2], strides[:2]))
    return vector if aligned else element_size


# ---- static configurations -----------------------------------------------------------------------
def _compress_config(request: V41Request) -> V41CompressConfig:
    return V41CompressConfig(request.ratio, request.kv_dtype, request.weight_dtype, request.latent, request.record,
                             request.score_dtype, request.state_dtype, request.block_size, request.ring,
                             request.shapes.compress_tokens_per_cta, request.pdl,
                             request.shapes.ratio2_ctas_per_sm if request.ratio == 2 else None)


def _store_config(request: V41Request) -> V41StoreConfig:
    return V41StoreConfig(request.ratio, request.record, request.shapes.store_tokens_per_cta, request.pdl)


def _index_key_config(request: V41Request) -> V41IndexKeyConfig:
    return V41IndexKeyConfig(request.ratio, request.layout, request.entries_per_page, request.weight_dtype,
                             request.shapes.index_key_warps, request.pdl)


# ---- TVM-FFI argument lists ------------------------------------------------------------------------
def compress_arguments(kv, score, positions, kv_slot_mapping, state: tuple | None, weight, latent, store: tuple | None,
                       scalars: tuple) -> tuple:
    """:class:`..kernels.v41_compress.V41CompressKernel`'s arguments. ``state``: ratio 2's
    ``(token_to_req, slot_mapping, save_slot_mapping, query_start_loc, state_cache, block_table)``
    (None for ratio 1); ``store``: ``(cos_sin_cache, k_cache)`` (None: no record); ``scalars``:
    ``(eps, fp8_inv, ring_capacity)``."""
    token_to_req, slots, saves, query_start_loc, state_cache, block_table = state or (None,) * 6
    cos_sin, k_cache = store or (None, None)
    return (kv, score, positions, kv_slot_mapping, token_to_req, slots, saves, query_start_loc, state_cache,
            block_table, weight, latent, cos_sin, k_cache, *scalars)


def store_arguments(latent, positions, kv_slot_mapping, cos_sin_cache, k_cache, scalars: tuple) -> tuple:
    """:class:`..kernels.v41_store.V41StoreKernel`'s arguments; ``scalars``: ``(fp8_inv,)``."""
    return (latent, positions, kv_slot_mapping, cos_sin_cache, k_cache, *scalars)


def index_key_arguments(k_pre, positions, kv_slot_mapping, weight, cos_sin_cache, k_cache, scalars: tuple) -> tuple:
    """:class:`..kernels.v41_index_key.V41IndexKeyKernel`'s arguments; ``scalars``: ``(eps,)``."""
    return (k_pre, positions, kv_slot_mapping, weight, cos_sin_cache, k_cache, *scalars)


# ---- the registry ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class V41KernelPath:
    """One V4.1 kernel and the operations it runs."""

    name: str  # the compile cache's kernel name
    operations: tuple[str, ...]  # SPEC §14.7 operations
    configs: Callable[[V41Request], object]  # its static configuration for a call
    arguments: Callable[..., tuple]  # its TVM-FFI argument list


V41_PATHS = {path.name: path for path in (
    V41KernelPath("v41_compress", ("v41_compress_norm", "v41_compress_norm_rope_store"), _compress_config,
                  compress_arguments),
    V41KernelPath("v41_store", ("v41_rope_quant_store",), _store_config, store_arguments),
    V41KernelPath("v41_index_key", ("v41_index_key_store",), _index_key_config, index_key_arguments),
)}


def path_of(operation: str) -> V41KernelPath:
    """The path that runs a SPEC §14.7 operation."""
    return next(path for path in V41_PATHS.values() if operation in path.operations)


__all__ = ["DEFAULT_V41_SHAPES", "V41KernelPath", "V41Request", "V41Shapes", "V41_PATHS", "compress_arguments",
           "index_key_arguments", "path_of", "record_store_align", "store_arguments"]
