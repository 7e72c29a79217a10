"""The project's pytest plugin, loaded by the package's ``conftest.py``.

- Without a CUDA GPU, Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` is
  set here, before anything imports Triton.
- Tests marked ``gpu`` are skipped cleanly when no CUDA GPU is present.
- ``--dsv4-impl module:attr`` adds the conformance suite as tests: one per scenario and per
  SPEC §9 error case, marked with the SPEC sections they check, ``--dsv4-xfail NAME,...`` for
  known deviations (``dsv4_compressor.conformance.pytest_items``). Outside this repository:
  ``pytest -p dsv4_compressor.pytest_plugin --dsv4-impl my_engine.kernels:compressor``.
"""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()

try:  # CI runs hypothesis derandomized, so a failure reproduces on the next run
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
except ImportError:  # hypothesis is a test extra
    pass
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


MARKERS = (
    "gpu: needs a CUDA GPU (skipped cleanly without one)",
    "slow: long CPU test (exhaustive samples)",
)


def pytest_addoption(parser):
    from dsv4_compressor.conformance.pytest_items import add_options

    add_options(parser)


def pytest_configure(config):
    from dsv4_compressor.conformance.pytest_items import MARKERS as CONFORMANCE_MARKERS

    for marker in MARKERS:  # also when no pyproject.toml is read (an installed package)
        config.addinivalue_line("markers", marker)
    for name, text in CONFORMANCE_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(_ConformanceOutcomes(), "dsv4-conformance-outcomes")


def pytest_collection_modifyitems(session, config, items):
    from dsv4_compressor.conformance.pytest_items import make_items

    items.extend(make_items(session, config))
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


class _ConformanceOutcomes:
    """Remembers the conformance tests' outcomes; a run in which all were skipped checked nothing."""

    def __init__(self):
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if "dsv4[" in report.nodeid and (report.when == "call" or report.outcome != "passed"):
            self.outcomes[report.nodeid] = report.outcome

    def pytest_sessionfinish(self, session, exitstatus):
        from dsv4_compressor.conformance.pytest_items import nothing_checked

        if exitstatus == 0 and nothing_checked(self.outcomes):
            session.config.get_terminal_writer().line("dsv4 conformance: every test was skipped; nothing was checked", red=True)
            session.exitstatus = 3
