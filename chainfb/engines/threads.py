"""How many threads the CPU engines may use.

The NumPy engine (:mod:`~chainfb.engines.numpy_log`), the compiled engine
(:mod:`~chainfb.engines.numba_log`) and the SciPy shared-graph engine
(:mod:`~chainfb.engines.scipy_shared`) split a batch's sequences between
this many threads (NumPy, SciPy and the compiled code release the GIL).
Default: the ``CHAINFB_NUM_THREADS`` environment variable, else the CPUs
this process may run on.  The threads are pools started once per process
and size (:func:`pool`); a forked child starts its own.  :func:`parallel`
runs one part in the calling thread and the others on a pool, so a call
split in two wakes one worker, not two, while the caller works.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["set_num_threads", "get_num_threads", "pool", "parallel"]

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
    part): the calling thread and ``threads - 1`` workers of :func:`pool`,
    each taking the next part not yet taken.  Every part has finished when
    it returns; an exception of a part is raised then."""
    parts = list(parts)
    n = min(len(parts), threads or len(parts))
    if n <= 1:
        return [fn(p) for p in parts]
    out = [None] * len(parts)
    taken = itertools.count()  # next() on it is atomic under the GIL

    def work():
        i = next(taken)
        while i < len(parts):
            out[i] = fn(parts[i])
            i = next(taken)

    futures = [pool(n - 1).submit(work) for _ in range(n - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.result()
    return out
