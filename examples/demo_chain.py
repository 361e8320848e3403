"""End-to-end LF-MMI on synthetic data: transcripts -> numerator graphs,
phone LM -> denominator graph, a small network trained with ChainLoss.

Synthetic corpus: words over a few phones, utterances of random words,
frames = noisy phone embeddings with random durations.  Every 10 steps it
prints the LF-MMI objective per frame (numerator minus denominator
log-likelihood) and the fraction of frames where the best-scoring phone
(max over its two chain pdfs) is the true phone.

The objective rises during training.  By default the numerator graphs carry
only the lexicon, silence and topology weights, not the phone LM's, so the
numerator is not a part of the denominator and the objective is not bounded
by 0: with the defaults it goes from about -0.20 to above +0.2 per frame,
crossing 0 within the first 20 steps.  With ``--normalize`` the numerator
graphs are composed with Kaldi's normalization FST (the denominator's
weights), the objective stays below 0 and rises towards it (about -0.68 to
-0.32 per frame with the defaults).

    python -m examples.demo_chain [--steps 60] [--utts 64]
"""

import argparse
import time

from ._cli import Parser


def corpus(rng, num_utts, dim=16):
    """The synthetic corpus: ``(phones, lexicon, [(words, phone ids, frame phone ids [T], feats [T, dim])])``."""
    import numpy as np

    from chainfb.chain import read_lexicon, transcript_phones

    phones = ["SIL", "A", "B", "C", "D", "E"]
    lex = read_lexicon(["ab A B", "ba B A", "cde C D E", "ed E D", "ace A C E", "SIL SIL"])
    vocab = ["ab", "ba", "cde", "ed", "ace"]
    emb = rng.normal(size=(len(phones), dim))
    utts = []
    for _ in range(num_utts):
        words = list(rng.choice(vocab, size=int(rng.integers(1, 4))))
        seq = transcript_phones(words, lex, phones, "SIL", 0.3, rng)
        seq = [0] + seq + [0]
        frames = np.concatenate([np.repeat(p, rng.integers(1, 4)) for p in seq])
        feats = emb[frames] + 0.8 * rng.normal(size=(len(frames), dim))
        utts.append((words, seq, frames, feats))
    return phones, lex, utts


def main(argv=None):
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="training steps (default: %(default)s)")
    ap.add_argument("--utts", type=int, default=64, help="utterances in the synthetic corpus (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the corpus and the model (default: %(default)s)")
    ap.add_argument("--normalize", action="store_true",
                    help="compose Kaldi's normalization FST into the numerator graphs (objective <= 0)")
    args = ap.parse_args(argv)
    if args.steps < 0:
        ap.error(f"argument --steps: expected at least 0, got {args.steps}")
    if args.utts < 1:
        ap.error(f"argument --utts: expected at least 1, got {args.utts}")

    import numpy as np
    import torch

    from chainfb.chain import (
        ChainLoss, DenominatorGraph, Topology, add_normalization, den_graph, estimate_phone_lm, fits,
        normalization_fst, numerator_graph,
    )

    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    phones, lex, utts = corpus(rng, args.utts)
    topo = Topology.chain()
    P = topo.num_pdfs(len(phones))
    lm = estimate_phone_lm([u[1] for u in utts], order=3, no_prune_order=2, num_extra_states=50)
    den = DenominatorGraph(den_graph(lm, topo), P)
    nums = [numerator_graph(u[0], lex, topo, phones, "SIL", 0.3) for u in utts]
    if args.normalize:
        norm = normalization_fst(den)
        nums = [add_normalization(g, norm) for g in nums]
    lengths = np.array([len(u[2]) for u in utts])
    assert all(fits(g, L)[0] for g, L in zip(nums, lengths))
    T = lengths.max()
    x = np.zeros((len(utts), T, utts[0][3].shape[1]), np.float32)
    truth = np.full((len(utts), T), -1)
    for n, u in enumerate(utts):
        x[n, :lengths[n]] = u[3]
        truth[n, :lengths[n]] = u[2]
    x = torch.from_numpy(x)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[2], 64), torch.nn.ReLU(), torch.nn.Linear(64, P))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = ChainLoss(den, leaky_hmm_coefficient=0.1, l2_regularize=1e-4, reduction="frame")
    print(f"{len(utts)} utterances, {lengths.sum()} frames; den graph {den}")
    t0 = time.perf_counter()
    for step in range(args.steps + 1):
        y = model(x)
        loss = loss_fn(y, nums, lengths)
        if step % 10 == 0:
            with torch.no_grad():
                best = y.view(*y.shape[:2], -1, 2).max(-1).values.argmax(-1).numpy()
                mask = truth >= 0
                acc = (best[mask] == truth[mask]).mean()
            info = loss_fn.info
            print(f"step {step:4d}  objf/frame {info['objf_per_frame']:8.4f}  "
                  f"(num {info['num'] / info['frames']:8.4f}, den {info['den'] / info['frames']:8.4f})  "
                  f"frame phone acc {acc:.3f}")
        if step == args.steps:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"{args.steps} steps in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
