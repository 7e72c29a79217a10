"""SPEC §13.1-§13.3: the state formats, one frozen descriptor that owns what a state row holds
and where the row of a position lives.

- **dtype** (§13.1): ``"fp32"`` (§3) or ``"bf16"``; the state tensor's dtype selects it (the
  spec carries a bf16 state as ``uint16`` bit patterns). A bf16 state stores each element
  rounded once from binary32 (nearest, ties to even) and reads it back exactly.
- **ape_at** (§13.2): ``"save"`` (§4: the stored score already includes ``ape``) or
  ``"compress"`` (the stored score is raw; pooling adds ``ape[pos mod r]`` to every row it reads).
- **ring_capacity** (§13.3): ``None`` (paged: position ``q`` lives at
  ``block_table[req, q // bs]``, offset ``q mod bs``) or ``C`` (a ring of ``C`` rows in the first
  ``C / bs`` blocks of the request's block-table row: ``q mod C`` in place of ``q``).

The defaults are §3-§5 exactly. Every saved row goes through :meth:`StateFormat.save_row` and
every row that pooling reads through :meth:`StateFormat.read_row`, whether it comes from the
state or, in §13.4's step call, from the call's own inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arithmetic import add
from .formats import bf16_bits, bf16_to_f32

F32 = np.float32
STATE_DTYPES = ("fp32", "bf16")  # §13.1
APE_AT = ("save", "compress")  # §13.2
_STORAGE = {"fp32": np.dtype(np.float32), "bf16": np.dtype(np.uint16)}  # bf16 as bit patterns


@dataclass(frozen=True)
class StateFormat:
    """What a state row holds (``dtype``, ``ape_at``) and where a position's row is (``ring_capacity``)."""

    dtype: str = "fp32"  # "fp32" or "bf16" (SPEC §13.1)
    ape_at: str = "save"  # "save" or "compress" (SPEC §13.2)
    ring_capacity: int | None = None  # None: paged; C: a ring of C rows per request (SPEC §13.3)

    def __post_init__(self):
        if self.dtype not in STATE_DTYPES:
            raise ValueError(f"dtype: expected one of {STATE_DTYPES}, got {self.dtype!r}")
        if self.ape_at not in APE_AT:
            raise ValueError(f"ape_at: expected one of {APE_AT}, got {self.ape_at!r}")
        if self.ring_capacity is not None and (isinstance(self.ring_capacity, bool) or int(self.ring_capacity) < 1):
            raise ValueError(f"ring_capacity: expected None or a positive integer, got {self.ring_capacity!r}")

    @classmethod
    def of(cls, state_cache: np.ndarray, ape_at: str = "save", ring_capacity: int | None = None) -> "StateFormat":
        """The format of a NumPy state cache: ``float32`` is fp32, ``uint16`` (bf16 bit patterns) bf16."""
        by_storage = {storage: name for name, storage in _STORAGE.items()}
        if state_cache.dtype not in by_storage:
            raise ValueError(f"state_cache: expected dtype float32 or uint16 (bf16 bit patterns), got {state_cache.dtype}")
        return cls(by_storage[state_cache.dtype], ape_at, ring_capacity)

    @property
    def storage(self) -> np.dtype:
        """The NumPy dtype of a state-cache element: ``float32``, or ``uint16`` bf16 bit patterns."""
        return _STORAGE[self.dtype]

    # ---- where a row lives -------------------------------------------------------------------
    def row_of(
        self,
        block_table: np.ndarray,  # int32 [num_reqs, max_blocks]
        requests: np.ndarray,  # int [...]: block-table row of each position (broadcast with positions)
        positions: np.ndarray,  # int64 [...]: absolute positions >= 0
        block_size: int,  # bs
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(block, offset)`` of each position's state row: paged ``block_table[req, q // bs]``,
        ``q mod bs``; in a ring, the same with ``q mod C`` in place of ``q``."""
        index = positions if self.ring_capacity is None else positions % self.ring_capacity
        return block_table[requests, index // block_size], index % block_size

    # ---- what a row holds ----------------------------------------------------------------------
    def encode(self, values: np.ndarray) -> np.ndarray:
        """binary32 values as stored: copied (fp32), or rounded once to bf16 (RNE) as ``uint16`` patterns."""
        values = np.asarray(values, dtype=F32)
        return bf16_bits(values) if self.dtype == "bf16" else values.copy()

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """Stored elements as the binary32 values they represent (exact)."""
        return bf16_to_f32(stored) if self.dtype == "bf16" else np.asarray(stored, dtype=F32)

    def save_row(
        self,
        kv: np.ndarray,  # float32 [..., SW]
        score: np.ndarray,  # float32 [..., SW]: raw, without ape
        ape_rows: np.ndarray | None,  # float32 [..., SW]: ape[p mod r] of each row; None: no ape
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stored ``(kv, score)`` of a saved token (SPEC §4, §13.1, §13.2): ``kv`` and the
        score, ``add(score, ape)`` with ``ape_at = "save"`` or raw with ``"compress"``, each
        encoded once."""
        stored_score = add(score, ape_rows) if self.ape_at == "save" and ape_rows is not None else score
        return self.encode(kv), self.encode(stored_score)

    def read_row(
        self,
        kv: np.ndarray,  # storage dtype [..., SW]: the stored kv
        score: np.ndarray,  # storage dtype [..., SW]: the stored score
        ape_rows: np.ndarray | None,  # float32 [..., SW]: ape[pos mod r] of each row; None: no ape
    ) -> tuple[np.ndarray, np.ndarray]:
        """A stored row as pooling reads it (SPEC §5, §13.1, §13.2): both halves decoded, and
        with ``ape_at = "compress"`` ``add(score, ape)``."""
        kv, score = self.decode(kv), self.decode(score)
        if self.ape_at == "compress" and ape_rows is not None:
            score = add(score, ape_rows)
        return kv, score


PAGED_FP32 = StateFormat()  # SPEC §3-§5: fp32 rows, ape added at the save, paged
