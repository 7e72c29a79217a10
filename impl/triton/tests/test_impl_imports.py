"""The product (``impl/``) imports nothing from its tooling (``bench/``)."""

import ast
from pathlib import Path

IMPL = Path(__file__).resolve().parents[2]


def test_impl_imports_nothing_from_bench():
    offenders = []
    for path in IMPL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.relative_to(IMPL)}: {n}" for n in names if "bench" in n.split(".")]
    assert offenders == []
