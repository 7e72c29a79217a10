"""Run cases x implementations x modes; one row per (case, implementation, mode)."""

from __future__ import annotations

import functools
import importlib
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ..impl.cutedsl.variants import INDEXER_VARIANTS, VARIANTS
from .cases import Case
from .timing import BenchImpl, Prepared, capture_graph, prepare, summarize, time_eager, time_graph

TARGET_TRIAL_MS = 25.0  # each trial runs about this long
TRIALS = 5


def _cutedsl():
    def load():
        module = importlib.import_module("dsv4_compressor.impl.cutedsl")
        return BenchImpl("cutedsl", module.compress_norm_rope_store, module.save_partial_states)
    return load


def _cutedsl_variant(variant, **belongs):
    """A named CuTe DSL variant (:mod:`dsv4_compressor.impl.cutedsl.variants`); ``belongs``: the
    :class:`BenchImpl` flag naming the cases where it differs from the dispatcher."""
    def load():
        return BenchImpl(f"cutedsl-{variant.name}", variant.compress_norm_rope_store, variant.save_partial_states,
                         **belongs)
    return load


def _cutedsl_bound():
    """CuTe DSL through :func:`dsv4_compressor.impl.cutedsl.bind`, as an engine calls it: one
    bound layer per input set (for a save case, :func:`_save_layer`), and each set's call
    made beforehand (``layer.compress_norm_rope_store(per-token arrays, workspace=...)`` or
    ``layer.save_partial_states(...)``), so the eager loop's host time is the bound call's."""
    def load():
        cutedsl = importlib.import_module("dsv4_compressor.impl.cutedsl")

        def prepare_calls(prepared: Prepared) -> dict:
            case, calls = prepared.case, {}
            for s in prepared.sets:
                if case.operation == "save":
                    kv_score, ape, positions, slot_mapping, state_cache, block_size = s.args
                    layer = _save_layer(cutedsl, state_cache, block_size, ape.shape[0])
                    calls[id(s)] = functools.partial(layer.save_partial_states, kv_score, ape, positions, slot_mapping)
                    continue
                (state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
                 rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping) = s.args
                layer = cutedsl.bind(state_cache, k_cache, rms_norm_weight, cos_sin_cache, block_size=block_size,
                                     rms_norm_eps=rms_norm_eps, **s.kwargs)
                calls[id(s)] = functools.partial(layer.compress_norm_rope_store, token_to_req_indices, positions,
                                                 slot_mapping, block_table, kv_slot_mapping, workspace=s.workspace)
            return calls

        return BenchImpl("cutedsl-bound", None, None, prepare_calls=prepare_calls)
    return load


def _save_layer(cutedsl, state_cache, block_size: int, compress_ratio: int):
    """A layer bound for its ``save_partial_states`` alone (the save cases have a state cache
    and no compressed cache): the compressed cache, norm weight and cos/sin cache are minimal
    stand-ins of the state's head width, which the save never reads."""
    from ..spec.constants import HEAD_DIMS, ratio_config
    from ..spec.entry_layout import PAGED_LAYOUTS

    head_dim = next(h for h in HEAD_DIMS if ratio_config(compress_ratio, h).state_row_width == state_cache.shape[2])
    layout = "flashmla_fp8" if head_dim == 512 else "indexer_fp8"
    device = state_cache.device
    k_cache = torch.zeros((1, 1, PAGED_LAYOUTS[layout].entry_bytes), dtype=torch.uint8, device=device)
    return cutedsl.bind(state_cache, k_cache, torch.ones(head_dim, device=device), torch.zeros((1, 64), device=device),
                        block_size=block_size, compress_ratio=compress_ratio, rms_norm_eps=1e-6, layout=layout)


def _custom_ops(prefix: str):
    """An implementation through its ``torch.ops.dsv4_compressor.<prefix>_*`` custom ops."""
    def load():
        importlib.import_module(f"dsv4_compressor.impl.{prefix}")  # registers the ops
        compress_op = getattr(torch.ops.dsv4_compressor, f"{prefix}_compress_norm_rope_store")
        save_op = getattr(torch.ops.dsv4_compressor, f"{prefix}_save_partial_states")

        def compress(*args, compress_ratio, layout="flashmla_fp8", fp8_scale=None, hadamard=False):
            compress_op(*args, compress_ratio, layout, fp8_scale, hadamard=hadamard)

        def compress_with_workspace(*args, compress_ratio, layout="flashmla_fp8", fp8_scale=None, hadamard=False,
                                    workspace=None):
            compress_op(*args, compress_ratio, layout, fp8_scale, hadamard=hadamard, workspace=workspace)

        return BenchImpl(f"{prefix}-op", compress_with_workspace if prefix == "cutedsl" else compress,
                         save_op)
    return load


def _module(name: str, module_name: str):
    def load():
        module = importlib.import_module(module_name)
        return BenchImpl(name, module.compress_norm_rope_store, module.save_partial_states)
    return load


def _triton_indexer(block_c: int, num_warps: int):
    """The Triton indexer kernel with other knobs than its default (a row of the ``--head 128`` sweep)."""
    def load():
        module = importlib.import_module("dsv4_compressor.impl.triton")
        config = module.FusedConfig(block_c=block_c, num_warps=num_warps)
        return BenchImpl(f"triton-indexer_bc{block_c}_w{num_warps}",
                         functools.partial(module.compress_norm_rope_store, config=config), module.save_partial_states,
                         indexer_compress_only=True)
    return load


# name -> loader; each named CuTe DSL variant (a forced C128 path and knobs,
# dsv4_compressor.impl.cutedsl.variants, which needs torch only) is a separate row
REGISTRY = {
    "triton": _module("triton", "dsv4_compressor.impl.triton"),
    "cutedsl": _cutedsl(),
    "cutedsl-bound": _cutedsl_bound(),
    "cutedsl-op": _custom_ops("cutedsl"),
    "triton-op": _custom_ops("triton"),
    **{f"cutedsl-{name}": _cutedsl_variant(v, c128_compress_only=v.c128_compress_only) for name, v in VARIANTS.items()},
    # the indexer kernel's knobs (C4: the default is block_c 128 with 2 warps)
    **{f"triton-indexer_bc{c}_w{w}": _triton_indexer(c, w) for c, w in ((128, 4), (64, 4), (128, 1))},
    # the CuTe DSL indexer's knobs (rows of the --head 128 sweep's compress cases)
    **{f"cutedsl-{name}": _cutedsl_variant(v, indexer_compress_only=True) for name, v in INDEXER_VARIANTS.items()},
}


def lab_setting(name: str):
    """``cutedsl-<setting>`` of the tuner's generated space (:func:`.cutedsl_tune.settings`), or None."""
    from .cutedsl_tune import named_setting

    found = named_setting(name)
    if found is None:
        return None
    ratio, variant = found
    return _cutedsl_variant(variant, c128_compress_only=ratio == 128 and variant.c128_compress_only)


def load_bench_impl(name: str) -> BenchImpl:
    """A registry name, a tuner setting (``cutedsl-fused_cluster+cluster.tile=32``), or
    ``module:attribute`` of an object with the two operations."""
    if name in REGISTRY:
        return REGISTRY[name]()
    setting = lab_setting(name)
    if setting is not None:
        return setting()
    if ":" in name:
        from ..conformance.implementations import load_implementation

        loaded = load_implementation(name)
        return BenchImpl(name, loaded.target.compress_norm_rope_store, loaded.target.save_partial_states)
    raise ValueError(f"--impl: expected one of {sorted(REGISTRY)} or module:attribute, got {name!r}")


@dataclass
class Row:
    case: str
    operation: str
    token_num: int
    active: int
    implementation: str
    mode: str  # eager / graph
    median_us: float | None
    low_us: float | None
    high_us: float | None
    host_us: float | None
    bytes_moved: int
    gbs: float | None
    pct_copy: float | None
    error: str = ""
    variant: str = ""  # the step benchmarks' state or input format (e.g. "ring bf16"); "" elsewhere

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RowLabel:
    """What a row is about (all but the implementation and the mode)."""

    case: str  # the table, e.g. "c128_decode" or "c128_prefill_step"
    operation: str  # "compress", "save", "step" or "index_key"
    token_num: int
    active: int
    variant: str = ""  # the step benchmarks' format, e.g. "ring bf16" or "fp32 kv/score"

    def row(self, name: str, mode: str, bytes_moved: int, timing=None, copy_gbs: float | None = None,
            error: str = "") -> Row:
        """The row of implementation ``name`` in ``mode``: its :class:`.timing.Timing` (bandwidth
        against ``copy_gbs``), or none and ``error``."""
        if timing is None:
            return Row(self.case, self.operation, self.token_num, self.active, name, mode, None, None, None, None,
                       bytes_moved, None, None, error, self.variant)
        gbs = bytes_moved / (timing.median_us * 1e-6) / 1e9
        return Row(self.case, self.operation, self.token_num, self.active, name, mode, timing.median_us, timing.low_us,
                   timing.high_us, timing.host_us, bytes_moved, gbs, 100.0 * gbs / copy_gbs, "", self.variant)


def describe_error(error: Exception) -> str:
    """An error's first line, as a row reports it."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def _iterations(call, sets: list) -> int:
    """Calls per trial so one trial lasts about TARGET_TRIAL_MS (from one timed call)."""
    per_call, _ = time_eager(call, sets, len(sets))
    return max(len(sets), min(2000, int(TARGET_TRIAL_MS * 1e3 / max(per_call, 1.0))))


def time_calls(calls: dict, sets: list, modes: list[str], trials: int, describe=describe_error) -> dict:
    """Time every call (name -> a function of one input set, or a str: why it cannot run) in every
    mode over ``sets``, trials interleaved across the calls: name -> {mode: Timing}, or the error
    (the str given, or ``describe`` of what the call raised while warming up or being captured)."""
    iterations, graphs, results = {}, {}, {}
    for name, call in calls.items():
        if isinstance(call, str):
            results[name] = call
            continue
        try:
            for s in sets:  # compile and warm up
                call(s)
            torch.cuda.synchronize()
            iterations[name] = _iterations(call, sets)
            if "graph" in modes:
                count = max(len(sets), min(iterations[name], 200))
                graphs[name] = (capture_graph(call, sets, count), count)
        except Exception as error:  # report and go on with the other calls
            results[name] = describe(error)
            iterations.pop(name, None)
            torch.cuda.synchronize()
    samples = {(n, m): [] for n in iterations for m in modes}
    hosts = {n: [] for n in iterations}
    for _ in range(trials):
        for name, iters in iterations.items():
            if "eager" in modes:
                device_us, host_us = time_eager(calls[name], sets, iters)
                samples[(name, "eager")].append(device_us)
                hosts[name].append(host_us)
            if "graph" in modes:
                graph, count = graphs[name]
                samples[(name, "graph")].append(time_graph(graph, count, max(1, iters // count)))
    for name in iterations:
        results[name] = {m: summarize(samples[(name, m)], hosts[name] if m == "eager" else None) for m in modes}
    del graphs
    torch.cuda.empty_cache()
    return results


def timed_rows(label: RowLabel, results: dict, names, modes: list[str], bytes_moved: int, copy_gbs: float) -> list[Row]:
    """The rows of :func:`time_calls`' ``results`` for each of ``names`` in turn, every mode of a call together."""
    return [label.row(name, mode, bytes_moved, error=results[name]) if isinstance(results[name], str)
            else label.row(name, mode, bytes_moved, results[name][mode], copy_gbs)
            for name in names for mode in modes]


def run_case(case: Case, impls: list[BenchImpl], modes: list[str], copy_gbs: float, trials: int = TRIALS,
             num_sets: int | None = None) -> list[Row]:
    """Time ``case`` for every implementation and mode, trials interleaved across implementations;
    ``num_sets`` input sets (default: as many as keep the reads out of L2, :func:`.timing.rotation_sets`)."""
    prepared = prepare(case, num_sets)
    calls = {}
    for impl in impls:
        try:
            calls[impl.name] = impl.caller(prepared)
        except Exception as error:  # no such operation: report and go on with the other implementations
            calls[impl.name] = describe_error(error)
    results = time_calls(calls, prepared.sets, modes, trials)
    label = RowLabel(case.name, case.operation, case.token_num, prepared.num_active)
    rows = timed_rows(label, results, [i.name for i in impls], modes, prepared.bytes_moved, copy_gbs)
    del prepared
    torch.cuda.empty_cache()
    return rows


def run_sweep(cases: list[Case], impls: list[BenchImpl], modes: list[str], copy_gbs: float, progress=True,
              num_sets: int | None = None, trials: int = TRIALS) -> list[Row]:
    rows = []
    started = time.perf_counter()
    for index, case in enumerate(cases, 1):
        if progress:
            print(f"\r[{index}/{len(cases)}] {case.name} token_num={case.token_num} ({time.perf_counter() - started:.0f}s)   ",
                  end="", file=sys.stderr, flush=True)
        case_rows = run_case(case, [i for i in impls if i.runs(case)], modes, copy_gbs, trials, num_sets)
        rows.extend(case_rows)
        if progress:  # one line per row as it lands, so a cut-off run still leaves its numbers
            for r in case_rows:
                print(f"\nrow {r.case} n={r.token_num} {r.implementation} {r.mode}: "
                      f"{'-' if r.median_us is None else f'{r.median_us:.2f}'} us "
                      f"[{'-' if r.low_us is None else f'{r.low_us:.2f}'}..{'-' if r.high_us is None else f'{r.high_us:.2f}'}] "
                      f"{'' if r.pct_copy is None else f'{r.pct_copy:.1f}% copy '}"
                      f"{'' if r.host_us is None else f'host {r.host_us:.1f} us '}{r.error}", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return rows


@functools.cache
def gpu_name() -> str:
    return torch.cuda.get_device_name()
