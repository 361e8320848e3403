"""The compiled CPU engine: the forward-backward of
:mod:`~chainfb.engines.numpy_log` written as plain loops over frames,
states and arcs and compiled by Numba (the optional ``jit`` extra:
``pip install "chainfb[jit]"``).

The NumPy engine pays a dozen array operations per frame, each a Python
call; on lattices with few states per frame (CTC graphs, transducer step
graphs, numerator graphs) that overhead is most of its time.  Here one
frame of a sequence is a pass over its arcs.  Same definitions, same
numbers to rounding (see :mod:`~chainfb.engines.numpy_log`).

Representation: scaled probabilities with a log-domain escape.  Within a
frame every cell (a state's alpha or beta) is relative to the frame's scale:
the arc weights are ``w = exp(log_prob - max log_prob)`` and the emissions
``E = exp(X[t, c] - m_t)`` with ``m_t`` the frame's largest score in the
sequence (one ``exp`` per column and frame), so one frame is::

    alpha_{t+1}(j) = sum_{arcs i->j} alpha_t(i) * w * E(col)      (forward)
    B_t(i)         = sum_{arcs i->j} w * E(col) * beta_{t+1}(j)    (backward)

-- multiply-adds, no ``exp`` or ``log`` per arc.  Each frame is then divided
by its largest cell (its log accumulated, with ``m_t`` and the weight
shift, into the sequence's offset).  A cell's sum is kept as a scaled
probability when it is at least ``_SAFE = 1e-290``: then it is exact to
float64's rounding even if some terms underflowed (each lost term is below
``DBL_MIN ~ 2.2e-308``, under ``1e-17`` of the sum).  A smaller (but
nonzero) cell is recomputed in the log domain -- the log-sum-exp of its
arcs' ``log(far end) + log_prob + score`` -- and kept as its log; such cells
enter their successors' sums as ``exp(log)`` and, when a normalisation
brings them into the safe range, become scaled again, so a cell kept as a
log is always below ``_SAFE`` of its frame's largest.  Every cell is thus
exact however far it lies below the others (a tight alignment whose only
surviving path is thousands of nats below dead ends), and the common case
costs no transcendental function at all.

Arc posteriors at frame ``t`` are ``alpha_t(i) w E beta_{t+1}(j) / Z_t``
with the frame's own total ``Z_t = sum_i alpha_t(i) B_t(i)``, as the NumPy
engine normalises them.  When the scaled total is at least ``1e-200``,
every term left out of it (a cell kept as a log, below ``1e-290`` times at
most the out-degree) is below ``1e-88`` of it and the scaled products are
used; a frame with a smaller total is done in the log domain.

Sequences are independent: the compiled function releases the GIL and
contiguous ranges of sequences run on :func:`chainfb.engines.get_num_threads`
threads; columns belong to one sequence, so the threads never write the
same posterior.  NaN in a sequence's scores gives NaN out for that sequence
only.  ``CHAINFB_NUMBA=0`` in the environment leaves Numba unused (``auto``
then picks the NumPy engine).  No leaky HMM and no Viterbi here (those run
on the NumPy engines; :func:`chainfb.engines.select` knows).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..lattice import Lattice, balanced_ranges
from .threads import get_num_threads

__all__ = ["available", "forward_backward", "require"]

try:
    import numba
except ImportError:  # the optional ``jit`` extra
    numba = None
if os.environ.get("CHAINFB_NUMBA", "1") == "0":  # opt out: the NumPy engine everywhere
    numba = None

# sequences' total arcs * frames below which one thread does the whole batch
_MIN_PARALLEL_WORK = 200_000


def available() -> bool:
    """Whether Numba is installed (the ``jit`` extra)."""
    return numba is not None


def require() -> None:
    """Raise a clear error when Numba is missing."""
    if numba is None:
        raise ValueError('engine: "numba" needs Numba: pip install "chainfb[jit]" (or pip install numba)')


def _compile(fn):
    return numba.njit(nogil=True, cache=True)(fn) if numba is not None else fn


def _inline(fn):
    """A helper compiled into its callers (no call per cell)."""
    return numba.njit(nogil=True, cache=True, inline="always")(fn) if numba is not None else fn


# a sum of scaled probabilities at least this large is exact to float64's
# rounding even if some of its terms underflowed (each lost term is below
# DBL_MIN ~ 2.2e-308, so the relative error is below 1e-17 per term)
_SAFE = 1e-290
_LOG_SAFE = float(np.log(_SAFE))
# frame totals (alpha * beta) above this: posteriors from the scaled values
_SAFE_TOTAL = 1e-200


@_inline
def _logval(p, lv):
    """The log of a cell kept as a scaled probability ``p`` or, when ``p`` is
    0, as its log ``lv`` (``-inf``: a true zero)."""
    return np.log(p) if p != 0.0 else lv


@_inline
def _lse_push(m, acc, v):
    """The term ``v`` into a running log-sum-exp ``(max m, sum acc of
    exp(. - m))``: ``-inf`` adds nothing, NaN makes ``acc`` NaN."""
    if v > m:
        return v, acc * np.exp(m - v) + 1.0
    if v != v:
        return m, v
    if v > -np.inf:
        return m, acc + np.exp(v - m)
    return m, acc


@_inline
def _store(r, P, LV, j):
    """Keep the log value ``r`` in cell ``j``: scaled when safe, else as a log."""
    if r >= _LOG_SAFE:
        P[j] = np.exp(r)
        LV[j] = -np.inf
    else:
        P[j] = 0.0
        LV[j] = r


@_compile
def _normalise(P, LV):
    """Divide a frame's cells by their largest value; return its log (0 if
    none).  Cells kept as logs that the division brings into the safe range
    become scaled again, so a cell kept as a log is always below ``_SAFE``."""
    c = 0.0
    for j in range(P.shape[0]):
        if P[j] > c:
            c = P[j]
    lc = 0.0
    if c > 0.0 and c < np.inf:
        lc = np.log(c)
        for j in range(P.shape[0]):
            P[j] /= c
    elif c == 0.0:  # every cell tiny (kept as logs) or zero
        lc = -np.inf
        for j in range(P.shape[0]):
            if LV[j] > lc:
                lc = LV[j]
        if lc == -np.inf:
            return 0.0
    else:  # NaN or +inf: leave the frame as it is
        return 0.0
    for j in range(P.shape[0]):
        if LV[j] > -np.inf:
            _store(LV[j] - lc, P, LV, j)
    return lc


@_inline
def _fast_sum(P, LV, ptr, other, w, col, E, base, k):
    """A cell's new value as the sum of its arcs' scaled products (arcs
    ``ptr[k] .. ptr[k+1]``, ``other`` their far ends, local to ``base``);
    far ends kept as logs enter as ``exp(log)``."""
    s = 0.0
    for a in range(ptr[k], ptr[k + 1]):
        i = other[a] - base
        p = P[i]
        if p == 0.0:
            if LV[i] == -np.inf:
                continue
            p = np.exp(LV[i])
        s += p * w[a] * E[col[a]]
    return s


@_compile
def _slow_cell(P, LV, ptr, other, lp, col, xt, base, k, shift, out_P, out_LV, j):
    """The cell in the log domain (its scaled sum was below the safe range):
    the log-sum-exp of ``log(far end) + log_prob + score - shift`` over its
    arcs, kept in ``out_P[j]`` / ``out_LV[j]``."""
    m = -np.inf
    acc = 0.0
    for a in range(ptr[k], ptr[k + 1]):
        i = other[a] - base
        m, acc = _lse_push(m, acc, _logval(P[i], LV[i]) + lp[a] + xt[col[a]] - shift)
    if acc != acc:
        out_P[j], out_LV[j] = acc, -np.inf
    elif acc == 0.0:
        out_P[j], out_LV[j] = 0.0, -np.inf
    else:
        _store(m + np.log(acc), out_P, out_LV, j)


@_inline
def _frame(Pp, LVp, Pn, LVn, ptr, other, w, lp, col, xt, E, base, shift):
    """One frame of either direction: every cell ``j`` of ``Pn``/``LVn`` from
    the far ends in ``Pp``/``LVp`` -- the scaled sum when it is safe (or
    NaN), else the exact log-domain value."""
    for j in range(Pn.shape[0]):
        s = _fast_sum(Pp, LVp, ptr, other, w, col, E, base, base + j)
        if s >= _SAFE or s != s:
            Pn[j] = s
            LVn[j] = -np.inf
        else:
            _slow_cell(Pp, LVp, ptr, other, lp, col, xt, base, base + j, shift, Pn, LVn, j)


@_compile
def _run(n0, n1, state_off, start, final, in_ptr, in_src, in_lp, in_w, in_col,
         out_ptr, out_dst, out_lp, out_w, out_col, wshift, X, E, M, lengths, need_post, loglike, post):
    """Sequences ``n0 <= n < n1``: ``loglike[n]`` and, if ``need_post``,
    their columns of ``post [T, C]`` (zero on entry), from the scores ``X``,
    the emissions ``E = exp(X - M[t, n])`` and the frame maxima ``M [T, N]``.
    See the module docstring for the representation and why it is exact."""
    ninf = -np.inf
    for n in range(n0, n1):
        s0 = state_off[n]
        W = state_off[n + 1] - s0
        L = lengths[n]
        P = np.zeros((L + 1, W))
        LV = np.full((L + 1, W), ninf)
        P[0, start[n] - s0] = 1.0
        offset = 0.0
        for t in range(L):
            shift = M[t, n] + wshift
            _frame(P[t], LV[t], P[t + 1], LV[t + 1], in_ptr, in_src, in_w, in_lp, in_col, X[t], E[t], s0, shift)
            offset += shift + _normalise(P[t + 1], LV[t + 1])
        fmax = ninf
        for j in range(W):
            if final[s0 + j] > fmax:
                fmax = final[s0 + j]
        if fmax == ninf:
            fmax = 0.0
        m = ninf
        acc = 0.0
        for j in range(W):  # loglike: the log-sum-exp of alpha_L + final
            m, acc = _lse_push(m, acc, _logval(P[L, j], LV[L, j]) + final[s0 + j] - fmax)
        loglike[n] = (m + np.log(acc) + fmax + offset) if acc != 0.0 else ninf
        if not need_post or loglike[n] == ninf:
            continue  # no complete path: zero posteriors
        Q = np.zeros(W)  # beta_{t+1}, scaled, and its tiny cells' logs
        LQ = np.full(W, ninf)
        BP = np.empty(W)  # B_t before normalisation
        BL = np.empty(W)
        for j in range(W):
            _store(final[s0 + j] - fmax, Q, LQ, j)
        for t in range(L - 1, -1, -1):
            xt, et = X[t], E[t]
            shift = M[t, n] + wshift
            _frame(Q, LQ, BP, BL, out_ptr, out_dst, out_w, out_lp, out_col, xt, et, s0, shift)
            Pt, LVt, pt = P[t], LV[t], post[t]
            z = 0.0
            for i in range(W):
                if Pt[i] != 0.0 and BP[i] != 0.0:
                    z += Pt[i] * BP[i]
            if z >= _SAFE_TOTAL and z < np.inf:
                # every term left out (a cell kept as a log) is below 1e-88 of z
                for i in range(W):
                    if Pt[i] == 0.0:
                        continue
                    ai = Pt[i] / z
                    for a in range(out_ptr[s0 + i], out_ptr[s0 + i + 1]):
                        c = out_col[a]
                        pt[c] += ai * out_w[a] * et[c] * Q[out_dst[a] - s0]
            elif z != z or z == np.inf:  # NaN in: NaN out
                for a in range(out_ptr[s0], out_ptr[s0 + W]):
                    pt[out_col[a]] = np.nan
            else:  # a small total: the frame in the log domain
                m = ninf
                acc = 0.0
                for i in range(W):
                    m, acc = _lse_push(m, acc, _logval(Pt[i], LVt[i]) + _logval(BP[i], BL[i]))
                if acc != 0.0:
                    lz = m + np.log(acc)
                    for i in range(W):
                        ai = _logval(Pt[i], LVt[i]) - lz
                        if ai == ninf:
                            continue
                        for a in range(out_ptr[s0 + i], out_ptr[s0 + i + 1]):
                            d = out_dst[a] - s0
                            pt[out_col[a]] += np.exp(ai + out_lp[a] + xt[out_col[a]] - shift
                                                     + _logval(Q[d], LQ[d]))
            for i in range(W):
                Q[i] = BP[i]
                LQ[i] = BL[i]
            _normalise(Q, LQ)


def _arrays(lat: Lattice) -> tuple:
    """The lattice as CSR arrays (in-arcs by destination, out-arcs by source), cached on it."""
    arrs = lat.__dict__.get("_numba_arrays")
    if arrs is None:
        f, b = lat.fwd, lat.bwd
        lp_in = np.asarray(f.log_prob, dtype=np.float64)
        lp_out = np.asarray(b.log_prob, dtype=np.float64)
        finite = lp_in[np.isfinite(lp_in)]
        # arc weights as probabilities relative to the largest (every path of L frames takes L arcs)
        wshift = float(finite.max()) if finite.size else 0.0
        arrs = (
            np.asarray(lat.state_offsets, dtype=np.int64), np.asarray(lat.start, dtype=np.int64),
            np.asarray(lat.final, dtype=np.float64),
            f.ptr, np.asarray(f.src, dtype=np.int64),
            lp_in, np.exp(lp_in - wshift), np.asarray(f.col, dtype=np.int64),
            b.ptr, np.asarray(b.dst, dtype=np.int64),
            lp_out, np.exp(lp_out - wshift), np.asarray(b.col, dtype=np.int64), wshift,
        )
        lat._numba_arrays = arrs
    return arrs


def _emissions(lat: Lattice, X: np.ndarray, T: int):
    """``E = exp(X - M[t, seq])`` ``[T, C]`` and ``M [T, N]``, each frame's
    largest score per sequence (0 where all are ``-inf``; NaN or ``+inf``
    where a score is, so that they propagate)."""
    N = lat.num_sequences
    M = np.zeros((T, N))
    col_off = lat.col_offsets
    used = np.flatnonzero(np.diff(col_off) > 0)
    if used.size and T:
        M[:, used] = np.maximum.reduceat(X, col_off[used], axis=1)
    M[np.isneginf(M)] = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        E = np.exp(X - M[:, lat.col_seq])
    return E, M


def forward_backward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, leaky=None, need_posteriors: bool = True):
    """Forward-backward over a lattice (the engine protocol, see
    :mod:`chainfb.engines`), compiled.

    Parameters
    ----------
    lat : Lattice
    X : float64 ``[T, C]`` compact scores (entries past a sequence's length are not read).
    lengths : int64 ``[N]``, each in ``[0, T]``.
    leaky : must be None (the leaky HMM runs on the NumPy engines).
    need_posteriors : bool

    Returns
    -------
    loglike : float64 ``[N]``
    posteriors : float64 ``[T, C]`` or None
    """
    require()
    if leaky is not None:
        raise ValueError("leaky: the numba engine has no leaky HMM; use engine='numpy' or 'shared'")
    X = np.ascontiguousarray(X, dtype=np.float64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    N = lat.num_sequences
    T, C = X.shape
    loglike = np.empty(N)
    post = np.zeros((T, C)) if need_posteriors else np.zeros((0, 0))
    arrs = _arrays(lat)
    E, M = _emissions(lat, X, T)
    work = np.diff(lat.arc_offsets) * (lengths + 1.0) + 1.0  # arcs x frames per sequence
    ranges = balanced_ranges(work, max(1, get_num_threads()))
    if len(ranges) < 2 or work.sum() < _MIN_PARALLEL_WORK:
        _run(0, N, *arrs, X, E, M, lengths, need_posteriors, loglike, post)
    else:
        with ThreadPoolExecutor(len(ranges)) as ex:
            list(ex.map(lambda r: _run(r[0], r[1], *arrs, X, E, M, lengths, need_posteriors, loglike, post), ranges))
    return loglike, (post if need_posteriors else None)
