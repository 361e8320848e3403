"""Exact state merging for epsilon-free acceptors (cheap minimization).

Two merges, repeated until nothing changes, each preserving every path's
weight exactly (so the graph's total weight for any score sequence is
unchanged):

* *suffix merge*: states with the same final weight and the same outgoing
  arcs (pdf, destination, weight, word; self-loops compared as self-loops)
  have the same future, so all their incoming arcs can point at one of them
  (this is minimization for the graphs built here);
* *prefix merge*: non-start states with the same incoming arcs (source, pdf,
  weight, word) and the same self-loops can share one state holding the
  union of their outgoing arcs and the log-sum of their final weights (the
  common-prefix part of determinization, e.g. pronunciations that share
  their first phones).

Parallel arcs (same source, destination, pdf and word) are combined by
log-sum.  This is not full weighted determinization: graphs stay
non-deterministic where alternatives differ early and re-join late.
"""

from __future__ import annotations

import numpy as np

from ... import checks
from ...fst import Fst
from .connect import useful_states

__all__ = ["merge_equivalent_states", "trim", "determinize"]

SELF = -2


def trim(fst: Fst, word_of_arc=None):
    """Remove states not on a start-to-final path (and their arcs).

    Returns ``(fst, word_of_arc)``; ``word_of_arc`` ``[A]`` follows the arcs
    (``None`` in, ``None`` out).  A graph with no complete path is returned
    as a single non-final start state with no arcs.
    """
    S = fst.num_states
    ok = fst.log_prob > -np.inf
    keep = useful_states(S, fst.src[ok], fst.dst[ok], fst.start, np.flatnonzero(fst.final > -np.inf))
    if not keep[fst.start]:
        return Fst(1, 0, [], [], [], [], [-np.inf]), (None if word_of_arc is None else np.zeros(0, np.int64))
    new = np.full(S, -1, dtype=np.int64)
    order = np.concatenate([[fst.start], np.flatnonzero(keep & (np.arange(S) != fst.start))])
    new[order] = np.arange(len(order))
    m = ok & keep[fst.src] & keep[fst.dst]
    out = _build(len(order), 0, new[fst.src[m]], new[fst.dst[m]], fst.pdf[m], fst.log_prob[m],
                 fst.final[order], None if word_of_arc is None else np.asarray(word_of_arc)[m])
    return out


def _build(S, start, src, dst, pdf, lp, final, word):
    """An Fst whose arc order equals the canonical one, and the permuted words."""
    src = np.asarray(src, np.int64)
    key = np.where(src == start, -1, src)
    order = np.argsort(key, kind="stable")
    f = Fst(S, start, src[order], np.asarray(dst, np.int64)[order], np.asarray(pdf, np.int64)[order],
            np.asarray(lp, np.float64)[order], final)
    return f, (None if word is None else np.asarray(word, np.int64)[order])


def _combine_parallel(arcs):
    """Merge arcs with the same (src, dst, pdf, word) by log-sum of weights."""
    acc = {}
    for s, d, p, lp, w in arcs:
        k = (s, d, p, w)
        acc[k] = np.logaddexp(acc[k], lp) if k in acc else lp
    return [(s, d, p, float(lp), w) for (s, d, p, w), lp in acc.items()]


def merge_equivalent_states(fst: Fst, word_of_arc=None, max_passes: int = 50):
    """Repeated exact suffix and prefix merging (see the module docstring).

    Parameters
    ----------
    fst : Fst
    word_of_arc : int array ``[A]`` or None — labels that must be preserved.

    Returns
    -------
    ``(Fst, word_of_arc)`` — trimmed, states renumbered, start state 0.
    """
    words = np.full(fst.num_arcs, -1, np.int64) if word_of_arc is None else np.asarray(word_of_arc, np.int64)
    fst, words = trim(fst, words)
    arcs = list(zip(fst.src.tolist(), fst.dst.tolist(), fst.pdf.tolist(), fst.log_prob.tolist(), words.tolist()))
    final = fst.final.tolist()
    start = fst.start
    for _ in range(max_passes):
        changed = False
        for mode in ("suffix", "prefix"):
            arcs = _combine_parallel(arcs)
            S = len(final)
            sig = [[] for _ in range(S)]
            for s, d, p, lp, w in arcs:
                if mode == "suffix":
                    sig[s].append((p, SELF if d == s else d, lp, w))
                else:
                    sig[d].append((SELF if d == s else s, p, lp, w))
            rep = list(range(S))
            seen = {}
            for s in range(S):
                if mode == "prefix" and (s == start or not any(x[0] != SELF for x in sig[s])):
                    continue
                key = (final[s] if mode == "suffix" else None, tuple(sorted(sig[s])))
                r = seen.setdefault(key, s)
                if r != s:
                    rep[s] = r
            if all(rep[s] == s for s in range(S)):
                continue
            changed = True
            new_final = list(final)
            if mode == "prefix":
                for s in range(S):
                    if rep[s] != s:
                        new_final[rep[s]] = float(np.logaddexp(new_final[rep[s]], final[s]))
            if mode == "suffix":
                # drop the merged states' outgoing arcs (identical to their representative's)
                arcs = [(s, rep[d], p, lp, w) for s, d, p, lp, w in arcs if rep[s] == s]
            else:
                # drop the merged states' incoming arcs (duplicates); move outgoing arcs to the representative
                arcs = [(rep[s], rep[d], p, lp, w) for s, d, p, lp, w in arcs if rep[d] == d or (s == d)]
                # a merged state's self-loops duplicated the representative's: keep one copy
                dedup, kept = set(), []
                for a in arcs:
                    if a[0] == a[1]:
                        if (a[0], a[2], a[3], a[4]) in dedup:
                            continue
                        dedup.add((a[0], a[2], a[3], a[4]))
                    kept.append(a)
                arcs = kept
            final = new_final
            # renumber
            live = sorted({start} | {s for s in range(S) if rep[s] == s})
            idx = {s: i for i, s in enumerate(live)}
            arcs = [(idx[s], idx[d], p, lp, w) for s, d, p, lp, w in arcs]
            final = [final[s] for s in live]
            start = idx[start]
        if not changed:
            break
    arcs = _combine_parallel(arcs)
    src = [a[0] for a in arcs]
    out, words = _build(len(final), start, src, [a[1] for a in arcs], [a[2] for a in arcs],
                        [a[3] for a in arcs], np.array(final, np.float64), [a[4] for a in arcs])
    out, words = trim(out, words)
    return out, words


def determinize(fst: Fst, max_states: int | None = None, delta: float = 1e-10, semiring: str = "log"):
    """Weighted determinization in the log semiring (subset construction with
    residual weights), so that no state has two arcs with the same pdf.

    Every pdf sequence keeps its total weight (up to ``delta``: residual
    weights are matched after rounding to ``delta``, as OpenFst/Kaldi
    quantize).  Graphs without the twins property may not have a finite
    deterministic equivalent: the construction gives up after
    ``max_states`` states (default ``20 * num_states + 100``) and returns
    ``None``.  ``semiring="tropical"`` does the same in the max semiring
    (alternatives combined by ``max`` instead of log-sum): every pdf
    sequence keeps its best path's weight.

    Returns
    -------
    Fst or None — deterministic, trimmed, start state 0.
    """
    if max_states is None:
        max_states = 20 * fst.num_states + 100
    plus = {"log": np.logaddexp, "tropical": np.maximum}[checks.choice(semiring, "semiring", ("log", "tropical"))]
    out_arcs: list[list] = [[] for _ in range(fst.num_states)]
    for s, d, p, lp in zip(fst.src.tolist(), fst.dst.tolist(), fst.pdf.tolist(), fst.log_prob.tolist()):
        if lp > -np.inf:
            out_arcs[s].append((p, d, lp))
    final = fst.final

    def key(subset):
        return tuple(sorted((q, round(r / delta)) for q, r in subset.items()))

    start = {fst.start: 0.0}
    ids = {key(start): 0}
    subsets = [start]
    src, dst, pdf, lps, finals = [], [], [], [], []
    i = 0
    while i < len(subsets):
        sub = subsets[i]
        f = -np.inf
        for q, r in sub.items():
            if final[q] > -np.inf:
                f = plus(f, r + final[q])
        finals.append(float(f))
        by_pdf: dict = {}
        for q, r in sub.items():
            for p, d, lp in out_arcs[q]:
                t = by_pdf.setdefault(p, {})
                t[d] = plus(t[d], r + lp) if d in t else r + lp
        for p in sorted(by_pdf):
            t = by_pdf[p]
            w = float(plus.reduce(np.array(list(t.values()))))
            nxt = {d: float(v - w) for d, v in t.items()}
            k = key(nxt)
            j = ids.get(k)
            if j is None:
                if len(subsets) >= max_states:
                    return None
                j = ids[k] = len(subsets)
                subsets.append(nxt)
            src.append(i); dst.append(j); pdf.append(p); lps.append(w)
        i += 1
    out, _ = _build(len(subsets), 0, src, dst, pdf, lps, np.array(finals), None)
    return trim(out)[0]
