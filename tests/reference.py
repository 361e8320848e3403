"""Independent straightforward float64 references (plain Python loops over
arcs and frames), written without reference to the engine's code."""

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
