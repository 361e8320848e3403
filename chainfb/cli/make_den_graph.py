"""Estimate a phone LM from transcripts and write the LF-MMI denominator graph.

Transcripts (Kaldi ``text``) become phone sequences through the lexicon
(first pronunciation, or sampled by probability with ``--sample-prons``;
optional silence inserted between words with probability ``--sil-prob``),
an unsmoothed pruned n-gram phone LM is estimated (Kaldi's
chain-est-phone-lm: ``--order``, ``--no-prune-order``,
``--num-extra-states``), expanded by the topology, merged, and written as
OpenFst text (label = pdf + 1).  ``--phone-seqs`` reads phone sequences
(``utt_id phone ...``) directly instead of text + lexicon (e.g. from
alignments).  ``--context biphone`` gives the graph left-biphone pdfs
(each arc reading phone p from an LM state whose last phone is q takes the
pdfs of the biphone (q, p), tied to p's monophone when (q, p) occurs fewer
than ``--min-biphone-count`` times in the transcripts, counted without
silence as Kaldi counts them; with ``--phone-seqs``, in the sequences as
given); ``chainfb-make-numerator-graphs`` with the same text and options
builds the same units.

    chainfb-make-den-graph --lexicon data/lang/lexicon.txt \\
        --phones data/lang/phones.txt --text data/train/text --out exp/chain/den.fst
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._args import (Parser, add_context_options, add_word_positions_option, check_context_options,
                  check_input_files, check_symbol, check_topology, positioned)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``argv``, default ``sys.argv[1:]``); see the module's docstring."""
    ap = Parser(prog="chainfb-make-den-graph", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phones", required=True, help="phones.txt or one phone per line (pdf numbering order)")
    ap.add_argument("--text", help="Kaldi text file (with --lexicon)")
    ap.add_argument("--lexicon", help="lexicon.txt or lexiconp.txt (with --text)")
    ap.add_argument("--phone-seqs", help="utt_id phone phone ... (instead of --text/--lexicon)")
    ap.add_argument("--topology", default="chain", help="chain, ctc, hmm3, or a .topo file (default: %(default)s)")
    ap.add_argument("--optional-silence", default="SIL",
                    help="optional silence phone between words ('' to disable) (default: %(default)s)")
    ap.add_argument("--sil-prob", type=float, default=0.5,
                    help="probability of the optional silence (default: %(default)s)")
    ap.add_argument("--sample-prons", action="store_true", help="sample pronunciations by their probabilities")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: %(default)s)")
    ap.add_argument("--order", type=int, default=4, help="n-gram order of the phone LM (default: %(default)s)")
    ap.add_argument("--no-prune-order", type=int, default=3,
                    help="orders up to this one are never pruned (default: %(default)s)")
    ap.add_argument("--num-extra-states", type=int, default=1000,
                    help="LM states kept beyond the unpruned orders (default: %(default)s)")
    ap.add_argument("--out", required=True, help="den graph, OpenFst text")
    add_context_options(ap)
    add_word_positions_option(ap)
    args = ap.parse_args(argv)
    check_context_options(ap, args)
    if not args.phone_seqs and not (args.text and args.lexicon):
        ap.error("give --text and --lexicon, or --phone-seqs")
    if not 0.0 <= args.sil_prob < 1.0:
        ap.error(f"argument --sil-prob: expected a probability in [0, 1), got {args.sil_prob}")
    if args.order < 1 or args.no_prune_order < 1 or args.num_extra_states < 0:
        ap.error("arguments --order, --no-prune-order: expected >= 1; --num-extra-states: expected >= 0")
    check_input_files(ap, args, "--phones", "--text", "--lexicon", "--phone-seqs")
    check_topology(ap, args.topology)

    import numpy as np

    from ._progress import progress
    from chainfb.chain import (
        BiphoneSet, DenominatorGraph, Topology, den_graph, estimate_phone_lm, phone_index, read_lexicon, read_phones,
        read_text, transcript_phones,
    )

    try:
        phones = read_phones(args.phones, word_positions=args.word_positions)
        ids = phone_index(phones)
        topo = Topology.read(args.topology)
        sil = args.optional_silence or None
        if sil is not None and not args.phone_seqs:
            check_symbol(ap, "--optional-silence", sil, phones, "phones of --phones")
        rng = np.random.default_rng(args.seed)
        seqs = []
        texts = []
        if args.phone_seqs:
            with open(args.phone_seqs) as f:
                for n, ln in enumerate(progress(f.readlines(), desc="phone sequences", unit="utt"), 1):
                    fields = ln.split()
                    unknown = [p for p in fields[1:] if p not in ids]
                    if unknown:
                        ap.fail(f"{args.phone_seqs}: line {n}: phone {unknown[0]!r} is not in --phones")
                    if fields:
                        seqs.append([ids[p] for p in fields[1:]])
        else:
            lex = positioned(read_lexicon(args.lexicon), args)
            skipped = 0
            for utt, words in progress(read_text(args.text), desc="transcripts", unit="utt"):
                try:
                    seqs.append(transcript_phones(words, lex, phones, sil, args.sil_prob, rng,
                                                  "sample" if args.sample_prons else "first"))
                    texts.append(words)
                except ValueError as e:
                    skipped += 1
                    print(f"skipped {utt}: {e}", file=sys.stderr)
            if skipped:
                print(f"skipped {skipped} utterances", file=sys.stderr)
        if not seqs:
            ap.fail("no phone sequence to estimate the phone LM from")
        lm = estimate_phone_lm(seqs, args.order, args.no_prune_order, args.num_extra_states)
        context = None
        if args.context == "biphone":
            if args.phone_seqs:
                context = BiphoneSet.from_phone_sequences(seqs, phones, args.min_biphone_count,
                                                          args.min_monophone_count)
            else:
                context = BiphoneSet.from_transcripts(texts, lex, phones, args.min_biphone_count,
                                                      args.min_monophone_count, args.biphone_prons)
        fst = den_graph(lm, topo, context=context)
        fst.write(args.out)
    except OSError as e:
        ap.fail(f"{e.filename or ''}: {e.strerror or e}" if e.filename else str(e))
    except ValueError as e:
        ap.fail(str(e))
    den = DenominatorGraph(fst, topo.num_pdfs(len(phones)) if context is None else context.num_pdfs(topo))
    print(f"phone LM: {lm.num_states} states, {lm.num_arcs} arcs; {context or 'monophone'}; den graph: {den}; "
          f"num_pdfs = {den.num_pdfs}; written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
