"""GPU checks of the C128 handoff kernel's arrival counters.

The last of a token's 8 CTAs (found by a per-token atomic counter) finishes the token and
resets the counter, so the counters are zero between calls and a CUDA graph replays from zero.
Every case also writes the spec's bytes (:func:`cutedsl_steps.run_step`).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import Case, DeviceStep, assert_bytes, run_step  # noqa: E402

from dsv4_compressor.conformance.runner import run_spec  # noqa: E402

pytestmark = pytest.mark.gpu


def _counters(step: DeviceStep, stream: int | None = None):
    """The counter array the calls on ``stream`` (default: the current one) used, as they left it."""
    from dsv4_compressor.impl.cutedsl.host import buffers

    device = step.state.device
    return buffers._COUNTERS[(device, buffers._current_stream(device) if stream is None else stream)]


def test_handoff_counters_are_zero_between_calls():
    """The handoff kernel's last CTA of each token resets its counter: after calls of every
    size (some tokens inactive) the whole counter array of this stream is zero again."""
    for case in (Case(128, 8, 64), Case(128, 5, 2, layout="bf16")):
        step, _ = run_step(case, c128_path="fused_handoff")
        entry = _counters(step)
        assert entry.zeroed and int(torch.count_nonzero(entry.tensor)) == 0


def test_handoff_graphs_captured_before_any_eager_use_start_from_zero_counters():
    """Two graphs captured on a stream whose counter array has never been used outside capture
    (the array then holds whatever its memory held): each graph zero-fills it once, so either
    can be replayed first, whatever the array holds before the replay."""
    from dsv4_compressor.impl import cutedsl

    inputs = Case(128, 8, 2).inputs()
    expected = run_spec(inputs)
    step = DeviceStep(inputs)
    step.load_state(expected.state_after_save)  # the store alone, on the spec's post-save state
    k_clean = step.k_owner.clone()
    kwargs = dict(**step.layout_kwargs(), c128_path="fused_handoff",
                  workspace=torch.empty(step.batch.num_tokens, 512, device="cuda"))
    cutedsl.compress_norm_rope_store(**step.compress_args(), **kwargs)  # compiles, on the default stream's own array
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    for calls, graph in zip((2, 1), graphs):
        with torch.cuda.graph(graph, stream=side):
            for _ in range(calls):
                cutedsl.compress_norm_rope_store(**step.compress_args(), **kwargs)
    counters = _counters(step, side.cuda_stream).tensor
    for garbage, graph in ((5, graphs[1]), (3, graphs[0]), (7, graphs[1])):
        counters.fill_(garbage)  # no fill outside capture has run: the graph must bring its own
        step.k_owner.copy_(k_clean)
        graph.replay()
        calls = 2 if graph is graphs[0] else 1
        assert_bytes(f"graph of {calls} call(s)", inputs, "k_cache", step.k_bytes(), expected.k_cache_after_store)
        assert int(torch.count_nonzero(counters)) == 0
