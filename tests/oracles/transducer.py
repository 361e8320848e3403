"""Independent references for the transducer tests (no step graphs, no engine):

- ``enumerate_loglike``: every alignment enumerated as a sequence of moves on
  the (t, u) grid, summed in torch float64 (autograd gives the exact gradient);
- ``grid_reference``: plain-loop alpha/beta over (t, u) in float64 NumPy,
  returning log P and the gradient w.r.t. the logits.

Both handle big blanks (durations, sigma) with NeMo's boundary rules: a big
blank of duration d at (t, u) lands on (t + d, u); allowed iff t + d <= T - 1,
or t + d == T on the last row (u == U).
"""

import math

import numpy as np
import torch


def _moves(t, u, T, U, durations):
    """(kind, dt, du) moves allowed out of (t, u); kind 0 blank, 1 label, 2+i big blank i."""
    out = []
    if t < T:
        if t + 1 <= T - 1 or u == U:
            out.append((0, 1, 0))
        if u < U:
            out.append((1, 0, 1))
        for i, d in enumerate(durations):
            if t + d <= T - 1 or (u == U and t + d == T):
                out.append((2 + i, d, 0))
    return out


def enumerate_paths(T, U, durations=()):
    """All alignments as lists of (t, u, kind) from (0, 0) to (T, U)."""
    paths = []

    def rec(t, u, acc):
        if (t, u) == (T, U):
            paths.append(list(acc))
            return
        for kind, dt, du in _moves(t, u, T, U, durations):
            acc.append((t, u, kind))
            rec(t + dt, u + du, acc)
            acc.pop()

    if T > 0:
        rec(0, 0, [])
    return paths


def enumerate_loglike(lp, targets, T, U, blank, durations=(), sigma=0.0):
    """log P of one utterance from log-probs ``lp [T', U'+1, V]`` (torch, float64) by enumeration."""
    paths = enumerate_paths(T, U, durations)
    if not paths:
        return lp.new_tensor(-math.inf)

    def sym(u, kind):
        if kind == 0:
            return blank
        if kind == 1:
            return int(targets[u])
        return blank - 1 - (kind - 2)

    scores = [sum(lp[t, u, sym(u, k)] - sigma for t, u, k in p) for p in paths]
    return torch.logsumexp(torch.stack(scores), 0)


def grid_reference(logits, targets, T, U, blank, durations=(), sigma=0.0, fused=True, fastemit=0.0):
    """``(logP, grad [T', U'+1, V])`` for one utterance by alpha/beta loops on the grid.

    ``grad`` is the gradient of ``-(1+fastemit) logP`` in NeMo's FastEmit form
    (the true gradient when fastemit == 0)."""
    x = np.asarray(logits, dtype=np.float64)
    if fused:
        m = x.max(-1, keepdims=True)
        lp = x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))
    else:
        lp = x
    grad = np.zeros_like(x)
    if T == 0:
        return -math.inf, grad

    def sym(u, kind):
        if kind == 0:
            return blank
        if kind == 1:
            return int(targets[u])
        return blank - 1 - (kind - 2)

    alpha = np.full((T + 1, U + 1), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(T + 1):
        for u in range(U + 1):
            if t == 0 and u == 0:
                continue
            terms = []
            if u > 0 and t < T:
                terms.append(alpha[t, u - 1] + lp[t, u - 1, sym(u - 1, 1)] - sigma)
            for kind, dt in [(0, 1)] + [(2 + i, d) for i, d in enumerate(durations)]:
                s = t - dt
                if s >= 0 and (kind, dt, 0) in _moves(s, u, T, U, durations):
                    terms.append(alpha[s, u] + lp[s, u, sym(u, kind)] - sigma)
            alpha[t, u] = np.logaddexp.reduce(terms) if terms else -np.inf
    beta = np.full((T + 1, U + 1), -np.inf)
    beta[T, U] = 0.0
    for t in range(T, -1, -1):
        for u in range(U, -1, -1):
            if (t, u) == (T, U):
                continue
            terms = [lp[t, u, sym(u, k)] - sigma + beta[t + dt, u + du] for k, dt, du in _moves(t, u, T, U, durations)]
            beta[t, u] = np.logaddexp.reduce(terms) if terms else -np.inf
    logP = alpha[T, U]
    if not np.isfinite(logP):
        return logP, grad
    for t in range(T):
        for u in range(U + 1):
            occ = 0.0
            for k, dt, du in _moves(t, u, T, U, durations):
                p = math.exp(alpha[t, u] + lp[t, u, sym(u, k)] - sigma + beta[t + dt, u + du] - logP)
                w = p * (1 + fastemit) if k == 1 else p
                grad[t, u, sym(u, k)] -= w
                occ += w
            if fused:
                grad[t, u] += np.exp(lp[t, u]) * occ
    return logP, grad
