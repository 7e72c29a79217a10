"""``python -m dsv4_compressor demo``: the operator on a small mixed batch, one entry explained.

It builds a vLLM-style step (decode requests, a chunked prefill, padding), runs the NumPy
spec (save, then compress-norm-rope-store into a FlashMLA cache) and prints one stored entry
region by region: E4M3 bytes with their dequantized values beside a float64 ideal computed
here from the plain formulas, the UE8M0 scale bytes, and the bf16 RoPE values.

``--layout indexer_fp8`` or ``indexer_mxfp4`` (optionally ``--hadamard``) runs the indexer's
compressor (SPEC §12, head width 128) instead and explains one indexer entry.

``--state-format ring``, ``--state-dtype bf16`` or ``--ape-at compress`` runs one step of SPEC
§13.4's ``compress_and_save`` on that state format instead (:mod:`.demo_state`).

``--model v4.1`` runs DeepSeek-V4.1's compressor (SPEC §14) instead (:mod:`.v41_demo`).
"""

from __future__ import annotations

import numpy as np

from . import batch as B
from . import float64_ideal
from .constants import DATA_RECORD_BYTES, INDEXER_HEAD_DIM, NOPE_DIM, QUANT_BLOCK, ratio_config
from .entry_layout import PAGED_LAYOUTS
from .formats import bf16_to_f32, e2m1_to_f32, e4m3_to_f32
from .layouts import flashmla_page_bytes, page_bytes
from .operator import compress_norm_rope_store
from .state import save_partial_states


def add_arguments(parser) -> None:
    parser.add_argument("--model", choices=("v4", "v4.1"), default="v4",
                        help="DeepSeek V4's compressor (SPEC §1-§13) or DeepSeek-V4.1's (SPEC §14)")
    parser.add_argument("--ratio", type=int, choices=(1, 2, 4, 128), default=None,
                        help="compress ratio: 4 or 128 for v4 (default 4), 1 or 2 for v4.1 (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--channels", type=int, default=4, help="NoPE channels shown per quantization block")
    parser.add_argument("--layout", choices=("flashmla_fp8", "indexer_fp8", "indexer_mxfp4", "bf16", "fp8_per_tensor",
                                             "v41_mxfp8", "v41_nvfp4"), default=None,
                        help="v4: the 512-wide FlashMLA entry (default) or an indexer entry (head width 128, SPEC §12);"
                             " v4.1: v41_nvfp4 (default), v41_mxfp8, flashmla_fp8, bf16 or fp8_per_tensor")
    parser.add_argument("--hadamard", action="store_true", help="indexer layouts: apply the Hadamard rotation")
    parser.add_argument("--state-format", choices=("paged", "ring"), default="paged",
                        help="SPEC §13.3: a paged state, or a ring of C rows per request (runs compress_and_save)")
    parser.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32", help="SPEC §13.1: the state's dtype")
    parser.add_argument("--ape-at", choices=("save", "compress"), default="save",
                        help="SPEC §13.2: where ape is added to the scores")


def run_indexer(args) -> int:
    """The indexer compressor (SPEC §12) on a small mixed batch; one entry explained."""
    rng = np.random.default_rng(args.seed)
    r, layout = args.ratio, args.layout
    config = ratio_config(r, INDEXER_HEAD_DIM)
    bs, entries = B.INDEXER_STATE_BLOCK_SIZE[r], 8
    requests = B.decode_requests(3, r, rng, max_entries=4) + [B.chunked_prefill(r + 1, 2 * r + 3)]
    b = B.build_batch(requests, compress_ratio=r, block_size=bs, entries_per_page=entries, rng=rng, num_padding=2)
    state = B.random_state_cache(b.num_state_blocks, bs, r, rng, head_dim=INDEXER_HEAD_DIM)
    weight = B.random_norm_weight(rng, bf16=False, head_dim=INDEXER_HEAD_DIM)
    cos_sin = B.rope_cos_sin_cache(int(b.positions.max()) + 1)
    k_cache = B.canary_k_cache(layout, b.num_pages, entries)
    eps = 1e-6
    entry = PAGED_LAYOUTS[layout]
    print(f"DeepSeek V4 indexer compressor, NumPy spec: C{r} (W = {config.window} rows), head width 128, state rows of"
          f" {config.state_row_width} floats in blocks of {bs}; layout {layout} ({entry.entry_bytes} bytes per entry,"
          f" {entries} entries per page){', Hadamard rotation' if args.hadamard else ''}")
    save_partial_states(B.random_kv_score(b.num_tokens, r, rng, head_dim=INDEXER_HEAD_DIM),
                        B.random_ape(r, rng, head_dim=INDEXER_HEAD_DIM), b.positions, b.slot_mapping, state, bs)
    compress_norm_rope_store(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, bs, weight, eps,
                             cos_sin, k_cache, b.kv_slot_mapping, compress_ratio=r, layout=layout,
                             hadamard=args.hadamard, debug=True)
    t = int(np.flatnonzero(b.active)[-1])
    slot = int(b.kv_slot_mapping[t])
    page, o = divmod(slot, entries)
    pages = page_bytes(k_cache, entry.entry_bytes)
    data = pages[page, o * entry.data_bytes:(o + 1) * entry.data_bytes]
    scale_at = entries * entry.data_bytes + o * entry.scale_bytes
    scale_record = pages[page, scale_at:scale_at + entry.scale_bytes]
    z = float64_ideal.indexer_entry(state, b, weight, eps, cos_sin, t, args.hadamard)
    p = int(b.positions[t])
    print(f"\n{b.num_active} of {b.num_tokens} tokens are active. Entry of token {t}: position {p} closes group {p // r};"
          f" cache slot {slot} = page {page}, entry {o}: data record at page byte {o * entry.data_bytes},"
          f" scale record at page byte {scale_at}")
    print(f"Scale record: {' '.join(f'{v:02x}' for v in scale_record)}", end="  ")
    if layout == "indexer_fp8":
        scale = float(scale_record.view("<f4")[0])
        print(f"(binary32 {scale:g}, little-endian)")
        values = e4m3_to_f32(data).astype(np.float64) * scale
        codes = data
    else:
        print("(UE8M0 bytes 127+k of the four 32-channel blocks)")
        codes = np.stack([data & 0xF, data >> 4], axis=1).reshape(INDEXER_HEAD_DIM)
        values = e2m1_to_f32(codes).astype(np.float64) * np.repeat(np.exp2(scale_record.astype(np.float64) - 127), 32)
    print("  ch   code  dequantized    float64 ideal    difference")
    for c in [c for g in range(0, 128, 32) for c in range(g, g + args.channels)]:
        print(f"  {c:3d}  0x{int(codes[c]):02x}  {values[c]:13.6g}  {z[c]:15.8g}  {values[c] - z[c]:+11.3g}")
    changed = int(np.count_nonzero(page_bytes(k_cache, entry.entry_bytes) != B.CANARY_BYTE))
    print(f"\n{b.num_active} entries written ({b.num_active * entry.entry_bytes} bytes); {changed} cache bytes differ from"
          f" the canary 0x{B.CANARY_BYTE:02x} (a written byte may equal it).")
    return 0


def run(args) -> int:
    if args.model == "v4.1":
        from .v41_demo import run as run_v41

        return run_v41(args)
    args.ratio = 4 if args.ratio is None else args.ratio
    args.layout = args.layout or "flashmla_fp8"
    if args.ratio not in (4, 128):
        raise SystemExit(f"--ratio: DeepSeek V4's compressors have ratio 4 or 128, got {args.ratio} (ratios 1 and 2: --model v4.1)")
    if args.layout not in ("flashmla_fp8", "indexer_fp8", "indexer_mxfp4"):
        raise SystemExit(f"--layout: the v4 demo explains flashmla_fp8, indexer_fp8 or indexer_mxfp4, got {args.layout}")
    if (args.state_format, args.state_dtype, args.ape_at) != ("paged", "fp32", "save"):
        if args.layout != "flashmla_fp8" or args.hadamard:
            raise SystemExit("--state-format/--state-dtype/--ape-at: the state-format demo explains a flashmla_fp8 entry;"
                             " leave out --layout and --hadamard")
        from . import demo_state

        return demo_state.run(args)
    if args.layout != "flashmla_fp8":
        return run_indexer(args)
    if args.hadamard:
        raise SystemExit("--hadamard: only with --layout indexer_fp8 or indexer_mxfp4")
    rng = np.random.default_rng(args.seed)
    r = args.ratio
    config = ratio_config(r)
    bs, entries = (4, 64) if r == 4 else (8, 2)
    requests = B.decode_requests(3, r, rng, max_entries=4) + [B.chunked_prefill(r + 1, 2 * r + 3)]
    b = B.build_batch(requests, compress_ratio=r, block_size=bs, entries_per_page=entries, rng=rng, num_padding=2)
    state = B.random_state_cache(b.num_state_blocks, bs, r, rng)
    kv_score = B.random_kv_score(b.num_tokens, r, rng)
    ape = B.random_ape(r, rng)
    weight = B.random_norm_weight(rng, bf16=False)
    cos_sin = B.rope_cos_sin_cache(int(b.positions.max()) + 1)
    k_cache = B.canary_k_cache("flashmla_fp8", b.num_pages, entries)
    eps = 1e-6

    print(f"DeepSeek V4 KV compressor, NumPy spec: C{r} (window W = {config.window} rows, overlap {config.overlap}), "
          f"state blocks of {bs} rows, {entries} entries per FlashMLA page")
    print(f"\n{b.num_tokens} tokens from {len(requests)} requests + 2 padding; a token is active iff it has a state slot,"
          f" closes a window ((p+1) % {r} == 0) and has a cache slot:")
    print("  token  request  position  state slot  cache slot  active")
    for t in range(b.num_tokens):
        print(f"  {t:5d}  {b.token_to_req_indices[t]:7d}  {b.positions[t]:8d}  {b.slot_mapping[t]:10d}  "
              f"{b.kv_slot_mapping[t]:10d}  {'yes' if b.active[t] else ''}")

    save_partial_states(kv_score, ape, b.positions, b.slot_mapping, state, bs)
    compress_norm_rope_store(state, b.token_to_req_indices, b.positions, b.slot_mapping, b.block_table, bs, weight, eps,
                             cos_sin, k_cache, b.kv_slot_mapping, compress_ratio=r, debug=True)

    t = int(np.flatnonzero(b.active)[-1])
    slot = int(b.kv_slot_mapping[t])
    page, o = divmod(slot, entries)
    pages = flashmla_page_bytes(k_cache)
    data = pages[page, o * DATA_RECORD_BYTES:(o + 1) * DATA_RECORD_BYTES]
    scale_at = entries * DATA_RECORD_BYTES + o * 8
    scales = pages[page, scale_at:scale_at + 8]
    y, rope = float64_ideal.attention_entry(state, b, weight, eps, cos_sin, t)
    p = int(b.positions[t])
    print(f"\nEntry of token {t}: position {p} closes group {p // r}, rows {max(p - config.window + 1, 0)}..{p};"
          f" cache slot {slot} = page {page}, entry {o}")
    print(f"  data record at page byte {o * DATA_RECORD_BYTES} (448 E4M3 bytes + 128 bytes of bf16 RoPE),"
          f" scale record at page byte {scale_at}")
    print(f"\nScale record: {' '.join(f'{v:02x}' for v in scales)}  (UE8M0 bytes 127+k of blocks 0..6, then pad 00)")
    print("\nNoPE: bf16(y) / 2^k rounded to E4M3; dequantized = e4m3 * 2^k, beside the float64 ideal y")
    print("  block  ch   byte  e4m3        dequantized    float64 ideal    difference")
    for g in range(NOPE_DIM // QUANT_BLOCK):
        k = int(scales[g]) - 127
        for c in range(g * QUANT_BLOCK, g * QUANT_BLOCK + args.channels):
            code = data[c]
            e = float(e4m3_to_f32(np.uint8(code)))
            value = e * 2.0**k
            print(f"  {g:5d}  {c:3d}  0x{code:02x}  {e:10.5g}  {value:13.6g}  {y[c]:15.8g}  {value - y[c]:+11.3g}")
        amax = np.abs(y[g * 64:(g + 1) * 64]).max()
        print(f"  {'':5s}  block amax (ideal) {amax:.6g} -> k = {k} (smallest k with amax <= 448 * 2^k), byte 0x{scales[g]:02x}")
    stored_rope = bf16_to_f32(data[NOPE_DIM:].copy().view("<u2"))
    print(f"\nRoPE: pairs (y[448+2j], y[449+2j]) rotated with cos_sin_cache row {(p // r) * r} (the group's first position),"
          f" stored as bf16")
    print("  ch   bf16     stored          float64 ideal")
    for j in range(0, 64, 8):
        bits = int(data[NOPE_DIM + 2 * j]) | int(data[NOPE_DIM + 2 * j + 1]) << 8
        print(f"  {448 + j:3d}  0x{bits:04x}  {float(stored_rope[j]):14.7g}  {rope[j]:14.7g}")
    changed = int(np.count_nonzero(pages != B.CANARY_BYTE))
    print(f"\n{b.num_active} active tokens wrote {b.num_active} entries ({b.num_active * 584} bytes); {changed} cache bytes"
          f" differ from the canary 0x{B.CANARY_BYTE:02x} they were filled with (a written byte may equal it),"
          f" nothing else was touched.")
    return 0
