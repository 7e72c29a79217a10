"""The kernel paths of ``compress_norm_rope_store``: one record each, in one registry.

A :class:`KernelPath` is everything the host needs to run a call one way: its name (the one
name of that way everywhere: ``c128_path=``, logs, variants, PTX), the kernels it launches in
order and their static configurations for a call (:mod:`..config`), how their TVM-FFI
functions are called, and what it needs besides the call's tensors (the fp32 ``x`` scratch,
per-token arrival counters, a persistent grid sized by the device). :func:`choose` returns a
record; the launch plans (:mod:`.plans`), ``warm_up``, ``compress``, the PTX list
(:mod:`..ptx`) and the variants iterate :data:`PATHS`. A new path is one record here plus
its kernel module (``kernels/``).

Nothing here touches a tensor or the GPU: every function takes the call's shape
(:class:`PathRequest`), the frozen :class:`.policy.Policy` and, for the persistent grid, the
device's resident clusters.

``c128_path="auto"`` picks by the number of tokens ``T``:

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
only when asked for by name, or for SPEC §13's formats (below). On a large step each of their
CTAs takes a run of up to 32 consecutive tokens and finds the active ones by a ballot
(:func:`token_run`), so a step where few tokens close a window launches a CTA per run, not a
CTA per token and channel tile. C4 runs ``c4``; the indexer layouts (SPEC §12) run ``indexer``.

SPEC §13's state formats (a bf16 state, ``ape_at="compress"``, a ring, the step's chunk rows) are
compile-time options (:class:`..config.StateFormat`) of the paths whose record lists the state's
dtype in ``formats``: ``c4``, ``indexer`` and the two split paths take both dtypes, ``fused_pipelined``
an fp32 state (it stages rows 16 bytes a lane). Under ``auto`` a C128 call with a format other than
the default takes ``fused_pipelined`` for an fp32 state, whatever ``T``: the persistent grid skips
the many tokens of a step that close no window for a ballot bit, and its chunk rows stream from
``kv``/``score`` as state rows do; a bf16 state takes ``split_generic``. A forced path that cannot
take the call's format is refused (``ValueError``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

from ....spec.constants import HEAD_DIM, INDEXER_HEAD_DIM
from ..config import (DEFAULT_STATE, C4Config, C128PoolConfig, EntryFormat, FusedClusterConfig, FusedHandoffConfig,
                      FusedPipelinedConfig, IndexerConfig, SaveConfig, SplitStoreConfig, StateFormat)
from .buffers import handoff_counters
from .policy import Policy


@dataclass(frozen=True)
class PathRequest:
    """What the static configurations of a call's kernels depend on."""

    ratio: int  # 4 or 128
    block_size: int  # bs
    num_tokens: int  # T
    layout: str  # a layout of spec.entry_layout
    entries_per_page: int  # B = k_cache.shape[1]
    weight_dtype: str  # "float32" | "bfloat16"
    store_align: int  # bytes every 4-channel store may assume (config.store_alignments)
    hadamard: bool  # SPEC §12's rotation (indexer layouts)
    policy: Policy
    pdl: bool
    early_metadata: bool = False  # with pdl: metadata read before griddepcontrol.wait (C128 paths)
    state: StateFormat = DEFAULT_STATE  # SPEC §13: the state's dtype, where ape is added, paged or ring

    @property
    def entry(self) -> EntryFormat:
        return EntryFormat(self.layout, self.entries_per_page, self.weight_dtype, self.store_align)


@dataclass(frozen=True)
class KernelPath:
    """One way to run ``compress_norm_rope_store``."""

    name: str
    ratios: tuple[int, ...]  # the compress ratios it takes
    head_dim: int  # the head width it takes (512, or the indexer's 128)
    kernels: tuple[str, ...]  # kernel names of the compile cache, in launch order
    configs: Callable[[PathRequest], tuple]  # the kernels' static configurations for a call
    launch: Callable  # launch(plan, fixed, metadata, scratch): the kernels' TVM-FFI calls
    scratch: bool = False  # keeps x in the fp32 scratch (the call's ``workspace``)
    counters: bool = False  # takes this stream's per-token arrival counters
    persistent: bool = False  # a grid of as many clusters as the device holds (a launch argument)
    auto: bool = True  # ``c128_path="auto"`` may pick it (the split paths: only by name)
    pooling: tuple | None = None  # (kernel, configs) of the pooling-only kernel that writes x (``compress``)
    takes_fp8_inv: bool = True  # the kernels take div(1, fp8_scale) after eps (the indexer's: eps alone)
    formats: tuple[str, ...] = ()  # the state dtypes whose SPEC §13 formats it takes (then ``ape`` and
    #                                ``ring_capacity`` follow the launch's scalars)

    def takes(self, state: StateFormat) -> bool:
        """Whether the path's kernels take a call's state format (SPEC §3's, or one of ``formats``)."""
        return state == DEFAULT_STATE or state.dtype in self.formats


# ---- launches: the kernels' TVM-FFI signatures ------------------------------------------------
# fixed = (state_cache, rms_norm_weight, cos_sin_cache, k_cache, device), the layer's tensors;
# metadata = (token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping).
# formats: SPEC §13's launch arguments of a path that takes them, (ape, ring_capacity, kv, score,
# query_start_loc) with None where unused (LaunchPlan.formats); () for the paths that do not.
def launch_fused(plan, fixed, metadata, scratch, formats=()) -> None:
    """One kernel on the nine tensors, then the plan's scalars (and grid), then ``formats``."""
    state_cache, rms_norm_weight, cos_sin_cache, k_cache, _ = fixed
    token_req, positions, slots, block_table, kv_slots = metadata
    plan.ffi[0](state_cache, token_req, positions, slots, block_table, rms_norm_weight, cos_sin_cache, k_cache,
                kv_slots, *plan.scalars, *formats)


def launch_handoff(plan, fixed, metadata, scratch, formats=()) -> None:
    """One kernel on the nine tensors, the x scratch and the stream's arrival counters."""
    state_cache, rms_norm_weight, cos_sin_cache, k_cache, device = fixed
    token_req, positions, slots, block_table, kv_slots = metadata
    plan.ffi[0](state_cache, token_req, positions, slots, block_table, rms_norm_weight, cos_sin_cache, k_cache,
                kv_slots, scratch, handoff_counters(device, plan.num_tokens), *plan.scalars)


def launch_split(plan, fixed, metadata, scratch, formats=()) -> None:
    """The compress kernel into the x scratch, then the store kernel. The store kernel takes
    nothing the compress kernel has not checked already (the same per-token arrays and
    scratch, the layer's fixed tensors): once the first launch passed TVM-FFI's checks, the
    second passes them too."""
    state_cache, rms_norm_weight, cos_sin_cache, k_cache, _ = fixed
    token_req, positions, slots, block_table, kv_slots = metadata
    pool, store = plan.ffi
    pool(state_cache, token_req, positions, slots, block_table, kv_slots, scratch, *formats)
    store(scratch, positions, slots, kv_slots, rms_norm_weight, cos_sin_cache, k_cache, *plan.scalars)


# ---- static configurations ---------------------------------------------------------------------
def cluster_tile(num_tokens: int, policy: Policy) -> int:
    """Channels per CTA of the cluster kernel: 32 (16 CTAs per token) for a few tokens, where
    more SMs per token shorten the exact arithmetic's critical path; 64 (8 CTAs) above."""
    if policy.shapes.cluster.tile is not None:
        return policy.shapes.cluster.tile
    return 32 if num_tokens <= policy.cluster16_max_tokens else 64


def _pool_config(request: PathRequest, mapping: tuple, block8: bool) -> C128PoolConfig:
    """The C128 pooling configuration of ``mapping = (warps, tile, kv_in_smem, kv_after_max)``:
    Block8 lookups (each lane's rows in one state block; ``ValueError`` if ``bs`` does not
    allow it) or generic ones (runs of ``gcd(bs, rows per lane)`` rows: Block8's when ``bs``
    allows)."""
    warps, tile, staged, late = mapping
    rows_per_lane = C128PoolConfig(request.block_size, 1, warps, tile).rows_per_lane
    if block8 and request.block_size % rows_per_lane:
        raise ValueError(
            f"c128_path: 'split_block8' expected block_size a multiple of {rows_per_lane} (each lane's "
            f"{rows_per_lane} rows in one state block), got block_size={request.block_size}; use 'split_generic' "
            "or 'auto'")
    rows_per_lookup = rows_per_lane if block8 else math.gcd(request.block_size, rows_per_lane)
    early = request.pdl and (request.early_metadata or request.policy.early_metadata)
    staged = staged and request.state.dtype == "float32"  # a bf16 state's kv rows stay in registers
    return C128PoolConfig(request.block_size, rows_per_lookup, warps, tile, staged, late, request.pdl, early,
                          request.state)


def _cluster_pool(request: PathRequest) -> C128PoolConfig:
    shape = request.policy.shapes.cluster
    mapping = (shape.warps, cluster_tile(request.num_tokens, request.policy), shape.kv_in_smem, shape.kv_after_max)
    return _pool_config(request, mapping, block8=False)


def token_run(num_tokens: int, policy: Policy, tokens_per_cta: int = 1) -> int:
    """Tokens per CTA of the split kernels and the step call's save: the largest power of two up to
    32 that leaves ``T`` at least ``policy.split_runs`` runs (1 below twice that): a step where few
    tokens close a window then launches a CTA per run, not one per token. A kernel shaped with
    several token groups a CTA (``tokens_per_cta``) keeps them: 1."""
    run = 1
    while tokens_per_cta == 1 and run < 32 and num_tokens // (2 * run) >= policy.split_runs:
        run *= 2
    return run


def _split_pool(request: PathRequest, block8: bool) -> C128PoolConfig:
    shape = request.policy.shapes.split
    staged = shape.kv_in_smem and not request.state.rows_from_inputs  # a step's rows go to registers
    pool = _pool_config(request, (shape.warps, shape.tile, staged, shape.kv_after_max), block8)
    return dataclasses.replace(pool, token_run=token_run(request.num_tokens, request.policy))


def _c4_configs(request: PathRequest) -> tuple:
    return (C4Config(request.block_size, request.entry, request.policy.shapes.c4_tokens_per_cta, request.pdl,
                     request.state),)


def _indexer_configs(request: PathRequest) -> tuple:
    shapes = request.policy.shapes
    warps = shapes.indexer_c4_warps if request.ratio == 4 else shapes.indexer_c128_warps
    return (IndexerConfig(request.ratio, request.block_size, request.layout, request.hadamard,
                          request.entries_per_page, request.weight_dtype, warps, request.pdl, request.state),)


def _fused_cluster_configs(request: PathRequest) -> tuple:
    return (FusedClusterConfig(_cluster_pool(request), request.entry),)


def _fused_handoff_configs(request: PathRequest) -> tuple:
    # fixed mapping: a warp per 64-channel block when finishing
    mapping = (8, 64, True, request.policy.shapes.handoff_kv_after_max)
    return (FusedHandoffConfig(_pool_config(request, mapping, block8=False), request.entry),)


def _fused_pipelined_configs(request: PathRequest) -> tuple:
    # fixed mapping; the kernel orders its own loads
    pool = _pool_config(request, (8, 64, True, False), block8=False)
    return (FusedPipelinedConfig(pool, request.entry, request.policy.shapes.pipelined_ctas_per_sm),)


def _split_configs(block8: bool) -> Callable[[PathRequest], tuple]:
    def configs(request: PathRequest) -> tuple:
        per_cta = request.policy.shapes.store_tokens_per_cta
        store = SplitStoreConfig(request.entry, per_cta, request.pdl, token_run(request.num_tokens, request.policy,
                                                                                 per_cta))
        return (_split_pool(request, block8), store)

    return configs


def save_config(compress_ratio: int, block_size: int, vector_inputs: bool, policy: Policy, pdl: bool,
                head_dim: int = HEAD_DIM, state: StateFormat = DEFAULT_STATE) -> SaveConfig:
    """``save_partial_states``' kernel (both head widths; ``state``: SPEC §13.1's dtype and §13.2's
    ``ape_at``, a ring saving as a paged state does)."""
    state = StateFormat(state.dtype, state.ape_at)  # the save writes at slot_mapping: ring or not
    return SaveConfig(compress_ratio, block_size, vector_inputs, policy.shapes.save_tokens_per_cta, pdl, head_dim,
                      state)


def step_save_config(compress_ratio: int, block_size: int, vector_inputs: bool, policy: Policy, pdl: bool,
                     head_dim: int, state: StateFormat, num_tokens: int) -> SaveConfig:
    """``compress_and_save``'s save (SPEC §13.4; ``state``: the step's format): ``kv`` and ``score`` as
    two tensors, ``policy.shapes.step_save_tokens_per_cta`` token groups a CTA. A ring's save writes
    each request's tail, few rows of a large step, but those rows are consecutive tokens, which a run
    would save one after the other: runs of tokens only where ``policy.step_save_runs`` asks for them
    (a ring), and, as for every kernel, only with one group a CTA (:func:`token_run`). A paged
    state's step saves every token. With ``pdl`` and no runs, the save reads its inputs before the
    grid-dependency wait (``SaveConfig.inputs_before_wait``: its predecessor is the step's compress)."""
    save = save_config(compress_ratio, block_size, vector_inputs, policy, pdl, head_dim, state.stored)
    groups = policy.shapes.step_save_tokens_per_cta
    run = token_run(num_tokens, policy, groups) if state.ring and policy.step_save_runs else 1
    return dataclasses.replace(save, split_inputs=True, token_run=run, tokens_per_cta=groups,
                               inputs_before_wait=pdl and run == 1)


# the pooling-only kernels that write x (``compress``): C4's kernel without an entry, or the split
# compress kernel (the fused C128 kernels pool like ``split_generic``)
def _c4_pooling(request: PathRequest) -> C4Config:
    return C4Config(request.block_size, None, request.policy.shapes.c4_tokens_per_cta, request.pdl, request.state)


C4_POOLING = ("c4", _c4_pooling)
GENERIC_POOLING = ("split_pool", lambda request: _split_pool(request, block8=False))
BLOCK8_POOLING = ("split_pool", lambda request: _split_pool(request, block8=True))


# ---- the registry -------------------------------------------------------------------------------
_C128, _BOTH = (128,), (4, 128)
_DTYPES = ("float32", "bfloat16")  # both state dtypes of SPEC §13.1
PATHS = {path.name: path for path in (
    KernelPath("c4", (4,), HEAD_DIM, ("c4",), _c4_configs, launch_fused, pooling=C4_POOLING, formats=_DTYPES),
    KernelPath("indexer", _BOTH, INDEXER_HEAD_DIM, ("indexer",), _indexer_configs, launch_fused,
               takes_fp8_inv=False, formats=_DTYPES),
    KernelPath("fused_cluster", _C128, HEAD_DIM, ("fused_cluster",), _fused_cluster_configs, launch_fused,
               pooling=GENERIC_POOLING),
    KernelPath("fused_handoff", _C128, HEAD_DIM, ("fused_handoff",), _fused_handoff_configs, launch_handoff,
               scratch=True, counters=True, pooling=GENERIC_POOLING),
    KernelPath("fused_pipelined", _C128, HEAD_DIM, ("fused_pipelined",), _fused_pipelined_configs, launch_fused,
               persistent=True, pooling=GENERIC_POOLING, formats=("float32",)),
    KernelPath("split_block8", _C128, HEAD_DIM, ("split_pool", "split_store"), _split_configs(True), launch_split,
               scratch=True, auto=False, pooling=BLOCK8_POOLING, formats=_DTYPES),
    KernelPath("split_generic", _C128, HEAD_DIM, ("split_pool", "split_store"), _split_configs(False), launch_split,
               scratch=True, auto=False, pooling=GENERIC_POOLING, formats=_DTYPES),
)}
C128_PATHS = ("auto", "fused_cluster", "fused_handoff", "fused_pipelined", "split_block8", "split_generic")


def check_c128_path(c128_path) -> None:
    if c128_path not in C128_PATHS:
        raise ValueError(f"c128_path: expected one of {', '.join(repr(p) for p in C128_PATHS)}, got {c128_path!r}")


def paths_for(ratio: int, head_dim: int) -> tuple[KernelPath, ...]:
    """The paths that take a ratio and head width, in registry order."""
    return tuple(path for path in PATHS.values() if ratio in path.ratios and path.head_dim == head_dim)


def choose(c128_path: str, ratio: int, head_dim: int, num_tokens: int, block_size: int,
           policy: Policy, state: StateFormat = DEFAULT_STATE) -> KernelPath:
    """The path of a call (raises ``ValueError`` for an unknown ``c128_path``, also where it has
    no effect, for a forced one the block size does not allow, or one that cannot take the
    call's SPEC §13 state format). A ratio and head width with one path take it (C4, the
    indexer); C128 takes the forced path or ``auto``'s choice: with a format other than the
    default, ``fused_pipelined`` for an fp32 state and ``split_generic`` for a bf16 one (paths of any
    block size)."""
    check_c128_path(c128_path)
    candidates = paths_for(ratio, head_dim)
    if len(candidates) == 1:
        return candidates[0]
    formatted = state != DEFAULT_STATE
    if c128_path != "auto":
        path = PATHS[c128_path]
        if not path.takes(state):
            takes = ", ".join(repr(p.name) for p in candidates if p.takes(state))
            raise ValueError(f"c128_path: expected a path that takes SPEC §13's state formats ({takes} or 'auto') "
                             f"for {state}, got {c128_path!r}")
        path.configs(PathRequest(ratio, block_size, 1, "flashmla_fp8", 1, "float32", 16, False, policy, False))
        return path  # (its configurations raise if the block size does not allow it)
    if formatted:
        return PATHS["fused_pipelined" if PATHS["fused_pipelined"].takes(state) else "split_generic"]
    if num_tokens <= policy.cluster_max_tokens:
        return PATHS["fused_cluster"]
    if num_tokens <= policy.handoff_max_tokens:
        return PATHS["fused_handoff"]
    return PATHS["fused_pipelined"]


def plan(call, options, store_align: int, bf16_weight: bool) -> tuple[KernelPath, PathRequest]:
    """The path of a validated call (the front end's ``CompressStoreCall``) and the request its
    configurations are built from; ``options``: the call's :class:`.arguments.CompressOptions`."""
    pooling, store = call.pooling, call.store
    state = state_format(pooling.state_format)
    path = choose(options.c128_path, pooling.config.ratio, pooling.config.head_dim, pooling.num_tokens,
                  pooling.block_size, options.policy, state)
    request = PathRequest(pooling.config.ratio, pooling.block_size, pooling.num_tokens, store.layout,
                          store.entries_per_page, "bfloat16" if bf16_weight else "float32", store_align,
                          store.hadamard, options.policy, options.pdl,
                          options.early_metadata and options.pdl,  # without PDL there is no wait to read ahead of
                          state)
    return path, request


def state_format(spec_format) -> StateFormat:
    """The kernels' :class:`..config.StateFormat` of the front end's validated one
    (``spec.state_format.StateFormat``: dtype ``"fp32"``/``"bf16"``, ``ape_at``, ``ring_capacity``)."""
    return StateFormat("bfloat16" if spec_format.dtype == "bf16" else "float32", spec_format.ape_at,
                       spec_format.ring_capacity is not None)
