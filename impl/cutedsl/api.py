"""Public operations of the CuTe DSL implementation: validation, dispatch, launch.

Order of work in every call (SPEC §8/§9):

1. the shared front end (:mod:`dsv4_compressor.impl.frontend`) validates every argument
   and raises ``ValueError`` (argument, expected, given) before anything is compiled or
   launched;
2. fast-path constraints of this implementation (CUDA tensors, a forced ``c128_path``
   that the block size does not allow, the scratch ``workspace``) raise ``ValueError``
   the same way;
3. the static configuration (:mod:`.config`) selects a compiled kernel from the
   in-process cache (compiled on first use; warm it before CUDA-graph capture), which is
   called through TVM-FFI with the torch tensors on the current stream: no host sync, no
   per-call conversion, no allocation except the C128 split path's scratch when the
   caller passes no ``workspace``.

Dispatch: C4 runs the fused kernel. C128 runs

- ``fused_cluster``: one launch, a thread-block cluster per token (16 CTAs of 32 channels
  up to ``TUNING.c128_cluster16_max_tokens`` tokens, 8 CTAs of 64 channels above; kv rows
  requested once the window max is known);
- ``fused_handoff``: one launch, 8 independent CTAs per token (no cluster, so no GPC
  packing limit); the last of them, found by a per-token atomic counter, finishes the
  token from the ``workspace`` scratch. Past about ``TUNING.c128_handoff_waves`` waves a
  CTA takes a chunk of up to 32 tokens (a ballot finds the active ones), so steps with
  few active tokens among many cost a fraction of a CTA per inactive token;
- ``fused_stream``: one launch, about one wave of persistent clusters that ballot their
  tokens' activity and stream the active ones through a two-stage ``cp.async`` pipeline.
  Never chosen by ``auto`` (slower on all-active decode sweeps), but the fastest path for
  steps with few active tokens among many (a prefill chunk plus decode tokens);
- ``split_block8``: Block8 compress kernel + store kernel (each lane's rows in one state
  block: ``bs % 8 == 0`` with the default mapping), or ``split_generic`` (any ``bs``).

``c128_path="auto"`` picks ``fused_cluster`` up to ``TUNING.c128_cluster_max_tokens`` tokens
(16), ``fused_handoff`` up to ``TUNING.c128_fused_max_tokens`` (64), then Block8 whenever
allowed (generic otherwise) while the handoff kernel would take one token per CTA (Block8
is 1.5-3% faster there on dense steps, as fast on a sparse decode step), and
``fused_handoff`` with chunks of tokens above (about 16 waves: 1057 tokens on 132 SMs;
``TUNING.c128_chunked_handoff``): on all-active steps it is 6-8% slower than Block8 there,
but real C128 steps are sparse (about 1 token in 128 closes a window), where it is 3.5x
faster (``bench/RESULTS.md`` tables O, P, V). ``save_and_compress_norm_rope_store`` keeps
``fused_handoff`` above 64 tokens: with its metadata read under the save kernel its inactive
CTAs cost nothing (5.0 against 7.2 µs on a 512-token decode step).

Every kernel is launched with programmatic dependent launch (``TUNING.pdl``, see
:mod:`.dependent_launch`): its CTAs may become resident while the previous kernel in the
stream finishes, and it waits (``griddepcontrol.wait``) before its first memory access;
except that with early metadata (``save_and_compress_norm_rope_store``, or opt-in
``TUNING.c128_early_metadata``) the C128 kernels read their metadata first and wait right
before their first state row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..frontend import describe_torch, layout_key, validate_compress_norm_rope_store, validate_save_partial_states
from .config import HANDOFF_CTAS_PER_SM, HANDOFF_CTAS_PER_TOKEN, MAX_CHUNK_TOKENS
from .indexer_config import INDEXER_LAYOUTS
from ...spec.constants import HEAD_DIMS
from ...spec.validation import check_compress

SUPPORTED_DEVICES = ("cuda",)
C128_PATHS = ("auto", "fused_cluster", "fused_handoff", "fused_stream", "split_block8", "split_generic")
HEAD_DIM = 512


@dataclass
class Tuning:
    """Static knobs the dispatcher uses; each distinct value compiles its own kernel once.

    Sweep them on the GPU with ``python -m dsv4_compressor.impl.cutedsl.tune`` or
    ``python -m dsv4_compressor.bench.probe variants`` (or assign fields of :data:`TUNING`
    between timed runs). Defaults come from H200 measurements (CUDA-graph replay,
    decode-boundary sweeps, bs 8 / B 2 for C128, bs 4 / B 64 for C4; ``bench/RESULTS.md``,
    third session, all with PDL):

    ====  ==============  ==============  ==============  ==============
    T     16-CTA cluster  8-CTA cluster   handoff         split Block8
    ====  ==============  ==============  ==============  ==============
    1     3.0 µs          3.5 µs          4.3 µs          4.1 µs
    8     3.9 µs          3.6 µs          4.6 µs          4.5 µs
    16    5.9 µs          5.0 µs          5.0 µs          5.0 µs
    32    10.4 µs         10.5 µs         8.6 µs          8.8 µs
    64    16.8 µs         13.6 µs         12.7 µs         13.8 µs
    128   29.4 µs         22.7 µs         22.7 µs         22.2 µs
    1024  65% of copy BW  94%             97-99%          98-100%
    8192  66%             97%             99% (chunks)    103-105%
    ====  ==============  ==============  ==============  ==============

    Steps with few active tokens: decode step (512 tokens, 3 active) handoff 8.2 µs, Block8
    8.2, stream 5.3; prefill chunk plus decode (4608 tokens, 36 active) handoff 18.9 µs (4
    waves: 12.9), stream 22.2, Block8 67.0, Triton 37.2. Early metadata (fourth session,
    table U): auto 2.5 / 7.5 / 11.7 µs at 1 / 32 / 64 tokens, decode step 5.0. Without PDL
    every path is 0.4-1.1 µs slower below 256 tokens, except clusters at 32 tokens (8.9 µs
    instead of 10.5: with PDL the next call's clusters take GPC room early). C4 fused: 2.5 µs
    (T=1), 3.1 µs (T=128), 97% of copy bandwidth at T=16384.
    """

    c4_tokens_per_cta: int = 1  # C4 fused: 1, 2, 4 token groups of 128 threads per CTA (2: 90% at 16K)
    c128_split_warps: int = 8  # split compress kernel: 4, 8, 16 warps per CTA
    c128_split_tile: int = 64  # split compress kernel: 64 or 32 channels per CTA
    c128_split_kv_in_smem: bool = False  # split compress kernel: kv rows staged in smem (cp.async); no gain
    c128_store_tokens_per_cta: int = 1  # split store kernel: 1, 2, 4
    c128_cluster_warps: int = 8  # cluster kernel: 4, 8, 16 warps per CTA
    c128_cluster_tile: int | None = None  # cluster kernel: 64 (8-CTA clusters), 32 (16-CTA clusters), None: by T
    c128_cluster16_max_tokens: int = 4  # tile None: 16-CTA clusters up to this T, 8-CTA above
    c128_cluster_kv_after_max: bool = True  # cluster kernel: issue kv loads after the window max
    c128_split_kv_after_max: bool = False  # split compress kernel: the same
    c128_cluster_kv_in_smem: bool = True  # cluster kernel: kv rows staged in smem (64 regs, 4 CTAs/SM)
    c128_handoff_kv_after_max: bool = True  # handoff kernel (8 warps, 64 channels, kv in smem): kv after the max
    c128_handoff_waves: int | None = 16  # handoff kernel: tokens per CTA grow so the grid is about this many
    #                                      waves of 4 CTAs per SM (None: one token per CTA); see handoff_chunk
    c128_stream_tile: int = 32  # stream kernel: 32 (16-CTA clusters, 3 CTAs/SM) or 64 (8-CTA, 1 CTA/SM)
    c128_stream_warps: int = 8  # stream kernel: 4, 8, 16 warps per CTA
    c128_stream_ctas_per_sm: int | None = None  # stream kernel's grid: CTAs per SM (None: as shared memory allows)
    c128_stream_clusters: int | None = None  # stream kernel's grid: clusters (None: from c128_stream_ctas_per_sm)
    c128_cluster_max_tokens: int = 16  # auto: fused_cluster up to this T (and up to c128_fused_max_tokens)
    c128_fused_max_tokens: int | None = 64  # auto: fused_handoff up to this T (None = always), split above ...
    c128_chunked_handoff: bool = True  # ... except where the handoff kernel takes chunks of tokens (see api docs)
    save_tokens_per_cta: int = 1  # save_partial_states: 1, 2, 4
    pdl: bool = True  # every kernel: programmatic dependent launch (griddepcontrol; see .dependent_launch)
    c128_early_metadata: bool = False  # with pdl, the C128 split, cluster and handoff kernels read positions,
    #   slots, block table, weights and cos/sin before griddepcontrol.wait: only if the previous kernel in the
    #   stream writes none of them and waits for its own predecessor before it triggers (.dependent_launch)


TUNING = Tuning()


def _kernels():
    """Import the CuTe DSL side lazily, with a clear message when it is not installed."""
    try:
        from . import compile_cache, config
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dsv4_compressor.impl.cutedsl needs NVIDIA's CuTe DSL and TVM-FFI: "
            'pip install "nvidia-cutlass-dsl[cu13]==4.8.1" "apache-tvm-ffi>=0.1.6,<0.2" '
            f"(import failed: {error})"
        ) from error
    return compile_cache, config


# ---- argument helpers -------------------------------------------------------------------
def _require_cuda(name: str, tensor: torch.Tensor) -> None:
    if tensor.device.type not in SUPPORTED_DEVICES:
        raise ValueError(f"{name}: expected a tensor on one of {SUPPORTED_DEVICES}, got a tensor on {tensor.device}")


def _unit_stride_1d(tensor: torch.Tensor) -> torch.Tensor:
    """A per-token array of length <= 1 may carry any stride (SPEC §9); TVM-FFI wants 1."""
    if tensor.stride(0) != 1:
        return tensor.as_strided(tuple(tensor.shape), (1,))
    return tensor


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    """Same for a 2-D table whose last extent is 1."""
    if tensor.stride(-1) != 1:
        return tensor.as_strided(tuple(tensor.shape), tuple(tensor.stride()[:-1]) + (1,))
    return tensor


def _store_align(k_cache: torch.Tensor, layout: str) -> int:
    """Byte alignment of every 4-channel store (the bf16/fp8 layouts allow any strides)."""
    if layout == "flashmla_fp8":
        return 16  # validated: 16-byte aligned base and page stride, records at multiples of 8
    item = k_cache.element_size()
    vector = 4 * item
    pages, entries, _ = k_cache.shape
    aligned = (
        k_cache.data_ptr() % vector == 0
        and (pages <= 1 or (k_cache.stride(0) * item) % vector == 0)
        and (entries <= 1 or (k_cache.stride(1) * item) % vector == 0)
    )
    return vector if aligned else item


def _x_buffer(buffer, num_tokens: int, device: torch.device, name: str) -> torch.Tensor:
    """An fp32 ``[S >= T, 512]`` buffer with 16-byte aligned rows (given or allocated)."""
    if buffer is None:
        return torch.empty((num_tokens, HEAD_DIM), dtype=torch.float32, device=device)
    if not isinstance(buffer, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor or None, got {type(buffer).__name__}")
    if buffer.dtype != torch.float32:
        raise ValueError(f"{name}: expected dtype float32, got {str(buffer.dtype).removeprefix('torch.')}")
    if buffer.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like state_cache), got a tensor on {buffer.device}")
    if buffer.data_ptr() % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned base address, got address 0x{buffer.data_ptr():x}")
    if buffer.dim() == 2 and buffer.shape[1] == HEAD_DIM and buffer.shape[0] >= num_tokens:
        if buffer.stride(1) != 1 or (buffer.shape[0] > 1 and buffer.stride(0) % 4):
            raise ValueError(f"{name}: expected strides (multiple of 4, 1), got strides {list(buffer.stride())}")
        return _unit_last_stride(buffer)
    if buffer.dim() == 1 and buffer.is_contiguous() and buffer.numel() >= num_tokens * HEAD_DIM:
        return buffer[: num_tokens * HEAD_DIM].view(num_tokens, HEAD_DIM)
    raise ValueError(
        f"{name}: expected float32 [S >= {num_tokens}, {HEAD_DIM}] (rows 16-byte aligned) or a contiguous "
        f"float32 tensor of >= {num_tokens * HEAD_DIM} elements, got shape {list(buffer.shape)}"
    )


def _metadata(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping):
    return (_unit_stride_1d(token_to_req_indices), _unit_stride_1d(positions), _unit_stride_1d(slot_mapping),
            _unit_last_stride(block_table), _unit_stride_1d(kv_slot_mapping))


# ---- C128 dispatch ------------------------------------------------------------------------
def cluster_tile(num_tokens: int) -> int:
    """Channels per CTA of the cluster kernel: 32 (16 CTAs per token) for a few tokens,
    where more SMs per token shorten the exact arithmetic's critical path; 64 (8 CTAs)
    above, where fewer, larger CTAs stream better (``bench/RESULTS.md``, tables A and G)."""
    if TUNING.c128_cluster_tile is not None:
        return TUNING.c128_cluster_tile
    return 32 if num_tokens <= TUNING.c128_cluster16_max_tokens else 64


def c128_pool_config(path: str, block_size: int, num_tokens: int = 1, early_metadata: bool = False):
    """The :class:`.config.C128PoolConfig` of a C128 path (``fused_*``/``split_*``); with PDL
    its metadata is read before the wait if ``early_metadata`` or ``TUNING.c128_early_metadata``
    (not on the stream path)."""
    _, config = _kernels()
    if path == "fused_cluster":
        warps, tile, staged = TUNING.c128_cluster_warps, cluster_tile(num_tokens), TUNING.c128_cluster_kv_in_smem
        late = TUNING.c128_cluster_kv_after_max
    elif path == "fused_handoff":  # fixed mapping: a warp per 64-channel block when finishing
        warps, tile, staged, late = 8, 64, True, TUNING.c128_handoff_kv_after_max
    elif path == "fused_stream":
        warps, tile, staged, late = TUNING.c128_stream_warps, TUNING.c128_stream_tile, False, False
    else:
        warps, tile, staged = TUNING.c128_split_warps, TUNING.c128_split_tile, TUNING.c128_split_kv_in_smem
        late = TUNING.c128_split_kv_after_max
    rows_per_lane = config.C128PoolConfig(block_size, 1, warps, tile).rows_per_lane
    if path == "split_block8":
        if block_size % rows_per_lane:
            raise ValueError(
                f"c128_path: 'split_block8' expected block_size a multiple of {rows_per_lane} (each lane's "
                f"{rows_per_lane} rows in one state block), got block_size={block_size}; use 'split_generic' or 'auto'"
            )
        rows_per_lookup = rows_per_lane
    else:  # generic lookups: runs of gcd(bs, rows per lane) rows share a block (Block8's when bs allows)
        rows_per_lookup = math.gcd(block_size, rows_per_lane)
    early = TUNING.pdl and (early_metadata or TUNING.c128_early_metadata) and path != "fused_stream"
    return config.C128PoolConfig(block_size, rows_per_lookup, warps, tile, staged, late, TUNING.pdl, early)


SMEM_PER_SM = 227 * 1024  # bytes a CTA may opt in to on sm_90, and about what an SM holds


def stream_grid(stream_config, num_tokens: int, device: torch.device) -> tuple[int, int]:
    """``(clusters, chunk)`` of the stream kernel: about one wave of clusters, each taking
    chunks of up to 32 consecutive tokens (fewer when there are few tokens per cluster).

    The estimate counts SMs, not GPCs: on the H200 measured, 8-CTA clusters of one CTA per
    SM fit 15 at a time, not 132 // 8 = 16, and the 16th then runs alone afterwards (43 µs
    instead of 27 at 128 tokens); set ``TUNING.c128_stream_clusters`` to pin the count. The
    default 16-CTA variant (three CTAs per SM) is not sensitive to it (18-24 clusters equal).
    """
    per_sm = TUNING.c128_stream_ctas_per_sm
    if per_sm is None:
        per_sm = max(1, min(SMEM_PER_SM // (stream_config.smem_bytes + 1024), 2048 // (32 * stream_config.pool.warps)))
    sms = _multiprocessor_count(device)
    clusters = TUNING.c128_stream_clusters or sms * per_sm // stream_config.cluster_size
    clusters = max(1, min(num_tokens, clusters))
    chunk = max(1, min(MAX_CHUNK_TOKENS, -(-num_tokens // clusters)))
    return clusters, chunk


_SM_COUNTS: dict = {}
_COUNTERS: dict = {}  # (device, stream) -> _CounterArray: the handoff kernel's arrival counters
_OUTGROWN: list = []  # replaced counter arrays stay allocated: a captured CUDA graph may still use them


def _current_stream(device: torch.device) -> int:
    try:
        return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())
    except AttributeError:  # pragma: no cover - older torch
        return torch.cuda.current_stream(device).cuda_stream


def handoff_chunk(num_tokens: int, device: torch.device) -> int:
    """Tokens per CTA of the handoff kernel: 1 up to about ``TUNING.c128_handoff_waves``
    waves of CTAs (4 per SM), then as many as keep the grid at that many waves, at most 32
    (one ballot). Inactive tokens then cost a CTA a ballot bit instead of a CTA each, which
    is what steps with few active tokens among many (prefill chunks, decode) need."""
    waves = TUNING.c128_handoff_waves
    if waves is None:
        return 1
    if not isinstance(waves, int) or waves < 1:
        raise ValueError(f"TUNING.c128_handoff_waves: expected None or an integer >= 1, got {waves!r}")
    slots = waves * HANDOFF_CTAS_PER_SM * _multiprocessor_count(device)
    return max(1, min(MAX_CHUNK_TOKENS, -(-HANDOFF_CTAS_PER_TOKEN * num_tokens // slots)))


@dataclass
class _CounterArray:
    tensor: torch.Tensor  # int32, zero between calls once zeroed
    zeroed: bool = False  # a zero-fill has run outside any graph capture
    filled_captures: set = field(default_factory=set)  # ids of the captures that recorded a zero-fill


def handoff_counters(device: torch.device, num_tokens: int) -> torch.Tensor:
    """The ``fused_handoff`` kernel's per-token arrival counters for the current stream: an
    int32 array of at least ``num_tokens`` zeros (the kernel leaves them zero again).

    One array per (device, stream), so calls on different streams never share counters. A
    CUDA graph keeps the array of the stream it was captured on: graphs captured on one
    stream must not be replayed concurrently on several.

    A new array is zero-filled on the stream before its first use. A fill issued inside a
    graph capture exists only in that graph, so until a fill has run outside capture, each
    capture that uses the array records one fill of its own (at its first call: later calls
    of the same graph follow in stream order and find the zeros the kernel left), and the
    first call outside capture fills it again. Once filled outside capture, nothing more.
    """
    key = (device, _current_stream(device))
    entry = _COUNTERS.get(key)
    if entry is None or entry.tensor.numel() < num_tokens:
        if entry is not None:
            _OUTGROWN.append(entry.tensor)
        size = max(4096, 1 << (num_tokens - 1).bit_length())
        entry = _COUNTERS[key] = _CounterArray(torch.empty(size, dtype=torch.int32, device=device))
    if not entry.zeroed:
        capture = _capture_id(device)
        if capture is None:
            entry.tensor.zero_()
            entry.zeroed = True
        elif capture not in entry.filled_captures:
            entry.tensor.zero_()  # recorded into this graph only
            entry.filled_captures.add(capture)
    return entry.tensor


def _capture_id(device: torch.device) -> int | None:
    """The id of the CUDA graph capture running on the current stream (unique over the
    process's lifetime), or None outside capture."""
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return None
    import cuda.bindings.driver as driver

    result = driver.cuStreamGetCaptureInfo(driver.CUstream(_current_stream(device)))
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuStreamGetCaptureInfo failed: {result[0]}")
    return int(result[2])  # (error, status, id, graph, ...)


def _multiprocessor_count(device: torch.device) -> int:
    if device not in _SM_COUNTS:
        _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device]


def choose_c128_path(c128_path: str, num_tokens: int, block_size: int, device: torch.device | None = None,
                     early_metadata: bool = False) -> str:
    """Resolve ``c128_path`` (raises ``ValueError`` for an unknown or disallowed path).

    ``auto``: clusters, then the handoff kernel up to ``c128_fused_max_tokens``; above, Block8
    (1.5-3% faster on dense steps, as fast on a sparse decode step) unless, with a ``device``
    and ``TUNING.c128_chunked_handoff``, the handoff kernel would take chunks of tokens (a
    step with few active tokens among many: 3.5x faster than Block8), or it reads its metadata
    early (``save_and_compress_norm_rope_store``: its inactive CTAs then finish under the save
    kernel, 5.0 against 7.2 µs on the decode step)."""
    if c128_path not in C128_PATHS:
        raise ValueError(f"c128_path: expected one of {', '.join(repr(p) for p in C128_PATHS)}, got {c128_path!r}")
    if c128_path != "auto":
        c128_pool_config(c128_path, block_size)  # raises if the path cannot take this block size
        return c128_path
    limit = TUNING.c128_fused_max_tokens
    if num_tokens <= TUNING.c128_cluster_max_tokens and (limit is None or num_tokens <= limit):
        return "fused_cluster"
    if limit is None or num_tokens <= limit:
        return "fused_handoff"
    if TUNING.c128_chunked_handoff and device is not None and (early_metadata or handoff_chunk(num_tokens, device) > 1):
        return "fused_handoff"
    rows_per_lane = c128_pool_config("split_generic", block_size).rows_per_lane
    return "split_block8" if block_size % rows_per_lane == 0 else "split_generic"


# ---- public operations ----------------------------------------------------------------------
def save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, *, debug: bool = False) -> None:
    """SPEC §4: copy each saved token's kv and ``add(score, ape[p mod r])`` into the state cache."""
    launch = _save_launch(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug)
    if launch is not None:
        launch()


def _save_launch(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug: bool):
    """Validate a ``save_partial_states`` call and return its launch (None: nothing to do)."""
    call = validate_save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug=debug,
                                        head_dims=HEAD_DIMS)  # 512, and the indexer's 128 (SPEC §12)
    _require_cuda("state_cache", state_cache)
    if call.num_tokens == 0:
        return None
    compile_cache, config = _kernels()
    vector_inputs = (
        kv_score.data_ptr() % 16 == 0 and (call.num_tokens <= 1 or kv_score.stride(0) % 4 == 0)
        and ape.data_ptr() % 16 == 0 and ape.stride(0) % 4 == 0
    )
    kernel = compile_cache.compile_save(
        config.SaveConfig(call.config.ratio, call.block_size, vector_inputs, TUNING.save_tokens_per_cta, TUNING.pdl,
                          call.config.head_dim)
    )
    positions, slot_mapping = _unit_stride_1d(positions), _unit_stride_1d(slot_mapping)
    return lambda: kernel(kv_score, ape, positions, slot_mapping, state_cache)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a ``compress_norm_rope_store`` call decides before its launches.

    A plan depends only on what SPEC §9 validates (dtypes, shapes, strides, devices, base
    alignment, the scalars), on ``c128_path``, on the workspace's layout and on
    :data:`TUNING`; the tensors themselves change every step. Calls with the same key reuse
    the plan, so the host pays one key, one dictionary lookup and the FFI launches.
    """

    kernels: tuple  # compiled TVM-FFI callables, launched in order
    path: str  # "c4", "fused_cluster", "fused_handoff", "fused_stream", "split_block8" or "split_generic"
    eps: float
    fp8_inv: float
    num_tokens: int
    restride: bool  # a per-token array or the block table needs its unit stride restored
    grid: tuple = ()  # fused_stream: (clusters, chunk); fused_handoff: (chunk,)

    def run(self, state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
            cos_sin_cache, k_cache, kv_slot_mapping, workspace) -> None:
        if self.num_tokens == 0:
            return
        if self.restride:
            token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping = _metadata(
                token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping)
        if not self.path.startswith("split"):  # one launch: c4, fused_cluster, fused_handoff, fused_stream
            buffers = ()
            if self.path == "fused_handoff":  # the x scratch and the arrival counters
                buffers = (_x_buffer(workspace, self.num_tokens, state_cache.device, "workspace"),
                           handoff_counters(state_cache.device, self.num_tokens))
            self.kernels[0](state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
                            cos_sin_cache, k_cache, kv_slot_mapping, *buffers, self.eps, self.fp8_inv, *self.grid)
            return
        scratch = _x_buffer(workspace, self.num_tokens, state_cache.device, "workspace")
        pool, store = self.kernels
        pool(state_cache, token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping, scratch)
        store(scratch, positions, slot_mapping, kv_slot_mapping, rms_norm_weight, cos_sin_cache, k_cache, self.eps,
              self.fp8_inv)


_PLANS: dict[tuple, LaunchPlan] = {}
_PLANS_MAX = 512


def _plan_key(tensors: tuple, workspace, scalars: tuple) -> tuple:
    """The plan cache key (unhashable scalars make the lookup fail, and the call validate)."""
    return (*map(layout_key, tensors), None if workspace is None else layout_key(workspace), *scalars,
            *map(type, scalars), tuple(TUNING.__dict__.values()))


def _build_plan(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
                rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio, layout, fp8_scale, debug,
                workspace, c128_path, early_metadata) -> LaunchPlan:
    """Validate (SPEC §9 and this implementation's constraints), dispatch and compile."""
    call = validate_compress_norm_rope_store(
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
        rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
        fp8_scale=fp8_scale, debug=debug, head_dims=HEAD_DIMS,  # a 128-wide state then names its layouts
    )
    num_tokens, block_size = call.pooling.num_tokens, call.pooling.block_size
    ratio = call.pooling.config.ratio
    if c128_path not in C128_PATHS:  # also for C4, where it has no effect: a typo is still an error
        raise ValueError(f"c128_path: expected one of {', '.join(repr(p) for p in C128_PATHS)}, got {c128_path!r}")
    path = choose_c128_path(c128_path, num_tokens, block_size, state_cache.device, early_metadata) if ratio == 128 else "c4"
    if path.startswith("split") or path == "fused_handoff":
        _x_buffer(workspace, num_tokens, state_cache.device, "workspace")  # raises on a bad workspace
    _require_cuda("state_cache", state_cache)
    eps = float(call.store.eps)
    fp8_inv = float(np.float32(1.0) / call.store.fp8_scale) if call.store.layout == "fp8_per_tensor" else 1.0
    restride = any(t.stride(-1) != 1 for t in (token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping))
    if num_tokens == 0:
        return LaunchPlan((), path, eps, fp8_inv, 0, restride)
    compile_cache, config = _kernels()
    entry = config.EntryFormat(
        layout=call.store.layout,
        entries_per_page=call.store.entries_per_page,
        weight_dtype="bfloat16" if rms_norm_weight.dtype == torch.bfloat16 else "float32",
        store_align=_store_align(k_cache, call.store.layout),
    )
    if path == "c4":
        kernels = (compile_cache.compile_c4(config.C4Config(block_size, entry, TUNING.c4_tokens_per_cta, TUNING.pdl)),)
    elif path == "fused_cluster":
        pool = c128_pool_config(path, block_size, num_tokens, early_metadata)
        kernels = (compile_cache.compile_c128_cluster(config.ClusterConfig(pool, entry)),)
    elif path == "fused_handoff":
        chunk = handoff_chunk(num_tokens, state_cache.device)  # 1 <= chunk <= MAX_CHUNK_TOKENS
        handoff = config.HandoffConfig(c128_pool_config(path, block_size, early_metadata=early_metadata), entry,
                                       chunked=chunk > 1)
        return LaunchPlan((compile_cache.compile_c128_handoff(handoff),), path, eps, fp8_inv, num_tokens, restride, (chunk,))
    elif path == "fused_stream":
        stream_config = config.StreamConfig(c128_pool_config(path, block_size), entry)
        grid = stream_grid(stream_config, num_tokens, state_cache.device)
        return LaunchPlan((compile_cache.compile_c128_stream(stream_config),), path, eps, fp8_inv, num_tokens, restride, grid)
    else:
        kernels = (compile_cache.compile_c128_pool(c128_pool_config(path, block_size, early_metadata=early_metadata)),
                   compile_cache.compile_c128_store(config.StoreConfig(entry, TUNING.c128_store_tokens_per_cta, TUNING.pdl)))
    return LaunchPlan(kernels, path, eps, fp8_inv, num_tokens, restride)


def compress_norm_rope_store(
    state_cache,  # fp32 [num_state_blocks, bs, 2*SW]
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    rms_norm_weight,  # bf16 or fp32 [512]
    rms_norm_eps,  # python float (rounded to binary32)
    cos_sin_cache,  # fp32 [max_pos, 64]
    k_cache,  # flashmla_fp8: uint8 [P, B, 584]; bf16: bf16 [P, B, 512]; fp8_per_tensor: float8_e4m3fn [P, B, 512]
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    debug: bool = False,
    workspace: torch.Tensor | None = None,  # C128 split/handoff paths' fp32 scratch: [S >= T, 512] or >= T*512 elements
    c128_path: str = "auto",  # "auto" | "fused_cluster" | "fused_handoff" | "fused_stream" | "split_block8" | "split_generic"
    hadamard: bool = False,  # indexer layouts: the Hadamard rotation before quantization (SPEC §12)
) -> None:
    """SPEC §5-§7: pool, normalize, rotate, quantize and store one entry per active token.

    The first call with a given argument layout validates, dispatches and compiles; later
    calls with the same layout reuse that :class:`LaunchPlan` (``debug=True`` always
    validates, and checks values). The indexer layouts (``"indexer_fp8"``,
    ``"indexer_mxfp4"``, head width 128, SPEC §12) run :mod:`.indexer_launch`'s kernels
    (``workspace`` and ``c128_path`` do not apply there).
    """
    tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
               cos_sin_cache, k_cache, kv_slot_mapping)
    hadamard = bool(hadamard) if isinstance(hadamard, np.bool_) else hadamard
    if layout in INDEXER_LAYOUTS or hadamard is not False:  # SPEC §12 (a misplaced hadamard is rejected there)
        from . import indexer_launch

        if c128_path not in C128_PATHS:  # unused by the indexer kernels, but a typo is still an error
            raise ValueError(f"c128_path: expected one of {', '.join(repr(p) for p in C128_PATHS)}, got {c128_path!r}")
        return indexer_launch.compress_norm_rope_store(
            state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size, rms_norm_weight,
            rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio=compress_ratio, layout=layout,
            fp8_scale=fp8_scale, hadamard=hadamard, debug=debug)
    plan = _compress_plan(tensors, block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, debug, workspace,
                          c128_path, early_metadata=False)
    plan.run(*tensors, workspace)


def _compress_plan(tensors: tuple, block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, debug, workspace,
                   c128_path, early_metadata: bool) -> LaunchPlan:
    """The cached :class:`LaunchPlan` of a ``compress_norm_rope_store`` call (validated, dispatched
    and compiled on the first call with this layout)."""
    scalars = (block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, c128_path, early_metadata)
    key = None if debug else _plan_key(tensors, workspace, scalars)
    try:
        plan = None if key is None else _PLANS.get(key)
    except TypeError:  # an unhashable argument: validate (and reject) it the long way
        key = plan = None
    if plan is None:
        state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight, cos_sin_cache, \
            k_cache, kv_slot_mapping = tensors
        plan = _build_plan(state_cache, token_to_req_indices, positions, slot_mapping, block_table, block_size,
                           rms_norm_weight, rms_norm_eps, cos_sin_cache, k_cache, kv_slot_mapping, compress_ratio,
                           layout, fp8_scale, debug, workspace, c128_path, early_metadata)
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


def save_and_compress_norm_rope_store(
    kv_score,  # fp32 [T, 2*SW]: this step's kv and score projections
    ape,  # fp32 [r, SW]
    state_cache,  # fp32 [num_state_blocks, bs, 2*SW]
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    rms_norm_weight,  # bf16 or fp32 [512]
    rms_norm_eps,  # python float (rounded to binary32)
    cos_sin_cache,  # fp32 [max_pos, 64]
    k_cache,  # as in compress_norm_rope_store
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    layout: str = "flashmla_fp8",
    fp8_scale: float | None = None,
    debug: bool = False,
    workspace: torch.Tensor | None = None,
    c128_path: str = "auto",
    hadamard: bool = False,  # indexer layouts (SPEC §12)
) -> None:
    """SPEC §4 then §5-§7: ``save_partial_states(kv_score, ape, positions, slot_mapping,
    state_cache, block_size)`` and ``compress_norm_rope_store(...)`` with the same state cache,
    back to back on the current stream; both calls are validated before either launches.

    The same bytes as the two calls. Faster with PDL (``TUNING.pdl``): the C128 compress
    kernel reads its metadata, block table, weights and cos/sin while the save kernel still
    runs, and waits (``griddepcontrol.wait``) only before its first state row. That is safe
    here, and only here: the kernel right before it is this call's save kernel, which writes
    nothing but state rows and lets the compress kernel start only after its own
    predecessor has completed (see :mod:`.dependent_launch`).
    """
    tensors = (state_cache, token_to_req_indices, positions, slot_mapping, block_table, rms_norm_weight,
               cos_sin_cache, k_cache, kv_slot_mapping)
    hadamard = bool(hadamard) if isinstance(hadamard, np.bool_) else hadamard
    if layout in INDEXER_LAYOUTS or hadamard is not False:  # SPEC §12: validated, then the save, then the compress
        from . import indexer_launch

        plan = indexer_launch.indexer_plan(tensors, (block_size, rms_norm_eps, compress_ratio, layout, fp8_scale,
                                                     hadamard), debug)
        save = _save_launch(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug)
        if save is not None:
            save()
        return plan.run(*tensors)
    plan = _compress_plan(tensors, block_size, rms_norm_eps, compress_ratio, layout, fp8_scale, debug, workspace,
                          c128_path, early_metadata=TUNING.pdl)  # without PDL there is no wait to read ahead of
    save = _save_launch(kv_score, ape, positions, slot_mapping, state_cache, block_size, debug)
    if save is not None:  # None only for T = 0, where the plan launches nothing either
        save()
    plan.run(*tensors, workspace)


def compress(
    state_cache,  # fp32 [num_state_blocks, bs, 2*SW]
    token_to_req_indices,  # int32 [T]
    positions,  # int64 [T]
    slot_mapping,  # int64 [T]
    block_table,  # int32 [num_reqs, max_blocks]
    block_size,  # bs
    kv_slot_mapping,  # int64 [T]
    *,
    compress_ratio: int,
    out: torch.Tensor | None = None,  # fp32 [S >= T, 512]; allocated (NaN-filled) when None
    c128_path: str = "auto",  # C128: which compress kernel ("split_block8" | "split_generic"; others: auto)
) -> torch.Tensor:
    """SPEC §5: the compressed vector ``x`` (fp32 ``[T, 512]``) of the active tokens.

    Rows of active tokens hold exactly SPEC's bits (the split path's scratch contents);
    other rows are left untouched (NaN when ``out`` is None). For tests and debugging.
    """
    call = check_compress(
        describe_torch("state_cache", state_cache), describe_torch("token_to_req_indices", token_to_req_indices),
        describe_torch("positions", positions), describe_torch("slot_mapping", slot_mapping),
        describe_torch("block_table", block_table), block_size, describe_torch("kv_slot_mapping", kv_slot_mapping),
        compress_ratio, head_dims=(HEAD_DIM,),
    )
    num_tokens, block_size = call.num_tokens, call.block_size
    ratio = call.config.ratio
    path = choose_c128_path(c128_path, num_tokens, block_size) if ratio == 128 else None
    if out is not None:
        _x_buffer(out, num_tokens, state_cache.device, "out")
    _require_cuda("state_cache", state_cache)
    if out is None:
        out = torch.full((num_tokens, HEAD_DIM), float("nan"), dtype=torch.float32, device=state_cache.device)
    buffer = _x_buffer(out, num_tokens, state_cache.device, "out")
    if num_tokens == 0:
        return out
    compile_cache, config = _kernels()
    args = _metadata(token_to_req_indices, positions, slot_mapping, block_table, kv_slot_mapping)
    token_req, positions, slot_mapping, block_table, kv_slot_mapping = args
    if ratio == 4:
        kernel = compile_cache.compile_c4(config.C4Config(block_size, None, TUNING.c4_tokens_per_cta, TUNING.pdl))
    else:
        if path in ("fused_cluster", "fused_handoff", "fused_stream"):  # the fused kernels pool like the split ones
            path = "split_generic"  # (generic lookups are Block8's whenever bs allows)
        kernel = compile_cache.compile_c128_pool(c128_pool_config(path, block_size))
    kernel(state_cache, token_req, positions, slot_mapping, block_table, kv_slot_mapping, buffer)
    return out
