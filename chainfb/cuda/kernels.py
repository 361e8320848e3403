"""The CUDA sources shipped with chainfb, the kernel instantiations they
provide, their run-time compilation by CuPy (NVRTC), cached per device, and
where data runs.

A *kernel backend* is what the CUDA engines (:mod:`chainfb.engines.cuda`,
:mod:`chainfb.engines.cuda_shared`) and the score-map launchers
(:mod:`chainfb.cuda.transducer_maps`) take as their first argument.  It has:

``xp``
    the array module of its memory (``cupy`` for the GPU): every array the
    callers allocate or convert for the kernels comes from ``xp``.
``launch(name, grid, block, args, shared_mem=0)``
    run the kernel instantiation ``name`` (a key of :data:`KERNELS`) on a
    1-D grid of ``grid`` blocks of ``block`` threads (nothing for ``grid <=
    0``) with ``shared_mem`` bytes of dynamic shared memory per block (what
    ``CHAINFB_DYNAMIC_SHARED`` in ``common.cuh`` points at); ``args`` is a
    list of ``xp`` arrays (C-contiguous) and NumPy scalars whose types
    match the kernel's parameters exactly.
``max_shared_mem`` (optional)
    the most shared memory a block may have on the device (the engines
    assume 48 KiB without it).
``clusters`` (optional)
    whether it runs the kernels declared with thread block clusters
    (``cluster.cu``: compute capability 9.0 or later; False without it).
``multiprocessors`` (optional)
    the device's SMs (the engines assume 132 without it).
``separate_arrays`` (optional)
    the engines' arrays each in an allocation of its own (for a memory
    checker, which sees an access past an array only at its allocation's
    end) instead of views of one allocation: a lattice's arrays and a call's
    scratch rows (False without it; see :mod:`chainfb.engines.cuda_memory`).
``cache_key()``
    a hashable key of where arrays made now live and are ordered (device
    and stream): device copies cached on a lattice are kept per key (see
    :func:`chainfb.engines.cuda.cached`).

:class:`CupyBackend` is the GPU's.  The test suite plugs a CPU emulation of
the same sources into this interface (``tests/emulation/``).

Where data runs is decided in one place: :func:`on_device` (CuPy arrays and
CUDA tensors run through the kernels) and :func:`backend_for` (the backend
those kernels run on).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Sequence
from types import ModuleType
from typing import Any, Protocol

import numpy as np


__all__ = [
    "SOURCES",
    "KERNELS",
    "MIN_COMPUTE",
    "source_dir",
    "load_source",
    "nvrtc_options",
    "KernelBackend",
    "CupyBackend",
    "cupy_backend",
    "on_device",
    "backend_for",
    "require_cupy",
    "cuda_include_dirs",
    "null_or",
    "extent_bytes",
    "REAL_TYPES",
]

#: Kernel files (compiled separately) and the instantiations each provides.
SOURCES = {
    "engine.cu": [f"chainfb::fb_{k}<{r}>" for k in ("recursion", "posteriors") for r in ("float", "double")],
    # thread block clusters: built only for devices of compute capability 9.0 and later
    "cluster.cu": [f"chainfb::fb_cluster_recursion<{r}, {k}>" for r in ("float", "double") for k in (2, 4, 8)],
    "shared_graph.cu": [
        f"chainfb::fb_shared_{k}<{r}>" for k in ("recursion", "posteriors") for r in ("float", "double")
    ],
    # the score map of pdf-labelled graphs: (input, output) of the gather, (posteriors, gradient) of the scatter
    "pdf_map.cu": [f"chainfb::pdf_gather<{i}, {o}>" for i, o in (("float", "float"), ("float", "double"),
                                                                  ("double", "double"))]
    + [f"chainfb::pdf_scatter<{p}, {g}>" for p, g in (("float", "float"), ("double", "float"), ("double", "double"))],
    "transducer.cu": [
        f"chainfb::transducer_gather<{i}, {r}>"
        for i, r in (("float", "float"), ("double", "double"), ("chainfb::F16", "float"), ("chainfb::BF16", "float"))
    ]
    + [
        f"chainfb::transducer_grad<{i}, {r}>"
        for i, r in (("float", "float"), ("double", "double"), ("chainfb::F16", "float"), ("chainfb::BF16", "float"))
    ],
}

#: the least compute capability (major * 10 + minor) a source's kernels compile for; the others compile for
#: every architecture chainfb supports (sm_80 on)
MIN_COMPUTE = {"cluster.cu": 90}

#: kernel name -> source file
KERNELS = {name: src for src, names in SOURCES.items() for name in names}


#: the C++ type of each real dtype the kernels are instantiated for (the ``R`` of ``fb_recursion<R>``, the ``In``
#: and ``Out`` of ``pdf_gather<In, Out>``, ...)
REAL_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def null_or(a: Any) -> Any:
    """``a``, or a null pointer (``uint64`` 0) for None: an optional kernel array argument."""
    return np.uint64(0) if a is None else a


def extent_bytes(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """The bytes of memory a strided array spans, from its first element to the end of its last (``strides`` in
    bytes, non-negative; what a kernel given the array's first element may reach); 0 for an empty array."""
    if any(n == 0 for n in shape):
        return 0
    return itemsize + sum((n - 1) * s for n, s in zip(shape, strides))


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def source_dir() -> str:
    """Directory holding the ``.cu``/``.cuh`` files."""
    return os.path.dirname(os.path.abspath(__file__))


def load_source(name: str) -> str:
    """Text of ``name`` with its local ``#include "..."`` files inlined (once
    each), so the code alone determines the compiled result (and CuPy's cache
    key).  ``emulate.h`` is never inlined: its include sits behind ``#ifdef
    CHAINFB_EMULATE`` (the test suite's host build, see ``common.cuh``) and
    the file is not part of the package."""
    seen = set()

    def expand(fname):
        if fname in seen:
            return ""
        seen.add(fname)
        with open(os.path.join(source_dir(), fname), encoding="utf-8") as f:
            text = f.read()

        def sub(m):
            inc = m.group(1)
            if inc == "emulate.h":
                return m.group(0)
            return expand(inc)

        return _INCLUDE.sub(sub, text)

    return expand(name)


def cuda_include_dirs() -> list:
    """Directories holding ``cuda_fp16.h`` / ``cuda_bf16.h`` for NVRTC: the
    toolkit of ``$CUDA_PATH`` / ``$CUDA_HOME`` or of ``nvcc`` on the PATH,
    the ``nvidia-cuda-runtime`` wheel (installed by CuPy's ``ctk``
    extra), ``/usr/local/cuda*``; the first that has them."""
    import shutil
    import sys

    cands = [os.path.join(os.environ[v], "include") for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    for p in sys.path:
        cands += [os.path.join(p, "nvidia", sub, "include") for sub in ("cuda_runtime", "cu13", "cu12")]
    import glob

    cands += ["/usr/local/cuda/include"] + sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    out = []
    for d in cands:
        if os.path.isfile(os.path.join(d, "cuda_fp16.h")) and d not in out:
            out.append(d)
    return out[:1]


def nvrtc_options(arch: str | None = None) -> tuple:
    """NVRTC options for chainfb's kernels (``arch`` like ``"sm_90"``)."""
    opts = ["--std=c++17", "-default-device"] + [f"-I{d}" for d in cuda_include_dirs()]
    if arch is not None:
        opts.append(f"--gpu-architecture={arch}")
    return tuple(opts)


def _torch_cuda_major():
    """CUDA major version torch was built with, or None (CPU build / no torch)."""
    try:
        import torch
    except ImportError:
        return None
    v = getattr(torch.version, "cuda", None)
    return int(str(v).split(".")[0]) if v else None


def _cupy_cuda_major(cupy):
    """CUDA major version of CuPy's runtime (e.g. 12 for 12080)."""
    return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000


def _import_cupy():
    import cupy

    return cupy


_checked_cupy = None  # (the CuPy module, torch's CUDA major version) require_cupy last found to match


def require_cupy() -> ModuleType:
    """Import CuPy for chainfb's GPU path, checking that its CUDA major
    version matches torch's; a clear error with the install line otherwise.
    (Checked once: a step on the GPU asks several times.)"""
    global _checked_cupy
    major = _torch_cuda_major()
    want = major if major is not None else 13

    def line():  # (made only for an error: a step asks several times)
        return f"pip install 'chainfb[gpu-cu{want}]'  (or: pip install 'cupy-cuda{want}x[ctk]')"

    try:
        cupy = _import_cupy()
    except ImportError as e:
        raise ImportError(f"chainfb's GPU path needs CuPy built for CUDA {want}: {line()}") from e
    if _checked_cupy == (cupy, major):
        return cupy
    have = _cupy_cuda_major(cupy)
    if major is not None and have != major:
        raise RuntimeError(
            f"CuPy is built for CUDA {have} but torch for CUDA {major} (torch.version.cuda = "
            f"{_torch_version_cuda()}); install the matching CuPy: pip uninstall cupy-cuda{have}x && {line()}")
    _checked_cupy = (cupy, major)
    return cupy


def _torch_version_cuda():
    import torch

    return torch.version.cuda


#: shared memory, static and dynamic together, a block may use without its kernel opting in (bytes)
_DEFAULT_SHARED = 48 * 1024


class KernelBackend(Protocol):
    """The kernel backend interface (module docstring; ``max_shared_mem`` is
    optional and read with ``getattr``)."""

    xp: Any

    def launch(self, name: str, grid: int, block: int, args: Sequence[Any], shared_mem: int = 0) -> None:
        """Run kernel instantiation ``name`` on ``grid`` blocks of ``block`` threads."""
        ...

    def cache_key(self) -> Hashable:
        """Where arrays made now live and are ordered (device and stream)."""
        ...


class CupyBackend:
    """Launch chainfb kernels on the current CUDA device through CuPy."""

    def __init__(self):
        cupy = require_cupy()

        self.xp = cupy
        self._modules = {}
        self._facts = {}  # (fact, device) -> int
        # (instantiation, device) -> [RawKernel, its static shared memory, the dynamic shared memory it was opted
        # in for (0: never)]: each a driver query, asked once, not at every launch
        self._functions = {}

    def module(self, src: str) -> Any:
        """The compiled ``RawModule`` of source file ``src`` for the current device."""
        dev = self.xp.cuda.Device().id
        key = (src, dev)
        mod = self._modules.get(key)
        if mod is None:
            mod = self.xp.RawModule(code=load_source(src), options=nvrtc_options(), name_expressions=SOURCES[src])
            self._modules[key] = mod
        return mod

    def function(self, name: str) -> Any:
        """The ``RawKernel`` of instantiation ``name`` (a key of :data:`KERNELS`) on the current device."""
        return self.module(KERNELS[name]).get_function(name)

    @property
    def max_shared_mem(self) -> int:
        """The most shared memory (bytes) a block may have on the current
        device once a kernel opts in (``cudaDevAttrMaxSharedMemoryPerBlockOptin``)."""
        return self._device_fact("shared", lambda dev: dev.attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))

    def _device_fact(self, name: str, read: Callable[[Any], int]) -> int:
        """``read(device)`` for the current device, read once per device (a device's attributes do not change)."""
        dev = self.xp.cuda.Device()
        key = (name, dev.id)
        got = self._facts.get(key)
        if got is None:
            got = self._facts[key] = int(read(dev))
        return got

    @property
    def clusters(self) -> bool:
        """Whether the current device runs thread block clusters (compute capability 9.0 or later)."""
        return self._device_fact("compute", lambda dev: dev.compute_capability) >= 90

    @property
    def multiprocessors(self) -> int:
        """The current device's SMs."""
        return self._device_fact("sms", lambda dev: dev.attributes["MultiProcessorCount"])

    def launch(self, name: str, grid: int, block: int, args: Sequence[Any], shared_mem: int = 0) -> None:
        """Run kernel ``name`` on ``grid`` blocks of ``block`` threads with
        ``shared_mem`` bytes of dynamic shared memory per block (where the
        kernel's static shared memory and ``shared_mem`` together pass the
        48 KiB a block gets by default, its ``max_dynamic_shared_size_bytes``
        is raised first: CUDA refuses such a launch, ``CUDA_ERROR_INVALID_VALUE``,
        otherwise)."""
        if grid <= 0:
            return
        shared_mem = int(shared_mem)
        if shared_mem < 0:
            raise ValueError(f"{name}: shared_mem must be >= 0, got {shared_mem}")
        key = (name, self.xp.cuda.Device().id)
        entry = self._functions.get(key)
        if entry is None:
            fn = self.function(name)
            entry = self._functions[key] = [fn, int(fn.shared_size_bytes), 0]
        fn, static, opted = entry
        if static + shared_mem > _DEFAULT_SHARED and opted < shared_mem:
            # opt in (whether the attribute's default counts the static shared memory or not)
            fn.max_dynamic_shared_size_bytes = max(shared_mem, fn.max_dynamic_shared_size_bytes)
            entry[2] = fn.max_dynamic_shared_size_bytes
        fn((int(grid),), (int(block),), tuple(args), shared_mem=shared_mem)

    def cache_key(self) -> tuple[str, int, int]:
        """Where arrays made now live and are ordered: the current device and
        CuPy's current stream (see :func:`chainfb.engines.cuda.cached`)."""
        return ("cuda", self.xp.cuda.Device().id, self.xp.cuda.get_current_stream().ptr)


_CUPY_BACKEND = None


def cupy_backend() -> CupyBackend:
    """The process-wide :class:`CupyBackend` (modules cached per device)."""
    global _CUPY_BACKEND
    if _CUPY_BACKEND is None:
        _CUPY_BACKEND = CupyBackend()
    return _CUPY_BACKEND


def on_device(x: object) -> bool:
    """Whether ``x`` lives on a CUDA device -- a CuPy array or a CUDA torch
    tensor -- and so runs through the kernels (on :func:`backend_for`'s
    backend).  Imports neither CuPy nor torch."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return True
    return mod.startswith("torch") and bool(getattr(x, "is_cuda", False))


def backend_for(x: object) -> CupyBackend | None:
    """The kernel backend that runs ``x``: :func:`cupy_backend` when
    :func:`on_device`, else None (the CPU paths)."""
    return cupy_backend() if on_device(x) else None
