"""Compile each kernel once per static configuration, tensor-free, and cache it in process.

Why tensor-free: the compile functions take only hashable configurations
(:mod:`.config`), build fake tensors with symbolic sizes and strides, and return a TVM-FFI
callable that takes torch tensors directly and launches on torch's current stream
(``make_fake_stream(use_tvm_ffi_env_stream=True)``). So the hot path is one dictionary
lookup and one FFI call: no ``from_dlpack``, no re-tracing, no host synchronization, and
the launch can be captured in a CUDA graph. ``cute.compile`` is not thread-safe, hence
the lock.

Fake tensors: dynamic extents are ``sym_int``; the token count ``T`` is one shared symbol,
so TVM-FFI checks that all per-token arrays have the same length. Strides are plain
dynamic 64-bit symbols without divisibility promises (kernels build aligned pointers from
the alignment the front end checked; see :mod:`.memory`); compile-time values (``bs``,
``B``, row widths) are static extents, which TVM-FFI also checks at call time.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Callable

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, Int64, Uint8

from .config import (
    HEAD_DIM,
    ROPE_DIM,
    C4Config,
    C128PoolConfig,
    ClusterConfig,
    EntryFormat,
    HandoffConfig,
    PipelinedConfig,
    SaveConfig,
    StoreConfig,
)

_LOCK = threading.RLock()
log = logging.getLogger("dsv4_compressor")
_CACHE: dict[tuple, object] = {}

_DUMP_DIR: str | None = None


def _dump_dir() -> str:
    """A private temporary folder for kept PTX (the DSL writes it next to ``__ptx__``)."""
    global _DUMP_DIR
    if _DUMP_DIR is None:
        _DUMP_DIR = tempfile.mkdtemp(prefix="dsv4_cutedsl_ptx_")
        atexit.register(shutil.rmtree, _DUMP_DIR, True)
    return _DUMP_DIR


def _options(keep_ptx: bool) -> str:
    """TVM-FFI calling convention; ``keep_ptx`` also keeps the PTX text (``compiled.__ptx__``)."""
    if not keep_ptx:
        return "--enable-tvm-ffi"
    return f"--enable-tvm-ffi --keep-ptx --dump-dir={_dump_dir()}"


def cached(key: tuple, build: Callable[[], object]):
    """The compiled object for ``key``, building it on first use (thread-safe)."""
    full_key = key + (os.environ.get("CUTE_DSL_ARCH", ""), cutlass.__version__)
    compiled = _CACHE.get(full_key)
    if compiled is None:
        with _LOCK:
            compiled = _CACHE.get(full_key)
            if compiled is None:
                start = time.perf_counter()
                compiled = build()
                _CACHE[full_key] = compiled
                log.info("cutedsl: compiled %s in %.1f s", getattr(key[1], "tag", key[1]), time.perf_counter() - start)
    return compiled


def clear() -> None:
    """Forget every compiled kernel (tests)."""
    with _LOCK:
        _CACHE.clear()


# ---- fake tensors ---------------------------------------------------------------------
def _dyn_stride():
    return cute.sym_int64()


def fake_per_token(dtype, num_tokens):
    """int32/int64 ``[T]``, unit stride."""
    return cute.runtime.make_fake_compact_tensor(dtype, (num_tokens,), assumed_align=dtype.width // 8)


def fake_state_cache(block_size: int, row_width: int):
    """fp32 ``[num_blocks, bs, 2*SW]``, base 16-byte aligned, strides (s0, s1, 1)."""
    return cute.runtime.make_fake_tensor(
        Float32, (cute.sym_int(), block_size, row_width), stride=(_dyn_stride(), _dyn_stride(), 1), assumed_align=16
    )


def fake_block_table():
    """int32 ``[num_reqs, max_blocks]``, any row stride."""
    return cute.runtime.make_fake_tensor(Int32, (cute.sym_int(), cute.sym_int()), stride=(_dyn_stride(), 1), assumed_align=4)


def fake_x_buffer():
    """fp32 ``[S, 512]`` scratch/output, rows 16-byte aligned (checked by the front end)."""
    return cute.runtime.make_fake_tensor(Float32, (cute.sym_int(), HEAD_DIM), stride=(_dyn_stride(), 1), assumed_align=16)


def fake_weight(weight_dtype: str):
    dtype = BFloat16 if weight_dtype == "bfloat16" else Float32
    return cute.runtime.make_fake_tensor(dtype, (HEAD_DIM,), stride=(1,), assumed_align=dtype.width // 8)


def fake_cos_sin():
    return cute.runtime.make_fake_tensor(Float32, (cute.sym_int(), ROPE_DIM), stride=(_dyn_stride(), 1), assumed_align=4)


def fake_k_cache(entry: EntryFormat):
    """``k_cache`` with a static ``B``; strides dynamic (SPEC allows padded page strides)."""
    B = entry.entries_per_page
    if entry.layout == "flashmla_fp8":
        shape, dtype = (cute.sym_int(), B, 584), Uint8
    elif entry.layout == "bf16":
        shape, dtype = (cute.sym_int(), B, HEAD_DIM), BFloat16
    else:
        shape, dtype = (cute.sym_int(), B, HEAD_DIM), Float8E4M3FN
    return cute.runtime.make_fake_tensor(dtype, shape, stride=(_dyn_stride(), _dyn_stride(), 1), assumed_align=entry.store_align)


def fake_stream():
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)


# ---- compile functions ------------------------------------------------------------------
def compile_c4(config: C4Config, *, keep_ptx: bool = False):
    """C4 fused (``config.entry`` set) or pooling-only (``entry=None``) kernel."""

    def build():
        from .pooling_c4 import C4FusedKernel, C4PoolKernel

        T = cute.sym_int()
        state = fake_state_cache(config.block_size, 4 * HEAD_DIM)
        token_req, positions = fake_per_token(Int32, T), fake_per_token(Int64, T)
        slots, kv_slots = fake_per_token(Int64, T), fake_per_token(Int64, T)
        if config.entry is None:
            return cute.compile(C4PoolKernel(config), state, token_req, positions, slots, fake_block_table(), kv_slots,
                                fake_x_buffer(), fake_stream(), options=_options(keep_ptx))
        return cute.compile(
            C4FusedKernel(config), state, token_req, positions, slots, fake_block_table(),
            fake_weight(config.entry.weight_dtype), fake_cos_sin(), fake_k_cache(config.entry), kv_slots,
            Float32(1e-6), Float32(1.0), fake_stream(), options=_options(keep_ptx),
        )

    return cached(("c4", config, keep_ptx), build)


def compile_c128_pool(config: C128PoolConfig, *, keep_ptx: bool = False):
    """C128 split path, compress kernel (Block8 or generic): writes x to the scratch."""

    def build():
        from .pooling_c128 import C128PoolKernel

        T = cute.sym_int()
        return cute.compile(
            C128PoolKernel(config), fake_state_cache(config.block_size, 2 * HEAD_DIM), fake_per_token(Int32, T),
            fake_per_token(Int64, T), fake_per_token(Int64, T), fake_block_table(), fake_per_token(Int64, T),
            fake_x_buffer(), fake_stream(), options=_options(keep_ptx),
        )

    return cached(("c128_pool", config, keep_ptx), build)


def compile_c128_store(config: StoreConfig, *, keep_ptx: bool = False):
    """C128 split path, store kernel: x scratch -> cache entries."""

    def build():
        from .store import C128StoreKernel

        T = cute.sym_int()
        return cute.compile(
            C128StoreKernel(config), fake_x_buffer(), fake_per_token(Int64, T), fake_per_token(Int64, T),
            fake_per_token(Int64, T), fake_weight(config.entry.weight_dtype), fake_cos_sin(),
            fake_k_cache(config.entry), Float32(1e-6), Float32(1.0), fake_stream(), options=_options(keep_ptx),
        )

    return cached(("c128_store", config, keep_ptx), build)


def fused_c128_inputs(config: ClusterConfig) -> tuple:
    """The nine tensor arguments every single-launch C128 kernel starts with (cluster, handoff,
    stream): state cache, token_to_req, positions, slots, block table, weight, cos/sin,
    k_cache, kv slots."""
    T = cute.sym_int()
    return (fake_state_cache(config.pool.block_size, 2 * HEAD_DIM), fake_per_token(Int32, T), fake_per_token(Int64, T),
            fake_per_token(Int64, T), fake_block_table(), fake_weight(config.entry.weight_dtype), fake_cos_sin(),
            fake_k_cache(config.entry), fake_per_token(Int64, T))


def compile_c128_cluster(config: ClusterConfig, *, keep_ptx: bool = False):
    """C128 single-launch kernel on 8-CTA clusters."""

    def build():
        from .fused_c128_cluster import C128ClusterKernel

        return cute.compile(
            C128ClusterKernel(config), *fused_c128_inputs(config),
            Float32(1e-6), Float32(1.0), fake_stream(), options=_options(keep_ptx),
        )

    return cached(("c128_cluster", config, keep_ptx), build)


def compile_c128_handoff(config: HandoffConfig, *, keep_ptx: bool = False):
    """C128 single-launch kernel without clusters (the last CTA of a token finishes it)."""

    def build():
        from .fused_c128_handoff import C128HandoffKernel

        return cute.compile(
            C128HandoffKernel(config), *fused_c128_inputs(config),
            fake_x_buffer(), fake_per_token(Int32, cute.sym_int()), Float32(1e-6), Float32(1.0), fake_stream(),
            options=_options(keep_ptx),
        )

    return cached(("c128_handoff", config, keep_ptx), build)


def compile_c128_pipelined(config: PipelinedConfig, *, keep_ptx: bool = False):
    """C128 single-launch kernel on a persistent grid of 8-CTA clusters (``G`` a launch argument);
    its cubin is kept for the driver's cluster-occupancy query (:mod:`.occupancy`)."""

    def build():
        from .fused_c128_pipelined import C128PipelinedKernel

        return cute.compile(
            C128PipelinedKernel(config), *fused_c128_inputs(config),
            Float32(1e-6), Float32(1.0), Int32(1), fake_stream(),
            options=f"{_options(keep_ptx)} --keep-cubin --dump-dir={_dump_dir()}",
        )

    return cached(("c128_pipelined", config, keep_ptx), build)


def compile_save(config: SaveConfig, *, keep_ptx: bool = False):
    """save_partial_states."""

    def build():
        from .save_states import SavePartialStatesKernel

        T = cute.sym_int()
        row = 2 * config.state_width
        align = 16 if config.vector_inputs else 4
        kv_score = cute.runtime.make_fake_tensor(Float32, (T, row), stride=(_dyn_stride(), 1), assumed_align=align)
        ape = cute.runtime.make_fake_tensor(Float32, (config.compress_ratio, config.state_width), stride=(_dyn_stride(), 1),
                                            assumed_align=align)
        return cute.compile(
            SavePartialStatesKernel(config), kv_score, ape, fake_per_token(Int64, T), fake_per_token(Int64, T),
            fake_state_cache(config.block_size, row), fake_stream(), options=_options(keep_ptx),
        )

    return cached(("save", config, keep_ptx), build)
