"""Host time of one eager call, split into its parts: ``python -m dsv4_compressor.bench.host_time``.

    python -m dsv4_compressor.bench.host_time [--ratio 128 4] [--sizes 1 8 64 1024] [--calls 2000]
    python -m dsv4_compressor.bench.probe host ...   (the same)

For the CuTe DSL implementation, per operation and token count (µs per call, median of
several rounds of ``--calls`` calls, host clock only; on a GPU the calls are issued in
batches short enough never to fill the launch queue, with a synchronization between batches
that is not timed, so device-bound sizes still show their host time):

- ``validate``: the SPEC §9 checks of the shared front end, uncached (what the first call
  with a layout pays, and every call without a plan cache);
- ``key``: building the plan key and finding the cached plan (an unbound call);
- ``run``: the plan's own Python (stride fix-ups, scratch, counters) with the kernels replaced
  by a no-op;
- ``ffi``: the plan's TVM-FFI launches alone, on pre-built arguments (scratch and counters
  made beforehand; GPU only), through the TVM-FFI functions themselves, without the compiled
  objects' Python ``__call__``, as every plan launches (``ffi, compiled object``: through
  that ``__call__``); ``ffi, fixed held``: the same with the layer's fixed tensors converted to TVM-FFI
  tensors once, as a bound layer holds them: the launch floor of a bound call; ``ffi, all
  held`` (one-kernel paths): every tensor converted beforehand (no torch tensor left to name
  a stream: it launches on the default stream);
- ``bound python``: a bound layer's eager call with its kernels replaced by a no-op (the
  token-count lookup, the dtype checks, the scratch and counters; on a GPU the workspace is
  passed, as an engine should);
- ``torch.ops floor``: an op of the same schema whose kernel does nothing (the dispatcher's own
  cost for those arguments: what ``torch.ops`` cannot go below);
- ``call``, ``bound call``, ``torch.ops``: whole calls (the kernels run on a GPU; on a CPU
  they are replaced by a no-op, so the totals leave out the FFI cost); ``bound call, no
  workspace``: a bound call of a scratch path (C128 handoff and split) without a workspace,
  which allocates the scratch per call;
- ``save call``, ``save ffi, held`` (the save kernel on pre-built arguments with the state
  cache held), ``bound save python`` and ``bound save``: the same for ``save_partial_states``;
- Triton ``call``: a whole call of the Triton implementation (GPU only).

On a CPU the tensors are CPU tensors and the CUDA-only checks are skipped, so validation,
keys and Python overhead can be measured anywhere; only the launches need the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time

import numpy as np


NULL_OP_NAMESPACE = "dsv4_compressor_host_time"  # the ``torch.ops floor`` column's do-nothing op
_NULL_LIBRARY: list = []  # keeps that op's library alive
QUEUE_BATCH = 200  # calls issued between untimed synchronizations (a few launches each: the launch queue never fills)


def _per_call_us(fn, calls: int, rounds: int = 5, sync=None) -> float:
    """Median over ``rounds`` of the host time per call of ``calls`` calls of ``fn``; with
    ``sync`` (a GPU), in batches of :data:`QUEUE_BATCH` with an untimed ``sync()`` between them."""
    fn()
    batch = calls if sync is None else min(calls, QUEUE_BATCH)
    samples = []
    for _ in range(rounds):
        elapsed = 0.0
        for first in range(0, calls, batch):
            if sync is not None:
                sync()
            start = time.perf_counter()
            for _ in range(min(batch, calls - first)):
                fn()
            elapsed += time.perf_counter() - start
        samples.append(elapsed / calls * 1e6)
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
    from ..impl.cutedsl.host import buffers, plans

    compile_cache = plans.kernels()
    saved_kernels = dict(compile_cache.KERNELS)
    saved_facts = {name: getattr(buffers, name) for name in ("require_cuda", "sm_count", "_current_stream")}
    try:
        for name in saved_kernels:
            compile_cache.KERNELS[name] = lambda config, **_: (lambda *args: None)
        buffers.require_cuda = lambda name, tensor: None
        buffers.sm_count = lambda device: 132
        buffers._current_stream = lambda device: 0
        yield
    finally:
        compile_cache.KERNELS.update(saved_kernels)
        for name, value in saved_facts.items():
            setattr(buffers, name, value)


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
    per_token = (token_req, positions, slots, table, kv_slots)
    kw = dict(compress_ratio=ratio, layout="flashmla_fp8", fp8_scale=None)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    timed = (lambda fn: _per_call_us(fn, calls, sync=sync)) if on_gpu else (lambda fn: _per_call_us(fn, calls))
    out = {}
    with _no_launches(on_gpu):
        api.compress_norm_rope_store(*args, **kw, workspace=workspace)  # builds (and compiles) the plan
        layer = api.bind(state, k_cache, weight, cos_sin, block_size=bs, compress_ratio=ratio, rms_norm_eps=eps)
        layer.compress_norm_rope_store(*per_token, workspace=workspace)  # validated: prepares this T
        layer.save_partial_states(kv_score, ape, positions, slots)  # the same for the save kernel
        api.save_partial_states(kv_score, ape, positions, slots, state, bs)
        sync()
        out["validate"] = timed(lambda: frontend.validate_compress_norm_rope_store(
            state, token_req, positions, slots, table, bs, weight, eps, cos_sin, k_cache, kv_slots, **kw))
        def key():  # an unbound call's arguments in the records' order, its key, its plan found
            return api._compress_plan(tensors, workspace, (bs, eps, ratio, "flashmla_fp8", None, False, "auto", True,
                                                           api.DEFAULT_POLICY, False, "save", None), False)

        out["key"] = timed(key)
        plan = key()
        out["path"] = plan.path.name
        noops = tuple((lambda *a: None) for _ in plan.kernels)  # the plans launch through ``ffi``
        noop_plan = dataclasses.replace(plan, kernels=noops, ffi=noops)
        out["run"] = timed(lambda: noop_plan.run(tensors, workspace))
        if on_gpu:
            out.update(_launch_floors(plan, layer, tensors, workspace, kv_score, ape, timed))
        prepared, save_kernel = layer._launches[tokens], layer._save_kernel
        try:  # the bound calls' own Python: their kernels replaced by a no-op
            layer._launches[tokens] = noop_plan.launch_bound
            layer._save_kernel = lambda *a: None
            out["bound python"] = timed(lambda: layer.compress_norm_rope_store(*per_token, workspace=workspace))
            out["bound save python"] = timed(lambda: layer.save_partial_states(kv_score, ape, positions, slots))
        finally:
            layer._launches[tokens], layer._save_kernel = prepared, save_kernel
        out["call"] = timed(lambda: api.compress_norm_rope_store(*args, **kw, workspace=workspace))
        out["bound call"] = timed(lambda: layer.compress_norm_rope_store(*per_token, workspace=workspace))
        if plan.path.scratch:
            out["bound call, no workspace"] = timed(lambda: layer.compress_norm_rope_store(*per_token))
        op = torch.ops.dsv4_compressor.cutedsl_compress_norm_rope_store
        out["torch.ops"] = timed(lambda: op(*args, ratio, workspace=workspace))
        floor = _null_op(op)
        out["torch.ops floor"] = timed(lambda: floor(*args, ratio, workspace=workspace))
        out["save call"] = timed(lambda: api.save_partial_states(kv_score, ape, positions, slots, state, bs))
        out["bound save"] = timed(lambda: layer.save_partial_states(kv_score, ape, positions, slots))
        sync()
    if on_gpu:
        from ..impl import triton as triton_impl

        triton_impl.compress_norm_rope_store(*args, **kw)
        triton_impl.save_partial_states(kv_score, ape, positions, slots, state, bs)
        out["triton call"] = timed(lambda: triton_impl.compress_norm_rope_store(*args, **kw))
        out["triton save"] = timed(lambda: triton_impl.save_partial_states(kv_score, ape, positions, slots, state, bs))
        sync()
    return out


def _null_op(op):
    """An op of ``op``'s schema whose kernel does nothing: what the dispatcher alone costs a call
    with those arguments (defined once, in a namespace of its own)."""
    import torch

    namespace = getattr(torch.ops, NULL_OP_NAMESPACE)
    if not hasattr(namespace, "null"):
        library = torch.library.Library(NULL_OP_NAMESPACE, "FRAGMENT")
        _NULL_LIBRARY.append(library)
        schema = str(op.default._schema)  # "namespace::name(arguments) -> ()"
        library.define("null" + schema[schema.index("("):])
        library.impl("null", lambda *args: None, "CompositeExplicitAutograd")
    return namespace.null


def _launch_floors(plan, layer, tensors: tuple, workspace, kv_score, ape, timed) -> dict[str, float]:
    """The TVM-FFI launches of ``plan`` and of the layer's save kernel on pre-built arguments
    (the path's own launch, :attr:`dsv4_compressor.impl.cutedsl.host.paths.KernelPath.launch`,
    through the TVM-FFI functions a bound call calls): with torch tensors, with the layer's fixed
    tensors held as TVM-FFI tensors (a bound call's floor), through the compiled objects'
    ``__call__`` and (one-kernel paths) with every tensor held."""
    import types

    import tvm_ffi

    state, token_req, positions, slots, table, weight, cos_sin, k_cache, kv_slots = tensors
    metadata = (token_req, positions, slots, table, kv_slots)
    scratch = workspace if plan.path.scratch else None
    device = state.device

    def launches(fixed, metadata=metadata, through=plan):
        return lambda: plan.path.launch(through, (*fixed, device), metadata, scratch, plan.formats(None))

    held = layer._held[:4]
    objects = types.SimpleNamespace(ffi=plan.kernels, scalars=plan.scalars, num_tokens=plan.num_tokens)
    out = {"ffi": timed(launches((state, weight, cos_sin, k_cache))), "ffi, fixed held": timed(launches(held)),
           "ffi, compiled object": timed(launches((state, weight, cos_sin, k_cache), through=objects))}
    if len(plan.kernels) == 1 and not plan.path.counters:
        every = tuple(tvm_ffi.from_dlpack(t) for t in metadata)
        out["ffi, all held"] = timed(launches(held, every))
    save = layer._save_kernel
    out["save ffi, held"] = timed(lambda: save(kv_score, ape, positions, slots, held[0], None))  # None: mScore
    return out


COLUMNS = ("path", "validate", "key", "run", "ffi, compiled object", "ffi", "ffi, fixed held", "ffi, all held",
           "bound python", "call", "bound call", "bound call, no workspace", "torch.ops", "torch.ops floor",
           "save call", "save ffi, held", "bound save python", "bound save", "triton call", "triton save")


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
