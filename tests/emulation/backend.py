"""Run chainfb's CUDA kernels on the CPU: the same ``.cu`` sources
(``chainfb/cuda/``) built by the host C++ compiler under ``emulate.h`` (this
directory) and loaded with ctypes.  Every CUDA thread is a user-level fiber
(``emulate_fiber.h``) on the launching thread, switched at ``__syncthreads``
and at warp intrinsics; several blocks run interleaved in a random order,
the threads of each phase in a shuffled order, each block with its own
static and dynamic shared memory poisoned with all-ones bytes (NaN).  Warp
shuffles, ``__syncwarp`` and ``__activemask`` follow CUDA's rules
(``emulate_warp.h``).  A barrier after a thread exited, a deadlock, a warp
intrinsic whose lanes diverged, too many threads or too much shared memory
is an error.  On request it counts the work kernels annotate
(``CHAINFB_WORK``) per launch and block, and moves exp / log / log1p
results by a few ulps (``CHAINFB_EMULATE_MATH``, ``emulate_math.h``).  Used
by the tests to check the kernels' logic on machines without a GPU.

``EmulatedBackend`` is a kernel backend as :mod:`chainfb.cuda.kernels`
describes it (``xp``, ``launch``, ``cache_key``), with NumPy arrays in place
of CuPy arrays, so the CUDA engines and launchers run unchanged on it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import struct
import subprocess

import numpy as np

from chainfb.cuda.kernels import KERNELS, source_dir

#: this directory: emulate*.h and the host launchers
EMULATION_DIR = os.path.dirname(os.path.abspath(__file__))

__all__ = ["EMULATION_DIR", "find_compiler", "host_build_flags", "build", "build_replay", "EmulatedBackend",
           "LaunchStats"]

#: the most dynamic shared memory a block may have (bytes), as on an H100 (static included)
MAX_SHARED_BYTES = 227 * 1024

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


@dataclasses.dataclass
class LaunchStats:
    """The work one launch did, as the emulation counted it (fields also
    readable as ``stats["span"]``).

    ``phases [grid]`` (int64): each block's phases (its ``__syncthreads`` + 1);
    ``span_weighted [grid]`` (float64): each block's sum over phases of the
    largest weighted count of any of its threads in the phase (``sum_cat
    w[cat] * count[cat]``, weights of :meth:`EmulatedBackend.set_work_weights`);
    ``span``: category name (``"kWorkArcF"``, ... as ``chainfb::Work`` spells
    them) -> the largest over blocks of the sum over phases of the largest
    count of any thread; ``work``: category name -> the total over all
    threads.
    """

    name: str
    grid: int
    block: int
    shared_mem: int
    phases: np.ndarray
    span_weighted: np.ndarray
    span: dict
    work: dict

    def __getitem__(self, key):
        return getattr(self, key)


class EmulatedBackend:
    """Launch the host-compiled kernels (NumPy arrays as device memory).

    ``record_to``: a directory every launch is also written to (see
    ``emulate_replay.cpp``).  ``count``: count the work of every launch; one
    :class:`LaunchStats` per launch is appended to ``stats``.  Counting off
    costs a branch per annotation.
    """

    xp = np
    #: it runs the kernels declared with thread block clusters (``cluster.cu``), as a device of compute
    #: capability 9.0 does
    clusters = True

    def __init__(self, library: str, record_to: str | None = None, count: bool = False):
        self.record_to = record_to  # a directory: every launch is also written there (see emulate_replay.cpp)
        self.count = bool(count)
        self.lib = ctypes.CDLL(library)
        self.lib.cfb_launch_ex.restype = ctypes.c_int
        self.lib.cfb_launch_ex.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                           ctypes.c_void_p, ctypes.c_int]
        self.lib.cfb_launch.restype = ctypes.c_int
        self.lib.cfb_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
        self.lib.cfb_kernel_name.restype = ctypes.c_char_p
        self.lib.cfb_last_error.restype = ctypes.c_char_p
        self.lib.cfb_work_category_name.restype = ctypes.c_char_p
        self.lib.cfb_set_work_weights.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.lib.cfb_last_launch_stats.argtypes = [ctypes.c_uint] + [ctypes.c_void_p] * 4
        self.work_categories = [self.lib.cfb_work_category_name(i).decode()
                                for i in range(self.lib.cfb_num_work_categories())]
        self.work_weights = {c: 1.0 for c in self.work_categories}
        self.launches = []  # (name, grid, block) of every launch, for tests
        self.stats = []  # LaunchStats of every launch when counting

    def kernel_names(self) -> list:
        return [self.lib.cfb_kernel_name(i).decode() for i in range(self.lib.cfb_num_kernels())]

    def set_work_weights(self, weights: dict) -> None:
        """The weights of the weighted span of later launches: ``{category
        name: weight}``; a category not named weighs 0 (every one weighs 1
        until this is called)."""
        unknown = sorted(set(weights) - set(self.work_categories))
        if unknown:
            raise ValueError(f"weights: unknown work categories {unknown} (known: {self.work_categories})")
        self.work_weights = {c: float(weights.get(c, 0.0)) for c in self.work_categories}

    def launch(self, name: str, grid: int, block: int, args, shared_mem: int = 0) -> None:
        if name not in KERNELS and not name.startswith("cfb_selftest::"):
            raise KeyError(f"unknown kernel {name!r}")
        if grid <= 0:
            return
        if not 1 <= int(block) <= 1024:
            raise ValueError(f"{name}: {block} threads per block (the CUDA limit is 1024)")
        if int(grid) >= 2**31:
            raise ValueError(f"{name}: grid of {grid} blocks (the CUDA limit is 2^31 - 1)")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)):
            raise TypeError(f"{name}: shared_mem must be an int, got {type(shared_mem).__name__}")
        if not 0 <= int(shared_mem) <= MAX_SHARED_BYTES:
            raise ValueError(f"{name}: shared_mem of {shared_mem} bytes (0..{MAX_SHARED_BYTES} per block)")
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
            self._record(name, int(grid), int(block), int(shared_mem), args)
        if self.count:
            w = np.array([self.work_weights[c] for c in self.work_categories], dtype=np.float64)
            self.lib.cfb_set_work_weights(w.ctypes.data, len(w))
        rc = self.lib.cfb_launch_ex(name.encode(), int(grid), int(block), int(shared_mem), ptrs, int(self.count))
        if rc == -1:
            raise KeyError(f"kernel {name!r} is not in the emulation library")
        if rc != 0:
            raise RuntimeError(f"{name} (grid {grid}, block {block}): {self.lib.cfb_last_error().decode()}")
        if self.count:
            self.stats.append(self._last_stats(name, int(grid), int(block), int(shared_mem)))

    def _last_stats(self, name, grid, block, shared_mem) -> LaunchStats:
        k = len(self.work_categories)
        phases = np.zeros(grid, dtype=np.int64)
        span_weighted = np.zeros(grid, dtype=np.float64)
        span = np.zeros(k, dtype=np.int64)
        work = np.zeros(k, dtype=np.int64)
        if self.lib.cfb_last_launch_stats(grid, phases.ctypes.data, span_weighted.ctypes.data, span.ctypes.data,
                                          work.ctypes.data) != 0:
            raise RuntimeError(f"{name}: the emulation kept no counts of this launch")
        return LaunchStats(name, grid, block, shared_mem, phases, span_weighted,
                           {c: int(v) for c, v in zip(self.work_categories, span)},
                           {c: int(v) for c, v in zip(self.work_categories, work)})

    def cache_key(self):
        """Key of the arrays cached for this backend (host memory, one "stream")."""
        return ("emulated", id(self))

    def _record(self, name, grid, block, shared_mem, args):
        path = os.path.join(self.record_to, f"launch_{len(self.launches):05d}.bin")
        with open(path, "wb") as f:
            f.write(struct.pack("<I", len(name)) + name.encode()
                    + struct.pack("<IIII", grid, block, shared_mem, len(args)))
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
