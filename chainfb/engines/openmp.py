"""Torch's OpenMP threads as the CPU engines' worker threads.

A training step alternates torch operations with chainfb's engines.  After
each parallel torch operation, the OpenMP worker threads that torch uses
stay awake for a while and spin, waiting for the next parallel region
(GNU libgomp spins some milliseconds before it sleeps).  An engine that
splits its batch over threads of its own then shares the cores with those
spinning threads: on two cores, two engine threads and one spinning torch
thread run at two thirds of their speed.  The simple transducer loss, whose
grid runs right after the joiner's torch operations, took 5 ms in its
engine where it takes 2.4 ms alone.

So when torch's OpenMP runtime is loaded and exports ``GOMP_parallel`` (the
GNU entry point; LLVM's and Intel's runtimes export it too), the engines
run their parts as a parallel region of that runtime: the threads that are
spinning take the parts at once, and no third thread competes for a core.
Each thread of the region enters Python through a ctypes callback, takes
the next part not yet taken, and calls the compiled code, which releases
the GIL.  The calling thread is one of the region's threads.

Not used (:func:`team` returns None; the engines fall back to their own
thread pool, :mod:`~chainfb.engines.threads`):

- outside Linux, or when torch's parallel backend is not OpenMP;
- when the environment variable ``CHAINFB_OPENMP`` is ``0``;
- in a forked child process (GNU libgomp's threads do not survive a fork,
  and a region would wait for them);
- when several OpenMP runtimes are loaded and none is torch's.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["team", "run_region"]

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_RUNTIMES = ("libgomp", "libiomp5", "libomp")
_forked = False
_regions: dict = {}  # key -> the region's work, for the callback
_keys = itertools.count(1)  # next() on it is atomic under the GIL


def _after_fork_in_child():
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _candidates():
    """``(paths, roots)``: the OpenMP runtimes mapped into this process, those
    under torch's installation (the directories ``roots``) first."""
    import torch

    here = os.path.dirname(os.path.abspath(torch.__file__))
    roots = (here + os.sep, here + ".libs" + os.sep)  # torch/lib, or a wheel's torch.libs
    seen = {}  # an ordered set
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                name = os.path.basename(path)
                if path.startswith("/") and name.startswith(_RUNTIMES) and ".so" in name:
                    seen[path] = None
    except OSError:
        return [], roots
    return sorted(seen, key=lambda p: not p.startswith(roots)), roots


@functools.cache
def _find():
    """The runtime's ``GOMP_parallel`` (looked for once), or None."""
    if not sys.platform.startswith("linux") or os.environ.get("CHAINFB_OPENMP", "1") == "0":
        return None
    import torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    paths, roots = _candidates()
    if not paths or (len(paths) > 1 and not paths[0].startswith(roots)):
        return None  # torch's runtime, or the only one loaded
    try:
        fn = ctypes.CDLL(paths[0]).GOMP_parallel
    except (OSError, AttributeError):
        return None
    fn.argtypes = [_CALLBACK, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    fn.restype = None
    return fn


def team() -> Any:
    """The runtime's ``GOMP_parallel``, or None where it is not used (module
    docstring)."""
    return None if _forked else _find()


def _enter(key):
    _regions[key]()


_ENTRY = _CALLBACK(_enter)  # kept alive for the life of the module


def run_region(region: Any, work: Callable[[], None], n: int) -> None:
    """Run ``work()`` on ``n`` threads of the OpenMP runtime's team, the
    calling thread one of them, through ``region`` (what :func:`team`
    returned); returns when every thread has returned.  ``work`` must catch
    its own exceptions (a callback cannot raise)."""
    key = next(_keys)
    _regions[key] = work
    try:
        region(_ENTRY, key, n, 0)
    finally:
        del _regions[key]
