"""GPU checks of the C128 pipelined kernel's walk: few clusters, many tokens each.

A persistent grid of ``G`` clusters, each walking a contiguous run of ``ceil(T / G)`` tokens in
ballots of 32, with the next active token's rows in flight while the current one finishes. With ``G`` capped at 1,
2 or 3 every cluster walks many batches (most of them without an active token) and pools
several active tokens back to back, the tile-sum buffers alternating between them; every case
must still write the spec's bytes (:func:`cutedsl_steps.run_step` compares the whole state and
k_cache allocations).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")

from cutedsl_steps import C128_CASES, Case, case_id, run_step  # noqa: E402

pytestmark = pytest.mark.gpu

PIPELINED_CASES = [case for case, paths in C128_CASES if "fused_pipelined" in paths]


@pytest.mark.parametrize("clusters", [1, 2, 3])
@pytest.mark.parametrize("case", PIPELINED_CASES, ids=case_id)
def test_few_clusters_walk_every_token(case, clusters):
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    policy = DEFAULT_POLICY.with_overrides(pipelined_max_clusters=clusters)
    step, _ = run_step(case, c128_path="fused_pipelined", policy=policy)
    assert step.batch.num_tokens > 32 * clusters  # more than one ballot per cluster


@pytest.mark.parametrize("overrides", [dict(pdl=False), dict(early_metadata=True)],
                         ids=lambda o: next(iter(o)))
def test_launch_options_keep_the_bytes(overrides):
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    fields = {k: v for k, v in overrides.items() if k != "pdl"}
    pdl = overrides.get("pdl", True)
    policy = DEFAULT_POLICY.with_overrides(pipelined_max_clusters=2, **fields)
    run_step(Case(128, 8, 64), c128_path="fused_pipelined", policy=policy, pdl=pdl)
    run_step(Case(128, 5, 2, layout="bf16", values="huge"), c128_path="fused_pipelined", policy=policy, pdl=pdl)


@pytest.mark.parametrize("ctas_per_sm", [2, 3])
def test_grid_is_as_many_clusters_as_the_device_holds(ctas_per_sm):
    """The driver's count of resident 8-CTA clusters is at most the SM slots allow (clusters
    live inside a GPC, so it may be fewer), and a large call's grid is exactly that count."""
    from dsv4_compressor.impl.cutedsl.host import buffers, compile_cache, occupancy
    from dsv4_compressor.impl.cutedsl.host.paths import PATHS, PathRequest
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY
    from dsv4_compressor.impl.cutedsl.kernels.fused_pipelined import FusedPipelinedKernel

    device = torch.device("cuda")
    policy = DEFAULT_POLICY.with_overrides(pipelined_ctas_per_sm=ctas_per_sm)
    path = PATHS["fused_pipelined"]
    request = PathRequest(128, 8, 100000, "flashmla_fp8", 64, "bfloat16", 16, False, policy, True)
    configs = path.configs(request)
    compiled, _ = compile_cache.compile_path(path, configs)
    grid = (occupancy.persistent_grid(compiled[0], configs[0], request,
                                      buffers.LaunchFacts(device, 16, buffers.sm_count(device))),)
    kernel = FusedPipelinedKernel(path.configs(request)[0])
    resident = occupancy.resident_clusters(compiled[0], device, kernel.threads, kernel.smem_bytes, kernel.tiles)
    slots = buffers.sm_count(device) * ctas_per_sm // kernel.tiles
    print(f"resident 8-CTA clusters at {ctas_per_sm} CTAs per SM: {resident} (SM slots: {slots})")
    assert resident is not None and 1 <= resident <= slots and grid == (resident,)


def test_cluster_count_is_asked_before_torch_has_touched_the_device():
    """In a fresh process whose first CUDA work is the occupancy query (no tensor allocated, no
    kernel launched, so no context current yet) the driver still answers: the query makes the
    primary context current itself rather than sizing the grid from the SM count."""
    import subprocess
    import sys

    program = (
        "import torch\n"
        "from dsv4_compressor.impl.cutedsl.host import compile_cache, occupancy\n"
        "from dsv4_compressor.impl.cutedsl.host.paths import PATHS, PathRequest\n"
        "from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY\n"
        "from dsv4_compressor.impl.cutedsl.kernels.fused_pipelined import FusedPipelinedKernel\n"
        "path = PATHS['fused_pipelined']\n"
        "request = PathRequest(128, 8, 100000, 'flashmla_fp8', 64, 'bfloat16', 16, False, DEFAULT_POLICY, True)\n"
        "configs = path.configs(request)\n"
        "compiled, _ = compile_cache.compile_path(path, configs)\n"
        "kernel = FusedPipelinedKernel(configs[0])\n"
        "print(occupancy.resident_clusters(compiled[0], torch.device('cuda'), kernel.threads, kernel.smem_bytes,"
        " kernel.tiles))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no cluster occupancy" not in done.stderr, done.stderr[-2000:]
    resident = int(done.stdout.strip().splitlines()[-1])
    assert 1 <= resident <= torch.cuda.get_device_properties(0).multi_processor_count
