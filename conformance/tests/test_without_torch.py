"""The suite without torch: the NumPy spec, and a user's NumPy implementation, are checked
through NumPy buffers (``Capabilities(arrays="numpy")``), the §9 error cases included, in a
process where importing torch fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dsv4_compressor.conformance.capabilities import Capabilities
from dsv4_compressor.conformance.runner import to_numpy

# Installed as sitecustomize in the child processes (the §9 worker inherits it): torch and
# the GPU packages cannot be imported.
BLOCKER = '''
import sys

class _Unimportable:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "triton", "cutlass"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Unimportable())
'''

# A user's NumPy implementation: the spec, and a mutant that changes one byte of the cache.
USER_KERNELS = '''
from dsv4_compressor import spec
from dsv4_compressor.conformance import Capabilities


class NumpyKernels:
    CAPABILITIES = Capabilities(arrays="numpy", head_widths=(512,))
    flip = False

    def save_partial_states(self, kv_score, ape, positions, slot_mapping, state_cache, block_size):
        spec.save_partial_states(kv_score, ape, positions, slot_mapping, state_cache, block_size)

    def compress_norm_rope_store(self, *args, **kwargs):
        spec.compress_norm_rope_store(*args, **kwargs)
        if self.flip:
            args[9].flat[0] ^= 1  # k_cache


class FlipsOneByte(NumpyKernels):
    flip = True
'''


@pytest.fixture(scope="module")
def torchless(tmp_path_factory):
    """Runs ``python -m dsv4_compressor ARGS`` where torch cannot be imported."""
    folder = tmp_path_factory.mktemp("torchless")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    (folder / "user_numpy_kernels.py").write_text(USER_KERNELS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dsv4_compressor", *args], capture_output=True, text=True,
                              timeout=600, env=env, cwd=folder)

    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr  # the blocker works
    return run


def test_spec_conformance_runs_without_torch(torchless):
    result = torchless("conformance", "--impl", "spec")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "| spec " in line]
    scenario_rows = [r for r in rows if r.split("|")[2].strip()]  # a token count: a scenario
    error_rows = [r for r in rows if not r.split("|")[2].strip()]
    assert len(scenario_rows) >= 50 and all("| PASS " in r for r in scenario_rows)
    assert "| PASS " in next(r for r in error_rows if r.startswith("positions int32 "))  # §9, in the worker
    assert sum("| PASS " in r for r in error_rows) >= 50
    checked = int(result.stdout.split("PASSED: ")[1].split()[0])
    assert checked == len(scenario_rows) + sum("| PASS " in r for r in error_rows)


def test_a_numpy_implementation_is_judged_without_torch(torchless):
    ok = torchless("conformance", "--impl", "user_numpy_kernels:NumpyKernels", "--scenarios", "c4_decode_boundary",
                   "tiny_amax", "*indexer*")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "UNSUPPORTED by user_numpy_kernels:NumpyKernels" in ok.stdout and "head width 128" in ok.stdout
    bad = torchless("conformance", "--impl", "user_numpy_kernels:FlipsOneByte", "--scenarios", "c4_decode_boundary",
                    "--no-errors")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "| FAIL " in bad.stdout and "expected" in bad.stdout and "1 bytes differ" in bad.stdout


def test_demo_and_the_torch_message_without_torch(torchless):
    demo = torchless("demo")
    assert demo.returncode == 0, demo.stderr
    assert "nothing else was touched" in demo.stdout
    needs = torchless("conformance", "--impl", "torch")
    assert needs.returncode == 2 and "Traceback" not in needs.stderr
    assert "torch" in needs.stderr and len(needs.stderr.strip().splitlines()) == 1


def test_numpy_strided_inputs_are_laid_out_as_the_torch_ones():
    torch = pytest.importorskip("torch")
    from dsv4_compressor.conformance.runner import to_torch

    for array in (np.arange(24, dtype=np.float32).reshape(4, 6), np.arange(5, dtype=np.int64),
                  np.arange(12, dtype=np.uint16).reshape(3, 4) | np.uint16(0x3F00)):
        view = to_numpy(array, strided=True)
        tensor = to_torch(array, "cpu", strided=True)
        assert np.array_equal(view, array) and not (view.ndim > 1 and view.flags.c_contiguous)
        assert view.strides == tuple(s * array.itemsize for s in tensor.stride())
        assert tensor.storage_offset() == 1 and tensor.stride()[-1] == 1
        if array.ndim > 1:  # rows padded by 3 elements
            assert tensor.stride()[-2] == array.shape[-1] + 3
        owner = view.base
        wide = torch.empty(0, dtype=tensor.dtype).set_(tensor.untyped_storage())
        wide_bits = wide.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else wide.numpy()
        assert owner.view(wide_bits.dtype).tobytes() == wide_bits.tobytes()  # padding values included


def test_numpy_capabilities_run_on_the_host():
    assert Capabilities(arrays="numpy").devices == ("cpu",)
    with pytest.raises(ValueError, match="devices"):
        Capabilities(arrays="numpy", devices=("cpu", "cuda"))
    with pytest.raises(ValueError, match="arrays"):
        Capabilities(arrays="jax")
