"""Command line: ``python -m dsv4_compressor <command> [options]``.

Each command lives in the sub-package that owns it; only the chosen command's module is
imported, so ``demo`` needs nothing but NumPy.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module with add_arguments(parser) and run(args) -> int, one-line help)
COMMANDS = {
    "demo": ("dsv4_compressor.spec.demo", "run the NumPy spec on a small mixed batch and explain one entry"),
    "conformance": ("dsv4_compressor.conformance.cli", "check an implementation byte for byte against the spec"),
    "ptx-check": ("dsv4_compressor.impl.ptx_check", "compile every kernel for sm_90 and check the PTX arithmetic"),
    "bench": ("dsv4_compressor.bench.cli", "time implementations on the GPU (eager and CUDA-graph replay)"),
    "figures": ("dsv4_compressor.docs.figures", "regenerate the SVG figures of docs/"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor",
                                     description="DeepSeek V4 KV compressor: spec, kernels, conformance, benchmarks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
    args = parser.parse_args(argv)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
