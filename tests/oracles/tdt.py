"""Independent references for the TDT tests (no step graphs, no engine).

Moves out of grid point ``(t, u)`` of an utterance with ``T`` frames and
``U`` labels (NeMo's TDT rules):

- label ``targets[u]`` with duration ``d`` (any ``d >= 0``) to ``(t + d, u + 1)``
  iff ``u < U`` and ``t + d <= T - 1``;
- blank with duration ``d > 0`` to ``(t + d, u)`` iff ``t + d <= T - 1`` or
  (``u == U`` and ``t + d == T``).

An alignment runs from ``(0, 0)`` to ``(T, U)``.  Arc score:
``log_softmax_V(tokens)[sym] - sigma + log_softmax_D(durations)[i]``.

- ``enumerate_loglike``: every alignment listed and summed in torch float64
  (autograd gives the exact gradient);
- ``grid_reference``: alpha/beta loops over ``(t, u)`` in float64 NumPy,
  returning log P and NeMo's TDT gradient w.r.t. the ``V + D`` logits
  (FastEmit in NeMo's form; clamp on the token part).
"""

import math

import numpy as np
import torch


def moves(t, u, T, U, durations):
    """``(kind, i, t', u')`` allowed out of ``(t, u)``; kind 0 blank, 1 label."""
    out = []
    if t >= T:
        return out
    for i, d in enumerate(durations):
        if d > 0 and (t + d <= T - 1 or (u == U and t + d == T)):
            out.append((0, i, t + d, u))
        if u < U and t + d <= T - 1:
            out.append((1, i, t + d, u + 1))
    return out


def enumerate_paths(T, U, durations):
    """All alignments as lists of ``(t, u, kind, i)``."""
    paths = []

    def rec(t, u, acc):
        if (t, u) == (T, U):
            paths.append(list(acc))
            return
        for kind, i, t2, u2 in moves(t, u, T, U, durations):
            acc.append((t, u, kind, i))
            rec(t2, u2, acc)
            acc.pop()

    if T > 0:
        rec(0, 0, [])
    return paths


def enumerate_loglike(logits, targets, T, U, blank, durations, sigma=0.0):
    """log P of one utterance from ``logits [T', U'+1, V + D]`` (torch float64) by enumeration."""
    D = len(durations)
    V = logits.shape[-1] - D
    tok = torch.log_softmax(logits[..., :V], -1)
    dur = torch.log_softmax(logits[..., V:], -1)
    paths = enumerate_paths(T, U, durations)
    if not paths:
        return logits.sum() * 0 - math.inf
    scores = []
    for p in paths:
        s = logits.new_zeros(())
        for t, u, kind, i in p:
            sym = blank if kind == 0 else int(targets[u])
            s = s + tok[t, u, sym] - sigma + dur[t, u, i]
        scores.append(s)
    return torch.logsumexp(torch.stack(scores), 0)


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def grid_reference(logits, targets, T, U, blank, durations, sigma=0.0, fastemit=0.0, clamp=-1.0):
    """``(logP, grad [T', U'+1, V + D])`` for one utterance by alpha/beta loops.

    ``grad`` is NeMo's gradient of ``-(1 + fastemit) logP``: token part
    ``softmax * (Pb + (1+f) Pl) - Pb [blank] - (1+f) Pl [label]`` (clamped to
    ``[-clamp, clamp]`` when ``clamp > 0``), duration part ``softmax * (Pb +
    Pl) - P_i``; the exact derivative when ``fastemit == 0``."""
    x = np.asarray(logits, dtype=np.float64)
    D = len(durations)
    V = x.shape[-1] - D
    tok, dur = _log_softmax(x[..., :V]), _log_softmax(x[..., V:])
    grad = np.zeros_like(x)
    if T == 0:
        return -math.inf, grad

    def score(t, u, kind, i):
        sym = blank if kind == 0 else int(targets[u])
        return tok[t, u, sym] - sigma + dur[t, u, i]

    alpha = np.full((T + 1, U + 1), -np.inf)  # every move lands inside the grid
    alpha[0, 0] = 0.0
    for t in range(T):
        for u in range(U + 1):
            for kind, i, t2, u2 in moves(t, u, T, U, durations):
                alpha[t2, u2] = np.logaddexp(alpha[t2, u2], alpha[t, u] + score(t, u, kind, i))
    logP = alpha[T, U]
    beta = np.full((T + 1, U + 1), -np.inf)
    beta[T, U] = 0.0
    for t in range(T - 1, -1, -1):
        for u in range(U, -1, -1):
            terms = [score(t, u, k, i) + beta[t2, u2] for k, i, t2, u2 in moves(t, u, T, U, durations)]
            beta[t, u] = np.logaddexp.reduce(terms) if terms else -np.inf
    assert np.isclose(beta[0, 0], logP) or not np.isfinite(logP)
    if not np.isfinite(logP):
        return logP, grad
    for t in range(T):
        for u in range(U + 1):
            P = np.zeros((2, D))
            for kind, i, t2, u2 in moves(t, u, T, U, durations):
                P[kind, i] += math.exp(alpha[t, u] + score(t, u, kind, i) + beta[t2, u2] - logP)
            Pb, Pl = P[0].sum(), P[1].sum()
            g = np.exp(tok[t, u]) * (Pb + (1 + fastemit) * Pl)
            g[blank] -= Pb
            if u < U:
                g[int(targets[u])] -= (1 + fastemit) * Pl
            if clamp > 0:
                g = np.clip(g, -clamp, clamp)
            grad[t, u, :V] = g
            grad[t, u, V:] = np.exp(dur[t, u]) * (Pb + Pl) - P.sum(0)
    return logP, grad
