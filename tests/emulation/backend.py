"""Run chainfb's CUDA kernels on the CPU: the same ``.cu`` sources
(``chainfb/cuda/``) built by the host C++ compiler under ``emulate.h`` (this
directory) (threads of a block as
``std::thread``\\ s, ``__syncthreads`` as a ``std::barrier``, several blocks
at once in a random order, each with its own shared memory poisoned with
NaN; a barrier after a thread exited, too many threads or too much shared
memory is an error), loaded with ctypes.  Used by the tests to check the kernels'
logic on machines without a GPU; far too slow for anything else.

``EmulatedBackend`` is a kernel backend as :mod:`chainfb.cuda.kernels`
describes it (``xp``, ``launch``, ``cache_key``), with NumPy arrays in place
of CuPy arrays, so the CUDA engines and launchers run unchanged on it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np

from chainfb.cuda.kernels import KERNELS, source_dir

#: this directory: emulate*.h and the host launchers
EMULATION_DIR = os.path.dirname(os.path.abspath(__file__))

__all__ = ["EMULATION_DIR", "find_compiler", "host_build_flags", "build", "build_replay", "EmulatedBackend"]

_CTYPES = {
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
}


def find_compiler() -> str | None:
    """A host C++20 compiler (``$CXX``, ``g++`` or ``clang++``), or None."""
    for c in (os.environ.get("CXX"), "g++", "clang++"):
        if c and shutil.which(c):
            return c
    return None


def host_build_flags() -> list:
    """The host compiler's flags for the kernels: C++20, every warning an
    error, ``CHAINFB_EMULATE`` defined and both this directory (the
    emulation headers) and the package's kernel sources on the include path."""
    return ["-std=c++20", "-O1", "-g", "-pthread", "-Wall", "-Werror", "-DCHAINFB_EMULATE", "-I", EMULATION_DIR,
            "-I", source_dir()]


def build(directory: str, compiler: str | None = None, extra_flags=()) -> str:
    """Compile the kernels for the host into ``directory``; returns the
    shared library's path.  Raises ``RuntimeError`` with the compiler's
    output on any error or warning."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise RuntimeError("no host C++ compiler found (set CXX)")
    out = os.path.join(directory, "libchainfb_emulated.so")
    cmd = [compiler, *host_build_flags(), "-shared", "-fPIC", "-x", "c++",
           os.path.join(EMULATION_DIR, "emulate_launch.cpp"), "-o", out, *extra_flags]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or res.stderr.strip():
        raise RuntimeError(f"host build of the kernels failed:\n{' '.join(cmd)}\n{res.stderr}")
    return out


class EmulatedBackend:
    """Launch the host-compiled kernels (NumPy arrays as device memory)."""

    xp = np

    def __init__(self, library: str, record_to: str | None = None):
        self.record_to = record_to  # a directory: every launch is also written there (see emulate_replay.cpp)
        self.lib = ctypes.CDLL(library)
        self.lib.cfb_launch.restype = ctypes.c_int
        self.lib.cfb_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
        self.lib.cfb_kernel_name.restype = ctypes.c_char_p
        self.lib.cfb_last_error.restype = ctypes.c_char_p
        self.launches = []  # (name, grid, block) of every launch, for tests

    def kernel_names(self) -> list:
        return [self.lib.cfb_kernel_name(i).decode() for i in range(self.lib.cfb_num_kernels())]

    def launch(self, name: str, grid: int, block: int, args) -> None:
        if name not in KERNELS and not name.startswith("cfb_selftest::"):
            raise KeyError(f"unknown kernel {name!r}")
        if grid <= 0:
            return
        if not 1 <= int(block) <= 1024:
            raise ValueError(f"{name}: {block} threads per block (the CUDA limit is 1024)")
        if int(grid) >= 2**31:
            raise ValueError(f"{name}: grid of {grid} blocks (the CUDA limit is 2^31 - 1)")
        holders = []
        ptrs = (ctypes.c_void_p * max(1, len(args)))()
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError(f"{name}: argument {i} must be C-contiguous")
                h = ctypes.c_void_p(a.ctypes.data)
            elif isinstance(a, np.generic) and a.dtype in _CTYPES:
                h = _CTYPES[a.dtype](a.item())
            else:
                raise TypeError(f"{name}: argument {i} must be an array or a NumPy scalar, got {type(a).__name__}")
            holders.append(h)
            ptrs[i] = ctypes.cast(ctypes.pointer(h), ctypes.c_void_p)
        self.launches.append((name, int(grid), int(block)))
        if self.record_to is not None:
            self._record(name, int(grid), int(block), args)
        rc = self.lib.cfb_launch(name.encode(), int(grid), int(block), ptrs)
        if rc == -1:
            raise KeyError(f"kernel {name!r} is not in the emulation library")
        if rc != 0:
            raise RuntimeError(f"{name} (grid {grid}, block {block}): {self.lib.cfb_last_error().decode()}")

    def cache_key(self):
        """Key of the arrays cached for this backend (host memory, one "stream")."""
        return ("emulated", id(self))

    def _record(self, name, grid, block, args):
        import struct

        path = os.path.join(self.record_to, f"launch_{len(self.launches):05d}.bin")
        with open(path, "wb") as f:
            f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<III", grid, block, len(args)))
            for a in args:
                if isinstance(a, np.ndarray):
                    b = a.tobytes() if a.ctypes.data else b""  # a null pointer stays null
                    f.write(struct.pack("<BQ", 0, len(b)) + b)
                else:
                    b = np.asarray(a).tobytes()
                    f.write(struct.pack("<BQ", 1, len(b)) + b)


def build_replay(directory: str, compiler: str | None = None, extra_flags=()) -> str:
    """Build the standalone replayer of recorded launches (emulate_replay.cpp
    with the kernels) into ``directory``; returns the executable's path."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise RuntimeError("no host C++ compiler found (set CXX)")
    out = os.path.join(directory, "chainfb_replay")
    cmd = [compiler, *host_build_flags(), "-x", "c++", os.path.join(EMULATION_DIR, "emulate_launch.cpp"),
           os.path.join(EMULATION_DIR, "emulate_replay.cpp"), "-o", out, *extra_flags]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or res.stderr.strip():
        raise RuntimeError(f"host build of the replayer failed:\n{' '.join(cmd)}\n{res.stderr}")
    return out
