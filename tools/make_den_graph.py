#!/usr/bin/env python3
"""Estimate a phone LM from transcripts and write the LF-MMI denominator graph.

Transcripts (Kaldi ``text``) become phone sequences through the lexicon
(first pronunciation, or sampled by probability with ``--sample-prons``;
optional silence inserted between words with probability ``--sil-prob``),
an unsmoothed pruned n-gram phone LM is estimated (Kaldi's
chain-est-phone-lm: ``--order``, ``--no-prune-order``,
``--num-extra-states``), expanded by the topology, merged, and written as
OpenFst text (label = pdf + 1).  ``--phone-seqs`` reads phone sequences
(``utt_id phone ...``) directly instead of text + lexicon (e.g. from
alignments).

    python tools/make_den_graph.py --lexicon data/lang/lexicon.txt \\
        --phones data/lang/phones.txt --text data/train/text --out exp/chain/den.fst
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _progress import progress  # noqa: E402

from chainfb.chain import (  # noqa: E402
    DenominatorGraph, Topology, den_graph, estimate_phone_lm, phone_index, read_lexicon, read_phones,
    read_text, transcript_phones,
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phones", required=True)
    ap.add_argument("--text", help="Kaldi text file (with --lexicon)")
    ap.add_argument("--lexicon")
    ap.add_argument("--phone-seqs", help="utt_id phone phone ... (instead of --text/--lexicon)")
    ap.add_argument("--topology", default="chain", help="chain, ctc, hmm3, or a .topo file")
    ap.add_argument("--optional-silence", default="SIL")
    ap.add_argument("--sil-prob", type=float, default=0.5)
    ap.add_argument("--sample-prons", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--order", type=int, default=4)
    ap.add_argument("--no-prune-order", type=int, default=3)
    ap.add_argument("--num-extra-states", type=int, default=1000)
    ap.add_argument("--out", required=True, help="den graph, OpenFst text")
    args = ap.parse_args(argv)

    phones = read_phones(args.phones)
    ids = phone_index(phones)
    topo = Topology.read(args.topology)
    rng = np.random.default_rng(args.seed)
    seqs = []
    if args.phone_seqs:
        with open(args.phone_seqs) as f:
            for ln in progress(f.readlines(), desc="phone sequences", unit="utt"):
                fields = ln.split()
                if fields:
                    seqs.append([ids[p] for p in fields[1:]])
    else:
        if not (args.text and args.lexicon):
            ap.error("give --text and --lexicon, or --phone-seqs")
        lex = read_lexicon(args.lexicon)
        sil = args.optional_silence or None
        skipped = 0
        for utt, words in progress(read_text(args.text), desc="transcripts", unit="utt"):
            try:
                seqs.append(transcript_phones(words, lex, phones, sil, args.sil_prob, rng,
                                              "sample" if args.sample_prons else "first"))
            except ValueError as e:
                skipped += 1
                print(f"skipped {utt}: {e}", file=sys.stderr)
        if skipped:
            print(f"skipped {skipped} utterances", file=sys.stderr)
    lm = estimate_phone_lm(seqs, args.order, args.no_prune_order, args.num_extra_states)
    fst = den_graph(lm, topo)
    fst.write(args.out)
    den = DenominatorGraph(fst, topo.num_pdfs(len(phones)))
    print(f"phone LM: {lm.num_states} states, {lm.num_arcs} arcs; den graph: {den}; "
          f"num_pdfs = {den.num_pdfs}; written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
