"""SPEC §6-§7 (and §12 at width 128) in Triton device code from a token's pooled vector: the
finishing stage every compress kernel ends with (the fused kernel and the split path's store
kernel).

RMSNorm, then by head: the 512-wide entry's RoPE, quantization and store in one of three layouts
(:mod:`.kv_entry`), or the indexer's (:mod:`.indexer_entry`: RoPE on channels 64..127, the
optional Hadamard rotation, FP8 or MXFP4).
"""


import triton
import triton.language as tl

from .indexer_entry import INDEXER_LAYOUT_CODES, LOG2_INDEXER_HEAD, ROWS as INDEXER_ROWS, hadamard_rotate, indexer_rope, store_indexer_entry
from .kv_entry import BLOCKS, LAYOUT_CODES, LOG2_HEAD_DIM, rope_rotate, store_entry
from .postprocess import load_norm_weight, rms_norm


def layout_code(head_dim: int, layout: str) -> int:
    """The ``LAYOUT`` constexpr of :func:`finish_entry` for a layout name (per head width)."""
    return (LAYOUT_CODES if head_dim == 512 else INDEXER_LAYOUT_CODES)[layout]


@triton.jit
def finish_entry(
    x,  # fp32 [ROWS, HEAD / ROWS]: the pooled vector, row-major = channel order (512: [8, 64], the seven NoPE
        # quantization blocks then RoPE; 128: [4, 32], the MXFP4 blocks, RoPE on rows 2 and 3)
    norm,  # (weight_ptr: fp32 [HEAD], or int16 [HEAD] bf16 patterns when WEIGHT_BF16; eps fp32)
    cos_sin_row_ptr,  # fp32 [64]: the entry's cos_sin_cache row (postprocess.rope_row)
    kv_slot,  # int64: the entry's slot in k_cache
    cache_u8_ptr,  # uint8 view of k_cache (page bytes or fp8 codes); unused for bf16
    cache_i16_ptr,  # int16 view of k_cache (flashmla page bytes, bf16 values); None for HEAD 128
    cache_page_stride,  # page layouts: the page stride in bytes; bf16/fp8_per_tensor: k_cache.stride(0)
    cache_entry_stride,  # bf16/fp8_per_tensor: k_cache.stride(1); flashmla_fp8: unused; None for HEAD 128
    entries_per_page,  # B
    fp8_scale,  # fp32 (fp8_per_tensor only); None for HEAD 128
    HEAD: tl.constexpr,  # 512, or the indexer's 128 (SPEC §12)
    LAYOUT: tl.constexpr,  # HEAD 512: 0 flashmla_fp8, 1 bf16, 2 fp8_per_tensor; HEAD 128: 0 indexer_fp8, 1 indexer_mxfp4
    HADAMARD: tl.constexpr,  # HEAD 128: SPEC §12's rotation before quantizing
    WEIGHT_BF16: tl.constexpr,
):
    """RMSNorm, RoPE, quantize and store one token's entry (SPEC §6-§7, §12) from its pooled vector."""
    ROWS: tl.constexpr = BLOCKS if HEAD == 512 else INDEXER_ROWS
    LOG2_HEAD: tl.constexpr = LOG2_HEAD_DIM if HEAD == 512 else LOG2_INDEXER_HEAD
    weight_ptr, eps = norm
    y = rms_norm(x, load_norm_weight(weight_ptr, ROWS, HEAD // ROWS, WEIGHT_BF16), eps, HEAD, LOG2_HEAD)
    if HEAD == 512:
        rope = rope_rotate(y, cos_sin_row_ptr)
        store_entry(y, rope, cache_u8_ptr, cache_i16_ptr, kv_slot, entries_per_page, cache_page_stride,
                    cache_entry_stride, fp8_scale, LAYOUT)
    else:
        z = indexer_rope(y, cos_sin_row_ptr)
        if HADAMARD:
            z = hadamard_rotate(z)
        store_indexer_entry(z, cache_u8_ptr, kv_slot, entries_per_page, cache_page_stride, LAYOUT)
