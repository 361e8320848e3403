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
from .threads import get_num_threads, parallel

try:  # y += A @ x for a CSR matrix, without scipy.sparse's per-call overhead
    from scipy.sparse._sparsetools import csr_matvec as _csr_matvec
except ImportError:  # pragma: no cover - other SciPy layouts
    def _csr_matvec(n_row, n_col, indptr, indices, data, x, y):
        from scipy.sparse import csr_matrix

        y += csr_matrix((data, indices, indptr), shape=(n_row, n_col)) @ x

__all__ = ["forward_backward", "best_path", "logsumexp_segments", "Segments"]

# below this many arcs per frame the array operations are too short for
# threads to overlap (the Python overhead holds the GIL): one thread
_MIN_PARALLEL_WORK = 100_000


class Segments:
    """Consecutive segments of a 1-D array: ``starts [K]`` and the segment of
    each element, ``seg_of [n]``.  Short segments (a mean under 8) take their
    maxima with ``np.maximum.at``, long ones with ``np.maximum.reduceat``
    (each is several times faster than the other in its own regime)."""

    __slots__ = ("starts", "seg_of", "short")

    def __init__(self, starts: np.ndarray, size: int):
        self.starts = np.asarray(starts, dtype=np.int64)
        lens = np.diff(np.append(self.starts, size))
        self.seg_of = np.repeat(np.arange(len(self.starts)), lens)
        self.short = bool(len(lens)) and size < 8 * len(lens)

    def max(self, v: np.ndarray) -> np.ndarray:
        if self.short:
            m = np.full(len(self.starts), -np.inf)
            np.maximum.at(m, self.seg_of, v)
            return m
        return np.maximum.reduceat(v, self.starts)


def logsumexp_segments(v: np.ndarray, segs: Segments) -> np.ndarray:
    """Log-sum-exp of each segment of ``v`` (``v`` is overwritten).
    Segments of all ``-inf`` give ``-inf``."""
    if v.size == 0:
        return np.full(len(segs.starts), -np.inf)
    m = segs.max(v)
    m[np.isneginf(m)] = 0.0
    v -= m.take(segs.seg_of)
    np.exp(v, out=v)
    s = np.bincount(segs.seg_of, weights=v, minlength=len(segs.starts))
    np.log(s, out=s)
    s += m
    return s


def _logsumexp_slots(v: np.ndarray):
    """Log-sum-exp over the first axis of ``v`` ``[K, R]`` (``v`` is
    overwritten by ``exp(v - max)``); columns of all ``-inf`` give
    ``-inf``.  Returns ``(lse [R], sums [R])``."""
    m = v[0].copy()
    for k in range(1, len(v)):
        np.maximum(m, v[k], out=m)
    np.maximum(m, -1e300, out=m)  # all -inf: exp(-inf - m) = 0, log(0) + m = -inf
    v -= m
    np.exp(v, out=v)
    ssum = v[0].copy()
    for k in range(1, len(v)):
        ssum += v[k]
    lse = np.log(ssum)
    lse += m
    return lse, ssum


def _dense_scores(X, t0, t1, d: _Dense):
    """``w(arc) + X[t, col(arc)]`` in the dense layout: ``[t1 - t0, K, R]``."""
    wx = X[t0:t1].take(d.col, axis=1)
    wx += d.log_prob
    return wx


def _arc_scores(X, t0, t1, side):
    """``w(arc) + X[t, col(arc)]`` for frames ``t0 <= t < t1``: ``[t1 - t0, A]``."""
    wx = X[t0:t1].take(side.col, axis=1)
    wx += side.log_prob
    return wx


def _mask_past_lengths(lat: Lattice, X: np.ndarray, lengths: np.ndarray) -> int:
    """Set ``X[t, c] = -inf`` for frames past the length of column ``c``'s
    sequence (they never contribute); returns the longest length."""
    Tmax = int(lengths.max()) if lengths.size else 0
    if X.shape[1] and Tmax:
        col_len = lengths[lat.col_seq]
        X[:Tmax][np.arange(Tmax)[:, None] >= col_len[None, :]] = -np.inf
    return Tmax


def _chunk_frames(lat: Lattice, Tmax: int, arcs: int | None = None) -> int:
    """Frames whose arc scores are gathered at once (about 32 MB; ``arcs``
    per frame, default the lattice's)."""
    arcs = lat.num_arcs if arcs is None else arcs
    return max(1, min(max(Tmax, 1), 4_000_000 // max(1, arcs)))


#: the largest in/out-degree for which a side's arcs are laid out densely
DENSE_MAX_DEGREE = 16
# ... and the most padding allowed (padded slots / arcs)
_DENSE_MAX_PAD = 2.0


class _Dense:
    """One side's arcs (``lat.fwd``: by destination, ``lat.bwd``: by source)
    as ``[K, R]`` (slot-major, so that reductions over slots run over
    contiguous rows): column ``r`` holds the arcs of state ``rows[r]`` (the
    side's key states), padded with arcs of weight ``-inf``.  ``other`` is each
    arc's other end and ``col`` its column (padding: those of the row's first arc),
    ``log_prob`` its weight; ``all_rows``: every state is a row, in order."""

    def __init__(self, side, other, num_states: int, num_columns: int):
        starts = side.seg_starts
        n = len(side.src)
        lens = np.diff(np.append(starts, n))
        R, K = len(starts), int(lens.max())
        slot = np.arange(K)
        valid = slot[:, None] < lens[None, :]
        # padding repeats the row's first arc (weight -inf), so it only ever reads its own
        # sequence's states and columns: a NaN or +inf there never reaches another sequence
        pos = np.where(valid, starts[None, :] + slot[:, None], starts[None, :])
        self.rows, self.K = side.key_states, K
        self.all_rows = R == num_states and bool((self.rows == np.arange(num_states)).all())
        self.other = other[pos]
        self.col = side.col[pos]
        self.log_prob = np.where(valid, side.log_prob[pos], -np.inf)
        self._valid, self._num_columns = valid, num_columns
        self._to_columns = None

    @staticmethod
    def fits(side) -> bool:
        n = len(side.src)
        if n == 0:
            return False
        lens = np.diff(np.append(side.seg_starts, n))
        K = int(lens.max())
        return K <= DENSE_MAX_DEGREE and len(lens) * K <= _DENSE_MAX_PAD * n + 64

    def to_columns(self):
        """Sparse ``[C, K*R]``: sums arc slots into their columns."""
        if self._to_columns is None:
            from scipy.sparse import csr_matrix

            slots = np.flatnonzero(self._valid.ravel())
            cols = self.col.ravel()[slots]
            self._to_columns = csr_matrix((np.ones(len(slots)), (cols, slots)),
                                          shape=(self._num_columns, self._valid.size))
        return self._to_columns


class _LatticeSegments:
    """Per-lattice segment structures (and dense layouts, where they fit)
    the frame loop reuses."""

    def __init__(self, lat: Lattice):
        self.fwd = Segments(lat.fwd.seg_starts, len(lat.fwd.src))  # arcs by destination
        self.bwd = Segments(lat.bwd.seg_starts, len(lat.bwd.src))  # arcs by source
        self.seqs = Segments(lat.state_offsets[:-1], lat.num_states)  # states by sequence
        S, C = lat.num_states, lat.num_columns
        self.dense_fwd = _Dense(lat.fwd, lat.fwd.src, S, C) if _Dense.fits(lat.fwd) else None
        self.dense_bwd = _Dense(lat.bwd, lat.bwd.dst, S, C) if _Dense.fits(lat.bwd) else None


def _segments(lat: Lattice) -> _LatticeSegments:
    p = getattr(lat, "_np_segments", None)
    if p is None:
        p = _LatticeSegments(lat)
        lat._np_segments = p
    return p


def forward_backward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, leaky=None, need_posteriors: bool = True):
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
    if threads < 2 or lat.num_arcs < _MIN_PARALLEL_WORK or not lengths.size or lengths.max() == 0:
        return _forward_backward_serial(lat, X, lengths, need_posteriors, leaky)
    parts = lat.split(threads)

    def run(part):
        seqs, states, cols, sub = part
        lk = None if leaky is None else (leaky[0], np.asarray(leaky[1])[states])
        return _forward_backward_serial(sub, X[:, cols], lengths[seqs], need_posteriors, lk)

    results = parallel(run, parts)
    loglike = np.concatenate([r[0] for r in results])
    if not need_posteriors:
        return loglike, None
    post = np.empty(X.shape)
    for (seqs, states, cols, sub), (_, p) in zip(parts, results):
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


def _normalise(plan: _LatticeSegments, sos: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Subtract each sequence's maximum (kept finite) from ``a``; return the maxima."""
    m = plan.seqs.max(a)
    m[~np.isfinite(m)] = 0.0
    a -= m[sos]
    return m


def _first_of_segments(seg: np.ndarray) -> np.ndarray:
    """For a sorted segment id per element: True on the first element of each segment."""
    first = np.ones(len(seg), dtype=bool)
    first[1:] = seg[1:] != seg[:-1]
    return first


def _max_step(plan, f, v, back_row, S: int) -> np.ndarray:
    """One frame of the max semiring: each destination state's best in-arc
    score ``[S]`` from the arc scores ``v`` (arcs in ``f``, sorted by
    destination), its winning arc written into ``back_row`` (the first one
    on ties)."""
    a = np.full(S, -np.inf)
    m = plan.fwd.max(v)
    win = np.flatnonzero((v == m.take(plan.fwd.seg_of)) & (v > -np.inf))
    seg = plan.fwd.seg_of[win]
    first = _first_of_segments(seg)  # arcs are sorted by destination: one winner each
    a[f.key_states] = m
    back_row[f.key_states[seg[first]]] = win[first]
    return a


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


def _zero_impossible(lat, loglike, lengths, post):
    """Zero posteriors for sequences without a complete path (``-inf``) and
    past each sequence's length, whatever NaN its scores held."""
    dead = loglike == -np.inf
    if dead.any():
        post[:, dead[lat.col_seq]] = 0.0
    col_len = lengths[lat.col_seq]
    if post.size and (col_len < len(post)).any():
        post[np.arange(len(post))[:, None] >= col_len[None, :]] = 0.0
    return post


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


def best_path(lat: Lattice, X: np.ndarray, lengths: np.ndarray):
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
#
# An arc read at frame t lands at frame t + span.  The span-1 passes above are
# kept as they are; lattices with ``max_span > 1`` take the passes below,
# which gather each arc's term from the frame it is read at (forward) or lands
# at (backward), over the segment layout.


def _logsumexp_by(v: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """``[n]``: the log-sum-exp of the entries of ``v`` with each id
    (``-inf`` for ids without entries; NaN stays with its id)."""
    m = np.full(n, -np.inf)
    np.maximum.at(m, ids, v)
    m[~np.isfinite(m)] = 0.0
    s = np.bincount(ids, weights=np.exp(v - m.take(ids)), minlength=n)
    return np.log(s) + m


def _forward_spans(lat: Lattice, X: np.ndarray, lengths: np.ndarray, semiring: str):
    """:func:`_forward` (same arguments and returns) for lattices whose arcs
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
    Tmax = _mask_past_lengths(lat, X, lengths)
    plan = _segments(lat)
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
            alpha[u] = _max_step(plan, f, v, back[u - 1], S)
            continue
        a = np.full(S, -np.inf)
        a[f.key_states] = logsumexp_segments(v, plan.fwd)
        offset[u] = offset[u - 1] + _normalise(plan, sos, a)
        alpha[u] = a
    if not N:
        return alpha, offset, np.zeros(0), np.zeros(0), back
    end = alpha[lengths[sos], np.arange(S)] + lat.final
    total = plan.seqs.max(end.copy()) if viterbi else logsumexp_segments(end.copy(), plan.seqs)
    return alpha, offset, end, total + offset[lengths, np.arange(N)], back


def _forward_backward_spans(lat: Lattice, X: np.ndarray, lengths: np.ndarray, need_posteriors: bool):
    """:func:`_forward_backward_serial` for lattices whose arcs may span
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
    plan = _segments(lat)
    sos = lat.seq_of_state
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        alpha, offset, _, loglike, _ = _forward_spans(lat, X, lengths, "log")
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
            boff[t] = base + _normalise(plan, sos, bt)
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
    return loglike, _zero_impossible(lat, loglike, lengths, post)
