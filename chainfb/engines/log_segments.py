"""The NumPy engine's building blocks (:mod:`chainfb.engines.numpy_log`):
segment reductions (log-sum-exp and maximum over consecutive segments of an
array), a lattice's per-side segment structures and dense ``[K, R]`` arc
layouts (kept by :meth:`~chainfb.lattice.Lattice.cache`), the per-sequence
normalisation of a frame, one max-semiring step, and the masks for frames
past a sequence's length and for sequences without a path.  Both of the
engine's passes (one frame per arc, :mod:`~chainfb.engines.numpy_log`; arcs
spanning frames, :mod:`~chainfb.engines.numpy_spans`) use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..lattice import Lattice, _Side

if TYPE_CHECKING:
    from scipy.sparse import csr_matrix

__all__ = ["Segments", "logsumexp_segments", "logsumexp_slots", "Dense", "DENSE_MAX_DEGREE", "LatticeSegments",
           "lattice_segments", "dense_scores", "arc_scores", "mask_past_lengths", "chunk_frames", "normalise",
           "first_of_segments", "max_step", "zero_impossible"]


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
        """The largest of ``v [n]`` in each segment: ``[K]``."""
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


def logsumexp_slots(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def dense_scores(X: np.ndarray, t0: int, t1: int, d: Dense) -> np.ndarray:
    """``w(arc) + X[t, col(arc)]`` in the dense layout: ``[t1 - t0, K, R]``."""
    wx = X[t0:t1].take(d.col, axis=1)
    wx += d.log_prob
    return wx


def arc_scores(X: np.ndarray, t0: int, t1: int, side: _Side) -> np.ndarray:
    """``w(arc) + X[t, col(arc)]`` for frames ``t0 <= t < t1``: ``[t1 - t0, A]``."""
    wx = X[t0:t1].take(side.col, axis=1)
    wx += side.log_prob
    return wx


def mask_past_lengths(lat: Lattice, X: np.ndarray, lengths: np.ndarray) -> int:
    """Set ``X[t, c] = -inf`` for frames past the length of column ``c``'s
    sequence (they never contribute); returns the longest length."""
    Tmax = int(lengths.max()) if lengths.size else 0
    if X.shape[1] and Tmax:
        col_len = lengths[lat.col_seq]
        X[:Tmax][np.arange(Tmax)[:, None] >= col_len[None, :]] = -np.inf
    return Tmax


def chunk_frames(lat: Lattice, Tmax: int, arcs: int | None = None) -> int:
    """Frames whose arc scores are gathered at once (about 32 MB; ``arcs``
    per frame, default the lattice's)."""
    arcs = lat.num_arcs if arcs is None else arcs
    return max(1, min(max(Tmax, 1), 4_000_000 // max(1, arcs)))


#: the largest in/out-degree for which a side's arcs are laid out densely
DENSE_MAX_DEGREE = 16
# ... and the most padding allowed (padded slots / arcs)
DENSE_MAX_PAD = 2.0


class Dense:
    """One side's arcs (``lat.fwd``: by destination, ``lat.bwd``: by source)
    as ``[K, R]`` (slot-major, so that reductions over slots run over
    contiguous rows): column ``r`` holds the arcs of state ``rows[r]`` (the
    side's key states), padded with arcs of weight ``-inf``.  ``other`` is each
    arc's other end and ``col`` its column (padding: those of the row's first arc),
    ``log_prob`` its weight; ``all_rows``: every state is a row, in order."""

    def __init__(self, side: _Side, other: np.ndarray, num_states: int, num_columns: int):
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
    def fits(side: _Side) -> bool:
        """Whether ``side`` takes the dense layout: at most
        :data:`DENSE_MAX_DEGREE` arcs per row and at most
        :data:`DENSE_MAX_PAD` padded slots per arc."""
        n = len(side.src)
        if n == 0:
            return False
        lens = np.diff(np.append(side.seg_starts, n))
        K = int(lens.max())
        return K <= DENSE_MAX_DEGREE and len(lens) * K <= DENSE_MAX_PAD * n + 64

    def to_columns(self) -> csr_matrix:
        """Sparse ``[C, K*R]``: sums arc slots into their columns."""
        if self._to_columns is None:
            from scipy.sparse import csr_matrix

            slots = np.flatnonzero(self._valid.ravel())
            cols = self.col.ravel()[slots]
            self._to_columns = csr_matrix((np.ones(len(slots)), (cols, slots)),
                                          shape=(self._num_columns, self._valid.size))
        return self._to_columns


class LatticeSegments:
    """Per-lattice segment structures (and dense layouts, where they fit)
    the frame loop reuses."""

    def __init__(self, lat: Lattice):
        self.fwd = Segments(lat.fwd.seg_starts, len(lat.fwd.src))  # arcs by destination
        self.bwd = Segments(lat.bwd.seg_starts, len(lat.bwd.src))  # arcs by source
        self.seqs = Segments(lat.state_offsets[:-1], lat.num_states)  # states by sequence
        S, C = lat.num_states, lat.num_columns
        self.dense_fwd = Dense(lat.fwd, lat.fwd.src, S, C) if Dense.fits(lat.fwd) else None
        self.dense_bwd = Dense(lat.bwd, lat.bwd.dst, S, C) if Dense.fits(lat.bwd) else None


def lattice_segments(lat: Lattice) -> LatticeSegments:
    """The lattice's :class:`LatticeSegments`, kept by :meth:`~chainfb.lattice.Lattice.cache`."""
    return lat.cache(("numpy", "segments"), lambda: LatticeSegments(lat))



def normalise(plan: LatticeSegments, sos: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Subtract each sequence's maximum (kept finite) from ``a``; return the maxima."""
    m = plan.seqs.max(a)
    m[~np.isfinite(m)] = 0.0
    a -= m[sos]
    return m


def first_of_segments(seg: np.ndarray) -> np.ndarray:
    """For a sorted segment id per element: True on the first element of each segment."""
    first = np.ones(len(seg), dtype=bool)
    first[1:] = seg[1:] != seg[:-1]
    return first


def max_step(plan: LatticeSegments, f: _Side, v: np.ndarray, back_row: np.ndarray, S: int) -> np.ndarray:
    """One frame of the max semiring: each destination state's best in-arc
    score ``[S]`` from the arc scores ``v`` (arcs in ``f``, sorted by
    destination), its winning arc written into ``back_row`` (the first one
    on ties)."""
    a = np.full(S, -np.inf)
    m = plan.fwd.max(v)
    win = np.flatnonzero((v == m.take(plan.fwd.seg_of)) & (v > -np.inf))
    seg = plan.fwd.seg_of[win]
    first = first_of_segments(seg)  # arcs are sorted by destination: one winner each
    a[f.key_states] = m
    back_row[f.key_states[seg[first]]] = win[first]
    return a



def zero_impossible(lat: Lattice, loglike: np.ndarray, lengths: np.ndarray, post: np.ndarray) -> np.ndarray:
    """Zero posteriors for sequences without a complete path (``-inf``) and
    past each sequence's length, whatever NaN its scores held."""
    dead = loglike == -np.inf
    if dead.any():
        post[:, dead[lat.col_seq]] = 0.0
    col_len = lengths[lat.col_seq]
    if post.size and (col_len < len(post)).any():
        post[np.arange(len(post))[:, None] >= col_len[None, :]] = 0.0
    return post
