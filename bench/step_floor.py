"""The host side of :func:`.floor_kernels.step_floor`: what a step must move, listed from its metadata.

A step's floor is one launch that moves its bytes with none of SPEC's arithmetic: each token's
kv (and score) row read once, the rows it saves written once, the window rows that come from the
state read once (as runs of ``H`` kv and ``H`` score elements: a C4 row's own half, a C128 or
V4.1 row whole), and each active token's record (``E`` bytes) and, for V4.1, its bf16 latent
row written once. Metadata (positions, slots, block tables) is not counted: the floor reads none,
its offsets are computed here on the host. No conforming kernel can move fewer bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

TOKENS_PER_PROGRAM = 2
RUNS_PER_PROGRAM = 4
NUM_WARPS = 4
NARROW_ROWS = 128  # rows this wide or narrower (the index key's) take a warp a program and the tokens below,
NARROW_TOKENS_PER_PROGRAM = 8  # unrolled, so that their loads are in flight together: a program per two
#                                256-byte rows would time its launches, not its bytes


@dataclass(frozen=True)
class FloorShape:
    """The compile-time shape of a step's floor."""

    state_width: int  # SW: elements of kv (and of score) in an input row and in half a state row
    head_dim: int  # H: elements of kv (and of score) in a run read from the state
    input_bf16: bool  # kv / score are bf16 (else fp32)
    has_score: bool  # the step reads a score row beside each kv row
    state_bf16: bool  # the state holds bf16 (else fp32)
    reads: int  # 0: no token row is read; 1: rows of tokens that save or have a record; 2: every token's
    entry_bytes: int  # E: bytes of a record (0: none written)
    latent: bool  # a bf16 latent row (SW elements) is written per record (V4.1)

    def __post_init__(self):
        if self.reads not in (0, 1, 2):
            raise ValueError(f"FloorShape.reads: expected 0, 1 or 2, got {self.reads!r}")


@dataclass(frozen=True)
class FloorPlan:
    """One step's floor: its shape and the host-computed offsets."""

    shape: FloorShape
    saves: np.ndarray  # int64 [T]: state slot the token's row is copied to, -1 = none
    entries: np.ndarray  # int64 [T]: byte offset of the token's record in the cache, -1 = none
    runs: np.ndarray  # int64 [num_runs]: element offset of each run's kv in the state

    def rows_read(self) -> int:
        """Token rows the floor reads."""
        if self.shape.reads == 2:
            return int(self.saves.shape[0])
        if self.shape.reads == 1:
            return int(np.count_nonzero((self.saves >= 0) | (self.entries >= 0)))
        return 0

    def bytes_moved(self) -> int:
        """Bytes the floor reads and writes (the step's must-move bytes, metadata aside)."""
        s = self.shape
        halves = 2 if s.has_score else 1
        element_in, element_state = (2 if s.input_bf16 else 4), (2 if s.state_bf16 else 4)
        saved = int(np.count_nonzero(self.saves >= 0)) if s.reads else 0
        records = int(np.count_nonzero(self.entries >= 0))
        return (self.rows_read() * halves * s.state_width * element_in + saved * halves * s.state_width * element_state
                + self.runs.shape[0] * 2 * s.head_dim * element_state + records * s.entry_bytes
                + (records * s.state_width * 2 if s.latent else 0))

    def shifted(self, slots: int, elements: int) -> "FloorPlan":
        """The same step on state blocks further on: saved slots moved by ``slots``, runs by ``elements``."""
        return replace(self, saves=np.where(self.saves >= 0, self.saves + slots, -1), runs=self.runs + elements)


def window_runs(positions: np.ndarray, token_to_req: np.ndarray, active: np.ndarray, first_from_inputs: np.ndarray, *,
                window: int, ratio: int, head_dim: int, block_table: np.ndarray, block_size: int,
                ring_capacity: int | None, strides: tuple[int, int]) -> np.ndarray:
    """int64 ``[num_runs]``: the state element offsets of every window row an active token reads from
    the state (SPEC §5, §13.3, §13.4, §14.3): row ``i`` at position ``pos = p - W + 1 + i`` when
    ``0 <= pos < first_from_inputs[t]`` (the rows from ``first_from_inputs`` on come from the call's
    inputs), its half ``h = i // r`` (``h * H`` elements into the row). ``positions``: int64 ``[T]``;
    ``token_to_req``: int32 ``[T]``; ``active``: bool ``[T]``; ``first_from_inputs``: int64 ``[T]``
    (``p + 1``: every row from the state); ``block_table``: int32 ``[num_reqs, max_blocks]``;
    ``strides``: the state's block and row strides in elements."""
    tokens = np.flatnonzero(active)
    rows = np.arange(window, dtype=np.int64)
    pos = positions[tokens, None] - window + 1 + rows[None, :]
    from_state = (pos >= 0) & (pos < first_from_inputs[tokens, None])
    token_index, row_index = np.nonzero(from_state)
    pos = pos[token_index, row_index]
    index = pos % ring_capacity if ring_capacity is not None else pos
    blocks = block_table[token_to_req[tokens[token_index]], index // block_size].astype(np.int64)
    return blocks * strides[0] + (index % block_size) * strides[1] + (row_index // ratio) * head_dim


def record_offsets(kv_slot_mapping: np.ndarray, active: np.ndarray, entries_per_page: int, page_stride: int,
                   entry_bytes: int) -> np.ndarray:
    """int64 ``[T]``: the byte offset ``page * page_stride + o * E`` of each active token's record
    (``slot = page * B + o``), -1 for the others. ``kv_slot_mapping``: int64 ``[T]``; ``active``: bool ``[T]``."""
    slots = np.maximum(kv_slot_mapping, 0)
    offsets = (slots // entries_per_page) * page_stride + (slots % entries_per_page) * entry_bytes
    return np.where(active, offsets, -1).astype(np.int64)


def floor_launcher(plan: FloorPlan, tensors: dict, device):
    """A no-argument call that launches :func:`.floor_kernels.step_floor` for ``plan``.
    ``tensors``: ``kv`` / ``score`` ([T, SW] fp32 or bf16, or None), ``state`` ([blocks, bs, 2*SW] fp32
    or bf16, or None), ``block_size``, ``cache`` (uint8 [bytes], the whole cache's storage, or None) and
    ``latent`` (bf16 [T, SW], or None)."""
    import torch

    from .floor_kernels import step_floor

    s = plan.shape
    num_tokens = int(plan.saves.shape[0])
    dummy = torch.zeros(16, dtype=torch.int16 if s.input_bf16 else torch.float32, device=device)
    kv, score = tensors.get("kv"), tensors.get("score")
    kv = dummy if kv is None else kv
    score = kv if score is None else score
    as_values = lambda t: t.view(torch.int16) if t.dtype == torch.bfloat16 else t  # noqa: E731
    state = tensors.get("state")
    if state is None:
        state_group = (torch.zeros(16, dtype=torch.int16 if s.state_bf16 else torch.float32, device=device), 0, 0, 1)
    else:
        state_group = (as_values(state), state.stride(0), state.stride(1), int(tensors["block_size"]))
    cache = tensors.get("cache")
    cache = torch.zeros(16, dtype=torch.uint8, device=device) if cache is None else cache
    latent = tensors.get("latent")
    latent_group = (cache, as_values(latent), latent.stride(0)) if latent is not None else (cache, dummy.view(torch.int16), 0)
    to_device = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    saves, entries, runs = to_device(plan.saves), to_device(plan.entries), to_device(plan.runs)
    narrow = s.state_width <= NARROW_ROWS
    tokens_per_program = NARROW_TOKENS_PER_PROGRAM if narrow else TOKENS_PER_PROGRAM
    token_programs = -(-num_tokens // tokens_per_program) if (s.reads or s.entry_bytes) else 0
    programs = max(1, token_programs + -(-runs.shape[0] // RUNS_PER_PROGRAM))
    out = torch.empty(programs, dtype=torch.float32, device=device)
    entry_block = 1 << max(s.entry_bytes - 1, 0).bit_length()
    args = ((as_values(kv), kv.stride(0), as_values(score), score.stride(0)), (saves, entries), state_group,
            (runs, int(runs.shape[0])), latent_group, out, num_tokens, token_programs)
    constants = dict(SW=s.state_width, H=s.head_dim, TOKENS=tokens_per_program, RUNS=RUNS_PER_PROGRAM,
                     INPUT_BF16=s.input_bf16, HAS_SCORE=s.has_score, STATE_BF16=s.state_bf16, READS=s.reads,
                     ENTRY_BLOCK=entry_block, ENTRY_BYTES=s.entry_bytes, LATENT=s.latent, UNROLL=narrow,
                     num_warps=1 if narrow else NUM_WARPS)

    def launch() -> None:
        step_floor[(programs,)](*args, **constants)

    launch.out = out  # the per-program sums (tests read them)
    return launch
