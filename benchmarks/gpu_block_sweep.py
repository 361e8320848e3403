"""The engine kernels' time on the GPU benchmark's graphs for each block size and shared-memory mode: which
launch the defaults should pick.

For each case and each (threads per block, mode) the recursion and posterior kernels' device time (CuPy events
around ``chainfb.engines.cuda.forward_backward`` on the compact scores, median of ``--repeat``); modes as in
``chainfb/cuda/forward_backward.cuh`` (2: rows' ring and staged scores in shared memory, 1: the ring, 0: neither).
Prints a table and writes ``--json FILE``.  Cases (``--cases``): ``ctc``, the CTC graphs of
``benchmarks/gpu_bench.py``'s shapes; ``rnnt``, ``multiblank``, ``tdt``, the step graphs of its RNN-T batch (B = 8,
LibriSpeech-like lengths; big blanks [2, 4]; durations 0..4); ``den``, its LF-MMI denominator (128 sequences x 150
frames, leaky HMM 0.1), on both engines.  The scores are random: the kernels' time does not depend on them.

    python -m benchmarks.gpu_block_sweep [--json FILE] [--repeat 5] [--blocks 128,256,512,1024] [--modes 2,1,0]
                                         [--cases ctc,rnnt,multiblank,tdt,den]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from .gpu_bench import CTC_SHAPES


def ctc_case(cupy, T, N, C, S, seed):
    """The CTC lattice of N random label sequences of length S and its compact float32 scores ``[T, cols]``."""
    from chainfb.ctc import _compile

    rng = np.random.default_rng(seed)
    lattice, score_map = _compile(np.full(N, S), rng.integers(1, C, N * S), 0)
    lp = rng.standard_normal((N, T, C)).astype(np.float32)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    X = cupy.asarray(score_map.gather(np, lp, dtype=np.float32))
    return lattice, X, cupy.full(N, T, dtype=np.int64), None


def transducer_case(cupy, kind, seed):
    """The engine's lattice of the RNN-T benchmark batch for ``kind`` (rnnt, multiblank, tdt), random compact
    scores ``[steps, cols]`` and the steps per sequence."""
    from .bench_transducer import draw_shapes
    from .count_map_work import CASES, criterion_layout

    rng = np.random.default_rng(seed)
    T, U = draw_shapes(np.random.default_rng(0), 8)
    name = next(n for n in CASES if n.startswith(kind))
    layout = criterion_layout(name, int(U.max()) + 1, T, U, CASES[name])
    X = -np.abs(rng.standard_normal((layout.num_steps, layout.lat.num_columns))).astype(np.float32)
    return layout.lat, cupy.asarray(X), cupy.asarray(layout.steps), None


def den_case_arrays(cupy, seed, N=128, T=150):
    """The denominator's lattice of N sequences, random compact scores ``[T, N x pdfs]``, the lengths and the leak."""
    from .bench_engine import den_case

    den = den_case(np.random.default_rng(0))
    lat = den._lattice(N)
    X = np.random.default_rng(seed).standard_normal((T, lat.num_columns)).astype(np.float32)
    return lat, cupy.asarray(X), cupy.full(N, T, dtype=np.int64), (0.1, den.log_init)


def cases(cupy, which):
    """``(name, lattice, X, lengths, leaky)`` of the cases named in ``which``."""
    if "ctc" in which:
        for T, N, C, S in CTC_SHAPES["cuda"]:
            yield (f"ctc T={T} N={N} C={C} S={S}", *ctc_case(cupy, T, N, C, S, T + S))
    for kind in ("rnnt", "multiblank", "tdt"):
        if kind in which:
            yield (f"{kind} B=8 (the RNN-T benchmark's batch)", *transducer_case(cupy, kind, 0))
    if "den" in which:
        yield ("den 128 x 150", *den_case_arrays(cupy, 0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--blocks", default="128,256,512,1024")
    ap.add_argument("--modes", default="2,1,0")
    ap.add_argument("--cases", default="ctc,rnnt,multiblank,tdt,den")
    args = ap.parse_args(argv)
    import cupy

    from chainfb.cuda.kernels import cupy_backend
    from chainfb.engines import cuda, cuda_shared

    backend = cupy_backend()
    blocks = [int(b) for b in args.blocks.split(",")]
    modes = [int(m) for m in args.modes.split(",")]
    out = []
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for case, lattice, X, lengths, leaky in cases(cupy, set(args.cases.split(","))):
        engines = [("cuda", cuda)] + ([("cuda_shared", cuda_shared)] if lattice.shared_fst is not None else [])
        for ename, engine in engines:
            for mode in modes:
                cuda.MODES = (mode, 0)  # the first that fits: this mode, else none
                for block in blocks:
                    runs = []
                    try:
                        for _ in range(args.repeat + 1):
                            start.record()
                            engine.forward_backward(backend, lattice, X.copy(), lengths, leaky, block_size=block)
                            end.record()
                            end.synchronize()
                            runs.append(cupy.cuda.get_elapsed_time(start, end))
                        ms = statistics.median(runs[1:])
                    except Exception as e:  # noqa: BLE001 -- recorded; the other launches still run
                        ms = f"{type(e).__name__}: {e}"
                    row = dict(case=case, engine=ename, mode=mode, block=block, ms=ms)
                    out.append(row)
                    print(row, flush=True)
    cuda.MODES = (2, 1, 0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
