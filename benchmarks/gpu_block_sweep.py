"""The engine kernels' time on the GPU benchmark's graphs for each block size and shared-memory mode: which
launch the defaults should pick.

For each case and each (threads per block, mode, arc table) the recursion and posterior kernels' device time (CuPy
events around ``chainfb.engines.cuda.forward_backward`` on the compact scores, median of ``--repeat``); modes as in
``chainfb/cuda/forward_backward.cuh`` (2: rows' ring and staged scores in shared memory, 1: the ring, 0: neither),
each with and without the sequence's arcs copied to shared memory before the frame loop (``--tables 1,0``; a
launch whose table does not fit records the error), and each direction of a sequence over a thread block cluster
of 2, 4 or 8 blocks (``--clusters``, ``chainfb/cuda/cluster.cu``: mode 0 only, the per-sequence engine without the
leaky HMM; a device before compute capability 9.0 records the error), and the posterior kernel with several frames
a block (``--posterior-frames``, ``chainfb.engines.cuda.POSTERIOR_FRAMES``: its arcs read from L2 once for
several frames) at the first mode, table and block.
Prints a table and writes ``--json FILE``.  Cases (``--cases``): ``ctc``, the CTC graphs of
``benchmarks/gpu_bench.py``'s shapes; ``rnnt``, ``multiblank``, ``tdt``, the step graphs of its RNN-T batch (B = 8,
LibriSpeech-like lengths; big blanks [2, 4]; durations 0..4); ``den``, its LF-MMI denominator (128 sequences x 150
frames, leaky HMM 0.1), on both engines.  The scores are random: the kernels' time does not depend on them.

    python -m benchmarks.gpu_block_sweep [--json FILE] [--repeat 5] [--blocks default,128,256,512,1024]
                                         [--modes 2,1,0] [--tables 1,0] [--clusters 1,2,4,8]
                                         [--posterior-frames 1,4,16]
                                         [--cases ctc,rnnt,multiblank,tdt,den]
                                         [--deadline UNIX_TIME] [--emulate]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys

import numpy as np

from .gpu_bench import CTC_SHAPES


def ctc_case(xp, T, N, C, S, seed):
    """The CTC lattice of N random label sequences of length S and its compact float32 scores ``[T, cols]``."""
    from chainfb.ctc import _compile

    rng = np.random.default_rng(seed)
    lattice, score_map = _compile(np.full(N, S), rng.integers(1, C, N * S), 0)
    lp = rng.standard_normal((N, T, C)).astype(np.float32)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    X = xp.asarray(score_map.gather(np, lp, dtype=np.float32))
    return lattice, X, xp.full(N, T, dtype=np.int64), None


def transducer_case(xp, kind, seed):
    """The engine's lattice of the RNN-T benchmark batch for ``kind`` (rnnt, multiblank, tdt), random compact
    scores ``[steps, cols]`` and the steps per sequence."""
    from .bench_transducer import draw_shapes
    from .count_map_work import CASES, criterion_layout

    rng = np.random.default_rng(seed)
    T, U = draw_shapes(np.random.default_rng(0), 8)
    name = next(n for n in CASES if n.startswith(kind))
    layout = criterion_layout(name, int(U.max()) + 1, T, U, CASES[name])
    X = -np.abs(rng.standard_normal((layout.num_steps, layout.lat.num_columns))).astype(np.float32)
    return layout.lat, xp.asarray(X), xp.asarray(layout.steps), None


def den_case_arrays(xp, seed, N=128, T=150):
    """The denominator's lattice of N sequences, random compact scores ``[T, N x pdfs]``, the lengths and the leak."""
    from .bench_engine import den_case

    den = den_case(np.random.default_rng(0))
    lat = den._lattice(N)
    X = np.random.default_rng(seed).standard_normal((T, lat.num_columns)).astype(np.float32)
    return lat, xp.asarray(X), xp.full(N, T, dtype=np.int64), (0.1, den.log_init)


def cases(xp, which, emulate=False):
    """``(name, lattice, X, lengths, leaky)`` of the cases named in ``which`` (arrays of ``xp``; ``emulate``: the
    tiny CTC shapes of the emulated benchmark)."""
    if "ctc" in which:
        for T, N, C, S in CTC_SHAPES["emulated" if emulate else "cuda"]:
            yield (f"ctc T={T} N={N} C={C} S={S}", *ctc_case(xp, T, N, C, S, T + S))
    for kind in ("rnnt", "multiblank", "tdt"):
        if kind in which:
            yield (f"{kind} B=8 (the RNN-T benchmark's batch)", *transducer_case(xp, kind, 0))
    if "den" in which:
        yield ("den 128 x 150", *den_case_arrays(xp, 0))


def launches(xp, which, emulate, modes, tables, blocks, clusters=(1,), frames=(1,)):
    """``(name, (case, lattice, X, lengths, leaky, engine name, engine, mode, table, block, cluster, frames))`` of
    every launch to time: each case of ``which`` (built as it is reached) on each engine that reads it, in each
    mode, with and without the arc table, at each block, one block a direction or a cluster of ``cluster`` (mode 0
    of the per-sequence engine without a leak only), the posterior kernel's frames a block 1; then each of
    ``frames`` above 1 at the first mode, table and block, one block a direction."""
    from chainfb.engines import cuda, cuda_shared

    for case, lattice, X, lengths, leaky in cases(xp, which, emulate):
        engines = [("cuda", cuda)] + ([("cuda_shared", cuda_shared)] if lattice.shared_fst is not None else [])
        for ename, engine in engines:
            runs = [(k, m, 1) for k in clusters for m in (modes if k == 1 else (0,))
                    if k == 1 or (ename == "cuda" and leaky is None)]  # (blocks a direction, mode, frames)
            items = list(itertools.product(runs, tables, blocks))
            items += [((1, modes[0], f), tables[0], blocks[0]) for f in frames if f > 1]
            for (cluster, mode, f), table, block in items:
                name = (f"{case} / {ename} / mode {mode} / table {int(table)} / block {block or 'default'} / "
                        f"K {cluster} / F {f}")
                yield name, (case, lattice, X, lengths, leaky, ename, engine, mode, table, block, cluster, f)


def _launch(engine, backend, lattice, X, lengths, leaky, block, cluster):
    """One forward-backward of ``engine`` (on a copy of ``X``: the engine masks frames past the lengths in place)."""
    engine.forward_backward(backend, lattice, X.copy(), lengths, leaky, block_size=block, cluster=cluster)


def sweep(place, which, modes, tables, blocks, repeat, deadline=float("inf"), json_path=None,
          clusters=(1,), frames=(1,)) -> dict:
    """Time every launch of :func:`launches` at ``place`` (``benchmarks._gpu_place``); returns ``{"rows": [...],
    "skipped": [...]}`` (rows: case, engine, mode, table, block -- None for the default --, cluster, the posterior
    kernel's frames a block, ms or the error, and ``fits``: False where the launch asked for does not fit the
    device's shared memory, its error then no failure),
    written to ``json_path`` as it goes; launches not started by ``deadline`` (Unix time) are listed as
    skipped."""
    from chainfb.engines import cuda

    from ._gpu_place import until, write_json

    result = dict(rows=[], skipped=[], current=None)
    defaults = cuda.MODES, cuda.ARC_TABLES, cuda.POSTERIOR_FRAMES
    items = launches(place.backend.xp, which, place.emulated, modes, tables, blocks, clusters, frames)
    try:
        for _, (case, lattice, X, lengths, leaky, ename, engine, mode, table, block, cluster, f) in until(
                deadline, items, result, json_path):
            cuda.MODES = (mode, 0)  # the first that fits: this mode, else none
            cuda.ARC_TABLES = (table,)
            cuda.POSTERIOR_FRAMES = f
            launch = functools.partial(_launch, engine, place.backend, lattice, X, lengths, leaky, block, cluster)
            fits = True
            try:
                ms = statistics.median([place.timed_ms(launch)[1] for _ in range(repeat + 1)][1:])
            except ValueError as e:  # the launch asked for does not fit the device's shared memory: not a failure
                fits, ms = "fits" not in str(e), f"{type(e).__name__}: {e}"[:300]
            except Exception as e:  # noqa: BLE001 -- recorded; the other launches still run
                ms = f"{type(e).__name__}: {e}"[:300]
            row = dict(case=case, engine=ename, mode=mode, table=table, block=block, cluster=cluster, frames=f,
                       ms=ms, fits=fits)
            result["rows"].append(row)
            print(row, flush=True)
    finally:
        cuda.MODES, cuda.ARC_TABLES, cuda.POSTERIOR_FRAMES = defaults
    if json_path:
        write_json(json_path, result)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--blocks", default="default,128,256,512,1024",
                    help="threads per block; 'default': the engine's own choice")
    ap.add_argument("--modes", default="2,1,0")
    ap.add_argument("--tables", default="1,0")
    ap.add_argument("--clusters", default="1", help="blocks a direction of a sequence (1, 2, 4, 8)")
    ap.add_argument("--posterior-frames", default="1", help="the posterior kernel's frames a block (at the first "
                    "mode, table and block)")
    ap.add_argument("--cases", default="ctc,rnnt,multiblank,tdt,den")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="Unix time after which no launch starts")
    ap.add_argument("--emulate", action="store_true", help="the kernels' CPU emulation (PYTHONPATH=tests): checks "
                    "the script; its times are not GPU times")
    args = ap.parse_args(argv)
    from ._gpu_place import make_place

    place = make_place(args.emulate)
    blocks = [None if b == "default" else int(b) for b in args.blocks.split(",")]
    sweep(place, set(args.cases.split(",")), [int(m) for m in args.modes.split(",")],
          [bool(int(t)) for t in args.tables.split(",")], blocks, args.repeat, args.deadline, args.json,
          [int(k) for k in args.clusters.split(",")], [int(f) for f in args.posterior_frames.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
