"""Implementations that misbehave in the ways third-party kernels do, for the suite's tests
(loaded by the worker process as ``example_kernels:NAME`` with this folder on the path)."""

from __future__ import annotations

import os

import torch

from dsv4_compressor.conformance.capabilities import Capabilities
from dsv4_compressor.conformance.torch_reference import TorchReference


class CrashesOnUnknownLayout(TorchReference):
    """Dies (as a kernel without validation would, with an illegal address) on one bad call."""

    def compress_norm_rope_store(self, *args, layout="flashmla_fp8", **kwargs):
        if layout not in ("flashmla_fp8", "bf16", "fp8_per_tensor"):
            os.abort()
        return super().compress_norm_rope_store(*args, layout=layout, **kwargs)


class SignatureMessages(TorchReference):
    """Raises ValueError whose message lists the whole signature (every name, none first)."""

    def compress_norm_rope_store(self, *args, **kwargs):
        try:
            return super().compress_norm_rope_store(*args, **kwargs)
        except ValueError:
            raise ValueError("Mismatched type on argument #3 when calling: compress_norm_rope_store(state_cache, "
                             "token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight, "
                             "rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale)") from None


class WritesBeforeRaising(TorchReference):
    """Touches the compressed cache before validating."""

    def compress_norm_rope_store(self, state_cache, *args, **kwargs):
        torch.as_strided(state_cache, (1,), (1,)).add_(1)  # the first state value, whatever the layout
        return super().compress_norm_rope_store(state_cache, *args, **kwargs)


class VllmLike(TorchReference):
    """Declares what vLLM's wrappers accept: flashmla_fp8 only, C128 with 8-row blocks, state
    strides divisible by 16 floats."""

    CAPABILITIES = Capabilities(devices=("cpu",), layouts=("flashmla_fp8",), block_sizes={128: (8,)},
                                state_stride_multiple=16)

    def compress_norm_rope_store(self, *args, layout="flashmla_fp8", **kwargs):
        if layout != "flashmla_fp8":
            raise ValueError(f"layout: expected 'flashmla_fp8' (the only layout of this kernel), got {layout!r}")
        return super().compress_norm_rope_store(*args, layout=layout, **kwargs)


class GpuOnly(TorchReference):
    SUPPORTED_DEVICES = ("cuda",)
    CAPABILITIES = None  # the older declaration only


class BatchVariant(TorchReference):
    """Sums left to right in a call of more than one token and by the pairwise trees in a call
    of one (a kernel whose path, and so its arithmetic, follows the batch size): within the
    tolerant bounds, but a token's bytes depend on its batch."""

    def __init__(self):
        super().__init__(())
        self.batched = TorchReference(("sequential_sum",))

    def compress_norm_rope_store(self, state_cache, token_to_req_indices, *args, **kwargs):
        chosen = self.batched if token_to_req_indices.shape[0] > 1 else super()
        return chosen.compress_norm_rope_store(state_cache, token_to_req_indices, *args, **kwargs)


class WritesFromPadding(TorchReference):
    """Saves the last token's row into state row 0 when a call holds 8 tokens or more, whatever
    its slot (out-of-range work for the padding of a large bucket)."""

    def save_partial_states(self, kv_score, ape, positions, slot_mapping, state_cache, block_size):
        super().save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size)
        if kv_score.shape[0] >= 8:
            state_cache[0, 0, : kv_score.shape[1]] = kv_score[-1]


class StepCallWithoutTheCall(TorchReference):
    """Declares SPEC §13.4's step call but offers no compress_and_save."""

    CAPABILITIES = Capabilities(devices=("cpu",), step_call=True)
    compress_and_save = None
