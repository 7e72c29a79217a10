"""The frozen dispatch :class:`Policy`: thresholds, grid sizing and kernel shapes, passed to every call.

Two policies that compare equal dispatch identically; :mod:`.paths` turns a policy, the
call's shape and the device into the path a call runs and its kernels' static
configurations (:mod:`..config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class PoolShape:
    """The mapping of one C128 pooling kernel family (warps per CTA, channels per CTA, where kv
    rows live, when kv loads are issued); ``tile=None`` lets the cluster path choose by ``T``."""

    warps: int = 8  # 4, 8, 16
    tile: int | None = 64  # 64 or 32 channels per CTA
    kv_in_smem: bool = False  # kv rows staged in shared memory (cp.async)
    kv_after_max: bool = False  # kv loads issued once the window max is known

    SWEEP = {"warps": (4, 8, 16), "tile": (None, 64, 32), "kv_in_smem": (False, True), "kv_after_max": (False, True)}


@dataclass(frozen=True)
class KernelShapes:
    """Compile-time shapes of every kernel family; the defaults are what ``auto`` runs.

    Named variants (:mod:`..variants`) and the tuner's settings replace fields to time or test other shapes.
    """

    c4_tokens_per_cta: int = 1  # C4 fused: token groups of 128 threads per CTA (1, 2, 4)
    save_tokens_per_cta: int = 1  # save_partial_states (1, 2, 4)
    step_save_tokens_per_cta: int = 4  # compress_and_save's save (1, 2, 4; more than 1 takes no runs): a CTA a
    #                                    token spends most of a large step launching CTAs that save nothing
    store_tokens_per_cta: int = 1  # split path's store kernel (1, 2, 4)
    split: PoolShape = PoolShape()  # split path's compress kernel
    cluster: PoolShape = PoolShape(8, None, True, True)  # cluster kernel: kv in smem (64 registers, 4 CTAs/SM)
    handoff_kv_after_max: bool = True  # handoff kernel (8 warps, 64 channels, kv in smem)
    pipelined_ctas_per_sm: int = 3  # pipelined kernel's occupancy (.minnctapersm): 3 (80 registers) streams
    #                                 better than 2 (128 registers, no spills)
    indexer_c4_warps: int = 4  # indexer C4 kernel (SPEC §12): tokens, a warp each, per CTA (1, 2, 4, 8); 4: level
    #                             with 1 on dense sweeps, faster on steps of few active tokens
    indexer_c128_warps: int = 16  # indexer C128 kernel: warps per token's CTA (8: 16 rows each, 16: 8 rows)

    SWEEP = {"c4_tokens_per_cta": (1, 2, 4), "save_tokens_per_cta": (1, 2, 4), "step_save_tokens_per_cta": (1, 2, 4),
             "store_tokens_per_cta": (1, 2, 4),
             "handoff_kv_after_max": (False, True), "pipelined_ctas_per_sm": (2, 3),
             "indexer_c4_warps": (1, 2, 4, 8), "indexer_c128_warps": (8, 16)}


@dataclass(frozen=True)
class Policy:
    """Dispatch thresholds, grid sizing and kernel shapes; frozen, passed to every call.

    Two policies that compare equal dispatch identically; the default is :data:`DEFAULT_POLICY`.
    The thresholds are token counts timed on an H200 (``bench/RESULTS.md``), not sizes of a
    device: the persistent grid takes the device's own resident clusters (:mod:`.occupancy`),
    and on another GPU (Blackwell) the thresholds are a starting point to time again.
    """

    cluster_max_tokens: int = 16  # auto: fused_cluster up to this T
    cluster16_max_tokens: int = 4  # cluster tile None: 16-CTA clusters up to this T (shorter critical path)
    handoff_max_tokens: int = 64  # auto: fused_handoff up to this T (dense steps: 20% faster than pipelined at
    #                               64 tokens), fused_pipelined above
    pipelined_max_clusters: int | None = None  # pipelined kernel's grid: at most this many clusters (None: as
    #                                            many as the device holds at once)
    early_metadata: bool = False  # with pdl, C128 kernels read metadata before griddepcontrol.wait (a contract
    #                               on the previous kernel; see :mod:`..stages.dependent_launch`)
    split_runs: int = 256  # split kernels (and the step call's save where step_save_runs): a CTA takes a run of
    #                        up to 32 tokens (found active by a ballot) while T still gives at least this many runs
    step_save_runs: bool = False  # a ring step's save in runs: off, as a run saves a chunk's dense tail token by token
    shapes: KernelShapes = field(default_factory=KernelShapes)

    SWEEP = {"cluster_max_tokens": (8, 16, 32), "cluster16_max_tokens": (0, 4, 8), "handoff_max_tokens": (32, 64, 128),
             "pipelined_max_clusters": (None, 8, 16, 30), "early_metadata": (False, True),
             "split_runs": (64, 256, 1024, 1 << 30), "step_save_runs": (False, True)}

    def __post_init__(self):
        cap = self.pipelined_max_clusters
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"pipelined_max_clusters: expected None or an integer >= 1, got {cap!r}")
        runs = self.split_runs
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"split_runs: expected an integer >= 1, got {runs!r}")
        if not isinstance(self.step_save_runs, bool):
            raise ValueError(f"step_save_runs: expected a bool, got {self.step_save_runs!r}")
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
