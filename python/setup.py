"""Builds the libdsa package: libdsa/ (the ctypes binding and the torch ops) plus the libdsa.so it
loads, put inside the package as libdsa/lib/libdsa.so. That library is $LIBDSA_LIBRARY when set (a
libdsa.so built elsewhere, copied as it is), else build/python/libdsa.so, which the checkout's Makefile
links from the objects of build/libdsa.so (compiling the CUDA kernels first when they are not built:
needs the CUDA 13 toolkit) with RUNPATH $ORIGIN only; libdsa/_loader.py finds libcudart and libcublas at
load time.

pip shows a build's output only with -v, so the step's notes (compiling, how long it takes, how to skip
it) go to the terminal when there is one, else to stderr.

The wheel is tagged py3-none-<platform>: the package is Python over ctypes (no extension module, any
Python 3), the library it carries is specific to the platform.
"""
import glob
import os
import subprocess
import sys
import time

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools older than 70.1: the wheel package's command
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PACKAGE_LIBRARY = "build/python/libdsa.so"
# `make build/libdsa.so` from a clean checkout (every CUDA file, make -j2) on 2 cores of an x86-64
# host: 1 min 54 s (2026-12-07, 5ebf63a).
FULL_BUILD_MINUTES = 2


def note(line):
    """One line for whoever runs the build: to the terminal when there is one (pip keeps the build's
    own output to itself unless -v), else to stderr."""
    try:
        with open("/dev/tty", "w") as tty:
            tty.write("\n" + line + "\n")
        return
    except OSError:
        pass
    print(line, file=sys.stderr, flush=True)


def make_package_library():
    """build/libdsa.so, then build/python/libdsa.so from the same objects with RUNPATH $ORIGIN (the
    checkout's Makefile: LIB_SO and SO_RPATH); says first how many CUDA files it compiles and about how
    long that takes, then how long it took. build/libdsa.so stays in step with the package's copy, so
    `make test` does not relink it and find the installed copy older."""
    make = ["make", "-C", ROOT, "--no-print-directory", "BUILD=build"]
    dry = subprocess.run(make + ["-n", "build/libdsa.so"], capture_output=True, text=True)
    compiles = sum(1 for line in dry.stdout.splitlines() if "nvcc" in line and " -c " in line)
    total = len(glob.glob(os.path.join(ROOT, "cuda", "*", "*.cu")))
    if compiles:
        note(f"libdsa: compiling {compiles} of {total} CUDA files with make (all {total}: about "
             f"{FULL_BUILD_MINUTES} minutes on 2 cores; `pip install -v` shows the compiler; "
             "set LIBDSA_LIBRARY=path/to/libdsa.so to skip)")
    start = time.monotonic()
    subprocess.check_call(make + ["build/libdsa.so"])
    os.makedirs(os.path.dirname(os.path.join(ROOT, PACKAGE_LIBRARY)), exist_ok=True)
    subprocess.check_call(make + ["LIB_SO=" + PACKAGE_LIBRARY, "SO_RPATH=-Wl,-rpath,'$$ORIGIN'", PACKAGE_LIBRARY])
    if compiles:
        s = int(time.monotonic() - start)
        note(f"libdsa: built {PACKAGE_LIBRARY} in " + (f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"))
    return os.path.join(ROOT, PACKAGE_LIBRARY)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        src = os.environ.get("LIBDSA_LIBRARY") or make_package_library()
        dst = os.path.join(self.build_lib, "libdsa", "lib")
        os.makedirs(dst, exist_ok=True)
        self.copy_file(src, os.path.join(dst, "libdsa.so"))


class BinaryDistribution(Distribution):
    """A wheel for one platform (it carries libdsa.so), installed into platlib."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: ctypes only, so any Python 3 and no Python ABI."""

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel}, distclass=BinaryDistribution)
