#!/usr/bin/env python3
"""Forward+backward time of ``chainfb.ctc_loss`` against torch's CPU
``torch.nn.functional.ctc_loss``, measured in one run.

T=500, N=16, C=500, S=100 (every sequence full length), float32
log-softmax outputs, reduction "mean"; one step = loss + ``backward()``,
the methods interleaved, median of ``--repeat`` steps each after a
warm-up, and the ratio of the medians to torch's.  chainfb's compiled
graph is cached per targets, so the steps after the warm-up reuse it; the
"uncached" row compiles it every step (new targets each step in
training).  chainfb runs on the engine ``auto`` picks: the compiled one
when Numba (the ``jit`` extra) is installed; the "NumPy engine" row hides
Numba for comparison.

    python tools/bench_ctc.py [--repeat 7] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import chainfb

warnings.filterwarnings("ignore")


def run(args, T=500, N=16, C=500, S=100):
    import torch.nn.functional as F

    from chainfb import ctc as ctc_module

    torch.manual_seed(args.seed)
    log_probs = torch.randn(T, N, C).log_softmax(-1)
    targets = torch.randint(1, C, (N, S))
    il, tl = torch.full((N,), T), torch.full((N,), S)

    def uncached(*a):
        ctc_module._compiled.clear()
        return chainfb.ctc_loss(*a)

    from chainfb.engines import numba_log

    def numpy_engine(*a):
        saved, numba_log.numba = numba_log.numba, None  # what `auto` picks without the jit extra
        try:
            return chainfb.ctc_loss(*a)
        finally:
            numba_log.numba = saved

    fns = {"torch.nn.functional.ctc_loss": F.ctc_loss, "chainfb.ctc_loss": chainfb.ctc_loss,
           "chainfb.ctc_loss (uncached)": uncached}
    if numba_log.available():
        fns["chainfb.ctc_loss (NumPy engine)"] = numpy_engine

    def one(fn):
        x = log_probs.clone().requires_grad_()
        t0 = time.perf_counter()
        loss = fn(x, targets, il, tl)
        loss.backward()
        return time.perf_counter() - t0, float(loss)

    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, T={T} N={N} C={C} S={S} float32, "
          f"loss + backward, median of {args.repeat}; chainfb's CPU engine: "
          f"{'compiled (Numba ' + numba_log.numba.__version__ + ')' if numba_log.available() else 'NumPy'}")
    times = {k: [] for k in fns}
    vals = {}
    for fn in fns.values():
        one(fn)  # warm-up
    for _ in range(args.repeat):
        for k, fn in fns.items():
            dt, vals[k] = one(fn)
            times[k].append(dt)
    ref = statistics.median(times["torch.nn.functional.ctc_loss"])
    print(f"{'method':30s} {'time s':>8s} {'loss':>12s}  vs torch")
    for k in fns:
        t = statistics.median(times[k])
        print(f"{k:30s} {t:8.4f} {vals[k]:12.6f}  {t / ref:6.2f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
