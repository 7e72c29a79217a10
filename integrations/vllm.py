"""vLLM's DeepSeek V4 compressor entry points, keyword for keyword, on this project's kernels.

vLLM's compressor layer splits ``kv_score`` into ``kv`` and ``score``, saves them with
``save_partial_states`` and then calls ``compress_norm_rope_store_cutedsl`` (head 512 on CUDA) or
``compress_norm_rope_store_triton``, passing the paged cache as ``kv_cache`` plus a metadata
object whose ``slot_mapping`` is the compressed-cache slot of each token. The functions here
take exactly those parameters, check the ones this project fixes (head 512, RoPE 64, FP8
blocks of 64, 576-byte records, 8 scale bytes), and call :mod:`dsv4_compressor.impl.triton` or
:mod:`dsv4_compressor.impl.cutedsl`; the bytes written are the spec's (docs/SPEC.md), which
differ from vLLM's own kernels only where SPEC §11 says.

How the arguments map (docs/engine.md has the whole table):

- ``kv``, ``score`` ``[T, SW]`` -> ``kv_score [T, 2*SW]``: a zero-copy view when ``score`` is
  the right half of the same rows (as ``kv_score.split`` gives), else one concatenation.
  bf16 inputs are widened to fp32 (exact).
- ``kv_cache`` + ``k_cache_metadata.slot_mapping`` -> ``k_cache``, ``kv_slot_mapping``.
- ``num_actual``: the per-token tensors are sliced to their first ``num_actual`` entries
  (views), so buffers padded for CUDA graphs can be passed as they are.
- ``store_full_kv`` / ``store_full_fp8`` -> ``layout="bf16"`` / ``"fp8_per_tensor"``.
  ``fp8_scale`` may be a one-element tensor; it is read on the host (a device sync, so it is
  not capturable in a CUDA graph: pass a Python float there).
- ``pdl_kwargs`` is accepted and ignored: the CuTe DSL kernels always wait for their
  predecessor (``griddepcontrol.wait``) before touching memory; Triton launches without PDL.
- ``state_width``, ``overlap``, ``head_dim`` and the record constants must agree with the
  buffers; a mismatch, ``use_fp4_cache=True`` or the 128-wide indexer raises ``ValueError``
  before anything is written.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ..spec.constants import HEAD_DIM, NOPE_DIM, QUANT_BLOCK, ROPE_DIM, ratio_config

__all__ = [
    "save_partial_states",
    "save_partial_states_cutedsl",
    "compress_norm_rope_store_triton",
    "compress_norm_rope_store_cutedsl",
]

# vLLM's constants for head 512: (quant_block, token_stride, scale_dim)
_RECORD = {"quant_block": QUANT_BLOCK, "token_stride": NOPE_DIM + 2 * ROPE_DIM, "scale_dim": NOPE_DIM // QUANT_BLOCK + 1}
# what a consistent call passes: (head_dim, rope_head_dim, quant_block, token_stride, scale_dim, use_fp4_cache)
_FIXED = (HEAD_DIM, ROPE_DIM, *_RECORD.values(), False)
_AGREEING = {r: ratio_config(r).state_width for r in (4, 128)}  # compress_ratio -> state_width
_BACKENDS: dict = {}  # "triton" / "cutedsl" -> the kernel family's module, imported on first use


def _backend(family: str):
    """``dsv4_compressor.impl.<family>``, imported on the first call (CuTe DSL only when asked for)."""
    module = _BACKENDS.get(family)
    if module is None:
        module = _BACKENDS[family] = importlib.import_module(f"..impl.{family}", __package__)
    return module


def _expect(name: str, given: Any, expected: Any, why: str) -> None:
    if given != expected:
        raise ValueError(f"{name}: expected {expected!r} ({why}), got {given!r}")


def _check_ratio(compress_ratio: int, state_width: int, state_cache: torch.Tensor, overlap: bool | None = None) -> None:
    """``compress_ratio``, ``state_width`` (and ``overlap``) agree with SPEC §1 and with ``state_cache``."""
    if (type(compress_ratio) is int and _AGREEING.get(compress_ratio) == state_width == state_cache.shape[-1] // 2
            and (overlap is None or overlap == (compress_ratio == 4))):
        return  # every call of a running engine: no message built
    config = ratio_config(compress_ratio)  # ValueError naming compress_ratio unless 4 or 128
    _expect("state_width", state_width, config.state_width,
            f"{config.overlap} x head {HEAD_DIM} for compress_ratio {compress_ratio}")
    _expect("state_width", state_width, state_cache.shape[-1] // 2, "half of state_cache's last dimension")
    if overlap is not None:
        _expect("overlap", bool(overlap), config.overlap == 2, "overlapping windows are C4's only")


def _kv_score(kv: torch.Tensor, score: torch.Tensor, state_width: int) -> torch.Tensor:
    """``[T, 2*SW]`` fp32 from the two halves: a view when they are the fp32 halves of one row (the
    layer's ``kv_score.split``), else a copy."""
    strides, rows = kv.stride(), kv.shape
    if (kv.dtype is torch.float32 and score.dtype is torch.float32 and len(rows) == 2 and rows[1] == state_width
            and score.shape == rows and score.stride() == strides and strides[1] == 1
            and strides[0] >= 2 * state_width and score.get_device() == kv.get_device()
            and score.data_ptr() == kv.data_ptr() + 4 * state_width):
        try:  # score's elements follow kv's in every row: kv's storage holds them unless it ends first
            return torch.as_strided(kv, (rows[0], 2 * state_width), strides)
        except RuntimeError:  # kv's storage ends before score's last row: score lives elsewhere
            pass
    for name, tensor in (("kv", kv), ("score", score)):
        if tensor.dim() != 2 or tensor.shape[1] != state_width:
            raise ValueError(f"{name}: expected shape [T, {state_width}] (state_width), got {list(tensor.shape)}")
        if tensor.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{name}: expected dtype float32 or bfloat16, got {tensor.dtype}")
    if kv.shape[0] != score.shape[0] or kv.dtype != score.dtype or kv.device != score.device:
        raise ValueError(f"score: expected the shape, dtype and device of kv {list(kv.shape)} {kv.dtype} {kv.device}, "
                         f"got {list(score.shape)} {score.dtype} {score.device}")
    return torch.cat((kv, score), dim=1).float()


def _per_token(name: str, tensor: torch.Tensor, num_actual: int) -> torch.Tensor:
    if tensor.dim() != 1 or tensor.shape[0] < num_actual:
        raise ValueError(f"{name}: expected a 1-D tensor of at least num_actual = {num_actual} entries, "
                         f"got shape {list(tensor.shape)}")
    return _first_rows(tensor, num_actual)


def _first_rows(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` rows of ``tensor``: itself when it has no more (a view costs host time)."""
    return tensor if tensor.shape[0] == count else tensor[:count]


def _save_entry_point(family: str, name: str, kernels: str):
    """vLLM's ``save_partial_states``, keyword for keyword, on the kernel family ``family``
    (``"triton"`` or ``"cutedsl"``): the public function ``name`` (``kernels`` names the family in
    its docstring). One definition serves both families, whose entry points differ only there."""

    def save_partial_states(
        kv: torch.Tensor,  # fp32 or bf16 [T, SW]
        score: torch.Tensor,  # fp32 or bf16 [T, SW], without ape
        ape: torch.Tensor,  # fp32 [r, SW]
        positions: torch.Tensor,  # int64 [>= T]
        state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW], written in place
        slot_mapping: torch.Tensor,  # int64 [T], -1 = padding; T = num_actual
        block_size: int,  # bs
        state_width: int,  # SW = 1024 (C4) or 512 (C128)
        compress_ratio: int,  # 4 or 128
        pdl_kwargs: dict | None = None,  # ignored (see the module docstring)
    ) -> None:
        backend = _backend(family)
        _check_ratio(compress_ratio, state_width, state_cache)
        num_actual = slot_mapping.shape[0]
        kv_score = _kv_score(_first_rows(kv, num_actual), _first_rows(score, num_actual), state_width)
        backend.save_partial_states(kv_score, ape, _per_token("positions", positions, num_actual), slot_mapping,
                                    state_cache, block_size)

    save_partial_states.__name__ = save_partial_states.__qualname__ = name
    save_partial_states.__doc__ = f"vLLM's ``save_partial_states`` on the {kernels} kernel (SPEC §4)."
    return save_partial_states


save_partial_states = _save_entry_point("triton", "save_partial_states", "Triton")
save_partial_states_cutedsl = _save_entry_point("cutedsl", "save_partial_states_cutedsl", "CuTe DSL")


def _store_layout(store_full_kv: bool, store_full_fp8: bool) -> str:
    if store_full_fp8 and not store_full_kv:
        raise ValueError("store_full_fp8: expected store_full_kv=True with it, got store_full_kv=False")
    if not store_full_kv:
        return "flashmla_fp8"
    return "fp8_per_tensor" if store_full_fp8 else "bf16"


def _check_fixed(head_dim: int, rope_head_dim: int, quant_block: int, token_stride: int, scale_dim: int,
                 use_fp4_cache: bool) -> None:
    """The parameters vLLM passes that this project fixes (SPEC §1 and §7)."""
    if (head_dim, rope_head_dim, quant_block, token_stride, scale_dim, use_fp4_cache) == _FIXED:
        return
    _expect("head_dim", head_dim, HEAD_DIM, "the attention compressor; the 128-wide indexer is not covered here")
    _expect("use_fp4_cache", bool(use_fp4_cache), False, "MXFP4 caches belong to the indexer")
    _expect("rope_head_dim", rope_head_dim, ROPE_DIM, "SPEC §1")
    for name, given in (("quant_block", quant_block), ("token_stride", token_stride), ("scale_dim", scale_dim)):
        _expect(name, given, _RECORD[name], "the FlashMLA record of SPEC §7")


def _token_views(num_actual: int, k_cache_metadata: Any, token_to_req_indices: torch.Tensor, positions: torch.Tensor,
                 slot_mapping: torch.Tensor) -> list[torch.Tensor]:
    """The per-token tensors cut to ``num_actual`` (views; themselves where they have no more),
    ``k_cache_metadata.slot_mapping`` last."""
    kv_slot_mapping = getattr(k_cache_metadata, "slot_mapping", None)
    if not isinstance(kv_slot_mapping, torch.Tensor):
        raise ValueError(f"k_cache_metadata: expected an object whose slot_mapping is the compressed-cache slot "
                         f"tensor, got {type(k_cache_metadata).__name__}")
    tensors = [token_to_req_indices, positions, slot_mapping, kv_slot_mapping]
    one_d = (num_actual,)
    if (type(token_to_req_indices) is torch.Tensor and type(positions) is torch.Tensor
            and type(slot_mapping) is torch.Tensor and token_to_req_indices.shape == one_d
            and positions.shape == one_d and slot_mapping.shape == one_d and kv_slot_mapping.shape == one_d):
        return tensors  # unpadded buffers, as an eager engine passes them
    names = ("token_to_req_indices", "positions", "slot_mapping", "k_cache_metadata.slot_mapping")
    return [_per_token(name, tensor, num_actual) for name, tensor in zip(names, tensors)]


def _host_scale(fp8_scale: torch.Tensor | float | None, layout: str) -> float | None:
    if layout != "fp8_per_tensor":
        return None
    if fp8_scale is None:
        return 1.0  # vLLM's default: a scale of one
    if isinstance(fp8_scale, torch.Tensor):
        if fp8_scale.numel() != 1:
            raise ValueError(f"fp8_scale: expected one element, got shape {list(fp8_scale.shape)}")
        return float(fp8_scale.item())  # a device sync when the tensor lives on the GPU
    return fp8_scale


def compress_norm_rope_store_triton(
    state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW]
    num_actual: int,  # T: tokens of this step
    token_to_req_indices: torch.Tensor,  # int32 [>= T]
    positions: torch.Tensor,  # int64 [>= T]
    slot_mapping: torch.Tensor,  # int64 [>= T], -1 = padding
    block_table: torch.Tensor,  # int32 [num_reqs, max_blocks]
    block_size: int,  # bs
    state_width: int,  # SW
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    kv_cache: torch.Tensor,  # uint8 [num_pages, B, 584] (FlashMLA fp8 pages)
    k_cache_metadata: Any,  # .slot_mapping: int64 [>= T], -1 = no entry
    pdl_kwargs: dict,  # ignored
    head_dim: int,  # 512
    rope_head_dim: int,  # 64
    compress_ratio: int,  # 4 or 128
    overlap: bool,  # compress_ratio == 4
    use_fp4_cache: bool,  # False
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
    rms_norm_eps: float,
    quant_block: int,  # 64
    token_stride: int,  # 576
    scale_dim: int,  # 8
) -> None:
    """vLLM's ``compress_norm_rope_store_triton`` on this project's Triton kernel (SPEC §5-§7)."""
    backend = _backend("triton")

    _check_fixed(head_dim, rope_head_dim, quant_block, token_stride, scale_dim, use_fp4_cache)
    _check_ratio(compress_ratio, state_width, state_cache, overlap)
    token_to_req, pos, slots, kv_slots = _token_views(num_actual, k_cache_metadata, token_to_req_indices, positions,
                                                      slot_mapping)
    backend.compress_norm_rope_store(state_cache, token_to_req, pos, slots, block_table, block_size, rms_norm_weight,
                                     rms_norm_eps, cos_sin_cache, kv_cache, kv_slots, compress_ratio=compress_ratio)


def compress_norm_rope_store_cutedsl(
    state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW]
    num_actual: int,
    token_to_req_indices: torch.Tensor,  # int32 [>= T]
    positions: torch.Tensor,  # int64 [>= T]
    slot_mapping: torch.Tensor,  # int64 [>= T]
    block_table: torch.Tensor,  # int32 [num_reqs, max_blocks]
    block_size: int,
    state_width: int,
    cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
    kv_cache: torch.Tensor,  # uint8 [pages, B, 584]; bf16 [pages, B, 512] (store_full_kv); float8_e4m3fn (store_full_fp8)
    k_cache_metadata: Any,  # .slot_mapping: int64 [>= T]
    pdl_kwargs: dict,  # ignored
    head_dim: int,
    rope_head_dim: int,
    compress_ratio: int,
    overlap: bool,
    use_fp4_cache: bool,
    rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
    rms_norm_eps: float,
    quant_block: int,
    token_stride: int,
    scale_dim: int,
    store_full_kv: bool = False,
    store_full_fp8: bool = False,
    fp8_scale: torch.Tensor | float | None = None,  # dequantization scale: stored = e4m3(x / fp8_scale)
) -> None:
    """vLLM's ``compress_norm_rope_store_cutedsl`` on this project's CuTe DSL kernels (SPEC §5-§7)."""
    backend = _backend("cutedsl")

    _check_fixed(head_dim, rope_head_dim, quant_block, token_stride, scale_dim, use_fp4_cache)
    _check_ratio(compress_ratio, state_width, state_cache, overlap)
    layout = _store_layout(store_full_kv, store_full_fp8)
    token_to_req, pos, slots, kv_slots = _token_views(num_actual, k_cache_metadata, token_to_req_indices, positions,
                                                      slot_mapping)
    backend.compress_norm_rope_store(state_cache, token_to_req, pos, slots, block_table, block_size, rms_norm_weight,
                                     rms_norm_eps, cos_sin_cache, kv_cache, kv_slots, compress_ratio=compress_ratio,
                                     layout=layout, fp8_scale=_host_scale(fp8_scale, layout))
