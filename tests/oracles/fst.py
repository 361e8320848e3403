"""Independent references for pdf-labelled graphs, written without
reference to the engine's code:

- ``brute_force``: every path enumerated (the ground truth for tiny cases);
- ``brute_force_best``: the best path by enumeration;
- ``reference_forward_backward``: plain Python loops over arcs and frames
  in float64.

All three honour ``fst.span``: an arc read at frame ``t`` scores
``log_prob + scores[t, pdf]`` and lands at frame ``t + span``; a path
ends exactly at frame ``length`` in a final state; posteriors count an arc
at the frame it is read.
"""

import math

import numpy as np


def _lae(a, b):
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


def _spans(fst):
    span = getattr(fst, "span", None)
    return [1] * fst.num_arcs if span is None else [int(k) for k in span]


def reference_forward_backward(fst, scores, length=None):
    """``(loglike, posteriors [T, P])`` of one sequence, by plain loops."""
    T, P = scores.shape
    L = T if length is None else length
    S = fst.num_states
    arcs = [(s, d, p, w, k) for (s, d, p, w), k in zip(fst.arcs(), _spans(fst))]
    alpha = [[-math.inf] * S for _ in range(L + 1)]
    alpha[0][fst.start] = 0.0
    for t in range(L):
        for s, d, p, w, k in arcs:
            if t + k <= L and alpha[t][s] > -math.inf and w > -math.inf:
                alpha[t + k][d] = _lae(alpha[t + k][d], alpha[t][s] + w + float(scores[t, p]))
    total = -math.inf
    for s in range(S):
        if fst.final[s] > -math.inf:
            total = _lae(total, alpha[L][s] + fst.final[s])
    post = np.zeros((T, P))
    if total == -math.inf:
        return total, post
    beta = [[-math.inf] * S for _ in range(L + 1)]
    beta[L] = [float(x) for x in fst.final]
    for t in range(L - 1, -1, -1):
        for s, d, p, w, k in arcs:
            if t + k <= L and beta[t + k][d] > -math.inf and w > -math.inf:
                x = w + float(scores[t, p]) + beta[t + k][d]
                beta[t][s] = _lae(beta[t][s], x)
                if alpha[t][s] > -math.inf:
                    post[t, p] += math.exp(alpha[t][s] + x - total)
    return total, post


def _paths(fst, scores, L):
    """Every path of ``fst`` from frame 0 ending exactly at frame ``L`` in a
    final state, as ``(score, arcs)``, in lexicographic order of ``arcs``;
    arcs scoring -inf are left out (such a path has no weight)."""
    span = _spans(fst)
    arcs_from = {}
    for a in range(fst.num_arcs):
        arcs_from.setdefault(int(fst.src[a]), []).append(a)
    out = []

    def walk(state, t, acc, path):
        if t == L:
            if fst.final[state] > -np.inf:
                out.append((acc + fst.final[state], tuple(path)))
            return
        for a in arcs_from.get(state, []):
            if t + span[a] > L:
                continue
            w = fst.log_prob[a] + scores[t, fst.pdf[a]]
            if w == -np.inf:
                continue
            path.append(a)
            walk(int(fst.dst[a]), t + span[a], acc + w, path)
            path.pop()

    walk(fst.start, 0, 0.0, [])
    return out


def brute_force(fst, scores: np.ndarray, length: int | None = None):
    """``(loglike, posteriors [T, P])`` of one sequence by path enumeration."""
    T, P = scores.shape
    L = T if length is None else length
    span = _spans(fst)
    paths = _paths(fst, scores, L)
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
        for t, a in zip(_frames(path, span), path):
            post[t, fst.pdf[a]] += pr
    return float(Z), post


def _frames(path, span):
    """The frame at which each arc of ``path`` is read."""
    t, out = 0, []
    for a in path:
        out.append(t)
        t += span[a]
    return out


def brute_force_best(fst, scores, length):
    """Max over paths ending exactly at frame ``length``, and one best path
    (the tuple of its arcs, the first best in lexicographic order), by
    enumeration."""
    best, arg = -math.inf, None
    for v, path in _paths(fst, scores, length):
        if v > best:
            best, arg = v, path
    return best, arg


def frame_arcs(fst, path, length):
    """The arcs of ``path`` by the frame that reads them, ``[length]``: -1 at
    frames covered by a spanning arc (the ``best_path`` layout)."""
    out = np.full(length, -1, dtype=np.int64)
    if path is not None:
        for t, a in zip(_frames(path, _spans(fst)), path):
            out[t] = a
    return out


def expanded_span_one(fst, pad_pdf: int):
    """The span-1 graph with the same paths as ``fst`` when pdf ``pad_pdf``
    scores 0 everywhere: an arc of span k becomes a chain of k one-frame
    arcs through new states, the first reading the arc's pdf with its
    weight, the others ``pad_pdf`` with weight 0."""
    from chainfb import Fst

    arcs, S = [], fst.num_states
    for s, d, p, w, k in fst.arcs(spans=True):
        prev = s
        for i in range(k - 1):
            arcs.append((prev, S, p if i == 0 else pad_pdf, w if i == 0 else 0.0))
            prev, S = S, S + 1
        arcs.append((prev, d, p if k == 1 else pad_pdf, w if k == 1 else 0.0))
    finals = {s: float(v) for s, v in enumerate(fst.final) if v > -np.inf}
    return Fst.from_arcs(arcs, finals, start=fst.start, num_states=S)
