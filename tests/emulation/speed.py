"""Time the emulated engine kernels on long sequences: one sequence of T
frames through ``chainfb.engines.cuda.forward_backward`` (the forward and
the backward kernel) for a 2-state graph at 32 and 256 threads per block and
a 151-state numerator-like graph at 256 threads.

    PYTHONPATH=$PWD:$PWD/tests python -m emulation.speed [T] [--count]

``--count`` also counts the kernels' work (``EmulatedBackend(count=True)``).
Builds the emulation library into a temporary directory first (its time is
printed apart).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from chainfb import Fst, FstBatch, Lattice
from chainfb.engines.cuda import forward_backward
from chainfb.testing import numerator_like_fst

from .backend import EmulatedBackend, build


def cases(rng) -> list:
    """``(label, fst, threads per block)`` of the timed runs."""
    two = Fst.from_arcs([(0, 0, 0, -0.5), (0, 1, 1, -1.0), (1, 1, 1, -0.3), (1, 0, 0, -1.2)], {1: 0.0, 0: -1.0},
                        num_states=2)
    num = numerator_like_fst(rng, num_phones=75, num_pdfs=200)
    return [("2-state", two, 32), ("2-state", two, 256), (f"{num.num_states}-state", num, 256)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frames", nargs="?", type=int, default=20000)
    ap.add_argument("--count", action="store_true", help="count the kernels' work too")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        be = EmulatedBackend(build(d), **({"count": True} if a.count else {}))  # (runs on earlier versions too)
        print(f"build {time.perf_counter() - t0:.1f} s")
        rng = np.random.default_rng(0)
        for label, fst, threads in cases(rng):
            lat = Lattice.of(FstBatch([fst]))
            X = rng.normal(size=(a.frames, lat.num_columns))
            t0 = time.perf_counter()
            ll, _ = forward_backward(be, lat, X, np.array([a.frames]), block_size=threads)
            dt = time.perf_counter() - t0
            print(f"{label} graph, T={a.frames}, {threads} threads: {dt:.2f} s (loglike {ll[0]:.6f})", flush=True)


if __name__ == "__main__":
    main()
