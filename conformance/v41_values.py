"""Value profiles of the DeepSeek-V4.1 scenarios (SPEC §14): what the projections, the state rows,
the norm weight, the latent and the RoPE table look like, some of them tuned onto rounding ties
so that a one-rounding slip changes bytes deterministically.

A profile edits a :class:`V41Values` in place (binary32 values; the scenario builder rounds what
it holds in bf16 afterwards):

- ``pooled_ties``: pooled vectors exactly halfway between two bf16 values (SPEC §14.3's
  ``x' = bf16(x)``; ratio 1: ``kv`` itself, ratio 2: two equal rows with equal scores, whose
  softmax weights are exactly 1/2), half of them rounding up to the even neighbour;
- ``zeros``: ``+0`` and ``-0`` in ``kv`` and in the norm weight, whole 16- and 32-channel tiles of
  zeros (an NVFP4 tile's ``sigma = 2^-9``), RoPE pairs of zeros;
- ``huge`` / ``tiny``: norm weights that saturate NVFP4's scale at 448 (codes at +-6) or sink
  tiles below both amax floors;
- ``rope_ties`` (a given latent): RoPE pairs of powers of two and cos/sin rows ``±(1 + 2^-8)·2^-s``
  and 0, so every rotated value is exactly a bf16 tie;
- ``fp4_ties`` (a given latent): NVFP4 tiles whose amax is ``6·sigma`` for E4M3 scales that are not
  powers of two and whose other values are ``m·sigma`` for E2M1 midpoints and grid points ``m``
  (ties to even; a product by ``fl(1/sigma)`` in place of the division moves some of them);
- ``fp8_ties`` (a given latent): 32-channel blocks whose amax is ``448·2^k`` and whose other values
  sit on E4M3 midpoints at that scale;
- ``rope_fp8_midpoints`` / ``rope_fp4_midpoints`` (a given latent): the RoPE channels on E4M3 / E2M1
  midpoints at their scale, and cos/sin rows that move each rotated value by ``2^-10`` of itself:
  its bf16 rounding lands back on the midpoint (ties to even), the unrounded value does not, so a
  record that quantizes the unrounded RoPE output (SPEC §14.10) writes other codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..spec.arithmetic import div, mul
from ..spec.constants import NOPE_DIM
from ..spec.formats import E4M3_MAGNITUDES, bf16_bits, bf16_to_f32, e2m1_bits

F32 = np.float32
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_POINTS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


@dataclass
class V41Values:
    """A scenario's values before the builder stores them (every array binary32)."""

    ratio: int
    kv: np.ndarray  # float32 [T, 512]
    score: np.ndarray  # float32 [T, 512]
    state: np.ndarray  # float32 [num_state_blocks, bs, 1024]: kv then raw score
    weight: np.ndarray  # float32 [512] (or [128] for the index key)
    latent: np.ndarray  # float32 [T, 512]: bf16 values (v41_rope_quant_store's input)
    cos_sin: np.ndarray  # float32 [max_pos, 64]
    k_pre: np.ndarray  # float32 [T, 128]: bf16 values


def _normal(v: V41Values, rng: np.random.Generator) -> None:
    pass


def _tie_values(shape, rng: np.random.Generator) -> np.ndarray:
    """binary32 values exactly halfway between two bf16 neighbours, either parity, either sign."""
    high = bf16_bits((rng.standard_normal(shape) * 2.0).astype(F32)).astype(np.uint32)
    return ((high << np.uint32(16)) | np.uint32(0x8000)).view(F32)


def _pooled_ties(v: V41Values, rng: np.random.Generator) -> None:
    channels = np.arange(0, 512, 2)  # the even channels; the odd ones stay random
    if v.ratio == 1:
        v.kv[:, channels] = _tie_values((v.kv.shape[0], channels.size), rng)
        return
    ties = _tie_values(channels.size, rng)  # one value per channel in every row: x = add(t/2, t/2) = t
    v.kv[:, channels] = ties
    v.state[:, :, channels] = ties
    v.score[:, channels] = F32(0.5)
    v.state[:, :, 512 + channels] = F32(0.5)


def _zeros(v: V41Values, rng: np.random.Generator) -> None:
    signs = np.where(rng.random(v.kv[:, 24:48].shape) < 0.5, F32(-0.0), F32(0.0))
    v.kv[:, 24:48] = signs
    v.state[:, :, 24:48] = np.where(rng.random(v.state[:, :, 24:48].shape) < 0.5, F32(-0.0), F32(0.0))
    w = v.weight
    w[0:16] = F32(0.0)  # a whole NVFP4 tile of +0 weights
    w[64:96] = F32(-0.0)  # a whole MXFP8 block of -0 weights
    w[100:448:7] = np.where(np.arange(w[100:448:7].size) % 2, F32(-0.0), F32(0.0))
    w[448:452] = F32(0.0)  # two RoPE pairs of zeros
    w[460] = F32(-0.0)


def _huge(v: V41Values, rng: np.random.Generator) -> None:
    v.weight[16:48] *= F32(2e4)  # amax far above 6 * 448: sigma saturates at 448, codes at +-6
    v.weight[200:232] *= F32(3e3)
    v.weight[480:512] *= F32(1e4)


def _tiny(v: V41Values, rng: np.random.Generator) -> None:
    v.weight[0:32] *= F32(1e-4)  # below NVFP4's 6 * 2^-9 floor
    v.weight[32:64] *= F32(1e-7)  # below MXFP8's 1e-4 floor too
    v.weight[256:288] *= F32(1e-30)
    v.weight[496:512] *= F32(1e-6)


ROPE_TIE = F32(1.0 + 2.0 ** -8)


def _rope_ties(v: V41Values, rng: np.random.Generator) -> None:
    t = v.latent.shape[0]
    exponents = rng.integers(-6, 6, size=(t, 64))
    signs = np.where(rng.random((t, 64)) < 0.5, -1.0, 1.0)
    v.latent[:, NOPE_DIM:] = (signs * np.ldexp(1.0, exponents)).astype(F32)
    rows = v.cos_sin.shape[0]
    scale = np.ldexp(1.0, -rng.integers(0, 2, size=(rows, 32))) * np.where(rng.random((rows, 32)) < 0.5, -1.0, 1.0)
    swap = rng.random((rows, 32)) < 0.3  # (0, ±c): the pair is rotated by a quarter turn
    value = (ROPE_TIE * scale).astype(F32)
    v.cos_sin[:, :32] = np.where(swap, F32(0.0), value)
    v.cos_sin[:, 32:] = np.where(swap, value, F32(0.0))


@lru_cache(maxsize=1)
def _reciprocal_sensitive() -> tuple[tuple[float, float], ...]:
    """``(sigma, m)`` pairs — an E4M3 scale that is not a power of two, an E2M1 midpoint or grid
    point ``m`` — with ``m·sigma`` a bf16 value whose code differs between ``div(z, sigma)`` and
    ``mul(z, div(1, sigma))``."""
    sigmas = [float(s) for s in E4M3_MAGNITUDES if 2.0 ** -4 <= s <= 64.0 and np.frexp(s)[0] != 0.5]
    found = []
    for sigma in sigmas:
        for m in E2M1_MIDPOINTS + E2M1_POINTS:
            z = F32(m * sigma)
            if float(bf16_to_f32(bf16_bits(z))) != float(z):
                continue
            true = e2m1_bits(div(z, F32(sigma)))
            by_reciprocal = e2m1_bits(mul(z, div(F32(1.0), F32(sigma))))
            if true != by_reciprocal:
                found.append((sigma, m))
    return tuple(found)


def _fp4_tile(rng: np.random.Generator, sigma: float, forced: tuple[float, ...] = ()) -> np.ndarray:
    """16 values: ``6·sigma`` (the amax), the ``forced`` multiples, then random E2M1 midpoints and
    grid points times ``sigma``, each with a random sign, shuffled."""
    ms = list(forced) + list(rng.choice(E2M1_MIDPOINTS + E2M1_POINTS, size=15 - len(forced)))
    signs = np.where(rng.random(16) < 0.5, -1.0, 1.0)
    tile = np.array([6.0] + ms) * sigma * signs
    return rng.permutation(tile).astype(F32)


def _fp4_ties(v: V41Values, rng: np.random.Generator) -> None:
    sensitive = _reciprocal_sensitive()
    sigmas = [1.25, 1.75, 1.125, 0.875, 2.5, 0.625, 1.5, 3.5]
    t = v.latent.shape[0]
    for token in range(t):
        for tile in range(NOPE_DIM // 16):
            if sensitive and tile % 3 == 0:
                sigma, m = sensitive[(token * 7 + tile) % len(sensitive)]
                v.latent[token, 16 * tile:16 * tile + 16] = _fp4_tile(rng, sigma, (m, m, m))
            else:
                v.latent[token, 16 * tile:16 * tile + 16] = _fp4_tile(rng, sigmas[(token + tile) % len(sigmas)])


NUDGE = F32(1.0 + 2.0 ** -10)  # cos or sin: moves a value by far less than half a bf16 ulp


def _nudging_table(v: V41Values, rng: np.random.Generator) -> None:
    """cos/sin rows ``(1 + 2^-10, 0)`` or ``(0, 1 + 2^-10)``: every rotated value is ``±a·(1 + 2^-10)``
    for an input ``a``, which rounds back to ``a`` in bf16 (exact in binary32)."""
    swap = rng.random((v.cos_sin.shape[0], 32)) < 0.3
    v.cos_sin[:, :32] = np.where(swap, F32(0.0), NUDGE)
    v.cos_sin[:, 32:] = np.where(swap, NUDGE, F32(0.0))


def _rope_fp8_midpoints(v: V41Values, rng: np.random.Generator) -> None:
    """RoPE blocks of 32 whose amax is ``448·2^k`` and whose other values are E4M3 midpoints at that
    scale, nudged by the rotation: ``bf16`` takes them back onto the midpoint (ties to even), the
    unrounded rotated value lies above it (and the unrounded amax takes the next exponent)."""
    _nudging_table(v, rng)
    for token in range(v.latent.shape[0]):
        for block in range(NOPE_DIM // 32, 16):
            k = int(rng.integers(-8, 2))
            odd = 2 * rng.integers(0, 8, size=31) + 17
            values = np.concatenate([[448.0], odd / 16.0 * np.ldexp(1.0, rng.integers(-6, 8, size=31))])
            signs = np.where(rng.random(32) < 0.5, -1.0, 1.0)
            v.latent[token, 32 * block:32 * block + 32] = rng.permutation(values * signs * np.ldexp(1.0, k)).astype(F32)


def _rope_fp4_midpoints(v: V41Values, rng: np.random.Generator) -> None:
    """RoPE tiles of 16 with amax ``6·sigma`` and E2M1 midpoints times ``sigma``, nudged by the
    rotation as in :func:`_rope_fp8_midpoints`: ``div(bf16(o), sigma)`` is the midpoint, the
    unrounded ``o`` divided by sigma lies above it."""
    _nudging_table(v, rng)
    sigmas = [1.25, 1.75, 1.125, 0.875, 2.5, 0.625, 1.5, 3.5, 0.5, 2.0]
    for token in range(v.latent.shape[0]):
        for tile in range(NOPE_DIM // 16, 32):
            ms = rng.choice(E2M1_MIDPOINTS, size=15)
            signs = np.where(rng.random(16) < 0.5, -1.0, 1.0)
            sigma = sigmas[int(rng.integers(0, len(sigmas)))]
            v.latent[token, 16 * tile:16 * tile + 16] = rng.permutation(np.array([6.0, *ms]) * sigma * signs).astype(F32)


def _fp8_ties(v: V41Values, rng: np.random.Generator) -> None:
    t = v.latent.shape[0]
    for token in range(t):
        for block in range(NOPE_DIM // 32):
            k = int(rng.integers(-12, 4))
            odd = 2 * rng.integers(0, 8, size=31) + 17  # (17 + 2j) / 16: the midpoints between E4M3 neighbours
            e = rng.integers(-6, 8, size=31)  # E4M3 normal exponents below the amax's 448 = 1.75 * 2^8
            values = np.concatenate([[448.0], odd / 16.0 * np.ldexp(1.0, e)]) * np.ldexp(1.0, k)
            signs = np.where(rng.random(32) < 0.5, -1.0, 1.0)
            v.latent[token, 32 * block:32 * block + 32] = rng.permutation(values * signs).astype(F32)


PROFILES = {
    "normal": _normal,
    "pooled_ties": _pooled_ties,
    "zeros": _zeros,
    "huge": _huge,
    "tiny": _tiny,
    "rope_ties": _rope_ties,
    "fp4_ties": _fp4_ties,
    "fp8_ties": _fp8_ties,
    "rope_fp8_midpoints": _rope_fp8_midpoints,
    "rope_fp4_midpoints": _rope_fp4_midpoints,
}
LATENT_PROFILES = ("rope_ties", "fp4_ties", "fp8_ties", "rope_fp8_midpoints", "rope_fp4_midpoints")  # edit v41_rope_quant_store's latent


def apply_profiles(names: tuple[str, ...], values: V41Values, rng: np.random.Generator) -> None:
    """Apply each named profile in turn (``names`` from :data:`PROFILES`)."""
    for name in names:
        if name not in PROFILES:
            raise ValueError(f"values: expected profiles from {sorted(PROFILES)}, got {name!r}")
        PROFILES[name](values, rng)
