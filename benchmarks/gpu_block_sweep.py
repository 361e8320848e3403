"""The engine kernels' time on the GPU's CTC graphs (the shapes of ``benchmarks/gpu_bench.py``) for each block size and
shared-memory mode: which launch the defaults should pick.

For each case and each (threads per block, mode) the recursion and posterior kernels' device time (CuPy events
around ``chainfb.engines.cuda.forward_backward`` on the compact scores, median of ``--repeat``); modes as in
``chainfb/cuda/forward_backward.cuh`` (2: rows' ring and staged scores in shared memory, 1: the ring, 0: neither).
Prints a table and writes ``--json FILE``.

    python -m benchmarks.gpu_block_sweep [--json FILE] [--repeat 5] [--blocks 128,256,512,1024] [--modes 2,1,0]
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
    rows = [rng.integers(1, C, S) for _ in range(N)]
    lattice, score_map = _compile(rows, 0)
    lp = rng.standard_normal((N, T, C)).astype(np.float32)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    X = cupy.asarray(score_map.gather(np, lp, dtype=np.float32))
    return lattice, X, cupy.full(N, T, dtype=np.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--blocks", default="128,256,512,1024")
    ap.add_argument("--modes", default="2,1,0")
    args = ap.parse_args(argv)
    import cupy

    from chainfb.cuda.kernels import cupy_backend
    from chainfb.engines import cuda, cuda_shared

    backend = cupy_backend()
    blocks = [int(b) for b in args.blocks.split(",")]
    modes = [int(m) for m in args.modes.split(",")]
    out = []
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for T, N, C, S in CTC_SHAPES["cuda"]:
        lattice, X, lengths = ctc_case(cupy, T, N, C, S, T + S)
        engines = [("cuda", cuda)] + ([("cuda_shared", cuda_shared)] if lattice.shared_fst is not None else [])
        for ename, engine in engines:
            for mode in modes:
                cuda.MODES = (mode, 0)  # the first that fits: this mode, else none
                for block in blocks:
                    runs = []
                    try:
                        for _ in range(args.repeat + 1):
                            start.record()
                            engine.forward_backward(backend, lattice, X.copy(), lengths, block_size=block)
                            end.record()
                            end.synchronize()
                            runs.append(cupy.cuda.get_elapsed_time(start, end))
                        ms = statistics.median(runs[1:])
                    except Exception as e:  # noqa: BLE001 -- recorded; the other launches still run
                        ms = f"{type(e).__name__}: {e}"
                    row = dict(case=f"T={T} N={N} C={C} S={S}", engine=ename, mode=mode, block=block, ms=ms)
                    out.append(row)
                    print(row, flush=True)
    cuda.MODES = (2, 1, 0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
