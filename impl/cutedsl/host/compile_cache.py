"""Compile each kernel once per static configuration, tensor-free, and cache it in process.

Why tensor-free: the compile functions take only hashable configurations
(:mod:`..config`), build fake tensors with symbolic sizes and strides, and return a TVM-FFI
callable that takes torch tensors directly and launches on torch's current stream
(``make_fake_stream(use_tvm_ffi_env_stream=True)``). So the hot path is one dictionary
lookup and one FFI call: no ``from_dlpack``, no re-tracing, no host synchronization, and
the launch can be captured in a CUDA graph. ``cute.compile`` is not thread-safe, hence
the lock.

Fake tensors: dynamic extents are ``sym_int``; the token count ``T`` is one shared symbol,
so TVM-FFI checks that all per-token arrays have the same length. Strides are plain
dynamic 64-bit symbols without divisibility promises (kernels build aligned pointers from
the alignment the front end checked; see :mod:`..stages.memory`); compile-time values (``bs``,
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

from ....spec.entry_layout import ENTRY_LAYOUTS
from .buffers import ffi_function
from ..config import (
    HEAD_DIM,
    INDEXER_HEAD_DIM,
    ROPE_DIM,
    C4Config,
    C128PoolConfig,
    FusedClusterConfig,
    EntryFormat,
    FusedHandoffConfig,
    IndexerConfig,
    FusedPipelinedConfig,
    SaveConfig,
    SplitStoreConfig,
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


def target_arch(arch: str | None = None) -> str:
    """The GPU architecture a compile targets: ``arch`` when given, else ``CUTE_DSL_ARCH`` as it
    is now, else ``""`` (the DSL asks the device). The DSL reads ``CUTE_DSL_ARCH`` once per
    process, so the target goes to every compile as ``--gpu-arch`` and into its cache key."""
    return arch or os.environ.get("CUTE_DSL_ARCH", "")


def _options(keep_ptx: bool, arch: str = "") -> str:
    """TVM-FFI calling convention, the target (``arch``; empty: the DSL's own choice); ``keep_ptx``
    also keeps the PTX text (``compiled.__ptx__``)."""
    target = f" --gpu-arch={arch}" if arch else ""
    if not keep_ptx:
        return f"--enable-tvm-ffi{target}"
    return f"--enable-tvm-ffi{target} --keep-ptx --dump-dir={_dump_dir()}"


def cached(key: tuple, build: Callable[[], object], arch: str | None = None):
    """The compiled object for ``key`` on target ``arch`` (:func:`target_arch`), building it on
    first use (thread-safe)."""
    full_key = key + (target_arch(arch), cutlass.__version__)
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


def fake_state_cache(block_size: int, row_width: int, dtype: str = "float32"):
    """fp32 (or bf16, SPEC §13.1) ``[num_blocks, bs, 2*SW]``, base 16-byte aligned, strides (s0, s1, 1)."""
    element = BFloat16 if dtype == "bfloat16" else Float32
    return cute.runtime.make_fake_tensor(
        element, (cute.sym_int(), block_size, row_width), stride=(_dyn_stride(), _dyn_stride(), 1), assumed_align=16
    )


def fake_ape(ratio: int, state_width: int, align: int = 4):
    """fp32 ``ape`` ``[r, SW]``, unit last stride, any row stride (``align``: its rows' alignment)."""
    return cute.runtime.make_fake_tensor(Float32, (ratio, state_width), stride=(_dyn_stride(), 1), assumed_align=align)


def state_format_arguments(state, ratio: int, state_width: int) -> tuple:
    """The launch arguments after the stream of a kernel with a SPEC §13 state format: ``ape``
    (``ape_at="compress"``; else ``None``) and ``ring_capacity``; none for the default format.
    With ``rows_from_inputs`` (SPEC §13.4) ``ape`` always, then ``kv`` and ``score`` (fp32 ``[T, SW]``,
    16-byte aligned rows, any row stride) and ``query_start_loc`` (int32 ``[num_reqs + 1]``)."""
    if state.is_default:
        return ()
    if state.rows_from_inputs:
        T = cute.sym_int()
        return (fake_ape(ratio, state_width), Int32(8), fake_rows("float32", state_width, T),
                fake_rows("float32", state_width, T), fake_per_token(Int32, cute.sym_int()))
    return (fake_ape(ratio, state_width) if state.ape_at == "compress" else None, Int32(8))


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


_ELEMENTS = {"uint8": Uint8, "bfloat16": BFloat16, "float8_e4m3fn": Float8E4M3FN}  # spec.entry_layout's dtypes


def fake_k_cache(layout: str, entries_per_page: int, store_align: int):
    """``k_cache`` of a layout (:mod:`dsv4_compressor.spec.entry_layout`) with a static ``B``;
    strides dynamic (SPEC allows padded page strides)."""
    entry = ENTRY_LAYOUTS[layout]
    shape = (cute.sym_int(), entries_per_page, entry.entry_elements)
    return cute.runtime.make_fake_tensor(_ELEMENTS[entry.element], shape, stride=(_dyn_stride(), _dyn_stride(), 1),
                                         assumed_align=store_align)


def fake_entry_cache(entry: EntryFormat):
    """``k_cache`` of a 512-wide entry format."""
    return fake_k_cache(entry.layout, entry.entries_per_page, entry.store_align)


def fake_stream():
    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)


# ---- compile functions ------------------------------------------------------------------
def compile_c4(config: C4Config, *, keep_ptx: bool = False, arch: str | None = None):
    """C4 fused (``config.entry`` set) or pooling-only (``entry=None``) kernel."""
    arch = target_arch(arch)

    def build():
        from ..kernels.c4 import C4FusedKernel, C4PoolKernel

        T = cute.sym_int()
        state = fake_state_cache(config.block_size, 4 * HEAD_DIM, config.state.dtype)
        token_req, positions = fake_per_token(Int32, T), fake_per_token(Int64, T)
        slots, kv_slots = fake_per_token(Int64, T), fake_per_token(Int64, T)
        formats = state_format_arguments(config.state, 4, 2 * HEAD_DIM)
        if config.entry is None:
            return cute.compile(C4PoolKernel(config), state, token_req, positions, slots, fake_block_table(), kv_slots,
                                fake_x_buffer(), fake_stream(), *formats, options=_options(keep_ptx, arch))
        return cute.compile(
            C4FusedKernel(config), state, token_req, positions, slots, fake_block_table(),
            fake_weight(config.entry.weight_dtype), fake_cos_sin(), fake_entry_cache(config.entry), kv_slots,
            Float32(1e-6), Float32(1.0), fake_stream(), *formats, options=_options(keep_ptx, arch),
        )

    return cached(("c4", config, keep_ptx), build, arch)


def compile_split_pool(config: C128PoolConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """C128 split path, compress kernel (Block8 or generic): writes x to the scratch."""
    arch = target_arch(arch)

    def build():
        from ..kernels.split_pool import SplitPoolKernel

        T = cute.sym_int()
        return cute.compile(
            SplitPoolKernel(config), fake_state_cache(config.block_size, 2 * HEAD_DIM, config.state.dtype),
            fake_per_token(Int32, T), fake_per_token(Int64, T), fake_per_token(Int64, T), fake_block_table(),
            fake_per_token(Int64, T), fake_x_buffer(), fake_stream(),
            *state_format_arguments(config.state, 128, HEAD_DIM), options=_options(keep_ptx, arch),
        )

    return cached(("split_pool", config, keep_ptx), build, arch)


def compile_split_store(config: SplitStoreConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """C128 split path, store kernel: x scratch -> cache entries."""
    arch = target_arch(arch)

    def build():
        from ..kernels.split_store import SplitStoreKernel

        T = cute.sym_int()
        return cute.compile(
            SplitStoreKernel(config), fake_x_buffer(), fake_per_token(Int64, T), fake_per_token(Int64, T),
            fake_per_token(Int64, T), fake_weight(config.entry.weight_dtype), fake_cos_sin(),
            fake_entry_cache(config.entry), Float32(1e-6), Float32(1.0), fake_stream(),
            options=_options(keep_ptx, arch),
        )

    return cached(("split_store", config, keep_ptx), build, arch)


def fused_c128_inputs(config: FusedClusterConfig) -> tuple:
    """The nine tensor arguments every single-launch C128 kernel starts with (cluster, handoff,
    stream): state cache, token_to_req, positions, slots, block table, weight, cos/sin,
    k_cache, kv slots."""
    T = cute.sym_int()
    return (fake_state_cache(config.pool.block_size, 2 * HEAD_DIM), fake_per_token(Int32, T), fake_per_token(Int64, T),
            fake_per_token(Int64, T), fake_block_table(), fake_weight(config.entry.weight_dtype), fake_cos_sin(),
            fake_entry_cache(config.entry), fake_per_token(Int64, T))


def compile_fused_cluster(config: FusedClusterConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """C128 single-launch kernel on 8-CTA clusters."""
    arch = target_arch(arch)

    def build():
        from ..kernels.fused_cluster import FusedClusterKernel

        return cute.compile(
            FusedClusterKernel(config), *fused_c128_inputs(config),
            Float32(1e-6), Float32(1.0), fake_stream(), options=_options(keep_ptx, arch),
        )

    return cached(("fused_cluster", config, keep_ptx), build, arch)


def compile_fused_handoff(config: FusedHandoffConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """C128 single-launch kernel without clusters (the last CTA of a token finishes it)."""
    arch = target_arch(arch)

    def build():
        from ..kernels.fused_handoff import FusedHandoffKernel

        return cute.compile(
            FusedHandoffKernel(config), *fused_c128_inputs(config),
            fake_x_buffer(), fake_per_token(Int32, cute.sym_int()), Float32(1e-6), Float32(1.0), fake_stream(),
            options=_options(keep_ptx, arch),
        )

    return cached(("fused_handoff", config, keep_ptx), build, arch)


def compile_fused_pipelined(config: FusedPipelinedConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """C128 single-launch kernel on a persistent grid of 8-CTA clusters (``G`` a launch argument);
    its cubin is kept for the driver's cluster-occupancy query (:mod:`.occupancy`). An fp32 state of
    SPEC §13 (``config.pool.state``) adds its launch arguments after the stream."""
    arch = target_arch(arch)

    def build():
        from ..kernels.fused_pipelined import FusedPipelinedKernel

        return cute.compile(
            FusedPipelinedKernel(config), *fused_c128_inputs(config),
            Float32(1e-6), Float32(1.0), Int32(1), fake_stream(),
            *state_format_arguments(config.pool.state, 128, HEAD_DIM),
            options=f"{_options(keep_ptx, arch)} --keep-cubin --dump-dir={_dump_dir()}",
        )

    return cached(("fused_pipelined", config, keep_ptx), build, arch)


def compile_save(config: SaveConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """save_partial_states."""
    arch = target_arch(arch)

    def build():
        from ..kernels.save import SavePartialStatesKernel

        T = cute.sym_int()
        row = 2 * config.state_width
        align = 16 if config.vector_inputs else 4
        width = config.state_width if config.split_inputs else row  # split: kv [T, SW], score [T, SW] after the stream
        kv_score = cute.runtime.make_fake_tensor(Float32, (T, width), stride=(_dyn_stride(), 1), assumed_align=align)
        score = (cute.runtime.make_fake_tensor(Float32, (T, width), stride=(_dyn_stride(), 1), assumed_align=align),
                 ) if config.split_inputs else ()
        ape = None if config.state.ape_at == "compress" else fake_ape(config.compress_ratio, config.state_width, align)
        return cute.compile(
            SavePartialStatesKernel(config), kv_score, ape, fake_per_token(Int64, T), fake_per_token(Int64, T),
            fake_state_cache(config.block_size, row, config.state.dtype), fake_stream(), *score,
            options=_options(keep_ptx, arch),
        )

    return cached(("save", config, keep_ptx), build, arch)


def compile_indexer(config: IndexerConfig, *, keep_ptx: bool = False, arch: str | None = None):
    """The indexer compressor's kernel (SPEC §12): C4 or C128 by ``config.ratio``."""
    arch = target_arch(arch)

    def build():
        from ..kernels.indexer import indexer_kernel

        T = cute.sym_int()
        weight_dtype = BFloat16 if config.weight_dtype == "bfloat16" else Float32
        weight = cute.runtime.make_fake_tensor(weight_dtype, (INDEXER_HEAD_DIM,), stride=(1,),
                                               assumed_align=weight_dtype.width // 8)
        k_cache = fake_k_cache(config.layout, config.entries_per_page, 16)  # page stride dynamic, aligned base
        return cute.compile(
            indexer_kernel(config), fake_state_cache(config.block_size, 2 * config.state_width, config.state.dtype),
            fake_per_token(Int32, T), fake_per_token(Int64, T),
            fake_per_token(Int64, T), fake_block_table(), weight,
            fake_cos_sin(), k_cache, fake_per_token(Int64, T), Float32(1e-6),
            fake_stream(), *state_format_arguments(config.state, config.ratio, config.state_width),
            options=_options(keep_ptx, arch),
        )

    return cached(("indexer", config, keep_ptx), build, arch)


# ---- DeepSeek-V4.1 (SPEC §14) ----------------------------------------------------------------
_DTYPES = {"float32": Float32, "bfloat16": BFloat16}


def fake_rows(dtype: str, width: int, num_tokens, align: int = 16):
    """fp32 or bf16 ``[T, width]`` rows (``kv``, ``score``, ``latent``, ``k_pre``), unit last stride,
    any row stride; base aligned to ``align`` bytes (16: SPEC §14.8's aligned rows)."""
    return cute.runtime.make_fake_tensor(_DTYPES[dtype], (num_tokens, width), stride=(_dyn_stride(), 1),
                                         assumed_align=align)


def fake_v41_state(dtype: str, block_size: int):
    """fp32 or bf16 ``[num_state_blocks, bs, 1024]``, base 16-byte aligned, strides (s0, s1, 1)."""
    return cute.runtime.make_fake_tensor(_DTYPES[dtype], (cute.sym_int(), block_size, 2 * HEAD_DIM),
                                         stride=(_dyn_stride(), _dyn_stride(), 1), assumed_align=16)


def fake_v41_k_cache(record):
    """``k_cache`` of a V4.1 record format (:class:`..v41_config.V41RecordFormat`): the record
    layouts' uint8 ``[num_pages, B, E]``, the rows layouts' ``[num_pages, B, 512]``."""
    entry = record.entry
    shape = (cute.sym_int(), record.entries_per_page, entry.entry_elements)
    return cute.runtime.make_fake_tensor(_ELEMENTS[entry.element], shape, stride=(_dyn_stride(), _dyn_stride(), 1),
                                         assumed_align=record.store_align)


def compile_v41_compress(config, *, keep_ptx: bool = False, arch: str | None = None):
    """DeepSeek-V4.1's compress kernel (``v41_compress_norm``, ``v41_compress_norm_rope_store``);
    the arguments a configuration does not read are ``None``."""
    arch = target_arch(arch)

    def build():
        from ..kernels.v41_compress import V41CompressKernel

        T = cute.sym_int()
        ratio2 = config.ratio == 2
        state = dict(
            mScore=fake_rows(config.score_dtype, HEAD_DIM, T) if ratio2 else None,
            mTokenReq=fake_per_token(Int32, T) if ratio2 else None,
            mSlot=fake_per_token(Int64, T) if ratio2 else None,
            mSave=fake_per_token(Int64, T) if ratio2 else None,
            mQsl=fake_per_token(Int32, cute.sym_int()) if ratio2 else None,
            mState=fake_v41_state(config.state_dtype, config.block_size) if ratio2 else None,
            mBlockTable=fake_block_table() if ratio2 else None,
        )
        store = config.record is not None
        return cute.compile(
            V41CompressKernel(config), fake_rows(config.kv_dtype, HEAD_DIM, T), state["mScore"],
            fake_per_token(Int64, T), fake_per_token(Int64, T), state["mTokenReq"], state["mSlot"], state["mSave"],
            state["mQsl"], state["mState"], state["mBlockTable"], fake_weight(config.weight_dtype),
            fake_rows("bfloat16", HEAD_DIM, T) if config.latent else None, fake_cos_sin() if store else None,
            fake_v41_k_cache(config.record) if store else None, Float32(1e-6), Float32(1.0), Int32(2), fake_stream(),
            options=_options(keep_ptx, arch),
        )

    return cached(("v41_compress", config, keep_ptx), build, arch)


def compile_v41_store(config, *, keep_ptx: bool = False, arch: str | None = None):
    """DeepSeek-V4.1's ``v41_rope_quant_store`` kernel."""
    arch = target_arch(arch)

    def build():
        from ..kernels.v41_store import V41StoreKernel

        T = cute.sym_int()
        return cute.compile(
            V41StoreKernel(config), fake_rows("bfloat16", HEAD_DIM, T), fake_per_token(Int64, T),
            fake_per_token(Int64, T), fake_cos_sin(), fake_v41_k_cache(config.record), Float32(1.0), fake_stream(),
            options=_options(keep_ptx, arch),
        )

    return cached(("v41_store", config, keep_ptx), build, arch)


def compile_v41_index_key(config, *, keep_ptx: bool = False, arch: str | None = None):
    """DeepSeek-V4.1's ``v41_index_key_store`` kernel (``k_pre`` rows need no alignment)."""
    arch = target_arch(arch)

    def build():
        from ..kernels.v41_index_key import V41IndexKeyKernel

        T = cute.sym_int()
        weight_dtype = _DTYPES[config.weight_dtype]
        weight = cute.runtime.make_fake_tensor(weight_dtype, (INDEXER_HEAD_DIM,), stride=(1,),
                                               assumed_align=weight_dtype.width // 8)
        return cute.compile(
            V41IndexKeyKernel(config), fake_rows("bfloat16", INDEXER_HEAD_DIM, T, align=2), fake_per_token(Int64, T),
            fake_per_token(Int64, T), weight, fake_cos_sin(), fake_k_cache(config.layout, config.entries_per_page, 16),
            Float32(1e-6), fake_stream(), options=_options(keep_ptx, arch),
        )

    return cached(("v41_index_key", config, keep_ptx), build, arch)


KERNELS = {  # kernel name -> its compile function (the names of paths.KernelPath.kernels)
    "c4": compile_c4,
    "split_pool": compile_split_pool,
    "split_store": compile_split_store,
    "fused_cluster": compile_fused_cluster,
    "fused_handoff": compile_fused_handoff,
    "fused_pipelined": compile_fused_pipelined,
    "indexer": compile_indexer,
    "save": compile_save,
    "v41_compress": compile_v41_compress,
    "v41_store": compile_v41_store,
    "v41_index_key": compile_v41_index_key,
}


def compile_kernel(kernel: str, config, *, keep_ptx: bool = False, arch: str | None = None):
    """The compiled TVM-FFI callable of kernel ``kernel`` for a static configuration (cached);
    ``arch``: the target (:func:`target_arch`)."""
    return KERNELS[kernel](config, keep_ptx=keep_ptx, arch=arch)


def compile_path(path, configs: tuple) -> tuple[tuple, tuple]:
    """``(compiled kernels, their TVM-FFI functions)`` of a :class:`.paths.KernelPath` for its
    static configurations (``path.configs(request)``), in launch order (compiled on first use)."""
    compiled = tuple(compile_kernel(kernel, config) for kernel, config in zip(path.kernels, configs))
    return compiled, tuple(ffi_function(kernel) for kernel in compiled)
