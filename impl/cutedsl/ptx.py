"""Every static configuration CI compiles, with its PTX, for the SPEC §2 PTX rules.

``python -m dsv4_compressor ptx-check`` calls :func:`ptx_variants` and applies
:func:`dsv4_compressor.impl.ptx_rules.check_ptx` (only ``.rn`` arithmetic, no FMA, no
approximate functions, no ``.ftz``, 128-bit loads where state rows stream).

The list is generated, not written out: for every kernel path of the registry
(:data:`.host.paths.PATHS`), the configurations its kernels run in production (the default
policy, PDL, bf16 weights, 64 entries a page, the production block sizes), the pooling-only
kernels of ``compress`` and the save kernel (also as SPEC §13.4's step call saves), each with its neighbours in the configuration
space (:func:`.space.neighbours`: every layout with each store alignment it allows, both
weight dtypes, ``B`` of 1, 7 and 64, block sizes that take each lookup granularity, every
mapping knob, PDL on and off, early metadata, SPEC §13's state formats where a kernel takes
them: each option alone and all together), and DeepSeek-V4.1's kernels (:mod:`.v41_ptx`: every
option of each at least once). A variant is named by its configuration's tag.
Compilation needs no GPU: each compile names its target (``--gpu-arch``; :data:`TARGET`,
Hopper, unless another is asked for: ``sm_100a`` or ``sm_103a`` for Blackwell), whatever
``CUTE_DSL_ARCH`` says. :func:`knows_target` tells whether the installed DSL has a target.
"""

from __future__ import annotations

from typing import Iterator

from . import v41_ptx

TARGET = "sm_90a"


def _production_requests():
    """A request of each ratio and head width as engines make it (SPEC §3's block sizes, the
    default layout; the other layouts are neighbours)."""
    from .host.paths import PathRequest
    from .host.policy import DEFAULT_POLICY

    for ratio, block_size, layout in ((4, 4, "flashmla_fp8"), (128, 8, "flashmla_fp8"), (4, 16, "indexer_fp8"),
                                      (128, 8, "indexer_fp8")):
        yield PathRequest(ratio, block_size, 1, layout, 64, "bfloat16", 16, False, DEFAULT_POLICY, True)


def kernel_configs() -> Iterator[tuple[str, object]]:
    """``(kernel, static config)`` of every CI variant, without duplicates."""
    from ...spec.entry_layout import ENTRY_LAYOUTS
    from .config import StateFormat
    from .host.paths import paths_for, save_config, step_save_config
    from .space import neighbours

    bases = {}
    for request in _production_requests():
        head_dim = ENTRY_LAYOUTS[request.layout].head_dim
        for path in paths_for(request.ratio, head_dim):
            bases.update(dict.fromkeys(zip(path.kernels, path.configs(request))))
            if path.pooling is not None:
                kernel, configs = path.pooling
                bases[(kernel, configs(request))] = None
        bases[("save", save_config(request.ratio, request.block_size, True, request.policy, True, head_dim))] = None
        ring_step = StateFormat("float32", "save", True, True)  # the step call's save (SPEC §13.4) on a ring
        bases[("save", step_save_config(request.ratio, request.block_size, True, request.policy, True, head_dim,
                                        ring_step, 1))] = None
    seen = {}
    for kernel, base in bases:
        for config in neighbours(base):
            seen.setdefault((kernel, config))
    for kernel, config in v41_ptx.kernel_configs():  # DeepSeek-V4.1's kernels (SPEC §14): listed there
        seen.setdefault((kernel, config))
    return iter(seen)


def streams_rows(kernel: str, config) -> bool:
    """Whether the kernel streams state or input rows, which the PTX rules want in 128-bit loads
    (the split store kernel reads x; the save kernel's rows are 16-byte aligned only with
    ``vector_inputs``; a bf16 state's rows (SPEC §13.1) are 8 bytes a thread; V4.1's kernels:
    :func:`.v41_ptx.streams_rows`)."""
    if kernel in v41_ptx.KERNELS:
        return v41_ptx.streams_rows(kernel, config)
    state = getattr(config, "state", None)
    if kernel != "save" and state is not None and state.dtype == "bfloat16":
        return False
    return kernel != "split_store" and getattr(config, "vector_inputs", True)


def compile_variant(kernel: str, config, *, keep_ptx: bool = True, target: str = TARGET):
    """The compiled TVM-FFI function of one variant for ``target`` (cached)."""
    from .host import compile_cache

    return compile_cache.compile_kernel(kernel, config, keep_ptx=keep_ptx, arch=target)


def knows_target(target: str) -> bool:
    """Whether the installed CuTe DSL has the architecture ``target`` (``"sm_103a"``, ...)."""
    from cutlass.base_dsl import Arch

    return target in Arch.__members__


def toolchain() -> str:
    """The compiler that makes this backend's PTX, for messages."""
    import cutlass

    return f"nvidia-cutlass-dsl {cutlass.__version__}"


def ptx_variants(target: str = TARGET) -> Iterator[tuple[str, str, dict]]:
    """Compile every variant for ``target``; yield ``(variant_name, ptx_text, check options)``."""
    for kernel, config in kernel_configs():
        compiled = compile_variant(kernel, config, target=target)
        yield config.tag, compiled.__ptx__, {"require_vector_loads": streams_rows(kernel, config)}
