"""Register an implementation's public operations as torch custom ops (``torch.ops.dsv4_compressor.*``).

Each implementation calls :func:`register` with its module of operations and a name prefix
(``cutedsl``, ``triton``). The ops' schemas declare what they write (``Tensor(a!)``), and
their fake implementations write nothing and touch no data, so ``torch.compile(fullgraph=True)``
traces through them and CUDA graphs capture them; the SPEC §9 validation (which reads
``data_ptr`` and, with ``debug``, copies metadata to NumPy) runs inside the real
implementation, when the op executes, and raises the same ``ValueError``.

The ops are defined with ``torch.library.Library`` (schema strings and one kernel for every
device) rather than ``torch.library.custom_op``, whose per-call Python bookkeeping costs more
than the launches themselves. An op takes the implementation's default policy; the direct
Python calls remain the cheapest way to launch.

The public functions themselves trace too: while ``torch.compile`` traces (Dynamo folds
``torch.compiler.is_compiling()`` to True), each calls its op (:func:`op`), so the graph holds
one op per call; eagerly that check is the only addition to the call. An option the op cannot
take is refused then, naming it (:func:`refuse`). A public function whose signature is its op's
schema (DeepSeek-V4.1's, :mod:`.v41_custom_ops`) gets that routing from :func:`traced_as_op`.
"""

from __future__ import annotations

import functools

import torch

NAMESPACE = "dsv4_compressor"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")

_COMPRESS_ARGS = ("Tensor state_cache, Tensor token_to_req_indices, Tensor positions, Tensor slot_mapping, "
                  "Tensor block_table, int block_size, Tensor rms_norm_weight, float rms_norm_eps, "
                  "Tensor cos_sin_cache, Tensor(a!) k_cache, Tensor kv_slot_mapping, int compress_ratio, "
                  'str layout="flashmla_fp8", float? fp8_scale=None, bool debug=False')
_CUTEDSL_EXTRAS = ', Tensor(b!)? workspace=None, str c128_path="auto", bool pdl=True'
_HADAMARD = ", bool hadamard=False"  # the indexer layouts' rotation (SPEC §12); last, so earlier positions stay
_STATE_OPTIONS = ', str ape_at="save", int? ring_capacity=None'  # SPEC §13.2/§13.3, after every earlier argument
_COMPRESS_STATE_OPTIONS = ", Tensor? ape=None" + _STATE_OPTIONS  # the compress also takes ape (SPEC §13.2)
SCHEMAS = {
    "save_partial_states": "(Tensor kv_score, Tensor ape, Tensor positions, Tensor slot_mapping, "
                           "Tensor(a!) state_cache, int block_size, bool debug=False) -> ()",
    "compress_norm_rope_store": f"({_COMPRESS_ARGS}{_HADAMARD}) -> ()",
}
# SPEC §13.4's step call, which writes both caches. (:func:`register` also makes the saves' ``ape``
# optional, unused with ape_at="compress", and appends _STATE_OPTIONS to the saves and
# _COMPRESS_STATE_OPTIONS to the compress.)
STATE_FORMAT_SCHEMAS = {
    "compress_and_save": (
        "(Tensor kv, Tensor score, Tensor ape, Tensor positions, Tensor token_to_req, Tensor query_start_loc, "
        "Tensor slot_mapping, Tensor save_slot_mapping, Tensor block_table, int bs, Tensor(a!) state_cache, "
        "Tensor rms_norm_weight, float rms_norm_eps, Tensor cos_sin_cache, Tensor(b!) k_cache, Tensor kv_slot_mapping, "
        'int compress_ratio, str layout="flashmla_fp8", float? fp8_scale=None' + _STATE_OPTIONS
        + ", bool hadamard=False, bool debug=False) -> ()"),
}
CUTEDSL_SCHEMAS = {
    "save_partial_states": SCHEMAS["save_partial_states"].replace("bool debug=False)",
                                                                  "bool debug=False, bool pdl=True)"),
    "compress_norm_rope_store": f"({_COMPRESS_ARGS}{_CUTEDSL_EXTRAS}{_HADAMARD}) -> ()",
    "save_and_compress_norm_rope_store": (
        "(Tensor kv_score, Tensor ape, " + _COMPRESS_ARGS.replace("Tensor state_cache", "Tensor(c!) state_cache")
        + _CUTEDSL_EXTRAS + _HADAMARD + ") -> ()"),
    "compress": "(Tensor state_cache, Tensor token_to_req_indices, Tensor positions, Tensor slot_mapping, "
                'Tensor block_table, int block_size, Tensor kv_slot_mapping, int compress_ratio, str c128_path="auto", '
                "bool pdl=True) -> Tensor",
}


def _kernels(module, cutedsl: bool) -> dict:
    """The real implementation of each op: the module's own kernel for it where it has one
    (``{operation}_op``, taking the schema's arguments in order, e.g. the CuTe DSL
    ``compress_norm_rope_store_op``: no keyword parsing), else :func:`_wrappers`' call of the
    module's operation."""
    return {operation: getattr(module, f"{operation}_op", wrapper)
            for operation, wrapper in _wrappers(module, cutedsl).items()}


def _wrappers(module, cutedsl: bool) -> dict:
    """Each op's call of the module's operation with the schema's arguments (the dispatcher may
    leave out trailing defaults: the module's own defaults then apply)."""
    save_extras = (("pdl",) if cutedsl else ()) + ("ape_at", "ring_capacity")  # SPEC §13
    compress_names = ("layout", "fp8_scale", "debug", *(("workspace", "c128_path", "pdl") if cutedsl else ()),
                      "hadamard", "ape", "ape_at", "ring_capacity")  # after compress_ratio

    def save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=False, *extras):
        module.save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                   **dict(zip(save_extras, extras)))

    def compress_norm_rope_store(*args):
        module.compress_norm_rope_store(*args[:11], compress_ratio=args[11], **dict(zip(compress_names, args[12:])))

    def compress_and_save(*args):
        names = ("layout", "fp8_scale", "ape_at", "ring_capacity", "hadamard", "debug")  # after compress_ratio
        module.compress_and_save(*args[:16], compress_ratio=args[16], **dict(zip(names, args[17:])))

    kernels = {"save_partial_states": save_partial_states, "compress_norm_rope_store": compress_norm_rope_store,
               "compress_and_save": compress_and_save}
    if not cutedsl:
        return kernels

    def save_and_compress_norm_rope_store(kv_score, ape, *args):
        # layout .. hadamard as in the schema, then SPEC §13's ape_at and ring_capacity
        defaults = trailing_defaults("save_and_compress_norm_rope_store", 14, cutedsl=True)
        (state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
         rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, debug, workspace,
         c128_path, pdl, hadamard, *formats) = tuple(args) + defaults[len(args) - 12:]
        module.save_and_compress_norm_rope_store(
            kv_score, ape, state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
            rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio,
            layout=layout, fp8_scale=fp8_scale, hadamard=hadamard, debug=debug, workspace=workspace,
            c128_path=c128_path, pdl=pdl, **dict(zip(("ape_at", "ring_capacity"), formats)))

    def compress(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, kv_slot_mapping,
                 compress_ratio, c128_path="auto", pdl=True):
        return module.compress(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                               kv_slot_mapping, compress_ratio=compress_ratio, c128_path=c128_path, pdl=pdl)

    kernels.update(save_and_compress_norm_rope_store=save_and_compress_norm_rope_store, compress=compress)
    return kernels


def _fake_nothing(*args, **kwargs) -> None:
    return None


def _fake_compress(state_cache, token_to_req_indices, positions, *args, **kwargs) -> torch.Tensor:
    return state_cache.new_empty((positions.shape[0], 512))  # fp32 [T, 512]


def op(prefix: str, operation: str):
    """The custom op ``torch.ops.dsv4_compressor.{prefix}_{operation}`` (what a public function
    calls while ``torch.compile`` traces it)."""
    return getattr(getattr(torch.ops, NAMESPACE), f"{prefix}_{operation}")


_compiling = torch.compiler.is_compiling  # True while torch.compile traces (Dynamo folds it)


def traced_as_op(prefix: str, operation: str, fixed: tuple = ()):
    """Decorate a public function whose parameters are its custom op's schema (names, order,
    keyword-only ones) so that, while ``torch.compile`` traces, the call is the op
    ``torch.ops.dsv4_compressor.{prefix}_{operation}`` on the same arguments; eagerly it is the
    function, after the one check. ``fixed``: ``(name, default, expected)`` of each keyword-only
    option the function has and the op does not take; it must keep ``default`` while tracing
    (:func:`refuse`; ``expected`` describes it, None: its repr). The undecorated function is
    ``__wrapped__`` (what the op's kernel calls)."""
    op_name = f"{prefix}_{operation}"

    def decorate(function):
        @functools.wraps(function)
        def public(*args, **kwargs):
            if _compiling():
                for name, default, expected in fixed:
                    if name in kwargs:
                        refuse(name, kwargs.pop(name), default, op_name, expected)
                return op(prefix, operation)(*args, **kwargs)
            return function(*args, **kwargs)

        return public

    return decorate


def refuse(name: str, given, default, operation: str, expected: str | None = None) -> None:
    """While ``torch.compile`` traces a public function: ``ValueError`` for an option its custom op
    cannot take (anything but ``default``; ``expected`` describes it, else its repr), naming the
    argument, what is expected and what was given."""
    if given is default or (default is not None and given == default):
        return
    raise ValueError(f"{name}: expected {expected or repr(default)} under torch.compile (the custom op "
                     f"{NAMESPACE}::{operation} takes no {name}), got {_described(given)}")


def _described(value) -> str:
    """A value for a message Dynamo can build while tracing: a constant's repr, else its type
    (a dataclass's or a tensor's repr cannot be traced)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return f"a {type(value).__name__}"


def registered_schemas(cutedsl: bool) -> dict:
    """``{operation: schema}`` as :func:`register` defines the ops (``cutedsl``: the CuTe DSL
    implementation's): the saves' ``ape`` optional, SPEC §13's options appended."""
    schemas = {**SCHEMAS, **(CUTEDSL_SCHEMAS if cutedsl else {})}
    schemas["save_partial_states"] = schemas["save_partial_states"].replace(
        "Tensor ape,", "Tensor? ape,").replace(") -> ()", _STATE_OPTIONS + ") -> ()")
    schemas["compress_norm_rope_store"] = schemas["compress_norm_rope_store"].replace(
        ") -> ()", _COMPRESS_STATE_OPTIONS + ") -> ()")
    if cutedsl:
        schemas["save_and_compress_norm_rope_store"] = schemas["save_and_compress_norm_rope_store"].replace(
            "Tensor ape,", "Tensor? ape,").replace(") -> ()", _STATE_OPTIONS + ") -> ()")
    schemas["compress_and_save"] = STATE_FORMAT_SCHEMAS["compress_and_save"]
    return schemas


@functools.cache
def trailing_defaults(operation: str, first: int, cutedsl: bool) -> tuple:
    """The schema defaults of ``operation``'s arguments from position ``first`` on (every one of
    them has one), as the dispatcher would fill in those it leaves out: what an op's kernel
    appends to the arguments it is given."""
    schema = torch._C.parse_schema(f"{NAMESPACE}::{operation}{registered_schemas(cutedsl)[operation]}")
    arguments = schema.arguments[first:]
    missing = [a.name for a in arguments if not a.has_default_value()]
    if missing:
        raise ValueError(f"first: expected a position after every argument without a default in {operation}'s "
                         f"schema, got {first} (no default: {', '.join(missing)})")
    return tuple(a.default_value for a in arguments)


def register(prefix: str, module, *, cutedsl: bool) -> dict:
    """Define ``{prefix}_save_partial_states``, ``{prefix}_compress_norm_rope_store``,
    ``{prefix}_compress_and_save`` (SPEC §13.4) and, for the CuTe DSL implementation (``cutedsl``:
    ``workspace``, ``c128_path`` and ``pdl`` arguments, the save's ``pdl`` last),
    ``{prefix}_save_and_compress_norm_rope_store`` and ``{prefix}_compress``, each calling
    ``module``'s operation of that name. The compress ops take ``layout`` (the indexer layouts
    too) and ``hadamard`` (SPEC §12). SPEC §13: the saves' ``ape`` is optional and every op that
    reads or writes the state takes ``ape_at`` and ``ring_capacity`` (the compress also ``ape``)
    after its other arguments; a state's dtype needs no argument. Returns ``{operation: op}``.

    Registers once per process: a second import of the package under another name (a test
    runner importing the repository root as a package) finds the ops already defined.
    """
    namespace = getattr(torch.ops, NAMESPACE)
    schemas = registered_schemas(cutedsl)
    if not hasattr(namespace, f"{prefix}_save_partial_states"):
        for operation, kernel in _kernels(module, cutedsl).items():
            name = f"{prefix}_{operation}"
            _LIBRARY.define(name + schemas[operation])
            _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", _fake_compress if operation == "compress"
                                        else _fake_nothing, lib=_LIBRARY)
    return {operation: getattr(namespace, f"{prefix}_{operation}") for operation in schemas}
