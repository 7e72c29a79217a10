"""DeepSeek-V4.1's Triton kernels (SPEC §14.7), one program per token, and their static configurations.

- :func:`v41_compress_kernel`: ``v41_compress_norm`` and ``v41_compress_norm_rope_store`` in one
  launch: activity (SPEC §14.3), the pooled vector (ratio 1: ``kv``; ratio 2: its two rows from
  the chunk or the state, :mod:`.v41_latent`), the norm and the bf16 latent (written when
  ``latent`` is given), then, when a cache is given, RoPE and the record (:mod:`.v41_records`);
  ratio 2 then saves the step's rows, after the compress (:mod:`.v41_save`);
- :func:`v41_rope_quant_store_kernel`: ``v41_rope_quant_store`` (SPEC §14.4-§14.5) from the latent;
- :func:`v41_index_key_kernel`: ``v41_index_key_store`` (SPEC §14.6).

Inactive tokens write nothing (a ratio-2 token may still save its row). Each static
configuration is a frozen dataclass whose :meth:`constants` are the kernel's constexpr arguments
and launch options (``enable_fp_fusion=False``: SPEC §2, no FMA); the launch plans and the PTX
variants share them. All offsets are int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from .indexer_entry import INDEXER_LAYOUT_CODES, store_indexer_entry
from .postprocess import rope_row
from .v41_index_key import index_key_entry
from .v41_latent import latent_of, load_latent, pooled_ratio1, pooled_ratio2, store_latent
from .v41_records import LAYOUT_CODES, store_record
from .v41_rows import entry_channels, save_row
from .v41_save import defers_to_first, save_deferred


@triton.jit
def latent_rope_store(x, token, position, kv_slot, norm, latent, rope, cache, channels, RATIO: tl.constexpr,
                      WEIGHT_BF16: tl.constexpr, LAYOUT: tl.constexpr):
    """An active token's stages after the pooling: the latent ``l = bf16(RMSNorm(bf16(x)))``,
    written to ``latent`` when it is given, then (when ``cache`` is given) RoPE at
    ``cp = (p // r) * r`` and the record of ``z`` at ``kv_slot``."""
    l8 = latent_of(x, norm, WEIGHT_BF16)
    if latent is not None:
        store_latent(latent, token, channels, l8)
    if cache is not None:
        cos_sin_ptr, cos_sin_stride = rope
        store_record(l8, cos_sin_ptr + rope_row(position, RATIO) * cos_sin_stride, cache, kv_slot, LAYOUT)


@triton.jit
def v41_compress_kernel(
    tokens,  # ratio 1: (positions int64 [T], kv_slot_mapping int64 [T]); ratio 2: the six arrays of .v41_save
    inputs,  # ratio 1: (kv_ptr, kv_stride16); ratio 2: (kv_ptr, kv_stride16, score_ptr, score_stride16), fp32 or int16 (bf16) [T, 512]
    state,  # ratio 2: .v41_rows' state group (fp32 or int16 (bf16) [num_state_blocks, bs, 1024], block table, bs, C); ratio 1: None
    norm,  # (weight_ptr fp32 or int16 (bf16) [512], eps fp32)
    latent,  # (latent_ptr int16 [T, 512] of bf16 patterns, latent_stride16), or None: not written
    rope,  # (cos_sin_ptr fp32 [max_pos, 64], cos_sin_stride), or None: no store
    cache,  # .v41_records' cache group, or None: no store (v41_compress_norm)
    RATIO: tl.constexpr,  # 1 or 2
    KV_BF16: tl.constexpr,
    SCORE_BF16: tl.constexpr,  # ratio 2
    STATE_BF16: tl.constexpr,  # ratio 2: a bf16 state (SPEC §13.1)
    RING: tl.constexpr,  # ratio 2: a ring of ring_capacity rows per request (SPEC §13.3), else paged
    WEIGHT_BF16: tl.constexpr,
    LAYOUT: tl.constexpr,  # .v41_records.LAYOUT_CODES (read when cache is given)
):
    token = tl.program_id(0).to(tl.int64)
    channels = entry_channels()
    if RATIO == 1:
        positions_ptr, kv_slots_ptr = tokens
        kv_slot = tl.load(kv_slots_ptr + token)
        if kv_slot >= 0:  # every position is a boundary
            position = tl.load(positions_ptr + token)
            x = pooled_ratio1(inputs, token, channels, KV_BF16)
            latent_rope_store(x, token, position, kv_slot, norm, latent, rope, cache, channels, RATIO, WEIGHT_BF16,
                              LAYOUT)
    else:
        positions_ptr, kv_slots_ptr, token_to_req_ptr, slots_ptr, saves_ptr, query_start_loc_ptr = tokens
        position = tl.load(positions_ptr + token)
        kv_slot = tl.load(kv_slots_ptr + token)
        save_slot = tl.load(saves_ptr + token)
        active = (kv_slot >= 0) & (tl.load(slots_ptr + token) >= 0) & ((position + 1) % 2 == 0)
        if active | (save_slot >= 0):  # token_to_req is read only for tokens that pool or save
            request = tl.load(token_to_req_ptr + token).to(tl.int64)
            first = tl.load(query_start_loc_ptr + request).to(tl.int64)
            chunk_start = tl.load(positions_ptr + first)
            if active:
                x = pooled_ratio2(inputs, state, token, position, request, first, chunk_start, channels, KV_BF16,
                                  SCORE_BF16, STATE_BF16, RING)
                latent_rope_store(x, token, position, kv_slot, norm, latent, rope, cache, channels, RATIO, WEIGHT_BF16,
                                  LAYOUT)
            if save_slot >= 0:
                if defers_to_first(tokens, state, token, save_slot, request, first, chunk_start, RING) == 0:
                    save_row(inputs, state, token, save_slot, channels, KV_BF16, SCORE_BF16, STATE_BF16)
            if active & (token == first):
                save_deferred(tokens, inputs, state, request, first, chunk_start, channels, KV_BF16, SCORE_BF16,
                              STATE_BF16, RING)


@triton.jit
def v41_rope_quant_store_kernel(
    tokens,  # (positions int64 [T], kv_slot_mapping int64 [T])
    latent,  # (latent_ptr int16 [T, 512] of bf16 patterns, latent_stride16)
    rope,  # (cos_sin_ptr fp32 [max_pos, 64], cos_sin_stride)
    cache,  # .v41_records' cache group
    RATIO: tl.constexpr,  # 1 or 2
    LAYOUT: tl.constexpr,  # .v41_records.LAYOUT_CODES
):
    token = tl.program_id(0).to(tl.int64)
    positions_ptr, kv_slots_ptr = tokens
    kv_slot = tl.load(kv_slots_ptr + token)
    position = tl.load(positions_ptr + token)
    if (kv_slot >= 0) & ((position + 1) % RATIO == 0):
        cos_sin_ptr, cos_sin_stride = rope
        l8 = load_latent(latent, token, entry_channels())
        store_record(l8, cos_sin_ptr + rope_row(position, RATIO) * cos_sin_stride, cache, kv_slot, LAYOUT)


@triton.jit
def v41_index_key_kernel(
    tokens,  # (positions int64 [T], kv_slot_mapping int64 [T]: the slot in the indexer's cache)
    k_pre,  # (k_pre_ptr int16 [T, 128] of bf16 patterns, k_pre_stride in elements)
    norm,  # (weight_ptr fp32 or int16 (bf16) [128], eps fp32)
    rope,  # (cos_sin_ptr fp32 [max_pos, 64], cos_sin_stride)
    cache,  # (cache_ptr uint8 page bytes [num_pages, page_stride], page_stride in bytes, entries_per_page)
    RATIO: tl.constexpr,  # 1 or 2
    WEIGHT_BF16: tl.constexpr,
    LAYOUT: tl.constexpr,  # 0 indexer_fp8, 1 indexer_mxfp4
):
    token = tl.program_id(0).to(tl.int64)
    positions_ptr, kv_slots_ptr = tokens
    kv_slot = tl.load(kv_slots_ptr + token)
    position = tl.load(positions_ptr + token)
    if (kv_slot >= 0) & ((position + 1) % RATIO == 0):
        cos_sin_ptr, cos_sin_stride = rope
        cache_ptr, page_stride, entries_per_page = cache
        z4 = index_key_entry(k_pre, token, norm, cos_sin_ptr + rope_row(position, RATIO) * cos_sin_stride, WEIGHT_BF16)
        store_indexer_entry(z4, cache_ptr, kv_slot, entries_per_page, page_stride, LAYOUT)


# ---- static configurations -------------------------------------------------------------------------------
DEFAULT_NUM_WARPS = 4  # a 512-wide entry: 4 fp32 a thread
INDEX_KEY_NUM_WARPS = 1  # a 128-wide key


def _launch_options(num_warps: int) -> dict:
    return dict(num_warps=num_warps, enable_fp_fusion=False)


@dataclass(frozen=True)
class CompressStatic:
    """The compile-time options of :func:`v41_compress_kernel` (one per argument layout)."""

    ratio: int  # 1 or 2
    kv_bf16: bool
    score_bf16: bool  # ratio 2 (False for ratio 1)
    state_bf16: bool  # ratio 2 (False for ratio 1)
    ring: bool  # ratio 2 (False for ratio 1)
    weight_bf16: bool
    latent: bool  # write the latent
    layout: str | None  # the record's layout; None: no store (v41_compress_norm)
    num_warps: int = DEFAULT_NUM_WARPS

    def __post_init__(self):
        if self.ratio not in (1, 2):
            raise ValueError(f"ratio: expected 1 or 2, got {self.ratio!r}")
        if self.ratio == 1 and (self.score_bf16 or self.state_bf16 or self.ring):
            raise ValueError("score_bf16, state_bf16, ring: expected False for ratio 1 (no score, no state), got True")
        if self.layout is not None and self.layout not in LAYOUT_CODES:
            raise ValueError(f"layout: expected None or one of {tuple(LAYOUT_CODES)}, got {self.layout!r}")
        if not self.latent and self.layout is None:
            raise ValueError("latent, layout: expected a latent or a layout (a call that writes something), got neither")

    def constants(self) -> dict:
        """Constexpr arguments and launch options."""
        return dict(RATIO=self.ratio, KV_BF16=self.kv_bf16, SCORE_BF16=self.score_bf16, STATE_BF16=self.state_bf16,
                    RING=self.ring, WEIGHT_BF16=self.weight_bf16, LAYOUT=LAYOUT_CODES.get(self.layout, 0),
                    **_launch_options(self.num_warps))

    @property
    def name(self) -> str:
        inputs = f"kv{'bf16' if self.kv_bf16 else 'f32'}"
        if self.ratio == 2:
            inputs += (f"_score{'bf16' if self.score_bf16 else 'f32'}_state{'bf16' if self.state_bf16 else 'f32'}"
                       f"_{'ring' if self.ring else 'paged'}")
        store = self.layout or "nostore"
        return (f"v41_compress_r{self.ratio}_{inputs}_{'bf16w' if self.weight_bf16 else 'f32w'}"
                f"_{'latent' if self.latent else 'nolatent'}_{store}_w{self.num_warps}")


@dataclass(frozen=True)
class StoreStatic:
    """The compile-time options of :func:`v41_rope_quant_store_kernel`."""

    ratio: int
    layout: str
    num_warps: int = DEFAULT_NUM_WARPS

    def constants(self) -> dict:
        return dict(RATIO=self.ratio, LAYOUT=LAYOUT_CODES[self.layout], **_launch_options(self.num_warps))

    @property
    def name(self) -> str:
        return f"v41_store_r{self.ratio}_{self.layout}_w{self.num_warps}"


@dataclass(frozen=True)
class IndexKeyStatic:
    """The compile-time options of :func:`v41_index_key_kernel`."""

    ratio: int
    layout: str  # indexer_fp8 or indexer_mxfp4
    weight_bf16: bool
    num_warps: int = INDEX_KEY_NUM_WARPS

    def constants(self) -> dict:
        return dict(RATIO=self.ratio, WEIGHT_BF16=self.weight_bf16, LAYOUT=INDEXER_LAYOUT_CODES[self.layout],
                    **_launch_options(self.num_warps))

    @property
    def name(self) -> str:
        return f"v41_index_key_r{self.ratio}_{self.layout}_{'bf16w' if self.weight_bf16 else 'f32w'}_w{self.num_warps}"
