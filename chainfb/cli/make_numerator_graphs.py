"""Compile numerator (supervision) graphs for every utterance of a Kaldi
``text`` file.

Each transcript becomes an epsilon-free pdf acceptor (alternative
pronunciations, optional silence between words, topology expansion, exact
state merging).  Utterances whose graph cannot fit their frame count
(``--utt2num-frames``, divided by ``--frame-subsampling-factor``, rounded
up) or that contain OOV words are reported on stderr (and in
``--rejected``) and left out.  Output: a text archive of OpenFst graphs
(``key`` line, graph, empty line); ``--kaldi-ark`` also writes a Kaldi
binary archive (OpenFst vector FSTs).  ``--context
biphone`` gives the graphs left-biphone pdfs, the units counted over the
transcripts of ``--text`` (use the training text, and the options of
``chainfb-make-den-graph``, so that both agree).

    chainfb-make-numerator-graphs --lexicon data/lang/lexicon.txt \\
        --phones data/lang/phones.txt --text data/train/text --topology chain \\
        --utt2num-frames data/train/utt2num_frames --frame-subsampling-factor 3 \\
        --out exp/chain/num_graphs.txt
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from ._args import (Parser, add_context_options, add_word_positions_option, check_context_options,
                  check_input_files, check_symbol, check_topology, positioned)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``argv``, default ``sys.argv[1:]``); see the module's docstring."""
    ap = Parser(prog="chainfb-make-numerator-graphs", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lexicon", required=True, help="lexicon.txt or lexiconp.txt")
    ap.add_argument("--phones", required=True, help="phones.txt or one phone per line (pdf numbering order)")
    ap.add_argument("--text", required=True, help="Kaldi text file: utt_id word ...")
    ap.add_argument("--topology", default="chain", help="chain, ctc, hmm3, or a .topo file (default: %(default)s)")
    ap.add_argument("--optional-silence", default="SIL",
                    help="optional silence phone between words ('' to disable) (default: %(default)s)")
    ap.add_argument("--sil-prob", type=float, default=0.5,
                    help="probability of the optional silence (default: %(default)s)")
    ap.add_argument("--utt2num-frames", help="utt_id num_frames (input frames) for the fit check")
    ap.add_argument("--frame-subsampling-factor", type=int, default=1,
                    help="input frames per output frame, for the fit check (default: %(default)s)")
    ap.add_argument("--den-graph", help="compose Kaldi's normalization FST of this den graph into each graph")
    ap.add_argument("--out", required=True, help="output text archive")
    ap.add_argument("--kaldi-ark", help="also write a Kaldi binary archive")
    ap.add_argument("--rejected", help="write rejected utterance ids and reasons here")
    add_context_options(ap)
    add_word_positions_option(ap)
    args = ap.parse_args(argv)
    check_context_options(ap, args)
    if not 0.0 <= args.sil_prob < 1.0:
        ap.error(f"argument --sil-prob: expected a probability in [0, 1), got {args.sil_prob}")
    if args.frame_subsampling_factor < 1:
        ap.error(f"argument --frame-subsampling-factor: expected at least 1, got {args.frame_subsampling_factor}")
    check_input_files(ap, args, "--lexicon", "--phones", "--text", "--utt2num-frames", "--den-graph")
    check_topology(ap, args.topology)

    from ._progress import progress
    from chainfb.chain import (
        BiphoneSet, DenominatorGraph, Topology, add_normalization, fits, normalization_fst,
        numerator_graph, read_lexicon, read_phones, read_text, write_fst_archive, write_kaldi_fst_archive,
    )

    try:
        lex = positioned(read_lexicon(args.lexicon), args)
        phones = read_phones(args.phones, word_positions=args.word_positions)
        topo = Topology.read(args.topology)
        sil = args.optional_silence or None
        if sil is not None:
            check_symbol(ap, "--optional-silence", sil, phones, "phones of --phones")
        frames = {}
        if args.utt2num_frames:
            with open(args.utt2num_frames) as f:
                for n, ln in enumerate(f, 1):
                    if ln.strip():
                        fields = ln.split()
                        if len(fields) != 2 or not fields[1].isdigit():
                            ap.fail(f"{args.utt2num_frames}: line {n}: expected 'utt_id num_frames'")
                        frames[fields[0]] = math.ceil(int(fields[1]) / args.frame_subsampling_factor)
        utts = read_text(args.text)
        context = None
        if args.context == "biphone":
            known = [w for _, w in utts if all(x in lex for x in w)]
            context = BiphoneSet.from_transcripts(known, lex, phones, args.min_biphone_count,
                                                  args.min_monophone_count, args.biphone_prons)
            print(f"{context}; {context.num_pdfs(topo)} pdfs", file=sys.stderr)
        norm = None
        if args.den_graph:
            den = DenominatorGraph.read(args.den_graph)
            want = topo.num_pdfs(len(phones)) if context is None else context.num_pdfs(topo)
            if den.num_pdfs > want:
                ap.fail(f"--den-graph {args.den_graph} uses pdf {den.num_pdfs - 1} but --context {args.context} "
                        f"gives {want} pdfs (another --context or --min-biphone-count?)")
            norm = normalization_fst(den)
    except OSError as e:
        ap.fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e))
    except ValueError as e:
        ap.fail(str(e))
    good, rejected = [], []
    for utt, words in progress(utts, desc="numerator graphs", unit="utt"):
        try:
            fst = numerator_graph(words, lex, topo, phones, sil, args.sil_prob, context=context)
        except ValueError as e:
            rejected.append((utt, str(e)))
            continue
        if norm is not None:
            fst = add_normalization(fst, norm)
        if utt in frames:
            ok, msg = fits(fst, frames[utt])
            if not ok:
                rejected.append((utt, msg))
                continue
        elif frames:
            rejected.append((utt, "no entry in --utt2num-frames"))
            continue
        good.append((utt, fst))
    for utt, why in rejected:
        print(f"rejected {utt}: {why}", file=sys.stderr)
    try:
        if args.rejected:
            with open(args.rejected, "w") as f:
                for utt, why in rejected:
                    f.write(f"{utt}\t{why}\n")
        if not good:
            first = f" (the first: {rejected[0][0]}: {rejected[0][1]})" if rejected else ""
            ap.fail(f"no graph to write: all {len(rejected)} utterance(s) of {args.text} rejected{first}"
                    if rejected else f"no utterance in {args.text}")
        n = write_fst_archive(args.out, good)
        if args.kaldi_ark:
            write_kaldi_fst_archive(args.kaldi_ark, good)
    except OSError as e:
        ap.fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e))
    print(f"wrote {n} graphs to {args.out}; rejected {len(rejected)}", file=sys.stderr)


if __name__ == "__main__":
    main()
