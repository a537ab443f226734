"""The loader (libdsa/_loader.py): the CUDA libraries libdsa.so names by soname, where they come from,
and the CUDA version check with its messages (versions mocked: a too old driver, no driver, a
runtime of another major). Runs on the CPU; the last test also runs where a GPU is."""
import ctypes
import os
import subprocess
import sys
import warnings

import pytest
import torch

import libdsa
from libdsa import _loader, ops


@pytest.fixture
def fresh_load(monkeypatch):
    """library() loads again (its first load reads the versions), with the process's contexts
    unchanged; monkeypatch puts the loaded library back afterwards."""
    monkeypatch.setattr(_loader, "_lib", None)
    monkeypatch.setattr(ops, "_contexts", {})
    return monkeypatch


def test_needed_sonames():
    lib = libdsa.library()
    needed = _loader.needed_libraries(lib.path)
    assert f"libcudart.so.{lib.cuda_major}" in needed
    assert f"libcublas.so.{lib.cuda_major}" in needed
    assert _loader.needed_libraries(__file__) == []


def test_cuda_libraries_found():
    # torch's import loaded its CUDA runtime and cuBLAS first: libdsa.so shares those
    lib = libdsa.library()
    assert set(lib.cuda_libraries) == {f"libcudart.so.{lib.cuda_major}", f"libcublasLt.so.{lib.cuda_major}",
                                       f"libcublas.so.{lib.cuda_major}"}
    for soname, where in lib.cuda_libraries.items():
        assert where, soname
        ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)  # loaded, by soname
    tried = []
    assert _loader._load_dependency("libdsa_test_absent.so.1", tried) is None
    assert len(tried) == 1 and tried[0].startswith("libdsa_test_absent.so.1 is in none of: ")


def test_loads_before_torch():
    """A process that has not imported torch: the loader finds the CUDA libraries itself (the
    package's copy of libdsa.so has RUNPATH $ORIGIN only) and runs a CPU reference op."""
    package = os.path.dirname(os.path.dirname(libdsa.__file__))
    code = ("import sys, types; p = types.ModuleType('libdsa'); p.__path__ = [sys.argv[1] + '/libdsa']; "
            "sys.modules['libdsa'] = p; from libdsa import _loader; lib = _loader.library(); "
            "assert 'torch' not in sys.modules; assert all(lib.cuda_libraries.values()), lib.cuda_libraries; "
            "print(lib.path, lib.cuda_libraries, lib.cuda_runtime, lib.cuda_driver)")
    env = dict(os.environ, LIBDSA_LIBRARY=libdsa.library().path)
    out = subprocess.run([sys.executable, "-c", code, package], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("runtime, driver, words", [
    (13000, 12040, ["supports CUDA 12.4", "CUDA 13.0 or newer", "580.65.06", "CPU reference"]),
    (13000, 0, ["no NVIDIA driver found", "CUDA 13.0 or newer", "580.65.06"]),
    (12080, 13000, ["built for the CUDA 13 runtime", "the one loaded is CUDA 12.8"]),
])
def test_cuda_problem_message(runtime, driver, words):
    line = _loader.cuda_problem(13, runtime, driver)
    assert "\n" not in line
    for w in words:
        assert w in line
    assert _loader.cuda_problem(13, 13000, 13000) is None
    assert _loader.cuda_problem(13, 13020, 13080) is None


def test_old_driver_warns_at_import_and_cuda_ops_raise(fresh_load):
    fresh_load.setattr(_loader, "cuda_versions", lambda soname: (13000, 12040))
    with pytest.warns(RuntimeWarning, match=r"libdsa: the NVIDIA driver supports CUDA 12\.4.*580\.65\.06"):
        _loader.load_at_import()
    with pytest.raises(libdsa.DSAUnsupported, match="supports CUDA 12.4"):
        ops._ctx_stream(torch.device("cuda"))
    # CPU tensors still run the CPU reference
    assert libdsa.topk(torch.tensor([[3.0, 1.0, 2.0]]), 2).tolist() == [[0, 2]]


def test_no_driver_is_silent_at_import(fresh_load):
    fresh_load.setattr(_loader, "cuda_versions", lambda soname: (13000, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _loader.load_at_import()
    with pytest.raises(libdsa.DSAUnsupported, match="no NVIDIA driver found"):
        ops._ctx_stream(torch.device("cuda"))


def test_versions_of_this_machine():
    lib = libdsa.library()
    assert lib.cuda_runtime // 1000 == lib.cuda_major
    if torch.cuda.is_available():
        assert lib.cuda_problem is None, lib.cuda_problem
