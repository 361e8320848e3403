"""The NumPy engine: forward-backward and Viterbi over a lattice, log domain,
float64.

Runs on a :class:`~chainfb.lattice.Lattice` and a compact score matrix
``X[T, C]`` (one column per distinct ``(sequence, pdf)``; see
:mod:`chainfb.score_map`).  It knows nothing about where the scores came
from: numerator graphs, denominator graphs and transducer step graphs all
arrive here as lattices and columns.

For sequence ``n`` with ``L = lengths[n]`` frames::

    alpha_0(s)     = 0 if s is the start state else -inf
    alpha_{t+1}(j) = logsum_{arcs i->j} alpha_t(i) + w(arc) + X[t, col(arc)]
    loglike[n]     = logsum_s alpha_L(s) + final(s)
    beta_L(s)      = final(s)
    beta_t(i)      = logsum_{arcs i->j} w(arc) + X[t, col(arc)] + beta_{t+1}(j)
    post[t, c]     = sum over arcs with column c of
                     exp(alpha_t(i) + w + X[t, c] + beta_{t+1}(j) - loglike[n])

Alphas and betas are kept normalised per sequence and frame (each frame's
maximum is divided out and its log accumulated in float64), and arc
posteriors at frame ``t`` are normalised by that frame's own total
``logsum_i alpha_t(i) + beta_t(i)`` rather than by ``loglike``: in exact
arithmetic the two are equal, but the per-frame total carries no large
offsets, so per-frame posterior sums stay at 1 to ~1e-9 even for
``T = 20000`` and scores of magnitude ``1e4``.  A sequence with no complete
path gets ``-inf`` and zero posteriors.

Arc layouts: when every state has at most :data:`DENSE_MAX_DEGREE` arcs in
(forward) or out (backward) and padding costs little, a side's arcs are laid
out densely as ``[R, K]`` (one row per state, padded with ``-inf`` arcs), so
each frame's reduction is a fixed-axis log-sum-exp instead of a segment
reduction, and the backward pass keeps each frame's normalised out-arc
weights so that the posteriors of a chunk of frames are formed and summed
per column in a few array operations (one sparse product) after the
chunk's betas; other graphs use the segment layout.  Both give the same
numbers (to rounding).

Semirings: the forward recursion is written once (:func:`_forward`), with
log-sum (``semiring="log"``, forward-backward) or max with back-pointers
(``semiring="max"``, :func:`best_path`) as the per-destination reduction, as
k2 does with its ``log_semiring`` flag.

Leaky HMM (Kaldi's denominator, ``leaky=(c, log_init)``): the initial
distribution is ``init`` instead of the start state, and every frame's
alphas (frame 0 and frame L included) become
``alpha'(i) = alpha(i) + c * sum_j alpha(j) * init(i)`` (sums per sequence);
the betas get the transposed map ``beta'(i) = beta(i) + c * sum_j init(j) *
beta(j)``.  Arc posteriors use ``alpha'_t`` and ``beta'_{t+1}``.
"""

from __future__ import annotations

import numpy as np

from ..lattice import Lattice
from .log_segments import DENSE_MAX_DEGREE, Segments, logsumexp_segments  # noqa: F401 -- also served from here
from .log_segments import LatticeSegments as _LatticeSegments
from .log_segments import arc_scores as _arc_scores
from .log_segments import chunk_frames as _chunk_frames
from .log_segments import dense_scores as _dense_scores
from .log_segments import first_of_segments as _first_of_segments
from .log_segments import lattice_segments as _segments
from .log_segments import logsumexp_slots as _logsumexp_slots
from .log_segments import mask_past_lengths as _mask_past_lengths
from .log_segments import max_step as _max_step
from .log_segments import normalise as _normalise
from .log_segments import zero_impossible as _zero_impossible
from .numpy_spans import forward_backward_spans as _forward_backward_spans
from .numpy_spans import forward_spans as _forward_spans
from .threads import MIN_PARALLEL_WORK, get_num_threads, parallel, split

try:  # y += A @ x for a CSR matrix, without scipy.sparse's per-call overhead
    from scipy.sparse._sparsetools import csr_matvec as _csr_matvec
except ImportError:  # pragma: no cover - other SciPy layouts
    def _csr_matvec(n_row, n_col, indptr, indices, data, x, y):
        from scipy.sparse import csr_matrix

        y += csr_matrix((data, indices, indptr), shape=(n_row, n_col)) @ x

__all__ = ["forward_backward", "best_path", "logsumexp_segments", "Segments"]


def forward_backward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, leaky: tuple[float, np.ndarray] | None = None,
                     need_posteriors: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Forward-backward over a lattice (the engine protocol, see :mod:`chainfb.engines`).

    Parameters
    ----------
    lat : Lattice
    X : float64 ``[T, C]``
        Compact scores.  Entries at frames ``t >= lengths[seq]`` are ignored
        (``X`` is modified in place: they are set to ``-inf``).
    lengths : int64 ``[N]``, each in ``[0, T]``.
    leaky : ``(coefficient, log_init)`` or None
        Leaky-HMM option: ``log_init`` float64 ``[S]`` is the log initial
        distribution over the lattice's states (per sequence) -- or ``[Sg]``
        over the graph's states when every sequence uses one graph --, and
        ``coefficient`` in ``(0, 1)``.
    need_posteriors : bool
        False runs the forward pass only.

    Returns
    -------
    loglike : float64 ``[N]``
    posteriors : float64 ``[T, C]`` or ``None``
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if leaky is not None:
        if lat.max_span > 1:
            raise ValueError(f"leaky: the leaky HMM does not run arcs that span several frames "
                             f"(max span {lat.max_span})")
        leaky = (leaky[0], lat.state_values(leaky[1]))
    threads = min(get_num_threads(), lat.num_sequences)
    ranges = split(np.diff(lat.arc_offsets) + 1.0, threads, MIN_PARALLEL_WORK["numpy"], parts_per_thread=1)
    if len(ranges) == 1 or not lengths.size or lengths.max() == 0:
        return _forward_backward_serial(lat, X, lengths, need_posteriors, leaky)
    parts = lat.parts(ranges)

    def run(part):
        seqs, states, cols, sub = part
        lk = None if leaky is None else (leaky[0], np.asarray(leaky[1])[states])
        return _forward_backward_serial(sub, X[:, cols], lengths[seqs], need_posteriors, lk)

    results = parallel(run, parts)
    loglike = np.concatenate([r[0] for r in results])
    if not need_posteriors:
        return loglike, None
    post = np.empty(X.shape)
    for (_, _, cols, _), (_, p) in zip(parts, results):
        post[:, cols] = p
    return loglike, post


class _Leak:
    """Kaldi's leaky-HMM maps for ``leaky = (c, log_init [S])``."""

    def __init__(self, lat: Lattice, plan: _LatticeSegments, leaky):
        with np.errstate(divide="ignore"):
            self.log_c = float(np.log(leaky[0]))  # c = 0: no leak, but still the initial distribution
        self.log_init = lat.state_values(leaky[1])
        self.sos, self.seqs = lat.seq_of_state, plan.seqs

    def alpha(self, a):
        tot = logsumexp_segments(a.copy(), self.seqs)
        return np.logaddexp(a, self.log_c + tot[self.sos] + self.log_init)

    def beta(self, b):
        tot = logsumexp_segments(b + self.log_init, self.seqs)
        return np.logaddexp(b, self.log_c + tot[self.sos])


def _forward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, semiring: str, leak: _Leak | None = None):
    """The forward recursion, once for both semirings.

    ``semiring="log"``: ``alpha[t]`` normalised per sequence, with the log of
    what was divided out up to frame ``t`` in ``offset[t, n]``.
    ``semiring="max"``: ``alpha`` is Viterbi's ``delta`` (not normalised,
    ``offset`` stays 0) and ``back[t, s]`` is the winning arc into state
    ``s`` at frame ``t`` (a position in ``lat.fwd``), ``-1`` if none.

    Returns ``(alpha [Tmax + 1, S], offset [Tmax + 1, N], end [S], total [N],
    back or None)`` where ``end`` is each state's (normalised) alpha at its
    sequence's length plus its final log-prob and ``total`` the log-sum (or
    max) of ``end`` over each sequence's states, offsets added back.
    """
    if lat.max_span > 1:
        return _forward_spans(lat, X, lengths, semiring)
    viterbi = semiring == "max"
    N, S = lat.num_sequences, lat.num_states
    Tmax = _mask_past_lengths(lat, X, lengths)
    plan = _segments(lat)
    f = lat.fwd
    sos = lat.seq_of_state
    chunk = _chunk_frames(lat, Tmax)
    alpha = np.full((Tmax + 1, S), -np.inf)
    offset = np.zeros((Tmax + 1, N))
    back = np.full((Tmax, S), -1, dtype=np.int64) if viterbi else None
    if leak is None:
        alpha[0, lat.start] = 0.0
    else:
        alpha[0] = leak.alpha(leak.log_init)
        offset[0] = _normalise(plan, sos, alpha[0])
    dense = plan.dense_fwd if not viterbi else None
    if dense is not None:
        chunk = _chunk_frames(lat, Tmax, dense.log_prob.size)
    for t in range(Tmax):
        if dense is not None:
            if t % chunk == 0:
                wx = _dense_scores(X, t, min(Tmax, t + chunk), dense)
            v = alpha[t].take(dense.other)
            v += wx[t % chunk]
            lse = _logsumexp_slots(v)[0]
            a = alpha[t + 1]  # -inf where no arc enters
            if dense.all_rows:
                a[:] = lse
            else:
                a[dense.rows] = lse
            if leak is not None:
                a[:] = leak.alpha(a)
            offset[t + 1] = offset[t] + _normalise(plan, sos, a)
            continue
        if t % chunk == 0:
            wx = _arc_scores(X, t, min(Tmax, t + chunk), f)
        v = alpha[t].take(f.src)
        v += wx[t % chunk]
        if viterbi:
            alpha[t + 1] = _max_step(plan, f, v, back[t], S)
            continue
        a = np.full(S, -np.inf)
        a[f.key_states] = logsumexp_segments(v, plan.fwd)
        if leak is not None:
            a = leak.alpha(a)
        offset[t + 1] = offset[t] + _normalise(plan, sos, a)
        alpha[t + 1] = a
    if not N:
        return alpha, offset, np.zeros(0), np.zeros(0), back
    end = alpha[lengths[sos], np.arange(S)] + lat.final
    total = plan.seqs.max(end.copy()) if viterbi else logsumexp_segments(end.copy(), plan.seqs)
    return alpha, offset, end, total + offset[lengths, np.arange(N)], back


def _next_beta(beta, t, leak, ends_at, final, plan, sos):
    """``beta_t`` as the next (earlier) frame's recursion reads it: the leaky
    map, the final weights of the sequences that end at ``t``, and the
    per-sequence normalisation."""
    if leak is not None:
        beta = leak.beta(beta)
    idx = ends_at.get(t)
    if idx is not None:
        beta[idx] = final[idx]
    _normalise(plan, sos, beta)
    return beta


def _forward_backward_serial(lat, X, lengths, need_posteriors, leaky):
    T, C = X.shape
    N = lat.num_sequences
    S = lat.num_states
    lengths = np.asarray(lengths, dtype=np.int64)
    plan = _segments(lat)
    if N == 0:
        return np.zeros(0), (np.zeros((T, C)) if need_posteriors else None)
    if lat.max_span > 1:
        return _forward_backward_spans(lat, X, lengths, need_posteriors)
    b = lat.bwd
    sos = lat.seq_of_state
    state_len = lengths[sos]
    leak = None if leaky is None else _Leak(lat, plan, leaky)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        alpha, _, _, loglike, _ = _forward(lat, X, lengths, "log", leak)
        if not need_posteriors:
            return loglike, None
        Tmax = alpha.shape[0] - 1
        chunk = _chunk_frames(lat, Tmax)

        # Arc posteriors at frame t are normalised by that frame's own total
        # Z_t = logsum_i alpha_t(i) + beta_t(i) (before the leaky map), which
        # equals loglike in exact arithmetic but carries no large offsets.
        post = np.zeros((T, C))
        final = lat.final if leak is None else leak.beta(lat.final)
        beta = np.where(state_len == Tmax, final, -np.inf)
        ends_at = {int(L): np.flatnonzero(state_len == L) for L in np.unique(lengths) if L < Tmax}
        if plan.dense_bwd is not None:
            _backward_dense(lat, plan, X, alpha, beta, final, ends_at, leak, post)
            return loglike, _zero_impossible(lat, loglike, lengths, post)
        for t in range(Tmax - 1, -1, -1):
            if t == Tmax - 1 or t % chunk == chunk - 1:
                c0 = t - t % chunk
                wx = _arc_scores(X, c0, t + 1, b)
            w = beta.take(b.dst)
            w += wx[t - c0]
            g = w.copy()
            beta = np.full(S, -np.inf)
            beta[b.key_states] = logsumexp_segments(w, plan.bwd)
            z = logsumexp_segments(alpha[t] + beta, plan.seqs)
            z[np.isneginf(z)] = np.inf  # no path through frame t: posteriors exp(-inf) = 0
            g += (alpha[t] - z.take(sos)).take(b.src)
            np.exp(g, out=g)
            post[t] = np.bincount(b.col, weights=g, minlength=C)
            beta = _next_beta(beta, t, leak, ends_at, final, plan, sos)
    return loglike, _zero_impossible(lat, loglike, lengths, post)


def _backward_dense(lat, plan, X, alpha, beta, final, ends_at, leak, post):
    """The backward pass in the dense layout, filling ``post`` (see
    :func:`_forward_backward_serial` for the definitions).  For each frame
    it keeps the betas before the leaky map and normalisation, ``B_t(i) =
    logsum_{arcs i->j} w + X + beta_{t+1}(j)``, and the arcs' shares of
    them, ``e / sum(e)``; once a chunk of frames is done, the arc posteriors
    are ``exp(alpha_t(i) + B_t(i) - Z_t) * share`` with ``Z_t = logsum_i
    alpha_t(i) + B_t(i)`` per sequence, summed into columns."""
    d = plan.dense_bwd
    S, sos = lat.num_states, lat.seq_of_state
    Tmax = alpha.shape[0] - 1
    K, R = d.other.shape
    chunk = max(1, _chunk_frames(lat, Tmax, d.log_prob.size) // 2)
    seq_starts = lat.state_offsets[:-1]
    to_cols = d.to_columns()
    C = post.shape[1]
    for c1 in range(Tmax, 0, -chunk):
        c0 = max(0, c1 - chunk)
        wx = _dense_scores(X, c0, c1, d)  # becomes the arcs' shares e
        sums = np.empty((c1 - c0, R))
        B = np.full((c1 - c0, S), -np.inf) if not d.all_rows else np.empty((c1 - c0, S))
        for t in range(c1 - 1, c0 - 1, -1):
            w = wx[t - c0]
            w += beta.take(d.other)
            lse, sums[t - c0] = _logsumexp_slots(w)
            if d.all_rows:
                B[t - c0] = lse
                beta = lse.copy()
            else:
                B[t - c0, d.rows] = lse
                beta = B[t - c0].copy()
            beta = _next_beta(beta, t, leak, ends_at, final, plan, sos)
        # per-frame totals and state occupancies of the chunk, then arc posteriors
        occ = alpha[c0:c1] + B
        m = np.maximum.reduceat(occ, seq_starts, axis=1)
        m[~np.isfinite(m)] = 0.0
        z = np.exp(occ - m.take(sos, axis=1))
        z = np.log(np.add.reduceat(z, seq_starts, axis=1)) + m
        z[np.isneginf(z)] = np.inf  # no path through frame t: posteriors 0
        occ -= z.take(sos, axis=1)
        np.exp(occ, out=occ)
        sums[sums == 0] = 1.0
        q = occ.take(d.rows, axis=1) if not d.all_rows else occ
        q /= sums
        wx *= q[:, None, :]
        for t in range(c0, c1):  # post[t] = to_cols @ shares (a frame's slots are contiguous)
            _csr_matvec(C, K * R, to_cols.indptr, to_cols.indices, to_cols.data, wx[t - c0].reshape(-1), post[t])


def best_path(lat: Lattice, X: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best path of each sequence: :func:`_forward` in the max semiring,
    then back-pointers (the engine protocol, see :mod:`chainfb.engines`).

    Parameters
    ----------
    lat : Lattice
    X : float64 ``[T, C]`` compact scores (frames past a length set to -inf in place).
    lengths : int64 ``[N]``, each in ``[0, T]``.

    Returns
    -------
    score : float64 ``[N]``
        ``max`` over complete paths ending exactly at frame ``lengths[n]``
        of the arc log-probs + scores + final log-prob; ``-inf`` if there is
        none.
    arcs : int64 ``[N, max(lengths)]``
        ``arcs[n, t]``: the best path's arc read at frame ``t``, as an index
        into the FstBatch's flat arc arrays; ``-1`` at frames inside an arc
        that spans several frames (covered, not read), past each length and
        for sequences without a path.  Ties: the first winning arc in the
        lattice's arc order, at the first best final state.
    """
    N = lat.num_sequences
    lengths = np.asarray(lengths, dtype=np.int64)
    plan = _segments(lat)
    f = lat.fwd
    _, _, end, score, back = _forward(lat, X, lengths, "max")
    Tmax = back.shape[0]
    # the best final state of each sequence (first one on ties)
    state = np.full(N, -1, dtype=np.int64)
    hit = np.flatnonzero((end == score.take(plan.seqs.seg_of)) & (end > -np.inf))
    seq = lat.seq_of_state[hit]
    first = _first_of_segments(seq)
    state[seq[first]] = hit[first]
    arcs = np.full((N, Tmax), -1, dtype=np.int64)
    alive = state >= 0
    if lat.max_span > 1:
        # back[u - 1, s]: the arc landing in s at frame u, read at u - span
        frame = np.where(alive, lengths, 0)
        for u in range(Tmax, 0, -1):
            on = np.flatnonzero(frame == u)
            pos = back[u - 1, state[on]]
            read = u - f.span[pos]
            arcs[on, read] = f.arc[pos]
            state[on] = f.src[pos]
            frame[on] = read
        return score, arcs
    for t in range(Tmax - 1, -1, -1):
        on = np.flatnonzero(alive & (t < lengths))
        pos = back[t, state[on]]
        arcs[on, t] = f.arc[pos]
        state[on] = f.src[pos]
    return score, arcs


# -- arcs that span several frames ------------------------------------------
