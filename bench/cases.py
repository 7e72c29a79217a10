"""Benchmark cases: the sweeps of the kernel pull requests, built with the spec's batch builders.

- C128 decode-boundary sweep: token_num 1, 2, 4, ..., 8192, 16374; every token closes a
  window of its own request; state block size 8; 2 entries per page.
- C4 sweep: 1 ... 16384 decode-boundary tokens; state block size 4; 64 entries per page.
- A realistic mixed step: decode tokens of many requests at random positions plus a chunked
  prefill of a few thousand tokens; C128 serving decode steps (512 requests at random
  positions, so only the few at a window boundary are active; 64 requests of which exactly
  one closes a window); and a C128 prefill step (one 16384-token chunk: 128 windows close).
- The save-partial-states pass over T tokens.
- The lightning indexer's compressor (SPEC §12, head width 128): the C4 decode sweep with state
  block size 16 and 64 entries per page, a mixed step, and the save pass, for ``indexer_fp8``
  and ``indexer_mxfp4`` (optionally with the Hadamard rotation); its C128 decode sweep for the
  Triton knob sweep.

Metadata comes from NumPy builders; the large buffers are filled on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spec import batch as B
from ..spec.constants import ENTRY_BYTES, HEAD_DIM, INDEXER_HEAD_DIM, ROPE_DIM, ratio_config
from ..spec.entry_layout import INDEXER_LAYOUTS, PAGED_LAYOUTS

C128_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16374)
C4_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
CACHE_BYTES_PER_ENTRY = {"flashmla_fp8": ENTRY_BYTES, "bf16": 2 * HEAD_DIM, "fp8_per_tensor": HEAD_DIM,
                         **{name: PAGED_LAYOUTS[name].entry_bytes for name in INDEXER_LAYOUTS}}
INDEXER_BLOCK_SIZE = B.INDEXER_STATE_BLOCK_SIZE[4]  # production C4 indexer state blocks: 16 rows


@dataclass(frozen=True)
class Case:
    """One benchmark row: an operation on a batch shape."""

    name: str  # e.g. "c128_decode"
    operation: str  # "compress" (compress_norm_rope_store) or "save" (save_partial_states)
    compress_ratio: int
    block_size: int
    entries_per_page: int
    token_num: int  # the x axis
    kind: str  # "decode" (every token active), "decode_step" (serving decode), "prefill", "mixed" or "save"
    layout: str = "flashmla_fp8"
    head_dim: int = HEAD_DIM  # 512, or 128 for the indexer (SPEC §12)
    hadamard: bool = False  # indexer layouts only
    active: int | None = None  # decode_step: exactly this many tokens close a window (None: random positions)

    def __post_init__(self):
        if self.active is not None and (self.kind != "decode_step" or not 0 <= self.active <= self.token_num):
            raise ValueError(f"Case.active: expected None, or 0..token_num={self.token_num} on a decode_step case, "
                             f"got {self.active!r} on kind {self.kind!r}")

    @property
    def config(self):
        return ratio_config(self.compress_ratio, self.head_dim)

    def batch(self, rng: np.random.Generator) -> B.Batch:
        r = self.compress_ratio
        if self.kind == "mixed":
            prefill = self.token_num - 512
            requests = B.mixed_requests(rng, r, num_decode=512, prefill_tokens=(prefill,), max_entries=64)
        elif self.kind == "decode_step" and self.active is not None:  # one token per request, `active` at a boundary
            requests = (B.decode_requests(self.active, r, rng, boundary=True, max_entries=64)
                        + B.decode_requests(self.token_num - self.active, r, rng, boundary=False, max_entries=64))
            requests = [requests[i] for i in rng.permutation(len(requests))]
        elif self.kind == "decode_step":  # one decode token per request at a random position
            requests = B.mixed_requests(rng, r, num_decode=self.token_num, prefill_tokens=(), max_entries=64)
        elif self.kind == "prefill":  # one chunk starting on a window boundary: token_num // r windows close
            requests = [B.chunked_prefill(r * int(rng.integers(0, 4)), self.token_num)]
        elif self.kind == "save":
            requests = B.decode_requests(self.token_num, r, rng, boundary=False, max_entries=64)
        else:
            requests = B.decode_requests(self.token_num, r, rng, max_entries=64 if r == 128 else 512)
        return B.build_batch(requests, compress_ratio=r, block_size=self.block_size,
                             entries_per_page=self.entries_per_page, rng=rng, spare_state_blocks=0, spare_pages=0)

    def bytes_moved(self, batch: B.Batch) -> int:
        """Bytes that must move through HBM: every input read once, every output written once."""
        config = self.config
        tokens = batch.num_tokens
        if self.operation == "save":
            saved = int(np.count_nonzero(batch.slot_mapping >= 0))
            row = config.state_row_width * 4
            return saved * 2 * row + tokens * 16 + config.ratio * config.state_width * 4
        active = batch.num_active
        window_bytes = config.window * 2 * self.head_dim * 4  # kv and score halves of every window row
        metadata = tokens * (4 + 8 + 8 + 8)  # token_to_req, positions, slots, kv slots
        per_entry = window_bytes + CACHE_BYTES_PER_ENTRY[self.layout] + ROPE_DIM * 4  # + the cos/sin row
        return active * per_entry + metadata + self.head_dim * 4


def c128_decode_sweep(sizes=C128_SWEEP, layout="flashmla_fp8") -> list[Case]:
    return [Case("c128_decode", "compress", 128, 8, 2, n, "decode", layout) for n in sizes]


def c4_decode_sweep(sizes=C4_SWEEP, layout="flashmla_fp8") -> list[Case]:
    return [Case("c4_decode", "compress", 4, 4, 64, n, "decode", layout) for n in sizes]


def mixed_steps() -> list[Case]:
    """Steps where few tokens are active: serving decode steps (C128: about 1 in 128 decode
    tokens closes a window; 64 tokens with exactly one active), a C128 prefill chunk of 16384
    tokens (128 active) and decode plus a prefill chunk."""
    return [Case("c128_decode_step", "compress", 128, 8, 2, 64, "decode_step", active=1),
            Case("c128_decode_step", "compress", 128, 8, 2, 512, "decode_step"),
            Case("c128_prefill_step", "compress", 128, 8, 2, 16384, "prefill"),
            Case("c128_mixed", "compress", 128, 8, 2, 4096 + 512, "mixed"),
            Case("c4_mixed", "compress", 4, 4, 64, 4096 + 512, "mixed")]


def save_sweep(sizes=(1, 64, 1024, 16384)) -> list[Case]:
    return ([Case("c128_save", "save", 128, 8, 2, n, "save") for n in sizes]
            + [Case("c4_save", "save", 4, 4, 64, n, "save") for n in sizes])


def _indexer_compress(kind: str, layout: str, hadamard: bool, token_num: int, ratio: int = 4) -> Case:
    name = f"indexer_c{ratio}_{kind}_{layout.removeprefix('indexer_')}{'_hadamard' if hadamard else ''}"
    return Case(name, "compress", ratio, B.INDEXER_STATE_BLOCK_SIZE[ratio], 64, token_num, kind, layout,
                INDEXER_HEAD_DIM, hadamard)


def indexer_decode_sweep(sizes=C4_SWEEP, layout="indexer_fp8", hadamard=False) -> list[Case]:
    """The indexer's C4 decode sweep: every token closes a window; per active token 8 KiB of state
    (8 rows x 128 kv + 128 score floats) in, one entry out."""
    return [_indexer_compress("decode", layout, hadamard, n) for n in sizes]


def indexer_c128_decode_sweep(sizes=C128_SWEEP, layout="indexer_fp8", hadamard=False) -> list[Case]:
    """The indexer kernel's C128 path on decode-boundary tokens (the knob sweep's; production
    indexers are C4): per active token 128 KiB of state (128 rows x 128 kv + 128 score floats) in."""
    return [_indexer_compress("decode", layout, hadamard, n, ratio=128) for n in sizes]


def decode_sweep(head: int, ratio: int, sizes=None, **options) -> list[Case]:
    """The decode-boundary sweep of a head width (512, or the indexer's 128) and ratio, at ``sizes``
    (None: the sweep's own); ``options``: ``layout``, and ``hadamard`` for the indexer's."""
    sweeps = {(HEAD_DIM, 128): c128_decode_sweep, (HEAD_DIM, 4): c4_decode_sweep,
              (INDEXER_HEAD_DIM, 128): indexer_c128_decode_sweep, (INDEXER_HEAD_DIM, 4): indexer_decode_sweep}
    sweep = sweeps[head, ratio]
    return sweep(tuple(sizes), **options) if sizes else sweep(**options)


def indexer_mixed_steps(layouts=INDEXER_LAYOUTS, hadamard=False) -> list[Case]:
    """512 decode tokens at random positions plus a 4096-token prefill chunk, per layout."""
    return [_indexer_compress("mixed", layout, hadamard, 4096 + 512) for layout in layouts]


def indexer_save_sweep(sizes=(1, 64, 1024, 16384)) -> list[Case]:
    return [Case("indexer_c4_save", "save", 4, INDEXER_BLOCK_SIZE, 64, n, "save", "indexer_fp8", INDEXER_HEAD_DIM) for n in sizes]
