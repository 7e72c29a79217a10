"""Static launch knobs of the Triton kernels (what to sweep on the H200) and their defaults.

Every field only changes speed, never bytes: the tests run several non-default configurations
under the interpreter and compare them byte for byte with the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from .pooling import RowPlan, row_plan

HEAD_DIM = 512


def check_power_of_two(name: str, value: int, low: int, high: int, why: str = "") -> None:
    """A knob's check: ``value`` a power of two in ``[low, high]``, else a ``ValueError`` naming it."""
    if value < low or value > high or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two in [{low}, {high}]{why}, got {value}")


@dataclass(frozen=True)
class FusedConfig:
    """Knobs of :func:`compress_norm_rope_store_kernel`.

    - ``block_c``: channels pooled per step (a power of two dividing 512). The step's tile is
      ``[W, block_c]`` fp32 for kv and again for score: C4 ``[8, 256]`` is two steps; C128
      ``[128, 64]`` is 8 steps of 64 KiB each.
    - ``num_warps``: warps per token program.
    - ``unroll_tiles``: unroll the channel-tile loop at compile time (True) or keep a runtime loop
      (False), which ``tile_stages > 1`` software-pipelines (cp.async into shared memory).
    - ``max_registers``: a cap on registers per thread (PTX ``.maxnreg``; None: the compiler's
      choice). A one-token program is small, so its registers can bound how many programs an SM
      holds, and with them the state bytes in flight; a cap trades a few spills for occupancy.
    """

    block_c: int
    num_warps: int
    unroll_tiles: bool = True
    tile_stages: int = 1
    max_registers: int | None = None

    def __post_init__(self):
        check_power_of_two("block_c", self.block_c, 4, HEAD_DIM)
        check_power_of_two("num_warps", self.num_warps, 1, 32)
        if self.tile_stages < 1:
            raise ValueError(f"tile_stages: expected >= 1, got {self.tile_stages}")
        if self.max_registers is not None and not (isinstance(self.max_registers, int) and 16 <= self.max_registers <= 255):
            raise ValueError(f"max_registers: expected None or an int in [16, 255], got {self.max_registers!r}")

    def plan(self, window: int) -> RowPlan:
        """Which window-row bits sit on lanes, warps and registers (see :mod:`.pooling`)."""
        return row_plan(window, self.block_c, self.num_warps)

    def launch_options(self) -> dict:
        """Triton's launch options for these knobs (:func:`launch_options`)."""
        return launch_options(self.num_warps, self.max_registers)


def launch_options(num_warps: int, max_registers: int | None) -> dict:
    """Triton's launch options: ``num_warps``, and ``maxnreg`` when registers are capped."""
    return {"num_warps": num_warps, **({} if max_registers is None else {"maxnreg": max_registers})}


MAX_TOKEN_RUN = 64  # the longest run of tokens a split-path program walks (its metadata is one vector load)


@dataclass(frozen=True)
class SplitConfig:
    """Knobs of the C128 split path (:mod:`.split_pool`, then :mod:`.split_store`).

    - ``block_c``, ``num_warps``: the pool program's ``[128, block_c]`` channel tile (a power of
      two dividing the head) and its warps;
    - ``store_warps``: warps of a store program;
    - ``pool_run``, ``store_run``: consecutive tokens one pool / store program walks, 1 ..
      :data:`MAX_TOKEN_RUN`; None: from the device's SM count (:func:`token_run`).
    """

    block_c: int = 64
    num_warps: int = 8
    store_warps: int = 4
    pool_run: int | None = None
    store_run: int | None = None

    def __post_init__(self):
        check_power_of_two("block_c", self.block_c, 4, HEAD_DIM)
        check_power_of_two("num_warps", self.num_warps, 1, 32)
        check_power_of_two("store_warps", self.store_warps, 1, 32)
        for name in ("pool_run", "store_run"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                          and 1 <= value <= MAX_TOKEN_RUN):
                raise ValueError(f"{name}: expected None or an int in [1, {MAX_TOKEN_RUN}], got {value!r}")

    def plan(self) -> RowPlan:
        """Which window-row bits of the pool tile sit on lanes, warps and registers (:mod:`.pooling`)."""
        return row_plan(128, self.block_c, self.num_warps)


# grid sizes of the split path's automatic runs, in programs per SM
POOL_PROGRAMS_PER_SM = 4  # about two [128, 64] pool programs fit an SM at once: two rounds of them
STORE_PROGRAMS_PER_SM = 8  # a store program is small: several fit an SM at once


def token_run(num_tokens: int, programs_per_token: int, sm_count: int | None, programs_per_sm: int,
              fixed: int | None) -> int:
    """Tokens one split-path program walks: ``fixed`` if given; else the smallest power of two (at
    most :data:`MAX_TOKEN_RUN`) that keeps ``ceil(T / run) * programs_per_token`` within
    ``programs_per_sm`` programs per SM, so that a step with few active tokens spreads them over
    every SM and a long step pays one program, not one per token, for a run of inactive ones
    (``sm_count`` None, no device to ask: :data:`MAX_TOKEN_RUN`)."""
    if fixed is not None:
        return fixed
    if sm_count is None:
        return MAX_TOKEN_RUN
    run = 1
    while run < MAX_TOKEN_RUN and -(-num_tokens // run) * programs_per_token > sm_count * programs_per_sm:
        run *= 2
    return run


@dataclass(frozen=True)
class SaveConfig:
    """Knobs of :func:`save_partial_states_kernel`: floats per program and warps."""

    block: int = 512
    num_warps: int = 4

    def __post_init__(self):
        check_power_of_two("block", self.block, 4, HEAD_DIM, " (it must divide SW)")
        check_power_of_two("num_warps", self.num_warps, 1, 32)

    def launch_shape(self, state_width: int) -> tuple[int, int]:
        """``(block, num_warps)`` for state rows of ``SW = state_width`` floats: a block never spans
        kv and score (capped at ``SW``), and a capped block keeps 4 floats (one 128-bit access) a thread."""
        block = min(self.block, state_width)
        return block, self.num_warps if block == self.block else max(1, min(self.num_warps, block // 128))


DEFAULT_FUSED = {
    # [8, 256] x 2 steps; 2 tree levels in registers, 1 across the 2 row warps (fastest C4 config on the H200)
    4: FusedConfig(block_c=256, num_warps=4),
    # [128, 64] x 8 steps in a runtime loop; 3 tree levels in registers, then one layout conversion
    # for the last 4 (fastest C128 config on the H200)
    128: FusedConfig(block_c=64, num_warps=8, unroll_tiles=False),
}
DEFAULT_SAVE = SaveConfig()

DEFAULT_INDEXER = {
    # [8, 128] in one step, 2 warps: two row levels in registers, one across the warps
    4: FusedConfig(block_c=128, num_warps=2),
    # [128, 32] x 4 steps in a runtime loop
    128: FusedConfig(block_c=32, num_warps=4, unroll_tiles=False),
}
# C4 from this many tokens: [8, 64] x 2 steps in one warp (faster from 4096 tokens on the H200, slower at 1024)
INDEXER_C4_MANY_TOKENS = 4096
INDEXER_C4_MANY = FusedConfig(block_c=64, num_warps=1)
INDEXER_HEAD_DIM = 128


# the split path's defaults by head width: the fused kernel's C128 tiles, one per program
# (a 128-wide store program in one warp: four channels, one 128-bit load, a thread)
DEFAULT_SPLIT = {512: SplitConfig(block_c=64, num_warps=8),
                 128: SplitConfig(block_c=32, num_warps=4, store_warps=1)}


def fused_config(compress_ratio: int, config: FusedConfig | None) -> FusedConfig:
    return DEFAULT_FUSED[compress_ratio] if config is None else config


def compress_config(compress_ratio: int, head_dim: int, config, num_tokens: int):
    """The kernel configuration of a compress call: ``config`` if given (a :class:`FusedConfig`, or
    a :class:`SplitConfig` for C128); else C128's split path (:data:`DEFAULT_SPLIT`) and C4's fused
    kernel (:data:`DEFAULT_FUSED`, the indexer's :func:`indexer_config`)."""
    if config is not None and not isinstance(config, (FusedConfig, SplitConfig)):
        raise ValueError(f"config: expected None, a FusedConfig or a SplitConfig, got {type(config).__name__}")
    if isinstance(config, SplitConfig) or (config is None and compress_ratio == 128):
        if compress_ratio != 128:
            raise ValueError(f"config: a SplitConfig takes compress_ratio 128 (a C128 window), got {compress_ratio}")
        split = DEFAULT_SPLIT[head_dim] if config is None else config
        if split.block_c > head_dim:
            raise ValueError(f"config: expected block_c <= {head_dim} for a {head_dim}-wide head, got {split.block_c}")
        return split
    if head_dim == INDEXER_HEAD_DIM:
        return indexer_config(compress_ratio, config, num_tokens)
    return fused_config(compress_ratio, config)


def save_config(config: SaveConfig | None) -> SaveConfig:
    return DEFAULT_SAVE if config is None else config


def indexer_config(compress_ratio: int, config: FusedConfig | None, num_tokens: int = 0) -> FusedConfig:
    """Knobs of the fused kernel on the indexer's head (SPEC §12): a :class:`FusedConfig` whose
    ``block_c`` divides 128; without one, the default of the ratio (C4: :data:`INDEXER_C4_MANY`
    from :data:`INDEXER_C4_MANY_TOKENS` tokens)."""
    if config is None:
        if compress_ratio == 4 and num_tokens >= INDEXER_C4_MANY_TOKENS:
            return INDEXER_C4_MANY
        return DEFAULT_INDEXER[compress_ratio]
    if config.block_c > INDEXER_HEAD_DIM or config.tile_stages != 1:
        raise ValueError(f"config: expected block_c <= {INDEXER_HEAD_DIM} and tile_stages 1 for the indexer's head, "
                         f"got block_c {config.block_c}, tile_stages {config.tile_stages}")
    return config
