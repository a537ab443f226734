"""_loader.py - finds and loads libdsa.so once per process, with the CUDA libraries it links, and checks
the CUDA versions they need.

The library: $LIBDSA_LIBRARY (a path), the copy inside this package (libdsa/lib/, put there by
`pip install ./python`), then the checkout's build/libdsa.so (running from a source tree).

Its CUDA libraries: libdsa.so names the CUDA runtime and cuBLAS by soname (libcudart.so.13 and
libcublas.so.13 for a build with the CUDA 13 toolkit, read from its dynamic section: a build with
another toolkit finds its own), and the package's copy carries no toolkit path (RUNPATH $ORIGIN).
Each is taken from the first of: a copy already loaded in the process (importing torch loads those of
its nvidia-* pip wheels), the nvidia/*/lib folders of pip wheels on sys.path, the system loader path
(LD_LIBRARY_PATH, ld.so.cache), $CUDA_HOME/lib64 (default /usr/local/cuda).

The versions: libdsa.so needs the CUDA runtime of the major it was built with and a driver for that
major (CUDA 13: NVIDIA driver 580.65.06 or newer), read through cudaRuntimeGetVersion and
cudaDriverGetVersion once loaded. The package's import loads the library: a driver that is too old
(or a runtime of another major) gets a one-line warning there, no driver at all gets nothing (CPU
tensors run the CPU reference); a CUDA op then raises DSAUnsupported with the same line.
"""
import ctypes
import glob
import os
import struct
import sys
import warnings

from . import _capi

_here = os.path.dirname(os.path.abspath(__file__))
_lib = None

# The Linux driver that each CUDA major's first release needs (NVIDIA's CUDA toolkit release notes).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}


def _candidates():
    env = os.environ.get("LIBDSA_LIBRARY")
    if env:
        return [env]
    return [os.path.join(_here, "lib", "libdsa.so"),
            os.path.normpath(os.path.join(_here, "..", "..", "build", "libdsa.so"))]


def needed_libraries(path):
    """The DT_NEEDED sonames of an ELF64 little-endian shared library; [] for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return []
            (shoff,) = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            # (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, ...) per section
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            for sec in sections:
                if sec[1] != 6:  # SHT_DYNAMIC; its sh_link is the section of its strings
                    continue
                f.seek(sec[4])
                dynamic = f.read(sec[5])
                strtab = sections[sec[6]]
                f.seek(strtab[4])
                strings = f.read(strtab[5])
                names = []
                for tag, value in struct.iter_unpack("<qQ", dynamic):
                    if tag == 0:  # DT_NULL
                        break
                    if tag == 1:  # DT_NEEDED
                        names.append(strings[value:strings.index(b"\0", value)].decode())
                return names
    except (OSError, struct.error, IndexError, ValueError):
        pass
    return []


def _wheel_dirs():
    """The nvidia/*/lib folders of pip wheels on sys.path (nvidia-cuda-runtime, nvidia-cublas; the
    CUDA 13 wheels share nvidia/cu13/lib)."""
    dirs = []
    for entry in sys.path:
        for d in sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib"))) if entry else []:
            if d not in dirs:
                dirs.append(d)
    return dirs


def _loaded_path(soname):
    """The file of an already loaded `soname` (from /proc/self/maps), or None when it is not loaded."""
    try:
        ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith(soname):
                    return path
    except OSError:
        pass
    return "(loaded)"


def _load_dependency(soname, tried):
    """Loads `soname` from the first place that has it (the module docstring's order) and returns its
    file; None when none has it, with the reasons appended to `tried`."""
    path = _loaded_path(soname)
    if path:
        return path
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    places = [os.path.join(d, soname) for d in _wheel_dirs()] + [soname, os.path.join(cuda_home, "lib64", soname)]
    for place in places:
        if os.sep in place and not os.path.exists(place):
            continue
        try:
            ctypes.CDLL(place)
        except OSError as e:
            if os.sep in place:  # there but not loadable; a bare soname failing is "not found"
                tried.append(str(e))
            continue
        return place if os.sep in place else (_loaded_path(soname) or soname)
    tried.append(f"{soname} is in none of: the nvidia/*/lib folders of pip wheels on sys.path, the system "
                 f"loader path, {os.path.join(cuda_home, 'lib64')}")
    return None


def _load_cuda_libraries(path, tried):
    """Loads the CUDA runtime and cuBLAS that libdsa.so at `path` links: ({soname: file}, the runtime's
    soname or None when its dynamic section names none)."""
    found, cudart = {}, None
    for soname in needed_libraries(path):
        if soname.startswith("libcudart.so."):
            cudart = soname
            names = [soname]
        elif soname.startswith("libcublas.so."):
            names = ["libcublasLt" + soname[len("libcublas"):], soname]  # cuBLAS needs cuBLASLt
        else:
            continue
        for name in names:
            found[name] = _load_dependency(name, tried)
    return found, cudart


def cuda_versions(cudart_soname):
    """(runtime, driver) as the loaded CUDA runtime reports them (1000 * major + 10 * minor; driver 0:
    no driver installed)."""
    cudart = ctypes.CDLL(cudart_soname, mode=os.RTLD_NOLOAD)
    runtime, driver = ctypes.c_int(0), ctypes.c_int(0)
    cudart.cudaRuntimeGetVersion(ctypes.byref(runtime))
    cudart.cudaDriverGetVersion(ctypes.byref(driver))
    return runtime.value, driver.value


def _cuda(version):
    return f"{version // 1000}.{version % 1000 // 10}"


def cuda_problem(major, runtime, driver):
    """Why libdsa's CUDA ops cannot run with this runtime and driver (versions as cuda_versions gives
    them), for a libdsa.so built with CUDA `major`; None when they can."""
    need = f"a driver for CUDA {major}.0 or newer" + (f" (NVIDIA {MIN_DRIVER[major]} or newer)"
                                                      if major in MIN_DRIVER else "")
    if runtime // 1000 != major:
        return (f"libdsa: libdsa.so is built for the CUDA {major} runtime, the one loaded is CUDA "
                f"{_cuda(runtime)}: its CUDA ops need the CUDA {major} runtime and {need}")
    if driver == 0:
        return (f"libdsa: no NVIDIA driver found: libdsa's CUDA ops need {need}; CPU tensors run "
                "libdsa's CPU reference")
    if driver < major * 1000:
        return (f"libdsa: the NVIDIA driver supports CUDA {_cuda(driver)}; libdsa's CUDA ops (CUDA "
                f"{major}) need {need}; CPU tensors run libdsa's CPU reference")
    return None


def library():
    """The loaded libdsa (an _capi.Lib); raises OSError naming every place searched. The first load
    reads the CUDA versions: lib.cuda_major (libdsa.so's), lib.cuda_runtime, lib.cuda_driver and
    lib.cuda_problem (cuda_problem's line or None); lib.cuda_libraries says where each CUDA library
    came from."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (absent)")
            continue
        missing = []
        cuda_libraries, cudart = _load_cuda_libraries(path, missing)
        try:
            lib = _capi.Lib(path)
        except OSError as e:
            tried.append(f"{path} ({e}{'; ' if missing else ''}{'; '.join(missing)})")
            continue
        lib.path, lib.cuda_libraries = path, cuda_libraries
        lib.cuda_major = lib.cuda_runtime = lib.cuda_driver = lib.cuda_problem = None
        if cudart is not None:
            lib.cuda_major = int(cudart.split(".")[2])
            lib.cuda_runtime, lib.cuda_driver = cuda_versions(cudart)
            lib.cuda_problem = cuda_problem(lib.cuda_major, lib.cuda_runtime, lib.cuda_driver)
        _lib = lib
        return lib
    raise OSError("libdsa.so not found or not loadable; tried: " + "; ".join(tried) +
                  ". Build it with `make` in the checkout, or set LIBDSA_LIBRARY. Its CUDA runtime and cuBLAS "
                  "come from torch's nvidia-* pip wheels (pip install nvidia-cuda-runtime nvidia-cublas for "
                  "CUDA 13), the system loader path or $CUDA_HOME/lib64.")


def load_at_import():
    """What the package's import does: loads libdsa and warns in one line when a driver is there but
    cannot run libdsa's CUDA ops (without a driver: nothing); a library that cannot load raises its
    OSError at first use instead."""
    try:
        lib = library()
    except OSError:
        return
    if lib.cuda_problem and lib.cuda_driver:
        warnings.warn(lib.cuda_problem, RuntimeWarning, stacklevel=2)


def require_cuda(lib):
    """Raises DSAUnsupported with cuda_problem's line when libdsa's CUDA ops cannot run here."""
    if lib.cuda_problem:
        raise _capi.DSAUnsupported(lib.cuda_problem, _capi.DSA_ERROR_NO_DEVICE)
