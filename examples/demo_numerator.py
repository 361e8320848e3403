"""Forward-backward of an example numerator graph on random scores.

Loads an OpenFst text graph (default: graphs/examples/numerator_4phones.fst),
draws random pdf log-likelihoods for a few sequences of different lengths,
and prints each sequence's log-likelihood and the per-frame posterior sums
(1 for every frame inside a sequence, 0 past its end).  The sequences are
--frames, 3/4 and 1/2 of it long, so --frames must give the shortest one at
least the graph's fewest frames.

    python -m examples.demo_numerator [--graph PATH] [--frames 20] [--seed 0] [--dot out.dot]
"""

import argparse
import os
import pathlib

from ._cli import Parser

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(argv=None):
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default=str(ROOT / "graphs" / "examples" / "numerator_4phones.fst"),
                    help="numerator graph, OpenFst text (default: the example numerator_4phones.fst)")
    ap.add_argument("--frames", type=int, default=20, help="frames of the longest sequence (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random scores (default: %(default)s)")
    ap.add_argument("--dot", help="also write the graph as Graphviz source to this file")
    args = ap.parse_args(argv)
    if args.frames < 1:
        ap.error(f"argument --frames: expected at least 1, got {args.frames}")
    if not os.path.isfile(args.graph):
        ap.error(f"argument --graph: no such file: {args.graph!r}")

    import numpy as np

    import chainfb
    from chainfb.chain import min_frames

    try:
        fst = chainfb.Fst.read(args.graph)
    except (OSError, ValueError) as e:
        ap.fail(f"argument --graph: cannot read {args.graph!r}: {e}")
    print(f"graph {args.graph}: {fst}")
    need = min_frames(fst)
    if need == float("inf"):
        ap.fail(f"argument --graph: {args.graph!r} has no path from the start to a final state")
    T = args.frames
    if T // 2 < need:
        ap.error(f"argument --frames: the graph's shortest path has {int(need)} frames and the shortest sequence "
                 f"is --frames // 2 long, so give --frames {2 * int(need)} or more (got {T})")
    if args.dot:
        try:
            pathlib.Path(args.dot).write_text(fst.to_dot(title=pathlib.Path(args.graph).name))
        except OSError as e:
            ap.fail(f"argument --dot: cannot write {args.dot!r}: {e.strerror or e}")
        print(f"wrote {args.dot}")
    rng = np.random.default_rng(args.seed)
    lengths = np.array([T, (3 * T) // 4, T // 2])
    scores = rng.normal(size=(len(lengths), T, fst.num_pdfs))
    loglike, post = chainfb.forward_backward(fst, scores, lengths)
    for n, L in enumerate(lengths):
        sums = post[n].sum(-1)
        print(f"sequence {n}: {L:3d} frames  loglike {loglike[n]:10.4f}  "
              f"posterior sums in [{sums[:L].min():.6f}, {sums[:L].max():.6f}], past end {sums[L:].sum():.1f}")


if __name__ == "__main__":
    main()
