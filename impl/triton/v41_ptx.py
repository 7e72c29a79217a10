"""PTX variants of DeepSeek-V4.1's Triton kernels (SPEC §14.7) for :mod:`.ptx`'s SPEC §2 rules.

Every compile-time option of every kernel appears in at least one variant: both ratios, ``kv``,
``score``, the state and the norm weight in fp32 and bf16, a paged state and a ring, the latent
written or not, each of the five records and no record (:func:`v41_compress_norm`), the store
kernel in every layout and the index key in both of its layouts. Each variant describes its
runtime arguments (tuples of Triton types, as the plans of :mod:`.v41` pass them; ``None``
arguments are constexprs) and its constexprs from the kernel's static configuration.
"""

from __future__ import annotations

from .ptx_variant import Variant
from .v41_kernels import CompressStatic, IndexKeyStatic, StoreStatic

V41_RECORDS = ("flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4")
V41_KERNELS = ("v41_compress", "v41_store", "v41_index_key")

#: (uint8 view, int16 view) pointer types of the cache group, by layout (:func:`.v41._cache_group`)
_CACHE_POINTERS = {"flashmla_fp8": ("*u8", "*i16"), "bf16": ("*i16", "*i16"), "fp8_per_tensor": ("*u8", "*u8"),
                   "v41_mxfp8": ("*u8", "*u8"), "v41_nvfp4": ("*u8", "*u8")}


def _values(bf16: bool) -> str:
    return "*i16" if bf16 else "*fp32"


def _cache(layout: str) -> tuple:
    return (*_CACHE_POINTERS[layout], "i32", "i32", "i32", "fp32")


def compress_signature(static: CompressStatic) -> tuple[dict, dict]:
    """(Triton type of each runtime argument, the arguments passed as None) of :func:`v41_compress_kernel`."""
    if static.ratio == 1:
        types = {"tokens": ("*i64", "*i64"), "inputs": (_values(static.kv_bf16), "i32")}
    else:
        types = {"tokens": ("*i64", "*i64", "*i32", "*i64", "*i64", "*i32"),
                 "inputs": (_values(static.kv_bf16), "i32", _values(static.score_bf16), "i32"),
                 "state": (_values(static.state_bf16), "i32", "i32", "*i32", "i32", "i32", "i32")}
    types["norm"] = (_values(static.weight_bf16), "fp32")
    if static.latent:
        types["latent"] = ("*i16", "i32")
    if static.layout is not None:
        types.update(rope=("*fp32", "i32"), cache=_cache(static.layout))
    nones = {name: None for name in ("state", "latent", "rope", "cache") if name not in types}
    return types, nones


def store_signature(static: StoreStatic) -> dict:
    return {"tokens": ("*i64", "*i64"), "latent": ("*i16", "i32"), "rope": ("*fp32", "i32"), "cache": _cache(static.layout)}


def index_key_signature(static: IndexKeyStatic) -> dict:
    return {"tokens": ("*i64", "*i64"), "k_pre": ("*i16", "i32"), "norm": (_values(static.weight_bf16), "fp32"),
            "rope": ("*fp32", "i32"), "cache": ("*u8", "i32", "i32")}


def compress_statics() -> list[CompressStatic]:
    """Every option of the compress kernel at least once."""
    out = []
    for layout in (None, *V41_RECORDS):  # every record (and none), both ratios, bf16 projections and weight
        out.append(CompressStatic(1, True, False, False, False, True, True, layout))
        out.append(CompressStatic(2, True, True, False, False, True, True, layout))
    out += [
        CompressStatic(1, False, False, False, False, False, True, "v41_nvfp4"),  # fp32 kv and weight
        CompressStatic(1, True, False, False, False, True, False, "v41_mxfp8"),  # no latent
        CompressStatic(2, False, False, False, False, False, True, "v41_nvfp4"),  # fp32 kv, score and weight
        CompressStatic(2, False, True, False, False, True, True, "v41_nvfp4"),  # mixed kv / score dtypes
        CompressStatic(2, True, True, True, False, True, True, "v41_nvfp4"),  # bf16 state
        CompressStatic(2, True, True, False, True, True, True, "v41_nvfp4"),  # a ring
        CompressStatic(2, False, False, True, True, True, False, "flashmla_fp8"),  # fp32 inputs into a bf16 ring, no latent
        CompressStatic(2, True, True, True, True, True, True, None),  # v41_compress_norm on a bf16 ring
    ]
    return out


def _variant(static, kernel: str, types: dict, nones: dict):
    """A :class:`.ptx_variant.Variant` from a static configuration (its launch options split off its
    constexprs)."""

    constants = static.constants()
    num_warps = constants.pop("num_warps")
    constants.pop("enable_fp_fusion")  # every launch passes False; ptx._compile does too
    return Variant(static.name, kernel, {**constants, **nones}, types, num_warps, False)


def variants() -> list:
    """The :class:`.ptx_variant.Variant` of every V4.1 configuration above."""
    out = [_variant(static, "v41_compress", *compress_signature(static)) for static in compress_statics()]
    for ratio in (1, 2):
        for layout in V41_RECORDS:
            static = StoreStatic(ratio, layout)
            out.append(_variant(static, "v41_store", store_signature(static), {}))
        for layout in ("indexer_fp8", "indexer_mxfp4"):
            for weight_bf16 in (True, False):
                static = IndexKeyStatic(ratio, layout, weight_bf16)
                out.append(_variant(static, "v41_index_key", index_key_signature(static), {}))
    return out


def kernel(name: str):
    """The jitted kernel of a variant's ``kernel`` field."""
    from . import v41_kernels

    return {"v41_compress": v41_kernels.v41_compress_kernel, "v41_store": v41_kernels.v41_rope_quant_store_kernel,
            "v41_index_key": v41_kernels.v41_index_key_kernel}[name]
