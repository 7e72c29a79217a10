"""pytest-benchmark cases (GPU only): ``pytest bench --benchmark-compare`` tracks them across
commits. Each benchmark times CUDA-graph replays of calls that rotate through the case's
input sets (as many as keep the reads out of L2); the reported time is per replay, whose calls
``extra_info`` records."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

CALLS = 20  # calls per replay at least
IMPLS = ["triton", "cutedsl", "cutedsl-split_block8", "cutedsl-cluster8", "cutedsl-fused_handoff"]


def _cases():
    from dsv4_compressor.bench.cases import c4_decode_sweep, c128_decode_sweep, save_sweep

    return (c128_decode_sweep((1, 64, 1024, 16374)) + c4_decode_sweep((1, 128, 16384))
            + [c for c in save_sweep((1024,))])


@pytest.fixture(scope="module")
def prepared_cases():
    from dsv4_compressor.bench.timing import prepare

    cache = {}

    def get(case):
        if case not in cache:
            cache.clear()  # one case's buffers at a time (C128 at 16374 tokens is 34 GB)
            torch.cuda.empty_cache()
            cache[case] = prepare(case)
        return cache[case]

    return get


@pytest.mark.parametrize("impl_name", IMPLS)
@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c.name}-{c.token_num}")
def test_graph_replay(benchmark, prepared_cases, impl_name, case):
    from dsv4_compressor.bench.sweep import load_bench_impl
    from dsv4_compressor.bench.timing import capture_graph

    impl = load_bench_impl(impl_name)
    if not impl.runs(case):
        pytest.skip("named variants differ only in C128 compress paths")
    prepared = prepared_cases(case)
    call = impl.caller(prepared)
    calls = max(CALLS, len(prepared.sets))
    graph = capture_graph(call, prepared.sets, calls)

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.extra_info.update(token_num=case.token_num, calls_per_replay=calls, bytes_per_call=prepared.bytes_moved)
    benchmark.pedantic(replay, rounds=20, warmup_rounds=3, iterations=1)
