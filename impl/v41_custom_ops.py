"""DeepSeek-V4.1's operations (SPEC §14.7) as torch custom ops: ``torch.ops.dsv4_compressor.{prefix}_v41_*``.

As :mod:`.custom_ops` does for V4's: schemas that declare what each op writes (``Tensor(a!)``;
ratio 2's state is an optional mutated tensor, ``Tensor(a!)?``), one kernel for every device,
and fake implementations that write nothing, so ``torch.compile(fullgraph=True)`` traces
through them and CUDA graphs capture them. The §14.8 checks run inside the real
implementation, when the op executes, and raise the same ``ValueError``.

The arguments are the spec's, in its order, with the same keyword-only ones; ``ape`` is accepted
(as ``None``) so that a V4 call ported unchanged gets §14.8's error. A family may append
keyword-only options of its own (CuTe DSL's ``pdl``). The public functions, decorated with
:func:`.custom_ops.traced_as_op`, call these ops while ``torch.compile`` traces them; each op's
kernel is the undecorated function.
"""

from __future__ import annotations

import torch

from .custom_ops import NAMESPACE

_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")

_STATE = ("Tensor? token_to_req, Tensor? query_start_loc, Tensor? slot_mapping, Tensor? save_slot_mapping, "
          "Tensor? block_table, int? bs, Tensor(a!)? state_cache, Tensor rms_norm_weight, float rms_norm_eps")
SCHEMAS = {
    "v41_compress_norm": (
        f"(Tensor kv, Tensor? score, Tensor positions, {_STATE}, Tensor kv_slot_mapping, Tensor(b!) latent, *, "
        "int compress_ratio, int? ring_capacity=None, Tensor? ape=None, bool debug=False) -> ()"),
    "v41_rope_quant_store": (
        "(Tensor latent, Tensor positions, Tensor kv_slot_mapping, Tensor cos_sin_cache, Tensor(a!) k_cache, *, "
        "int compress_ratio, str layout, float? fp8_scale=None, bool debug=False) -> ()"),
    "v41_compress_norm_rope_store": (
        f"(Tensor kv, Tensor? score, Tensor positions, {_STATE}, Tensor cos_sin_cache, Tensor(b!) k_cache, "
        "Tensor kv_slot_mapping, Tensor(c!)? latent, *, int compress_ratio, str layout, int? ring_capacity=None, "
        "float? fp8_scale=None, Tensor? ape=None, bool debug=False) -> ()"),
    "v41_index_key_store": (
        "(Tensor k_pre, Tensor positions, Tensor kv_slot_mapping, Tensor rms_norm_weight, float rms_norm_eps, "
        "Tensor cos_sin_cache, Tensor(a!) k_cache, *, int compress_ratio, str layout, bool debug=False) -> ()"),
}


def _fake_nothing(*args, **kwargs) -> None:
    return None


def register_v41(prefix: str, module, options: str = "") -> dict:
    """Define ``{prefix}_v41_compress_norm``, ``{prefix}_v41_rope_quant_store``,
    ``{prefix}_v41_compress_norm_rope_store`` and ``{prefix}_v41_index_key_store``, each calling
    ``module``'s function of the operation's name (undecorated) with the op's arguments;
    ``options``: schema text of the family's keyword-only options, appended to each (e.g.
    ``", bool pdl=True"``). Returns ``{operation: op}``.

    Registers once per process (a second import of the package under another name finds the ops defined).
    """
    namespace = getattr(torch.ops, NAMESPACE)
    if not hasattr(namespace, f"{prefix}_v41_compress_norm"):
        for operation, schema in SCHEMAS.items():
            name = f"{prefix}_{operation}"
            _LIBRARY.define(name + schema.replace(") -> ()", options + ") -> ()"))
            function = getattr(module, operation)
            _LIBRARY.impl(name, getattr(function, "__wrapped__", function), "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", _fake_nothing, lib=_LIBRARY)
    return {operation: getattr(namespace, f"{prefix}_{operation}") for operation in SCHEMAS}
