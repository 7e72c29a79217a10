"""The indexer's benchmark cases (SPEC §12): the C4 decode sweep, mixed steps and save pass, with
the bytes each moves (CPU only: the cases are NumPy metadata)."""

import argparse

import numpy as np

from dsv4_compressor.bench import cli
from dsv4_compressor.bench.cases import C4_SWEEP, indexer_decode_sweep, indexer_mixed_steps, indexer_save_sweep


def test_decode_sweep_bytes_per_active_token():
    rng = np.random.default_rng(0)
    for layout, entry in (("indexer_fp8", 132), ("indexer_mxfp4", 68)):
        cases = indexer_decode_sweep(layout=layout)
        assert [c.token_num for c in cases] == list(C4_SWEEP) and cases[0].block_size == 16
        case = indexer_decode_sweep((64,), layout=layout, hadamard=True)[0]
        assert case.hadamard and case.name.endswith("_hadamard")
        batch = case.batch(rng)
        assert batch.num_active == 64
        # 8 window rows x (128 kv + 128 score) fp32, the entry, a cos/sin row, 28 bytes of metadata; the weight once
        assert case.bytes_moved(batch) == 64 * (8 * 256 * 4 + entry + 64 * 4 + 28) + 128 * 4


def test_mixed_steps_and_save_cover_both_layouts():
    rng = np.random.default_rng(1)
    mixed = indexer_mixed_steps()
    assert {c.layout for c in mixed} == {"indexer_fp8", "indexer_mxfp4"}
    assert all(0 < c.batch(rng).num_active < c.token_num for c in mixed)
    save = indexer_save_sweep((16,))[0]
    batch = save.batch(rng)
    assert save.bytes_moved(batch) == 16 * 2 * 512 * 4 + 16 * 16 + 4 * 256 * 4


def test_cli_accepts_the_indexer_options():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--head", "128", "--layout", "indexer_mxfp4", "--hadamard", "--sizes", "1", "16384"])
    assert (args.head, args.layout, args.hadamard, args.sizes) == (128, ["indexer_mxfp4"], True, [1, 16384])
