"""``python -m dsv4_compressor demo --state-format ring`` (or ``--state-dtype bf16``, ``--ape-at compress``):
one step of SPEC §13.4's ``compress_and_save`` on the chosen state format, explained.

It builds a step of three requests (a decode token, a prefill chunk longer than the ring, a
speculative verify group with a boundary inside) over a state that earlier steps saved in the
chosen format, prints where each request's tokens are saved (the ring's tail saves) and, for one
entry, where each window row comes from (a state row, or a token of this call's chunk), then
checks the entries against a paged twin that saves every token.
"""

from __future__ import annotations

import numpy as np

from . import batch as B
from .constants import DATA_RECORD_BYTES, ratio_config
from .formats import bf16_bits, e4m3_to_f32
from .layouts import flashmla_page_bytes
from .pooling import window_positions
from .rows import ChunkInputs, window_rows
from .state_format import StateFormat
from .step import compress_and_save

RING_CAPACITY = {4: 12, 128: 256}  # C4: W + one block; C128: vLLM's 128 * ceil((128 + S) / 128) for S = 3 drafts
STATE_BLOCK = {4: 4, 128: 8}
ENTRIES = {4: 16, 128: 2}


def _state(batch: B.Batch, width: int, dtype: str) -> np.ndarray:
    storage = np.uint16 if dtype == "bf16" else np.float32
    return B.padded_view((batch.num_state_blocks, batch.block_size, width), storage, (0, 0, 0),
                         storage(0x7FC0) if dtype == "bf16" else np.float32(np.nan))


def _step(state_cache, batch: B.Batch, kv, score, ape, weight, cos_sin, k_cache, ape_at: str) -> None:
    compress_and_save(kv, score, ape, batch.positions, batch.token_to_req_indices, batch.query_start_loc,
                      batch.slot_mapping, batch.save_slot_mapping, batch.block_table, batch.block_size, state_cache,
                      weight, 1e-6, cos_sin, k_cache, batch.kv_slot_mapping, compress_ratio=batch.compress_ratio,
                      ape_at=ape_at, ring_capacity=batch.ring_capacity, debug=True)


def run(args) -> int:
    rng = np.random.default_rng(args.seed)
    r = args.ratio
    config = ratio_config(r)
    ring = args.state_format == "ring"
    capacity = RING_CAPACITY[r] if ring else None
    fmt = StateFormat(args.state_dtype, args.ape_at, capacity)
    bs, entries = STATE_BLOCK[r], ENTRIES[r]
    chunk_len = (capacity or RING_CAPACITY[r]) + config.window + 3
    requests = [B.Request(5 * r - 1, 1), B.Request(r + 1, chunk_len), *B.speculative_requests(1, r, 3, rng, max_entries=4)]
    paged = B.build_batch(requests, compress_ratio=r, block_size=bs, entries_per_page=entries, rng=rng, num_padding=2)
    ape = B.random_ape(r, rng)
    paged_state = _state(paged, config.state_row_width, fmt.dtype)
    B.save_history(paged, paged_state, ape, rng, ape_at=fmt.ape_at)
    batch, state = B.as_ring(paged, paged_state, capacity, rng) if ring else (paged, paged_state.copy())
    projections = B.random_kv_score(paged.num_tokens, r, rng)
    kv, score = projections[:, :config.state_width], projections[:, config.state_width:]
    weight = B.random_norm_weight(rng, bf16=True)
    cos_sin = B.rope_cos_sin_cache(int(paged.positions.max()) + 1)
    k_cache = B.canary_k_cache("flashmla_fp8", paged.num_pages, entries)

    where = (f"a ring of C = {capacity} rows per request (its first {capacity // bs} blocks of {bs} rows)" if ring
             else f"paged, blocks of {bs} rows")
    print(f"DeepSeek V4 KV compressor, NumPy spec, SPEC §13: C{r} (W = {config.window} rows); state {fmt.dtype},"
          f" ape added at the {fmt.ape_at}, {where}")
    print("\nOne compress_and_save call: compress every active token, rows at or after its chunk's start read from"
          " this call's kv/score, earlier rows from the state; then save the tokens with save_slot_mapping >= 0.")
    kinds = ("decode", f"prefill chunk{' longer than the ring' if ring else ''}", "verify group (3 drafts)")
    print(f"  request  {'kind':33s}  {'positions':12s}  {'saved':28s}  active at")
    for req, (first, end) in enumerate(zip(batch.query_start_loc[:-1], batch.query_start_loc[1:])):
        positions = batch.positions[first:end]
        saved = np.flatnonzero(batch.save_slot_mapping[first:end] >= 0)
        saved_text = (f"positions {positions[saved[0]]}..{positions[saved[-1]]}" if saved.size else "none")
        if saved.size < positions.size:
            saved_text += " (the tail)"
        active = positions[batch.active[first:end]]
        print(f"  {req:7d}  {kinds[req]:33s}  {positions[0]:5d}..{positions[-1]:<5d}  {saved_text:28s}  "
              f"{', '.join(str(p) for p in active)}")
    print(f"  padding tokens: {batch.num_tokens - int(batch.query_start_loc[-1])} (every slot -1)")

    # one entry's window: the first active token of the chunk that starts latest in its window
    actives = np.flatnonzero(batch.active)
    t = int(next((u for u in actives if batch.token_to_req_indices[u] == 1), actives[0]))
    window, _ = window_positions(batch.positions[t:t + 1], config)
    chunk = ChunkInputs(kv=kv, score=score, positions=batch.positions, query_start_loc=batch.query_start_loc)
    rows = window_rows(window, batch.token_to_req_indices[t:t + 1], fmt, state, batch.block_table, bs, chunk, ape)
    req = int(batch.token_to_req_indices[t])
    p0 = int(batch.positions[batch.query_start_loc[req]])
    print(f"\nEntry of token {t} (request {req}, position {batch.positions[t]}): window rows"
          f" {window[0, 0]}..{window[0, -1]}, this request's chunk starts at P0 = {p0}")
    step = max(1, config.window // 8)
    for i in range(0, config.window, step):
        q = int(window[0, i])
        if not rows.valid[0, i]:
            source = "invalid (position < 0)"
        elif rows.from_chunk[0, i]:
            source = f"chunk token {int(batch.query_start_loc[req]) + q - p0} (q >= P0: as the save would store it)"
        else:
            block, offset = fmt.row_of(batch.block_table, req, q, bs)
            index = f"{q} mod {capacity} = {q % capacity}" if ring else f"{q}"
            source = f"state block {int(block)}, row {int(offset)} (slot of position {index})"
        print(f"  row {i:3d}  position {q:5d}  {source}")
    if step > 1:
        print(f"  (every {step}th row shown)")

    _step(state, batch, kv, score, ape, weight, cos_sin, k_cache, fmt.ape_at)
    twin_state = paged_state.copy()
    twin_k = B.canary_k_cache("flashmla_fp8", paged.num_pages, entries)
    twin = B.Batch(**{**paged.__dict__, "save_slot_mapping": paged.slot_mapping})
    _step(twin_state, twin, kv, score, ape, weight, cos_sin, twin_k, fmt.ape_at)
    same = np.array_equal(flashmla_page_bytes(k_cache), flashmla_page_bytes(twin_k))

    slot = int(batch.kv_slot_mapping[t])
    page, o = divmod(slot, entries)
    pages = flashmla_page_bytes(k_cache)
    scales = pages[page, entries * DATA_RECORD_BYTES + o * 8: entries * DATA_RECORD_BYTES + o * 8 + 8]
    codes = pages[page, o * DATA_RECORD_BYTES: o * DATA_RECORD_BYTES + 4]
    values = e4m3_to_f32(codes).astype(np.float64) * 2.0 ** (int(scales[0]) - 127)
    print(f"\nIts entry at cache slot {slot}: scale record {' '.join(f'{v:02x}' for v in scales)};"
          f" channels 0..3 dequantized {', '.join(f'{v:.5g}' for v in values)}")
    saved = batch.save_slot_mapping[batch.save_slot_mapping >= 0]
    stored = state[saved // bs, saved % bs]
    if fmt.dtype == "bf16":
        last_kv = kv[batch.save_slot_mapping >= 0][-1, 0]
        assert int(stored[-1, 0]) == int(bf16_bits(last_kv))
        print(f"The save wrote {saved.size} rows of {config.state_row_width} bf16 values, each rounded once from"
              f" binary32 (the last row's kv[0]: 0x{int(stored[-1, 0]):04x}, the bf16 nearest {last_kv:.8g}).")
    else:
        print(f"The save wrote {saved.size} rows of {config.state_row_width} fp32 values"
              f" (scores {'with ape added' if fmt.ape_at == 'save' else 'raw: pooling adds ape'}).")
    print(f"\n{batch.num_active} entries written; every k_cache byte equals that of a paged twin that saves every"
          f" token: {'yes' if same else 'NO'}")
    return 0 if same else 1
