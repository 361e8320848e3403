#!/usr/bin/env python3
"""Forward-backward of an example numerator graph on random scores.

Loads an OpenFst text graph (default: graphs/examples/numerator_4phones.fst),
draws random pdf log-likelihoods for a few sequences of different lengths,
and prints each sequence's log-likelihood and the per-frame posterior sums
(1 for every frame inside a sequence, 0 past its end).

    python tools/demo_numerator.py [--graph PATH] [--frames 20] [--seed 0] [--dot out.dot]
"""

import argparse
import pathlib

import numpy as np

import chainfb

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default=str(ROOT / "graphs" / "examples" / "numerator_4phones.fst"))
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dot", help="also write the graph as Graphviz source to this file")
    args = ap.parse_args(argv)

    fst = chainfb.Fst.read(args.graph)
    print(f"graph {args.graph}: {fst}")
    if args.dot:
        pathlib.Path(args.dot).write_text(fst.to_dot(title=pathlib.Path(args.graph).name))
        print(f"wrote {args.dot}")
    rng = np.random.default_rng(args.seed)
    T = args.frames
    lengths = np.array([T, (3 * T) // 4, T // 2])
    scores = rng.normal(size=(len(lengths), T, fst.num_pdfs))
    loglike, post = chainfb.forward_backward(fst, scores, lengths)
    for n, L in enumerate(lengths):
        sums = post[n].sum(-1)
        print(f"sequence {n}: {L:3d} frames  loglike {loglike[n]:10.4f}  "
              f"posterior sums in [{sums[:L].min():.6f}, {sums[:L].max():.6f}], past end {sums[L:].sum():.1f}")


if __name__ == "__main__":
    main()
