"""The engine example for DeepSeek-V4.1 (``engine_loop.py --model v4.1``): vLLM's compressor calls
on this project's kernels, checked against the spec after every step.

What vLLM's V4.1 compressor layers do with the kernels, in miniature (docs/engine.md, "DeepSeek-V4.1"):

1. allocate, once, per layer: a ratio-2 layer's ring state (one block of ``C`` fp32 rows per
   request, ``C = max(8, 2^ceil(log2(S + 2)))`` for ``S`` drafts; block 0 is the null block),
   its compressed cache and its indexer cache; a ratio-1 layer's compressed cache (it keeps no state);
2. each step, schedule tokens (prefill chunks longer than the ring, then decode tokens and
   speculative verify groups of ``S + 1`` tokens, of which a random number of drafts is accepted:
   the rows of rejected drafts are overwritten later) and build vLLM's metadata: ``positions``,
   ``query_start_loc``, ``token_to_req_indices``, the ring ``slot_mapping`` (``block * C + p % C``)
   and each layer's compressed-cache slots (a slot for each group's last token), padded to a fixed
   number of tokens as for a captured CUDA graph;
3. call :mod:`dsv4_compressor.integrations.vllm_v41` as vLLM's layer does: on even steps
   ``fused_save_compress_norm`` then ``rope_quant_insert`` (vLLM's pair), on odd steps
   ``fused_save_compress_norm_rope_quant_insert`` (one launch); the ratio-2 layer then stores its
   index key from ``k_pre = wk(latent)`` with ``indexer_k_norm_rope_store``.

Every step also runs the NumPy spec (SPEC §14.7's calls, with the block table and tail saves
of SPEC §13.4) on mirrors of every buffer and compares every byte of the rings and caches and
the latent rows the step wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from dsv4_compressor import spec
from dsv4_compressor.conformance.engine import BlockPool, entry_slot
from dsv4_compressor.spec.batch import canary_k_cache, random_norm_weight, rope_cos_sin_cache, tail_saves
from dsv4_compressor.spec.v41_batch import bf16_patterns, vllm_ring

LAYER_RATIOS = (2, 1)  # the two kinds of V4.1 compressor layer
NULL_BLOCK = 0  # vLLM's ring block of requests without one
EPS = 1e-6


@dataclass
class V41Request:
    """One sequence: its prompt, how many tokens it decodes, and the blocks it owns."""

    prompt_len: int
    decode_len: int
    computed: int = 0  # positions 0 .. computed-1 are accepted
    ring_block: int = NULL_BLOCK  # the ratio-2 layer's ring block
    pages: dict[int, list[int]] = field(default_factory=dict)  # ratio -> compressed-cache pages (entries [i*B, (i+1)*B))

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.decode_len


@dataclass(frozen=True)
class V41EngineConfig:
    num_speculative: int = 3  # S: drafts per verify group
    entries_per_page: int = 8  # B
    chunk: int = 19  # prefill tokens per request per step: more than the ring's C = 8, and odd (chunks from odd positions)
    padded_tokens: int = 48  # every step is padded to this many tokens (a CUDA graph's size)
    ring_blocks: int = 8  # ring blocks, block 0 the null block
    pages: int = 32  # compressed-cache pages per layer
    record: str = "flashmla_fp8"  # the compressed cache's record (SPEC §14.5)
    index_layout: str = "indexer_mxfp4"  # the ratio-2 layer's index key (SPEC §14.6)


@dataclass(frozen=True)
class V41Step:
    """One step's metadata with vLLM's names, as NumPy arrays of ``padded_tokens`` entries."""

    positions: np.ndarray  # int64 [P]
    token_to_req_indices: np.ndarray  # int32 [P]
    query_start_loc: np.ndarray  # int32 [num_reqs + 1]
    slot_mapping: np.ndarray  # int64 [P]: ring slots block*C + p % C, -1 = padding
    kv_slot_mapping: dict[int, np.ndarray]  # ratio -> int64 [P]: compressed-cache slots of group ends, -1 = none
    ring_blocks: np.ndarray  # int32 [num_reqs, 1]: SPEC §13.3's block table of the ring
    accepted: list[int]  # tokens each scheduled request keeps


def v41_schedule(requests: list[V41Request], config: V41EngineConfig, step: int,
                 rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """``(request index, first position, count, kept)``: a prefill chunk (all kept); after the
    prompt, on even steps one decode token, on odd steps a verify group of up to ``S + 1``
    tokens of which the last token and a random number of drafts are kept."""
    plan = []
    for index, request in enumerate(requests):
        left = request.total_len - request.computed
        if left <= 0:
            continue
        if request.computed < request.prompt_len:
            count = min(config.chunk, request.prompt_len - request.computed)
            plan.append((index, request.computed, count, count))
        elif step % 2 == 0 or left == 1:
            plan.append((index, request.computed, 1, 1))
        else:
            count = min(config.num_speculative + 1, left)
            plan.append((index, request.computed, count, 1 + int(rng.integers(0, count))))
    return plan


def _page_slot(request: V41Request, ratio: int, entry: int, config: V41EngineConfig, pool: BlockPool) -> int:
    """The slot of the ratio-``ratio`` layer's entry ``entry`` (its page taken when first reached)."""
    layer_pages = SimpleNamespace(pages=request.pages.setdefault(ratio, []))  # the request's list, grown in place
    return entry_slot(layer_pages, entry, config.entries_per_page, pool)


def v41_build_step(requests: list[V41Request], plan, config: V41EngineConfig, ring_pool: BlockPool,
                   page_pools: dict[int, BlockPool]) -> V41Step:
    """vLLM's metadata of ``plan``, ring blocks and pages taken on demand, padded with slot -1 tokens."""
    capacity = vllm_ring(config.num_speculative).ring_capacity
    padded = config.padded_tokens
    if sum(count for _, _, count, _ in plan) > padded:
        raise RuntimeError("more tokens than padded_tokens")
    positions, token_to_req = np.zeros(padded, np.int64), np.zeros(padded, np.int32)
    slots = np.full(padded, -1, np.int64)
    kv_slots = {ratio: np.full(padded, -1, np.int64) for ratio in LAYER_RATIOS}
    starts, blocks, t = [0], [], 0
    for req, (index, first, count, _) in enumerate(plan):
        request = requests[index]
        if request.ring_block == NULL_BLOCK:
            request.ring_block = ring_pool.take()
        for p in range(first, first + count):
            positions[t], token_to_req[t] = p, req
            slots[t] = request.ring_block * capacity + p % capacity
            for ratio in LAYER_RATIOS:
                if (p + 1) % ratio == 0:
                    kv_slots[ratio][t] = _page_slot(request, ratio, p // ratio, config, page_pools[ratio])
            t += 1
        starts.append(t)
        blocks.append([request.ring_block])
    return V41Step(positions=positions, token_to_req_indices=token_to_req, query_start_loc=np.array(starts, np.int32),
                   slot_mapping=slots, kv_slot_mapping=kv_slots, ring_blocks=np.array(blocks, np.int32).reshape(-1, 1),
                   accepted=[kept for _, _, _, kept in plan])


@dataclass
class V41Layer:
    """One compressor layer's buffers: torch tensors for the kernels, NumPy mirrors for the spec."""

    ratio: int
    weight: np.ndarray  # uint16 bf16 patterns [512]
    k_cache_np: np.ndarray
    k_cache: object  # torch tensor twin
    state_np: np.ndarray | None = None  # ratio 2: float32 [ring_blocks, C, 1024]
    state: object = None
    index_np: np.ndarray | None = None  # ratio 2: the indexer cache
    index: object = None


def _torch(array: np.ndarray, device):
    import torch

    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(array.copy()).to(device)


def _layers(config: V41EngineConfig, rng: np.random.Generator, device) -> list[V41Layer]:
    capacity = vllm_ring(config.num_speculative).ring_capacity
    layers = []
    for ratio in LAYER_RATIOS:
        k_cache_np = canary_k_cache(config.record, config.pages, config.entries_per_page)
        layer = V41Layer(ratio=ratio, weight=random_norm_weight(rng, bf16=True), k_cache_np=k_cache_np,
                         k_cache=_torch(k_cache_np, device))
        if ratio == 2:
            layer.state_np = np.zeros((config.ring_blocks, capacity, 1024), np.float32)
            layer.state = _torch(layer.state_np, device)
            layer.index_np = canary_k_cache(config.index_layout, config.pages, config.entries_per_page)
            layer.index = _torch(layer.index_np, device)
        layers.append(layer)
    return layers


def _run_layer(layer: V41Layer, kv_score_np: np.ndarray, fused: bool, shared: dict, config: V41EngineConfig):
    """vLLM's calls for one layer (the pair or the fused entry, then the index key); returns the latent."""
    import torch

    from dsv4_compressor.integrations import vllm_v41

    t, r, device = shared["tensors"], layer.ratio, shared["device"]
    kv_score, weight = _torch(kv_score_np, device), _torch(layer.weight, device)
    slots = t["slot_mapping"] if r == 2 else t[f"kv_slot_mapping_{r}"]  # ratio 1: vLLM passes the cache's slots
    qsl, token_to_req = (t["query_start_loc"], t["token_to_req_indices"]) if r == 2 else (None, None)
    latent = torch.empty((config.padded_tokens, 512), dtype=torch.bfloat16, device=device)
    if fused:
        vllm_v41.fused_save_compress_norm_rope_quant_insert(
            kv_score, t["positions"], layer.state, slots, qsl, token_to_req, weight, EPS, r, shared["cos_sin"],
            layer.k_cache, t[f"kv_slot_mapping_{r}"], latent_out=latent)
    else:
        vllm_v41.fused_save_compress_norm(kv_score, t["positions"], layer.state, slots, qsl, token_to_req, weight, EPS, r,
                                          latent)
        vllm_v41.rope_quant_insert(latent, t["positions"], shared["cos_sin"], layer.k_cache, t[f"kv_slot_mapping_{r}"], r)
    k_pre = None
    if layer.index is not None:
        k_pre = (latent.float() @ shared["wk"]).bfloat16()  # wk(latent): the indexer's projection (in torch, as vLLM)
        vllm_v41.indexer_k_norm_rope_store(k_pre, t["positions"], shared["cos_sin"], shared["index_weight"], EPS,
                                           layer.index, t[f"kv_slot_mapping_{r}"], r,
                                           use_fp4_cache=config.index_layout == "indexer_mxfp4")
    return latent, k_pre


def _spec_layer(layer: V41Layer, meta: V41Step, kv_score_np: np.ndarray, k_pre_np, shared: dict,
                config: V41EngineConfig) -> np.ndarray:
    """SPEC §14.7 on the mirrors: the combined call with the ring's block table and tail saves; returns the latent."""
    r, capacity = layer.ratio, vllm_ring(config.num_speculative).ring_capacity
    kv_slots = meta.kv_slot_mapping[r]
    latent = np.zeros((config.padded_tokens, 512), np.uint16)
    if r == 2:
        state = dict(token_to_req=meta.token_to_req_indices, query_start_loc=meta.query_start_loc,
                     slot_mapping=meta.slot_mapping, save_slot_mapping=tail_saves(meta.slot_mapping, meta.query_start_loc, capacity),
                     block_table=meta.ring_blocks, bs=capacity, state_cache=layer.state_np, ring_capacity=capacity)
    else:  # ratio 1 keeps no state
        state = dict.fromkeys(("token_to_req", "query_start_loc", "slot_mapping", "save_slot_mapping", "block_table", "bs",
                               "state_cache"))
    spec.v41_compress_norm_rope_store(
        kv_score_np[:, :512], kv_score_np[:, 512:] if r == 2 else None, meta.positions, **state,
        rms_norm_weight=layer.weight, rms_norm_eps=EPS, cos_sin_cache=shared["cos_sin_np"], k_cache=layer.k_cache_np,
        kv_slot_mapping=kv_slots, latent=latent, compress_ratio=r, layout=config.record)
    if layer.index_np is not None:
        spec.v41_index_key_store(k_pre_np, meta.positions, kv_slots, shared["index_weight_np"], EPS, shared["cos_sin_np"],
                                 layer.index_np, compress_ratio=r, layout=config.index_layout)
    return latent


def _bytes(tensor) -> np.ndarray:
    import torch

    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy()


def _compare(step: int, layer: V41Layer, latent, latent_np: np.ndarray, meta: V41Step) -> None:
    """Every byte of the layer's buffers, and the latent rows of the tokens that wrote an entry."""
    written = meta.kv_slot_mapping[layer.ratio] >= 0
    pairs = [("latent rows", _bytes(latent).reshape(len(written), -1)[written], latent_np[written]),
             ("k_cache", _bytes(layer.k_cache), layer.k_cache_np), ("ring state", layer.state, layer.state_np),
             ("indexer cache", layer.index, layer.index_np)]
    for name, mine, expected in pairs:
        if expected is None:
            continue
        mine = mine if isinstance(mine, np.ndarray) else _bytes(mine)
        differ = np.flatnonzero(mine.reshape(-1) != expected.view(np.uint8).reshape(-1))
        if differ.size:
            raise AssertionError(f"step {step}, ratio-{layer.ratio} layer: {name} differs from the spec in {differ.size} "
                                 f"bytes (first: byte {differ[0]})")


def run_v41(config: V41EngineConfig, requests: list[V41Request], steps: int, seed: int = 0, log=print) -> dict[int, int]:
    """Run the loop; returns, per layer ratio, the number of distinct compressed entries written
    (every byte checked against the spec after every step)."""
    import torch

    from dsv4_compressor.docs.examples.engine_loop import load_backend

    _, device = load_backend("triton")
    rng = np.random.default_rng(seed)
    layers = _layers(config, rng, device)
    cos_sin_np = rope_cos_sin_cache(max(q.total_len for q in requests) + 2)
    index_weight_np = random_norm_weight(rng, bf16=True, head_dim=128)
    wk = torch.from_numpy((rng.standard_normal((512, 128)) / 16).astype(np.float32)).to(device)
    shared = dict(device=device, cos_sin=_torch(cos_sin_np, device), cos_sin_np=cos_sin_np, wk=wk,
                  index_weight=_torch(index_weight_np, device), index_weight_np=index_weight_np)
    ring_pool = BlockPool(config.ring_blocks, rng)
    ring_pool.free.remove(NULL_BLOCK)
    page_pools = {ratio: BlockPool(config.pages, rng) for ratio in LAYER_RATIOS}
    entries: dict[int, set] = {ratio: set() for ratio in LAYER_RATIOS}
    for step in range(steps):
        plan = v41_schedule(requests, config, step, rng)
        if not plan:
            break
        meta = v41_build_step(requests, plan, config, ring_pool, page_pools)
        arrays = dict(positions=meta.positions, token_to_req_indices=meta.token_to_req_indices,
                      query_start_loc=meta.query_start_loc, slot_mapping=meta.slot_mapping,
                      **{f"kv_slot_mapping_{r}": meta.kv_slot_mapping[r] for r in LAYER_RATIOS})
        shared["tensors"] = {name: torch.from_numpy(array).to(device) for name, array in arrays.items()}
        fused = step % 2 == 1
        for layer in layers:
            width = 512 * layer.ratio
            kv_score_np = rng.standard_normal((config.padded_tokens, width)).astype(np.float32)  # the projection's output
            latent, k_pre = _run_layer(layer, kv_score_np, fused, shared, config)
            k_pre_np = None if k_pre is None else k_pre.view(torch.int16).cpu().numpy().view(np.uint16)
            latent_np = _spec_layer(layer, meta, kv_score_np, k_pre_np, shared, config)
            _compare(step, layer, latent, latent_np, meta)
            for t in np.flatnonzero(meta.kv_slot_mapping[layer.ratio] >= 0):  # (request, entry)
                entries[layer.ratio].add((plan[meta.token_to_req_indices[t]][0], int(meta.positions[t]) // layer.ratio))
        for (index, first, _, kept) in plan:
            requests[index].computed = first + kept
        tokens = sum(count for _, _, count, _ in plan)
        log(f"step {step}: {tokens:3d} tokens (+{config.padded_tokens - tokens} padding), "
            f"{'fused entry' if fused else 'vLLM pair'}; rings, caches and latents identical to the spec")
    return {ratio: len(found) for ratio, found in entries.items()}


def default_v41_requests() -> list[V41Request]:
    return [V41Request(prompt_len=45, decode_len=9), V41Request(prompt_len=7, decode_len=12),
            V41Request(prompt_len=21, decode_len=5)]
