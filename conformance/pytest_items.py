"""The conformance suite as pytest tests (one per scenario, per multi-step sequence, per
scenario's batch invariance and per SPEC §9 error case; DeepSeek-V4.1's scenarios and SPEC §14.8
cases, marked ``spec_s14``, for an implementation that declares V4.1).

Enabled by the project's pytest plugin::

    pytest -p dsv4_compressor.pytest_plugin --dsv4-impl my_engine.kernels:compressor \
        [--dsv4-size small|medium|large|all] [--dsv4-tolerant] [--dsv4-xfail NAME,...] [--dsv4-no-invariance]

Each test is marked ``conformance`` and with the SPEC sections it checks (``spec_s5``,
``spec_s9``, ...), so ``-m spec_s9`` selects the error cases. Scenarios the implementation
declares unsupported, or that need a device it lacks, are skipped with the reason; a run in
which every conformance test was skipped ends with a non-zero status (nothing was checked).
``--dsv4-xfail`` names scenarios, sequences or error cases expected to fail (a known
deviation), ``invariance::NAME`` a scenario's batch invariance. In the tolerant verdict a
scenario whose bytes depend on the batch is an expected failure (reported, not failed).
"""

from __future__ import annotations

import pytest

MARKERS = {
    "conformance": "a conformance test of --dsv4-impl (dsv4_compressor.conformance)",
    **{f"spec_s{n}": f"checks SPEC §{n}" for n in (4, 5, 6, 7, 9, 10, 12, 13, 14)},
}


def add_options(parser) -> None:
    group = parser.getgroup("dsv4", "DeepSeek V4 compressor conformance")
    group.addoption("--dsv4-impl", action="append", default=[], metavar="NAME",
                    help="implementation to check: spec, torch, triton, cutedsl, module:attribute (repeatable)")
    group.addoption("--dsv4-size", default="small", choices=("small", "medium", "large", "all"),
                    help="catalogue part (cumulative; default small)")
    group.addoption("--dsv4-scenarios", default="", metavar="PATTERNS", help="comma-separated scenario names or globs")
    group.addoption("--dsv4-tolerant", action="store_true", help="the SPEC §10 tolerant verdict")
    group.addoption("--dsv4-xfail", default="", metavar="NAMES",
                    help="comma-separated scenario or error-case names expected to fail")
    group.addoption("--dsv4-no-errors", action="store_true", help="leave out the SPEC §9 error cases")
    group.addoption("--dsv4-no-invariance", action="store_true", help="leave out the batch-invariance tests")


def _sections_marker(section: str) -> str:
    """``§5`` -> ``spec_s5``; a subsection ``§14.3`` -> ``spec_s14``."""
    return "spec_s" + section.lstrip("§").split(".")[0]


class ConformanceFailure(Exception):
    """A scenario or error case that the implementation failed (reported without a traceback)."""


class _ConformanceItem(pytest.Item):
    """A conformance test: a failure is reported by its verdict's text alone."""

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class ScenarioItem(_ConformanceItem):
    def __init__(self, *, impl, scenario, tolerant: bool, **kwargs):
        super().__init__(**kwargs)
        self.impl, self.scenario, self.tolerant = impl, scenario, tolerant

    def runtest(self):
        from .runner import run_scenario
        from .v41_runner import run_v41_scenario

        run = run_v41_scenario if getattr(self.scenario, "model", "v4") == "v4.1" else run_scenario
        verdict = run(self.impl, self.scenario, tolerant=self.tolerant)
        self.user_properties.append(("status", verdict.status))
        if verdict.status in ("skip", "unsupported"):
            pytest.skip(f"{verdict.status}: {verdict.first_difference}")
        if not verdict.passed:
            counts = {k: v for k, v in verdict.counts.items() if k != "traceback"}
            raise ConformanceFailure(f"{verdict.status.upper()}: {verdict.first_difference}" + (f"\n{counts}" if counts else "")
                                     + (f"\n{verdict.counts['traceback']}" if "traceback" in verdict.counts else ""))

    def reportinfo(self):
        return "dsv4-conformance", None, f"{self.impl.name}: {self.scenario.name} ({self.scenario.description})"


class SequenceItem(ScenarioItem):
    """A multi-step sequence (``scenario`` is a :class:`~.sequences.Sequence`)."""

    def runtest(self):
        from .sequences import run_sequence

        self._judge(run_sequence(self.impl, self.scenario, tolerant=self.tolerant))

    def _judge(self, verdict):
        if verdict.status in ("skip", "unsupported"):
            pytest.skip(f"{verdict.status}: {verdict.first_difference}")
        if not verdict.passed:
            counts = {k: v for k, v in verdict.counts.items() if k != "traceback"}
            raise ConformanceFailure(f"{verdict.status.upper()}: {verdict.first_difference}" + (f"\n{counts}" if counts else ""))


class InvarianceItem(ScenarioItem):
    """A scenario's batch invariance: a failure in the exact verdict, an expected failure
    (reported, not failing) in the tolerant one."""

    def runtest(self):
        from .invariance import run_invariance

        verdict = run_invariance(self.impl, self.scenario)
        if verdict.status in ("skip", "unsupported"):
            pytest.skip(f"{verdict.status}: {verdict.detail}")
        if verdict.status == "fail" and self.tolerant:
            pytest.xfail(f"NOT BATCH-INVARIANT (reported, not failed, in the tolerant verdict): {verdict.detail}")
        if not verdict.passed:
            raise ConformanceFailure(f"{verdict.status.upper()}: {verdict.detail}"
                                     + (f"\n{verdict.traceback}" if verdict.traceback else ""))


class ErrorCaseItem(_ConformanceItem):
    def __init__(self, *, impl, case, results: dict, **kwargs):
        super().__init__(**kwargs)
        self.impl, self.case, self.results = impl, case, results

    def runtest(self):
        from .errors import CASES, run_error_cases

        key = self.impl.name
        if key not in self.results:  # one worker process runs all cases of an implementation
            from .v41_errors import V41_CASES

            self.results[key] = {v.case: v for v in run_error_cases(self.impl, CASES + V41_CASES)}
        verdict = self.results[key][self.case.name]
        if verdict.status in ("skip", "unsupported"):
            pytest.skip(f"{verdict.status}: {verdict.detail}")
        if not verdict.passed:
            raise ConformanceFailure(f"{verdict.status.upper()}: {verdict.detail}")

    def reportinfo(self):
        section = "SPEC §14.8" if self.case.name.startswith("v41 ") else "SPEC §9"
        return "dsv4-conformance", None, f"{self.impl.name}: {section} {self.case.name}"


def _xfail_name(item) -> str:
    """The name ``--dsv4-xfail`` knows an item by: the scenario, sequence or error case, and
    ``invariance::NAME`` for a scenario's batch invariance."""
    name = item.name.rsplit("::", 1)[-1]
    return f"invariance::{name}" if isinstance(item, InvarianceItem) else name


def make_items(pytest_session, config) -> list[pytest.Item]:
    """The conformance tests for ``--dsv4-impl`` (none without it)."""
    import fnmatch

    from .errors import CASES
    from .implementations import load_implementation
    from .scenarios import CATALOGUE, scenarios
    from .sequences import sequences
    from .v41_errors import V41_CASES
    from .v41_scenarios import V41_CATALOGUE, v41_scenarios

    names = config.getoption("--dsv4-impl")
    if not names:
        return []
    xfail = {n.strip() for n in config.getoption("--dsv4-xfail").split(",") if n.strip()}
    patterns = [p.strip() for p in config.getoption("--dsv4-scenarios").split(",") if p.strip()]
    in_catalogue = [p for p in patterns if any(fnmatch.fnmatch(s.name, p) for s in CATALOGUE)]
    in_v41 = [p for p in patterns if any(fnmatch.fnmatch(s.name, p) for s in V41_CATALOGUE)]
    try:
        chosen_sequences = sequences(patterns or None)
        chosen_v41 = v41_scenarios(in_v41, None) if patterns else v41_scenarios(None, config.getoption("--dsv4-size"))
        if patterns and not in_catalogue and not chosen_sequences and not chosen_v41:
            raise ValueError(f"--dsv4-scenarios: no scenario or sequence matches {patterns}")
        if in_catalogue or patterns:
            chosen = scenarios(in_catalogue, None) if in_catalogue else []
        else:
            chosen = scenarios(None, config.getoption("--dsv4-size"))
        loaded = [load_implementation(n) for n in names]
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    tolerant = config.getoption("--dsv4-tolerant")
    items, results = [], {}
    for impl in loaded:
        kinds = [(ScenarioItem, "", chosen), (SequenceItem, "sequences::", chosen_sequences)]
        if not config.getoption("--dsv4-no-invariance"):
            kinds.append((InvarianceItem, "invariance::", chosen))
        if impl.capabilities.v41 is not None:
            kinds.append((ScenarioItem, "", chosen_v41))
        for kind, prefix, where in kinds:
            for scenario in where:
                item = kind.from_parent(pytest_session, name=f"dsv4[{impl.name}]::{prefix}{scenario.name}", impl=impl,
                                        scenario=scenario, tolerant=tolerant)
                for section in scenario.sections + (("§10",) if tolerant else ()):
                    item.add_marker(_sections_marker(section))
                items.append(item)
        if not config.getoption("--dsv4-no-errors") and not patterns:
            for case in CASES + (V41_CASES if impl.capabilities.v41 is not None else ()):
                item = ErrorCaseItem.from_parent(pytest_session, name=f"dsv4[{impl.name}]::errors::{case.name}", impl=impl,
                                                 case=case, results=results)
                item.add_marker("spec_s14" if case in V41_CASES else "spec_s9")
                items.append(item)
    for item in items:
        item.add_marker("conformance")
        if _xfail_name(item) in xfail:
            item.add_marker(pytest.mark.xfail(reason="--dsv4-xfail: a known deviation", strict=False))
    unknown = xfail - {_xfail_name(item) for item in items}
    if unknown:
        raise pytest.UsageError(f"--dsv4-xfail: no scenario or error case named {sorted(unknown)}")
    return items


def nothing_checked(reports: dict) -> bool:
    """Whether conformance tests ran and every one of them was skipped."""
    outcomes = [outcome for name, outcome in reports.items() if "dsv4[" in name]
    return bool(outcomes) and all(outcome == "skipped" for outcome in outcomes)
