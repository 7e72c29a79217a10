"""What SPEC §2 means for PTX: the instruction rules every kernel's PTX must satisfy.

- every binary32 ``add``/``sub``/``mul`` carries ``.rn`` (PTX allows ptxas to contract an
  unrounded ``mul.f32`` + ``add.f32`` pair into an FMA; an explicit ``.rn`` forbids it); so
  does their packed form ``.f32x2`` (sm_100 and later: two binary32 lanes, each rounded
  alone, so ``add.rn.f32x2`` is two ``add.rn.f32``; Triton emits it for Blackwell);
- no ``fma``/``mad`` on floating point, no approximate functions (``ex2.approx``,
  ``rsqrt.approx``, ``rcp.approx``, ``sqrt.approx``, ``lg2.approx``, ``sin``/``cos``),
  no ``div.full``/``div.approx``;
- no ``.ftz`` anywhere (subnormals are kept, also by ``max``/``min`` and conversions);
- optional requirements per kernel: 128-bit global loads present: ``ld.global...v4`` of
  32-bit elements, or ``ld.global...v2`` of 64-bit elements (the same 16 bytes as the
  compilers spell them for sm_100 and later), or a 256-bit ``ld.global...v8`` of 32-bit /
  ``v4`` of 64-bit elements (sm_100 and later), or 16-byte ``cp.async`` into shared memory.

The rules are the same on every target: SPEC §2 does not change with the GPU; only the
spellings of a 128-bit load differ.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_FORBIDDEN = [
    (re.compile(r"^\s*(?:@!?%p\w+\s+)?(fma|mad)(\.\w+)*\.(f16|bf16|f32|f64|f16x2|bf16x2|f32x2)\b", re.M), "fused multiply-add on floating point"),
    (re.compile(r"\b(ex2|lg2|rsqrt|rcp|sqrt|sin|cos|tanh)\.approx\b"), "approximate function"),
    (re.compile(r"\bdiv\.(full|approx)\.f32\b"), "non-IEEE division"),
    (re.compile(r"^\s*(?:@!?%p\w+\s+)?\w+(\.\w+)*\.ftz\b", re.M), "flush-to-zero"),
    (re.compile(r"^\s*(?:@!?%p\w+\s+)?(add|sub|mul)(\.sat)?\.f32(x2)?\b", re.M), "binary32 add/sub/mul without .rn (may be contracted to FMA)"),
]

_COUNTED = {
    "add.rn.f32": re.compile(r"\badd\.rn\.f32\b"),
    "sub.rn.f32": re.compile(r"\bsub\.rn\.f32\b"),
    "mul.rn.f32": re.compile(r"\bmul\.rn\.f32\b"),
    "div.rn.f32": re.compile(r"\bdiv\.rn\.f32\b"),
    "sqrt.rn.f32": re.compile(r"\bsqrt\.rn\.f32\b"),
    "add.rn.f32x2": re.compile(r"\badd\.rn\.f32x2\b"),
    "sub.rn.f32x2": re.compile(r"\bsub\.rn\.f32x2\b"),
    "mul.rn.f32x2": re.compile(r"\bmul\.rn\.f32x2\b"),
    "ld.global.v4": re.compile(r"\bld\.global(\.[\w:]+)*\.v4\.(b32|f32|u32|s32)\b"),
    "ld.global.v2.b64": re.compile(r"\bld\.global(\.[\w:]+)*\.v2\.(b64|f64|u64|s64)\b"),  # 128 bits, sm_100's spelling
    "ld.global.256": re.compile(r"\bld\.global(\.[\w:]+)*\.(v8\.(b32|f32|u32|s32)|v4\.(b64|f64|u64|s64))\b"),
    "cp.async.16": re.compile(r"\bcp\.async\.c[ga](\.[\w:]+)*\.shared(::cta)?\.global(\.[\w:]+)*\s*\[[^]]+\],\s*\[[^]]+\],\s*16\b"),
    "ld.global.v2": re.compile(r"\bld\.global(\.[\w:]+)*\.v2\.(b32|f32|u32|s32)\b"),
    "ld.global.b32": re.compile(r"\bld\.global(\.[\w:]+)*\.(b32|f32|u32|s32)\b"),
    "st.global": re.compile(r"\bst\.global\b"),
    "shfl.sync": re.compile(r"\bshfl\.sync\b"),
    "bar.sync": re.compile(r"\b(bar|barrier)(\.cta)?\.sync\b"),
    "cvt.e4m3": re.compile(r"\bcvt\.rn\.satfinite\.e4m3x2\.f32\b"),
    "cvt.bf16": re.compile(r"\bcvt\.rn(\.\w+)*\.bf16(x2)?\.f32\b"),
    "local memory": re.compile(r"\b(ld|st)\.local\b"),
}

#: The counts of loads of at least 128 bits from global memory (what ``require_vector_loads`` asks for).
WIDE_LOADS = ("ld.global.v4", "ld.global.v2.b64", "ld.global.256", "cp.async.16")


@dataclass
class PtxReport:
    """The verdict on one kernel variant's PTX."""

    backend: str  # "triton" or "cutedsl"
    variant: str  # a readable name of the static configuration
    violations: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations


def check_ptx(backend: str, variant: str, ptx: str, *, require_vector_loads: bool = False, require_target: str | None = None) -> PtxReport:
    """Apply the rules to ``ptx``; each violation quotes the first offending line."""
    report = PtxReport(backend=backend, variant=variant)
    body = "\n".join(line.split("//")[0] for line in ptx.splitlines())  # drop comments
    for pattern, what in _FORBIDDEN:
        match = pattern.search(body)
        if match:
            line = body[body.rfind("\n", 0, match.start()) + 1: body.find("\n", match.end())].strip()
            count = len(pattern.findall(body))
            report.violations.append(f"{what}: {count}x, e.g. `{line}`")
    for name, pattern in _COUNTED.items():
        report.counts[name] = len(pattern.findall(body))
    if require_vector_loads and not any(report.counts[name] for name in WIDE_LOADS):
        report.violations.append("no 128-bit global loads (ld.global.v4.b32, ld.global.v2.b64, a 256-bit load or "
                                 "16-byte cp.async) where the kernel streams state rows")
    if require_target is not None:
        match = re.search(r"^\s*\.target\s+(\S+)", ptx, re.M)
        target = match.group(1).rstrip(",") if match else None
        if target != require_target:
            report.violations.append(f"PTX target: expected {require_target}, got {target}")
    return report
