"""Graph generators for tests and benchmarks (the test oracles themselves
live with the tests, under ``tests/oracles``).

- :func:`random_fst`: small random acceptors with the awkward features real
  graphs have (self-loops, several finals, shared pdfs, dead ends,
  unreachable states, a start state other than 0);
- :func:`numerator_like_fst`, :func:`denominator_like_fst`: graphs with the
  size and shape of chain numerator and denominator graphs;
- :func:`kaldi_sized_denominator`: a denominator built as a recipe builds one
  (a 4-gram phone LM on phone sequences, the chain topology), at Kaldi's size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .fst import Fst

if TYPE_CHECKING:
    from .chain import DenominatorGraph

__all__ = ["random_fst", "numerator_like_fst", "denominator_like_fst", "kaldi_sized_denominator"]


def random_fst(rng: np.random.Generator, num_states: int = 4, num_arcs: int = 8, num_pdfs: int = 3,
               start: int | None = None, num_finals: int = 2, self_loops: bool = True) -> Fst:
    """A small random acceptor; may contain dead ends and unreachable states."""
    src = rng.integers(0, num_states, num_arcs)
    dst = rng.integers(0, num_states, num_arcs)
    if self_loops:
        dst[: max(1, num_arcs // 4)] = src[: max(1, num_arcs // 4)]
    pdf = rng.integers(0, num_pdfs, num_arcs)
    lp = rng.normal(size=num_arcs) - 0.5
    start = int(rng.integers(0, num_states)) if start is None else start
    finals = {int(s): float(rng.normal()) for s in rng.choice(num_states, size=num_finals, replace=False)}
    return Fst.from_arcs(zip(src, dst, pdf, lp), finals, start=start, num_states=num_states)


def numerator_like_fst(rng: np.random.Generator, num_phones: int = 50, num_pdfs: int = 2000) -> Fst:
    """A left-to-right graph like an e2e numerator: per phone a state with a
    self-loop and a forward arc (distinct pdfs), plus optional-silence
    skips; about ``6 * num_phones`` arcs."""
    arcs = []
    S = 2 * num_phones + 1
    for p in range(num_phones):
        a, b = 2 * p, 2 * p + 1
        pe, ps = rng.integers(0, num_pdfs, 2)
        arcs += [(a, b, pe, -0.1), (b, b, ps, -0.7), (b, b + 1, pe, -0.7)]
        sil = rng.integers(0, num_pdfs)
        arcs += [(a, a, sil, -1.5), (b, a + 2, ps, -0.9), (a, b + 1, sil, -2.0)]
    return Fst.from_arcs(arcs, {S - 1: 0.0, S - 2: -0.5}, num_states=S)


def denominator_like_fst(rng: np.random.Generator, num_states: int = 3000, num_arcs: int = 50000,
                         num_pdfs: int = 2000) -> Fst:
    """A random strongly-connected graph of denominator size; all states final."""
    src = np.concatenate([np.arange(num_states), rng.integers(0, num_states, num_arcs - num_states)])
    dst = np.concatenate([(np.arange(num_states) + 1) % num_states, rng.integers(0, num_states, num_arcs - num_states)])
    pdf = rng.integers(0, num_pdfs, num_arcs)
    lp = np.log(rng.uniform(0.05, 1.0, num_arcs))
    f = Fst(num_states, 0, src, dst, pdf, lp, np.zeros(num_states))
    return f


def kaldi_sized_denominator(rng: np.random.Generator, num_phones: int = 40,
                            num_utts: int = 4000) -> DenominatorGraph:
    """A :class:`chainfb.DenominatorGraph` at Kaldi's scale (~3,400 states,
    ~48,000 arcs, 80 pdfs for the defaults): a 4-gram phone LM estimated on
    ``num_utts`` synthetic Markov phone sequences of 20..79 phones, composed
    with the chain topology."""
    from .chain import DenominatorGraph, Topology, den_graph, estimate_phone_lm

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
