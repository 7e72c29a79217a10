"""``python -m dsv4_compressor demo --model v4.1``: DeepSeek-V4.1's compressor (SPEC §14) on a small
step, one entry explained.

It builds a step (decode requests, a prefill chunk, padding) on a paged state of 8-row blocks or
(``--state-format ring``) vLLM's ring of 8 rows, fp32 or bf16 (``--state-dtype``), runs
``v41_compress_norm_rope_store`` and prints, for
one active token: where its two rows came from, its bf16 latent, its rotated entry ``z`` and
its record decoded value by value, each beside a float64 ideal computed here from the plain
formulas (softmax pooling, RMSNorm, RoPE) with none of the model's roundings.
"""

from __future__ import annotations

import numpy as np

from . import batch as B
from . import v41_batch as V
from .batch import Request
from .constants import NOPE_DIM
from .entry_layout import V41_RECORD_LAYOUTS
from .formats import bf16_to_f32, e2m1_to_f32, e4m3_to_f32
from .layouts import flashmla_page_bytes
from .v41_operator import v41_compress_norm_rope_store
from .v41_rope import rotate_bf16

V41_LAYOUTS = ("v41_nvfp4", "v41_mxfp8", "flashmla_fp8", "bf16", "fp8_per_tensor")
STATES = {"ring": ("vLLM's ring", V.vllm_ring), "paged": ("paged", V.paged)}  # --state-format


def _ideal(rows_kv: np.ndarray, rows_score: np.ndarray, weight: np.ndarray, eps: float, cos_sin: np.ndarray) -> np.ndarray:
    """The entry in float64 from the plain formulas: softmax pooling, RMSNorm, RoPE on 448..511."""
    w = np.exp(rows_score - rows_score.max(axis=0))
    x = (rows_kv * w).sum(axis=0) / w.sum(axis=0)
    y = x / np.sqrt(np.mean(x * x) + eps) * weight
    a, b = y[448::2], y[449::2]
    co, si = cos_sin[:32].astype(np.float64), cos_sin[32:].astype(np.float64)
    y[448::2], y[449::2] = a * co - b * si, a * si + b * co
    return y


def _decoded(k_cache: np.ndarray, layout: str, slot: int, fp8_scale: float | None) -> tuple[np.ndarray, list[str]]:
    """The record's 512 values by the readers' formulas, and a line describing its scales."""
    entries = k_cache.shape[1]
    page, o = divmod(slot, entries)
    if layout == "v41_nvfp4":
        entry = k_cache[page, o]
        codes = np.stack([entry[:256] & 0xF, entry[:256] >> 4], axis=1).reshape(512)
        sigma = e4m3_to_f32(entry[256:]).astype(np.float64)
        line = "scale bytes (E4M3 sigma of tiles 0..31): " + " ".join(f"{b:02x}" for b in entry[256:])
        return e2m1_to_f32(codes) * np.repeat(sigma, 16), [line, f"  tile 0: sigma = {sigma[0]:g}, tile 28 (RoPE): {sigma[28]:g}"]
    if layout == "v41_mxfp8":
        entry = k_cache[page, o]
        k = entry[512:].astype(np.int64) - 127
        line = "scale bytes (UE8M0 127 + k of blocks 0..15): " + " ".join(f"{b:02x}" for b in entry[512:])
        return e4m3_to_f32(entry[:512]) * np.repeat(np.ldexp(1.0, k), 32), [line]
    if layout == "flashmla_fp8":
        raw = flashmla_page_bytes(k_cache)[page]
        scales = raw[entries * 576 + o * 8:entries * 576 + o * 8 + 8]
        nope = e4m3_to_f32(raw[o * 576:o * 576 + NOPE_DIM]) * np.repeat(np.ldexp(1.0, scales[:7].astype(np.int64) - 127), 64)
        rope = bf16_to_f32(raw[o * 576 + NOPE_DIM:(o + 1) * 576].copy().view("<u2"))
        return np.concatenate([nope, rope]), ["scale record: " + " ".join(f"{b:02x}" for b in scales)]
    if layout == "bf16":
        return bf16_to_f32(k_cache[page, o]).astype(np.float64), ["bf16: the rotated entry z itself"]
    return e4m3_to_f32(k_cache[page, o]) * np.float64(fp8_scale), [f"fp8_per_tensor: e4m3(z / {fp8_scale:g})"]


def run(args) -> int:
    ratio = 2 if args.ratio is None else args.ratio
    layout = args.layout or "v41_nvfp4"
    if ratio not in (1, 2):
        raise SystemExit(f"--ratio: DeepSeek-V4.1's compressors have ratio 1 or 2, got {ratio}")
    if layout not in V41_LAYOUTS:
        raise SystemExit(f"--layout: expected one of {', '.join(V41_LAYOUTS)} with --model v4.1, got {layout}")
    if args.hadamard:
        raise SystemExit("--hadamard: DeepSeek-V4.1's index key has no Hadamard rotation")
    if args.ape_at != "save":
        raise SystemExit("--ape-at: DeepSeek-V4.1's compressors have no ape (the state holds the raw score)")
    rng = np.random.default_rng(args.seed)
    state_name, make_state = STATES[args.state_format]
    state_layout = make_state()
    bf16_state = args.state_dtype == "bf16"
    requests = [Request(int(p), 1) for p in 2 * rng.integers(2, 30, size=3) + 1] + [Request(5, 10)]
    entries = 4
    tables = V.v41_tables([r.context_len + r.num_tokens for r in requests], compress_ratio=ratio, state=state_layout,
                          entries_per_page=entries, rng=rng)
    step = V.v41_step(tables, requests, num_padding=2)
    kv, score = V.projections(step.num_tokens, rng)
    state = V.state_cache(tables.num_state_blocks, state_layout.block_size, rng, bf16=bf16_state)
    state_before = state.copy()
    weight = B.random_norm_weight(rng, bf16=True)
    cos_sin = B.rope_cos_sin_cache(64)
    k_cache = B.canary_k_cache(layout, tables.num_pages, entries)
    latent = V.latent_buffer(step.num_tokens)
    eps = 1e-6
    fp8_scale = 0.05 if layout == "fp8_per_tensor" else None
    record = V41_RECORD_LAYOUTS.get(layout)
    size = f"{record.entry_bytes} bytes per entry, interleaved" if record else "SPEC §7's record of z"
    where = ("no state" if ratio == 1 else
             f"{state_name} state (bs = {state_layout.block_size}, ring_capacity = {state_layout.ring_capacity}), "
             f"{args.state_dtype} rows of kv and the raw score")
    print(f"DeepSeek-V4.1 compressor, NumPy spec (SPEC §14): ratio {ratio}, {where}; layout {layout} ({size},"
          f" {entries} entries per page)")
    print(f"\n{step.num_tokens} tokens: {len(requests)} requests (3 decode, a chunk of 10 from position 5) and 2 padding;"
          f" active: a cache slot, {'every position' if ratio == 1 else 'an odd position and a state slot'}")
    print("  token  request  position  state slot  save slot  cache slot  active")
    active = (step.kv_slot_mapping >= 0) & ((step.positions + 1) % ratio == 0) & ((step.slot_mapping >= 0) | (ratio == 1))
    for t in range(step.num_tokens):
        print(f"  {t:5d}  {step.token_to_req[t]:7d}  {step.positions[t]:8d}  {step.slot_mapping[t]:10d}  "
              f"{step.save_slot_mapping[t]:9d}  {step.kv_slot_mapping[t]:10d}  {'yes' if active[t] else ''}")
    state_arguments = (step.token_to_req, step.query_start_loc, step.slot_mapping, step.save_slot_mapping, tables.block_table,
                       state_layout.block_size, state) if ratio == 2 else (None,) * 7
    v41_compress_norm_rope_store(kv, score if ratio == 2 else None, step.positions, *state_arguments, weight, eps, cos_sin,
                                 k_cache, step.kv_slot_mapping, latent, compress_ratio=ratio, layout=layout,
                                 ring_capacity=state_layout.ring_capacity if ratio == 2 else None, fp8_scale=fp8_scale)

    t = int(np.flatnonzero(active)[0 if ratio == 2 else -1])  # a decode token: its row p - 1 from the state
    p, req = int(step.positions[t]), int(step.token_to_req[t])
    rows = [t] if ratio == 1 else [None, t]
    kv_rows, score_rows = [kv[t].astype(np.float64)], [score[t].astype(np.float64)]
    if ratio == 2:
        first = int(step.query_start_loc[req])
        p0 = int(step.positions[first])
        if p - 1 >= p0:
            rows[0] = f"token {t - 1} of this call"
            kv_rows.insert(0, kv[t - 1].astype(np.float64))
            score_rows.insert(0, score[t - 1].astype(np.float64))
        else:
            index = (p - 1) if state_layout.ring_capacity is None else (p - 1) % state_layout.ring_capacity
            block = int(tables.block_table[req, index // state_layout.block_size])
            row = state_before[block, index % state_layout.block_size]
            row = bf16_to_f32(row) if row.dtype == np.uint16 else row
            rows[0] = f"the state, block {block} row {index % state_layout.block_size}"
            kv_rows.insert(0, row[:512].astype(np.float64))
            score_rows.insert(0, row[512:].astype(np.float64))
    ideal = _ideal(np.array(kv_rows), np.array(score_rows), bf16_to_f32(weight).astype(np.float64), eps,
                   cos_sin[(p // ratio) * ratio])
    slot = int(step.kv_slot_mapping[t])
    print(f"\nEntry of token {t} (request {req}, position {p}): entry {p // ratio}, cache slot {slot} = page {slot // entries},"
          f" entry {slot % entries}")
    if ratio == 2:
        print(f"  row p - 1 = {p - 1} from {rows[0]}; row p = {p} from token {t} of this call")
    z = rotate_bf16(latent[t:t + 1], cos_sin[(p // ratio) * ratio][None])[0]
    print("\nLatent l = bf16(RMSNorm(bf16(x))) and rotated entry z (RoPE at cp, NoPE copied), beside the float64 ideal")
    print("  ch    latent  value         z       value         float64 ideal")
    for c in (0, 1, 2, 3, 447, 448, 449, 450, 451, 510, 511):
        print(f"  {c:3d}  0x{int(latent[t, c]):04x}  {float(bf16_to_f32(latent[t, c])):12.6g}  0x{int(z[c]):04x}  "
              f"{float(bf16_to_f32(z[c])):12.6g}  {ideal[c]:14.8g}")
    values, lines = _decoded(k_cache, layout, slot, fp8_scale)
    print(f"\nRecord ({layout}):")
    for line in lines:
        print(f"  {line}")
    print("  ch    dequantized    float64 ideal    difference")
    for c in (0, 1, 2, 3, 16, 17, 448, 449, 511):
        print(f"  {c:3d}  {values[c]:13.6g}  {ideal[c]:15.8g}  {values[c] - ideal[c]:+11.3g}")
    worst = np.max(np.abs(values - ideal)) / np.max(np.abs(ideal))
    pages = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (k_cache.strides[0] * tables.num_pages)).from_address(
        k_cache.__array_interface__["data"][0]))  # every byte of the pages, padding included
    entry_bytes = record.entry_bytes if record else (584 if layout == "flashmla_fp8" else 512 * k_cache.itemsize)
    print(f"\nlargest difference over the 512 channels: {worst:.3g} of max |ideal|. {int(active.sum())} active tokens wrote"
          f" {int(active.sum())} entries ({int(active.sum()) * entry_bytes} bytes); {int(np.count_nonzero(pages != B.CANARY_BYTE))}"
          f" cache bytes differ from the canary 0x{B.CANARY_BYTE:02x} (a written byte may equal it).")
    return 0
