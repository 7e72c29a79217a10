"""The NumPy spec's DeepSeek-V4.1 operations behind torch tensors (CPU), for the suite's own tests
of its torch plumbing: the arguments as :mod:`.v41_calls` hands them to a torch implementation
(strided views, one projection allocation for ``kv`` and ``score``, padded latent rows, bfloat16
and float8 tensors) reach the spec as NumPy views of the same memory, so the spec writes in
place and every byte the suite compares went through torch.

It is not an independent implementation (its bytes are the spec's by construction); it shows
that the suite passes a torch implementation that is right, and is the base of the tests'
adapters that decline what they cannot express (``NotImplementedError``).
"""

from __future__ import annotations

import numpy as np

from .. import spec
from .capabilities import V41_EVERYTHING, Capabilities


def as_numpy(value):
    """A CPU tensor as a NumPy view of its memory (bfloat16 as uint16 patterns, float8 as uint8);
    anything else as it is."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type != "cpu":
        raise ValueError(f"expected CPU tensors, got a tensor on {value.device}")
    if value.dtype == torch.bfloat16:
        return value.view(torch.int16).numpy().view(np.uint16)
    if value.dtype == torch.float8_e4m3fn:
        return value.view(torch.uint8).numpy()
    return value.numpy()


class SpecThroughTorch:
    """SPEC §14.7's four operations on CPU torch tensors, computed by the NumPy spec in place."""

    SUPPORTED_DEVICES = ("cpu",)
    CAPABILITIES = Capabilities(devices=("cpu",), v4=False, v41=V41_EVERYTHING)

    def _call(self, operation: str, args, kwargs) -> None:
        getattr(spec, operation)(*map(as_numpy, args), **{k: as_numpy(v) for k, v in kwargs.items()})

    def v41_compress_norm(self, *args, **kwargs):
        self._call("v41_compress_norm", args, kwargs)

    def v41_rope_quant_store(self, *args, **kwargs):
        self._call("v41_rope_quant_store", args, kwargs)

    def v41_compress_norm_rope_store(self, *args, **kwargs):
        self._call("v41_compress_norm_rope_store", args, kwargs)

    def v41_index_key_store(self, *args, **kwargs):
        self._call("v41_index_key_store", args, kwargs)
