"""The NumPy engine's passes for lattices whose arcs span several frames
(``Lattice.max_span > 1``), called by :mod:`chainfb.engines.numpy_log`: an
arc read at frame ``t`` lands at frame ``t + span``; these passes gather each
arc's term from the frame it is read at (forward) or lands at (backward),
over the segment layout (:mod:`chainfb.engines.log_segments`).
"""

from __future__ import annotations

import numpy as np

from ..lattice import Lattice
from .log_segments import lattice_segments, logsumexp_segments, mask_past_lengths, max_step, normalise, zero_impossible

__all__ = ["forward_spans", "forward_backward_spans"]



def _logsumexp_by(v: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """``[n]``: the log-sum-exp of the entries of ``v`` with each id
    (``-inf`` for ids without entries; NaN stays with its id)."""
    m = np.full(n, -np.inf)
    np.maximum.at(m, ids, v)
    m[~np.isfinite(m)] = 0.0
    s = np.bincount(ids, weights=np.exp(v - m.take(ids)), minlength=n)
    return np.log(s) + m


def forward_spans(lat: Lattice, X: np.ndarray, lengths: np.ndarray,
                  semiring: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`chainfb.engines.numpy_log._forward` (same arguments and returns) for lattices whose arcs
    may span several frames: an arc of span ``k`` landing at frame ``u`` is
    read at frame ``u - k``, so ``alpha_u(j) = logsum`` over arcs ``i -> j``
    of ``alpha_{u-k}(i) + w + X[u-k, col]`` (``u - k >= 0``).

    ``alpha[u - k]`` is stored relative to ``offset[u - k]`` and frame ``u``'s
    sum is formed relative to ``offset[u - 1]`` (then normalised, as for
    span 1), so each arc's term carries ``offset[u - k] - offset[u - 1]``
    (zero for span 1): exact in the log domain however far back the arc
    reads.  ``back[u - 1, s]`` is the arc landing in ``s`` at frame ``u``."""
    viterbi = semiring == "max"
    N, S = lat.num_sequences, lat.num_states
    Tmax = mask_past_lengths(lat, X, lengths)
    plan = lattice_segments(lat)
    f = lat.fwd
    sos = lat.seq_of_state
    alpha = np.full((Tmax + 1, S), -np.inf)
    offset = np.zeros((Tmax + 1, N))
    back = np.full((Tmax, S), -1, dtype=np.int64) if viterbi else None
    alpha[0, lat.start] = 0.0
    for u in range(1, Tmax + 1):
        read = u - f.span
        early = read < 0  # would be read before frame 0
        read[early] = 0
        v = alpha[read, f.src]
        v += X[read, f.col]
        v += f.log_prob
        if not viterbi:
            v += offset[read, f.seq] - offset[u - 1].take(f.seq)
        v[early] = -np.inf
        if viterbi:
            alpha[u] = max_step(plan, f, v, back[u - 1], S)
            continue
        a = np.full(S, -np.inf)
        a[f.key_states] = logsumexp_segments(v, plan.fwd)
        offset[u] = offset[u - 1] + normalise(plan, sos, a)
        alpha[u] = a
    if not N:
        return alpha, offset, np.zeros(0), np.zeros(0), back
    end = alpha[lengths[sos], np.arange(S)] + lat.final
    total = plan.seqs.max(end.copy()) if viterbi else logsumexp_segments(end.copy(), plan.seqs)
    return alpha, offset, end, total + offset[lengths, np.arange(N)], back


def forward_backward_spans(lat: Lattice, X: np.ndarray, lengths: np.ndarray,
                           need_posteriors: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`chainfb.engines.numpy_log._forward_backward_serial` for lattices whose arcs may span
    several frames.

    Betas: ``beta_t(i) = logsum`` over arcs ``i -> j`` of ``w + X[t, col] +
    beta_{t+k}(j)`` (``t + k <= L``), stored normalised per sequence and
    frame with offsets ``boff[t]`` (each arc's term carries ``boff[t + k] -
    boff[t + 1]``, as in the forward pass).

    Posteriors: every path of sequence ``n`` crosses the cut between frames
    ``t`` and ``t + 1`` (``t < L``) on exactly one arc -- the arc read at
    some ``t' <= t`` with ``t' + k > t`` --, so the log-sum over those arcs of
    ``alpha_{t'} + w + X[t', col] + beta_{t'+k}`` is ``loglike`` in exact
    arithmetic.  Arc posteriors at frame ``t`` are normalised by that cut's
    total, formed relative to ``offset[t] + boff[t + 1]`` (short offset
    differences only), as the span-1 passes normalise by each frame's own
    total."""
    T, C = X.shape
    N, S = lat.num_sequences, lat.num_states
    plan = lattice_segments(lat)
    sos = lat.seq_of_state
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        alpha, offset, _, loglike, _ = forward_spans(lat, X, lengths, "log")
        if not need_posteriors:
            return loglike, None
        Tmax = alpha.shape[0] - 1
        b = lat.bwd
        beta = np.full((Tmax + 1, S), -np.inf)
        boff = np.zeros((Tmax + 1, N))
        post = np.zeros((T, C))
        state_len = lengths[sos]
        # arcs read before frame t that cross the cut after t: those of span > j, read at t - j; an arc longer
        # than every sequence is on no path and left out, so the work follows the spans that can occur
        cand = np.flatnonzero((b.span > 1) & (b.span <= Tmax))
        K = int(b.span[cand].max()) if cand.size else 1
        for t in range(Tmax, -1, -1):
            bt = np.full(S, -np.inf)
            if t < Tmax:
                land = t + b.span
                late = land > Tmax
                land[late] = Tmax
                w = beta[land, b.dst]
                w += X[t].take(b.col)
                w += b.log_prob
                w += boff[land, b.seq] - boff[t + 1].take(b.seq)
                w[late] = -np.inf
                bt[b.key_states] = logsumexp_segments(w.copy(), plan.bwd)
                base = boff[t + 1].copy()
            else:
                base = np.zeros(N)
            ends = np.flatnonzero(state_len == t)
            if ends.size:
                bt[ends] = lat.final[ends]
                base[lengths == t] = 0.0
            boff[t] = base + normalise(plan, sos, bt)
            beta[t] = bt
            if t == Tmax:
                continue
            g = w + alpha[t].take(b.src)  # relative to offset[t] + boff[t + 1]
            terms, ids = [g], [b.seq]
            for j in range(1, min(K, t + 1)):
                r = t - j
                sel = cand[b.span[cand] > j]
                sel = sel[t - j + b.span[sel] <= Tmax]
                seq = b.seq[sel]
                land = r + b.span[sel]
                v = alpha[r].take(b.src[sel]) + X[r].take(b.col[sel]) + b.log_prob[sel]
                v += beta[land, b.dst[sel]]
                v += offset[r].take(seq) - offset[t].take(seq)
                v += boff[land, seq] - boff[t + 1].take(seq)
                terms.append(v)
                ids.append(seq)
            z = _logsumexp_by(np.concatenate(terms), np.concatenate(ids), N)
            z[np.isneginf(z)] = np.inf  # no path across this cut: posteriors exp(-inf) = 0
            g -= z.take(b.seq)
            np.exp(g, out=g)
            post[t] = np.bincount(b.col, weights=g, minlength=C)
    return loglike, zero_impossible(lat, loglike, lengths, post)
