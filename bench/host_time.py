"""Host time of one eager call, split into its parts: ``python -m dsv4_compressor.bench.host_time``.

    python -m dsv4_compressor.bench.host_time [--ratio 128 4] [--sizes 1 8 64 1024] [--calls 2000]
    python -m dsv4_compressor.bench.probe host ...   (the same)

For the CuTe DSL implementation, per operation and token count (µs per call, median of
several rounds of ``--calls`` calls, host clock only):

- ``validate``: the SPEC §9 checks of the shared front end, uncached (what the first call
  with a layout pays, and every call without a plan cache);
- ``key``: building the plan key and finding the cached plan (an unbound call);
- ``bound key``: the same for a :func:`bind` operator (only per-token arrays keyed);
- ``run``: the plan's own Python (stride fix-ups, scratch, counters) with the kernels replaced
  by a no-op;
- ``ffi``: the TVM-FFI launches alone (GPU only); for a one-kernel path also with the layer's
  fixed tensors (``ffi, fixed held``) or every tensor (``ffi, all held``) converted to TVM-FFI
  tensors once, beforehand: what the torch-to-DLPack conversion costs per call;
- ``call``, ``bound call``, ``torch.ops``: whole calls (the kernels run on a GPU; on a CPU
  they are replaced by a no-op, so the totals leave out the FFI cost);
- Triton ``call``: a whole call of the Triton implementation (GPU only).

On a CPU the tensors are CPU tensors and the CUDA-only checks are skipped, so validation,
keys and Python overhead can be measured anywhere; only the launches need the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import numpy as np


def _per_call_us(fn, calls: int, rounds: int = 5) -> float:
    fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _arguments(ratio: int, tokens: int, device):
    """A decode-boundary step's arguments (the benchmark's own batches) on ``device``."""
    import torch

    from ..spec import batch as B
    from ..spec.constants import HEAD_DIM, ratio_config
    from .cases import c4_decode_sweep, c128_decode_sweep
    from .timing import _k_cache

    case = (c128_decode_sweep if ratio == 128 else c4_decode_sweep)((tokens,))[0]
    batch = case.batch(np.random.default_rng(0))
    width = ratio_config(ratio).state_row_width

    def t(array):
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    state = torch.zeros((max(batch.num_state_blocks, 1), case.block_size, width), device=device)
    k_cache = _k_cache(case.layout, max(batch.num_pages, 1), case.entries_per_page, device=device)
    args = (state, t(batch.token_to_req_indices), t(batch.positions), t(batch.slot_mapping), t(batch.block_table),
            case.block_size, t(B.random_norm_weight(np.random.default_rng(1), bf16=False)), 1e-6,
            t(B.rope_cos_sin_cache(int(batch.positions.max()) + 1)), k_cache, t(batch.kv_slot_mapping))
    kv_score = torch.zeros((tokens, width), device=device)
    ape = torch.zeros((ratio, width // 2), device=device)
    workspace = torch.empty((tokens, HEAD_DIM), device=device)
    return args, kv_score, ape, workspace


@contextlib.contextmanager
def _no_launches(on_gpu: bool):
    """Off a GPU: compiled kernels replaced by a no-op and the CUDA checks skipped."""
    if on_gpu:
        yield
        return
    from ..impl.cutedsl import launch

    compile_cache = launch.kernels()
    names = ("compile_c4", "compile_c128_cluster", "compile_c128_handoff", "compile_c128_pool",
             "compile_c128_store", "compile_save")
    saved = {name: getattr(compile_cache, name) for name in names}
    saved_launch = {name: getattr(launch, name) for name in ("_require_cuda", "sm_count", "_current_stream")}
    try:
        for name in names:
            setattr(compile_cache, name, lambda config, **_: (lambda *args: None))
        launch._require_cuda = lambda name, tensor: None
        launch.sm_count = lambda device: 132
        launch._current_stream = lambda device: 0
        yield
    finally:
        for name, value in saved.items():
            setattr(compile_cache, name, value)
        for name, value in saved_launch.items():
            setattr(launch, name, value)


def measure(ratio: int, tokens: int, calls: int, device) -> dict[str, float]:
    """``{part: µs per call}`` for one C``ratio`` step of ``tokens`` tokens."""
    import torch

    from ..impl import frontend
    from ..impl.cutedsl import api
    from ..impl.cutedsl import ops as _ops  # noqa: F401  (registers torch.ops.dsv4_compressor.*)

    on_gpu = device.type == "cuda"
    args, kv_score, ape, workspace = _arguments(ratio, tokens, device)
    state, token_req, positions, slots, table, bs, weight, eps, cos_sin, k_cache, kv_slots = args
    tensors = (state, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots)
    kw = dict(compress_ratio=ratio, layout="flashmla_fp8", fp8_scale=None)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    out = {}
    with _no_launches(on_gpu):
        api.compress_norm_rope_store(*args, **kw, workspace=workspace)  # builds (and compiles) the plan
        layer = api.bind(state, k_cache, weight, cos_sin, block_size=bs, compress_ratio=ratio, rms_norm_eps=eps)
        layer.compress_norm_rope_store(token_req, positions, slots, table, kv_slots, workspace=workspace)
        layer.save_partial_states(kv_score, ape, positions, slots)
        api.save_partial_states(kv_score, ape, positions, slots, state, bs)
        sync()
        out["validate"] = _per_call_us(lambda: frontend._validate_compress_norm_rope_store(
            state, token_req, positions, slots, table, bs, weight, eps, cos_sin, k_cache, kv_slots, **kw), calls)
        plan_args = (tensors, bs, eps, ratio, "flashmla_fp8", None, False, False, workspace, "auto", True, api.DEFAULT_POLICY,
                     False)
        out["key"] = _per_call_us(lambda: api._compress_plan(*plan_args), calls)
        out["bound key"] = _per_call_us(lambda: layer._compress_plan(token_req, positions, slots, table, kv_slots,
                                                                     workspace, False, False), calls)
        plan = api._compress_plan(*plan_args)
        out["path"] = plan.path
        if on_gpu:
            kernels = plan.kernels
            object.__setattr__(plan, "kernels", tuple((lambda *a: None) for _ in kernels))
            out["run"] = _per_call_us(lambda: plan.run(*tensors, workspace), calls)
            object.__setattr__(plan, "kernels", kernels)
            if len(kernels) == 1:
                extra = plan.grid
                if plan.path == "fused_handoff":
                    from ..impl.cutedsl import launch

                    counters = launch.handoff_counters(device, tokens)
                    out["ffi"] = _per_call_us(lambda: kernels[0](*tensors, workspace, counters, plan.eps, plan.fp8_inv,
                                                                 *extra), calls)
                else:
                    out["ffi"] = _per_call_us(lambda: kernels[0](*tensors, plan.eps, plan.fp8_inv, *extra), calls)
                    # the same launch with TVM-FFI tensors made once: the layer's fixed tensors, then all of them
                    import tvm_ffi

                    fixed = {0, 5, 6, 7}  # state cache, norm weight, cos/sin, k_cache
                    held = [tvm_ffi.from_dlpack(t) if i in fixed else t for i, t in enumerate(tensors)]
                    out["ffi, fixed held"] = _per_call_us(lambda: kernels[0](*held, plan.eps, plan.fp8_inv, *extra),
                                                          calls)
                    every = [tvm_ffi.from_dlpack(t) for t in tensors]
                    out["ffi, all held"] = _per_call_us(lambda: kernels[0](*every, plan.eps, plan.fp8_inv, *extra),
                                                        calls)
                sync()
        else:
            out["run"] = _per_call_us(lambda: plan.run(*tensors, workspace), calls)
        out["call"] = _per_call_us(lambda: api.compress_norm_rope_store(*args, **kw, workspace=workspace), calls)
        out["bound call"] = _per_call_us(lambda: layer.compress_norm_rope_store(
            token_req, positions, slots, table, kv_slots, workspace=workspace), calls)
        op = torch.ops.dsv4_compressor.cutedsl_compress_norm_rope_store
        out["torch.ops"] = _per_call_us(lambda: op(*args, ratio, workspace=workspace), calls)
        out["save call"] = _per_call_us(lambda: api.save_partial_states(kv_score, ape, positions, slots, state, bs),
                                        calls)
        out["bound save"] = _per_call_us(lambda: layer.save_partial_states(kv_score, ape, positions, slots), calls)
        sync()
    if on_gpu:
        from ..impl import triton as triton_impl

        triton_impl.compress_norm_rope_store(*args, **kw)
        triton_impl.save_partial_states(kv_score, ape, positions, slots, state, bs)
        out["triton call"] = _per_call_us(lambda: triton_impl.compress_norm_rope_store(*args, **kw), calls)
        out["triton save"] = _per_call_us(lambda: triton_impl.save_partial_states(kv_score, ape, positions, slots,
                                                                                  state, bs), calls)
        sync()
    return out


COLUMNS = ("path", "validate", "key", "bound key", "run", "ffi", "ffi, fixed held", "ffi, all held", "call",
           "bound call", "torch.ops", "save call", "bound save", "triton call", "triton save")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor.bench.host_time", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser) -> None:
    parser.add_argument("--ratio", type=int, nargs="*", default=[4, 128], choices=(4, 128))
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 8, 64, 1024])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")


def run(args) -> int:
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for ratio in args.ratio:
        for tokens in args.sizes:
            rows.append((ratio, tokens, measure(ratio, tokens, args.calls, device)))
    columns = [c for c in COLUMNS if any(c in r for _, _, r in rows)]
    print(f"host µs per call on {device} ({'kernels launched' if device.type == 'cuda' else 'no launches'})\n")
    print("| C | T | " + " | ".join(columns) + " |\n|---|---|" + "---|" * len(columns))
    for ratio, tokens, r in rows:
        cells = [r[c] if isinstance(r.get(c), str) else (f"{r[c]:.1f}" if c in r else "") for c in columns]
        print(f"| {ratio} | {tokens} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
