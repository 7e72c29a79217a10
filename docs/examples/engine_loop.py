"""A small engine loop around the kernels, checked against the spec after every step.

What an engine does with the compressor, in miniature (docs/engine.md walks through it):

1. allocate the state cache (fp32 rows, in blocks of ``bs`` rows) and the compressed cache
   (FlashMLA fp8 pages of ``B`` entries) once;
2. each step, schedule tokens (prefill chunks, then one decode token per request), grow each
   request's block lists, and build the step's metadata: ``positions``,
   ``token_to_req_indices``, the state ``slot_mapping``, the ``block_table`` and the
   compressed-cache ``kv_slot_mapping`` (a slot only for the token that closes a window),
   padded to a fixed number of tokens as for a captured CUDA graph (the free lists and the
   slot rules are ``dsv4_compressor.conformance.engine``'s, which the soak shares);
3. call ``save_partial_states`` and then ``compress_norm_rope_store``.

Here every step also runs the NumPy spec on mirrors of both caches and compares every byte.

Run: ``python -m dsv4_compressor.docs.examples.engine_loop [--backend triton|cutedsl]
[--ratio 4|128] [--steps N]``. Without a CUDA GPU the Triton kernels run under Triton's
interpreter (``TRITON_INTERPRET=1`` is set here before Triton is imported).

SPEC §13's state formats (either ``--backend``): ``--state-format ring`` keeps each request's state in a ring
of ``C`` rows and makes the step call ``compress_and_save`` with each chunk's tail as the saves;
``--state-dtype bf16`` keeps a bf16 state; ``--ape-at compress`` stores raw scores and adds
``ape`` while pooling. Any combination runs (:func:`run_state_format`), checked the same way.
``--model v4.1`` runs DeepSeek-V4.1's compressor layers (ratios 2 and 1, vLLM's ring state,
prefill chunks, decode and speculative verify groups) through vLLM's V4.1 entry points on the
Triton kernels instead: see :mod:`.engine_loop_v41` (``--backend`` and ``--ratio`` do not apply).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from dsv4_compressor import spec
from dsv4_compressor.conformance.engine import BlockPool, Geometry, step_metadata
from dsv4_compressor.spec.batch import random_norm_weight, rope_cos_sin_cache, tail_saves
from dsv4_compressor.spec.constants import ENTRY_BYTES, ratio_config

@dataclass
class Request:
    """One sequence: its prompt, how many tokens it decodes, and the blocks it owns."""

    prompt_len: int
    decode_len: int
    computed: int = 0  # positions 0 .. computed-1 are saved
    state_blocks: list[int] = field(default_factory=list)  # state block of rows [i*bs, (i+1)*bs)
    pages: list[int] = field(default_factory=list)  # compressed-cache page of entries [i*B, (i+1)*B)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.decode_len


@dataclass(frozen=True)
class EngineConfig:
    compress_ratio: int = 4  # r: C4 or C128
    block_size: int = 4  # bs: state rows per block
    entries_per_page: int = 16  # B: compressed entries per page
    chunk: int = 24  # prefill tokens per request per step
    padded_tokens: int = 64  # every step is padded to this many tokens (a CUDA graph's size)
    state_blocks: int = 512
    pages: int = 64


def schedule(requests: list[Request], config: EngineConfig) -> list[tuple[int, int, int]]:
    """This step's tokens as ``(request index, first position, count)``: a prefill chunk or one decode token."""
    plan = []
    for index, request in enumerate(requests):
        if request.computed >= request.total_len:
            continue
        if request.computed < request.prompt_len:
            count = min(config.chunk, request.prompt_len - request.computed)
        else:
            count = 1
        plan.append((index, request.computed, count))
    return plan


def build_step(requests, plan, config: EngineConfig, state_pool: BlockPool, page_pool: BlockPool,
               ring_capacity: int | None = None) -> dict[str, np.ndarray]:
    """The step's metadata as NumPy arrays (vLLM's names and dtypes), blocks allocated on demand
    and the step padded to ``config.padded_tokens`` tokens of slot -1.

    For each token at position ``p`` of a request: ``slot_mapping`` is the state row
    ``state_blocks[p // bs] * bs + p % bs``; a token that closes a window (``(p + 1) % r == 0``)
    gets the slot of entry ``p // r`` on the request's pages as its ``kv_slot_mapping``, every
    other token -1 (``dsv4_compressor.conformance.engine.step_metadata`` applies these rules).
    With ``ring_capacity`` ``C`` (SPEC §13.3) the state row is ``p mod C`` instead, and the block
    table is at least ``C / bs`` blocks wide.
    """
    geometry = Geometry(config.compress_ratio, config.block_size, config.entries_per_page, ring_capacity)
    if sum(count for _, _, count in plan) > config.padded_tokens:
        raise RuntimeError("more tokens than padded_tokens: raise --padded-tokens")
    columns = None if ring_capacity is None else (len(requests), ring_capacity // config.block_size)
    batch = step_metadata(plan, requests, geometry, state_pool, page_pool, padded_tokens=config.padded_tokens,
                          table_shape=columns)
    for index, first, count in plan:
        requests[index].computed = first + count
    return {name: getattr(batch, name) for name in
            ("positions", "token_to_req_indices", "slot_mapping", "block_table", "kv_slot_mapping")}


def load_backend(name: str):
    """``dsv4_compressor.impl.triton`` or ``.cutedsl``, and the torch device their tensors live on."""
    import torch

    if name == "triton" and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first import of Triton
    if name == "triton":
        from dsv4_compressor.impl import triton as backend
    else:
        from dsv4_compressor.impl import cutedsl as backend
    device = backend.SUPPORTED_DEVICES[0]
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"the {name} kernels need a CUDA GPU (none found); try --backend triton")
    return backend, device


def allocate_caches(config: EngineConfig, device, bf16_state: bool = False) -> tuple:
    """The state cache and the compressed cache, zeroed, allocated once: NumPy mirrors for the spec
    (a bf16 state as uint16 bit patterns), then their torch twins on ``device`` for the kernels."""
    import torch

    width = ratio_config(config.compress_ratio).state_row_width  # 2*SW: kv then score
    state_np = np.zeros((config.state_blocks, config.block_size, width), dtype=np.uint16 if bf16_state else np.float32)
    k_cache_np = np.zeros((config.pages, config.entries_per_page, ENTRY_BYTES), dtype=np.uint8)
    state_cache = torch.from_numpy(state_np.copy()).to(device)  # fp32 or bf16 [blocks, bs, 2*SW]
    if bf16_state:
        state_cache = state_cache.view(torch.bfloat16)
    k_cache = torch.from_numpy(k_cache_np.copy()).to(device)  # uint8 [pages, B, 584]
    return (state_np, k_cache_np), (state_cache, k_cache)


def scheduled_steps(requests: list[Request], config: EngineConfig, steps: int, rng: np.random.Generator):
    """The loop's steps, at most ``steps`` and none once every request is done: ``(step, plan,
    state_pool, page_pool)``, the block pools made once before the first."""
    state_pool, page_pool = BlockPool(config.state_blocks, rng), BlockPool(config.pages, rng)
    for step in range(steps):
        plan = schedule(requests, config)
        if not plan:
            return
        yield step, plan, state_pool, page_pool


def layer_constants(config: EngineConfig, requests: list[Request], rng: np.random.Generator, device) -> tuple:
    """The layer's fixed inputs, drawn once: ``(ape, rms_norm_weight, rms_norm_eps, cos_sin_cache)``
    as NumPy arrays for the spec, then as torch tensors on ``device`` for the kernels."""
    import torch

    r = config.compress_ratio
    width = ratio_config(r).state_row_width  # 2*SW: kv then score
    ape = (rng.standard_normal((r, width // 2)) * 0.5).astype(np.float32)  # fp32 [r, SW]
    weight = random_norm_weight(rng, bf16=True)  # bf16 as uint16 bit patterns [512]
    cos_sin = rope_cos_sin_cache(max(q.total_len for q in requests) + r)  # fp32 [max_pos, 64]
    kernel = (torch.from_numpy(ape).to(device), torch.from_numpy(weight.view(np.int16)).view(torch.bfloat16).to(device),
              1e-6, torch.from_numpy(cos_sin).to(device))
    return (ape, weight, 1e-6, cos_sin), kernel


def check_caches(step: int, device, caches: tuple, mirrors: tuple) -> None:
    """After a step's calls: the kernels' ``(state_cache, k_cache)`` against the spec's NumPy mirrors,
    every byte (``AssertionError`` naming the cache and the first differing byte)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    for name, mine, expected in zip(("state_cache", "k_cache"), caches, mirrors):
        differ = np.flatnonzero(_cache_bytes(mine) != expected.view(np.uint8))
        if differ.size:
            raise AssertionError(f"step {step}: {name} differs from the spec in {differ.size} bytes (first: byte {differ[0]})")


def run(config: EngineConfig, requests: list[Request], backend_name: str, steps: int, seed: int = 0, log=print) -> int:
    """Run the loop; returns the number of compressed entries written (all checked against the spec)."""
    import torch

    backend, device = load_backend(backend_name)
    rng = np.random.default_rng(seed)
    r = config.compress_ratio
    width = ratio_config(r).state_row_width  # 2*SW: kv then score
    bs = config.block_size

    # 1. buffers, allocated once: NumPy mirrors for the spec, torch tensors for the kernels
    (state_np, k_cache_np), (state_cache, k_cache) = allocate_caches(config, device)
    (ape_np, weight_np, eps, cos_sin_np), (ape, weight, _, cos_sin) = layer_constants(config, requests, rng, device)

    written = 0
    for step, plan, state_pool, page_pool in scheduled_steps(requests, config, steps, rng):
        # 2. this step's metadata
        meta = build_step(requests, plan, config, state_pool, page_pool)
        kv_score_np = rng.standard_normal((config.padded_tokens, width)).astype(np.float32)  # the projection's output
        t = {name: torch.from_numpy(array).to(device) for name, array in meta.items()}
        kv_score = torch.from_numpy(kv_score_np).to(device)

        # 3. the two calls, as an engine makes them
        backend.save_partial_states(kv_score, ape, t["positions"], t["slot_mapping"], state_cache, bs)
        backend.compress_norm_rope_store(
            state_cache, t["token_to_req_indices"], t["positions"], t["slot_mapping"], t["block_table"], bs,
            weight, eps, cos_sin, k_cache, t["kv_slot_mapping"], compress_ratio=r,
        )

        # the spec on the mirrors, then every byte compared
        spec.save_partial_states(kv_score_np, ape_np, meta["positions"], meta["slot_mapping"], state_np, bs)
        spec.compress_norm_rope_store(
            state_np, meta["token_to_req_indices"], meta["positions"], meta["slot_mapping"], meta["block_table"], bs,
            weight_np, eps, cos_sin_np, k_cache_np, meta["kv_slot_mapping"], compress_ratio=r,
        )
        check_caches(step, device, (state_cache, k_cache), (state_np, k_cache_np))
        entries = int((meta["kv_slot_mapping"] >= 0).sum())
        written += entries
        tokens = sum(count for _, _, count in plan)
        log(f"step {step}: {tokens:3d} tokens (+{config.padded_tokens - tokens} padding), "
            f"{entries} {'entry' if entries == 1 else 'entries'} written, state and compressed cache identical to the spec")
    return written


def default_requests(compress_ratio: int) -> list[Request]:
    if compress_ratio == 4:
        return [Request(prompt_len=37, decode_len=6), Request(prompt_len=5, decode_len=9), Request(prompt_len=16, decode_len=3)]
    return [Request(prompt_len=200, decode_len=2), Request(prompt_len=126, decode_len=4)]


def default_config(compress_ratio: int) -> EngineConfig:
    if compress_ratio == 4:
        return EngineConfig()
    return EngineConfig(compress_ratio=128, block_size=8, chunk=128, padded_tokens=256, state_blocks=128, pages=8)


# ---- SPEC §13's state formats: a bf16 state, ape added at the compress, a ring with tail saves ----
@dataclass(frozen=True)
class StateOptions:
    """How the engine keeps the compressor state (SPEC §13); the defaults are today's paged fp32 state."""

    addressing: str = "paged"  # "paged", or "ring": C rows per request, saved by the step call's tail
    dtype: str = "fp32"  # "fp32" or "bf16" (SPEC §13.1)
    ape_at: str = "save"  # "save" or "compress" (SPEC §13.2)
    ring_capacity: int | None = None  # C for "ring" (default: default_ring_capacity(r))

    @property
    def is_default(self) -> bool:
        return self.addressing == "paged" and self.dtype == "fp32" and self.ape_at == "save"


def default_ring_capacity(compress_ratio: int) -> int:
    """A ring that prefill chunks overrun: 12 rows for C4 (its windows cross the ring's end), 256 for
    C128 (vLLM's ring with speculative tokens)."""
    return 12 if compress_ratio == 4 else 256


def add_state_format_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-format", choices=("paged", "ring"), default="paged",
                        help="SPEC §13.3: a paged state (the two calls), or a ring of C rows per request "
                             "(compress_and_save with the tail saves)")
    parser.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32", help="SPEC §13.1: the state's dtype")
    parser.add_argument("--ape-at", choices=("save", "compress"), default="save",
                        help="SPEC §13.2: where ape is added to the scores")
    parser.add_argument("--ring-capacity", type=int, default=None, help="C, the ring's rows (default: 12 for C4, 256 for C128)")


def state_options(args: argparse.Namespace) -> StateOptions:
    return StateOptions(addressing=args.state_format, dtype=args.state_dtype, ape_at=args.ape_at,
                        ring_capacity=args.ring_capacity)


def ring_step_metadata(requests, plan, config: EngineConfig, state: StateOptions, state_pool: BlockPool,
                       page_pool: BlockPool) -> dict[str, np.ndarray]:
    """:func:`build_step`'s metadata with the state's addressing: for a ring, each token's ring slot
    (row ``p mod C`` of the request's ring, its blocks taken as rows are first reached) and a block
    table of at least ``C / bs`` columns; plus what ``compress_and_save`` takes, ``query_start_loc``
    (a block-table row's chunk; tokens are packed in row order, then padding) and
    ``save_slot_mapping`` (a ring: the last ``C`` tokens of each chunk; paged: every token)."""
    capacity = capacity_of(state, config)
    meta = build_step(requests, plan, config, state_pool, page_pool, ring_capacity=capacity)
    counts = np.zeros(len(requests), dtype=np.int64)
    for index, _, count in plan:
        counts[index] = count
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    saves = meta["slot_mapping"] if capacity is None else tail_saves(meta["slot_mapping"], starts, capacity)
    return {**meta, "query_start_loc": starts, "save_slot_mapping": saves}


def capacity_of(state: StateOptions, config: EngineConfig) -> int | None:
    if state.addressing == "paged":
        return None
    return state.ring_capacity or default_ring_capacity(config.compress_ratio)


def state_format_step(module, arrays: dict, caches: tuple, constants: tuple, state: StateOptions,
                      config: EngineConfig) -> None:
    """One layer step in ``state``'s format through ``module`` (either family's kernels on torch
    tensors, or the NumPy spec on arrays): paged, the save then the compress; a ring, ``compress_and_save``.
    ``arrays``: the step's metadata and ``kv_score`` [T, 2*SW]; ``caches``: (state_cache, k_cache);
    ``constants``: (ape [r, SW], rms_norm_weight [512], eps, cos_sin_cache [max_pos, 64])."""
    state_cache, k_cache = caches
    ape, weight, eps, cos_sin = constants
    a, r, bs = arrays, config.compress_ratio, config.block_size
    capacity = capacity_of(state, config)
    sw = a["kv_score"].shape[1] // 2
    if capacity is None:
        module.save_partial_states(a["kv_score"], ape, a["positions"], a["slot_mapping"], state_cache, bs, ape_at=state.ape_at)
        module.compress_norm_rope_store(state_cache, a["token_to_req_indices"], a["positions"], a["slot_mapping"],
                                        a["block_table"], bs, weight, eps, cos_sin, k_cache, a["kv_slot_mapping"],
                                        compress_ratio=r, ape=ape, ape_at=state.ape_at)
        return
    module.compress_and_save(a["kv_score"][:, :sw], a["kv_score"][:, sw:], ape, a["positions"], a["token_to_req_indices"],
                             a["query_start_loc"], a["slot_mapping"], a["save_slot_mapping"], a["block_table"], bs,
                             state_cache, weight, eps, cos_sin, k_cache, a["kv_slot_mapping"], compress_ratio=r,
                             ape_at=state.ape_at, ring_capacity=capacity)


def _cache_bytes(tensor) -> np.ndarray:  # tensor: a torch cache of any dtype (fp32, bf16 or uint8)
    """The bytes of a torch cache (a bf16 state through its int16 view)."""
    import torch

    tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().view(np.uint8)


def run_state_format(config: EngineConfig, requests: list[Request], backend_name: str, steps: int, state: StateOptions,
                     seed: int = 0, log=print) -> int:
    """:func:`run` in one of SPEC §13's state formats (paged: the two calls; a ring: the step call
    ``compress_and_save``) on either family's kernels; returns the number of compressed entries
    written, every step's state and compressed cache compared with the spec's byte for byte."""
    import torch

    backend, device = load_backend(backend_name)
    rng = np.random.default_rng(seed)
    width = ratio_config(config.compress_ratio).state_row_width  # 2*SW: kv then score
    capacity = capacity_of(state, config)

    (state_np, k_cache_np), (state_cache, k_cache) = allocate_caches(config, device, bf16_state=state.dtype == "bf16")
    spec_constants, kernel_constants = layer_constants(config, requests, rng, device)

    written = 0
    for step, plan, state_pool, page_pool in scheduled_steps(requests, config, steps, rng):
        meta = ring_step_metadata(requests, plan, config, state, state_pool, page_pool)
        meta["kv_score"] = rng.standard_normal((config.padded_tokens, width)).astype(np.float32)
        tensors = {name: torch.from_numpy(array).to(device) for name, array in meta.items()}
        state_format_step(backend, tensors, (state_cache, k_cache), kernel_constants, state, config)
        state_format_step(spec, meta, (state_np, k_cache_np), spec_constants, state, config)
        check_caches(step, device, (state_cache, k_cache), (state_np, k_cache_np))
        entries = int((meta["kv_slot_mapping"] >= 0).sum())
        written += entries
        tokens = sum(count for _, _, count in plan)
        saved = int((meta["save_slot_mapping"] >= 0).sum())
        where = "paged" if capacity is None else f"ring of {capacity}, {saved} tail rows saved"
        log(f"step {step}: {tokens:3d} tokens (+{config.padded_tokens - tokens} padding), "
            f"{entries} {'entry' if entries == 1 else 'entries'} written ({where}, {state.dtype} state, ape at "
            f"{state.ape_at}), state and compressed cache identical to the spec")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("triton", "cutedsl"), default="triton")
    parser.add_argument("--ratio", type=int, choices=(4, 128), default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=("v4", "v4.1"), default="v4")
    add_state_format_arguments(parser)
    args = parser.parse_args(argv)
    if args.model == "v4.1":
        return main_v41(args.steps, args.seed)
    state = state_options(args)
    if not state.is_default:
        written = run_state_format(default_config(args.ratio), default_requests(args.ratio), args.backend, args.steps,
                                   state, args.seed)
        print(f"{written} compressed entries written, every byte as the spec says")
        return 0
    written = run(default_config(args.ratio), default_requests(args.ratio), args.backend, args.steps, args.seed)
    print(f"{written} compressed entries written, every byte as the spec says")
    return 0


# ---- --model v4.1 ------------------------------------------------------------------------------------
def main_v41(steps: int, seed: int) -> int:
    """DeepSeek-V4.1's layers through vLLM's V4.1 entry points (:mod:`.engine_loop_v41`)."""
    from dsv4_compressor.docs.examples import engine_loop_v41 as v41

    written = v41.run_v41(v41.V41EngineConfig(), v41.default_v41_requests(), steps, seed)
    print(", ".join(f"{n} entries of the ratio-{r} layer" for r, n in written.items())
          + " written, every byte as the spec says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
