"""Which CuTe DSL kernel a call runs: the frozen dispatch :class:`Policy` and pure functions of it.

Nothing here touches a tensor or the GPU: every function takes the token count, the block
size, the policy and (where the grid depends on it) the device's resident clusters or
multiprocessor count, and returns a path name, a grid or a static kernel configuration
(:mod:`.config`). The launchers (:mod:`.launch`) call them once per plan; tests call them
directly.

C4 runs the fused kernel; the indexer layouts (SPEC §12) run the indexer's C4 or C128 kernel
(``KernelShapes.indexer_c4_warps`` / ``indexer_c128_warps``). ``c128_path="auto"`` picks, by
the number of tokens ``T``:

- ``fused_cluster`` up to ``cluster_max_tokens``: a thread-block cluster per token (16 CTAs
  of 32 channels up to ``cluster16_max_tokens``, 8 CTAs of 64 channels above);
- ``fused_handoff`` up to ``handoff_max_tokens``: 8 independent CTAs per token, the last of
  which (found by a per-token atomic counter) finishes the token from the scratch;
- above: ``fused_pipelined``, a persistent grid of as many 8-CTA clusters as the device holds
  at once, each walking a run of tokens: inactive tokens cost a ballot bit, and the next
  active token's rows stream while the current one finishes. Real C128 steps are sparse
  (about one token in 128 closes a window), and the token count alone cannot tell a sparse
  step from a dense one, so ``auto`` takes the kernel that is fast on both.

The split paths (``split_block8``, ``split_generic``: compress kernel + store kernel) run
only when asked for by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from .config import HEAD_DIM, C4Config, C128PoolConfig, EntryFormat, SaveConfig, StoreConfig
from .indexer_config import IndexerConfig

C128_PATHS = ("auto", "fused_cluster", "fused_handoff", "fused_pipelined", "split_block8", "split_generic")


@dataclass(frozen=True)
class PoolShape:
    """The mapping of one C128 pooling kernel family (warps per CTA, channels per CTA, where kv
    rows live, when kv loads are issued); ``tile=None`` lets the cluster path choose by ``T``."""

    warps: int = 8  # 4, 8, 16
    tile: int | None = 64  # 64 or 32 channels per CTA
    kv_in_smem: bool = False  # kv rows staged in shared memory (cp.async)
    kv_after_max: bool = False  # kv loads issued once the window max is known


@dataclass(frozen=True)
class KernelShapes:
    """Compile-time shapes of every kernel family; the defaults are what ``auto`` runs.

    Named variants (:mod:`.variants`) replace fields to time or test other shapes.
    """

    c4_tokens_per_cta: int = 1  # C4 fused: token groups of 128 threads per CTA (1, 2, 4)
    save_tokens_per_cta: int = 1  # save_partial_states (1, 2, 4)
    store_tokens_per_cta: int = 1  # split path's store kernel (1, 2, 4)
    split: PoolShape = PoolShape()  # split path's compress kernel
    cluster: PoolShape = PoolShape(8, None, True, True)  # cluster kernel: kv in smem (64 registers, 4 CTAs/SM)
    handoff_kv_after_max: bool = True  # handoff kernel (8 warps, 64 channels, kv in smem)
    pipelined_ctas_per_sm: int = 3  # pipelined kernel's occupancy (.minnctapersm): 3 (80 registers) streams
    #                                 better than 2 (128 registers, no spills)
    indexer_c4_warps: int = 4  # indexer C4 kernel (SPEC §12): tokens, a warp each, per CTA (1, 2, 4, 8); 4: level
    #                             with 1 on dense sweeps, faster on steps of few active tokens
    indexer_c128_warps: int = 16  # indexer C128 kernel: warps per token's CTA (8: 16 rows each, 16: 8 rows)


@dataclass(frozen=True)
class Policy:
    """Dispatch thresholds, grid sizing and kernel shapes; frozen, passed to every call.

    Two policies that compare equal dispatch identically; the default is :data:`DEFAULT_POLICY`.
    """

    cluster_max_tokens: int = 16  # auto: fused_cluster up to this T
    cluster16_max_tokens: int = 4  # cluster tile None: 16-CTA clusters up to this T (shorter critical path)
    handoff_max_tokens: int = 64  # auto: fused_handoff up to this T (dense steps: 20% faster than pipelined at
    #                               64 tokens), fused_pipelined above
    pipelined_max_clusters: int | None = None  # pipelined kernel's grid: at most this many clusters (None: as
    #                                            many as the device holds at once)
    early_metadata: bool = False  # with pdl, C128 kernels read metadata before griddepcontrol.wait (a contract
    #                               on the previous kernel; see :mod:`.dependent_launch`)
    shapes: KernelShapes = field(default_factory=KernelShapes)

    def __post_init__(self):
        cap = self.pipelined_max_clusters
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"pipelined_max_clusters: expected None or an integer >= 1, got {cap!r}")
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:  # part of every plan key: computed once
        return self._hash

    def with_overrides(self, **overrides) -> "Policy":
        """A copy with fields replaced; ``shapes`` fields may be given by name too
        (``c4_tokens_per_cta=2``, ``cluster=PoolShape(...)``)."""
        shape_names = {f.name for f in fields(KernelShapes)}
        own = {k: v for k, v in overrides.items() if k not in shape_names}
        shaped = {k: v for k, v in overrides.items() if k in shape_names}
        unknown = sorted(set(own) - {f.name for f in fields(Policy)})
        if unknown:
            raise ValueError(f"policy overrides: expected fields of Policy or KernelShapes, got {unknown}")
        return replace(self, **own, shapes=replace(self.shapes, **shaped) if shaped else self.shapes)


DEFAULT_POLICY = Policy()


# ---- C128 ---------------------------------------------------------------------------------
def cluster_tile(num_tokens: int, policy: Policy) -> int:
    """Channels per CTA of the cluster kernel: 32 (16 CTAs per token) for a few tokens, where
    more SMs per token shorten the exact arithmetic's critical path; 64 (8 CTAs) above."""
    if policy.shapes.cluster.tile is not None:
        return policy.shapes.cluster.tile
    return 32 if num_tokens <= policy.cluster16_max_tokens else 64


def c128_pool_config(path: str, block_size: int, policy: Policy, *, num_tokens: int = 1, pdl: bool = True,
                     early_metadata: bool = False) -> C128PoolConfig:
    """The :class:`.config.C128PoolConfig` of a C128 path (``fused_*``/``split_*``); with ``pdl``
    its metadata is read before the wait if ``early_metadata`` or ``policy.early_metadata``.
    Raises ``ValueError`` if ``split_block8`` cannot take ``block_size``."""
    shapes = policy.shapes
    if path == "fused_cluster":
        shape = shapes.cluster
        warps, tile, staged, late = shape.warps, cluster_tile(num_tokens, policy), shape.kv_in_smem, shape.kv_after_max
    elif path == "fused_handoff":  # fixed mapping: a warp per 64-channel block when finishing
        warps, tile, staged, late = 8, 64, True, shapes.handoff_kv_after_max
    elif path == "fused_pipelined":  # fixed mapping; the kernel orders its own loads
        warps, tile, staged, late = 8, 64, True, False
    else:
        shape = shapes.split
        warps, tile, staged, late = shape.warps, shape.tile, shape.kv_in_smem, shape.kv_after_max
    rows_per_lane = C128PoolConfig(block_size, 1, warps, tile).rows_per_lane
    if path == "split_block8":
        if block_size % rows_per_lane:
            raise ValueError(
                f"c128_path: 'split_block8' expected block_size a multiple of {rows_per_lane} (each lane's "
                f"{rows_per_lane} rows in one state block), got block_size={block_size}; use 'split_generic' or 'auto'"
            )
        rows_per_lookup = rows_per_lane
    else:  # generic lookups: runs of gcd(bs, rows per lane) rows share a block (Block8's when bs allows)
        rows_per_lookup = math.gcd(block_size, rows_per_lane)
    early = pdl and (early_metadata or policy.early_metadata)
    return C128PoolConfig(block_size, rows_per_lookup, warps, tile, staged, late, pdl, early)


def pipelined_clusters(num_tokens: int, resident: int | None, sm_count: int | None, policy: Policy) -> int:
    """Clusters ``G`` of the pipelined kernel's persistent grid: as many as the device holds at
    once (``resident``, from the driver; without it ``sm_count // 5``: 26 on the H200, which
    holds 30 or 45 at 2 or 3 CTAs per SM), at most ``policy.pipelined_max_clusters`` and never
    more than ``T``. Clusters beyond the resident ones would walk their share only
    after others ended."""
    if resident is None:
        resident = num_tokens if sm_count is None else max(1, sm_count // 5)
    clusters = min(num_tokens, resident)
    if policy.pipelined_max_clusters is not None:
        clusters = min(clusters, policy.pipelined_max_clusters)
    share = -(-num_tokens // max(1, clusters))  # tokens per cluster; no cluster without a token
    return max(1, -(-num_tokens // share))


def check_c128_path(c128_path) -> None:
    if c128_path not in C128_PATHS:
        raise ValueError(f"c128_path: expected one of {', '.join(repr(p) for p in C128_PATHS)}, got {c128_path!r}")


def choose(c128_path: str, num_tokens: int, block_size: int, policy: Policy = DEFAULT_POLICY) -> str:
    """Resolve ``c128_path`` for a C128 call (raises ``ValueError`` for an unknown path, or one
    the block size does not allow)."""
    check_c128_path(c128_path)
    if c128_path != "auto":
        c128_pool_config(c128_path, block_size, policy)  # raises if the path cannot take this block size
        return c128_path
    if num_tokens <= policy.cluster_max_tokens:
        return "fused_cluster"
    if num_tokens <= policy.handoff_max_tokens:
        return "fused_handoff"
    return "fused_pipelined"


# ---- the static configuration of every launch ---------------------------------------------
def c4_config(block_size: int, entry: EntryFormat | None, policy: Policy, pdl: bool) -> C4Config:
    return C4Config(block_size, entry, policy.shapes.c4_tokens_per_cta, pdl)


def store_config(entry: EntryFormat, policy: Policy, pdl: bool) -> StoreConfig:
    return StoreConfig(entry, policy.shapes.store_tokens_per_cta, pdl)


def save_config(compress_ratio: int, block_size: int, vector_inputs: bool, policy: Policy, pdl: bool,
                head_dim: int = HEAD_DIM) -> SaveConfig:
    return SaveConfig(compress_ratio, block_size, vector_inputs, policy.shapes.save_tokens_per_cta, pdl, head_dim)


def indexer_config(compress_ratio: int, block_size: int, layout: str, hadamard: bool, entries_per_page: int,
                   weight_dtype: str, policy: Policy, pdl: bool) -> IndexerConfig:
    """The indexer compressor's kernel (SPEC §12): a warp per token (C4) or a CTA per token (C128)."""
    warps = policy.shapes.indexer_c4_warps if compress_ratio == 4 else policy.shapes.indexer_c128_warps
    return IndexerConfig(compress_ratio, block_size, layout, hadamard, entries_per_page, weight_dtype, warps, pdl)
