"""Kaldi's normalization FST and its composition into numerator graphs.

Kaldi (``DenominatorGraph::GetNormalizationFst`` and
``AddWeightToSupervisionFst``) gives numerator graphs the denominator's
phone-LM weights, so that num and den score paths the same way and the
objective is ``<= 0``-ish: the normalization FST is the denominator graph
with a new start state that enters each state ``i`` with probability
``init(i)`` (epsilons removed: it copies every arc ``i -> j`` as ``start ->
j`` with weight ``init(i) * p``) and every state final with probability 1;
each numerator graph is then intersected with it (acceptors over pdfs;
:func:`chainfb.fst_algo.intersect`, also importable from here).
"""

from __future__ import annotations

import numpy as np

from ...fst import Fst
from ...fst_algo import intersect
from ..denominator import DenominatorGraph

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


def add_normalization(num_fst: Fst, den: DenominatorGraph | Fst) -> Fst:
    """``num_fst`` intersected with the normalization FST of ``den``
    (a DenominatorGraph, or an already built normalization Fst)."""
    norm = den if isinstance(den, Fst) else normalization_fst(den)
    return intersect(num_fst, norm)
