"""SPEC §7/§12: the compressed-cache layouts and the store of one entry per active token.

Three layouts for the 512-wide head (``flashmla_fp8``, ``bf16``, ``fp8_per_tensor``) and two
for the indexer's 128-wide head (``indexer_fp8``, ``indexer_mxfp4``).

Each ``store_*`` function writes only the bytes SPEC §7 names for the given slots; every
other byte of ``k_cache`` keeps its value.
"""

from __future__ import annotations

import numpy as np

from .arithmetic import div, mul
from .constants import DATA_RECORD_BYTES, ENTRY_BYTES, NOPE_DIM, NUM_QUANT_BLOCKS, SCALE_RECORD_BYTES
from .entry_layout import FLASHMLA_FP8, INDEXER_FP8, INDEXER_MXFP4, EntryLayout
from .formats import bf16, bf16_bits, bf16_to_f32, e4m3_bits
from .indexer import IndexerFp8, IndexerMxfp4
from .postprocess import QuantizedNope

F32 = np.float32


def page_and_offset(slots: np.ndarray, entries_per_page: int) -> tuple[np.ndarray, np.ndarray]:
    """``page = slot // B`` and ``o = slot mod B``."""
    return slots // entries_per_page, slots % entries_per_page


def flashmla_page_bytes(k_cache: np.ndarray) -> np.ndarray:
    """A ``uint8 [num_pages, B*584]`` view of the pages' bytes (the same memory as ``k_cache``).

    A page holds ``B`` data records of 576 bytes, then ``B`` scale records of 8 bytes; the
    rest of the page stride is never touched.
    """
    return page_bytes(k_cache, ENTRY_BYTES)


def page_bytes(k_cache: np.ndarray, entry_bytes: int) -> np.ndarray:
    """A ``uint8 [num_pages, B*E]`` view of the pages of a paged layout with ``E``-byte entries."""
    num_pages, entries = k_cache.shape[0], k_cache.shape[1]
    return np.lib.stride_tricks.as_strided(
        k_cache, shape=(num_pages, entries * entry_bytes), strides=(k_cache.strides[0], 1), writeable=True
    )


def store_records(k_cache: np.ndarray, layout: EntryLayout, slots: np.ndarray, data: np.ndarray, scales: np.ndarray) -> None:
    """Write entry ``o``'s data record and scale record where ``layout`` puts them: page bytes
    ``o * data_bytes`` and ``B * data_bytes + o * scale_bytes`` (split), or ``o * E`` and
    ``o * E + data_bytes`` (interleaved). ``data``/``scales``: uint8 ``[n, record bytes]``."""
    entries = k_cache.shape[1]
    pages = page_bytes(k_cache, layout.entry_bytes)
    page, offset = page_and_offset(slots, entries)
    data_columns = layout.data_offset(offset, entries)[:, None] + np.arange(layout.data_bytes)
    scale_columns = layout.scale_offset(offset, entries)[:, None] + np.arange(layout.scale_bytes)
    pages[page[:, None], data_columns] = data
    pages[page[:, None], scale_columns] = scales


def data_record_offset(offsets: np.ndarray) -> np.ndarray:
    """Byte offset in its page of entry ``o``'s data record: ``o * 576``."""
    return offsets * DATA_RECORD_BYTES


def scale_record_offset(offsets: np.ndarray, entries_per_page: int) -> np.ndarray:
    """Byte offset in its page of entry ``o``'s scale record: ``B * 576 + o * 8``."""
    return entries_per_page * DATA_RECORD_BYTES + offsets * SCALE_RECORD_BYTES


def flashmla_entry_bytes(nope: QuantizedNope, rope_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 576-byte data records and 8-byte scale records of ``n`` entries.

    Data: 448 E4M3 bytes, then the 64 RoPE values as little-endian bf16 (128 bytes).
    Scale: the 7 UE8M0 bytes of blocks 0..6, then one pad byte 0.
    """
    n = rope_bits.shape[0]
    rope_bytes = rope_bits.astype("<u2").view(np.uint8).reshape(n, -1)
    data = np.concatenate([nope.codes, rope_bytes], axis=1)
    scales = np.concatenate([nope.scale_bytes, np.zeros((n, SCALE_RECORD_BYTES - NUM_QUANT_BLOCKS), np.uint8)], axis=1)
    return data, scales


def store_flashmla_fp8(k_cache: np.ndarray, slots: np.ndarray, nope: QuantizedNope, rope_bits: np.ndarray) -> None:
    """``flashmla_fp8``: data record at ``page*stride0 + o*576``, scales at ``page*stride0 + B*576 + o*8``."""
    store_records(k_cache, FLASHMLA_FP8, slots, *flashmla_entry_bytes(nope, rope_bits))


def store_bf16(k_cache: np.ndarray, slots: np.ndarray, y: np.ndarray, rope_bits: np.ndarray) -> None:
    """``bf16``: entry = ``bf16(y[0:448])`` then the 64 bf16 RoPE values (uint16 patterns)."""
    page, offset = page_and_offset(slots, k_cache.shape[1])
    k_cache[page, offset] = np.concatenate([bf16_bits(y[:, :NOPE_DIM]), rope_bits], axis=1)


def store_fp8_per_tensor(k_cache: np.ndarray, slots: np.ndarray, y: np.ndarray, rope_bits: np.ndarray, fp8_scale: np.float32) -> None:
    """``fp8_per_tensor``: channel ``d`` = ``e4m3(mul(z[d], div(1, fp8_scale)))`` with ``z`` the bf16 value.

    ``z`` is ``bf16(y[d])`` for NoPE channels and the stored bf16 RoPE value for RoPE.
    """
    inv = div(F32(1.0), F32(fp8_scale))
    z = np.concatenate([bf16(y[:, :NOPE_DIM]), bf16_to_f32(rope_bits)], axis=1)
    page, offset = page_and_offset(slots, k_cache.shape[1])
    k_cache[page, offset] = e4m3_bits(mul(z, inv))


def store_indexer_fp8(k_cache: np.ndarray, slots: np.ndarray, entries: IndexerFp8) -> None:
    """``indexer_fp8`` (E = 132): 128 E4M3 bytes at ``page*stride0 + o*128``, the binary32
    scale ``2^k`` little-endian at ``page*stride0 + B*128 + o*4``."""
    scale_bytes = entries.scale.astype("<f4").view(np.uint8).reshape(-1, INDEXER_FP8.scale_bytes)
    store_records(k_cache, INDEXER_FP8, slots, entries.codes, scale_bytes)


def store_indexer_mxfp4(k_cache: np.ndarray, slots: np.ndarray, entries: IndexerMxfp4) -> None:
    """``indexer_mxfp4`` (E = 68): 64 packed E2M1 bytes at ``page*stride0 + o*64``, the four
    UE8M0 bytes at ``page*stride0 + B*64 + o*4``."""
    store_records(k_cache, INDEXER_MXFP4, slots, entries.packed, entries.scale_bytes)
