"""A second, independent implementation of SPEC.md in plain torch (CPU or CUDA).

It shares no arithmetic with ``dsv4_compressor.spec`` (only the SPEC §9 argument checks,
:mod:`.torch_calls`): constants are retyped from SPEC.md, the
tree is written recursively (halves) rather than level by level, bf16 and E4M3 come from
torch's own conversions, and the UE8M0 exponent from ``frexp`` (exact comparisons, no log2).
Agreement between the two, byte for byte, is the evidence that each reads SPEC.md right.

Every float32 operation is a separate torch elementwise op, never fused. Additions and
multiplications are torch's float32 ops (hardware, correctly rounded). Division and square
root are not taken from torch's float32 kernels: torch 2.13's CPU ``sqrt`` on float32 is
*not* correctly rounded (it was seen 1 ulp off), so :func:`div` rounds a float64 quotient
(exact for binary32 operands) and :func:`sqrt` rounds a float64 root and then corrects it
with exact float64 comparisons. Slow and meant for checking, not serving.

SPEC §13's state formats follow §13's text: a bf16 state holds ``x.to(torch.bfloat16)`` (torch's
round to nearest even) and is read by ``.to(float32)``; ``ape`` is added in the save or to every
row pooling reads (``ape_at``); a ring looks position ``q`` up at ``q mod C``; and
``compress_and_save`` takes a window's rows at or after the chunk's first position from its own
``kv``/``score``, stored and read back as the save and pooling would, compresses, then saves.

``TorchReference`` also takes *mutations*: deliberate deviations (the scale floor of
vLLM's CuTe kernels, RoPE at the token's own position, approximate exp2, ...) so the
conformance suite can prove it catches each of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from .capabilities import STATE_FORMATS, Capabilities
from .torch_calls import (
    ChunkRows, RowSource, StateOptions, StoreArgs, check_pooling, check_save, check_step_inputs, check_store_args,
)

F32 = torch.float32
MUTATIONS = (
    "scale_floor",  # UE8M0 from max(amax/448, 1e-4) instead of max(amax, 1e-4) (SPEC §11)
    "rope_at_token_position",  # rotate with cos_sin_cache[p] instead of [(p // r) * r]
    "approximate_exp2",  # exp(x * ln 2) in binary32 instead of exp2s (an engine's approximate exp)
    "skip_invalid_rows",  # leave C4's invalid rows out of the trees instead of adding +0
    "write_non_boundary",  # also store entries for non-boundary tokens with a kv slot
    "rope_rounded_to_bf16_first",  # rotate bf16(y) instead of the fp32 y (DeepSeek reference)
    "pad_byte_ff",  # write 0xFF as the scale record's pad byte
    "sequential_sum",  # left-to-right sums instead of the pairwise trees
    # one-ulp arithmetic slips
    "interleaved_tree",  # pairwise trees pairing even and odd elements instead of halves
    "fma_exp2",  # the exp2s polynomial with fused multiply-adds (one rounding per step)
    "fma_rope",  # RoPE with a fused multiply-add: a·co - bf(b·si) rounded once
    "weight_first",  # y = x·(rr·w) instead of (x·rr)·w
    "rsqrt_rounded_once",  # rr = 1/sqrt(v) rounded once instead of div(1, sqrt(v))
    "eps_before_mean",  # ms = (ss + eps)·2^-9 instead of ss·2^-9 + eps
    "exp2_cutoff_inclusive",  # exp2s(-126) = +0 (the cut-off taken as x <= -126)
    "exp2_no_cutoff",  # no cut-off: 2^j subnormal below -126
    # the sign of a zero only
    "plus_zero_sum",  # the trees added onto a +0 accumulator: a sum of -0 gives +0 (acc = 0; acc += v)
    # activity, slots and addressing
    "active_without_state_slot",  # a boundary token with a cache slot is active even without a state slot
    "padding_is_minus_one",  # only slot -1 means padding (other negative slots index from the end)
    "power_of_two_block_size",  # state block index and row by shift and mask (block size rounded down to 2^k)
    "ape_by_slot",  # the save adds ape[slot mod r] instead of ape[p mod r]
    "assume_contiguous_inputs",  # reads every input array as if it were contiguous
    "position_low_16_bits",  # the RoPE row from a 16-bit position
    # the indexer compressor (SPEC §12)
    "mxfp4_nibble_order",  # the even channel in the high nibble
    "indexer_scale_from_unrounded",  # the block exponent from max |z| instead of max |bf16(z)|
    "hadamard_stages_reversed",  # the butterfly stages with spans 1, 2, ..., 64
    "mxfp4_ties_away",  # E2M1 ties rounded away from zero instead of to the even code
    # the state formats (SPEC §13)
    "ape_added_twice",  # with ape_at="compress" the save adds ape too (and pooling adds it again)
    "ape_at_token_position",  # pooling's ape row from the boundary token's p mod r, not each row's pos_i mod r
    "bf16_by_truncation",  # a bf16 state stores the high 16 bits of binary32 (rounds toward zero)
    "ring_without_modulo",  # a ring looks position q up at q, not q mod C (reading past the request's blocks)
    "chunk_rows_from_state",  # compress_and_save reads every window row from the state, none from kv/score
    "save_before_compress_on_ring",  # compress_and_save on a ring saves the tail first, then compresses
)
POOL_CHUNK = 256  # tokens pooled at a time (bounds the memory of the gathered windows)
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # SPEC §12, retyped
HADAMARD_H = 0x3DB504F3  # 128^-1/2 rounded to binary32 (SPEC §12)


def div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Correctly rounded binary32 a / b: the float64 quotient rounds once more without harm
    (53 >= 2*24 + 2 bits)."""
    return (a.double() / b.double()).float()


def sqrt(v: torch.Tensor) -> torch.Tensor:
    """Correctly rounded binary32 sqrt(v), v >= 0: a candidate, then the exact test
    ``(r - u/2)^2 < v < (r + u/2)^2`` (midpoints have 25 bits, their squares are exact in
    float64) moves it by one ulp if needed."""
    v64 = v.double()
    r = torch.sqrt(v64).float()
    down = torch.nextafter(r, torch.zeros_like(r))
    up = torch.nextafter(r, torch.full_like(r, math.inf))
    low_mid = (r.double() + down.double()) / 2
    high_mid = (r.double() + up.double()) / 2
    r = torch.where(v64 < low_mid * low_mid, down, r)
    return torch.where(v64 > high_mid * high_mid, up, r)


def times_pow2(v: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """Binary32 ``v * 2^exponent`` rounded once: 2^exponent from a float64 exponent field
    (torch's pow/ldexp on CPU go through approximate vector math)."""
    power = ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)
    return (v.double() * power).float()


def _exponent_above(a: torch.Tensor, m: float, e: int) -> torch.Tensor:
    """The smallest integer k with a <= (m·2^e)·2^k for a > 0 and 1/2 <= m < 1, from frexp (exact
    on every device, where a rounded log2 is not: CUDA's may miss an exact power of two).

    With a = f·2^g, 1/2 <= f < 1: (m·2^e)·2^(g-e) = m·2^g holds a iff f <= m, and m·2^(g-e-1)
    < 2^(g-1) <= a never does; so k = g - e, plus one when f > m.
    """
    f, g = torch.frexp(a.double())
    return (g.to(torch.int64) - e) + (f > m).to(torch.int64)


def _bits_to_f32(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int32).view(F32)[0]


@dataclass(frozen=True)
class _Constants:
    log2e: torch.Tensor
    amin: torch.Tensor
    coeffs: tuple[torch.Tensor, ...]


def _constants(device) -> _Constants:
    # SPEC §1/§2, retyped from SPEC.md.
    coeffs = (0x3F800000, 0x3F317218, 0x3E75FDED, 0x3D63576A, 0x3C1D96DE, 0x3AAFA2B5, 0x3920E999)
    return _Constants(
        log2e=_bits_to_f32(0x3FB8AA3B).to(device),
        amin=_bits_to_f32(0x38D1B717).to(device),
        coeffs=tuple(_bits_to_f32(c).to(device) for c in coeffs),
    )


class TorchReference:
    """SPEC.md in torch; ``mutations`` (names from :data:`MUTATIONS`) make it deviate on purpose."""

    SUPPORTED_DEVICES = ("cpu", "cuda")
    CAPABILITIES = Capabilities(devices=("cpu", "cuda"), head_widths=(512, 128), **STATE_FORMATS)

    def __init__(self, mutations: tuple[str, ...] = ()):
        unknown = set(mutations) - set(MUTATIONS)
        if unknown:
            raise ValueError(f"mutations: expected names from {MUTATIONS}, got {sorted(unknown)}")
        self.mutations = frozenset(mutations)
        self.name = "torch" + "".join(f"+{m}" for m in sorted(self.mutations))

    # ---- arithmetic --------------------------------------------------------------------
    def _sum(self, v: torch.Tensor, dim: int) -> torch.Tensor:
        """Sum over ``dim`` of float32 ``v``: SPEC's tree, onto a ``+0`` accumulator with
        ``plus_zero_sum`` (which changes nothing but the sign of a zero sum)."""
        if "plus_zero_sum" in self.mutations:
            return torch.zeros_like(v.select(dim, 0)) + self._tree(v, dim)
        return self._tree(v, dim)

    def _tree(self, v: torch.Tensor, dim: int) -> torch.Tensor:
        """SPEC tree: add(tree(first half), tree(second half)), recursively (or the order of
        ``interleaved_tree`` or ``sequential_sum``)."""
        n = v.shape[dim]
        if "interleaved_tree" in self.mutations and n > 1:
            even, odd = v.narrow(dim, 0, n).unfold(dim, 2, 2).unbind(-1)
            return self._tree(even, dim) + self._tree(odd, dim)
        if "sequential_sum" in self.mutations:
            acc = v.select(dim, 0)
            for i in range(1, n):
                acc = acc + v.select(dim, i)
            return acc
        if n == 1:
            return v.select(dim, 0)
        first, second = v.split(n // 2, dim=dim)
        return self._tree(first, dim) + self._tree(second, dim)

    def _exp2(self, x: torch.Tensor, c: _Constants) -> torch.Tensor:
        if "approximate_exp2" in self.mutations:
            # an engine's exp: e^(x ln 2) with the argument x ln 2 rounded to binary32 (the
            # exponential itself in float64, so the deviation does not depend on the CPU)
            return torch.exp((x * math.log(2.0)).double()).float()
        j = torch.round(x.clamp(min=-126.0))  # round half to even; exact
        f = x.clamp(min=-126.0) - j
        p = c.coeffs[6].expand_as(f)
        for k in range(5, -1, -1):
            if "fma_exp2" in self.mutations:
                p = (p.double() * f.double() + c.coeffs[k].double()).float()
            else:
                p = p * f + c.coeffs[k]  # two ops: the product is rounded before the add
        if "exp2_no_cutoff" in self.mutations:
            j = torch.round(x)
            p2 = self._exp2_poly(x - j, c)
            return (p2.double() * torch.exp2(j.double())).float()
        result = times_pow2(p, j)
        if "exp2_cutoff_inclusive" in self.mutations:
            return torch.where(x <= -126.0, torch.zeros_like(result), result)
        return torch.where(x < -126.0, torch.zeros_like(result), result)

    @staticmethod
    def _exp2_poly(f: torch.Tensor, c: _Constants) -> torch.Tensor:
        p = c.coeffs[6].expand_as(f)
        for k in range(5, -1, -1):
            p = p * f + c.coeffs[k]
        return p

    def _rsqrt(self, v: torch.Tensor) -> torch.Tensor:
        """rr = div(1, sqrt(v)), two correctly rounded operations."""
        if "rsqrt_rounded_once" in self.mutations:
            return (1.0 / torch.sqrt(v.double())).float()
        return div(torch.ones_like(v), sqrt(v))

    def _normalize(self, x: torch.Tensor, rr: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """y = mul(mul(x, rr), w) for x [n, 512], rr [n], w [512]."""
        if "weight_first" in self.mutations:
            return x * (rr[:, None] * w[None, :])
        return (x * rr[:, None]) * w[None, :]

    def _rotate(self, a, b, co, si):
        """RoPE pairs: (sub(mul(a, co), mul(b, si)), add(mul(a, si), mul(b, co)))."""
        if "fma_rope" in self.mutations:
            return ((a.double() * co.double() - (b * si).double()).float(),
                    (a.double() * si.double() + (b * co).double()).float())
        return a * co - b * si, a * si + b * co

    def _padding(self, slots: torch.Tensor) -> torch.Tensor:
        """Which slots mean "none" (SPEC §3/§9: any negative slot)."""
        return slots == -1 if "padding_is_minus_one" in self.mutations else slots < 0

    def _block_and_row(self, pos: torch.Tensor, block_size: int):
        """(block column, row) of a position or slot."""
        if "power_of_two_block_size" in self.mutations:
            shift = block_size.bit_length() - 1
            return pos >> shift, pos & ((1 << shift) - 1)
        return pos // block_size, pos % block_size

    def _inputs(self, *tensors):
        """The input arrays as this implementation reads them."""
        if "assume_contiguous_inputs" not in self.mutations:
            return tensors
        return tuple(t if t is None else torch.as_strided(t, t.shape, torch.empty(t.shape, device="meta").stride(),
                                                          t.storage_offset())
                     for t in tensors)

    @staticmethod
    def _bf16(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(F32)

    def _ue8m0(self, amax: torch.Tensor, c: _Constants) -> torch.Tensor:
        """The smallest k with max(amax, AMIN) <= 448·2^k (448 = 0.875·2^9), exactly."""
        if "scale_floor" in self.mutations:
            scale = torch.maximum(amax.double() / 448.0, c.amin.double().new_tensor(1e-4))
            return torch.ceil(torch.log2(scale)).to(torch.int64)
        return _exponent_above(torch.maximum(amax, c.amin), 0.875, 9)

    # ---- SPEC §12 ----------------------------------------------------------------------
    def _hadamard(self, z: torch.Tensor) -> torch.Tensor:
        """Seven butterfly stages (spans 64, 32, ..., 1), each (a + b, a - b), then times h."""
        n = z.shape[0]
        for span in self._hadamard_spans():
            pairs = z.reshape(n, 128 // (2 * span), 2, span)
            first, second = pairs[:, :, 0], pairs[:, :, 1]
            z = torch.stack([first + second, first - second], dim=2).reshape(n, 128)
        return z * _bits_to_f32(HADAMARD_H).to(z.device)

    def _hadamard_spans(self) -> tuple[int, ...]:
        return (1, 2, 4, 8, 16, 32, 64) if "hadamard_stages_reversed" in self.mutations else (64, 32, 16, 8, 4, 2, 1)

    def _e2m1(self, v: torch.Tensor) -> torch.Tensor:
        """E2M1 codes of binary32 v (|v| <= 6 after the scaling): nearest grid point, ties to the
        even code, sign bit kept."""
        magnitude = v.abs().double().clamp(max=6.0)
        code = torch.zeros_like(v, dtype=torch.int64)
        for i in range(7):
            middle = (E2M1_GRID[i] + E2M1_GRID[i + 1]) / 2
            up_at_tie = "mxfp4_ties_away" in self.mutations or (i + 1) % 2 == 0
            code += (magnitude > middle) | ((magnitude == middle) & up_at_tie)
        negative = torch.signbit(v)
        return (code | (negative.to(torch.int64) << 3)).to(torch.uint8)

    def _store_indexer(self, q, z, slots, k_cache, layout, c) -> None:
        """q = bf16(z) [n, 128] (z: the unrounded values) into the indexer's pages."""
        device = q.device
        entries = k_cache.shape[1]
        entry = k_cache.shape[2]
        page, offset = slots // entries, slots % entries
        page_stride = k_cache.stride(0) if k_cache.shape[0] > 1 else entries * entry
        pages = torch.as_strided(k_cache, (k_cache.shape[0], entries * entry), (page_stride, 1))
        source = z if "indexer_scale_from_unrounded" in self.mutations else q
        if layout == "indexer_fp8":
            k = self._ue8m0(source.abs().amax(dim=1), c)
            scaled = times_pow2(q, (-k)[:, None].expand_as(q)).clamp(-448.0, 448.0)
            codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
            pages[page[:, None], (offset * 128)[:, None] + torch.arange(128, device=device)] = codes
            scale = ((k + 127) << 23).to(torch.int32).view(torch.uint8).reshape(-1, 4)  # binary32 2^k, little-endian
            pages[page[:, None], (entries * 128 + offset * 4)[:, None] + torch.arange(4, device=device)] = scale
            return
        blocks = q.reshape(-1, 4, 32)
        a = torch.maximum(source.reshape(-1, 4, 32).abs().amax(dim=2).double(), torch.tensor(6.0 * 2.0 ** -126, dtype=torch.float64))
        k = _exponent_above(a, 0.75, 3)  # the smallest k with a <= 6·2^k (6 = 0.75·2^3)
        v = times_pow2(blocks, (-k)[:, :, None].expand_as(blocks))
        codes = self._e2m1(v).reshape(-1, 128).to(torch.int64)
        low, high = codes[:, 0::2], codes[:, 1::2]
        if "mxfp4_nibble_order" in self.mutations:
            low, high = high, low
        packed = (low | (high << 4)).to(torch.uint8)
        pages[page[:, None], (offset * 64)[:, None] + torch.arange(64, device=device)] = packed
        pages[page[:, None], (entries * 64 + offset * 4)[:, None] + torch.arange(4, device=device)] = (k + 127).to(torch.uint8)

    # ---- SPEC §13: what a state row holds ---------------------------------------------------
    def _encode(self, values: torch.Tensor, state_cache: torch.Tensor) -> torch.Tensor:
        """fp32 values as ``state_cache`` stores them: as they are, or rounded to bf16 (SPEC §13.1)."""
        if state_cache.dtype != torch.bfloat16:
            return values
        if "bf16_by_truncation" in self.mutations:
            return (values.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
        return values.to(torch.bfloat16)  # nearest, ties to even

    def _stored_score(self, score: torch.Tensor, ape_rows: torch.Tensor | None, ape_at: str) -> torch.Tensor:
        """The score a save stores, before encoding: ``score + ape`` with ``ape_at="save"``, raw with
        ``"compress"`` (SPEC §13.2)."""
        adds = ape_at == "save" or "ape_added_twice" in self.mutations
        return score + ape_rows if adds and ape_rows is not None else score

    @staticmethod
    def _read_score(stored: torch.Tensor, ape_rows: torch.Tensor | None, ape_at: str) -> torch.Tensor:
        """A stored score (fp32) as pooling reads it: plus ``ape`` with ``ape_at="compress"``."""
        return stored + ape_rows if ape_at == "compress" and ape_rows is not None else stored

    # ---- SPEC §4 -----------------------------------------------------------------------
    def save_partial_states(self, kv_score, ape, positions, slot_mapping, state_cache, block_size, *, ape_at="save",
                            ring_capacity=None):
        options = StateOptions(ape, ape_at, ring_capacity)
        check_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, options)
        kv_score, ape, positions, slot_mapping = self._inputs(kv_score, ape, positions, slot_mapping)
        width = kv_score.shape[1] // 2
        self._save(kv_score[:, :width], kv_score[:, width:], positions, slot_mapping, state_cache, block_size,
                   StateOptions(ape, ape_at, ring_capacity))

    def _save(self, kv, score, positions, slot_mapping, state_cache, block_size, options: StateOptions) -> None:
        """Every token with a slot: ``kv`` and the stored score (SPEC §4, §13.1, §13.2) at its slot.
        ``kv``, ``score``: fp32 [T, SW]; ``positions``, ``slot_mapping``: int64 [T]."""
        width = kv.shape[1]
        saved = torch.nonzero(~self._padding(slot_mapping)).flatten()
        slots = slot_mapping[saved]
        blocks, offsets = self._block_and_row(slots, block_size)
        ape_rows = None
        if options.ape is not None:
            row_of_ape = slots if "ape_by_slot" in self.mutations else positions[saved]
            ape_rows = options.ape[row_of_ape % options.ape.shape[0]]
        state_cache[blocks, offsets, :width] = self._encode(kv[saved], state_cache)
        state_cache[blocks, offsets, width:] = self._encode(self._stored_score(score[saved], ape_rows, options.ape_at),
                                                           state_cache)

    # ---- SPEC §5 (with §13's rows) ---------------------------------------------------------
    def _state_rows(self, rows: RowSource, requests, pos):
        """The stored rows of positions ``pos`` (int64 [n, W], >= 0) of requests ``requests`` (int [n])
        as fp32 ``(kv, score)`` [n, W, SW] each: paged at ``pos``, in a ring at ``pos mod C``."""
        ring = rows.options.ring_capacity
        index = pos if ring is None or "ring_without_modulo" in self.mutations else pos % ring
        column, row_in_block = self._block_and_row(index, rows.block_size)
        table = rows.block_table
        if ring is not None and "ring_without_modulo" in self.mutations:  # block_table[req, q // bs], read past the row
            flat = (requests[:, None].long() * table.shape[1] + column).clamp(max=table.numel() - 1)
            blocks = table.reshape(-1)[flat].long()
        else:
            blocks = table[requests[:, None].long(), column].long()
        stored = rows.state_cache[blocks, row_in_block].to(F32)  # [n, W, 2*SW]; a bf16 element is exact in fp32
        width = stored.shape[2] // 2
        return stored[:, :, :width], stored[:, :, width:]

    def _ape_rows(self, ape, pos, positions):
        """fp32 [n, W, SW]: ``ape[pos mod r]`` of each window row (``pos`` int64 [n, W] of tokens at
        ``positions`` int64 [n]), or None without ``ape``."""
        if ape is None:
            return None
        if "ape_at_token_position" in self.mutations:
            pos = positions[:, None].expand_as(pos)
        return ape[pos % ape.shape[0]]

    def _chunk_rows(self, rows: RowSource, requests, pos, ape_rows):
        """SPEC §13.4: ``(from_chunk [n, W], kv, score [n, W, SW])``: the rows at or after each request's
        chunk start ``P0``, from token ``query_start_loc[req] + (q - P0)`` stored as the save would
        store it (``state_cache``'s dtype) and read back as pooling reads it."""
        chunk, ape_at = rows.chunk, rows.options.ape_at
        last = chunk.positions.shape[0] - 1
        start = chunk.query_start_loc[requests.long()].long()  # [n]
        first = chunk.positions[start.clamp(max=last)]  # P0 of each token's request
        from_chunk = pos >= first[:, None]
        u = (start[:, None] + (pos - first[:, None])).clamp(0, last)  # [n, W]
        kv = self._encode(chunk.kv[u], rows.state_cache).to(F32)
        stored = self._encode(self._stored_score(chunk.score[u], ape_rows, ape_at), rows.state_cache).to(F32)
        return from_chunk, kv, self._read_score(stored, ape_rows, ape_at)

    def _window_rows(self, rows: RowSource, requests, positions, window: int):
        """fp32 ``(kv, score)`` [n, W, SW] of each token's window, as pooling reads them, and ``valid``
        [n, W] (rows at positions < 0 hold whatever row 0 holds; they are masked later)."""
        i = torch.arange(window, device=positions.device)
        pos = positions[:, None] - window + 1 + i[None, :]
        valid = pos >= 0
        safe = pos.clamp(min=0)
        ape_rows = self._ape_rows(rows.options.ape, safe, positions)
        kv, stored = self._state_rows(rows, requests, safe)
        score = self._read_score(stored, ape_rows, rows.options.ape_at)
        if rows.chunk is not None:
            from_chunk, chunk_kv, chunk_score = self._chunk_rows(rows, requests, safe, ape_rows)
            kv = torch.where(from_chunk[:, :, None], chunk_kv, kv)
            score = torch.where(from_chunk[:, :, None], chunk_score, score)
        return kv, score, valid

    def _pool(self, rows: RowSource, requests, positions, ratio, c):
        overlap = 2 if ratio == 4 else 1
        head = rows.state_cache.shape[2] // (2 * overlap)
        window = overlap * ratio
        rows_kv, rows_score, valid = self._window_rows(rows, requests, positions, window)
        kv_parts, score_parts = [], []
        for row in range(window):
            h = row // ratio
            kv_parts.append(rows_kv[:, row, h * head:(h + 1) * head])
            score_parts.append(rows_score[:, row, h * head:(h + 1) * head])
        kv = torch.stack(kv_parts, dim=1)
        score = torch.stack(score_parts, dim=1)
        v3 = valid[:, :, None]
        m = torch.where(v3, score, torch.full_like(score, -math.inf)).amax(dim=1, keepdim=True)
        e = self._exp2((torch.where(v3, score, m) - m) * c.log2e, c)
        u = kv * e
        if "skip_invalid_rows" in self.mutations:
            # a kernel that loops over the valid rows only (C4's first window: rows 4..7)
            return torch.stack([div(self._sum(u[t][valid[t]], 0), self._sum(e[t][valid[t]], 0)) for t in range(u.shape[0])])
        zero = torch.zeros_like(e)
        e = torch.where(v3, e, zero)
        u = torch.where(v3, u, zero)
        return div(self._sum(u, 1), self._sum(e, 1))

    # ---- SPEC §6-§8 ----------------------------------------------------------------------
    def compress_norm_rope_store(
        self, state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
        rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, *,
        compress_ratio, layout="flashmla_fp8", fp8_scale=None, hadamard=False, ape=None, ape_at="save", ring_capacity=None,
    ):
        options = StateOptions(ape, ape_at, ring_capacity)
        store = StoreArgs(rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, hadamard)
        pooling = check_pooling(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                kv_slot_mapping, compress_ratio, options)  # SPEC §9 is shared, the arithmetic not
        check_store_args(store, state_cache, pooling.config.head_dim)
        (token_to_req_indices, positions, slot_mapping, block_table, ape) = self._inputs(
            token_to_req_indices, positions, slot_mapping, block_table, ape)
        rows = RowSource(state_cache, block_table, block_size, StateOptions(ape if ape_at == "compress" else None, ape_at,
                                                                            ring_capacity))
        self._compress_store(rows, token_to_req_indices, positions, slot_mapping, kv_slot_mapping, compress_ratio, store)

    def _compress_store(self, rows: RowSource, token_to_req_indices, positions, slot_mapping, kv_slot_mapping,
                        compress_ratio: int, store: StoreArgs) -> None:
        """SPEC §5-§7 (§12) for every active token, its window read from ``rows``. Per-token arrays:
        int32/int64 [T]."""
        rms_norm_weight, cos_sin_cache, kv_slot_mapping = self._inputs(store.rms_norm_weight, store.cos_sin_cache,
                                                                       kv_slot_mapping)
        rms_norm_eps, k_cache, layout, fp8_scale = store.rms_norm_eps, store.k_cache, store.layout, store.fp8_scale
        device = rows.state_cache.device
        c = _constants(device)
        r = compress_ratio
        boundary = (positions + 1) % r == 0
        if "write_non_boundary" in self.mutations:
            boundary = torch.ones_like(boundary)
        saved = torch.ones_like(boundary) if "active_without_state_slot" in self.mutations else ~self._padding(slot_mapping)
        active = saved & boundary & ~self._padding(kv_slot_mapping)
        tokens = torch.nonzero(active).flatten()
        if tokens.numel() == 0:
            return
        p = positions[tokens]
        requests = token_to_req_indices[tokens]
        x = torch.cat([self._pool(rows, requests[i:i + POOL_CHUNK], p[i:i + POOL_CHUNK], r, c)
                       for i in range(0, len(tokens), POOL_CHUNK)])
        eps = torch.tensor(rms_norm_eps, dtype=F32, device=device)
        ss = self._sum(x * x, 1)
        head = x.shape[1]
        if "eps_before_mean" in self.mutations:
            rr = self._rsqrt((ss + eps) * (1.0 / head))
        else:
            rr = self._rsqrt(ss * (1.0 / head) + eps)
        y = self._normalize(x, rr, rms_norm_weight.to(F32))
        # RoPE
        cp = p if "rope_at_token_position" in self.mutations else (p // r) * r
        if "position_low_16_bits" in self.mutations:
            cp = cp & 0xFFFF
        cs = cos_sin_cache[cp]
        ry = self._bf16(y) if "rope_rounded_to_bf16_first" in self.mutations else y
        start = head - 64  # RoPE channels: 448..511, or 64..127 for the indexer
        a, b = ry[:, start::2], ry[:, start + 1::2]
        co, si = cs[:, :32], cs[:, 32:]
        o0, o1 = self._rotate(a, b, co, si)
        if layout in ("indexer_fp8", "indexer_mxfp4"):
            z = torch.cat([y[:, :start], torch.stack([o0, o1], dim=2).reshape(-1, 64)], dim=1)
            self._store_indexer(self._bf16(self._hadamard(z)) if store.hadamard else self._bf16(z), z,
                                kv_slot_mapping[tokens], k_cache, layout, c)
            return
        rope = torch.stack([o0, o1], dim=2).reshape(-1, 64).to(torch.bfloat16)
        slots = kv_slot_mapping[tokens]
        entries = k_cache.shape[1]
        page, offset = slots // entries, slots % entries
        nope = self._bf16(y[:, :448])
        if layout == "flashmla_fp8":
            blocks = nope.reshape(-1, 7, 64)
            k = self._ue8m0(blocks.abs().amax(dim=2), c)
            scaled = times_pow2(blocks, (-k)[:, :, None].expand_as(blocks)).clamp(-448.0, 448.0)
            codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1, 448)
            scale_bytes = (k + 127).to(torch.uint8)
            pad = torch.full((tokens.numel(), 1), 0xFF if "pad_byte_ff" in self.mutations else 0, dtype=torch.uint8, device=device)
            page_stride = k_cache.stride(0) if k_cache.shape[0] > 1 else entries * 584
            pages = torch.as_strided(k_cache, (k_cache.shape[0], entries * 584), (page_stride, 1))
            data = torch.cat([codes, rope.view(torch.uint8).reshape(-1, 128)], dim=1)
            columns = (offset * 576)[:, None] + torch.arange(576, device=device)
            pages[page[:, None], columns] = data
            scale_columns = (entries * 576 + offset * 8)[:, None] + torch.arange(8, device=device)
            pages[page[:, None], scale_columns] = torch.cat([scale_bytes, pad], dim=1)
        elif layout == "bf16":
            k_cache[page, offset] = torch.cat([nope.to(torch.bfloat16), rope], dim=1)
        else:
            inv = div(torch.ones(1, device=device), torch.tensor([fp8_scale], dtype=F32, device=device))
            z = torch.cat([nope, rope.to(F32)], dim=1)
            k_cache[page, offset] = (z * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

    # ---- SPEC §13.4 ------------------------------------------------------------------------
    def compress_and_save(
        self, kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs,
        state_cache, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, *, compress_ratio,
        layout="flashmla_fp8", fp8_scale=None, ape_at="save", ring_capacity=None, hadamard=False,
    ):
        """Compress every active token, a window's rows at or after its chunk's first position taken
        from ``kv``/``score`` (fp32 [T, SW] each), then save the tokens with ``save_slot_mapping >= 0``."""
        options = StateOptions(ape, ape_at, ring_capacity)
        store = StoreArgs(rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, hadamard)
        pooling = check_pooling(state_cache, token_to_req, positions, slot_mapping, block_table, bs, kv_slot_mapping,
                                compress_ratio, options, token_name="token_to_req")
        check_step_inputs(kv, score, ape, query_start_loc, save_slot_mapping, block_table, pooling)
        check_store_args(store, state_cache, pooling.config.head_dim)
        (kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping,
         block_table) = self._inputs(kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping,
                                     save_slot_mapping, block_table)
        options = StateOptions(ape, ape_at, ring_capacity)
        chunk = None if "chunk_rows_from_state" in self.mutations else ChunkRows(kv, score, positions, query_start_loc)
        rows = RowSource(state_cache, block_table, bs, options, chunk)
        save_first = ring_capacity is not None and "save_before_compress_on_ring" in self.mutations
        if save_first:
            self._save(kv, score, positions, save_slot_mapping, state_cache, bs, options)
        self._compress_store(rows, token_to_req, positions, slot_mapping, kv_slot_mapping, compress_ratio, store)
        if not save_first:
            self._save(kv, score, positions, save_slot_mapping, state_cache, bs, options)


    # ---- SPEC §8's combined call ------------------------------------------------------------
    def save_and_compress_norm_rope_store(self, kv_score, ape, state_cache, token_to_req_indices, positions, slot_mapping,
                                          block_table, block_size, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache,
                                          kv_slot_mapping, *, compress_ratio, layout="flashmla_fp8", fp8_scale=None,
                                          hadamard=False):
        """The save, then the compress, on the same state cache; both calls' arguments are
        validated before either writes (SPEC §9)."""
        keywords = dict(compress_ratio=compress_ratio, layout=layout, fp8_scale=fp8_scale, hadamard=hadamard)
        options = StateOptions(ape, "save", None)
        pooling = check_pooling(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                kv_slot_mapping, compress_ratio, options)
        check_store_args(StoreArgs(rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, layout, fp8_scale, hadamard),
                         state_cache, pooling.config.head_dim)
        check_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, options)
        self.save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size)
        self.compress_norm_rope_store(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                                      rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, **keywords)


# One instance per mutation, loadable as e.g.
# ``--impl dsv4_compressor.conformance.torch_reference:MUTANTS.scale_floor``.
MUTANTS = SimpleNamespace(**{m: TorchReference((m,)) for m in MUTATIONS})
