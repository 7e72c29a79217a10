"""Public operations of the CuTe DSL implementation.

Order of work in every call (SPEC §8/§9):

1. the shared front end (:mod:`dsv4_compressor.impl.frontend`) validates every argument and
   raises ``ValueError`` (argument, expected, given) before anything is compiled or launched;
2. this implementation's own constraints (CUDA tensors, a forced ``c128_path`` that the
   block size does not allow, the scratch ``workspace``) raise ``ValueError`` the same way;
3. :func:`.host.paths.choose` picks the call's path (a record of :data:`.host.paths.PATHS`)
   from the frozen :class:`.host.policy.Policy`, the compile cache returns its kernels
   (compiled on first use: :func:`warm_up` before CUDA-graph capture), and they are called
   through TVM-FFI with the torch tensors on the current stream: no host sync, no per-call
   conversion, no allocation except the scratch of the C128 split and handoff paths when the
   caller passes no ``workspace``.

Steps 1-3 run once per argument layout and token count (a :class:`.host.plans.LaunchPlan`,
kept by :mod:`.host.arguments`' key); later calls with the same layout pay the key, a
dictionary lookup and the launches. :func:`bind` goes further: it validates a layer's fixed tensors once, and once a
token count has been validated its calls pay a lookup, five dtype checks and the launches,
TVM-FFI checking the rest (:class:`BoundLayer`).

Every kernel is launched with programmatic dependent launch (``pdl=True``, see
:mod:`.stages.dependent_launch`): its CTAs may become resident while the previous kernel in the
stream finishes, and it waits (``griddepcontrol.wait``) before its first memory access;
except that with early metadata (:func:`save_and_compress_norm_rope_store`, or
``Policy(early_metadata=True)``) the C128 kernels read their metadata first and wait right
before their first state row.

The indexer compressor (SPEC §12: head width 128, ``layout="indexer_fp8"`` or
``"indexer_mxfp4"``, ``hadamard=``) takes the same calls, plans, bound layers and warm-up; its
path is ``indexer`` (``workspace`` and ``c128_path`` do not apply there).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ...spec.constants import HEAD_DIM
from ...spec.entry_layout import ENTRY_LAYOUTS
from ...spec.validation import check_compress, check_hadamard
from .. import custom_ops
from ..frontend import describe_torch
from ..plan_cache import PlanCache
from .config import StateFormat, store_alignments
from .host import buffers, occupancy, plans, step_plans
from .host.arguments import (CompressOptions, CompressTensors, bound_key, compress_key, fixed_key, save_key, step_key,
                             unbound_save_key)
from .host.buffers import SUPPORTED_DEVICES  # noqa: F401  (the package's face re-exports it)
from .host.paths import PathRequest, check_c128_path, choose, save_config, step_save_config
from .host.policy import DEFAULT_POLICY, Policy

log = logging.getLogger("dsv4_compressor")

_PLANS = PlanCache()  # compress_norm_rope_store and save_partial_states plans, by argument layout
_LAYER_LAYOUTS: dict = {}  # a bound layer's fixed key -> a small int, its plans' key prefix
_BOUND_LAUNCHES: dict = {}  # that int -> PlanCache of T -> the plan's launch_bound (bound layers' eager path)
_INT32, _INT64 = torch.int32, torch.int64
# What an eager launch may raise before launching anything: TVM-FFI refusing an argument
# (TypeError, ValueError), the workspace check's ValueError, or a non-tensor argument met by the
# dtype checks (AttributeError). The call is then validated the long way, which names the argument.
_REFUSED = (TypeError, ValueError, AttributeError)
_compiling = torch.compiler.is_compiling  # True while torch.compile traces: the calls take their custom op
_DEFAULT_POLICY = "the default policy (DEFAULT_POLICY)"


# ---- public operations ----------------------------------------------------------------------
def save_partial_states(
    kv_score,  # fp32 [T, 2*SW]: kv then score (score without ape)
    ape,  # fp32 [r, SW]; unused (may be None) with ape_at="compress"
    positions,  # int64 [T]
    slot_mapping,  # int64 [T], -1 = padding
    state_cache,  # fp32 or bf16 (SPEC §13.1) [num_state_blocks, bs, 2*SW], written in place
    block_size,  # bs
    *,
    ape_at: str = "save",  # SPEC §13.2: "save" adds ape here, "compress" stores the raw score
    ring_capacity: int | None = None,  # SPEC §13.3: checked only; slot_mapping already names ring slots
    debug: bool = False,
    pdl: bool = True,
    policy: Policy = DEFAULT_POLICY,
) -> None:
    """SPEC §4: copy each saved token's kv and ``add(score, ape[p mod r])`` into the state cache
    (SPEC §13: the raw score with ``ape_at="compress"``; a bf16 state rounds each value once to
    bf16). Under ``torch.compile``: the custom op ``cutedsl_save_partial_states`` (the default
    policy)."""
    if _compiling():
        return _traced_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, pdl, policy,
                            ape_at, ring_capacity)
    _save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, pdl, policy, ape_at,
               ring_capacity).run(kv_score, ape, positions, slot_mapping, state_cache)


def _traced_save(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, pdl, policy, ape_at,
                 ring_capacity) -> None:
    """``save_partial_states`` as ``torch.compile`` traces it: one custom op."""
    custom_ops.refuse("policy", policy, DEFAULT_POLICY, "cutedsl_save_partial_states", _DEFAULT_POLICY)
    custom_ops.op("cutedsl", "save_partial_states")(kv_score, ape, positions, slot_mapping, state_cache, block_size,
                                                    debug, pdl, ape_at, ring_capacity)


def _save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, pdl, policy, ape_at,
               ring_capacity, fixed=None) -> plans.SavePlan:
    """The cached plan of a save (SPEC §13's ``ape_at`` and ``ring_capacity``; ``fixed``: a bound
    layer's interned key prefix, which holds them)."""
    if debug:
        key = plan = None
    elif fixed is None:
        key, plan = _PLANS.find(unbound_save_key, kv_score, ape, positions, slot_mapping, state_cache, block_size, pdl,
                                policy, ape_at, ring_capacity)
    else:
        key, plan = _PLANS.find(save_key, fixed, kv_score, ape, positions, slot_mapping)
    if plan is None:
        plan = _PLANS.put(key, plans.build_save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size,
                                                     debug, policy, pdl, ape_at, ring_capacity))
    return plan


def compress_norm_rope_store(
    state_cache,  # fp32 or bf16 (SPEC §13.1) [num_state_blocks, bs, 2*SW]
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    rms_norm_weight,  # bf16 or fp32 [H], H = 512 (or 128: the indexer)
    rms_norm_eps,  # python float (rounded to binary32)
    cos_sin_cache,  # fp32 [max_pos, 64]
    k_cache,  # flashmla_fp8: uint8 [P, B, 584]; bf16: bf16 [P, B, 512]; fp8_per_tensor: float8_e4m3fn [P, B, 512];
    #           indexer_fp8 / indexer_mxfp4: uint8 [P, B, 132 / 68]
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    layout: str = "flashmla_fp8",  # or "bf16", "fp8_per_tensor"; a 128-wide state: "indexer_fp8", "indexer_mxfp4"
    fp8_scale: float | None = None,
    hadamard: bool = False,  # indexer layouts: the Hadamard rotation before quantization (SPEC §12)
    ape: torch.Tensor | None = None,  # fp32 [r, SW]: needed with ape_at="compress" (SPEC §13.2)
    ape_at: str = "save",  # "save": the state's scores include ape; "compress": pooling adds it
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    debug: bool = False,
    workspace: torch.Tensor | None = None,  # C128 split/handoff paths' fp32 scratch: [S >= T, 512] or >= T*512 elements
    c128_path: str = "auto",  # "auto" or a path of host.paths.C128_PATHS ("fused_pipelined", "split_block8", ...)
    pdl: bool = True,  # programmatic dependent launch (see .dependent_launch)
    policy: Policy = DEFAULT_POLICY,  # dispatch thresholds and kernel shapes (see .dispatch)
) -> None:
    """SPEC §5-§7: pool, normalize, rotate, quantize and store one entry per active token.

    The first call with a given argument layout validates, dispatches and compiles; later
    calls with the same layout reuse that plan (``debug=True`` always validates, and checks
    values). The indexer layouts (``"indexer_fp8"``, ``"indexer_mxfp4"``, head width 128,
    SPEC §12) run the ``indexer`` path's kernel. SPEC §13: a bf16 state (the tensor's dtype),
    ``ape`` added at pooling (``ape_at="compress"``), a ring of ``ring_capacity`` rows per request
    (C128: ``auto`` then takes ``split_generic``). Under ``torch.compile``: the custom op
    ``cutedsl_compress_norm_rope_store`` (the default policy).
    """
    if _compiling():
        return _traced_compress("compress_norm_rope_store", (
            state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
            rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, debug,
            workspace, c128_path, pdl, hadamard, ape, ape_at, ring_capacity), policy)
    tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
               cos_sin_cache, k_cache, kv_slot_mapping)  # in CompressTensors' order
    options = (block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, c128_path, pdl, policy, False,
               ape_at, ring_capacity)
    _compress_plan(tensors, workspace, options, debug, ape=ape).run(tensors, workspace, ape)


# the compress op's arguments after compress_ratio at their schema defaults: layout, fp8_scale, debug,
# workspace, c128_path, pdl, hadamard, ape, ape_at, ring_capacity
_OP_TRAILING_DEFAULTS = custom_ops.trailing_defaults("compress_norm_rope_store", 12, cutedsl=True)


def compress_norm_rope_store_op(*args) -> None:
    """The kernel of ``torch.ops.dsv4_compressor.cutedsl_compress_norm_rope_store``: the op's
    arguments in its schema's order (the dispatcher leaves trailing defaults out), taken to the
    cached plan as :func:`compress_norm_rope_store` takes them, without its keyword parsing (the
    largest part of the Python an op call adds to torch's dispatcher)."""
    (state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight, rms_norm_eps,
     cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, debug, workspace, c128_path, pdl,
     hadamard, ape, ape_at, ring_capacity) = args + _OP_TRAILING_DEFAULTS[len(args) - 12:]
    tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
               cos_sin_cache, k_cache, kv_slot_mapping)  # in CompressTensors' order
    options = (block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, c128_path, pdl, DEFAULT_POLICY,
               False, ape_at, ring_capacity)
    _compress_plan(tensors, workspace, options, debug, ape=ape).run(tensors, workspace, ape)


def _traced_compress(operation: str, arguments: tuple, policy) -> None:
    """``compress_norm_rope_store`` or ``save_and_compress_norm_rope_store`` as ``torch.compile``
    traces it: one custom op on ``arguments`` (in its schema's order)."""
    custom_ops.refuse("policy", policy, DEFAULT_POLICY, f"cutedsl_{operation}", _DEFAULT_POLICY)
    custom_ops.op("cutedsl", operation)(*arguments)


def _compress_plan(tensors: tuple, workspace, options: tuple, debug: bool, ape=None, layer=None) -> plans.LaunchPlan:
    """The cached plan of a ``compress_norm_rope_store`` call (validated, dispatched and
    compiled on the first call with this layout); ``tensors`` and ``options`` in the order of
    :class:`.host.arguments.CompressTensors` and :class:`.host.arguments.CompressOptions`;
    ``ape``: SPEC §13.2's, or None; ``layer``: a bound layer's interned key part, else None."""
    if debug:
        key = plan = None
    elif layer is None:
        key, plan = _PLANS.find(compress_key, tensors, workspace, options, ape)
    else:
        key, plan = _PLANS.find(bound_key, layer, options.early_metadata, tensors, workspace, ape)
    if plan is None:
        plan = _PLANS.put(key, plans.build_compress_plan(
            CompressTensors._make(tensors), workspace, CompressOptions._make(options), debug, ape))
    return plan


def save_and_compress_norm_rope_store(
    kv_score,  # fp32 [T, 2*SW]: this step's kv and score projections
    ape,  # fp32 [r, SW]
    state_cache,  # fp32 or bf16 (SPEC §13.1) [num_state_blocks, bs, 2*SW]
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    rms_norm_weight,  # bf16 or fp32 [512]
    rms_norm_eps,  # python float (rounded to binary32)
    cos_sin_cache,  # fp32 [max_pos, 64]
    k_cache,  # as in compress_norm_rope_store
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    hadamard: bool = False,  # indexer layouts (SPEC §12)
    ape_at: str = "save",  # SPEC §13.2 (the save and the compress alike)
    ring_capacity: int | None = None,  # SPEC §13.3
    debug: bool = False,
    workspace: torch.Tensor | None = None,
    c128_path: str = "auto",
    pdl: bool = True,
    policy: Policy = DEFAULT_POLICY,
) -> None:
    """SPEC §4 then §5-§7: ``save_partial_states(kv_score, ape, positions, slot_mapping,
    state_cache, block_size)`` and ``compress_norm_rope_store(...)`` with the same state cache,
    back to back on the current stream; both calls are validated before either launches.

    The same bytes as the two calls. Faster with PDL: the C128 compress kernel reads its
    metadata, block table, weights and cos/sin while the save kernel still runs, and waits
    (``griddepcontrol.wait``) only before its first state row. That is safe here, and only
    here: the kernel right before it is this call's save kernel, which writes nothing but
    state rows and lets the compress kernel start only after its own predecessor has
    completed (see :mod:`.stages.dependent_launch`). Under ``torch.compile``: the custom op
    ``cutedsl_save_and_compress_norm_rope_store`` (the default policy).
    """
    if _compiling():
        return _traced_compress("save_and_compress_norm_rope_store", (
            kv_score, ape, state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
            rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale,
            debug, workspace, c128_path, pdl, hadamard, ape_at, ring_capacity), policy)
    tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
               cos_sin_cache, k_cache, kv_slot_mapping)  # in CompressTensors' order
    options = (block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, c128_path, pdl, policy, True,
               ape_at, ring_capacity)
    plan = _compress_plan(tensors, workspace, options, debug, ape=ape)
    save = _save_plan(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug, pdl, policy, ape_at,
                      ring_capacity)
    save.run(kv_score, ape, positions, slot_mapping, state_cache)
    plan.run(tensors, workspace, ape)


def compress_and_save(
    kv,  # fp32 [T, SW]: this call's kv projections (any row stride, 16-byte aligned rows)
    score,  # fp32 [T, SW]: this call's raw scores (no ape; any row stride, 16-byte aligned rows)
    ape,  # fp32 [r, SW]: added at the save or at the compress (ape_at)
    positions,  # int64 [T]
    token_to_req,  # int32 [T]: request (block_table row) of each token
    query_start_loc,  # int32 [num_reqs + 1]: first token of each request's chunk
    slot_mapping,  # int64 [T]: state slot, -1 = padding (the activity rule reads it)
    save_slot_mapping,  # int64 [T]: slot the save writes, -1 = not saved (a ring: the tail)
    block_table,  # int32 [num_reqs', max_blocks], num_reqs' >= num_reqs
    bs,  # rows per state block
    state_cache,  # fp32 or bf16 [num_state_blocks, bs, 2*SW], written in place
    rms_norm_weight,  # bf16 or fp32 [H], H = 512 or 128
    rms_norm_eps,  # python float (rounded to binary32)
    cos_sin_cache,  # fp32 [max_pos, 64]
    k_cache,  # the layout's cache, as in compress_norm_rope_store; written in place
    kv_slot_mapping,  # int64 [T]: compressed-cache slot, -1 = none
    *,
    compress_ratio: int,  # 4 (C4) or 128 (C128)
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    ape_at: str = "save",  # SPEC §13.2
    ring_capacity: int | None = None,  # SPEC §13.3: None paged, C a ring of C rows per request
    hadamard: bool = False,  # SPEC §12's rotation; indexer layouts only
    debug: bool = False,
    pdl: bool = True,  # programmatic dependent launch (see .dependent_launch)
    policy: Policy = DEFAULT_POLICY,  # kernel shapes and the persistent grid's cap
) -> None:
    """SPEC §13.4 in two launches on the current stream (three for a bf16 C128 state, whose compress is the
    split path's two): the compress kernel of the call's state
    format compiled with ``rows_from_inputs`` (each window row at or after its request's chunk start
    read from ``kv``/``score`` as the save would store it and pooling read it back, older rows from
    the state; C4: ``c4``, C128: ``fused_pipelined`` for an fp32 state, ``split_generic`` for a bf16 one,
    the indexer layouts: ``indexer``), then the save
    of the tokens with ``save_slot_mapping >= 0``, after every window has been read. Nothing is
    compiled or launched if validation fails. The first call with a given argument layout validates
    and compiles; later calls reuse that plan (``debug=True`` always validates, and checks values).
    Under ``torch.compile``: the custom op ``cutedsl_compress_and_save`` (the default ``pdl`` and policy)."""
    if _compiling():
        custom_ops.refuse("pdl", pdl, True, "cutedsl_compress_and_save")
        custom_ops.refuse("policy", policy, DEFAULT_POLICY, "cutedsl_compress_and_save", _DEFAULT_POLICY)
        return custom_ops.op("cutedsl", "compress_and_save")(
            kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping, save_slot_mapping, block_table, bs,
            state_cache, rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout,
            fp8_scale, ape_at, ring_capacity, hadamard, debug)
    tensors = step_plans.StepTensors(kv, score, ape, positions, token_to_req, query_start_loc, slot_mapping,
                                     save_slot_mapping, block_table, state_cache, rms_norm_weight, cos_sin_cache,
                                     k_cache, kv_slot_mapping)
    options = (bs, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard, "auto", pdl, policy, False, ape_at,
               ring_capacity)  # in CompressOptions' order
    key = plan = None
    if not debug:
        key, plan = _PLANS.find(step_key, (state_cache, token_to_req, positions, slot_mapping, block_table,
                                           rms_norm_weight, cos_sin_cache, k_cache, kv_slot_mapping), options, ape, kv,
                                score, query_start_loc, save_slot_mapping)
    if plan is None:
        plan = _PLANS.put(key, step_plans.build_step_plan(tensors, CompressOptions._make(options), debug))
    plan.run(tensors)


def compress(
    state_cache,  # fp32 [num_state_blocks, bs, 2*SW]
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    out: torch.Tensor | None = None,  # fp32 [S >= T, 512]; allocated (NaN-filled) when None
    c128_path: str = "auto",  # C128: which compress kernel ("split_block8" | "split_generic"; others: auto)
    pdl: bool = True,
    policy: Policy = DEFAULT_POLICY,
) -> torch.Tensor:
    """SPEC §5: the compressed vector ``x`` (fp32 ``[T, 512]``) of the active tokens.

    Rows of active tokens hold exactly SPEC's bits (the split path's scratch contents);
    other rows are left untouched (NaN when ``out`` is None). For tests and debugging. Under
    ``torch.compile``: the custom op ``cutedsl_compress`` (a new tensor: no ``out``; the default
    policy).
    """
    if _compiling():
        return _traced_pooling(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                               kv_slot_mapping, compress_ratio, out, c128_path, pdl, policy)
    call = check_compress(
        describe_torch("state_cache", state_cache), describe_torch("token_to_req_indices", token_to_req_indices),
        describe_torch("positions", positions), describe_torch("slot_mapping", slot_mapping),
        describe_torch("block_table", block_table), block_size, describe_torch("kv_slot_mapping", kv_slot_mapping),
        compress_ratio, head_dims=(HEAD_DIM,),  # no indexer kernel writes x
    )
    num_tokens, block_size = call.num_tokens, call.block_size
    path = choose(c128_path, call.config.ratio, HEAD_DIM, num_tokens, block_size, policy)
    buffer = None if out is None else buffers.x_buffer(out, num_tokens, state_cache.device, "out")
    buffers.require_cuda("state_cache", state_cache)
    if out is None:
        out = buffer = torch.full((num_tokens, HEAD_DIM), float("nan"), dtype=torch.float32, device=state_cache.device)
    if num_tokens == 0:
        return out
    kernel, configs = path.pooling
    request = PathRequest(call.config.ratio, block_size, num_tokens, "flashmla_fp8", 1, "float32", 16, False, policy,
                          pdl)
    compiled = plans.kernels().compile_kernel(kernel, configs(request))
    metadata = buffers.unit_strides(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping)
    compiled(state_cache, *metadata, buffer)
    return out


def _traced_pooling(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                    kv_slot_mapping, compress_ratio, out, c128_path, pdl, policy) -> torch.Tensor:
    """``compress`` as ``torch.compile`` traces it: one custom op, which returns a new tensor."""
    custom_ops.refuse("out", out, None, "cutedsl_compress")
    custom_ops.refuse("policy", policy, DEFAULT_POLICY, "cutedsl_compress", _DEFAULT_POLICY)
    return custom_ops.op("cutedsl", "compress")(state_cache, token_to_req_indices, positions, slot_mapping,
                                                block_table, block_size, kv_slot_mapping, compress_ratio, c128_path,
                                                pdl)


# ---- a layer's operator, validated once ------------------------------------------------------
class BoundLayer:
    """The operations of one attention layer with its fixed tensors bound (see :func:`bind`).

    The first call with a token count validates every argument through the shared front end,
    exactly like the unbound operations, and prepares that count's launch. Later calls with
    that count take the eager path: ``T = positions.shape[0]``, the dtypes of the per-token
    arrays and the block table (``is`` int32/int64), a dictionary lookup, and the TVM-FFI
    launch with the layer's fixed tensors converted once. Everything else SPEC §9 asks of
    the per-token arrays, the block table and the workspace, TVM-FFI checks in C before it
    launches: tensor type, rank, device type and index (every tensor on the state cache's
    device), dtype width and kind (int and uint of one width alike: hence the ``is`` checks
    here), static extents, one length ``T`` for every per-token array, unit last strides
    (where the extent is above 1) and base alignment; :func:`.host.buffers.bound_scratch` checks the
    workspace's rows. When TVM-FFI refuses an argument, nothing has been launched, and the
    call is validated the long way, which raises SPEC §9's ``ValueError`` (or, for a layout
    SPEC allows that the eager path does not take, runs the validated plan). ``debug=True``,
    ``T = 0`` and :meth:`save_and_compress_norm_rope_store` always take the validated,
    keyed path.

    Layers whose fixed arguments have the same layout share their plans. The bound tensors
    must keep their storage, shape and strides (bind again after reallocating a cache).
    """

    def __init__(self, state_cache, k_cache, rms_norm_weight, cos_sin_cache, *, block_size, compress_ratio,
                 rms_norm_eps, layout, fp8_scale, hadamard, c128_path, pdl, policy, ape_at="save", ring_capacity=None):
        self.state_cache, self.k_cache = state_cache, k_cache  # fp32 or bf16 [blocks, bs, 2*SW]; k_cache as in the layout
        self.rms_norm_weight, self.cos_sin_cache = rms_norm_weight, cos_sin_cache  # [H]; fp32 [max_pos, 64]
        self.block_size, self.compress_ratio, self.rms_norm_eps = block_size, compress_ratio, rms_norm_eps
        self.layout, self.fp8_scale, self.hadamard = layout, fp8_scale, hadamard
        self.c128_path, self.pdl, self.policy = c128_path, pdl, policy
        self.ape_at, self.ring_capacity = ape_at, ring_capacity  # SPEC §13.2/§13.3 (the state's dtype: §13.1)
        self.options = CompressOptions(block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, hadamard,
                                       c128_path, pdl, policy, False, ape_at, ring_capacity)
        empty = _empty_metadata(state_cache, block_size, ring_capacity)  # T = 0: validates the fixed arguments
        plans.build_compress_plan(CompressTensors._make(self._tensors(empty[0], empty[1], empty[1], empty[2], empty[1])),
                                  None, self.options, False, _empty_ape(state_cache, compress_ratio, ape_at))
        fixed = fixed_key(state_cache, rms_norm_weight, cos_sin_cache, k_cache, self.options)
        self._layout = _LAYER_LAYOUTS.setdefault(fixed, len(_LAYER_LAYOUTS))  # plans' key prefix
        self._launches = _BOUND_LAUNCHES.setdefault(self._layout, PlanCache())  # T -> plan.launch_bound
        self._takes_ape = ape_at == "compress"  # the compress's ape is a per-call argument: the keyed path
        self._held = None  # (state cache, norm weight, cos/sin, k_cache) as TVM-FFI tensors, then the device
        self._save_kernel = None  # save_partial_states' kernel of 16-byte aligned inputs, once compiled

    def _hold(self) -> None:
        """The layer's fixed tensors as TVM-FFI tensors, then its device (made after the first
        launch: CuTe DSL is imported by then; the torch tensors where a conversion fails)."""
        if self._held is None:
            fixed = (self.state_cache, self.rms_norm_weight, self.cos_sin_cache, self.k_cache)
            try:
                fixed = buffers.held_tensors(*fixed)
            except (ImportError, BufferError, TypeError, ValueError, RuntimeError):  # converted at each launch
                log.debug("cutedsl: bound layer keeps torch tensors for its fixed arguments", exc_info=True)
            self._held = (*fixed, self.state_cache.device)

    def _tensors(self, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping) -> tuple:
        return (self.state_cache, token_to_req_indices, positions, slot_mapping, block_table, self.rms_norm_weight,
                self.cos_sin_cache, self.k_cache, kv_slot_mapping)  # in CompressTensors' order

    def _compress_plan(self, tensors: tuple, workspace, debug: bool, early_metadata: bool,
                       ape=None) -> plans.LaunchPlan:
        options = self.options._replace(early_metadata=True) if early_metadata else self.options
        return _compress_plan(tensors, workspace, options, debug, ape, self._layout)

    def _save_plan(self, kv_score, ape, positions, slot_mapping, debug: bool) -> plans.SavePlan:
        return _save_plan(kv_score, ape, positions, slot_mapping, self.state_cache, self.block_size, debug, self.pdl,
                          self.policy, self.ape_at, self.ring_capacity, self._layout)

    def compress_norm_rope_store(self, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping, *,
                                 ape=None, workspace=None, debug: bool = False) -> None:
        """:func:`compress_norm_rope_store` with this layer's fixed arguments (``workspace``:
        pass a 2-D ``[S >= T, 512]`` one for the C128 scratch, see :func:`.host.buffers.bound_scratch`;
        ``ape``: fp32 ``[r, SW]``, a layer bound with ``ape_at="compress"`` only, whose calls then
        take the keyed path)."""
        if not debug and not self._takes_ape:
            try:  # the eager path (see the class)
                launch_bound = self._launches.get(positions.shape[0])
                if (launch_bound is not None and token_to_req_indices.dtype is _INT32 and positions.dtype is _INT64
                        and slot_mapping.dtype is _INT64 and block_table.dtype is _INT32
                        and kv_slot_mapping.dtype is _INT64 and ape is None):
                    launch_bound(self._held, (token_to_req_indices, positions, slot_mapping, block_table,
                                              kv_slot_mapping), workspace)
                    return
            except _REFUSED:  # refused before any launch: the validation below names the argument
                pass
        tensors = self._tensors(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping)
        plan = self._compress_plan(tensors, workspace, debug, False, ape)
        plan.run(tensors, workspace, ape)
        if plan.kernels and not debug and not self._takes_ape:  # later calls with this T take the eager path
            self._hold()
            self._launches.put(plan.num_tokens, plan.launch_bound)

    def save_partial_states(self, kv_score, ape, positions, slot_mapping, *, debug: bool = False) -> None:
        """:func:`save_partial_states` into this layer's state cache (the eager path, as for
        :meth:`compress_norm_rope_store`, for ``kv_score`` and ``ape`` with 16-byte aligned rows;
        with ``ape_at="compress"`` the save reads no ``ape``: pass None or any)."""
        kernel = self._save_kernel
        if kernel is not None and not debug:
            try:  # TVM-FFI checks the rest, the base alignments included (see the class)
                if (positions.shape[0] and positions.dtype is _INT64 and slot_mapping.dtype is _INT64
                        and not kv_score.stride(0) % 4 and (self._takes_ape or not ape.stride(0) % 4)):
                    kernel(kv_score, None if self._takes_ape else ape, positions, slot_mapping, self._held[0],
                           None)  # the kernel's score of split inputs: TVM-FFI takes the defaulted None too
                    return
            except _REFUSED:  # refused before any launch: the validation below names the argument
                pass
        plan = self._save_plan(kv_score, ape, positions, slot_mapping, debug)
        plan.run(kv_score, ape, positions, slot_mapping, self.state_cache)
        if plan.vector_inputs and not debug:
            self._hold()
            self._save_kernel = buffers.ffi_function(plan.kernel)

    def save_and_compress_norm_rope_store(self, kv_score, ape, token_to_req_indices, positions, slot_mapping,
                                          block_table, kv_slot_mapping, *, workspace=None, debug: bool = False) -> None:
        """:func:`save_and_compress_norm_rope_store` with this layer's fixed arguments (``ape`` goes to
        the compress too where the layer adds it there, ``ape_at="compress"``)."""
        tensors = self._tensors(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping)
        compress_ape = ape if self._takes_ape else None
        plan = self._compress_plan(tensors, workspace, debug, True, compress_ape)
        self._save_plan(kv_score, ape, positions, slot_mapping, debug).run(kv_score, ape, positions, slot_mapping,
                                                                          self.state_cache)
        plan.run(tensors, workspace, compress_ape)

    def warm_up(self, token_counts=None, *, save: bool = True, save_and_compress: bool = False) -> list:
        """:func:`warm_up` for this layer's configuration."""
        return warm_up(compress_ratio=self.compress_ratio, block_size=self.block_size, layout=self.layout,
                       entries_per_page=self.k_cache.shape[1], weight_dtype=self.rms_norm_weight.dtype,
                       device=self.state_cache.device, token_counts=token_counts,
                       store_align=buffers.store_align(self.k_cache, self.layout), hadamard=self.hadamard,
                       c128_path=self.c128_path, pdl=self.pdl, policy=self.policy, save=save,
                       save_and_compress=save_and_compress, state_dtype=self.state_cache.dtype, ape_at=self.ape_at,
                       ring_capacity=self.ring_capacity)


def _empty_metadata(state_cache, block_size=1, ring_capacity=None) -> tuple:
    """``T = 0`` per-token arrays and a block table of no rows, as wide as a ring of
    ``ring_capacity`` rows needs (SPEC §13.3; one column when paged or unchecked)."""
    device = state_cache.device if isinstance(state_cache, torch.Tensor) else None
    columns = 1
    if (isinstance(ring_capacity, int) and isinstance(block_size, int) and block_size > 0
            and 0 < ring_capacity <= 1 << 20):
        columns = max(1, -(-ring_capacity // block_size))
    return (torch.empty(0, dtype=torch.int32, device=device), torch.empty(0, dtype=torch.int64, device=device),
            torch.empty((0, columns), dtype=torch.int32, device=device))


def _empty_ape(state_cache, compress_ratio, ape_at):
    """A zero ``ape`` (fp32 ``[r, SW]``) for a bound layer's ``T = 0`` validation where the compress
    takes one (``ape_at="compress"``), else None."""
    if ape_at != "compress" or not isinstance(state_cache, torch.Tensor) or state_cache.dim() != 3:
        return None
    ratio = compress_ratio if compress_ratio in (4, 128) else 4
    return torch.zeros((ratio, state_cache.shape[2] // 2), dtype=torch.float32, device=state_cache.device)


def bind(state_cache, k_cache, rms_norm_weight, cos_sin_cache, *, block_size: int, compress_ratio: int,
         rms_norm_eps: float, layout: str = "flashmla_fp8", fp8_scale: float | None = None, hadamard: bool = False,
         c128_path: str = "auto", pdl: bool = True, policy: Policy = DEFAULT_POLICY, ape_at: str = "save",
         ring_capacity: int | None = None) -> BoundLayer:
    """A layer's operator: its state cache, compressed cache, norm weight, cos/sin cache and
    scalars validated now (``ValueError`` as in the unbound calls), so that each call checks
    only the per-token arrays, the block table and the workspace (after the first call of a
    token count, mostly in TVM-FFI's C wrapper: see :class:`BoundLayer`).

    ``op = bind(...); op.save_partial_states(kv_score, ape, positions, slot_mapping)``,
    ``op.compress_norm_rope_store(token_to_req_indices, positions, slot_mapping, block_table,
    kv_slot_mapping, workspace=...)``, ``op.save_and_compress_norm_rope_store(...)``, ``op.warm_up()``.
    The indexer layouts (SPEC §12, with ``hadamard``) bind the same way. SPEC §13's state formats:
    the state's dtype is the bound ``state_cache``'s (fp32 or bf16); ``ape_at`` and ``ring_capacity``
    are the layer's (with ``ape_at="compress"`` its compress calls take ``ape=`` and skip the eager path).
    """
    return BoundLayer(state_cache, k_cache, rms_norm_weight, cos_sin_cache, block_size=block_size,
                      compress_ratio=compress_ratio, rms_norm_eps=rms_norm_eps, layout=layout, fp8_scale=fp8_scale,
                      hadamard=hadamard, c128_path=c128_path, pdl=pdl, policy=policy, ape_at=ape_at,
                      ring_capacity=ring_capacity)


# ---- warm-up -----------------------------------------------------------------------------------
DEFAULT_MAX_TOKENS = 16384  # token counts warm_up covers when given none


def _warm_state(state_dtype, ape_at, ring_capacity) -> StateFormat:
    """:func:`warm_up`'s SPEC §13 options as the kernels' :class:`.config.StateFormat`."""
    dtypes = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
    if state_dtype not in dtypes:
        raise ValueError(f"state_dtype: expected torch.float32 or torch.bfloat16, got {state_dtype!r}")
    if ring_capacity is not None and (isinstance(ring_capacity, bool) or not isinstance(ring_capacity, int)
                                      or ring_capacity < 1):
        raise ValueError(f"ring_capacity: expected None or a positive integer, got {ring_capacity!r}")
    return StateFormat(dtypes[state_dtype], ape_at, ring_capacity is not None)  # (StateFormat checks ape_at)


def _want_step(wanted: dict, counts, compress_ratio: int, block_size: int, policy: Policy, state: StateFormat,
               store: tuple) -> None:
    """Add :func:`compress_and_save`'s kernels for ``counts`` to ``wanted`` (``store``: the request's
    layout, entries per page, weight dtype, store alignment, hadamard and pdl)."""
    layout, entries_per_page, weight, store_align, hadamard, pdl = store
    head_dim = ENTRY_LAYOUTS[layout].head_dim
    step = dataclasses.replace(state, rows_from_inputs=True)
    for num_tokens in counts:
        path = choose("auto", compress_ratio, head_dim, num_tokens, block_size, policy, step)
        request = PathRequest(compress_ratio, block_size, num_tokens, layout, entries_per_page, weight, store_align,
                              hadamard, policy, pdl, False, step)
        for kernel, config in zip(path.kernels, path.configs(request)):
            wanted.setdefault((path, kernel, config), request)
        save = step_save_config(compress_ratio, block_size, True, policy, pdl, head_dim, step, num_tokens)
        wanted.setdefault((None, "save", save), None)


def warm_up(*, compress_ratio: int, block_size: int, layout: str = "flashmla_fp8", entries_per_page: int,
            weight_dtype: torch.dtype = torch.bfloat16, device="cuda", token_counts=None, store_align: int | None = None,
            hadamard: bool = False, c128_path: str = "auto", pdl: bool = True, policy: Policy = DEFAULT_POLICY,
            save: bool = True, save_and_compress: bool = False, state_dtype: torch.dtype = torch.float32,
            ape_at: str = "save", ring_capacity: int | None = None, step: bool = False) -> list:
    """Compile every kernel a layer's configuration can dispatch to, before CUDA-graph capture.

    The configuration: ``compress_ratio``, ``block_size``, ``layout``, ``entries_per_page``
    (``k_cache.shape[1]``), ``weight_dtype`` (bf16 or fp32), ``device`` (the pipelined
    kernel's grid depends on how many of its clusters it holds), ``store_align`` (bf16/fp8
    layouts: the byte alignment of the cache's rows; default the aligned one: 8 for bf16, 4 for
    fp8_per_tensor), ``c128_path``,
    ``pdl`` and ``policy``. ``token_counts``: the step sizes to prepare (None: every count from
    1 to 16384). ``save`` also compiles ``save_partial_states`` (16-byte aligned inputs);
    ``save_and_compress`` the early-metadata kernels of :func:`save_and_compress_norm_rope_store`.
    SPEC §13's state format: ``state_dtype`` (``torch.float32`` or ``torch.bfloat16``), ``ape_at``,
    ``ring_capacity`` (``None`` or ``C``; only whether it is a ring changes the kernels). ``step``: the
    kernels of :func:`compress_and_save` too (the compress kernels with ``rows_from_inputs``, the save
    of two input tensors, its ``ape`` rows 16-byte aligned).
    The indexer layouts (SPEC §12; ``hadamard``) compile their one kernel, whatever the token
    counts, and the save kernel at the indexer's state widths.

    Returns the static configurations compiled (each logged at INFO on the
    ``dsv4_compressor`` logger).
    """
    device = torch.device(device)
    if compress_ratio not in (4, 128) or isinstance(compress_ratio, bool):
        raise ValueError(f"compress_ratio: expected 4 or 128, got {compress_ratio!r}")
    check_c128_path(c128_path)
    hadamard = check_hadamard(hadamard, layout)  # the calls' check and message
    entry = ENTRY_LAYOUTS.get(layout)
    if entry is None:
        raise ValueError(f"layout: expected one of {', '.join(repr(name) for name in ENTRY_LAYOUTS)}, got {layout!r}")
    if store_align is None:  # the aligned rows' alignment
        store_align = max(store_alignments(entry))
    weight = "bfloat16" if weight_dtype == torch.bfloat16 else "float32"
    state = _warm_state(state_dtype, ape_at, ring_capacity)
    counts = range(1, DEFAULT_MAX_TOKENS + 1) if token_counts is None else token_counts
    wanted = {}  # (path, kernel, config), in first-use order
    for early in (False, True) if save_and_compress and compress_ratio == 128 and pdl else (False,):
        for num_tokens in counts:
            path = choose(c128_path, compress_ratio, entry.head_dim, num_tokens, block_size, policy, state)
            request = PathRequest(compress_ratio, block_size, num_tokens, layout, entries_per_page, weight,
                                  store_align, hadamard, policy, pdl, early and pdl, state)
            for kernel, config in zip(path.kernels, path.configs(request)):
                if (path, kernel, config) not in wanted:
                    log.info("cutedsl warm_up: C%d from T=%d: %s", compress_ratio, num_tokens, path.name)
                    wanted[(path, kernel, config)] = request
    if save:
        config = save_config(compress_ratio, block_size, True, policy, pdl, entry.head_dim, state)
        wanted[(None, "save", config)] = None
    if step:
        _want_step(wanted, counts, compress_ratio, block_size, policy, state,
                   (layout, entries_per_page, weight, store_align, hadamard, pdl))
    compile_cache = plans.kernels()
    for (path, kernel, config), request in wanted.items():
        compiled = compile_cache.compile_kernel(kernel, config)
        if path is not None and path.persistent and device.type == "cuda":  # the driver's occupancy, asked now
            occupancy.persistent_grid(compiled, config, request, buffers.LaunchFacts(device, store_align,
                                                                              buffers.sm_count(device)))
    return [config for _, _, config in wanted]
