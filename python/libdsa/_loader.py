"""_loader.py - finds and loads libdsa.so once per process.

Search order: $LIBDSA_LIBRARY (a path), the copy installed inside this package (libdsa/lib/, put there
by `pip install ./python`), then the checkout's build/libdsa.so (running from a source tree). libdsa.so
needs libcudart.so.13 and libcublas.so.13: when the dynamic loader does not find them, they are loaded
from torch's CUDA wheels (nvidia/*/lib beside torch) or $CUDA_HOME/lib64 first.
"""
import ctypes
import glob
import os

from . import _capi

_here = os.path.dirname(os.path.abspath(__file__))
_lib = None


def _candidates():
    env = os.environ.get("LIBDSA_LIBRARY")
    if env:
        return [env]
    return [os.path.join(_here, "lib", "libdsa.so"),
            os.path.normpath(os.path.join(_here, "..", "..", "build", "libdsa.so"))]


def _preload_cuda_libraries():
    """Loads libcudart / libcublas with RTLD_GLOBAL from torch's wheels or CUDA_HOME, if present."""
    dirs = []
    try:
        import torch  # noqa: F401  (torch's own import loads its CUDA libraries)
        site = os.path.dirname(os.path.dirname(torch.__file__))
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib")))
    except ImportError:
        pass
    dirs.append(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64"))
    for name in ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"):
        for d in dirs:
            path = os.path.join(d, name)
            if os.path.exists(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    break
                except OSError:
                    pass


def library():
    """The loaded libdsa (an _capi.Lib); raises OSError naming every place searched."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (absent)")
            continue
        try:
            _lib = _capi.Lib(path)
        except OSError as first:
            _preload_cuda_libraries()
            try:
                _lib = _capi.Lib(path)
            except OSError:
                tried.append(f"{path} ({first})")
                continue
        _lib.path = path
        return _lib
    raise OSError("libdsa.so not found or not loadable; tried: " + "; ".join(tried) +
                  ". Build it with `make` in the checkout, or set LIBDSA_LIBRARY.")
