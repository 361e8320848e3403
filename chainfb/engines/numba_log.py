"""The compiled CPU engine: the log-domain forward-backward of
:mod:`~chainfb.engines.numpy_log`, written as plain loops over frames,
states and arcs and compiled by Numba (the optional ``jit`` extra:
``pip install "chainfb[jit]"``).

The NumPy engine pays a dozen array operations per frame, each a Python
call; on lattices with few states per frame (CTC graphs, transducer step
graphs, numerator graphs) that overhead is most of its time.  Here a frame
costs a few passes over the in-arcs (forward) or the out-arcs (backward)
and one ``exp`` per arc.  Same recursion, same numbers (to rounding); see
:mod:`~chainfb.engines.numpy_log` for the definitions:

- alphas per state, each frame divided by its maximum per sequence (the log
  of it accumulated), so that values stay near 0 for any length;
- each destination's log-sum-exp from its arcs' maximum and ``exp(v -
  max)`` of the others (the backward pass keeps these as the arcs' shares
  of their source's beta, so an arc posterior costs a multiplication); NaN
  propagates as in NumPy;
- arc posteriors at frame ``t`` normalised by that frame's own total
  ``Z_t = logsum_i alpha_t(i) + B_t(i)`` (``B_t`` the betas before
  normalisation), as the NumPy engine does, so per-frame posterior sums
  stay at 1 to rounding however long the sequence.

Sequences are independent: the compiled function releases the GIL and
contiguous ranges of sequences run on :func:`numpy_log.get_num_threads`
threads.  ``CHAINFB_NUMBA=0`` in the environment leaves Numba unused
(``auto`` then picks the NumPy engine).  Columns belong to one sequence, so the threads never write the
same posterior.  No leaky HMM and no Viterbi here (those run on the NumPy
engines; :func:`chainfb.engines.select` knows).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..lattice import Lattice
from .numpy_log import get_num_threads

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
    return numba.njit(nogil=True, cache=True, fastmath=False)(fn) if numba is not None else fn


@_compile
def _max_of(vals, k0, k1):
    """The maximum of ``vals[k0:k1]`` (``-inf`` if empty), NaN if any is NaN."""
    m = -np.inf
    for k in range(k0, k1):
        v = vals[k]
        if v > m:
            m = v
        elif v != v:
            return v
    return m


@_compile
def _exp_sum(vals, k0, k1, m):
    """``sum exp(vals[k0:k1] - m)`` for the maximum ``m`` (finite), writing
    each term back into ``vals``; the maximum's own term is exactly 1."""
    s = 0.0
    hit = False
    for k in range(k0, k1):
        v = vals[k]
        if v == m and not hit:
            e = 1.0
            hit = True
        elif v > -np.inf:
            e = np.exp(v - m)
        else:
            e = 0.0
        vals[k] = e
        s += e
    return s


@_compile
def _run(n0, n1, state_off, start, final, in_ptr, in_src, in_lp, in_col, out_ptr, out_dst, out_lp, out_col,
         X, lengths, need_post, loglike, post):
    """Sequences ``n0 <= n < n1``: ``loglike[n]`` and, if ``need_post``,
    their columns of ``post [T, C]`` (zero on entry).

    Each destination's (source's) log-sum-exp takes two passes over its
    arcs' terms, kept in a scratch row: their maximum, then ``exp(v - max)``
    (which the backward pass keeps as the arcs' shares of their source's
    beta: ``post(arc) = exp(alpha_t(i) + B_t(i) - Z_t) * share``)."""
    ninf = -np.inf
    for n in range(n0, n1):
        s0 = state_off[n]
        W = state_off[n + 1] - s0
        L = lengths[n]
        alpha = np.empty((L + 1, W))
        alpha[0, :] = ninf
        alpha[0, start[n] - s0] = 0.0
        offset = 0.0
        ia0 = in_ptr[s0]
        v = np.empty(max(in_ptr[s0 + W] - ia0, out_ptr[s0 + W] - out_ptr[s0], W))
        for t in range(L):
            prev = alpha[t]
            row = alpha[t + 1]
            xt = X[t]
            for a in range(ia0, in_ptr[s0 + W]):
                v[a - ia0] = prev[in_src[a] - s0] + in_lp[a] + xt[in_col[a]]
            mx = ninf
            for j in range(W):
                k0, k1 = in_ptr[s0 + j] - ia0, in_ptr[s0 + j + 1] - ia0
                m = _max_of(v, k0, k1)
                if m > ninf and m < np.inf:
                    r = m + np.log(_exp_sum(v, k0, k1, m))
                else:
                    r = m  # -inf: no arc alive; NaN or +inf propagate
                row[j] = r
                if r > mx:
                    mx = r
            if mx > ninf and mx < np.inf:
                for j in range(W):
                    row[j] -= mx
                offset += mx
        for j in range(W):
            v[j] = alpha[L, j] + final[s0 + j]
        m = _max_of(v, 0, W)
        loglike[n] = (m + np.log(_exp_sum(v, 0, W, m)) + offset) if (m > ninf and m < np.inf) else m
        if not need_post or loglike[n] == ninf:
            continue  # no complete path: zero posteriors
        oa0 = out_ptr[s0]
        beta = np.empty(W)
        B = np.empty(W)
        ssum = np.empty(W)
        for j in range(W):
            beta[j] = final[s0 + j]
        for t in range(L - 1, -1, -1):
            xt = X[t]
            for a in range(oa0, out_ptr[s0 + W]):
                v[a - oa0] = beta[out_dst[a] - s0] + out_lp[a] + xt[out_col[a]]
            for i in range(W):
                k0, k1 = out_ptr[s0 + i] - oa0, out_ptr[s0 + i + 1] - oa0
                m = _max_of(v, k0, k1)
                if m > ninf and m < np.inf:
                    ssum[i] = _exp_sum(v, k0, k1, m)
                    B[i] = m + np.log(ssum[i])
                else:
                    B[i] = m
            z = ninf
            zs = 0.0
            for i in range(W):  # Z_t = logsum_i alpha_t(i) + B_t(i), two passes
                u = alpha[t, i] + B[i]
                if u > z:
                    z = u
                elif u != u:
                    z = u
                    break
            if z > ninf and z < np.inf:
                for i in range(W):
                    u = alpha[t, i] + B[i]
                    if u > ninf:
                        zs += np.exp(u - z)
                z += np.log(zs)
                for i in range(W):
                    u = alpha[t, i] + B[i]
                    if u == ninf:
                        continue
                    occ = np.exp(u - z) / ssum[i]
                    for a in range(out_ptr[s0 + i], out_ptr[s0 + i + 1]):
                        post[t, out_col[a]] += occ * v[a - oa0]
            elif z != z or z == np.inf:  # NaN in: NaN out
                for a in range(oa0, out_ptr[s0 + W]):
                    post[t, out_col[a]] = np.nan
            mx = ninf
            for i in range(W):
                if B[i] > mx:
                    mx = B[i]
            if not (mx > ninf and mx < np.inf):
                mx = 0.0
            for i in range(W):
                beta[i] = B[i] - mx


def _arrays(lat: Lattice) -> tuple:
    """The lattice as CSR arrays (in-arcs by destination, out-arcs by source), cached on it."""
    arrs = lat.__dict__.get("_numba_arrays")
    if arrs is None:
        S = lat.num_states
        f, b = lat.fwd, lat.bwd
        states = np.arange(S + 1)
        arrs = (
            lat.state_offsets.astype(np.int64), np.asarray(lat.start, dtype=np.int64),
            np.asarray(lat.final, dtype=np.float64),
            np.searchsorted(f.dst, states).astype(np.int64), f.src.astype(np.int64),
            np.asarray(f.log_prob, dtype=np.float64), f.col.astype(np.int64),
            np.searchsorted(b.src, states).astype(np.int64), b.dst.astype(np.int64),
            np.asarray(b.log_prob, dtype=np.float64), b.col.astype(np.int64),
        )
        lat._numba_arrays = arrs
    return arrs


def _ranges(lat: Lattice, lengths: np.ndarray, parts: int):
    """Contiguous sequence ranges with about equal work (arcs x frames)."""
    N = lat.num_sequences
    work = np.bincount(lat.fwd.seq, minlength=N) * (lengths + 1.0) + 1.0
    cum = np.concatenate([[0.0], np.cumsum(work)])
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts)
    bounds = np.unique(np.clip(np.concatenate([[0], cuts, [N]]), 0, N))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist())), float(cum[-1])


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
    ranges, work = _ranges(lat, lengths, max(1, get_num_threads()))
    if len(ranges) < 2 or work < _MIN_PARALLEL_WORK:
        _run(0, N, *arrs, X, lengths, need_posteriors, loglike, post)
    else:
        with ThreadPoolExecutor(len(ranges)) as ex:
            list(ex.map(lambda r: _run(r[0], r[1], *arrs, X, lengths, need_posteriors, loglike, post), ranges))
    return loglike, (post if need_posteriors else None)
