"""Random graphs and brute-force references for tests and benchmarks.

``brute_force`` enumerates every path and is the ground truth for tiny
cases; ``random_fst`` makes graphs with the awkward features real graphs
have (self-loops, several finals, shared pdfs, dead ends, unreachable
states, a start state other than 0).
"""

from __future__ import annotations


import numpy as np

from .fst import Fst

__all__ = ["random_fst", "numerator_like_fst", "denominator_like_fst", "brute_force"]


def random_fst(rng, num_states=4, num_arcs=8, num_pdfs=3, start=None, num_finals=2, self_loops=True) -> Fst:
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


def numerator_like_fst(rng, num_phones=50, num_pdfs=2000) -> Fst:
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


def denominator_like_fst(rng, num_states=3000, num_arcs=50000, num_pdfs=2000) -> Fst:
    """A random strongly-connected graph of denominator size; all states final."""
    src = np.concatenate([np.arange(num_states), rng.integers(0, num_states, num_arcs - num_states)])
    dst = np.concatenate([(np.arange(num_states) + 1) % num_states, rng.integers(0, num_states, num_arcs - num_states)])
    pdf = rng.integers(0, num_pdfs, num_arcs)
    lp = np.log(rng.uniform(0.05, 1.0, num_arcs))
    f = Fst(num_states, 0, src, dst, pdf, lp, np.zeros(num_states))
    return f


def brute_force(fst: Fst, scores: np.ndarray, length: int | None = None):
    """``(loglike, posteriors [T, P])`` of one sequence by path enumeration."""
    T, P = scores.shape
    L = T if length is None else length
    paths = []
    arcs_from = {}
    for a in range(fst.num_arcs):
        arcs_from.setdefault(int(fst.src[a]), []).append(a)

    def walk(state, t, acc, path):
        if t == L:
            if fst.final[state] > -np.inf:
                paths.append((acc + fst.final[state], tuple(path)))
            return
        for a in arcs_from.get(state, []):
            w = fst.log_prob[a] + scores[t, fst.pdf[a]]
            if w == -np.inf:
                continue
            path.append(a)
            walk(int(fst.dst[a]), t + 1, acc + w, path)
            path.pop()

    walk(fst.start, 0, 0.0, [])
    post = np.zeros((T, P))
    if not paths:
        return -np.inf, post
    ws = np.array([w for w, _ in paths])
    m = ws.max()
    if m == -np.inf:
        return -np.inf, post
    Z = m + np.log(np.exp(ws - m).sum())
    for w, path in paths:
        pr = np.exp(w - Z)
        for t, a in enumerate(path):
            post[t, fst.pdf[a]] += pr
    return float(Z), post


