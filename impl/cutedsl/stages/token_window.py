"""The window a token pools (SPEC §5): where its rows are, and what SPEC §13's formats add.

The pooling stages of every V4 kernel (C4, C128 tiles, the indexer's two) take one
:class:`TokenWindow` instead of seven arguments. It is a trace-time record: the kernels build it
from their launch arguments and the stages unpack it, so it adds no instruction.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass.cute as cute
from cutlass import Int32, Int64


class TokenWindow(NamedTuple):
    state: cute.Tensor  # fp32 or bf16 (config.state) [num_blocks, bs, 2*SW]: the state cache
    block_table: cute.Tensor  # int32 [num_reqs, max_blocks]
    req: Int32  # the token's block-table row
    position: Int64  # p, a boundary position (p % r == r - 1)
    ape: cute.Tensor | None = None  # SPEC §13.2: fp32 [r, SW] with ape_at="compress", else None
    ring_capacity: Int32 | None = None  # SPEC §13.3: C (a ring), else None
    chunk: Any = None  # SPEC §13.4: step_rows.chunk_of(...) with rows_from_inputs, else None
