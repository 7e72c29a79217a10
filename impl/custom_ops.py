"""Register an implementation's public operations as torch custom ops (``torch.ops.dsv4_compressor.*``).

Each implementation calls :func:`register` with its module of operations and a name prefix
(``cutedsl``, ``triton``). The ops declare what they write (``mutates_args``) and have fake
implementations that write nothing and touch no data, so ``torch.compile(fullgraph=True)``
traces through them and CUDA graphs capture them; the SPEC §9 validation (which reads
``data_ptr`` and, with ``debug``, copies metadata to NumPy) runs inside the real
implementation, when the op executes, and raises the same ``ValueError``.

An op takes the implementation's default policy; the direct Python calls remain the
cheapest way to launch (an op adds the dispatcher's cost to every eager call).
"""

from __future__ import annotations

from typing import Optional

import torch

NAMESPACE = "dsv4_compressor"


def register(prefix: str, module, *, compress_extras: bool) -> dict:
    """Define ``{prefix}_save_partial_states``, ``{prefix}_compress_norm_rope_store`` and, with
    ``compress_extras`` (the CuTe DSL implementation), ``{prefix}_save_and_compress_norm_rope_store``
    and ``{prefix}_compress``, each calling ``module``'s operation of that name. Returns the ops.

    Registers once per process: a second import of the package under another name (a test
    runner importing the repository root as a package) finds the ops already defined.
    """
    namespace = getattr(torch.ops, NAMESPACE)
    names = ["save_partial_states", "compress_norm_rope_store"]
    names += ["save_and_compress_norm_rope_store", "compress"] if compress_extras else []
    if hasattr(namespace, f"{prefix}_save_partial_states"):
        return {name: getattr(namespace, f"{prefix}_{name}") for name in names}
    ops = {}

    @torch.library.custom_op(f"{NAMESPACE}::{prefix}_save_partial_states", mutates_args=("state_cache",))
    def save_partial_states(kv_score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
                            slot_mapping: torch.Tensor, state_cache: torch.Tensor, block_size: int,
                            debug: bool = False) -> None:
        module.save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug)

    @save_partial_states.register_fake
    def _(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=False) -> None:
        return None

    ops["save_partial_states"] = save_partial_states

    if compress_extras:
        @torch.library.custom_op(f"{NAMESPACE}::{prefix}_compress_norm_rope_store", mutates_args=("k_cache", "workspace"))
        def compress_norm_rope_store(
            state_cache: torch.Tensor, token_to_req_indices: torch.Tensor, positions: torch.Tensor,
            slot_mapping: torch.Tensor, block_table: torch.Tensor, block_size: int, rms_norm_weight: torch.Tensor,
            rms_norm_eps: float, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, kv_slot_mapping: torch.Tensor,
            compress_ratio: int, layout: str = "flashmla_fp8", fp8_scale: Optional[float] = None, debug: bool = False,
            workspace: Optional[torch.Tensor] = None, c128_path: str = "auto", pdl: bool = True,
        ) -> None:
            module.compress_norm_rope_store(
                state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
                rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
                fp8_scale=fp8_scale, debug=debug, workspace=workspace, c128_path=c128_path, pdl=pdl)
    else:
        @torch.library.custom_op(f"{NAMESPACE}::{prefix}_compress_norm_rope_store", mutates_args=("k_cache",))
        def compress_norm_rope_store(
            state_cache: torch.Tensor, token_to_req_indices: torch.Tensor, positions: torch.Tensor,
            slot_mapping: torch.Tensor, block_table: torch.Tensor, block_size: int, rms_norm_weight: torch.Tensor,
            rms_norm_eps: float, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, kv_slot_mapping: torch.Tensor,
            compress_ratio: int, layout: str = "flashmla_fp8", fp8_scale: Optional[float] = None, debug: bool = False,
        ) -> None:
            module.compress_norm_rope_store(
                state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
                rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
                fp8_scale=fp8_scale, debug=debug)

    @compress_norm_rope_store.register_fake
    def _(*args, **kwargs) -> None:
        return None

    ops["compress_norm_rope_store"] = compress_norm_rope_store
    if not compress_extras:
        return ops

    @torch.library.custom_op(f"{NAMESPACE}::{prefix}_save_and_compress_norm_rope_store",
                             mutates_args=("state_cache", "k_cache", "workspace"))
    def save_and_compress_norm_rope_store(
        kv_score: torch.Tensor, ape: torch.Tensor, state_cache: torch.Tensor, token_to_req_indices: torch.Tensor,
        positions: torch.Tensor, slot_mapping: torch.Tensor, block_table: torch.Tensor, block_size: int,
        rms_norm_weight: torch.Tensor, rms_norm_eps: float, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor,
        kv_slot_mapping: torch.Tensor, compress_ratio: int, layout: str = "flashmla_fp8",
        fp8_scale: Optional[float] = None, debug: bool = False, workspace: Optional[torch.Tensor] = None,
        c128_path: str = "auto", pdl: bool = True,
    ) -> None:
        module.save_and_compress_norm_rope_store(
            kv_score, ape, state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
            rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio,
            layout=layout, fp8_scale=fp8_scale, debug=debug, workspace=workspace, c128_path=c128_path, pdl=pdl)

    @save_and_compress_norm_rope_store.register_fake
    def _(*args, **kwargs) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::{prefix}_compress", mutates_args=())
    def compress(state_cache: torch.Tensor, token_to_req_indices: torch.Tensor, positions: torch.Tensor,
                 slot_mapping: torch.Tensor, block_table: torch.Tensor, block_size: int,
                 kv_slot_mapping: torch.Tensor, compress_ratio: int, c128_path: str = "auto",
                 pdl: bool = True) -> torch.Tensor:
        return module.compress(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                               kv_slot_mapping, compress_ratio=compress_ratio, c128_path=c128_path, pdl=pdl)

    @compress.register_fake
    def _(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, kv_slot_mapping,
          compress_ratio, c128_path="auto", pdl=True) -> torch.Tensor:
        return state_cache.new_empty((positions.shape[0], 512))  # fp32 [T, 512]

    ops["save_and_compress_norm_rope_store"] = save_and_compress_norm_rope_store
    ops["compress"] = compress
    return ops
