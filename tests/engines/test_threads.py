"""The CPU engines' threads (:mod:`chainfb.engines.threads`): parts run on
torch's OpenMP team where it can be used (:mod:`chainfb.engines.openmp`),
else on chainfb's own pool, with the same results either way."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from chainfb import FstBatch, engines
from chainfb.engines import openmp
from chainfb.engines import threads as engine_threads
from chainfb.lattice import Lattice
from chainfb.testing import random_fst

from threads import in_threads

team_only = pytest.mark.skipif(openmp.team() is None, reason="torch's OpenMP runtime is not usable here")


@pytest.fixture(params=["team", "pool"])
def where(request, monkeypatch):
    """Each test once on torch's OpenMP team (where usable) and once on the pool."""
    if request.param == "team":
        if openmp.team() is None:
            pytest.skip("torch's OpenMP runtime is not usable here")
    else:
        monkeypatch.setattr(openmp, "team", lambda: None)
    return request.param


def test_the_team_is_torchs_on_linux():
    if not sys.platform.startswith("linux") or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch here does not run on OpenMP under Linux")
    paths, roots = openmp._candidates()
    assert paths and paths[0].startswith(roots), paths  # the runtime torch loaded, not another one
    assert openmp.team() is not None


def test_parallel_runs_every_part_in_order_with_the_caller(where):
    """The first three parts wait for each other, so they finish only when
    three threads run them at the same time, the calling thread among them (a
    thread takes no part while it runs one)."""
    seen = []
    meet = threading.Barrier(3, timeout=60)

    def part(p):
        seen.append(threading.get_ident())
        if p < 3:
            meet.wait()
        return p * p

    out = engine_threads.parallel(part, range(7), 3)
    assert out == [p * p for p in range(7)]
    assert threading.get_ident() in seen  # the calling thread takes parts too
    assert len(set(seen)) == 3
    assert engine_threads.parallel(lambda p: p, []) == [] and engine_threads.parallel(lambda p: -p, [4]) == [-4]


def test_a_failing_part_raises_in_the_caller(where):
    done = []
    with pytest.raises(ZeroDivisionError):
        engine_threads.parallel(lambda p: done.append(p) or 1 / p, [2, 0, 1, 3], 2)
    assert sorted(done) == [0, 1, 2, 3]  # the other thread still ran the rest
    assert engine_threads.parallel(lambda p: -p, range(5), 2) == [0, -1, -2, -3, -4]  # still usable afterwards


@team_only
def test_a_part_may_split_again_on_the_team():
    """A region inside a part runs on the part's thread (nested regions are
    one thread each), without waiting for threads that are busy."""
    out = engine_threads.parallel(lambda p: sum(engine_threads.parallel(lambda q: p * q, range(4), 2)), range(3), 2)
    assert out == [0, 6, 12]


def _batch(seed):
    rng = np.random.default_rng(seed)
    fsts = [random_fst(rng, num_states=6, num_arcs=15, num_pdfs=5, num_finals=2) for _ in range(6)]
    lat = Lattice.of(FstBatch(fsts))
    X = rng.normal(size=(20, lat.num_columns))
    lengths = rng.integers(1, 21, size=6)
    return lat, X, lengths


def test_callers_on_several_threads_get_their_own_numbers(where, monkeypatch):
    """Python threads that call the engine at once each get a region (or
    pool parts) of their own and the numbers a one-thread call gives."""
    from chainfb.engines import numba_log

    if not numba_log.available():
        pytest.skip("the compiled engine is not available")
    monkeypatch.setitem(engine_threads.MIN_PARALLEL_WORK, "numba", 0)
    batches = [_batch(seed) for seed in range(4)]
    before = engines.get_num_threads()
    engines.set_num_threads(1)
    try:
        expect = [numba_log.forward_backward(*b) for b in batches]
        engines.set_num_threads(2)

        def work(k):
            for _ in range(5):
                ll, post = numba_log.forward_backward(*batches[k])
                np.testing.assert_array_equal(ll, expect[k][0])
                np.testing.assert_array_equal(post, expect[k][1])

        assert in_threads(work, 4, switch=1e-4) == []
    finally:
        engines.set_num_threads(before)


def test_chainfb_openmp_0_keeps_the_pool():
    code = ("from chainfb.engines import openmp, threads; assert openmp.team() is None; "
            "assert threads.parallel(lambda p: p * 2, range(5), 2) == [0, 2, 4, 6, 8]")
    env = dict(os.environ, CHAINFB_OPENMP="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
