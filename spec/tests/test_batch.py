"""The batch builders follow vLLM's slot rules."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor.spec import batch as B


@pytest.mark.parametrize("ratio, block_size, entries", [(4, 4, 64), (128, 8, 2), (4, 16, 1), (128, 4, 64)])
def test_slots_follow_the_block_tables(ratio, block_size, entries):
    rng = np.random.default_rng(ratio + block_size)
    requests = B.mixed_requests(rng, ratio, num_decode=9, prefill_tokens=(3 * ratio + 5,))
    b = B.build_batch(requests, compress_ratio=ratio, block_size=block_size, entries_per_page=entries, rng=rng,
                      num_padding=4, padding_at_end=False)
    real = b.slot_mapping >= 0
    q, p = b.token_to_req_indices[real], b.positions[real]
    assert np.array_equal(b.slot_mapping[real], b.block_table[q, p // block_size].astype(np.int64) * block_size + p % block_size)
    boundary = ((b.positions + 1) % ratio == 0) & real
    e = b.positions[boundary] // ratio
    qb = b.token_to_req_indices[boundary]
    assert np.array_equal(b.kv_slot_mapping[boundary], b.kv_block_table[qb, e // entries].astype(np.int64) * entries + e % entries)
    assert np.all(b.kv_slot_mapping[~boundary] == -1)
    assert np.count_nonzero(~real) == 4
    used = b.block_table[b.block_table >= 0]
    assert len(np.unique(used)) == used.size  # every (request, column) has its own block
    assert not np.array_equal(used, np.arange(used.size))  # shuffled, not the identity


def test_decode_requests_are_boundary_tokens():
    rng = np.random.default_rng(0)
    for ratio in (4, 128):
        assert all((r.context_len + 1) % ratio == 0 for r in B.decode_requests(50, ratio, rng))
        assert all((r.context_len + 1) % ratio != 0 for r in B.decode_requests(50, ratio, rng, boundary=False))


def test_padded_view_keeps_its_padding():
    view = B.padded_view((3, 5), np.float32, (1, 3), np.float32(7.0))
    assert view.strides == (8 * 4, 4) and view.__array_interface__["data"][0] % 64 == 0
    view[...] = 1.0
    assert np.all(view.base.view(np.float32) != 0)


def test_relocation_preserves_content():
    rng = np.random.default_rng(1)
    b = B.build_batch(B.decode_requests(4, 4, rng), compress_ratio=4, block_size=4, entries_per_page=8, rng=rng)
    state = B.random_state_cache(b.num_state_blocks, 4, 4, rng)
    moved, moved_state = B.relocate_state_blocks(b, state, rng)
    for t in range(b.num_tokens):
        assert np.array_equal(state[b.slot_mapping[t] // 4, b.slot_mapping[t] % 4], moved_state[moved.slot_mapping[t] // 4, moved.slot_mapping[t] % 4])


# ---- SPEC §13: ring state, tail saves, speculative groups -------------------------------------------
@pytest.mark.parametrize("ratio, block_size, capacity", [(4, 4, 8), (4, 4, 12), (128, 8, 136), (128, 8, 256)])
def test_ring_batches_keep_each_request_in_its_first_blocks_and_save_the_tails(ratio, block_size, capacity):
    rng = np.random.default_rng(ratio + capacity)
    requests = [B.Request(5, 2 * capacity + 3), B.Request(3 * ratio - 1, 1), B.Request(0, capacity - 1), B.Request(ratio, capacity)]
    b = B.build_ring_batch(requests, compress_ratio=ratio, ring_capacity=capacity, block_size=block_size, entries_per_page=4,
                           rng=rng, num_padding=3)
    assert b.ring_capacity == capacity and b.block_table.shape == (4, capacity // block_size)
    used = b.block_table.reshape(-1)
    assert len(np.unique(used)) == used.size and used.max() < b.num_state_blocks
    assert b.query_start_loc.tolist() == [0, 2 * capacity + 3, 2 * capacity + 4, 3 * capacity + 3, 4 * capacity + 3]
    real = np.arange(b.num_tokens) < b.query_start_loc[-1]
    q, p = b.token_to_req_indices[real], b.positions[real]
    ring = p % capacity
    assert np.array_equal(b.slot_mapping[real], b.block_table[q, ring // block_size].astype(np.int64) * block_size + ring % block_size)
    assert np.all(b.slot_mapping[~real] == -1) and np.all(b.save_slot_mapping[~real] == -1)
    for req, (first, end) in enumerate(zip(b.query_start_loc[:-1], b.query_start_loc[1:])):
        saves = b.save_slot_mapping[first:end]
        tail = min(capacity, end - first)
        assert np.all(saves[:end - first - tail] == -1)
        assert np.array_equal(saves[end - first - tail:], b.slot_mapping[end - tail:end])
        assert len(np.unique(saves[saves >= 0])) == tail  # a tail never names one ring slot twice
    boundary = real & ((b.positions + 1) % ratio == 0)
    assert np.all(b.kv_slot_mapping[boundary] >= 0) and np.all(b.kv_slot_mapping[~boundary] == -1)


def test_as_ring_copies_the_rows_before_each_chunk():
    rng = np.random.default_rng(5)
    requests = [B.Request(21, 3), B.Request(6, 5)]
    b = B.build_batch(requests, compress_ratio=4, block_size=4, entries_per_page=8, rng=rng, num_padding=1)
    state = B.random_state_cache(b.num_state_blocks, 4, 4, rng)
    ringed, ring = B.as_ring(b, state, 12, rng)
    assert np.array_equal(ringed.kv_slot_mapping, b.kv_slot_mapping) and np.array_equal(ringed.positions, b.positions)
    for req, request in enumerate(requests):
        for q in range(max(0, request.context_len - 12), request.context_len):
            paged_block = b.block_table[req, q // 4] if q // 4 < b.block_table.shape[1] else -1
            if paged_block >= 0:
                ring_row = ring[ringed.block_table[req, (q % 12) // 4], q % 12 % 4]
                assert np.array_equal(ring_row.view(np.uint32), state[paged_block, q % 4].view(np.uint32))
    with pytest.raises(ValueError, match="ring_capacity"):
        B.as_ring(b, state, 6, rng)
    scattered = B.build_batch(requests, compress_ratio=4, block_size=4, entries_per_page=8, rng=rng, num_padding=2,
                              padding_at_end=False)
    assert scattered.query_start_loc is None
    with pytest.raises(ValueError, match="batch"):
        B.as_ring(scattered, state, 12, rng)


@pytest.mark.parametrize("ratio, drafts", [(4, 1), (4, 3), (4, 9), (128, 3), (128, 200)])
def test_speculative_groups_hold_a_boundary(ratio, drafts):
    rng = np.random.default_rng(drafts)
    requests = B.speculative_requests(40, ratio, drafts, rng)
    for request in requests:
        positions = np.arange(request.context_len, request.context_len + request.num_tokens)
        assert request.num_tokens == drafts + 1 and request.context_len >= 0
        assert np.any((positions + 1) % ratio == 0)
    places = {int(np.flatnonzero((np.arange(r.context_len, r.context_len + r.num_tokens) + 1) % ratio == 0)[0]) for r in requests}
    assert len(places) > 1  # the boundary is not always at the same place in the group


def test_save_history_writes_every_block_row_in_the_format():
    from dsv4_compressor.spec.arithmetic import add

    b = B.build_batch([B.Request(9, 3), B.Request(2, 6)], compress_ratio=4, block_size=4, entries_per_page=8,
                      rng=np.random.default_rng(6))
    ape = B.random_ape(4, np.random.default_rng(7))
    states = {}
    for ape_at in ("save", "compress"):
        states[ape_at] = B.random_state_cache(b.num_state_blocks, 4, 4, np.random.default_rng(8), row_pad=4)
        B.save_history(b, states[ape_at], ape, np.random.default_rng(9), ape_at=ape_at)
    for req, column in zip(*np.nonzero(b.block_table >= 0)):
        block = b.block_table[req, column]
        positions = column * 4 + np.arange(4)
        raw = states["compress"][block]
        assert np.array_equal(states["save"][block, :, :1024], raw[:, :1024])
        assert np.array_equal(states["save"][block, :, 1024:], add(raw[:, 1024:], ape[positions % 4]))
    spare = np.setdiff1d(np.arange(b.num_state_blocks), b.block_table[b.block_table >= 0])
    assert np.array_equal(states["save"][spare], states["compress"][spare])  # untouched
