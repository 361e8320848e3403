"""Independent references for pdf-labelled graphs, written without
reference to the engine's code:

- ``brute_force``: every path enumerated (the ground truth for tiny cases);
- ``brute_force_best``: the best path by enumeration;
- ``reference_forward_backward``: plain Python loops over arcs and frames
  in float64.
"""

import itertools
import math

import numpy as np


def _lae(a, b):
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


def reference_forward_backward(fst, scores, length=None):
    """``(loglike, posteriors [T, P])`` of one sequence, by plain loops."""
    T, P = scores.shape
    L = T if length is None else length
    S = fst.num_states
    arcs = fst.arcs()
    alpha = [[-math.inf] * S for _ in range(L + 1)]
    alpha[0][fst.start] = 0.0
    for t in range(L):
        for s, d, p, w in arcs:
            if alpha[t][s] > -math.inf and w > -math.inf:
                alpha[t + 1][d] = _lae(alpha[t + 1][d], alpha[t][s] + w + float(scores[t, p]))
    total = -math.inf
    for s in range(S):
        if fst.final[s] > -math.inf:
            total = _lae(total, alpha[L][s] + fst.final[s])
    post = np.zeros((T, P))
    if total == -math.inf:
        return total, post
    beta = [float(x) for x in fst.final]
    for t in range(L - 1, -1, -1):
        nb = [-math.inf] * S
        for s, d, p, w in arcs:
            if beta[d] > -math.inf and w > -math.inf:
                x = w + float(scores[t, p]) + beta[d]
                nb[s] = _lae(nb[s], x)
                if alpha[t][s] > -math.inf:
                    post[t, p] += math.exp(alpha[t][s] + x - total)
        beta = nb
    return total, post


def brute_force(fst, scores: np.ndarray, length: int | None = None):
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


def brute_force_best(fst, scores, length):
    """Max over paths of exactly ``length`` arcs, and one best path, by enumeration."""
    best, arg = -math.inf, None
    for path in itertools.product(range(fst.num_arcs), repeat=length):
        s, v = fst.start, 0.0
        for t, a in enumerate(path):
            if fst.src[a] != s:
                break
            v += fst.log_prob[a] + scores[t, fst.pdf[a]]
            s = fst.dst[a]
        else:
            v += fst.final[s]
            if v > best:
                best, arg = v, path
    return best, arg
