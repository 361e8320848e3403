#!/usr/bin/env python3
"""Forward+backward throughput of the engine, in arc-frames per second.

Cases: (a) 64 numerator-like graphs of ~300 arcs, T=150; (b) one
denominator-sized graph (3,000 states, 50,000 arcs) shared by 32 sequences,
T=150.  ``arc-frames`` = arcs of all sequences x frames.

    python tools/bench_engine.py [--repeat 3] [--device cpu|cuda]
"""

import argparse
import time

import numpy as np

import chainfb
from chainfb.testing import denominator_like_fst, numerator_like_fst


def cases(rng, P=2000, T=150):
    graphs = [numerator_like_fst(rng, num_phones=50, num_pdfs=P) for _ in range(64)]
    yield "(a) 64 numerator graphs", chainfb.FstBatch(graphs), T, P
    den = denominator_like_fst(rng, num_pdfs=P)
    yield "(b) 1 den graph x 32 seqs", chainfb.FstBatch([den], np.zeros(32, dtype=np.int64)), T, P


def run(batch, scores, lengths, device):
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        chainfb.forward_backward(batch, scores, lengths)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    chainfb.forward_backward(batch, scores, lengths)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'case':28s} {'arcs':>9s} {'frames':>6s} {'seconds':>8s} {'M arc-frames/s':>15s}")
    for name, batch, T, P in cases(rng):
        N = batch.num_sequences
        scores = rng.normal(size=(N, T, P)).astype(np.float32)
        lengths = np.full(N, T)
        if args.device == "cuda":
            import torch

            scores = torch.from_numpy(scores).cuda()
        run(batch, scores, lengths, args.device)  # warm-up (builds the lattice)
        best = min(run(batch, scores, lengths, args.device) for _ in range(args.repeat))
        arcs = sum(batch.fsts[g].num_arcs for g in batch.seq_to_graph)
        print(f"{name:28s} {arcs:9d} {T:6d} {best:8.3f} {arcs * T / best / 1e6:15.1f}")


if __name__ == "__main__":
    main()
