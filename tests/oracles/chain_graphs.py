"""Enumeration references for chain graphs, written without the graph
compiler: the pdf sequences an FST accepts, and the phone sequences of a
transcript with alternative pronunciations and optional silence."""

import itertools
import math
from collections import defaultdict


def pdf_sequences(fst, L):
    """{pdf tuple: total probability} over all paths of exactly L arcs (enumeration)."""
    out = defaultdict(float)
    arcs = defaultdict(list)
    for s, d, p, lp in fst.arcs():
        arcs[s].append((d, p, lp))

    def walk(s, seq, lp):
        if len(seq) == L:
            if fst.final[s] > -math.inf:
                out[tuple(seq)] += math.exp(lp + fst.final[s])
            return
        for d, p, w in arcs[s]:
            walk(d, seq + [p], lp + w)

    walk(fst.start, [], 0.0)
    return dict(out)


def phone_alternatives(words, lex, sil_prob, phones, sil="SIL"):
    """{phone-id tuple: prob} of a transcript (``phones``: the phone list)
    with optional silence at every boundary (independent)."""
    prons = [[(tuple(phones.index(p) for p in ph), pr) for ph, pr in lex.prons[w]] for w in words]
    out = defaultdict(float)
    nb = len(words) + 1
    for choice in itertools.product(*prons):
        for sils in itertools.product([0, 1], repeat=nb):
            seq, prob = [], 1.0
            for i in range(nb):
                if sils[i]:
                    seq.append(phones.index(sil))
                prob *= sil_prob if sils[i] else 1 - sil_prob
                if i < len(choice):
                    seq += list(choice[i][0])
                    prob *= choice[i][1]
            out[tuple(seq)] += prob
    return out


def lm_prefix_prob(lm, phones):
    """The probability a phone LM (``lm.arcs``: ``(src, dst, phone,
    log_prob)``; ``lm.start``) gives the phone prefix ``phones`` (0 when it
    cannot be read)."""
    arcs = {(s, p): (d, lp) for s, d, p, lp in lm.arcs}
    s, lp = lm.start, 0.0
    for p in phones:
        if (s, p) not in arcs:
            return 0.0
        s, w = arcs[(s, p)]
        lp += w
    return math.exp(lp)


def expected_pdf_sequences(alternatives, L, align):
    """{pdf tuple: prob} a numerator graph must accept at length ``L``:
    every alignment (``align(phones, L)``, a list of pdf tuples) of every
    phone sequence of ``alternatives`` ({phones: prob}), probabilities summed;
    only the sequences of positive probability."""
    out = defaultdict(float)
    for phones, prob in alternatives.items():
        for seq in align(phones, L):
            out[seq] += prob
    return {k: v for k, v in out.items() if v > 0}
