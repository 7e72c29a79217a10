"""A fast-math implementation that calibrates the tolerant verdict (SPEC §10).

It follows SPEC.md except where engines' kernels do not: ``exp2`` and ``rsqrt`` carry a
relative error of up to ``2^-21`` (each result moved by a deterministic pseudo-random
factor in ``[1 - 2^-21, 1 + 2^-21]``), products feed additions unrounded (FMA-style
contraction: the RoPE rotation and the norm's ``x·rr·w`` are computed in float64 and rounded
once), and sums run in another order (right to left onto an accumulator that starts at ``+0``,
as ``acc = 0.0; acc += v`` and ``torch.sum`` do, so a sum of ``-0`` is ``+0``; the indexer's
rotation stages with spans 1, 2, ..., 64). Its bytes differ from the spec's near rounding ties
and in the sign of zero sums; ``--tolerant`` must pass it on every scenario, so the tolerant
verdict is no tighter than such arithmetic needs. SPEC §13's state formats it inherits from
:class:`~.torch_reference.TorchReference` unchanged: storing a row (bf16 rounding, ``score + ape``)
and reading it back are exact operations that a fast kernel performs as the spec does.
"""

from __future__ import annotations

import torch

from .capabilities import STATE_FORMATS, Capabilities
from .torch_reference import TorchReference

APPROX = 2.0 ** -21  # relative error of the approximate exp2 and rsqrt


def perturb(v: torch.Tensor, salt: int) -> torch.Tensor:
    """``v·(1 + δ)`` rounded to binary32, ``|δ| <= 2^-21`` a hash of v's bits (deterministic)."""
    bits = v.float().view(torch.int32).to(torch.int64)
    h = ((bits * 2654435761 + salt * 40503) >> 7) & 0xFFFF
    delta = (h.double() / 32768.0 - 1.0) * APPROX
    return (v.double() * (1.0 + delta)).float()


class FastMathReference(TorchReference):
    """SPEC.md with approximate exp2/rsqrt, fused products and right-to-left sums from +0."""

    SUPPORTED_DEVICES = ("cpu", "cuda")
    CAPABILITIES = Capabilities(devices=("cpu", "cuda"), head_widths=(512, 128), **STATE_FORMATS)

    def __init__(self):
        super().__init__()
        self.name = "fast-math"

    def _sum(self, v: torch.Tensor, dim: int) -> torch.Tensor:
        """Right-to-left sum over ``dim`` of float32 ``v``, from a ``+0`` accumulator."""
        acc = torch.zeros_like(v.select(dim, 0))
        for i in range(v.shape[dim] - 1, -1, -1):
            acc = acc + v.select(dim, i)
        return acc

    def _exp2(self, x: torch.Tensor, c) -> torch.Tensor:
        exact = torch.exp2(x.double()).float()  # x rounded to binary32 first, as a kernel's argument is
        return torch.where(x < -126.0, torch.zeros_like(exact), perturb(exact, 1))

    def _rsqrt(self, v: torch.Tensor) -> torch.Tensor:
        return perturb(torch.rsqrt(v.double()).float(), 2)

    def _normalize(self, x, rr, w):
        return (x.double() * rr.double()[:, None] * w.double()[None, :]).float()

    def _hadamard_spans(self):
        return (1, 2, 4, 8, 16, 32, 64)  # another order of the rotation's stages (SPEC §12)

    def _rotate(self, a, b, co, si):
        a, b, co, si = a.double(), b.double(), co.double(), si.double()
        return (a * co - b * si).float(), (a * si + b * co).float()

