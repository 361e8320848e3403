"""Generic FST algorithms, in one place (as k2's ``fsa_algo.py`` beside
``fsa.py``): they know graphs, never what a graph is for.  The chain graph
builders (:mod:`chainfb.chain.graphs`) and k2's algorithms
(:mod:`chainfb.compat.k2.ops`) are written on top of them.

Most take a :class:`~chainfb.Fst` (an epsilon-free acceptor over pdfs,
log-probabilities) and return one; the lower-level ones take arc arrays, so
that graphs of other kinds (phone graphs with epsilons, k2's FSAs) use them
too.

- connect: :func:`accessible`, :func:`coaccessible`, :func:`useful_states`
  (on arc arrays), :func:`trim` (an Fst without its useless states),
  :func:`topological_order`;
- :func:`canonical_fst`: an Fst from arc arrays, its arcs in the order the
  algorithms here return (the start state's arcs first, then by source);
- minimization: :func:`merge_equivalent_states` (exact suffix and prefix
  merging, repeated);
- :func:`determinize`: weighted subset construction in the log or the
  tropical semiring;
- :func:`intersect`: two pdf acceptors, weights multiplied;
- epsilon removal: :func:`remove_epsilons` (log semiring, acyclic epsilons,
  arc tuples) and :func:`remove_epsilons_max` (tropical semiring, epsilon
  cycles allowed, the source arcs of every result arc);
- path lengths: :func:`min_frames` (the fewest arcs of any complete path)
  and :func:`has_path_of_length`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

from . import checks
from .fst import Fst

#: Integer ids (states, labels) per arc or per state: a list of ints or an integer array.
Ids = Sequence[int] | np.ndarray

__all__ = ["accessible", "coaccessible", "useful_states", "trim", "topological_order", "canonical_fst",
           "merge_equivalent_states", "determinize", "intersect", "remove_epsilons", "remove_epsilons_max",
           "min_frames", "has_path_of_length"]


# --------------------------------------------------------------- connect
def _reached(num_nodes: int, src: np.ndarray, dst: np.ndarray, seed: int) -> np.ndarray:
    graph = csr_matrix((np.ones(len(src)), (src, dst)), shape=(num_nodes, num_nodes))
    seen = np.zeros(num_nodes, dtype=bool)
    seen[breadth_first_order(graph, seed, directed=True, return_predecessors=False)] = True
    return seen


def _ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def accessible(num_states: int, src: Ids, dst: Ids, start: int) -> np.ndarray:
    """Bool mask ``[num_states]``: reachable from ``start`` along arcs ``src[i] -> dst[i]``."""
    return _reached(int(num_states), _ids(src), _ids(dst), int(start))


def coaccessible(num_states: int, src: Ids, dst: Ids, final_states: Ids) -> np.ndarray:
    """Bool mask ``[num_states]``: able to reach one of ``final_states`` along arcs ``src[i] -> dst[i]``."""
    src, dst, finals = _ids(src), _ids(dst), _ids(final_states)
    S = int(num_states)
    # reverse the arcs and start from a super node linked to every final state
    super_node = np.full(len(finals), S, dtype=np.int64)
    return _reached(S + 1, np.concatenate([dst, super_node]), np.concatenate([src, finals]), S)[:S]


def useful_states(num_states: int, src: Ids, dst: Ids, start: int, final_states: Ids) -> np.ndarray:
    """Bool mask ``[num_states]``: reachable from ``start`` along arcs
    ``src[i] -> dst[i]`` and able to reach one of ``final_states`` (the
    states a trim keeps)."""
    return accessible(num_states, src, dst, start) & coaccessible(num_states, src, dst, final_states)


def trim(fst: Fst, word_of_arc: Ids | None = None) -> tuple[Fst, np.ndarray | None]:
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
    out = canonical_fst(len(order), 0, new[fst.src[m]], new[fst.dst[m]], fst.pdf[m], fst.log_prob[m],
                        fst.final[order], None if word_of_arc is None else np.asarray(word_of_arc)[m])
    return out


def topological_order(num_states: int, src: Ids, dst: Ids, start: int, last: int | None = None) -> np.ndarray | None:
    """The states reachable from ``start`` in an order in which every arc
    other than a self-loop goes forward (Kahn's algorithm, the
    lowest-numbered ready state first), int64 ``[K]``; with ``last`` (k2's
    final state), that state appended at the end, reachable or not, and its
    arcs not followed.  ``None`` when a cycle other than a self-loop is
    reachable, or a state is reachable only through ``last``."""
    src, dst = _ids(src), _ids(dst)
    S, start = int(num_states), int(start)
    reach = accessible(S, src, dst, start)
    arcs = np.flatnonzero(reach[src] & reach[dst] & (src != dst))
    indeg = np.bincount(dst[arcs], minlength=S)
    out_arcs = [[] for _ in range(S)]
    for a in arcs.tolist():
        out_arcs[src[a]].append(dst[a])
    ready = [start] if indeg[start] == 0 else []
    order = []
    while ready:
        s = heapq.heappop(ready)
        if s == last:
            continue
        order.append(s)
        for d in out_arcs[s]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(ready, d)
    expected = int(reach.sum()) - (1 if last is not None and reach[last] else 0)
    if len(order) != expected:
        return None
    return np.array(order + ([] if last is None else [int(last)]), np.int64)


# --------------------------------------------------------------- arc order
def canonical_fst(num_states: int, start: int, src: Ids, dst: Ids, pdf: Ids, log_prob: Sequence[float] | np.ndarray,
                  final: Sequence[float] | np.ndarray,
                  word: Ids | None = None) -> tuple[Fst, np.ndarray | None]:
    """An Fst of these arcs in the canonical order (the start state's arcs
    first, then by source state, otherwise as given), and ``word`` ``[A]``
    (labels that follow the arcs, or ``None``) permuted alike:
    ``(Fst, word)``."""
    src = np.asarray(src, np.int64)
    key = np.where(src == start, -1, src)
    order = np.argsort(key, kind="stable")
    f = Fst(num_states, start, src[order], np.asarray(dst, np.int64)[order], np.asarray(pdf, np.int64)[order],
            np.asarray(log_prob, np.float64)[order], final)
    return f, (None if word is None else np.asarray(word, np.int64)[order])


# --------------------------------------------------------------- minimization
SELF = -2


def _combine_parallel(arcs):
    """Merge arcs with the same (src, dst, pdf, word) by log-sum of weights."""
    acc = {}
    for s, d, p, lp, w in arcs:
        k = (s, d, p, w)
        acc[k] = np.logaddexp(acc[k], lp) if k in acc else lp
    return [(s, d, p, float(lp), w) for (s, d, p, w), lp in acc.items()]


def merge_equivalent_states(fst: Fst, word_of_arc: Ids | None = None,
                            max_passes: int = 50) -> tuple[Fst, np.ndarray | None]:
    """Exact state merging for epsilon-free acceptors (cheap minimization).

    Two merges, repeated until nothing changes, each preserving every path's
    weight exactly (so the graph's total weight for any score sequence is
    unchanged):

    * *suffix merge*: states with the same final weight and the same
      outgoing arcs (pdf, destination, weight, word; self-loops compared as
      self-loops) have the same future, so all their incoming arcs can
      point at one of them (this is minimization for the graphs built here);
    * *prefix merge*: non-start states with the same incoming arcs (source,
      pdf, weight, word) and the same self-loops can share one state holding
      the union of their outgoing arcs and the log-sum of their final
      weights (the common-prefix part of determinization, e.g.
      pronunciations that share their first phones).

    Parallel arcs (same source, destination, pdf and word) are combined by
    log-sum.  This is not full weighted determinization: graphs stay
    non-deterministic where alternatives differ early and re-join late.

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
    out, words = canonical_fst(len(final), start, src, [a[1] for a in arcs], [a[2] for a in arcs],
                               [a[3] for a in arcs], np.array(final, np.float64), [a[4] for a in arcs])
    out, words = trim(out, words)
    return out, words


# --------------------------------------------------------------- determinization
def determinize(fst: Fst, max_states: int | None = None, delta: float = 1e-10,
                semiring: str = "log") -> Fst | None:
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
            src.append(i)
            dst.append(j)
            pdf.append(p)
            lps.append(w)
        i += 1
    out, _ = canonical_fst(len(subsets), 0, src, dst, pdf, lps, np.array(finals), None)
    return trim(out)[0]


# --------------------------------------------------------------- intersection
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
                src.append(i)
                dst.append(j)
                pdf.append(p)
                lps.append(lp1 + lp2)
    final = np.full(len(ids), -np.inf)
    for (s1, s2), i in ids.items():
        final[i] = a.final[s1] + b.final[s2]
    fst, _ = canonical_fst(len(ids), 0, src, dst, pdf, lps, final, None)
    return trim(fst)[0]


# --------------------------------------------------------------- epsilon removal
def _lae(a: float, b: float) -> float:
    return float(np.logaddexp(a, b))


def remove_epsilons(num_states: int, arcs: Iterable[tuple], final: dict, epsilon: int = -1,
                    what: str = "graph") -> tuple[list[tuple], dict]:
    """Epsilon removal in the log semiring: ``(arcs, final)`` of an
    equivalent graph without epsilon arcs, on the same states (trim it
    afterwards).

    ``arcs`` are tuples ``(src, dst, label, log_prob, *rest)`` (label
    ``epsilon`` on an epsilon arc; ``rest``, e.g. a word label, follows each
    non-epsilon arc), ``final`` a dict ``state -> log_prob``.  From every
    state, each epsilon path to a state ``v`` is followed by ``v``'s
    non-epsilon arcs and final weight, path weights summed exactly.  The
    epsilon arcs must not form a cycle (a ``ValueError`` naming ``what``).
    """
    eps_out: dict[int, list] = {}
    real_out: dict[int, list] = {}
    for a in arcs:
        (eps_out if a[2] == epsilon else real_out).setdefault(a[0], []).append(a)
    closure_cache: dict[int, dict] = {}

    def closure(u, stack=()):
        if u in closure_cache:
            return closure_cache[u]
        if u in stack:
            raise ValueError(f"the epsilon arcs of the {what} form a cycle")
        c = {u: 0.0}
        for a in eps_out.get(u, []):
            for x, w in closure(a[1], stack + (u,)).items():
                c[x] = _lae(c[x], a[3] + w) if x in c else a[3] + w
        closure_cache[u] = c
        return c

    out_arcs, out_final = [], {}
    for u in range(num_states):
        for v, w in closure(u).items():
            for a in real_out.get(v, []):
                out_arcs.append((u, a[1], a[2], w + a[3]) + tuple(a[4:]))
            if v in final:
                f = w + final[v]
                out_final[u] = _lae(out_final[u], f) if u in out_final else f
    return out_arcs, out_final


def _eps_closure_max(s, eps_out, S, name):
    """Best (max) epsilon-path score from ``s`` to each state it reaches, and
    the arcs of that path; a cycle of positive score is an error."""
    best, pred, count = {s: 0.0}, {s: None}, {}
    queue = deque([s])
    while queue:
        q = queue.popleft()
        for arc, d, w in eps_out[q]:
            v = best[q] + w
            if d not in best or v > best[d]:
                best[d], pred[d] = v, (q, arc)
                count[d] = count.get(d, 0) + 1
                if count[d] > S:
                    raise ValueError(f"{name}: remove_epsilon needs an FSA without epsilon cycles of score > 0")
                queue.append(d)
    paths = {}
    for q in best:
        path, cur = [], q
        while pred[cur] is not None:
            cur, arc = pred[cur]
            path.append(arc)
        paths[q] = path[::-1]
    return [s] + sorted(q for q in best if q != s), paths


def remove_epsilons_max(num_states: int, src: Ids, dst: Ids, label: Ids, score: Sequence[float] | np.ndarray,
                        epsilon: int = 0,
                        name: str = "fsa") -> tuple[int, np.ndarray, np.ndarray, np.ndarray, list]:
    """Epsilon removal in the tropical semiring (max): from each state, the
    best epsilon path to every state it reaches (itself first, then by
    state id) is followed by that state's non-epsilon arcs.

    Returns ``(num_states, src, dst, label, paths)``: the arcs (int64 ``[A']``,
    the states kept as they are; connect afterwards) and, per result arc,
    the list of source arcs it stands for (the epsilon path, then the arc).
    An epsilon cycle of positive score is a ``ValueError`` naming ``name``.
    """
    S = int(num_states)
    eps_out = [[] for _ in range(S)]
    other = [[] for _ in range(S)]
    for a in range(len(src)):
        (eps_out if label[a] == epsilon else other)[src[a]].append(
            (a, dst[a], score[a]) if label[a] == epsilon else a)
    ns, nd, nl, maps = [], [], [], []
    for s in range(S):
        if not eps_out[s]:
            for a in other[s]:
                ns.append(s), nd.append(dst[a]), nl.append(label[a]), maps.append([a])
            continue
        states, paths = _eps_closure_max(s, eps_out, S, name)
        for q in states:
            for a in other[q]:
                ns.append(s), nd.append(dst[a]), nl.append(label[a]), maps.append(paths[q] + [a])
    return S, np.array(ns, np.int64), np.array(nd, np.int64), np.array(nl, np.int64), maps


# --------------------------------------------------------------- path lengths
def min_frames(fst: Fst) -> float:
    """The fewest frames (arcs) of any start-to-final path; ``inf`` if none.

    Kaldi rejects training examples whose numerator graph's shortest path is
    longer than the number of frames; see :func:`chainfb.chain.fits`.
    """
    ok = fst.log_prob > -np.inf
    out: dict[int, list] = {}
    for s, d in zip(fst.src[ok].tolist(), fst.dst[ok].tolist()):
        out.setdefault(s, []).append(d)
    dist = {fst.start: 0}
    q = deque([fst.start])
    best = math.inf
    while q:
        u = q.popleft()
        if fst.final[u] > -np.inf:
            best = min(best, dist[u])
            break  # BFS: the first final state popped is the nearest
        for v in out.get(u, ()):
            if v not in dist:
                dist[v] = dist[u] + 1
                q.append(v)
    return best if best < math.inf else math.inf


def has_path_of_length(fst: Fst, num_frames: int) -> bool:
    """Whether some start-to-final path of ``fst`` has exactly ``num_frames``
    arcs of log-prob ``> -inf`` (graphs without self-loops may not fit every
    length)."""
    ok = fst.log_prob > -np.inf
    cur = np.zeros(fst.num_states, bool)
    cur[fst.start] = True
    src, dst = fst.src[ok], fst.dst[ok]
    for _ in range(int(num_frames)):
        nxt = np.zeros_like(cur)
        nxt[dst[cur[src]]] = True
        cur = nxt
        if not cur.any():
            break
    return bool((cur & (fst.final > -np.inf)).any())
