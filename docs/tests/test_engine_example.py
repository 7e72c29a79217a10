"""The engine example of docs/engine.md runs, writes entries, and matches the spec byte for byte.

``docs/examples/engine_loop.py`` compares both caches with the NumPy spec after every step and
raises on the first differing byte; these tests run it (Triton under its interpreter without a
GPU; CuTe DSL on a GPU) and check that it wrote entries and stopped with every request done.
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
