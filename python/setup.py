"""Puts libdsa.so inside the package when it is built: $LIBDSA_LIBRARY if set, else the checkout's
build/libdsa.so, which `make` builds first when it is missing (needs the CUDA toolkit; about 2
minutes on 2 cores). The wheel is platform-specific since it carries that library."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        src = os.environ.get("LIBDSA_LIBRARY")
        if not src:
            src = os.path.join(ROOT, "build", "libdsa.so")
            if not os.path.exists(src):
                subprocess.check_call(["make", "-C", ROOT, "build/libdsa.so"])
        dst = os.path.join(self.build_lib, "libdsa", "lib")
        os.makedirs(dst, exist_ok=True)
        shutil.copy2(src, os.path.join(dst, "libdsa.so"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
