"""Kaldi's normalization FST and its composition into numerator graphs.

Kaldi (``DenominatorGraph::GetNormalizationFst`` and
``AddWeightToSupervisionFst``) gives numerator graphs the denominator's
phone-LM weights, so that num and den score paths the same way and the
objective is ``<= 0``-ish: the normalization FST is the denominator graph
with a new start state that enters each state ``i`` with probability
``init(i)`` (epsilons removed: it copies every arc ``i -> j`` as ``start ->
j`` with weight ``init(i) * p``) and every state final with probability 1;
each numerator graph is then intersected with it (acceptors over pdfs).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ...fst import Fst
from ..denominator import DenominatorGraph
from .minimize import _build, trim

__all__ = ["normalization_fst", "intersect", "add_normalization"]


def normalization_fst(den: DenominatorGraph) -> Fst:
    """The normalization FST of a denominator graph (see module docstring).

    Returns an Fst with ``S + 1`` states; the new start state is ``S``.
    """
    if not isinstance(den, DenominatorGraph):
        den = DenominatorGraph(den)
    f = den.fst
    S = f.num_states
    ok = den.log_init[f.src] > -np.inf
    src = np.concatenate([f.src, np.full(int(ok.sum()), S)])
    dst = np.concatenate([f.dst, f.dst[ok]])
    pdf = np.concatenate([f.pdf, f.pdf[ok]])
    lp = np.concatenate([f.log_prob, f.log_prob[ok] + den.log_init[f.src[ok]]])
    return Fst(S + 1, S, src, dst, pdf, lp, np.zeros(S + 1))


def intersect(a: Fst, b: Fst) -> Fst:
    """Intersection of two pdf acceptors (weights multiply, i.e. log-probs add;
    finals add).  Only state pairs reachable from the start pair are built;
    the result is trimmed."""
    by_pdf: list[dict] = [dict() for _ in range(b.num_states)]
    for s, d, p, lp in zip(b.src.tolist(), b.dst.tolist(), b.pdf.tolist(), b.log_prob.tolist()):
        by_pdf[s].setdefault(p, []).append((d, lp))
    a_out: list[list] = [[] for _ in range(a.num_states)]
    for s, d, p, lp in zip(a.src.tolist(), a.dst.tolist(), a.pdf.tolist(), a.log_prob.tolist()):
        a_out[s].append((d, p, lp))
    ids = {(a.start, b.start): 0}
    q = deque([(a.start, b.start)])
    src, dst, pdf, lps = [], [], [], []
    while q:
        pair = q.popleft()
        s1, s2 = pair
        i = ids[pair]
        for d1, p, lp1 in a_out[s1]:
            for d2, lp2 in by_pdf[s2].get(p, ()):
                nxt = (d1, d2)
                j = ids.get(nxt)
                if j is None:
                    j = ids[nxt] = len(ids)
                    q.append(nxt)
                src.append(i); dst.append(j); pdf.append(p); lps.append(lp1 + lp2)
    final = np.full(len(ids), -np.inf)
    for (s1, s2), i in ids.items():
        final[i] = a.final[s1] + b.final[s2]
    fst, _ = _build(len(ids), 0, src, dst, pdf, lps, final, None)
    return trim(fst)[0]


def add_normalization(num_fst: Fst, den) -> Fst:
    """``num_fst`` intersected with the normalization FST of ``den``
    (a DenominatorGraph, or an already built normalization Fst)."""
    norm = den if isinstance(den, Fst) else normalization_fst(den)
    return intersect(num_fst, norm)
