"""The vLLM entry points of :mod:`.vllm` as an implementation the bench and conformance take.

``python -m dsv4_compressor bench --impl dsv4_compressor.integrations.vllm_impl:cutedsl`` times
each call the way a vLLM engine makes it: ``kv_score`` split into the ``kv`` and ``score`` views,
the compressed-cache slots in a metadata object, every one of vLLM's keyword arguments, and the
entry point's own checks. Beside vLLM's kernels behind the same interface, the difference
in eager time is the difference an engine sees when it swaps the import.

``cutedsl`` and ``triton`` call :func:`.vllm.save_partial_states_cutedsl` /
:func:`.vllm.save_partial_states` and :func:`.vllm.compress_norm_rope_store_cutedsl` /
:func:`.vllm.compress_norm_rope_store_triton`. vLLM's Triton entry point writes only the
FlashMLA record, so ``triton`` refuses the other layouts (``NotImplementedError``), as vLLM's
Triton kernel does.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..conformance.capabilities import Capabilities
from ..spec.constants import HEAD_DIM, ROPE_DIM
from ..spec.entry_layout import LAYOUTS
from . import vllm

__all__ = ["VllmEntryPoints", "cutedsl", "triton"]


class VllmEntryPoints:
    """SPEC §4 and §5–§7 through :mod:`.vllm`'s entry points of one kernel family (``"cutedsl"`` or
    ``"triton"``), called with the arguments vLLM's compressor layer passes."""

    def __init__(self, family: str):
        if family not in ("cutedsl", "triton"):
            raise ValueError(f"family: expected 'cutedsl' or 'triton', got {family!r}")
        self.family = family

    @property
    def SUPPORTED_DEVICES(self) -> tuple[str, ...]:  # noqa: N802 - the implementation protocol's name
        """The kernel family's own (its module is imported on first use)."""
        return vllm._backend(self.family).SUPPORTED_DEVICES

    @property
    def CAPABILITIES(self) -> Capabilities:  # noqa: N802 - the implementation protocol's name
        """vLLM's V4 calls: SPEC §3's fp32 paged state, ``ape`` added at the save, the two calls;
        every layout on CuTe DSL, the FlashMLA record alone on Triton (as vLLM's Triton entry point)."""
        return Capabilities(devices=self.SUPPORTED_DEVICES,
                            layouts=LAYOUTS if self.family == "cutedsl" else ("flashmla_fp8",))

    def save_partial_states(
        self,
        kv_score: torch.Tensor,  # fp32 [T, 2*SW]: kv then score (without ape)
        ape: torch.Tensor,  # fp32 [r, SW]
        positions: torch.Tensor,  # int64 [T]
        slot_mapping: torch.Tensor,  # int64 [T], -1 = padding
        state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW], written in place
        block_size: int,
    ) -> None:
        save = vllm.save_partial_states_cutedsl if self.family == "cutedsl" else vllm.save_partial_states
        state_width = state_cache.shape[-1] // 2
        kv, score = kv_score.split([state_width, state_width], dim=-1)  # the layer's views
        save(kv=kv, score=score, ape=ape, positions=positions, state_cache=state_cache, slot_mapping=slot_mapping,
             block_size=block_size, state_width=state_width, compress_ratio=ape.shape[0], pdl_kwargs={})

    def compress_norm_rope_store(
        self,
        state_cache: torch.Tensor,  # fp32 [num_state_blocks, bs, 2*SW]
        token_to_req_indices: torch.Tensor,  # int32 [T]
        positions: torch.Tensor,  # int64 [T]
        slot_mapping: torch.Tensor,  # int64 [T], -1 = padding
        block_table: torch.Tensor,  # int32 [num_reqs, max_blocks]
        block_size: int,
        rms_norm_weight: torch.Tensor,  # bf16 or fp32 [512]
        rms_norm_eps: float,
        cos_sin_cache: torch.Tensor,  # fp32 [max_pos, 64]
        k_cache: torch.Tensor,  # the layout's cache (SPEC §7)
        kv_slot_mapping: torch.Tensor,  # int64 [T], -1 = no entry
        *,
        compress_ratio: int,
        layout: str = "flashmla_fp8",
        fp8_scale: float | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        kwargs = dict(
            state_cache=state_cache, num_actual=slot_mapping.shape[0], token_to_req_indices=token_to_req_indices,
            positions=positions, slot_mapping=slot_mapping, block_table=block_table, block_size=block_size,
            state_width=state_cache.shape[-1] // 2, cos_sin_cache=cos_sin_cache, kv_cache=k_cache,
            k_cache_metadata=SimpleNamespace(slot_mapping=kv_slot_mapping), pdl_kwargs={}, head_dim=HEAD_DIM,
            rope_head_dim=ROPE_DIM, compress_ratio=compress_ratio, overlap=compress_ratio == 4, use_fp4_cache=False,
            rms_norm_weight=rms_norm_weight, rms_norm_eps=rms_norm_eps, **vllm._RECORD)
        if self.family == "triton":
            if layout != "flashmla_fp8":
                raise NotImplementedError(f"layout {layout!r}: vLLM's Triton entry point writes only the "
                                          "flashmla_fp8 record")
            vllm.compress_norm_rope_store_triton(**kwargs)
            return
        vllm.compress_norm_rope_store_cutedsl(**kwargs, store_full_kv=layout != "flashmla_fp8",
                                              store_full_fp8=layout == "fp8_per_tensor", fp8_scale=fp8_scale)


cutedsl = VllmEntryPoints("cutedsl")
triton = VllmEntryPoints("triton")
