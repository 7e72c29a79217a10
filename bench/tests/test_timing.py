"""The input-set rotation of the benchmarks: every pass over the sets reads at least
``ROTATION_BYTES`` of distinct state rows, so no timed call finds its rows in L2."""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor.bench import timing
from dsv4_compressor.bench.cases import c4_decode_sweep, c128_decode_sweep, indexer_decode_sweep, save_sweep


@pytest.mark.parametrize("nbytes", [0, 1, 8 << 10, 35 << 10, 1 << 20, 33 << 20, timing.ROTATION_BYTES, 8 << 30])
def test_rotation_sets_cover_the_rotation_bytes_unless_capped(nbytes):
    sets = timing.rotation_sets(nbytes)
    assert 2 <= sets <= timing.MAX_SETS
    assert sets * nbytes >= timing.ROTATION_BYTES or sets == timing.MAX_SETS
    assert sets == 2 or (sets - 1) * nbytes < timing.ROTATION_BYTES  # no more than needed


def test_the_smallest_case_still_passes_twice_the_l2():
    case = indexer_decode_sweep((1,))[0]  # one 8 KiB window, the least a benchmark call reads
    nbytes = case.bytes_moved(case.batch(np.random.default_rng(0)))
    assert timing.rotation_sets(nbytes) * nbytes >= 100e6  # the H200's L2: 50 MB


@pytest.mark.parametrize("num_sets", [1, 2, 3, 4, 5, 7, 9, 16])
def test_the_sets_are_independent_batches_then_their_copies_in_turn(num_sets):
    count, independent, copies = timing.rotation_layout(1 << 20, num_sets)
    assert (count, independent) == (num_sets, min(num_sets, timing.INDEPENDENT_SETS))
    assert (copies - 1) * independent < count <= copies * independent
    groups = [[(batch, copy) for copy in range(copies)] for batch in range(independent)]
    sets = timing.interleave(groups, count)
    assert sets == [(k % independent, k // independent) for k in range(count)]
    assert timing.rotation_layout(1 << 20)[0] == timing.rotation_sets(1 << 20)


def _touched_blocks(s, case) -> set:
    """State blocks (of the set's own state tensor, by data pointer) that its active tokens read
    (SPEC §5's activity rule and window rows, from the spec)."""
    from dsv4_compressor.spec.pooling import active_tokens, window_positions

    state, bs = s.args[0], s.args[5]
    token_req, positions, slots, table, kv_slots = (s.args[i].cpu().numpy() for i in (1, 2, 3, 4, 10))
    active = active_tokens(positions, slots, kv_slots, case.compress_ratio)
    rows, valid = window_positions(positions[active], case.config)
    requests = np.broadcast_to(token_req[active][:, None], rows.shape)
    return {(state.data_ptr(), int(b)) for b in table[requests[valid], rows[valid] // bs]}


@pytest.mark.gpu
@pytest.mark.parametrize("case", c4_decode_sweep((1, 128)) + c128_decode_sweep((1, 8)) + indexer_decode_sweep((1,)),
                         ids=lambda c: f"{c.name}-{c.token_num}")
def test_every_set_reads_its_own_state_blocks(case):
    prepared = timing.prepare(case)
    expected = timing.rotation_sets(prepared.bytes_moved)
    assert len(prepared.sets) == expected
    seen = set()
    for s in prepared.sets:
        state, block_table = s.args[0], s.args[4]
        assert int(block_table.max()) < state.shape[0]
        blocks = _touched_blocks(s, case)
        assert blocks and not blocks & seen  # no block read by two sets
        seen |= blocks
    assert len(seen) * case.block_size * case.config.state_row_width * 4 >= timing.ROTATION_BYTES / 2


@pytest.mark.gpu
def test_save_sets_have_their_own_inputs():
    prepared = timing.prepare(save_sweep((1,))[0])
    pointers = {(s.args[0].data_ptr(), s.args[4].data_ptr()) for s in prepared.sets}
    assert len(prepared.sets) > 4 and len(pointers) == len(prepared.sets)


def test_prepare_refuses_no_sets():
    with pytest.raises(ValueError, match="num_sets"):
        timing.prepare(c4_decode_sweep((1,))[0], num_sets=0)


def test_bench_refuses_no_sets_before_any_gpu_work(capsys):
    import argparse

    from dsv4_compressor.bench import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--sets", "0"])) == 2
    assert "--sets expected an integer >= 1, got 0" in capsys.readouterr().err
