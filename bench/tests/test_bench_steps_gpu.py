"""The step benchmarks' timing on a GPU: every call of a small case of each suite is warmed up,
captured in a CUDA graph and timed, eager and replayed, with no error (the CPU tests cover what
each call writes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.parametrize("suite", ["state-step", "state-dense", "v41", "v41-index-key"])
def test_every_call_of_a_small_case_is_timed_eager_and_in_a_graph(suite):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dsv4_compressor.bench import state_steps as S
    from dsv4_compressor.bench import v41_steps as V
    from dsv4_compressor.bench.step_runner import run_calls
    from dsv4_compressor.impl import triton as T

    if suite.startswith("state"):
        case = (S.serving_steps(("ring",), ("bf16",))[0] if suite == "state-step" else S.dense_sweeps((4,), (64,))[0])
        case = case.dry_run_version()
        prepared, refusal = S.prepare_state(case, "cuda", num_sets=3)
        calls = S.state_calls(case, T, refusal)
    else:
        case = (V.steps((2,), ("fp32",))[2] if suite == "v41" else V.index_key_sweeps((2,), (64,))[0]).dry_run_version()
        prepared = V.prepare_v41(case, "cuda", num_sets=3)
        calls = V.v41_calls(case, [V.load_v41_impl("triton"), V.load_v41_impl("triton-split")])
    rows = run_calls(prepared, calls, ["eager", "graph"], copy_gbs=3000.0, trials=1)
    assert {(r.implementation, r.mode) for r in rows} == {(n, m) for n in calls for m in ("eager", "graph")}
    for r in rows:
        assert (r.error.startswith("unsupported") if isinstance(calls[r.implementation], str)
                else not r.error and r.median_us > 0), r
