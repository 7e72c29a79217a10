"""The project's pytest plugin, loaded by the package's ``conftest.py``.

- Without a CUDA GPU, Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` is
  set here, before anything imports Triton.
- Tests marked ``gpu`` are skipped cleanly when no CUDA GPU is present.
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


def pytest_configure(config):
    for marker in MARKERS:  # also when no pyproject.toml is read (an installed package)
        config.addinivalue_line("markers", marker)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
