"""The C128 serving shapes among the ``--extra`` cases: how many tokens each step holds and how
many of them close a window (CPU only: the cases are NumPy metadata)."""

import argparse

import numpy as np
import pytest

from dsv4_compressor.bench import cli
from dsv4_compressor.bench.cases import Case, mixed_steps


def _c128_steps() -> dict[tuple[str, int], Case]:
    return {(c.name, c.token_num): c for c in mixed_steps() if c.compress_ratio == 128}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_step_of_64_tokens_has_exactly_one_active(seed):
    batch = _c128_steps()[("c128_decode_step", 64)].batch(np.random.default_rng(seed))
    assert batch.num_tokens == 64 and batch.num_active == 1
    assert len(set(batch.token_to_req_indices.tolist())) == 64  # one decode token per request
    closes = (batch.positions + 1) % 128 == 0
    assert int(closes.sum()) == 1 and bool(batch.active[closes].all())


def test_prefill_step_of_16384_tokens_closes_128_windows():
    batch = _c128_steps()[("c128_prefill_step", 16384)].batch(np.random.default_rng(0))
    assert batch.num_tokens == 16384 and batch.num_active == 128
    assert np.array_equal(np.diff(batch.positions), np.ones(16383, dtype=np.int64))  # one contiguous chunk
    assert int(batch.positions[0]) % 128 == 0


def test_the_earlier_serving_steps_keep_their_shapes():
    steps = _c128_steps()
    assert set(steps) == {("c128_decode_step", 64), ("c128_decode_step", 512), ("c128_prefill_step", 16384),
                          ("c128_mixed", 4608)}
    assert steps[("c128_decode_step", 512)].active is None  # random positions, as before


def test_extra_runs_the_c128_serving_steps():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    _, cases = cli.selected_cases(parser.parse_args(["--ratio", "128", "--extra"]))
    assert {("c128_decode_step", 64), ("c128_prefill_step", 16384)} <= {(c.name, c.token_num) for c in cases}


@pytest.mark.parametrize("fields", [dict(kind="decode", active=1), dict(kind="decode_step", active=65),
                                    dict(kind="decode_step", active=-1)])
def test_active_count_only_on_decode_steps_within_the_token_count(fields):
    with pytest.raises(ValueError, match="Case.active"):
        Case("c128_decode_step", "compress", 128, 8, 2, 64, **fields)


@pytest.mark.parametrize("case_name, tokens, expected", [
    ("c128_decode", 16374, ("c128_decode", 16374, 128, 512)),
    ("c128_decode_step", 512, ("c128_decode_step", 512, 128, 512)),
    ("c128_decode_step", 64, ("c128_decode_step", 64, 128, 512)),
    ("indexer_fp8", 16384, ("indexer_c4_decode_fp8", 16384, 4, 128)),
    ("c4_decode", 1024, ("c4_decode", 1024, 4, 512)),
])
def test_profile_one_runs_the_named_case(case_name, tokens, expected):
    from dsv4_compressor.bench.probe import profile_case

    case = profile_case(case_name, tokens)
    assert (case.name, case.token_num, case.compress_ratio, case.head_dim) == expected


@pytest.mark.parametrize("case_name, tokens", [("c128_decode_step", 100), ("c4_mixed_step", 8), ("nonsense", 1)])
def test_profile_one_refuses_a_case_it_does_not_have(case_name, tokens):
    from dsv4_compressor.bench.probe import profile_case

    with pytest.raises(ValueError, match="profile-one --case"):
        profile_case(case_name, tokens)


def test_profile_one_refuses_a_variant_it_does_not_have():
    """An unknown name fails before anything is prepared, naming the ones there are."""
    pytest.importorskip("torch")
    from dsv4_compressor.bench.probe import profile_one

    with pytest.raises(ValueError, match="profile-one --variant: expected auto or one of .*split_block8.*got 'nonsense'"):
        profile_one(64, "nonsense")
