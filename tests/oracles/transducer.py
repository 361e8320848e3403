"""Independent references for the transducer tests (no step graphs, no engine):

- ``enumerate_loglike``: every alignment enumerated as a sequence of moves on
  the (t, u) grid, summed in torch float64 (autograd gives the exact gradient);
- ``grid_reference``: plain-loop alpha/beta over (t, u) in float64 NumPy,
  returning log P and the gradient w.r.t. the logits;
- ``rnnt_reference``: a direct differentiable RNN-T alpha recursion in torch;
- ``rnnt_step_case``: a small RNN-T batch as hand-built step graphs with the
  arguments of the CUDA score-map kernels.

Both handle big blanks (durations, sigma) with NeMo's boundary rules: a big
blank of duration d at (t, u) lands on (t + d, u); allowed iff t + d <= T - 1,
or t + d == T on the last row (u == U).
"""

import math

import numpy as np
import torch

from chainfb import Fst, FstBatch, Lattice


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


def _symbol(u, kind, targets, blank):
    """The vocabulary index a move of ``kind`` reads at label position ``u``
    (0 blank, 1 the label ``targets[u]``, 2 + i big blank i at ``blank - 1 - i``)."""
    if kind == 0:
        return blank
    if kind == 1:
        return int(targets[u])
    return blank - 1 - (kind - 2)


def enumerate_loglike(lp, targets, T, U, blank, durations=(), sigma=0.0):
    """log P of one utterance from log-probs ``lp [T', U'+1, V]`` (torch, float64) by enumeration."""
    paths = enumerate_paths(T, U, durations)
    if not paths:
        return lp.new_tensor(-math.inf)

    def sym(u, kind):
        return _symbol(u, kind, targets, blank)

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
        return _symbol(u, kind, targets, blank)

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


def rnnt_reference(logits, targets, T_len, U_len, blank):
    """Direct float64 alpha recursion in torch (differentiable): -logP per utterance."""
    lp = torch.log_softmax(logits, dim=-1)
    out = []
    for b in range(logits.shape[0]):
        T, U = int(T_len[b]), int(U_len[b])
        alpha = {}
        for t in range(T):
            for u in range(U + 1):
                if t == 0 and u == 0:
                    alpha[t, u] = logits.new_zeros(())
                    continue
                terms = []
                if t > 0:
                    terms.append(alpha[t - 1, u] + lp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t, u - 1] + lp[b, t, u - 1, targets[b, u - 1]])
                alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
        out.append(-(alpha[T - 1, U] + lp[b, T - 1, U, blank]))
    return torch.stack(out)


def rnnt_step_case(rng, B=3, T=5, Umax=3, V=6, blank=0, T_len=(5, 3, 4), U_len=(3, 1, 0)):
    """Random float64 logits, the step graphs (state u: blank self-loop with
    pdf 2u, label arc u -> u+1 with pdf 2u+1), their lattice, the column
    layout ``colidx``, the score-map arguments (``sym``: kind 0 the blank,
    kind 1 the label) and the reference's ``targets`` / ``blank``."""
    T_len = np.asarray(T_len)
    U_len = np.asarray(U_len)
    targets = rng.integers(1, V, (B, Umax))
    logits = rng.normal(size=(B, T, Umax + 1, V))
    fsts = []
    for b in range(B):
        U = int(U_len[b])
        arcs = [(u, u, 2 * u, 0.0) for u in range(U + 1)] + [(u, u + 1, 2 * u + 1, 0.0) for u in range(U)]
        fsts.append(Fst.from_arcs(arcs, {U: 0.0}, num_states=U + 1))
    lat = Lattice.of(FstBatch(fsts))
    col_off = np.searchsorted(lat.col_seq, np.arange(B + 1))
    colidx = -np.ones((B, Umax + 1, 2), dtype=np.int32)
    for b in range(B):
        for u in range(U_len[b] + 1):
            colidx[b, u, 0] = col_off[b] + 2 * u
            if u < U_len[b]:
                colidx[b, u, 1] = col_off[b] + 2 * u + 1
    sym = np.stack([np.full((B, Umax + 1), blank), np.pad(targets, ((0, 0), (0, 1)), constant_values=-1)], axis=2)
    sym[:, :, 1][np.arange(Umax + 1)[None, :] >= U_len[:, None]] = -1
    args = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len)
    return logits, lat, args, T + Umax, T_len, U_len, dict(targets=targets, blank=blank)
