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

:func:`split` is the one place that cuts work into parts for
:func:`parallel`: every engine and the compiled score maps call it, with a
threshold of :data:`MIN_PARALLEL_WORK` below which a call runs on one
thread (one per kind of work, each with its reason).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import openmp

__all__ = ["set_num_threads", "get_num_threads", "pool", "parallel", "split", "PARTS_PER_THREAD",
           "MIN_PARALLEL_WORK"]

#: parts a batch is cut into per thread, for :func:`parallel` to hand out (each thread taking the next
#: part left: the threads finish together, and a thread held up by other load leaves its parts to others)
PARTS_PER_THREAD = 2

#: the work below which :func:`split` leaves a call on one thread, per kind of work (its unit, and why)
MIN_PARALLEL_WORK = {
    # the NumPy engine: arcs of the lattice (plus one per sequence); below it the array operations of a
    # frame are too short for threads to overlap (the Python overhead holds the GIL)
    "numpy": 100_000,
    # the compiled engine: arcs x frames of the batch (plus one per sequence and frame); below it a
    # thread's wake-up costs more than the work it takes over
    "numba": 200_000,
    # the SciPy shared-graph engine: sequences x arcs x frames; its sparse products release the GIL only
    # for their length, so a part must hold many sequences
    "shared": 2e7,
    # the compiled score maps, per thread: grid cells (b, t, u), one logits row each
    "cells": 256,
    # ... blocks of frames of a batch row (each many cells)
    "blocks": 2,
    # ... rows of a (px, py) grid
    "rows": 64,
    # ... single scores moved by a score plan (a copy each: only long ones pay for a thread)
    "scores": 1 << 17,
}

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


def parallel(fn: Callable[[Any], Any], parts: Sequence[Any], threads: int | None = None) -> list:
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


def split(work: int | np.ndarray, threads: int, min_work: float, parts_per_thread: int = PARTS_PER_THREAD) -> list:
    """Contiguous ``(start, stop)`` ranges covering the items, to run on
    ``threads`` threads with :func:`parallel`.

    ``work``: each item's cost ``[N]`` (an array), or ``N`` (an int) for
    items of cost 1 each.  One range ``[(0, N)]`` when ``threads < 2``,
    there are fewer than two items, or the total work is under
    ``min_work``; else at most ``parts_per_thread * threads`` ranges of
    about equal cost: with costs, each cut at the item boundary whose
    cumulative cost is nearest its share (not the first past it: with few
    long items that would leave one thread most of the work); with ``N``
    items of cost 1, range ``k`` starts at ``N * k // parts``."""
    uniform = isinstance(work, (int, np.integer))
    if uniform:
        N, total = int(work), float(work)
    else:
        work = np.asarray(work, dtype=np.float64)
        N, total = len(work), float(work.sum())
    parts = max(1, int(parts_per_thread) * int(threads))
    if threads < 2 or N < 2 or total < min_work or parts < 2:
        return [(0, N)]
    if uniform:
        edges = [N * k // parts for k in range(parts + 1)]
        return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
    cum = np.concatenate([[0.0], np.cumsum(work)])
    goal = cum[-1] * np.arange(1, parts) / parts
    hi = np.clip(np.searchsorted(cum, goal), 1, N)
    cuts = np.where(goal - cum[hi - 1] < cum[hi] - goal, hi - 1, hi)
    bounds = np.unique(np.concatenate([[0], cuts, [N]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
