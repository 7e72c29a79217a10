"""SPEC §14.5: the records of DeepSeek-V4.1's compressed cache, all encoding the rotated entry ``z``.

Two new records, interleaved (each entry's scales follow its own data inside its ``E`` bytes):

- ``v41_mxfp8`` (``E = 528``): 512 E4M3 bytes in 16 blocks of 32 with power-of-two (UE8M0)
  scales, then the 16 scale bytes;
- ``v41_nvfp4`` (``E = 288``): 256 bytes of packed E2M1 codes in 32 tiles of 16 with E4M3 scales
  ``sigma`` (not powers of two), then the 32 scale bytes.

And V4's three 512-wide records (SPEC §7), fed from ``z``: the NoPE blocks quantize ``z[0:448]``
itself (already bf16, so §7's ``bf16`` rounding changes nothing) and the RoPE values stored are
``z[448:512]``. Their bytes come from the V4 quantizers and stores unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arithmetic import div
from .constants import MXFP8_BLOCK, NOPE_DIM, NVFP4_TILE
from .entry_layout import V41_MXFP8, V41_NVFP4
from .formats import bf16_to_f32, e2m1_bits, e4m3_to_f32, nvfp4_scale_bits
from .layouts import store_bf16, store_flashmla_fp8, store_fp8_per_tensor, store_records
from .postprocess import e4m3_blocks, quantize_nope

F32 = np.float32


@dataclass(frozen=True)
class Mxfp8Entries:
    """``v41_mxfp8`` entries: sixteen E4M3 blocks of 32 channels with UE8M0 scales."""

    codes: np.ndarray  # uint8 [n, 512]: e4m3(z[d] * 2^-k)
    scale_bytes: np.ndarray  # uint8 [n, 16]: 127 + k of blocks 0..15


def quantize_mxfp8(z: np.ndarray) -> Mxfp8Entries:
    """``z``: fp32 ``[n, 512]`` (bf16 values). Per block of 32: ``amax = max |z|``, ``k`` per
    SPEC §2 (``AMIN`` floor, 448), bytes ``e4m3(z * 2^-k)``, scale byte ``127 + k``."""
    codes, scale_bytes, _ = e4m3_blocks(z, MXFP8_BLOCK)
    return Mxfp8Entries(codes=codes, scale_bytes=scale_bytes)


@dataclass(frozen=True)
class Nvfp4Entries:
    """``v41_nvfp4`` entries: thirty-two E2M1 tiles of 16 channels with E4M3 scales."""

    packed: np.ndarray  # uint8 [n, 256]: code[2j] | code[2j+1] << 4
    scale_bytes: np.ndarray  # uint8 [n, 32]: the E4M3 byte of sigma for tiles 0..31


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes per byte, the even channel in the low nibble: uint8 ``[n, m]`` -> ``[n, m/2]``."""
    return (codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))).astype(np.uint8)


def quantize_nvfp4(z: np.ndarray) -> Nvfp4Entries:
    """``z``: fp32 ``[n, 512]`` (bf16 values). Per tile of 16:
    ``sigma = e4m3(div(max(max |z|, 6 * 2^-9), 6))``; ``code = e2m1(div(z, sigma))`` (ties to
    even, saturating to +-6, sign kept). An all-zero tile has ``sigma = 2^-9`` and codes 0."""
    n = z.shape[0]
    tiles = z.reshape(n, -1, NVFP4_TILE)
    scale_bytes = nvfp4_scale_bits(np.max(np.abs(tiles), axis=-1))
    sigma = e4m3_to_f32(scale_bytes)
    codes = e2m1_bits(div(tiles, sigma[:, :, None])).reshape(n, -1)
    return Nvfp4Entries(packed=pack_e2m1(codes), scale_bytes=scale_bytes)


def store_v41_mxfp8(k_cache: np.ndarray, slots: np.ndarray, entries: Mxfp8Entries) -> None:
    """``v41_mxfp8`` (E = 528): data byte ``d`` at ``page*stride0 + o*528 + d``, scale byte ``g``
    at ``page*stride0 + o*528 + 512 + g``."""
    store_records(k_cache, V41_MXFP8, slots, entries.codes, entries.scale_bytes)


def store_v41_nvfp4(k_cache: np.ndarray, slots: np.ndarray, entries: Nvfp4Entries) -> None:
    """``v41_nvfp4`` (E = 288): data byte ``j`` at ``page*stride0 + o*288 + j``, scale byte ``g``
    at ``page*stride0 + o*288 + 256 + g``."""
    store_records(k_cache, V41_NVFP4, slots, entries.packed, entries.scale_bytes)


def store_rotated_entries(
    k_cache: np.ndarray,  # the layout's cache (see v41_operator.v41_rope_quant_store), written in place
    slots: np.ndarray,  # int64 [n]: kv_slot_mapping of the active tokens
    z_bits: np.ndarray,  # uint16 [n, 512]: the rotated entries z (bf16 bit patterns)
    layout: str,  # flashmla_fp8, bf16, fp8_per_tensor, v41_mxfp8 or v41_nvfp4
    fp8_scale: np.float32 | None,  # fp8_per_tensor only
) -> None:
    """SPEC §14.5: write one record of ``z`` per slot in ``layout``; no other byte changes."""
    z = bf16_to_f32(z_bits)
    rope_bits = z_bits[:, NOPE_DIM:]
    if layout == "flashmla_fp8":
        store_flashmla_fp8(k_cache, slots, quantize_nope(z), rope_bits)
    elif layout == "bf16":
        store_bf16(k_cache, slots, z, rope_bits)
    elif layout == "fp8_per_tensor":
        store_fp8_per_tensor(k_cache, slots, z, rope_bits, fp8_scale)
    elif layout == V41_MXFP8.name:
        store_v41_mxfp8(k_cache, slots, quantize_mxfp8(z))
    elif layout == V41_NVFP4.name:
        store_v41_nvfp4(k_cache, slots, quantize_nvfp4(z))
    else:
        raise ValueError(f"layout: expected one of 'flashmla_fp8', 'bf16', 'fp8_per_tensor', 'v41_mxfp8', 'v41_nvfp4', got {layout!r}")
