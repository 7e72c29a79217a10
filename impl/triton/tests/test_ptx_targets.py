"""The PTX rules on Blackwell's spellings, and ``ptx-check --arch`` (no compile here: CI runs
``ptx-check --arch sm_100a`` on every variant).

- packed binary32 arithmetic (``.f32x2``, sm_100 and later) obeys the same rules as ``.f32``;
- a 128-bit load spelled ``ld.global.v2.b64`` (sm_100) or a 256-bit one counts as wide;
- the PTX target must be the one asked for;
- ``ptx-check`` runs each target it is given, skips (and says so) a target a backend's compiler
  does not know, and fails on a variant that does not compile.
"""

import argparse

import pytest

from dsv4_compressor.impl import ptx_check
from dsv4_compressor.impl.ptx_rules import check_ptx
from dsv4_compressor.impl.triton.ptx import capability


def _ptx(target: str, *lines: str) -> str:
    return "\n".join((".version 8.8", f".target {target}", ".address_size 64", *lines))


def test_packed_binary32_arithmetic_needs_rn_like_scalar():
    rounded = _ptx("sm_100a", "\tadd.rn.f32x2 \t%rd1, %rd2, %rd3;", "\tmul.rn.f32x2 \t%rd4, %rd1, %rd3;",
                   "\tsub.rn.f32x2 \t%rd5, %rd4, %rd1;")
    report = check_ptx("triton", "packed", rounded, require_target="sm_100a")
    assert report.ok, report.violations
    assert (report.counts["add.rn.f32x2"], report.counts["mul.rn.f32x2"], report.counts["sub.rn.f32x2"]) == (1, 1, 1)
    for line in ("\tadd.f32x2 \t%rd1, %rd2, %rd3;", "\t@%p1 mul.f32x2 \t%rd1, %rd2, %rd3;",
                 "\tfma.rn.f32x2 \t%rd1, %rd2, %rd3, %rd4;", "\tadd.rn.ftz.f32x2 \t%rd1, %rd2, %rd3;"):
        assert not check_ptx("triton", "packed", _ptx("sm_100a", line)).ok, line


@pytest.mark.parametrize("load", ["ld.global.v4.b32 \t{%r1, %r2, %r3, %r4}, [%rd1];",
                                  "ld.global.nc.v2.b64 \t{%rd2, %rd3}, [%rd1];",
                                  "ld.global.L2::128B.v2.b64 \t{%rd2, %rd3}, [%rd1];",
                                  "ld.global.v8.b32 \t{%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}, [%rd1];",
                                  "cp.async.cg.shared.global [%r1], [%rd1], 16;"])
def test_every_spelling_of_a_wide_load_counts(load):
    assert check_ptx("cutedsl", "wide", _ptx("sm_100a", "\t" + load), require_vector_loads=True).ok


def test_narrow_loads_are_not_wide_and_the_target_is_checked():
    narrow = _ptx("sm_100a", "\tld.global.v2.b32 \t{%r1, %r2}, [%rd1];", "\tld.global.b64 \t%rd2, [%rd1];")
    report = check_ptx("cutedsl", "narrow", narrow, require_vector_loads=True, require_target="sm_90a")
    assert [v.split(" (")[0].split(":")[0] for v in report.violations] == ["no 128-bit global loads", "PTX target"]
    assert "expected sm_90a, got sm_100a" in report.violations[1]


def test_triton_capability_of_each_target():
    assert [capability(t) for t in ptx_check.TARGETS] == [90, 100, 103]
    with pytest.raises(ValueError, match="target: expected a PTX target such as 'sm_90a' or 'sm_100a', got 'hopper'"):
        capability("hopper")


class _Backend:
    """A stand-in backend module: knows ``known`` targets; ``broken`` fails after its first variant."""

    def __init__(self, known=("sm_90a", "sm_100a"), broken=False):
        self.known, self.broken, self.asked = known, broken, []

    def toolchain(self) -> str:
        return "stand-in 1.0"

    def knows_target(self, target: str) -> bool:
        return target in self.known

    def ptx_variants(self, target: str):
        self.asked.append(target)
        yield "v1", _ptx(target, "\tadd.rn.f32 \t%f1, %f2, %f3;"), {}
        if self.broken:
            raise RuntimeError(f"kernel k2 cannot be compiled for {target}")
        yield "v2", _ptx(target, "\tmul.rn.f32 \t%f1, %f2, %f3;"), {}


def _run(monkeypatch, capsys, backend, *argv) -> tuple[int, str]:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as run() does; restored for the tests after this one
    monkeypatch.setattr(ptx_check.importlib, "import_module", lambda name: backend)
    parser = argparse.ArgumentParser()
    ptx_check.add_arguments(parser)
    code = ptx_check.run(parser.parse_args(["--backend", "triton", *argv]))
    return code, capsys.readouterr().out


def test_ptx_check_runs_each_target_and_says_which_it_skips(monkeypatch, capsys):
    backend = _Backend()
    code, out = _run(monkeypatch, capsys, backend, "--arch", "all")
    assert code == 0 and backend.asked == ["sm_90a", "sm_100a"]
    assert "ok   triton   sm_100a v2" in out
    assert "skip triton   sm_103a: stand-in 1.0 does not know this target; nothing compiled" in out
    assert out.rstrip().endswith("PASSED: 4 variants checked for sm_90a, sm_100a, sm_103a, 0 failure(s), "
                                 "1 target(s) skipped")
    code, out = _run(monkeypatch, capsys, _Backend())
    assert code == 0 and "sm_100a" not in out and "PASSED: 2 variants checked for sm_90a, 0 failure(s)" in out
    backend = _Backend()
    code, out = _run(monkeypatch, capsys, backend, "--arch", "sm_100a", "sm_90a", "sm_100a")
    assert code == 0 and backend.asked == ["sm_90a", "sm_100a"]  # each once, Hopper first


def test_ptx_check_fails_on_a_variant_that_does_not_compile(monkeypatch, capsys):
    code, out = _run(monkeypatch, capsys, _Backend(broken=True), "--arch", "sm_100a")
    assert code == 1
    assert ("FAIL triton   sm_100a: compiling failed after 1 variant(s) (RuntimeError: kernel k2 cannot be "
            "compiled for sm_100a)") in out
    assert "FAILED: 1 variants checked for sm_100a, 1 failure(s)" in out
