"""PTX of every Triton kernel variant, compiled without a GPU for Hopper (sm_90a) or Blackwell
(sm_100a, sm_103a) (SPEC §2 instruction rules).

:func:`ptx_variants` yields ``(variant_name, ptx_text, {"require_vector_loads": bool})`` for both
ratios, all three layouts, both weight dtypes, representative state block sizes and the default
and alternative knob settings, and the same kernel on the indexer's head (SPEC §12: both
layouts, with and without the rotation), compiled with ``enable_fp_fusion=False`` exactly as the
launches are, for the compute capability of a PTX target (:func:`capability`).
Feed them to :func:`dsv4_compressor.impl.ptx_rules.check_ptx`.

``TRITON_INTERPRET=1`` makes ``@triton.jit`` return interpreter objects that cannot be compiled.
When it is set in this process, :func:`ptx_variants` compiles in a child Python process with the
variable removed (``python -m dsv4_compressor.impl.triton.ptx --json --arch TARGET``) and yields
its results, so callers need not care. :func:`resource_usage` runs Triton's bundled ``ptxas`` on a PTX text to
read registers and spills (no GPU needed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from . import v41_ptx
from .ptx_variant import Variant

#: The PTX target of the default check. Triton's NVIDIA backend always appends "a" for capability
#: >= 90 (``sm_arch_from_capability``, in 3.6 and 3.9 alike), so Triton PTX for capability 9.0 says
#: ``.target sm_90a`` (10.0: ``sm_100a``, 10.3: ``sm_103a``); the kernels use no arch-specific
#: instruction (no wgmma/setmaxnreg, no tcgen05).
TARGET = "sm_90a"


def capability(target: str) -> int:
    """Triton's compute capability of a PTX target: ``sm_90a`` -> 90, ``sm_100a`` -> 100,
    ``sm_103a`` -> 103."""
    match = re.fullmatch(r"sm_(\d+)[af]?", target)
    if match is None:
        raise ValueError(f"target: expected a PTX target such as 'sm_90a' or 'sm_100a', got {target!r}")
    return int(match.group(1))


def toolchain() -> str:
    """The compiler that makes this backend's PTX, for messages."""
    import triton

    return f"Triton {triton.__version__}"


def knows_target(target: str) -> bool:
    """Whether the ``ptxas`` Triton bundles for ``target`` lists it (Triton compiles through it)."""
    from triton.backends.nvidia.compiler import get_ptxas

    listing = subprocess.run([get_ptxas(capability(target)).path, "--help"], capture_output=True, text=True,
                             check=False).stdout
    return re.search(rf"\b{re.escape(target)}\b", listing) is not None


#: Triton types of the fused kernel's pointer arguments to k_cache, by layout; None: the argument
#: is None, a constexpr (the indexer's layouts have no int16 view, no entry stride, no fp8 scale).
_CACHE_TYPES = {"flashmla_fp8": ("*u8", "*i16"), "bf16": ("*i16", "*i16"), "fp8_per_tensor": ("*u8", "*u8"),
                "indexer_fp8": ("*u8", None), "indexer_mxfp4": ("*u8", None)}


def _fused_arguments(layout: str, weight_bf16: bool, rows) -> tuple[dict, dict]:
    """(Triton type of every runtime argument, the arguments passed as None) of the fused kernel
    for a layout, a weight dtype and SPEC §13's row format (a :class:`.rows.RowFormat`)."""
    cache_u8, cache_i16 = _CACHE_TYPES[layout]
    types = {
        "state_ptr": "*i16" if rows.state_bf16 else "*fp32", "state_block_stride16b": "i32", "state_row_stride16b": "i32",
        "tokens": ("*i32", "*i64", "*i64", "*i64"),
        "block_table_ptr": "*i32", "block_table_stride": "i32",
        "weight_ptr": "*i16" if weight_bf16 else "*fp32", "eps": "fp32",
        "cos_sin_ptr": "*fp32", "cos_sin_stride": "i32",
        "cache_u8_ptr": cache_u8, "cache_i16_ptr": cache_i16, "cache_page_stride": "i32", "cache_entry_stride": "i32",
        "entries_per_page": "i32", "fp8_scale": "fp32",
        "ape": ("*fp32", "i32"), "chunk": ("*fp32", "i32", "*fp32", "i32", "*i32"),
    }
    nones = {} if cache_i16 is not None else dict.fromkeys(("cache_i16_ptr", "cache_entry_stride", "fp8_scale"))
    if not (rows.ape_at_compress or rows.chunk):
        nones["ape"] = None
    if not rows.chunk:
        nones["chunk"] = None
    return types, nones


def fused_variant(name: str, head_dim: int, ratio: int, block_size: int, layout: str, hadamard: bool,
                  weight_bf16: bool, config, rows=None) -> Variant:
    """The :class:`Variant` of the fused kernel for one static configuration (``rows``: SPEC §13's
    :class:`.rows.RowFormat`, None for the default)."""
    from .fused import kernel_constants
    from .rows import PAGED_FP32_ROWS

    rows = PAGED_FP32_ROWS if rows is None else rows
    window = 2 * ratio if ratio == 4 else ratio
    types, nones = _fused_arguments(layout, weight_bf16, rows)
    constexprs = {**kernel_constants(head_dim, ratio, block_size, layout, hadamard, weight_bf16, config,
                                     config.plan(window), rows), **nones}
    # contiguous ape [r, SW] and projection rows [T, 2*SW] (kv and score views of them): strides the
    # JIT sees divisible by 16, as it specializes them at a launch
    divisible = tuple(name for name in ("ape[1]", "chunk[1]", "chunk[3]") if name.partition("[")[0] not in nones)
    return Variant(name, "fused", constexprs, types, config.num_warps, True, divisible_ints=divisible,
                   max_registers=config.max_registers)


def indexer_variant(ratio: int, block_size: int, layout: str, hadamard: bool, weight_bf16: bool, config) -> Variant:
    """The :class:`Variant` of the fused kernel on the indexer's head (SPEC §12) for one static configuration."""
    name = (f"indexer_c{ratio}_bs{block_size}_{layout}{'_hadamard' if hadamard else ''}_{'bf16w' if weight_bf16 else 'f32w'}"
            f"_bc{config.block_c}_w{config.num_warps}{'' if config.unroll_tiles else '_loop'}"
            f"{'' if config.max_registers is None else f'_r{config.max_registers}'}")
    return fused_variant(name, 128, ratio, block_size, layout, hadamard, weight_bf16, config)


def indexer_variants() -> list[Variant]:
    """The indexer's defaults for both layouts with and without the rotation, plus a knob sweep."""
    from .config import DEFAULT_INDEXER, INDEXER_C4_MANY, FusedConfig

    out = []
    for ratio, block_size in ((4, 16), (4, 4), (128, 8)):
        for layout in ("indexer_fp8", "indexer_mxfp4"):
            for hadamard in (False, True):
                out.append(indexer_variant(ratio, block_size, layout, hadamard, block_size != 4, DEFAULT_INDEXER[ratio]))
    for config in (FusedConfig(block_c=64, num_warps=4), FusedConfig(block_c=128, num_warps=4),
                   FusedConfig(block_c=64, num_warps=2, unroll_tiles=False, max_registers=32), INDEXER_C4_MANY):
        out.append(indexer_variant(4, 16, "indexer_mxfp4", True, True, config))
    return out


_SAVE_TYPES = {
    "kv_score_ptr": "*fp32", "kv_score_stride": "i32", "ape_ptr": "*fp32", "ape_stride": "i32",
    "positions_ptr": "*i64", "slot_mapping_ptr": "*i64", "state_ptr": "*fp32",
    "state_block_stride16b": "i32", "state_row_stride16b": "i32", "block_size": "i32",
    "score_rows": ("*fp32", "i32"),
}


def rows_suffix(rows) -> str:
    """A variant name's suffix for SPEC §13's options (a :class:`.rows.RowFormat`; empty for the default)."""
    return (("_state_bf16" if rows.state_bf16 else "") + ("_ape_at_compress" if rows.ape_at_compress else "")
            + (f"_ring{rows.ring_capacity}" if rows.ring_capacity else "") + ("_step" if rows.chunk else ""))


def kv_variant(ratio: int, block_size: int, layout: str, weight_bf16: bool, config, rows=None) -> Variant:
    """The :class:`Variant` of the fused kernel on the 512-wide head for one static configuration."""
    from .rows import PAGED_FP32_ROWS

    rows = PAGED_FP32_ROWS if rows is None else rows
    name = (f"fused_c{ratio}_bs{block_size}_{layout}_{'bf16w' if weight_bf16 else 'f32w'}"
            f"_bc{config.block_c}_w{config.num_warps}{'' if config.unroll_tiles else f'_loop{config.tile_stages}'}"
            f"{rows_suffix(rows)}")
    return fused_variant(name, 512, ratio, block_size, layout, False, weight_bf16, config, rows)


def save_variant(name: str, ratio: int, state_width: int, config, *, state_bf16: bool = False, add_ape: bool = True,
                 split_score: bool = False) -> Variant:
    """The :class:`Variant` of the save kernel for state rows of ``SW = state_width`` (``config`` a
    :class:`.config.SaveConfig`), contiguous projection and ``ape`` rows (the JIT sees strides
    divisible by 16 and vectorizes; other strides launch a specialization with 32-bit loads).
    SPEC §13: ``state_bf16``, ``add_ape`` (False: ``ape_at = "compress"``, no ``ape``),
    ``split_score`` (§13.4's separate ``kv`` / ``score`` rows)."""
    block, warps = config.launch_shape(state_width)
    constexprs = dict(RATIO=ratio, STATE_WIDTH=state_width, BLOCK=block, STATE_BF16=state_bf16, ADD_APE=add_ape)
    if not add_ape:
        constexprs.update(ape_ptr=None, ape_stride=None)
    if not split_score:
        constexprs.update(score_rows=None)
    types = {**_SAVE_TYPES, "state_ptr": "*i16" if state_bf16 else "*fp32"}
    return Variant(name, "save", constexprs, types, warps, True,
                   divisible_ints=("kv_score_stride", "ape_stride", "score_rows[1]"))


def split_variants() -> list[Variant]:
    """The C128 split path's two kernels (:mod:`.split_pool`, :mod:`.split_store`) on both head widths:
    the pool kernel with SPEC §13's options one at a time and all together, the store kernel in every
    layout and weight dtype."""
    from .config import DEFAULT_SPLIT
    from .rows import RowFormat
    from .split_launch import split_constants

    def variant(name: str, kernel: str, constexprs: dict, types: dict, num_warps: int, divisible: tuple = ()):
        # the pool kernel streams state rows (128-bit loads required); the store reads a pooled vector
        return Variant(name, kernel, constexprs, types, num_warps, kernel == "split_pool", divisible_ints=divisible)

    out = []
    for head, block_size, ring, layouts in ((512, 8, 256, ("flashmla_fp8", "bf16", "fp8_per_tensor")),
                                            (128, 8, 136, ("indexer_fp8", "indexer_mxfp4"))):
        config = DEFAULT_SPLIT[head]
        prefix = f"split{'' if head == 512 else '_indexer'}"
        for rows in (RowFormat(), RowFormat(state_bf16=True), RowFormat(ape_at_compress=True),
                     RowFormat(ring_capacity=ring), RowFormat(chunk=True), RowFormat(True, True, ring, True)):
            pool, _ = split_constants(head, block_size, (layouts[0], False, True), rows, config)
            types, nones = _fused_arguments(layouts[0], True, rows)
            pool_types = {name: types[name] for name in ("state_ptr", "state_block_stride16b", "state_row_stride16b",
                                                         "tokens", "block_table_ptr", "block_table_stride", "ape",
                                                         "chunk")}
            pool_types.update(num_tokens="i32", token_run="i32", pooled_ptr="*fp32")
            divisible = tuple(name for name in ("ape[1]", "chunk[1]", "chunk[3]") if name.partition("[")[0] not in nones)
            out.append(variant(f"{prefix}_pool_c128_bs{block_size}_bc{config.block_c}_w{config.num_warps}{rows_suffix(rows)}",
                               "split_pool", {**pool, **{k: v for k, v in nones.items() if k in ("ape", "chunk")}},
                               pool_types, config.num_warps, divisible))
        for layout in layouts:
            for weight_bf16, hadamard in ((True, head == 128), (False, False)):
                _, store = split_constants(head, block_size, (layout, hadamard, weight_bf16), RowFormat(), config)
                types, nones = _fused_arguments(layout, weight_bf16, RowFormat())
                store_types = {name: types[name] for name in ("tokens", "weight_ptr", "eps", "cos_sin_ptr", "cos_sin_stride",
                                                              "cache_u8_ptr", "cache_i16_ptr", "cache_page_stride",
                                                              "cache_entry_stride", "entries_per_page", "fp8_scale")}
                store_types.update(num_tokens="i32", token_run="i32", pooled_ptr="*fp32")
                constexprs = {**store, **{k: v for k, v in nones.items() if k in store_types}}
                out.append(variant(f"{prefix}_store_c128_{layout}{'_hadamard' if hadamard else ''}"
                                   f"_{'bf16w' if weight_bf16 else 'f32w'}_w{config.store_warps}", "split_store",
                                   constexprs, store_types, config.store_warps))
    return out


def state_format_variants() -> list[Variant]:
    """SPEC §13's options, one at a time and all together, on both head widths and both ratios: a
    bf16 state, ``ape`` added at pooling, a ring, the step call (rows from ``kv`` / ``score``), and
    the save kernel's bf16 state, raw scores and separate ``kv`` / ``score`` rows."""
    from .config import DEFAULT_FUSED, DEFAULT_INDEXER, DEFAULT_SAVE
    from .rows import RowFormat

    def options(ring: int) -> list:
        return [RowFormat(state_bf16=True), RowFormat(ape_at_compress=True), RowFormat(ring_capacity=ring),
                RowFormat(chunk=True), RowFormat(True, True, ring, True)]

    out = []
    for ratio, block_size, ring in ((4, 4, 12), (128, 8, 256)):
        for rows in options(ring):
            out.append(kv_variant(ratio, block_size, "flashmla_fp8", True, DEFAULT_FUSED[ratio], rows))
        for layout in ("bf16", "fp8_per_tensor"):  # every option at once on the other layouts
            out.append(kv_variant(ratio, block_size, layout, False, DEFAULT_FUSED[ratio], RowFormat(True, True, ring, True)))
    for ratio, block_size, ring in ((4, 16, 16), (128, 8, 136)):
        for rows in options(ring):
            name = f"indexer_c{ratio}_bs{block_size}_indexer_mxfp4_hadamard_bf16w{rows_suffix(rows)}"
            out.append(fused_variant(name, 128, ratio, block_size, "indexer_mxfp4", True, True, DEFAULT_INDEXER[ratio], rows))
        rows = RowFormat(True, False, ring, True)
        out.append(fused_variant(f"indexer_c{ratio}_bs{block_size}_indexer_fp8_f32w{rows_suffix(rows)}", 128, ratio,
                                 block_size, "indexer_fp8", False, False, DEFAULT_INDEXER[ratio], rows))
    for ratio, head, state_width in ((4, 512, 1024), (128, 512, 512), (4, 128, 256), (128, 128, 128)):
        prefix = f"save{'' if head == 512 else '_indexer'}_c{ratio}"
        for state_bf16, add_ape, split in ((True, True, False), (False, False, False), (False, True, True),
                                           (True, False, True)):
            name = (f"{prefix}{'_state_bf16' if state_bf16 else ''}{'' if add_ape else '_ape_at_compress'}"
                    f"{'_step' if split else ''}")
            out.append(save_variant(name, ratio, state_width, DEFAULT_SAVE, state_bf16=state_bf16, add_ape=add_ape,
                                    split_score=split))
    return out


def variants() -> list[Variant]:
    """Every variant worth checking: defaults for all (ratio, layout, weight, bs), plus knob sweeps,
    the indexer's and SPEC §13's state formats."""
    from .config import DEFAULT_FUSED, DEFAULT_SAVE, FusedConfig

    fused = kv_variant
    out = []
    for ratio, block_sizes in ((4, (4, 16)), (128, (8, 4))):
        for block_size in block_sizes:
            for layout in ("flashmla_fp8", "bf16", "fp8_per_tensor"):
                for weight_bf16 in (True, False):
                    out.append(fused(ratio, block_size, layout, weight_bf16, DEFAULT_FUSED[ratio]))
    sweeps = {
        4: [FusedConfig(block_c=512, num_warps=4), FusedConfig(block_c=512, num_warps=2), FusedConfig(block_c=256, num_warps=2)],
        128: [FusedConfig(block_c=64, num_warps=8), FusedConfig(block_c=32, num_warps=8, unroll_tiles=False),
              FusedConfig(block_c=32, num_warps=4, unroll_tiles=False),
              FusedConfig(block_c=32, num_warps=4, unroll_tiles=False, tile_stages=2)],
    }
    for ratio, configs in sweeps.items():
        for config in configs:
            variant = fused(ratio, 4 if ratio == 4 else 8, "flashmla_fp8", True, config)
            if config.tile_stages > 1:  # pipelined loops stream the tiles with cp.async (16 B), not ld.global.v4
                variant = Variant(variant.name, variant.kernel, variant.constexprs, variant.signature_types, variant.num_warps, False)
            out.append(variant)
    for ratio in (4, 128):
        out.append(save_variant(f"save_c{ratio}_block{DEFAULT_SAVE.block}_w{DEFAULT_SAVE.num_warps}_contiguous_rows", ratio,
                                1024 if ratio == 4 else 512, DEFAULT_SAVE))
    out += indexer_variants()
    for ratio, state_width in ((4, 256), (128, 128)):  # the indexer's state rows: the launch caps BLOCK at SW
        block, warps = DEFAULT_SAVE.launch_shape(state_width)
        out.append(save_variant(f"save_indexer_c{ratio}_block{block}_w{warps}_contiguous_rows", ratio, state_width,
                                DEFAULT_SAVE))
    out += state_format_variants()
    out += split_variants()
    out += v41_ptx.variants()  # DeepSeek-V4.1's kernels (SPEC §14)
    return out


def _divisibility(signature: dict, names: list, divisible_ints: tuple) -> dict:
    """Triton's ``tt.divisibility`` 16 attributes: every pointer (the bases of all tensor arguments
    are 16-byte aligned, validated) and the integers in ``divisible_ints`` (a tuple argument's
    element as ``"name[j]"``); other integers get no assumptions. A tuple argument's elements are
    keyed ``(argument, element)``."""
    attrs = {}
    for i, name in enumerate(names):
        types = signature[name]
        elements = [((i, j), t, f"{name}[{j}]") for j, t in enumerate(types)] if isinstance(types, tuple) else [((i,), types, name)]
        for key, ty, element in elements:
            if ty.startswith("*") or element in divisible_ints:
                attrs[key] = [["tt.divisibility", 16]]
    return attrs


def _compile(variant: Variant, target: str = TARGET) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .config import launch_options

    if variant.kernel == "fused":
        from .fused import compress_norm_rope_store_kernel as kernel
    elif variant.kernel == "split_pool":
        from .split_pool import split_pool_kernel as kernel
    elif variant.kernel == "split_store":
        from .split_store import split_store_kernel as kernel
    elif variant.kernel in v41_ptx.V41_KERNELS:
        kernel = v41_ptx.kernel(variant.kernel)
    else:
        from .save_states import save_partial_states_kernel as kernel
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("the kernels were decorated under TRITON_INTERPRET=1; compile in a process without it")
    signature = {name: ("constexpr" if name in variant.constexprs else variant.signature_types[name]) for name in kernel.arg_names}
    attrs = _divisibility(signature, kernel.arg_names, variant.divisible_ints)
    source = ASTSource(kernel, signature=signature, constexprs=dict(variant.constexprs), attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability(target), 32),
                              options={**launch_options(variant.num_warps, variant.max_registers),
                                       "enable_fp_fusion": False})
    return compiled.asm["ptx"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _compile_in_child(target: str) -> list[tuple[str, str, dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run([sys.executable, "-m", "dsv4_compressor.impl.triton.ptx", "--json", "--arch", target],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"compiling the Triton PTX variants in a child process failed:\n{done.stderr[-4000:]}")
    return [tuple(item) for item in json.loads(done.stdout)]


def ptx_variants(target: str = TARGET) -> Iterator[tuple[str, str, dict]]:
    """``(variant_name, ptx_text, {"require_vector_loads": bool})`` for every kernel variant,
    compiled for ``target`` (``sm_90a``, ``sm_100a``, ``sm_103a``)."""
    if _interpreting():
        yield from _compile_in_child(target)
        return
    for variant in variants():
        yield variant.name, _compile(variant, target), {"require_vector_loads": variant.require_vector_loads}


def resource_usage(ptx: str) -> dict:
    """Registers, spill bytes and shared memory ptxas reports for ``ptx`` (Triton's bundled ptxas)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    target = re.search(r"^\s*\.target\s+(\w+)", ptx, re.M).group(1)
    ptxas = get_ptxas(capability(target)).path  # the ptxas Triton itself uses for this arch (knows its PTX version)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, "-v", f"--gpu-name={target}", source, "-o", os.path.join(tmp, "kernel.cubin")],
                              capture_output=True, text=True, check=True)
    report = done.stderr
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, report)) else 0  # noqa: E731
    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_stores": number(r"(\d+) bytes spill stores"),
        "spill_loads": number(r"(\d+) bytes spill loads"),
        "stack_frame": number(r"(\d+) bytes stack frame"),
        "shared": number(r"(\d+) bytes smem"),
    }


def _main(argv: list[str]) -> int:
    target = argv[argv.index("--arch") + 1] if "--arch" in argv else TARGET
    results = [(name, ptx, options) for name, ptx, options in ptx_variants(target)]
    if "--json" in argv:
        json.dump(results, sys.stdout)
        return 0
    from ..ptx_rules import check_ptx

    for name, ptx, options in results:
        report = check_ptx("triton", name, ptx, require_target=target, **options)
        usage = resource_usage(ptx)
        counts = report.counts
        print(f"{name:58s} {'ok ' if report.ok else 'BAD'} regs={usage['registers']:3d} spill={usage['spill_stores']}/{usage['spill_loads']} "
              f"smem={usage['shared']:5d} v4={counts['ld.global.v4']:3d} b32={counts['ld.global.b32']:3d} shfl={counts['shfl.sync']:3d} "
              f"bar={counts['bar.sync']:3d} add={counts['add.rn.f32']} mul={counts['mul.rn.f32']} div={counts['div.rn.f32']} "
              f"local={counts['local memory']}")
        for violation in report.violations:
            print("    ", violation)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
