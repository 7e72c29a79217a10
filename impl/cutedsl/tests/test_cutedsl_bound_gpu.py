"""GPU checks of the bound layers' eager path, against the NumPy specification and SPEC §9.

A bound call whose token count is prepared launches its kernels through TVM-FFI with no
validation in Python but a few dtype checks (see ``dsv4_compressor.impl.cutedsl.api.BoundLayer``).
Here, with the real TVM-FFI checks: bound calls write the spec's bytes (the caches' whole
allocations, padding and canaries included: the conformance suite's buffers) for T = 0, 1, 2, 64, 1024 on the C4, C128 (cluster, handoff, split)
and indexer paths, eagerly and inside a CUDA graph; every bad per-token argument, block
table, workspace or save input raises SPEC §9's ``ValueError`` naming it, with nothing
written; and the layer keeps working after a refused call.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")

from dsv4_compressor import spec  # noqa: E402
from dsv4_compressor.conformance.buffers import Buffer  # noqa: E402
from dsv4_compressor.conformance.runner import to_torch  # noqa: E402
from dsv4_compressor.spec import batch as B  # noqa: E402

from cutedsl_test_calls import BAD_SAVES, strided, unsigned, unvalidated  # noqa: E402,F401

pytestmark = pytest.mark.gpu

PER_TOKEN = ("token_to_req_indices", "positions", "slot_mapping", "block_table", "kv_slot_mapping")


@dataclass(frozen=True)
class Step:
    """A step of ``tokens`` decode tokens (about half of them, an eighth from 1024 on, closing a window)."""

    ratio: int
    tokens: int
    layout: str = "flashmla_fp8"
    hadamard: bool = False
    path: str = "auto"

    @property
    def fp8_scale(self) -> float | None:
        return 0.0371 if self.layout == "fp8_per_tensor" else None

    @property
    def head_dim(self) -> int:
        return 128 if self.layout.startswith("indexer") else 512

    @property
    def block_size(self) -> int:
        if self.ratio == 128:
            return 8
        return B.INDEXER_STATE_BLOCK_SIZE[4] if self.head_dim == 128 else 4

    @property
    def name(self) -> str:
        return f"C{self.ratio}-T{self.tokens}-{self.layout}{'-hadamard' if self.hadamard else ''}-{self.path}"


@functools.lru_cache(maxsize=None)
def _numpy_step(step: Step):
    """The step's NumPy inputs (the caches as conformance Buffers: whole allocations, padding
    included) and the spec's k_cache allocation after the call (computed once per step)."""
    rng = np.random.default_rng(0)
    tokens = max(step.tokens, 1)  # T = 0 calls take the per-token arrays' empty slices
    closing = max(1, tokens // 8 if tokens >= 1024 else (tokens + 1) // 2)
    requests = (B.decode_requests(closing, step.ratio, rng, boundary=True, max_entries=8)
                + B.decode_requests(tokens - closing, step.ratio, rng, boundary=False, max_entries=8))
    batch = B.build_batch(requests, compress_ratio=step.ratio, block_size=step.block_size, entries_per_page=64,
                          rng=rng, drop_entry_fraction=0.1 if tokens > 2 else 0.0)
    state = Buffer.of(B.random_state_cache(batch.num_state_blocks, step.block_size, step.ratio, rng, row_pad=4,
                                           block_pad_rows=1, head_dim=step.head_dim))
    weight = B.random_norm_weight(rng, bf16=True, head_dim=step.head_dim)
    k_cache = _canary_k_cache(step, batch.num_pages)
    cos_sin = B.rope_cos_sin_cache(int(batch.positions.max()) + 1)
    expected, k = k_cache.numpy_copy()
    if step.tokens:
        spec.compress_norm_rope_store(state.numpy_copy()[1], batch.token_to_req_indices, batch.positions,
                                      batch.slot_mapping, batch.block_table, batch.block_size, weight, 1e-6, cos_sin,
                                      k, batch.kv_slot_mapping, compress_ratio=step.ratio, layout=step.layout,
                                      fp8_scale=step.fp8_scale, hadamard=step.hadamard, debug=True)
    return batch, state, weight, cos_sin, k_cache, expected


def _canary_k_cache(step: Step, num_pages: int) -> Buffer:
    if step.layout in ("bf16", "fp8_per_tensor"):  # [P, B, 512], an entry of padding after each page
        dtype = np.uint16 if step.layout == "bf16" else np.uint8
        fill = B.CANARY_BYTE * (0x0101 if dtype == np.uint16 else 1)
        view = B.padded_view((num_pages, 64, 512), dtype, (0, 1, 0), fill)
        return Buffer.of(view, "bfloat16" if step.layout == "bf16" else "float8_e4m3fn")
    return Buffer.of(B.canary_k_cache(step.layout, num_pages, 64, page_pad_bytes=32))


@dataclass
class Arguments:
    """One step's CUDA arguments: the caches' whole allocations (uint8) and the call's tensors."""

    state_owner: torch.Tensor
    k_owner: torch.Tensor
    tensors: dict  # compress_norm_rope_store's tensor arguments by name

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def build(step: Step):
    """``(fresh CUDA arguments, the spec's k_cache allocation, the canary one)``."""
    batch, state, weight, cos_sin, k_cache, expected = _numpy_step(step)
    state_owner, state_view = state.torch_copy("cuda")
    k_owner, k_view = k_cache.torch_copy("cuda")
    tensors = {name: to_torch(getattr(batch, name), "cuda") for name in PER_TOKEN}
    tensors.update(state_cache=state_view, k_cache=k_view, rms_norm_weight=to_torch(weight, "cuda"),
                   cos_sin_cache=to_torch(cos_sin, "cuda"))
    return Arguments(state_owner, k_owner, tensors), expected, k_cache.owner


def bind(step: Step, args: Arguments):
    from dsv4_compressor.impl import cutedsl

    return cutedsl.bind(args["state_cache"], args["k_cache"], args["rms_norm_weight"], args["cos_sin_cache"],
                        block_size=step.block_size, compress_ratio=step.ratio, rms_norm_eps=1e-6, layout=step.layout,
                        fp8_scale=step.fp8_scale, hadamard=step.hadamard, c128_path=step.path)


def per_token(args: Arguments, tokens: int) -> list:
    arrays = [args[n] for n in PER_TOKEN]
    if tokens == 0:
        arrays = [a[:0] if n != "block_table" else a for n, a in zip(PER_TOKEN, arrays)]
    return arrays


def reset(args: Arguments, canary: np.ndarray) -> None:
    args.k_owner.copy_(torch.from_numpy(canary))


def assert_same_bytes(name: str, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape, (name, got.shape, expected.shape)
    diff = np.flatnonzero(got != expected)
    assert diff.size == 0, f"{name}: {diff.size} bytes differ, first at byte {diff[0]}: got {got[diff[0]]}, " \
                           f"expected {expected[diff[0]]}"


def check(name: str, args: Arguments, expected: np.ndarray, state_before: np.ndarray) -> None:
    """The k_cache allocation is ``expected`` and the state cache's is unchanged, byte for byte."""
    torch.cuda.synchronize()
    assert_same_bytes(f"{name} k_cache", args.k_owner.cpu().numpy(), expected)
    assert_same_bytes(f"{name} state_cache", args.state_owner.cpu().numpy(), state_before)


def _workspace(kind: str, tokens: int):
    if kind == "2d":
        return torch.empty(tokens + 5, 512, device="cuda")
    if kind == "1d":
        return torch.empty((tokens + 1) * 512, device="cuda")
    return None


# ---- the spec's bytes ---------------------------------------------------------------------------
STEPS = [
    *(Step(4, t) for t in (1, 2, 64, 1024)),
    *(Step(128, t) for t in (1, 2, 64, 1024)),
    *(Step(128, 64, path=p) for p in ("fused_cluster", "fused_handoff", "split_block8", "split_generic")),
    Step(128, 2048),  # the pipelined kernel, each cluster walking a run of tokens
    Step(4, 64, "bf16"), Step(4, 64, "fp8_per_tensor"), Step(128, 64, "bf16"), Step(128, 1024, "fp8_per_tensor"),
    *(Step(4, t, "indexer_fp8") for t in (1, 64, 1024)),
    Step(4, 64, "indexer_mxfp4", hadamard=True),
    *(Step(128, t, "indexer_mxfp4", hadamard=True) for t in (2, 64)),
    Step(128, 64, "indexer_fp8"),
]


@pytest.mark.parametrize("workspace_kind", ["2d", "none", "1d"])
@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_bound_calls_write_the_spec_bytes_on_the_eager_path(step, workspace_kind, unvalidated):
    from dsv4_compressor.impl.cutedsl.host.paths import choose
    from dsv4_compressor.impl.cutedsl.host.policy import DEFAULT_POLICY

    scratch = choose(step.path, step.ratio, step.head_dim, step.tokens, step.block_size, DEFAULT_POLICY).scratch
    if workspace_kind != "2d" and not scratch:
        pytest.skip("no scratch on this path: the workspace is not used")
    args, expected, canary = build(step)
    state_before = args.state_owner.cpu().numpy()
    layer = bind(step, args)
    arrays = per_token(args, step.tokens)
    workspace = _workspace(workspace_kind, step.tokens)
    layer.compress_norm_rope_store(*arrays, workspace=workspace)  # validated: prepares T
    check(step.name + " first call", args, expected, state_before)
    reset(args, canary)
    unvalidated()
    layer.compress_norm_rope_store(*arrays, workspace=workspace)
    check(step.name, args, expected, state_before)


@pytest.mark.parametrize("step", [Step(4, 64), Step(128, 64), Step(128, 1024), Step(4, 64, "indexer_fp8"),
                                  Step(128, 2, "bf16")], ids=lambda s: s.name)
def test_the_eager_path_replays_in_a_cuda_graph(step, unvalidated):
    """Captured on the capture's side stream (TVM-FFI takes torch's current stream from a
    per-token array: the held fixed tensors carry none)."""
    args, expected, canary = build(step)
    state_before = args.state_owner.cpu().numpy()
    layer = bind(step, args)
    arrays = per_token(args, step.tokens)
    workspace = _workspace("2d", step.tokens)
    layer.compress_norm_rope_store(*arrays, workspace=workspace)
    torch.cuda.synchronize()
    unvalidated()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.compress_norm_rope_store(*arrays, workspace=workspace)
    reset(args, canary)
    graph.replay()
    check(step.name, args, expected, state_before)


def test_a_call_of_no_tokens_writes_nothing_and_is_validated():
    step = Step(128, 0)
    args, expected, canary = build(step)
    state_before = args.state_owner.cpu().numpy()
    layer = bind(step, args)
    empty = per_token(args, 0)
    layer.compress_norm_rope_store(*empty)
    layer.compress_norm_rope_store(*empty)
    with pytest.raises(ValueError, match="positions: expected dtype int64"):
        layer.compress_norm_rope_store(empty[0], empty[1].view(torch.uint64), *empty[2:])
    check(step.name, args, canary, state_before)


def test_the_bound_path_calls_tvm_ffi_functions():
    """The plans' ``ffi`` are the TVM-FFI functions themselves, without the compiled objects'
    Python ``__call__`` (with this CuTe DSL release)."""
    import tvm_ffi

    step = Step(128, 1024, path="split_block8")  # two kernels
    args, expected, canary = build(step)
    layer = bind(step, args)
    layer.compress_norm_rope_store(*per_token(args, step.tokens))
    plan = layer._launches[step.tokens].__self__
    assert plan.path.name.startswith("split")  # a KernelPath record
    assert all(isinstance(f, tvm_ffi.Function) and f is not k for f, k in zip(plan.ffi, plan.kernels))


# ---- refused calls: SPEC §9's ValueError, nothing written ------------------------------------------
BAD = [  # (per-token argument, change, the ValueError's start)
    ("token_to_req_indices", unsigned, "token_to_req_indices: expected dtype int32"),
    ("positions", unsigned, "positions: expected dtype int64"),
    ("slot_mapping", unsigned, "slot_mapping: expected dtype int64"),
    ("kv_slot_mapping", unsigned, "kv_slot_mapping: expected dtype int64"),
    ("block_table", unsigned, "block_table: expected dtype int32"),
    ("positions", lambda t: t.int(), "positions: expected dtype int64"),
    ("token_to_req_indices", lambda t: t.long(), "token_to_req_indices: expected dtype int32"),
    ("slot_mapping", lambda t: t[:-1], "slot_mapping: expected length T"),
    ("token_to_req_indices", lambda t: t[1:], "token_to_req_indices: expected length T"),
    ("kv_slot_mapping", lambda t: t[None], "kv_slot_mapping: expected 1 dimensions"),
    ("positions", strided, "positions: expected last stride 1"),
    ("kv_slot_mapping", strided, "kv_slot_mapping: expected last stride 1"),
    ("slot_mapping", lambda t: t.cpu(), "slot_mapping: expected a tensor on cuda"),
    ("block_table", lambda t: t[0], "block_table: expected 2 dimensions"),
    ("block_table", strided, "block_table: expected last stride 1"),
    ("block_table", lambda t: t.cpu(), "block_table: expected a tensor on cuda"),
    ("positions", lambda t: t.tolist(), "positions: expected a torch.Tensor, got list"),
]
REFUSING_STEPS = [Step(4, 64), Step(128, 2), Step(128, 64), Step(128, 1024), Step(4, 64, "indexer_fp8"),
                  Step(128, 64, "fp8_per_tensor")]


@pytest.mark.parametrize("step", REFUSING_STEPS, ids=lambda s: s.name)
@pytest.mark.parametrize("name, change, needle", BAD, ids=[f"{i}-{n}" for i, (n, _, _) in enumerate(BAD)])
def test_a_bad_per_token_argument_is_named_and_nothing_written(step, name, change, needle):
    args, expected, canary = build(step)
    state_before = args.state_owner.cpu().numpy()
    layer = bind(step, args)
    arrays = per_token(args, step.tokens)
    workspace = _workspace("2d", step.tokens)
    layer.compress_norm_rope_store(*arrays, workspace=workspace)  # validated: prepares T
    torch.cuda.synchronize()
    reset(args, canary)
    bad = list(arrays)
    bad[PER_TOKEN.index(name)] = change(arrays[PER_TOKEN.index(name)])
    with pytest.raises(ValueError, match=needle):
        layer.compress_norm_rope_store(*bad, workspace=workspace)
    check(f"{step.name} refused", args, canary, state_before)
    layer.compress_norm_rope_store(*arrays, workspace=workspace)  # the layer keeps working
    check(step.name, args, expected, state_before)


BAD_WORKSPACES = [
    (lambda t: torch.empty(t - 1, 512, device="cuda"), "workspace: expected float32 \\[S >= "),
    (lambda t: torch.empty(t, 514, device="cuda")[:, :512], "workspace: expected strides \\(multiple of 4, 1\\)"),
    (lambda t: torch.empty(t * 512 + 4, device="cuda")[1:1 + t * 512].view(t, 512),
     "workspace: expected a 16-byte aligned base"),
    (lambda t: torch.empty(t * 512 + 4, device="cuda")[1:1 + t * 512], "workspace: expected a 16-byte aligned base"),
    (lambda t: torch.empty(t, 512, dtype=torch.float64, device="cuda"), "workspace: expected dtype float32"),
    (lambda t: torch.empty(t, 512, dtype=torch.int32, device="cuda"), "workspace: expected dtype float32"),
    (lambda t: torch.empty(t, 256, device="cuda"), "workspace: expected float32 \\[S >= "),
    (lambda t: torch.empty(t * 512 - 1, device="cuda"), "workspace: expected float32 \\[S >= "),
    (lambda t: torch.empty(t, 512), "workspace: expected a tensor on cuda"),
]


@pytest.mark.parametrize("step", [Step(128, 64), Step(128, 1024, path="split_block8"), Step(128, 64, path="split_generic")],
                         ids=lambda s: s.name)  # the paths with a scratch
@pytest.mark.parametrize("make, needle", BAD_WORKSPACES)
def test_a_bad_workspace_is_named_and_nothing_written(step, make, needle):
    args, expected, canary = build(step)
    state_before = args.state_owner.cpu().numpy()
    layer = bind(step, args)
    arrays = per_token(args, step.tokens)
    layer.compress_norm_rope_store(*arrays, workspace=_workspace("2d", step.tokens))
    torch.cuda.synchronize()
    reset(args, canary)
    with pytest.raises(ValueError, match=needle):
        layer.compress_norm_rope_store(*arrays, workspace=make(step.tokens))
    check(f"{step.name} refused", args, canary, state_before)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("name", PER_TOKEN)
def test_a_per_token_argument_on_another_device_is_named_and_nothing_written(name):
    step = Step(128, 64)
    args, expected, canary = build(step)
    state_before = args.state_owner.cpu().numpy()
    layer = bind(step, args)
    arrays = per_token(args, step.tokens)
    layer.compress_norm_rope_store(*arrays)
    torch.cuda.synchronize()
    reset(args, canary)
    bad = list(arrays)
    bad[PER_TOKEN.index(name)] = arrays[PER_TOKEN.index(name)].to("cuda:1")
    with pytest.raises(ValueError, match=f"{name}: expected a tensor on cuda:0"):
        layer.compress_norm_rope_store(*bad)
    check(f"{step.name} refused", args, canary, state_before)


# ---- save_partial_states ----------------------------------------------------------------------------
def _save_step(ratio: int, tokens: int, head_dim: int = 512, seed: int = 3):
    """``(a layer bound to a fresh CUDA state cache, its Arguments, kv_score, ape, the spec's
    state allocation after the save)``."""
    rng = np.random.default_rng(seed)
    block_size = 8 if ratio == 128 else 4
    batch = B.build_batch(B.decode_requests(tokens, ratio, rng, boundary=False, max_entries=8), compress_ratio=ratio,
                          block_size=block_size, entries_per_page=4, rng=rng, unsaved_fraction=0.1)
    state = Buffer.of(B.random_state_cache(batch.num_state_blocks, block_size, ratio, rng, row_pad=8, block_pad_rows=2,
                                           head_dim=head_dim))
    kv = B.random_kv_score(batch.num_tokens, ratio, rng, head_dim=head_dim)
    ape = B.random_ape(ratio, rng, head_dim=head_dim)
    expected, saved = state.numpy_copy()
    spec.save_partial_states(kv, ape, batch.positions, batch.slot_mapping, saved, block_size, debug=True)
    layout = "flashmla_fp8" if head_dim == 512 else "indexer_fp8"
    state_owner, state_view = state.torch_copy("cuda")
    k_owner, k_view = Buffer.of(B.canary_k_cache(layout, 1, 1)).torch_copy("cuda")
    tensors = {name: to_torch(getattr(batch, name), "cuda") for name in PER_TOKEN}
    tensors.update(state_cache=state_view, k_cache=k_view,
                   rms_norm_weight=to_torch(B.random_norm_weight(rng, bf16=True, head_dim=head_dim), "cuda"),
                   cos_sin_cache=to_torch(B.rope_cos_sin_cache(int(batch.positions.max()) + 1), "cuda"))
    from dsv4_compressor.impl import cutedsl

    layer = cutedsl.bind(state_view, k_view, tensors["rms_norm_weight"], tensors["cos_sin_cache"],
                         block_size=block_size, compress_ratio=ratio, rms_norm_eps=1e-6, layout=layout)
    return layer, Arguments(state_owner, k_owner, tensors), to_torch(kv, "cuda"), to_torch(ape, "cuda"), expected


def _state_is(name: str, args: Arguments, expected: np.ndarray) -> None:
    torch.cuda.synchronize()
    assert_same_bytes(name, args.state_owner.cpu().numpy(), expected)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values at a base 4 bytes past a 16-byte boundary."""
    shifted = torch.empty(t.numel() + 4, dtype=t.dtype, device=t.device)[1:1 + t.numel()].view(t.shape)
    return shifted.copy_(t)


@pytest.mark.parametrize("ratio, tokens, head_dim", [(4, 1, 512), (4, 64, 512), (128, 1024, 512), (4, 64, 128),
                                                     (128, 64, 128)])
def test_a_bound_save_writes_the_spec_bytes_on_the_eager_path(ratio, tokens, head_dim, unvalidated):
    layer, args, kv, ape, expected = _save_step(ratio, tokens, head_dim)
    before = args.state_owner.clone()
    layer.save_partial_states(kv, ape, args["positions"], args["slot_mapping"])  # validated: prepares the kernel
    _state_is("first call state_cache", args, expected)
    args.state_owner.copy_(before)
    unvalidated()
    layer.save_partial_states(kv, ape, args["positions"], args["slot_mapping"])
    _state_is("state_cache", args, expected)


def test_a_bound_save_of_misaligned_inputs_takes_the_validated_path_and_writes_the_spec_bytes():
    layer, args, kv, ape, expected = _save_step(128, 64)
    before = args.state_owner.clone()
    layer.save_partial_states(kv, ape, args["positions"], args["slot_mapping"])
    rows_apart = torch.empty(kv.shape[0], kv.shape[1] + 1, device="cuda")[:, :-1].copy_(kv)  # rows 4 bytes off
    for kv_in, ape_in in ((_misaligned(kv), ape), (kv, _misaligned(ape)), (rows_apart, ape)):
        args.state_owner.copy_(before)
        layer.save_partial_states(kv_in, ape_in, args["positions"], args["slot_mapping"])
        _state_is("state_cache", args, expected)


@pytest.mark.parametrize("change, needle", BAD_SAVES + [
    (lambda kv, ape, pos, slots: (kv.cpu(), ape, pos, slots), "kv_score: expected a tensor on cuda"),
    (lambda kv, ape, pos, slots: (kv, ape, pos, slots.cpu()), "slot_mapping: expected a tensor on cuda"),
])
def test_a_bad_save_argument_is_named_and_nothing_written(change, needle):
    layer, args, kv, ape, expected = _save_step(128, 64)
    before = args.state_owner.clone()
    layer.save_partial_states(kv, ape, args["positions"], args["slot_mapping"])  # prepares the kernel
    torch.cuda.synchronize()
    args.state_owner.copy_(before)
    with pytest.raises(ValueError, match=needle):
        layer.save_partial_states(*change(kv, ape, args["positions"], args["slot_mapping"]))
    _state_is("refused: state_cache", args, before.cpu().numpy())
    layer.save_partial_states(kv, ape, args["positions"], args["slot_mapping"])  # the layer keeps working
    _state_is("state_cache", args, expected)
