"""Command line: ``python -m dsv4_compressor <command> [options]`` (also installed as ``dsv4-compressor``).

Each command lives in the sub-package that owns it; only the chosen command's module is
imported, so ``demo`` needs nothing but NumPy. Errors a user can fix (a bad argument, a
missing optional package, a closed pipe as in ``demo | head``) end with one line on stderr
and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__

# command -> (module with add_arguments(parser) and run(args) -> int, one-line help)
COMMANDS = {
    "demo": ("dsv4_compressor.spec.demo", "run the NumPy spec on a small mixed batch and explain one entry"),
    "conformance": ("dsv4_compressor.conformance.cli", "check an implementation byte for byte against the spec"),
    "soak": ("dsv4_compressor.conformance.soak_cli", "run a randomized engine for minutes, comparing every step's bytes"),
    "ptx-check": ("dsv4_compressor.impl.ptx_check", "compile every kernel for sm_90a (--arch: sm_100a, sm_103a) and check the PTX"),
    "bench": ("dsv4_compressor.bench.cli", "time implementations on the GPU (eager and CUDA-graph replay)"),
    "figures": ("dsv4_compressor.docs.figures", "regenerate the SVG figures of docs/"),
}

# Commands that load user code named ``module:attribute`` (--impl).
LOADS_USER_CODE = ("conformance", "bench", "soak")

# optional top-level package -> the extra that installs it
EXTRAS = {"torch": "torch", "triton": "triton", "cutlass": "cutedsl", "tvm_ffi": "cutedsl",
          "cuda": "cutedsl", "matplotlib": "plot", "pytest": "test", "hypothesis": "test"}

EXIT_USAGE = 2


def _missing_module_message(command: str, error: ModuleNotFoundError) -> str:
    top = (error.name or "").partition(".")[0]
    if top in EXTRAS:
        return (f"{command}: needs the optional package {top!r}, which is not installed here; "
                f"install it with: pip install 'dsv4-compressor[{EXTRAS[top]}]'")
    return f"{command}: cannot import {error.name!r} ({error})"


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so that the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass


def build_parser(chosen: str | None) -> tuple[argparse.ArgumentParser, object | None]:
    """The parser, with only the chosen command's module imported (its arguments added)."""
    parser = argparse.ArgumentParser(prog="python -m dsv4_compressor",
                                     description="DeepSeek V4 KV compressor: spec, kernels, conformance, benchmarks")
    parser.add_argument("--version", action="version", version=f"dsv4-compressor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    chosen = chosen if chosen in COMMANDS else None
    if chosen in LOADS_USER_CODE and os.getcwd() not in sys.path and "" not in sys.path:
        # The installed script starts with its own folder on sys.path, not the current one;
        # `--impl my_kernels:impl` must find my_kernels.py where the user stands.
        sys.path.append(os.getcwd())
    try:
        parser, module = build_parser(chosen)
        args = parser.parse_args(argv)
        return int(module.run(args) or 0)
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as error:
        print(f"error: {_missing_module_message(chosen or 'dsv4_compressor', error)}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as error:  # the project's way of naming a bad argument, expected and given
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
