"""The SciPy shared-graph engine: many sequences over ONE graph (the LF-MMI
denominator), scaled probability domain with sparse matrix products,
float64.

The engine protocol (see :mod:`chainfb.engines`) on lattices whose
sequences all map to one graph (:func:`shared_graph`): same quantities as
:func:`chainfb.engines.numpy_log.forward_backward` (same definition of the
log-likelihood, the posteriors and the leaky-HMM option), but the graph is
not replicated per sequence: states x sequences arrays are
multiplied by sparse matrices built once per graph.  Arcs are grouped by
``(destination, pdf)``; ``W[src, g]`` sums the probabilities of the arcs of
group ``g`` leaving ``src``, so one frame is::

    pre   = W^T a_t                      [G, N]
    a_t+1 = D (e_t[pdf(g)] * pre) / s_t  (D: group -> destination; s_t the per-sequence sum)

with ``e_t = exp(x_t - max_k x_t)`` and the log of the scales accumulated
(Kaldi's denominator recursion, generalised).  The backward pass is the
transpose.  Exact up to float64 underflow of path-weight *ratios* below
~1e-300 within one frame: with scores spread over more than ~700 nats in
one frame (never the case for Kaldi's clamped [-30, 30] denominator
scores) a live sequence could be reported as impossible.  Arc weights
and finals enter shifted by their maxima, so any weight is fine; the
spread of the arc weights adds to the scores' spread.  The dispatcher
(:func:`chainfb.engines.select`) only picks this engine when
:func:`is_exact`: finite scores whose per-frame spread plus the arc
weights' spread is less than :data:`MAX_SPREAD` nats.
Impossible sequences give ``-inf`` and zero posteriors.  Knows nothing
about what the graph means.

Arcs that span frames (``span > 1``, see :mod:`chainfb.engines`) are
grouped by span, one set of sparse matrices per span ``k``; frame ``t``
sums ``D_k (e_{t-k} * W_k^T a_{t-k})`` over the spans, each rescaled by the
scales of the frames between (per-frame log increments, summed over at most
``k`` frames) relative to the largest contribution (see
:meth:`_SharedGraph._run_spans`).  No leaky HMM with spans (ValueError), and
:func:`is_exact` is False for such graphs, so the automatic choice runs them
on the exact engines; ``engine="shared"`` runs them here.

The lattice's columns of sequence ``n`` are the graph's distinct pdfs in
sorted order (see :class:`~chainfb.lattice.Lattice`), so ``X [T, C]`` is
``[T, N, K]`` in memory.  The sparse matrices are built once per graph and
kept by the batch's :meth:`~chainfb.batch.FstBatch.cache` (shared by every batch size, see
:meth:`chainfb.FstBatch.with_sequences`); the lattice's per-sequence arcs
are never read.  Sequences run in groups whose stored alphas ``[T+1, S,
n]`` take at most :data:`ALPHA_BYTES` per thread, so a call's memory does
not grow with the batch beyond its scores and posteriors.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..fst import Fst
from ..lattice import Lattice
from .threads import MIN_PARALLEL_WORK, get_num_threads, parallel, split

__all__ = ["forward_backward", "best_path", "shared_graph", "is_exact", "MAX_SPREAD", "ALPHA_BYTES"]

#: per-frame span of finite scores (nats) above which the scaled domain could underflow
MAX_SPREAD = 600.0
#: the most bytes of stored alphas one thread holds at a time (sequences run in groups within it).
#: Smaller groups make the sparse products less efficient: on the 3,379-state denominator
#: (T = 150, 128 sequences, 2 threads) 48 MiB (groups of 12) costs about a quarter more time than
#: one group per thread (then ~570 MB of alphas); 96 MiB about 5 %.
ALPHA_BYTES = 48 * 2**20


def shared_graph(lat: Lattice) -> Fst | None:
    """The one :class:`Fst` all of ``lat``'s sequences run on, or None."""
    return lat.shared_fst


def is_exact(lat: Lattice, X: np.ndarray) -> bool:
    """Whether this engine gives the exact engine's numbers on ``lat`` and
    ``X [T, C]``: every score finite, and each frame's score spread plus the
    spread of the graph's finite arc weights below :data:`MAX_SPREAD` nats
    (and the spread of its finite finals too), so that no path-weight ratio
    within a frame can underflow.  The weights themselves may be anything:
    they enter shifted by their maximum.  False for arcs that span several
    frames (``lat.max_span > 1``): this engine runs them when asked for by
    name, and the automatic choice keeps them on the exact engines."""
    if getattr(lat, "max_span", 1) > 1:
        return False
    X = np.asarray(X)
    if X.size and not np.isfinite(X).all():
        return False
    g = _matrices(lat)
    spread = float((X.max(axis=1) - X.min(axis=1)).max()) if X.size else 0.0
    return spread + g.weight_spread < MAX_SPREAD and g.final_spread < MAX_SPREAD


def _matrices(lat: Lattice) -> _SharedGraph:
    """The shared graph's sparse matrices (built once per graph, cached in
    the batch's memo, :meth:`~chainfb.batch.FstBatch.cache`)."""
    return lat.batch.cache(("scipy_shared", "matrices", lat.graph), lambda: _SharedGraph(lat.shared_fst))


def forward_backward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, leaky: tuple[float, np.ndarray] | None = None,
                     need_posteriors: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Forward-backward of a shared-graph lattice (protocol of
    :func:`chainfb.engines.numpy_log.forward_backward`; ``leaky``'s
    ``log_init`` is the graph's ``[Sg]``, or ``[S]`` with the same values
    for every sequence's instance).

    Parameters
    ----------
    lat : Lattice whose sequences all use one graph.
    X : float64 ``[T, C]`` compact scores.
    lengths : int64 ``[N]`` in ``[0, T]``.

    Returns
    -------
    loglike : float64 ``[N]``; posteriors : float64 ``[T, C]`` or None.
    """
    fst = shared_graph(lat)
    if fst is None:
        raise ValueError("lat: the shared-graph engine needs every sequence to use one graph")
    N = lat.num_sequences
    X = np.asarray(X)
    T, C = X.shape
    eng = _matrices(lat)
    K = eng.num_columns
    if C != N * K:
        raise ValueError(f"X: expected [T, {N * K}] columns for {N} sequences of {K} pdfs, got {tuple(X.shape)}")
    if leaky is not None:
        Sg = fst.num_states
        log_init = np.asarray(leaky[1], dtype=np.float64)
        if log_init.shape != (Sg,):
            if log_init.shape != (N * Sg,):
                raise ValueError(f"leaky: log_init must have shape ({Sg},) or ({N * Sg},), got {log_init.shape}")
            per_seq = log_init.reshape(N, Sg)
            if N and not (per_seq == per_seq[:1]).all():
                raise ValueError("leaky: the shared-graph engine needs the same log_init for every sequence")
            log_init = per_seq[0] if N else np.zeros(Sg)
        leaky = (leaky[0], log_init)
    Xs = X.reshape(T, N, K).transpose(1, 0, 2)
    loglike, post = eng.forward_backward(Xs, lengths, need_posteriors, leaky)
    if post is not None:
        post = np.ascontiguousarray(post.transpose(1, 0, 2)).reshape(T, C)
    return loglike, post


def best_path(lat: Lattice, X: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Viterbi: the NumPy engine's max-semiring pass (the scaled domain has
    no advantage there)."""
    from . import numpy_log

    return numpy_log.best_path(lat, X, lengths)


class _SharedGraph:
    """Sparse matrices of one :class:`Fst` and the forward-backward of ``N``
    sequences over it.  Its distinct pdfs (sorted, arcs of any weight) are
    the columns: ``self.pdfs`` ``[K]``.
    """

    def __init__(self, fst: Fst):
        if not isinstance(fst, Fst):
            raise TypeError(f"fst: expected chainfb.Fst, got {type(fst).__name__}")
        self.fst = fst
        S = fst.num_states
        self.pdfs, all_col = np.unique(fst.pdf, return_inverse=True)
        ok = fst.log_prob > -np.inf
        src, dst, col = fst.src[ok], fst.dst[ok], all_col.reshape(-1)[ok]
        w = fst.log_prob[ok]
        # arc weights and finals enter shifted by their maxima (added back to the log-likelihood), so
        # no weight overflows; their spreads decide, with the scores', whether any can underflow
        self.weight_shift = float(w.max()) if w.size else 0.0
        self.weight_spread = float(w.max() - w.min()) if w.size else 0.0
        prob = np.exp(w - self.weight_shift)
        K = len(self.pdfs)
        gkey = dst * max(K, 1) + col
        gu, gidx = np.unique(gkey, return_inverse=True)
        G = len(gu)
        self.group_dst = gu // max(K, 1)
        self.group_col = gu % max(K, 1)
        self.num_states, self.num_groups, self.num_columns = S, G, K
        # W^T [G, S] (csr) and W [S, G] (csr), duplicates summed
        WT = sp.csr_matrix((prob, (gidx, src)), shape=(G, S))
        WT.sum_duplicates()
        self.WT = WT
        self.W = WT.T.tocsr()
        ones = np.ones(G)
        self.D = sp.csr_matrix((ones, (self.group_dst, np.arange(G))), shape=(S, G))
        self.DT = self.D.T.tocsr()
        self.P = sp.csr_matrix((ones, (self.group_col, np.arange(G))), shape=(K, G))
        # arcs that span frames: one set of matrices per span (None when every arc spans one frame)
        self.by_span = None
        if fst.max_span > 1:
            self.by_span = []
            for k in np.unique(fst.span[ok]):
                sel = fst.span[ok] == k
                gu_k, gi_k = np.unique(gkey[sel], return_inverse=True)
                Gk = len(gu_k)
                gd, gc = gu_k // max(K, 1), gu_k % max(K, 1)
                WTk = sp.csr_matrix((prob[sel], (gi_k.reshape(-1), src[sel])), shape=(Gk, S))
                WTk.sum_duplicates()
                onesk = np.ones(Gk)
                Dk = sp.csr_matrix((onesk, (gd, np.arange(Gk))), shape=(S, Gk))
                Pk = sp.csr_matrix((onesk, (gc, np.arange(Gk))), shape=(K, Gk))
                self.by_span.append((int(k), WTk, WTk.T.tocsr(), Dk, Dk.T.tocsr(), Pk, gc))
        fin = fst.final[fst.final > -np.inf]
        self.final_shift = float(fin.max()) if fin.size else 0.0
        self.final_spread = float(fin.max() - fin.min()) if fin.size else 0.0
        self.final = np.exp(fst.final - self.final_shift)

    def forward_backward(self, X, lengths, need_posteriors: bool = True, leaky=None):
        """Log-likelihoods and column posteriors; large calls are split by
        sequence over :func:`chainfb.engines.get_num_threads` threads (SciPy's
        sparse products and NumPy release the GIL), and each thread runs its
        sequences in groups whose alphas fit in :data:`ALPHA_BYTES`.  See
        :meth:`_run`."""
        X = np.asarray(X)
        if X.ndim != 3:
            return self._run(X, lengths, need_posteriors, leaky)
        N, T = X.shape[:2]
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != (N,):
            raise ValueError(f"lengths: expected [{N}] ints in [0, {T}]")
        # one part per thread, of at least 8 sequences each, all of one cost (arcs x frames)
        ranges = split(np.full(N, float(self.fst.num_arcs * T)), min(get_num_threads(), N // 8),
                       MIN_PARALLEL_WORK["shared"], parts_per_thread=1)
        group = max(1, ALPHA_BYTES // (8 * (T + 1) * max(self.num_states, 1)))

        def run(a, b):  # sequences a..b-1, a group at a time
            return [self._run(X[s:min(s + group, b)], lengths[s:min(s + group, b)], need_posteriors, leaky)
                    for s in range(a, b, group)]

        if len(ranges) == 1:
            res = run(0, N)
        else:
            res = [r for part in parallel(lambda ab: run(*ab), ranges) for r in part]
        if len(res) == 1:
            return res[0]
        if not res:
            return self._run(X, lengths, need_posteriors, leaky)
        loglike = np.concatenate([r[0] for r in res])
        post = np.concatenate([r[1] for r in res]) if need_posteriors else None
        return loglike, post

    def _inverse_totals(self, alphas, lengths, loglike):
        """``(ok [N], 1 / P_hat [N])``: the sequences with a path and the
        inverse of their total in the scaled domain, ``P_hat = sum_i
        alpha'_L(i) final(i)`` (0 for sequences without a path)."""
        ok = np.isfinite(loglike)
        p_hat = np.ones(len(loglike))
        for n in np.flatnonzero(ok):
            p_hat[n] = (alphas[lengths[n], :, n] * self.final).sum()
        return ok, np.where(ok, 1.0 / p_hat, 0.0)

    def _run(self, X, lengths, need_posteriors: bool = True, leaky=None):
        """Log-likelihoods and column posteriors.

        Parameters
        ----------
        X : float ``[N, T, K]`` — scores of the graph's columns ``self.pdfs``
            (``X[..., k]`` is the score of pdf ``self.pdfs[k]``).
        lengths : int ``[N]`` in ``[0, T]``.
        leaky : ``(coefficient, log_init [S])`` or None — Kaldi's leaky HMM
            (see :mod:`chainfb.engines.numpy_log`); the initial distribution replaces
            the start state.

        Returns
        -------
        loglike : float64 ``[N]``
        posteriors : float64 ``[N, T, K]`` or None — ``d loglike / d X``.
        """
        X = np.asarray(X)
        if X.ndim != 3 or X.shape[2] != self.num_columns:
            raise ValueError(f"X: expected [N, T, {self.num_columns}], got shape {X.shape}")
        N, T, K = X.shape
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != (N,) or (N and (lengths.min() < 0 or lengths.max() > T)):
            raise ValueError(f"lengths: expected [{N}] ints in [0, {T}]")
        if self.by_span is not None:
            if leaky is not None:
                raise ValueError("leaky: the leaky HMM is not defined for arcs that span several frames")
            return self._run_spans(X, lengths, need_posteriors)
        S = self.num_states
        Tmax = int(lengths.max()) if N else 0
        if leaky is not None:
            c = float(leaky[0])
            init = np.exp(np.asarray(leaky[1], dtype=np.float64))
            if init.shape != (S,):
                raise ValueError(f"leaky: log_init must have shape ({S},), got {init.shape}")
            init = init[:, None]

            def leak(a):
                return a + c * a.sum(axis=0, keepdims=True) * init

            def leak_t(b):
                return b + c * (init * b).sum(axis=0, keepdims=True)
        else:
            leak = leak_t = None
        # per-frame, per-sequence max for scaling; frames past the length use e = 1 (ignored)
        valid = np.arange(T)[None, :] < lengths[:, None]  # [N, T]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m = X.max(axis=2) if K else np.zeros((N, T))
            m = np.where(np.isfinite(m) & valid, m, 0.0)
            # E[t] = exp(x_t - max) as [K, N] (1 past a sequence's length)
            E = np.exp(X[:, :Tmax, :] - m[:, :Tmax, None]).transpose(1, 2, 0).copy()
            E[~valid[:, :Tmax].T[:, None, :].repeat(K, axis=1)] = 1.0
            alphas = np.zeros((Tmax + 1, S, N))
            log_scale = np.zeros(N)
            dead = np.zeros(N, bool)
            a = np.zeros((S, N))
            if leak is None:
                a[self.fst.start] = 1.0
            else:
                a[:] = init
                a = leak(a)
            alphas[0] = a
            scales = np.ones((Tmax, N))
            loglike = np.full(N, -np.inf)
            fin = self.final[:, None]
            for t in range(Tmax + 1):
                ending = np.flatnonzero(lengths == t)
                if ending.size:
                    tot = (a[:, ending] * fin).sum(axis=0)
                    loglike[ending] = np.log(tot) + log_scale[ending] + self.final_shift
                if t == Tmax:
                    break
                e = E[t]  # [K, N]
                pre = self.WT @ a
                pre *= e[self.group_col]
                a = self.D @ pre
                s = a.sum(axis=0)
                bad = ~(s > 0) & valid[:, t]
                dead |= bad
                s = np.where(s > 0, s, 1.0)
                a /= s
                if leak is not None:
                    a = leak(a)
                scales[t] = s
                log_scale += np.where(valid[:, t], np.log(s) + m[:, t] + self.weight_shift, 0.0)
                alphas[t + 1] = a
            loglike[dead] = -np.inf
            loglike[~np.isfinite(loglike)] = -np.inf
            if not need_posteriors:
                return loglike, None
            post = np.zeros((N, T, K))
            ok, inv = self._inverse_totals(alphas, lengths, loglike)
            b = np.zeros((S, N))
            fin_b = fin if leak_t is None else leak_t(np.repeat(fin, 1, axis=1))
            for t in range(Tmax - 1, -1, -1):
                starting = np.flatnonzero((lengths == t + 1) & ok)
                if starting.size:
                    b[:, starting] = fin_b
                e = E[t]  # frames past a length: b is 0 there, so e's value does not matter
                bd = self.DT @ b  # [G, N]: b'_{t+1}(dst g)
                bd *= e[self.group_col]
                pre = self.WT @ alphas[t]
                g = pre * bd
                g *= inv / scales[t]
                post[:, t, :] = (self.P @ g).T
                b = (self.W @ bd) / scales[t]
                if leak_t is not None:
                    b = leak_t(b)
        return loglike, post

    def _run_spans(self, X, lengths, need_posteriors: bool = True):
        """:meth:`_run` (no leaky HMM) for arcs that span several frames,
        one set of matrices per span ``k`` (``self.by_span``)::

            y_k     = D_k (e_{t-k}[pdf(g)] * W_k^T a_{t-k})       [S, N]
            a_t     = sum_k y_k exp(O_{t-k} - O_{t-1} + m_{t-k} - G_t) / s_t

        with ``O_t`` the log of frame ``t``'s scale (kept as per-frame
        increments, so the scale between two frames is a sum of at most
        ``k`` of them), ``G_t`` the largest contribution's log (every
        contribution is at most 1, the largest exactly 1) and ``s_t`` the
        per-sequence sum.  The betas share the forward scales, so that the
        arc posteriors at frame ``t`` are ``a_t W_k e_t b_{t+k}
        exp(O_t + m_t - O_{t+k}) / p_hat`` with one ``p_hat`` per sequence;
        ``b_{t+k}`` is 0 past a sequence's length.  A frame may hold no path
        (every path spans it) without the sequence being impossible."""
        N, T, K = X.shape
        S = self.num_states
        Tmax = int(lengths.max()) if N else 0
        valid = np.arange(T)[None, :] < lengths[:, None]  # [N, T]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m = X.max(axis=2) if K else np.zeros((N, T))
            m = np.where(np.isfinite(m) & valid, m, 0.0)[:, :Tmax].T.copy()  # [Tmax, N]
            E = np.exp(X[:, :Tmax, :] - m.T[:, :, None]).transpose(1, 2, 0).copy()  # [Tmax, K, N]
            E[~valid[:, :Tmax].T[:, None, :].repeat(K, axis=1)] = 1.0
            alphas = np.zeros((Tmax + 1, S, N))
            alphas[0, self.fst.start] = 1.0
            inc = np.zeros((Tmax + 1, N))  # O_t - O_{t-1}, 0 past a sequence's length
            log_scale = np.zeros(N)
            loglike = np.full(N, -np.inf)
            fin = self.final[:, None]
            ending = np.flatnonzero(lengths == 0)
            loglike[ending] = np.log((alphas[0][:, ending] * fin).sum(axis=0)) + self.final_shift
            for t in range(1, Tmax + 1):
                parts = []
                rel = np.zeros(N)  # O_s - O_{t-1} for s = t - k
                for s in range(t - 1, max(t - 1 - max(k for k, *_ in self.by_span), -1), -1):
                    if s < t - 1:
                        rel = rel - inc[s + 1]
                    k = t - s
                    for kk, WT, _, D, _, _, gc in self.by_span:
                        if kk == k:
                            y = D @ ((WT @ alphas[s]) * E[s][gc])
                            ymax = y.max(axis=0)
                            parts.append((y, ymax, rel + m[s]))
                if parts:
                    lk = np.stack([np.where(ymax > 0, np.log(ymax) + r, np.where(ymax == ymax, -np.inf, ymax))
                                   for _, ymax, r in parts])
                    G = lk.max(axis=0)
                    G = np.where(G == -np.inf, 0.0, G)
                    a = np.zeros((S, N))
                    for (y, ymax, r) in parts:
                        a += y * np.where(ymax != 0, np.exp(r - G), 0.0)
                else:
                    G = np.zeros(N)
                    a = np.zeros((S, N))
                s_t = a.sum(axis=0)
                s_t = np.where(s_t > 0, s_t, 1.0)
                a /= s_t
                alphas[t] = a
                inc[t] = np.where(t <= lengths, G + self.weight_shift + np.log(s_t), 0.0)
                log_scale += inc[t]
                ending = np.flatnonzero(lengths == t)
                if ending.size:
                    tot = (a[:, ending] * fin).sum(axis=0)
                    loglike[ending] = np.log(tot) + log_scale[ending] + self.final_shift
            if not need_posteriors:
                return loglike, None
            post = np.zeros((N, T, K))
            ok, inv = self._inverse_totals(alphas, lengths, loglike)
            kmax = max(k for k, *_ in self.by_span)
            ring = np.zeros((kmax + 1, S, N))  # b'_f in slot f % (kmax + 1); 0 past each length
            for t in range(Tmax, -1, -1):
                b = np.zeros((S, N))
                if t < Tmax:
                    for k, WT, W, _, DT, P, gc in self.by_span:
                        if t + k > Tmax:
                            continue
                        # exp(O_t + m_t + w_shift - O_{t+k}), 0 where t + k is past the length
                        f = np.where(t + k <= lengths,
                                     np.exp(m[t] + self.weight_shift - inc[t + 1:t + k + 1].sum(axis=0)), 0.0)
                        bd = (DT @ ring[(t + k) % (kmax + 1)]) * E[t][gc]
                        bd *= f
                        b += W @ bd
                        g = (WT @ alphas[t]) * bd
                        g *= inv
                        post[:, t, :] += (P @ g).T
                starting = np.flatnonzero((lengths == t) & ok)
                b[:, starting] = fin
                ring[t % (kmax + 1)] = b
        return loglike, post
