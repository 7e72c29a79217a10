"""Loads the project's pytest plugin wherever the tests are collected from, and collects the
package's folders as plain directories.

In the repository (``pytest``) and in an install (``pytest --pyargs dsv4_compressor``, where no
pyproject.toml is read) alike: Triton falls back to its interpreter without a GPU and tests
marked ``gpu`` skip themselves.

The repository root *is* the package ``dsv4_compressor``, so pytest would otherwise take each
folder holding an ``__init__.py`` for a package named after the checkout's folders and import
it under that name (which fails for a checkout named ``dsv4-compressor``, and elsewhere loads
a second copy of the package). Test folders have no ``__init__.py``; their modules import the
package as ``dsv4_compressor``.
"""

import pytest

pytest_plugins = ["dsv4_compressor.pytest_plugin"]


def pytest_collect_directory(path, parent):
    if (path / "__init__.py").is_file():
        return pytest.Dir.from_parent(parent, path=path)
    return None
