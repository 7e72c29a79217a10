"""Loads the project's pytest plugin wherever the tests are collected from.

In the repository (``pytest``) and in an install (``pytest --pyargs dsv4_compressor``, where no
pyproject.toml is read) alike: Triton falls back to its interpreter without a GPU and tests
marked ``gpu`` skip themselves.
"""

pytest_plugins = ["dsv4_compressor.pytest_plugin"]
