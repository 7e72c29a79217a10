"""The names that bench/gpu_steps.sh passes to the tools (tuning settings, kernel variants,
bench implementations) all exist: a retired variant or setting fails here, not on the GPU."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_steps.sh"


STEPS_TOOL = "dsv4_compressor.bench.steps"  # the step benchmarks: their own --impl names (test_bench_steps_listed)


# the adapters around another project's kernels that steps may time beside ours: on the caller's
# PYTHONPATH, never in this repository; the script's header says so, naming each
THIRD_PARTY_ADAPTERS = {"vllm_adapter": "vllm_adapter (attribute cutedsl)",
                        "vllm_v41_adapter": "vllm_v41_adapter (class VllmV41)"}


def _step_commands(tool: str | None = None) -> list[list[str]]:
    """The words of every ``step NAME LIMIT COMMAND...`` line: those that run ``-m tool``, or (None)
    all but the step benchmarks'."""
    lines = (line.strip().removesuffix(";;") for line in SCRIPT.read_text().splitlines())
    commands = [shlex.split(line) for line in lines if line.startswith("step ")]
    return [words for words in commands if (STEPS_TOOL in words) == (tool == STEPS_TOOL)
            and (tool is None or tool in words)]


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
        if module in THIRD_PARTY_ADAPTERS:
            assert THIRD_PARTY_ADAPTERS[module] in SCRIPT.read_text(), impl  # the script's header names it
        elif module:
            assert module == "dsv4_compressor.impl.cutedsl.variants" and attribute in VARIANTS, impl
        else:
            assert impl in REGISTRY or lab_setting(impl) is not None, impl


def test_bench_steps_listed_and_parse():
    """The step benchmarks of SPEC §13 and §14 are steps, and each one's arguments parse and pass the
    tool's own checks; its implementations are the project's V4.1 rows or ``module:attribute``."""
    from dsv4_compressor.bench import steps

    commands = {words[1]: words for words in _step_commands(STEPS_TOOL)}
    assert {"state-memory", "bench-state-c128", "bench-state-c4", "bench-state-dense", "$s", "bench-v41-index-key"} \
        <= set(commands)
    v41 = commands.pop("$s")  # the V4.1 steps: one command, its ratio and dtype from the step's name
    arguments = dict(re.findall(r'(bench-v41-r[12]-\w+)\) args="([^"]+)"', SCRIPT.read_text()))
    assert set(arguments) == {f"bench-v41-r{r}-{d}" for r in (1, 2) for d in ("fp32", "bf16")}
    for name, extra in arguments.items():
        words = [w for w in v41 if w != "$args"] + shlex.split(extra)
        commands[name] = [w.replace("${s#bench-}", name.removeprefix("bench-")) for w in words]
    for name, words in commands.items():
        argv = words[words.index(STEPS_TOOL) + 1:]
        args = steps.parser().parse_args([a.replace("$LOGS", "out") for a in argv])
        assert steps._check(args) == "", name
        if args.suite == "state":
            assert steps.state_cases(args), name
        elif args.suite == "v41":
            assert steps.v41_cases(args), name
            assert all(i in ("triton", "triton-split", "cutedsl") or ":" in i for i in args.impl), name
    assert "vllm_v41_adapter:VllmV41" in commands["bench-v41-r2-fp32"]
    bf16 = commands["bench-v41-r2-bf16"]
    assert steps.parser().parse_args(bf16[bf16.index(STEPS_TOOL) + 1:]).input_dtype == ["bf16"]


def test_gpu_test_files_and_scenarios_named_by_steps_exist():
    """Every test file a ``tests-*`` step runs is in the repository, and every ``--scenarios`` pattern
    of a conformance step matches a scenario of the catalogue."""
    import fnmatch

    from dsv4_compressor.conformance.scenarios import CATALOGUE

    root = SCRIPT.parents[1]
    files = [word for words in _step_commands() for word in words if word.endswith(".py")]
    assert "impl/cutedsl/tests/test_cutedsl_step_gpu.py" in files
    assert not [f for f in files if not (root / f).is_file()], files
    names = [scenario.name for scenario in CATALOGUE]
    patterns = _values("--scenarios")
    assert "state_*" in patterns
    assert not [p for p in patterns if not fnmatch.filter(names, p)], patterns


def _shards() -> dict[str, list[str]]:
    """``shard_args``' conformance arguments of each shard of ``conformance:IMPL:SHARD``."""
    text = SCRIPT.read_text()
    body = text[text.index("shard_args() {"):]
    body = body[:body.index("\n}\n")]
    return {name: shlex.split(args) for name, args in re.findall(r'^\s*([\w-]+)\) echo "([^"]*)" ;;', body, re.M)}


def _matching(words: list[str], items) -> list[str]:
    """The names of ``items`` that a shard's ``--scenarios`` patterns select (each pattern some)."""
    import fnmatch

    patterns = words[words.index("--scenarios") + 1:]
    patterns = patterns[:next((i for i, w in enumerate(patterns) if w.startswith("-")), len(patterns))]
    assert all(fnmatch.filter([item.name for item in items], p) for p in patterns), patterns
    return [item.name for item in items if any(fnmatch.fnmatch(item.name, p) for p in patterns)]


def test_conformance_shards_cover_the_catalogue_once():
    """The V4 shards of ``conformance:IMPL:SHARD`` split the scenario catalogue and the sequences with no
    scenario left out and none run twice, and every shard's arguments parse."""
    from dsv4_compressor.conformance import cli
    from dsv4_compressor.conformance.scenarios import CATALOGUE
    from dsv4_compressor.conformance.sequences import SEQUENCES

    shards = _shards()
    assert {"core", "state", "verify", "medium", "large-c4", "large-c128", "large-rest", "errors", "v41",
            "graph-small", "graph-big", "graph-medium", "graph-large-c4", "graph-large-rest"} == set(shards)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    for words in shards.values():
        parser.parse_args(["--impl", "spec", *words])
    seen = {}
    for name, words in shards.items():
        if "--scenarios" not in words or "--graph" in words:
            continue
        for item in _matching(words, CATALOGUE + SEQUENCES):
            seen.setdefault(item, []).append(name)
    assert {n: s for n, s in seen.items() if len(s) > 1} == {}
    assert sorted(set(s.name for s in CATALOGUE + SEQUENCES) - set(seen)) == []
    graph_parts = [name for name in shards if name.startswith("graph-") and name not in ("graph-small", "graph-big")]
    in_parts = sorted(n for part in graph_parts for n in _matching(shards[part], CATALOGUE + SEQUENCES))
    assert in_parts == sorted(_matching(shards["graph-big"], CATALOGUE + SEQUENCES))  # graph-big, once
