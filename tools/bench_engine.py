#!/usr/bin/env python3
"""Forward+backward throughput of the engine, in arc-frames per second.

Cases: (a) 64 numerator-like graphs of ~300 arcs, T=150; (b) one
denominator-sized graph (3,000 states, 50,000 arcs) shared by 32 sequences,
T=150.  ``arc-frames`` = arcs of all sequences x frames.

``--den``: the LF-MMI denominator at Kaldi's scale instead: a 4-gram phone-LM
graph (40 phones, chain topology: ~3,400 states, ~48,000 arcs, 80 pdfs)
shared by 128 sequences, T=150, leaky HMM 0.1, through the one engine
(``lattice``) and the sparse shared-graph path (``shared``, CPU only).

    python tools/bench_engine.py [--repeat 3] [--device cpu|cuda] [--den [--den-seqs 128]]
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


def den_case(rng, num_phones=40, num_utts=4000):
    """A Kaldi-sized denominator graph from a phone LM estimated on synthetic
    Markov phone sequences."""
    from chainfb.chain import DenominatorGraph, Topology, den_graph, estimate_phone_lm

    trans = rng.dirichlet(np.full(num_phones, 0.3), size=num_phones).cumsum(1)
    seqs = []
    for _ in range(num_utts):
        L = int(rng.integers(20, 80))
        s = [int(rng.integers(num_phones))]
        for u in rng.random(L - 1):
            s.append(int(min(np.searchsorted(trans[s[-1]], u), num_phones - 1)))
        seqs.append(s)
    topo = Topology.chain()
    lm = estimate_phone_lm(seqs, order=4, no_prune_order=3, num_extra_states=2000)
    return DenominatorGraph(den_graph(lm, topo), topo.num_pdfs(num_phones))


def run_den(args):
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    den = den_case(rng)
    print(f"den graph: {den} (built in {time.perf_counter() - t0:.1f} s)")
    N, T = args.den_seqs, 150
    scores = rng.normal(size=(N, T, den.num_pdfs)).astype(np.float32)
    lengths = np.full(N, T)
    lengths[N // 2:] = T - rng.integers(0, 20, N - N // 2)
    engines = ["shared", "lattice"] if args.device == "cpu" else ["lattice"]
    if args.device == "cuda":
        import torch

        scores = torch.from_numpy(scores).cuda()
    print(f"{'engine':10s} {'seqs':>5s} {'frames':>6s} {'seconds':>8s} {'M arc-frames/s':>15s}")
    for eng in engines:
        def once():
            if args.device == "cuda":
                import torch

                torch.cuda.synchronize()
            t = time.perf_counter()
            den.forward_backward(scores, lengths, 0.1, engine=eng)
            if args.device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t

        once()  # warm-up (builds the lattice / sparse matrices)
        best = min(once() for _ in range(args.repeat))
        print(f"{eng:10s} {N:5d} {T:6d} {best:8.3f} {den.num_arcs * N * T / best / 1e6:15.1f}")
    if args.device == "cpu":
        # the whole LF-MMI loss: numerators (the one engine) + denominator (shared path) + backward
        import torch

        from chainfb.chain import ChainLoss

        nums = chainfb.FstBatch([numerator_like_fst(rng, num_phones=30, num_pdfs=den.num_pdfs) for _ in range(N)])
        loss_fn = ChainLoss(den, leaky_hmm_coefficient=0.1)
        y = torch.from_numpy(scores).requires_grad_()

        def step():
            t = time.perf_counter()
            loss_fn(y, nums, lengths).backward()
            return time.perf_counter() - t

        step()
        best = min(step() for _ in range(args.repeat))
        print(f"ChainLoss forward+backward ({N} numerator graphs of ~{nums.num_arcs // N} arcs + den): {best:.3f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--den", action="store_true", help="benchmark the LF-MMI denominator (Kaldi scale)")
    ap.add_argument("--den-seqs", type=int, default=128)
    args = ap.parse_args(argv)
    if args.den:
        return run_den(args)
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
