"""PTX variants of DeepSeek-V4.1's CuTe DSL kernels (SPEC §14.7) for :mod:`.ptx`'s SPEC §2 rules.

Every compile-time option of every kernel appears in at least one variant, as in the Triton
family's list (``impl/triton/v41_ptx.py``): both ratios; ``kv``, ``score``, the state and the
norm weight in fp32 and bf16; a paged state and a ring; the latent written or not; each of the
five records and no record (``v41_compress_norm``); the ``bf16`` and ``fp8_per_tensor`` rows
with aligned and unaligned stores; the store kernel in every layout; ratio 2 with and without
its launch bound; the index key in both of its layouts with both weight dtypes; every thread
mapping; PDL on (the calls' default) and off.
"""

from __future__ import annotations

from typing import Iterator

from .host.v41_paths import V41_PATHS, V41Request, V41Shapes

V41_RECORDS = ("flashmla_fp8", "bf16", "fp8_per_tensor", "v41_mxfp8", "v41_nvfp4")
INDEX_KEY_LAYOUTS = ("indexer_fp8", "indexer_mxfp4")
B = 64  # entries per page of the production-like variants
F32, BF16 = "float32", "bfloat16"
KERNELS = tuple(V41_PATHS)  # v41_compress, v41_store, v41_index_key


def _ratio2(kv=BF16, score=BF16, state=F32, block_size=8, ring=False) -> dict:
    return dict(ratio=2, kv_dtype=kv, score_dtype=score, state_dtype=state, block_size=block_size, ring=ring)


def _compress_requests() -> list[V41Request]:
    ratio1 = dict(ratio=1, kv_dtype=BF16)
    out = []
    for layout in (None, *V41_RECORDS):  # every record (and none), both ratios, bf16 projections and weight
        out.append(V41Request(layout=layout, entries_per_page=B, **ratio1))
        out.append(V41Request(layout=layout, entries_per_page=B, **_ratio2()))
    out += [
        V41Request(layout="v41_nvfp4", entries_per_page=B, ratio=1, kv_dtype=F32, weight_dtype=F32),  # fp32 kv, weight
        V41Request(layout="v41_mxfp8", entries_per_page=B, latent=False, **ratio1),  # no latent
        V41Request(layout="bf16", entries_per_page=7, store_align=2, **ratio1),  # unaligned rows
        V41Request(layout="fp8_per_tensor", entries_per_page=7, store_align=1, **ratio1),
        V41Request(layout="v41_nvfp4", entries_per_page=B, weight_dtype=F32, **_ratio2(F32, F32)),  # fp32 inputs
        V41Request(layout="v41_nvfp4", entries_per_page=B, **_ratio2(F32, BF16)),  # mixed kv / score dtypes
        V41Request(layout="v41_nvfp4", entries_per_page=B, **_ratio2(state=BF16)),  # bf16 state
        V41Request(layout="v41_nvfp4", entries_per_page=B, **_ratio2(block_size=16, ring=True)),  # vLLM's ring
        V41Request(layout="flashmla_fp8", entries_per_page=B, latent=False,
                   **_ratio2(F32, F32, BF16, block_size=2, ring=True)),  # fp32 inputs into a bf16 ring, no latent
        V41Request(layout=None, **_ratio2(state=BF16, block_size=2, ring=True)),  # the reference's ring of 2
        V41Request(layout="v41_nvfp4", entries_per_page=1, **_ratio2(block_size=3)),  # odd bs, B = 1
        V41Request(layout="v41_mxfp8", entries_per_page=B, shapes=V41Shapes(compress_tokens_per_cta=2), **ratio1),
        V41Request(layout="v41_nvfp4", entries_per_page=B, shapes=V41Shapes(compress_tokens_per_cta=4), **_ratio2()),
        V41Request(layout="v41_nvfp4", entries_per_page=B, pdl=False, **_ratio2()),
        V41Request(layout="v41_nvfp4", entries_per_page=B, shapes=V41Shapes(ratio2_ctas_per_sm=None), **_ratio2()),
    ]
    return out


def _store_requests() -> list[V41Request]:
    out = [V41Request(ratio=ratio, layout=layout, entries_per_page=B) for ratio in (1, 2) for layout in V41_RECORDS]
    out += [
        V41Request(ratio=1, layout="bf16", entries_per_page=7, store_align=2),
        V41Request(ratio=2, layout="fp8_per_tensor", entries_per_page=7, store_align=1),
        V41Request(ratio=2, layout="v41_nvfp4", entries_per_page=B, shapes=V41Shapes(store_tokens_per_cta=4)),
        V41Request(ratio=1, layout="v41_mxfp8", entries_per_page=B, pdl=False),
    ]
    return out


def _index_key_requests() -> list[V41Request]:
    out = [V41Request(ratio=ratio, layout=layout, entries_per_page=B, weight_dtype=weight)
           for ratio in (1, 2) for layout in INDEX_KEY_LAYOUTS for weight in (BF16, F32)]
    out += [
        V41Request(ratio=2, layout="indexer_mxfp4", entries_per_page=3, shapes=V41Shapes(index_key_warps=1)),
        V41Request(ratio=1, layout="indexer_fp8", entries_per_page=B, shapes=V41Shapes(index_key_warps=8), pdl=False),
    ]
    return out


def kernel_configs() -> Iterator[tuple[str, object]]:
    """``(kernel, static config)`` of every V4.1 variant, without duplicates."""
    requests = {"v41_compress": _compress_requests(), "v41_store": _store_requests(),
                "v41_index_key": _index_key_requests()}
    seen = {}
    for kernel, listed in requests.items():
        for request in listed:
            seen.setdefault((kernel, V41_PATHS[kernel].configs(request)))
    return iter(seen)


def streams_rows(kernel: str, config) -> bool:
    """Whether a V4.1 variant reads fp32 rows (``kv``, ``score`` or the state), which the PTX rules
    want in 128-bit loads; bf16 rows are 8 bytes a thread, the latent and ``k_pre`` too."""
    if kernel != "v41_compress":
        return False
    return F32 in (config.kv_dtype, config.score_dtype, config.state_dtype)
