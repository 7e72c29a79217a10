"""The fused ``compress_norm_rope_store`` kernel of both head widths: one launch, one program per
token (C4, and C128 with a :class:`.config.FusedConfig`; C128's default is the split path,
:mod:`.split_pool` and :mod:`.split_store`).

Each program checks SPEC §5's activity rule and returns at once for inactive tokens (they
write nothing). An active token's program runs the stages of ``spec.operator``:

1. the window (:func:`.window.window_rows`): its W window rows resolved once: position, validity,
   ``block_table`` entry and the int64 element offset of the row's kv half (C4: rows 0..3 read
   channels 0..H-1 of kv and score, rows 4..7 channels H..2H-1);
2. pooling (:mod:`.pooling`): the ``HEAD`` channels in ``HEAD / BLOCK_C`` channel tiles of
   ``[W, BLOCK_C]``, the pooled tiles collected in a ``[HEAD/BLOCK_C, BLOCK_C]`` register tensor
   (the RMSNorm needs all channels before anything can be stored);
3. the finishing stage (:func:`.finish.finish_entry`): RMSNorm, then by head RoPE, quantization
   and the store of the 512-wide entry in one of three layouts, or of the indexer's 128-wide
   entry (SPEC §12: RoPE on channels 64..127, the optional Hadamard rotation, FP8 or MXFP4).

Defaults: 512-wide C4 two ``[8, 256]`` tiles, C128 a runtime loop over eight ``[128, 64]``
tiles; the indexer's in :mod:`.config`. Argument shapes and dtypes are documented on the
kernel; all offsets are int64.
"""


import triton
import triton.language as tl

from .finish import finish_entry, layout_code
from .indexer_entry import ROWS as INDEXER_ROWS
from .kv_entry import BLOCKS
from .pooling import pool_window_tiles
from .postprocess import rope_row
from .rows import PAGED_FP32_ROWS, RowFormat
from .window import token_activity, window_rows


@triton.jit
def compress_norm_rope_store_kernel(
    state_ptr,  # fp32 [num_state_blocks, bs, 2*SW] (int16 bf16 patterns with ROW_FORMAT.state_bf16), row strides below
    state_block_stride16b,  # state_cache.stride(0) in 16-byte units (// 4 fp32, // 8 bf16)
    state_row_stride16b,  # state_cache.stride(1) in 16-byte units
    tokens,  # the per-token metadata, a tuple: token_to_req int32 [T], positions, slot_mapping, kv_slot_mapping int64 [T]
    block_table_ptr,  # int32 [num_reqs, max_blocks], row stride block_table_stride
    block_table_stride,
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
    ape,  # SPEC §13.2/§13.4: (ape_ptr fp32 [r, SW], ape.stride(0)); None unless ape_at_compress or chunk
    chunk,  # SPEC §13.4: (kv_ptr fp32 [T, SW], kv row stride // 4, score_ptr fp32 [T, SW], score row stride // 4,
            # query_start_loc_ptr int32 [num_reqs + 1]); None unless ROW_FORMAT.chunk
    HEAD: tl.constexpr,  # 512, or the indexer's 128 (SPEC §12)
    RATIO: tl.constexpr,  # 4 or 128
    BLOCK_SIZE: tl.constexpr,  # bs, rows per state block
    LAYOUT: tl.constexpr,  # HEAD 512: 0 flashmla_fp8, 1 bf16, 2 fp8_per_tensor; HEAD 128: 0 indexer_fp8, 1 indexer_mxfp4
    HADAMARD: tl.constexpr,  # HEAD 128: SPEC §12's rotation before quantizing
    WEIGHT_BF16: tl.constexpr,
    ROW_FORMAT: tl.constexpr,  # SPEC §13's state format and row sources, a .rows.RowFormat
    BLOCK_C: tl.constexpr,  # channels per pooled tile (divides HEAD)
    UNROLL_TILES: tl.constexpr,  # static unrolled tile loop (True) or a runtime loop (False)
    TILE_STAGES: tl.constexpr,  # software-pipelining stages of the runtime tile loop
    LANE_BITS: tl.constexpr,
    WARP_BITS: tl.constexpr,
    REG_BITS: tl.constexpr,
):
    token = tl.program_id(0)
    position, request, kv_slot, active = token_activity(token, tokens, RATIO)
    if active:
        W: tl.constexpr = (2 if RATIO == 4 else 1) * RATIO
        rows = window_rows((state_ptr, state_block_stride16b, state_row_stride16b),
                           (block_table_ptr, block_table_stride), ape, chunk, tokens, request, position, RATIO,
                           BLOCK_SIZE, HEAD, ROW_FORMAT, LANE_BITS, WARP_BITS, REG_BITS)
        pooled = pool_window_tiles(rows, position >= W - 1, HEAD, RATIO, BLOCK_C, UNROLL_TILES, TILE_STAGES,
                                   ROW_FORMAT, LANE_BITS, WARP_BITS, REG_BITS)
        ROWS: tl.constexpr = BLOCKS if HEAD == 512 else INDEXER_ROWS
        finish_entry(tl.reshape(pooled, (ROWS, HEAD // ROWS)), (weight_ptr, eps),
                     cos_sin_ptr + rope_row(position, RATIO) * cos_sin_stride, kv_slot, cache_u8_ptr, cache_i16_ptr,
                     cache_page_stride, cache_entry_stride, entries_per_page, fp8_scale, HEAD, LAYOUT, HADAMARD,
                     WEIGHT_BF16)


def kernel_constants(head_dim: int, ratio: int, block_size: int, layout: str, hadamard: bool, weight_bf16: bool,
                     knobs, plan, rows: RowFormat = PAGED_FP32_ROWS) -> dict:
    """The constexpr arguments of :func:`compress_norm_rope_store_kernel` for one static
    configuration (the launch plans and the PTX variants alike): ``knobs`` a
    :class:`.config.FusedConfig`, ``plan`` its :class:`.pooling.RowPlan` for the window, ``rows``
    SPEC §13's state format and row sources."""
    return dict(
        HEAD=head_dim, RATIO=ratio, BLOCK_SIZE=block_size,
        LAYOUT=layout_code(head_dim, layout), HADAMARD=hadamard,
        WEIGHT_BF16=weight_bf16, ROW_FORMAT=rows, BLOCK_C=knobs.block_c, UNROLL_TILES=knobs.unroll_tiles,
        TILE_STAGES=knobs.tile_stages,
        LANE_BITS=plan.lane_bits, WARP_BITS=plan.warp_bits, REG_BITS=plan.reg_bits,
    )
