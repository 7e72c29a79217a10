"""The C128 split path's store kernel: the pooled vectors of :mod:`.split_pool` -> RMSNorm, RoPE,
quantization, store (:func:`.finish.finish_entry`, the fused kernel's finishing stage).

Grid ``ceil(T / token_run)``: program ``k`` reads the metadata of tokens ``k * token_run ..`` at once
(:func:`.window.run_activity`) and finishes each active one in token order. Inactive tokens write
nothing; their rows of ``pooled`` are never read.
"""


import triton
import triton.language as tl

from .finish import finish_entry
from .indexer_entry import ROWS as INDEXER_ROWS
from .kv_entry import BLOCKS
from .postprocess import rope_row
from .window import run_activity, take_next, token_activity


@triton.jit(do_not_specialize=["num_tokens", "token_run"])  # one compiled kernel for every T and run
def split_store_kernel(
    tokens,  # token_to_req int32 [T], positions, slot_mapping, kv_slot_mapping int64 [T]
    num_tokens,  # T
    token_run,  # tokens a program walks, 1 .. MAX_RUN
    pooled_ptr,  # fp32 [T, HEAD]: the active tokens' pooled vectors (split_pool_kernel)
    weight_ptr,  # fp32 [HEAD], or int16 [HEAD] of bf16 patterns when WEIGHT_BF16
    eps,  # fp32
    cos_sin_ptr,  # fp32 [max_pos, 64], row stride cos_sin_stride
    cos_sin_stride,
    cache_u8_ptr,  # uint8 view of k_cache: page bytes (flashmla_fp8, the indexer's), fp8 bytes; unused for bf16
    cache_i16_ptr,  # int16 view of k_cache: flashmla page bytes as int16, bf16 values; None for HEAD 128
    cache_page_stride,  # page layouts: the page stride in bytes; bf16/fp8_per_tensor: k_cache.stride(0)
    cache_entry_stride,  # bf16/fp8_per_tensor: k_cache.stride(1); flashmla_fp8: unused; None for HEAD 128
    entries_per_page,  # B
    fp8_scale,  # fp32 (fp8_per_tensor only); None for HEAD 128
    HEAD: tl.constexpr,  # 512, or the indexer's 128 (SPEC §12)
    RATIO: tl.constexpr,  # 128
    LAYOUT: tl.constexpr,  # HEAD 512: 0 flashmla_fp8, 1 bf16, 2 fp8_per_tensor; HEAD 128: 0 indexer_fp8, 1 indexer_mxfp4
    HADAMARD: tl.constexpr,  # HEAD 128: SPEC §12's rotation before quantizing
    WEIGHT_BF16: tl.constexpr,
    MAX_RUN: tl.constexpr,  # the largest token_run (a power of two)
):
    ROWS: tl.constexpr = BLOCKS if HEAD == 512 else INDEXER_ROWS
    first = tl.program_id(0).to(tl.int64) * token_run
    active, count = run_activity(first, token_run, num_tokens, tokens, RATIO, MAX_RUN)
    channels = tl.arange(0, ROWS)[:, None] * (HEAD // ROWS) + tl.arange(0, HEAD // ROWS)[None, :]
    for _ in range(count):
        offset, active = take_next(active, MAX_RUN)
        token = first + offset
        position, _, kv_slot, _ = token_activity(token, tokens, RATIO)
        x = tl.load(pooled_ptr + (token * HEAD + channels))
        finish_entry(x, (weight_ptr, eps), cos_sin_ptr + rope_row(position, RATIO) * cos_sin_stride, kv_slot,
                     cache_u8_ptr, cache_i16_ptr, cache_page_stride, cache_entry_stride, entries_per_page, fp8_scale,
                     HEAD, LAYOUT, HADAMARD, WEIGHT_BF16)
