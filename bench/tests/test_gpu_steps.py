"""The names that bench/gpu_steps.sh passes to the tools (tuning settings, kernel variants,
bench implementations) all exist: a retired variant or setting fails here, not on the GPU."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_steps.sh"


def _step_commands() -> list[list[str]]:
    """The words of every ``step NAME LIMIT COMMAND...`` line."""
    lines = (line.strip().removesuffix(";;") for line in SCRIPT.read_text().splitlines())
    return [shlex.split(line) for line in lines if line.startswith("step ")]


def _values(option: str) -> list[str]:
    """Every word given to ``option`` (up to the next option) in any step."""
    found = []
    for words in _step_commands():
        for i, word in enumerate(words):
            if word == option:
                for value in words[i + 1:]:
                    if value.startswith("-"):
                        break
                    found.append(value)
    return found


def _ncu_variants() -> list[str]:
    """The variants the ``ncu-*`` steps give ``profile-one`` (every ``--variant NAME`` but ``auto``)."""
    return [v for v in re.findall(r"--variant (\w+)", SCRIPT.read_text()) if v != "auto"]


def test_tuning_settings_exist():
    from dsv4_compressor.bench.cutedsl_tune import settings

    named = set(_values("--settings"))
    assert {"split_block8", "fused_cluster+cluster.tile=32", "fused_pipelined"} <= named
    unknown = named - set(settings(128)) - set(settings(4))
    assert not unknown, f"gpu_steps.sh names tuning settings that bench/cutedsl_tune.py lacks: {sorted(unknown)}"


def test_variants_and_implementations_exist():
    from dsv4_compressor.bench.cutedsl_tune import settings
    from dsv4_compressor.bench.sweep import REGISTRY, lab_setting
    from dsv4_compressor.impl.cutedsl.variants import VARIANTS

    variants = set(_values("--variants") + _ncu_variants())
    assert {"cluster8", "split_block8", "fused_handoff+handoff_kv_after_max=False"} <= variants
    known = set(VARIANTS) | set(settings(128))
    assert not variants - known, sorted(variants - known)
    impls = set(_values("--impl"))
    assert {"triton", "cutedsl", "cutedsl-split_block8", "cutedsl-bound", "cutedsl-indexer_c4_w1"} <= impls
    for impl in impls:
        module, _, attribute = impl.rpartition(":")
        if module:
            assert module == "dsv4_compressor.impl.cutedsl.variants" and attribute in VARIANTS, impl
        else:
            assert impl in REGISTRY or lab_setting(impl) is not None, impl
