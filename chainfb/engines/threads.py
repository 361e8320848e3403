"""How many threads the CPU engines may use.

The NumPy engine (:mod:`~chainfb.engines.numpy_log`), the compiled engine
(:mod:`~chainfb.engines.numba_log`) and the SciPy shared-graph engine
(:mod:`~chainfb.engines.scipy_shared`) split a batch's sequences between
this many threads (NumPy, SciPy and the compiled code release the GIL).
Default: the ``CHAINFB_NUM_THREADS`` environment variable, else the CPUs
this process may run on.  :func:`parallel` runs the parts on torch's
OpenMP threads where it can (:mod:`~chainfb.engines.openmp`: they are awake
after torch's operations, and no extra thread competes with them for the
cores), else on a pool started once per process and size (:func:`pool`; a
forked child starts its own).  Either way the calling thread takes parts
too, so a call split in two wakes one worker, not two.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from . import openmp

__all__ = ["set_num_threads", "get_num_threads", "pool", "parallel", "PARTS_PER_THREAD"]

#: parts a batch is cut into per thread, for :func:`parallel` to hand out (each thread taking the next
#: part left: the threads finish together, and a thread held up by other load leaves its parts to others)
PARTS_PER_THREAD = 2

_num_threads = int(os.environ.get("CHAINFB_NUM_THREADS", "0")) or len(os.sched_getaffinity(0))


def set_num_threads(n: int) -> None:
    """Threads every CPU engine may use (``n >= 1``)."""
    global _num_threads
    if int(n) < 1:
        raise ValueError(f"n: expected a positive number of threads, got {n}")
    _num_threads = int(n)


def get_num_threads() -> int:
    """Threads every CPU engine may use (see :func:`set_num_threads`)."""
    return _num_threads


_pools: dict = {}
_pools_lock = threading.Lock()
# a forked child has none of the parent's threads: it starts its own pools
os.register_at_fork(after_in_child=_pools.clear)


def pool(n: int) -> ThreadPoolExecutor:
    """A pool of ``n`` worker threads, started once per process and size
    (not per call).  Its tasks must not wait on tasks of the same pool."""
    with _pools_lock:
        ex = _pools.get(n)
        if ex is None:
            ex = _pools[n] = ThreadPoolExecutor(n, thread_name_prefix="chainfb")
        return ex


def parallel(fn, parts, threads: int | None = None) -> list:
    """``[fn(p) for p in parts]`` on ``threads`` threads (default: one per
    part): the calling thread and ``threads - 1`` workers, of torch's OpenMP
    team (module docstring) or of :func:`pool`, each taking the next part not
    yet taken.  Every part has finished when it returns; the first exception
    of a part is raised then (a thread whose part raised takes no more; the
    others run the rest)."""
    parts = list(parts)
    n = min(len(parts), threads or len(parts))
    if n <= 1:
        return [fn(p) for p in parts]
    out = [None] * len(parts)
    errors = []
    taken = itertools.count()  # next() on it is atomic under the GIL

    def work():
        try:
            i = next(taken)
            while i < len(parts):
                out[i] = fn(parts[i])
                i = next(taken)
        except BaseException as e:  # noqa: B036 -- raised again by the caller
            errors.append(e)

    region = openmp.team()
    if region is not None:
        openmp.run_region(region, work, n)
    else:
        futures = [pool(n - 1).submit(work) for _ in range(n - 1)]
        work()
        for f in futures:
            f.result()
    if errors:
        raise errors[0]
    return out
