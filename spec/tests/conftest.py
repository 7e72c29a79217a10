"""Make ``spec_test_helpers`` importable by the tests of this folder (pytest's importlib mode)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
