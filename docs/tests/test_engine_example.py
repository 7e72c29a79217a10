"""The engine example of docs/engine.md runs, writes entries, and matches the spec byte for byte.

``docs/examples/engine_loop.py`` compares both caches with the NumPy spec after every step and
raises on the first differing byte; these tests run it (Triton under its interpreter without a
GPU; CuTe DSL on a GPU) and check that it wrote entries and stopped with every request done,
in today's paged fp32 state and in SPEC §13's formats (a ring with tail saves, a bf16 state,
``ape`` added at the compress).
``--model v4.1`` (``docs/examples/engine_loop_v41.py``) runs vLLM's V4.1 entry points the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

from dsv4_compressor.docs.examples import engine_loop


@pytest.mark.parametrize("ratio", [4, 128])
def test_engine_loop_on_triton(ratio):
    requests = engine_loop.default_requests(ratio)
    lines = []
    written = engine_loop.run(engine_loop.default_config(ratio), requests, "triton", steps=40, log=lines.append)
    assert written == sum(q.total_len // ratio for q in requests)  # one entry per closed window
    assert all(q.computed == q.total_len for q in requests)
    assert len(lines) >= 3 and all("identical to the spec" in line for line in lines)


def test_engine_loop_metadata_follows_the_slot_rules():
    config = engine_loop.default_config(4)
    requests = [engine_loop.Request(prompt_len=9, decode_len=0)]
    rng = np.random.default_rng(1)
    state_pool, page_pool = engine_loop.BlockPool(config.state_blocks, rng), engine_loop.BlockPool(config.pages, rng)
    meta = engine_loop.build_step(requests, engine_loop.schedule(requests, config), config, state_pool, page_pool)
    request = requests[0]
    for p in range(9):
        assert meta["slot_mapping"][p] == request.state_blocks[p // 4] * 4 + p % 4
    boundary = [p for p in range(9) if (p + 1) % 4 == 0]  # positions 3 and 7 close entries 0 and 1
    assert [p for p in range(9) if meta["kv_slot_mapping"][p] >= 0] == boundary
    assert [int(meta["kv_slot_mapping"][p]) for p in boundary] == [request.pages[0] * 16 + e for e in (0, 1)]
    assert (meta["slot_mapping"][9:] == -1).all() and (meta["kv_slot_mapping"][9:] == -1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("ratio", [4, 128])
def test_engine_loop_on_cutedsl(ratio):
    requests = engine_loop.default_requests(ratio)
    written = engine_loop.run(engine_loop.default_config(ratio), requests, "cutedsl", steps=40, log=lambda line: None)
    assert written == sum(q.total_len // ratio for q in requests)


# ---- SPEC §13's state formats ----------------------------------------------------------------------
@pytest.mark.parametrize("ratio, addressing, dtype, ape_at", [
    (4, "ring", "fp32", "save"),
    (4, "ring", "bf16", "compress"),
    (4, "paged", "bf16", "save"),
    (4, "paged", "fp32", "compress"),
    (128, "ring", "bf16", "save"),
])
def test_engine_loop_in_each_state_format(ratio, addressing, dtype, ape_at):
    requests = engine_loop.default_requests(ratio)
    state = engine_loop.StateOptions(addressing=addressing, dtype=dtype, ape_at=ape_at)
    lines = []
    written = engine_loop.run_state_format(engine_loop.default_config(ratio), requests, "triton", 40, state,
                                           log=lines.append)
    assert written == sum(q.total_len // ratio for q in requests)  # one entry per closed window
    assert all(q.computed == q.total_len for q in requests)
    assert len(lines) >= 3 and all("identical to the spec" in line for line in lines)


def test_ring_metadata_names_ring_rows_and_saves_each_chunks_tail():
    config = engine_loop.default_config(4)
    state = engine_loop.StateOptions(addressing="ring")
    capacity = engine_loop.default_ring_capacity(4)
    requests = [engine_loop.Request(prompt_len=30, decode_len=0), engine_loop.Request(prompt_len=5, decode_len=0)]
    rng = np.random.default_rng(2)
    state_pool, page_pool = engine_loop.BlockPool(config.state_blocks, rng), engine_loop.BlockPool(config.pages, rng)
    plan = engine_loop.schedule(requests, config)  # a chunk of 24 (longer than the ring) and one of 5
    meta = engine_loop.ring_step_metadata(requests, plan, config, state, state_pool, page_pool)
    assert list(meta["query_start_loc"]) == [0, 24, 29]
    assert meta["block_table"].shape[1] >= capacity // config.block_size
    for t, (req, p) in enumerate([(0, p) for p in range(24)] + [(1, p) for p in range(5)]):
        row = p % capacity
        assert meta["slot_mapping"][t] == requests[req].state_blocks[row // 4] * 4 + row % 4
        in_tail = t >= 24 - capacity if req == 0 else True
        assert meta["save_slot_mapping"][t] == (meta["slot_mapping"][t] if in_tail else -1)
    assert (meta["save_slot_mapping"][29:] == -1).all()


def test_state_format_flags_select_the_run(capsys):
    assert engine_loop.main(["--state-format", "ring", "--state-dtype", "bf16", "--ape-at", "compress", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "ring of 12" in out and "bf16 state, ape at compress" in out


@pytest.mark.gpu
@pytest.mark.parametrize("ratio, addressing, dtype, ape_at", [
    (4, "ring", "bf16", "compress"), (128, "ring", "fp32", "save"), (4, "paged", "bf16", "save")])
def test_engine_loop_in_state_formats_on_cutedsl(ratio, addressing, dtype, ape_at):
    """The CuTe DSL family in SPEC §13's formats (a ring through its step call ``compress_and_save``),
    every step checked against the spec."""
    requests = engine_loop.default_requests(ratio)
    state = engine_loop.StateOptions(addressing=addressing, dtype=dtype, ape_at=ape_at)
    written = engine_loop.run_state_format(engine_loop.default_config(ratio), requests, "cutedsl", 40, state,
                                           log=lambda line: None)
    assert written == sum(q.total_len // ratio for q in requests)


# ---- --model v4.1 ------------------------------------------------------------------------------------
def test_engine_loop_v41_on_triton():
    """Both V4.1 layers through vLLM's entry points (the pair and the fused entry on alternate
    steps), checked against the spec after every step, every request finished."""
    from dsv4_compressor.docs.examples import engine_loop_v41 as v41

    requests = v41.default_v41_requests()
    lines = []
    written = v41.run_v41(v41.V41EngineConfig(), requests, steps=40, log=lines.append)
    assert written == {r: sum(q.total_len // r for q in requests) for r in v41.LAYER_RATIOS}  # one entry per group
    assert all(q.computed == q.total_len for q in requests)
    assert all("identical to the spec" in line for line in lines)
    assert any("fused entry" in line for line in lines) and any("vLLM pair" in line for line in lines)


def test_engine_loop_v41_metadata_follows_vllms_ring():
    from dsv4_compressor.docs.examples import engine_loop_v41 as v41

    config = v41.V41EngineConfig()
    requests = [v41.V41Request(prompt_len=5, decode_len=0), v41.V41Request(prompt_len=3, decode_len=0)]
    rng = np.random.default_rng(2)
    ring_pool = engine_loop.BlockPool(config.ring_blocks, rng)
    ring_pool.free.remove(v41.NULL_BLOCK)
    pools = {r: engine_loop.BlockPool(config.pages, rng) for r in v41.LAYER_RATIOS}
    meta = v41.v41_build_step(requests, v41.v41_schedule(requests, config, 0, rng), config, ring_pool, pools)
    capacity = 8  # max(8, 2^ceil(log2(S + 2))) for S = 3
    assert list(meta.query_start_loc) == [0, 5, 8]
    for t, (req, p) in enumerate([(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2)]):
        block = requests[req].ring_block
        assert block != v41.NULL_BLOCK and meta.ring_blocks[req, 0] == block
        assert meta.positions[t] == p and meta.slot_mapping[t] == block * capacity + p % capacity
        pages = requests[req].pages
        assert meta.kv_slot_mapping[1][t] == pages[1][p // 8] * 8 + p % 8
        assert meta.kv_slot_mapping[2][t] == (pages[2][0] * 8 + p // 2 if p % 2 else -1)
    assert (meta.slot_mapping[8:] == -1).all() and all((meta.kv_slot_mapping[r][8:] == -1).all() for r in (1, 2))
