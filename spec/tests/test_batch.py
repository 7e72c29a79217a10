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
