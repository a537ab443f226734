"""pytest setup: the installed libdsa package is used when there is one (pip install ./python);
otherwise the checkout's python/libdsa with the checkout's build/libdsa.so."""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

_checkout = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def pytest_terminal_summary(terminalreporter):
    """Which package, library and CUDA versions the suites ran (make test: the installed package when
    there is one), and a warning when that library is older than the checkout's build."""
    import libdsa
    loaded = libdsa.library()
    lib = loaded.path
    terminalreporter.write_line(f"libdsa under test: {os.path.dirname(libdsa.__file__)} with {lib}")
    if getattr(loaded, "cuda_runtime", None) is not None:  # the CUDA versions the loader read
        v = lambda x: f"{x // 1000}.{x % 1000 // 10}"
        driver = f"for CUDA {v(loaded.cuda_driver)}" if loaded.cuda_driver else "none"
        terminalreporter.write_line(f"  CUDA runtime {v(loaded.cuda_runtime)}, driver {driver}")
    build = os.path.join(_checkout, "build", "libdsa.so")
    if (os.path.exists(build) and os.path.realpath(lib) != os.path.realpath(build)
            and os.path.getmtime(lib) < os.path.getmtime(build)):
        terminalreporter.write_line("  older than the checkout's build/libdsa.so: run `pip install ./python` again "
                                    "to test the build (or pip uninstall libdsa to test the checkout)")
