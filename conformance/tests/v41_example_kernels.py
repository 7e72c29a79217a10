"""DeepSeek-V4.1 implementations that behave the ways third-party adapters do, for the suite's
tests (loaded in-process, and by the CLI and the error worker as ``v41_example_kernels:NAME`` with
this folder on the path). They compute with the spec behind torch tensors
(:class:`~dsv4_compressor.conformance.v41_torch_adapter.SpecThroughTorch`) and declare nothing."""

from __future__ import annotations

import torch

from dsv4_compressor.conformance.v41_torch_adapter import SpecThroughTorch


class DeclinesLikeVllm(SpecThroughTorch):
    """No declaration; raises ``NotImplementedError`` before writing for what vLLM's kernels cannot
    express: bf16 kv/score/state, separate kv and score allocations, a paged state, bs != C, padded
    latent rows."""

    CAPABILITIES = None

    def _check(self, kv=None, score=None, state_cache=None, bs=None, latent=None, ring_capacity=None, ratio=1):
        if kv is not None and kv.dtype != torch.float32:
            raise NotImplementedError("kv: bf16 projections")
        if ratio == 2 and state_cache is not None and score is not None:  # missing ones: the spec's ValueError
            if state_cache.dtype != torch.float32:
                raise NotImplementedError("state_cache: a bf16 state")
            if ring_capacity is None or bs != ring_capacity:
                raise NotImplementedError("state_cache: a paged state, or a ring in several blocks")
            if score.dtype != torch.float32 or score.data_ptr() != kv.data_ptr() + 512 * 4:
                raise NotImplementedError("score: separate kv and score allocations")
        if latent is not None and latent.stride(0) != 512:
            raise NotImplementedError("latent: padded rows")

    def v41_compress_norm(self, *args, compress_ratio, ring_capacity=None, **kwargs):
        self._check(args[0], args[1], args[9], args[8], args[13], ring_capacity, compress_ratio)
        super().v41_compress_norm(*args, compress_ratio=compress_ratio, ring_capacity=ring_capacity, **kwargs)

    def v41_compress_norm_rope_store(self, *args, compress_ratio, ring_capacity=None, **kwargs):
        self._check(args[0], args[1], args[9], args[8], args[15], ring_capacity, compress_ratio)
        super().v41_compress_norm_rope_store(*args, compress_ratio=compress_ratio, ring_capacity=ring_capacity,
                                             **kwargs)

    def v41_rope_quant_store(self, latent, *args, **kwargs):
        self._check(latent=latent)
        super().v41_rope_quant_store(latent, *args, **kwargs)


class WritesThenDeclines(SpecThroughTorch):
    """Writes the latent, then raises ``NotImplementedError``: not an honest "unsupported"."""

    def v41_compress_norm_rope_store(self, *args, **kwargs):
        super().v41_compress_norm_rope_store(*args, **kwargs)
        raise NotImplementedError("too late")


class ValidatesAfterWriting(SpecThroughTorch):
    """Computes first and validates afterwards: a bad call writes before it raises."""

    def v41_compress_norm_rope_store(self, *args, **kwargs):
        latent = args[15]
        if latent is not None and latent.dtype == torch.bfloat16:
            latent.view(torch.int16).fill_(7)
        super().v41_compress_norm_rope_store(*args, **kwargs)


class MissingDeclaredOperation:
    """Declares every V4.1 operation and offers three: refused when loaded."""

    CAPABILITIES = SpecThroughTorch.CAPABILITIES
    v41_compress_norm = SpecThroughTorch.v41_compress_norm
    v41_rope_quant_store = SpecThroughTorch.v41_rope_quant_store
    v41_compress_norm_rope_store = SpecThroughTorch.v41_compress_norm_rope_store
