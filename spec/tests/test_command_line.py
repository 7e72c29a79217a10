"""``python -m dsv4_compressor``: version, errors without tracebacks, closed pipes, --impl from the cwd."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dsv4_compressor
from dsv4_compressor.__main__ import _missing_module_message, main


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-m", "dsv4_compressor", *args], capture_output=True, text=True,
                          env=env, timeout=300, **kwargs)


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"dsv4-compressor {dsv4_compressor.__version__}"


def test_an_unknown_implementation_is_one_line_and_exit_status_2(capsys):
    pytest.importorskip("torch")
    assert main(["conformance", "--impl", "no_such_module_here:impl"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error: " in err
    assert "no_such_module_here" in err and "Traceback" not in err


def test_a_missing_optional_package_names_its_extra():
    error = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert "pip install 'dsv4-compressor[torch]'" in _missing_module_message("conformance", error)
    error = ModuleNotFoundError("No module named 'cutlass.cute'", name="cutlass.cute")
    assert "[cutedsl]" in _missing_module_message("ptx-check", error)


def test_demo_into_a_closed_pipe_ends_without_a_traceback():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    process = subprocess.Popen([sys.executable, "-m", "dsv4_compressor", "demo"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
    process.stdout.read(40)  # like `| head -c 40`
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) in (0, 1)  # 0 only if everything fitted in the pipe before it closed
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr


def test_a_bad_subcommand_is_argparse_usage_not_a_traceback():
    result = _run("frobnicate")
    assert result.returncode == 2 and "invalid choice" in result.stderr and "Traceback" not in result.stderr


def test_impl_module_is_found_in_the_current_directory(tmp_path, monkeypatch, capsys):
    """The installed script starts without the current directory on sys.path."""
    pytest.importorskip("torch")
    (tmp_path / "my_local_kernels.py").write_text(
        "from dsv4_compressor.conformance.implementations import SpecImplementation\nimpl = SpecImplementation()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["conformance", "--impl", "my_local_kernels:impl", "--scenarios", "c4_first_window", "--no-errors"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--state-format", "ring"], ["--state-format", "ring", "--state-dtype", "bf16", "--ape-at", "compress"],
                                  ["--ratio", "128", "--state-format", "ring"], ["--ape-at", "compress"]])
def test_the_state_format_demo_explains_a_step_and_matches_its_paged_twin(args, capsys):
    assert main(["demo", *args]) == 0
    out = capsys.readouterr().out
    assert "compress_and_save" in out and "chunk token" in out and "state block" in out
    assert out.rstrip().endswith("paged twin that saves every token: yes")
    assert ("(the tail)" in out) == ("ring" in args)


def test_the_state_format_demo_refuses_an_indexer_layout():
    with pytest.raises(SystemExit, match="--state-format"):
        main(["demo", "--state-format", "ring", "--layout", "indexer_fp8"])


@pytest.mark.parametrize("arguments", [
    ["--model", "v4.1"],
    ["--model", "v4.1", "--ratio", "1", "--layout", "v41_mxfp8"],
    ["--model", "v4.1", "--state-format", "ring", "--state-dtype", "bf16", "--layout", "flashmla_fp8"],
    ["--model", "v4.1", "--state-format", "ring", "--layout", "fp8_per_tensor"],
])
def test_demo_of_v41_explains_one_entry(arguments, capsys):
    assert main(["demo", *arguments]) == 0
    out = capsys.readouterr().out
    assert "DeepSeek-V4.1 compressor" in out and "Latent l = bf16(RMSNorm(bf16(x)))" in out and "float64 ideal" in out


def test_demo_refuses_a_ratio_of_the_other_model():
    with pytest.raises(SystemExit, match="ratio 1 or 2"):
        main(["demo", "--model", "v4.1", "--ratio", "4"])
    with pytest.raises(SystemExit, match="ratio 4 or 128"):
        main(["demo", "--ratio", "2"])
    with pytest.raises(SystemExit, match="no ape"):
        main(["demo", "--model", "v4.1", "--ape-at", "compress"])
