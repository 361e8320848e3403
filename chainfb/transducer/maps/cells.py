"""The compiled kernels of the transducer family's CPU score maps (RNN-T,
multi-blank RNN-T, TDT, and the ``(px, py)`` grids' score plans), compiled by
Numba (a default dependency) and run by :func:`run` on
:func:`chainfb.engines.get_num_threads` threads over ranges of grid cells
``(b, t, u)``, blocks of frames, rows or single scores.  The backend that
calls them is :mod:`chainfb.transducer.maps.compiled`.

Gather: per cell read by some arc, the log-normaliser of the row (for
TDT the token logits' plus the duration logits', one ``log`` of the
product of the two sums), and the engine scores of the cell's arcs, which
reach ``X [num_steps, C]`` (column ``colidx[b, u, j]`` at step ``t + u``
for ``t < counts[b, u, j]``,
:meth:`~chainfb.transducer.graphs.TransducerLayout.slot_counts`) through
blocks of ``_TB`` frames written diagonal by diagonal, so that both the
logits and ``X`` are read and written along their rows (TDT keeps the
block in a small buffer; RNN-T moves a whole cell-order matrix).  When a
gradient will be asked for, the row's exponentials ``exp(x - max)`` are
left in the gradient-to-be, so each logit is read once and exponentiated
once; TDT's duration softmax is left there too.

Gradient: per cell, the arc posteriors of its slots, then the row of the
gradient written once: the kept exponentials times ``occupancy / sum``
(the softmax times the occupancy; for RNN-T recomputed from the logits
when nothing was kept, TDT's gradient always follows a gather that kept
them) minus the posteriors at the symbols read (module docstrings of the
criteria), clamped.  The gradient starts as fresh zero memory; cells no arc
reads are never written, and the rows of utterances whose cost is not
finite are zeroed.

float32 logits use an exponential evaluated in float32 lanes (range
reduction by ``ln 2`` and a degree-7 polynomial, within a few units in the
last place, vectorised by the compiler); float64 logits use ``np.exp``
(both :func:`chainfb.engines.vector_math.exp_scaled_sum`).
Sums of exponentials accumulate in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...engines.numba_cache import njit
from ...engines.threads import MIN_PARALLEL_WORK, get_num_threads, parallel, split
from ...engines.vector_math import exp_scaled_sum, has_nan, row_exp_sum, row_max


@njit(nogil=True)
def _log_norm(row, lo, n, buf, ib, fast):
    """``(log sum_k exp(row[lo + k]), 1 / sum_k exp(row[lo + k] - max))``,
    the first in float64 (the row maximum when it is not finite; NaN when a
    NaN is in the row; then the second is 0), with ``buf[k] = exp(row[lo +
    k] - max)`` written when the maximum is finite."""
    m, s = row_exp_sum(row, lo, n, buf, ib, fast)  # NaN in the row: NaN
    if not np.isfinite(m):
        return m, 0.0
    return m + np.log(s), 1.0 / s


@njit(nogil=True, inline="always")
def _clamp(row, n, clamp):
    """``row[:n]`` clamped to ``[-clamp, clamp]`` in place."""
    for k in range(n):
        if row[k] > clamp:
            row[k] = clamp
        elif row[k] < -clamp:
            row[k] = -clamp


@njit(nogil=True, inline="always")
def _cell_used(counts, b, u, t):
    """Whether some arc kind of main state ``u`` is read at frame ``t``."""
    for j in range(counts.shape[2]):
        if t < counts[b, u, j]:
            return True
    return False


@njit(nogil=True)
def rnnt_gather_cells(x: np.ndarray, sym: np.ndarray, counts: np.ndarray, fused: bool, fast: bool, S: np.ndarray,
                      norm: np.ndarray, inv: np.ndarray, g: np.ndarray, keep: bool, c0: int, c1: int) -> None:
    """Cells ``c0 <= (b * T + t) * U1 + u < c1`` of an RNN-T / multi-blank
    batch: ``norm[cell]`` (float64; 0 when not ``fused``) and
    ``S[cell, j] = x[b, t, u, sym[b, u, j]] - norm`` for the kinds ``j``
    read at ``t`` (:func:`move_blocks` moves them into the engine's matrix).  With ``keep`` (and ``fused``) the row
    ``exp(x - max)`` is left in ``g[b, t, u]`` and ``inv[cell]`` holds the
    factor that makes it the softmax (for :func:`rnnt_grad_cells`)."""
    B, T, U1, V = x.shape
    J = sym.shape[2]
    buf = np.empty(V, x.dtype)
    ib = np.empty(V, np.int32)
    for cell in range(c0, c1):
        u = cell % U1
        t = (cell // U1) % T
        b = cell // (U1 * T)
        if not _cell_used(counts, b, u, t):
            continue
        row = x[b, t, u]
        nm = 0.0
        if fused:
            nm, iv = _log_norm(row, 0, V, g[b, t, u] if keep else buf, ib, fast)
            inv[cell] = iv
        norm[cell] = nm
        for j in range(J):
            if t < counts[b, u, j]:
                S[cell, j] = np.float64(row[sym[b, u, j]]) - nm


@njit(nogil=True)
def rnnt_grad_cells(x: np.ndarray, sym: np.ndarray, counts: np.ndarray, norm: np.ndarray, inv: np.ndarray,
                    P: np.ndarray, kind_weight: np.ndarray, zero: np.ndarray, clamp: float, fused: bool, fast: bool,
                    kept: bool, g: np.ndarray, c0: int, c1: int) -> None:
    """The gradient rows ``g[b, t, u]`` of cells ``c0 <= cell < c1``:
    ``exp(x - norm) * sum_j w_j - sum_j w_j [k == sym_j]`` with ``w_j =
    kind_weight[j] * P[cell, j]`` (the posteriors by cell, :func:`move_blocks`; no first term when
    not ``fused``), clamped to ``[-clamp, clamp]`` when ``clamp > 0``;
    ``g`` is zero on entry and left so for cells no arc reads and for
    utterances with ``zero[b]``, or (``kept``) holds what
    :func:`rnnt_gather_cells` left there."""
    B, T, U1, V = x.shape
    J = sym.shape[2]
    ib = np.empty(V, np.int32)
    w = np.zeros(J)
    for cell in range(c0, c1):
        u = cell % U1
        t = (cell // U1) % T
        b = cell // (U1 * T)
        grow = g[b, t, u]
        used = False
        occ = 0.0
        if not zero[b]:
            for j in range(J):
                if t < counts[b, u, j]:
                    w[j] = kind_weight[j] * P[cell, j]
                    occ += w[j]
                    used = True
                else:
                    w[j] = 0.0
        if not used:  # out is zero on entry (or only the gather wrote there): nothing to write
            if kept and _cell_used(counts, b, u, t):
                grow[:] = 0.0
            continue
        nm = norm[cell]
        if fused and occ != 0.0 and np.isfinite(nm):
            if kept:  # exp(x - max) from the gather: times occ / sum
                f = occ * inv[cell]
                for k in range(V):
                    grow[k] = grow[k] * f
            else:
                exp_scaled_sum(x[b, t, u], 0, V, nm, occ, grow, ib, fast)
        elif kept:
            grow[:] = 0.0
        for j in range(J):
            if t < counts[b, u, j]:
                k = sym[b, u, j]
                grow[k] = grow[k] - w[j]
        if clamp > 0.0:
            _clamp(grow, V, clamp)


# frames per block of the moves between the engine's matrix and the cell order
_TB = 16


@njit(nogil=True)
def tdt_gather_blocks(x: np.ndarray, V: int, blank: int, labels: np.ndarray, counts: np.ndarray, colidx: np.ndarray,
                      sigma: float, fast: bool, X: np.ndarray, inv: np.ndarray, g: np.ndarray, keep: bool, c0: int,
                      c1: int) -> None:
    """Blocks ``c0 <= blk < c1`` of ``_TB`` frames of an utterance of a TDT
    batch (``x [B, T, U1, V + D]``): per cell, the scores of the slots ``j
    = kind * D + i`` (kind 0 the blank, 1 the label ``labels[b, u]``) read
    at ``t``, ``x[sym] + x[V + i] - (tnorm + dnorm + sigma)`` with the
    token and duration log-normalisers' sum taken as one ``log`` of the
    product of the two rows' sums; kept in a block-sized buffer, then
    written into ``X[t + u, colidx[b, u, j]]`` diagonal by diagonal (as
    :func:`move_blocks`).  The durations of the ``U1`` cells of a frame are
    exponentiated together (one vectorised pass).  ``inv[cell]``: the
    factor that makes the token row's ``exp(x - max)`` its softmax (0 or NaN
    where the token normaliser is not finite).  With ``keep`` that row is
    left in ``g[b, t, u, :V]`` and the duration softmax in ``g[b, t, u,
    V:]`` (0 where its normaliser is not finite).  ``fast``: exponentials
    in float32 lanes (see :func:`exp_scaled_sum`)."""
    B, T, U1, VD = x.shape
    D = VD - V
    J = 2 * D
    buf = np.empty(V, x.dtype)
    ib = np.empty(max(V, U1 * D), np.int32)
    Sb = np.empty((_TB, U1, J))
    dv = np.empty(U1 * D, x.dtype)  # a frame's durations minus their row's maximum, then exp
    de = np.empty(U1 * D, x.dtype)
    zero = np.zeros(1, x.dtype)[0]
    used = np.zeros(U1, np.bool_)
    tmax = np.empty(U1)
    tsum = np.empty(U1)
    dmax = np.empty(U1)
    nblk = (T + _TB - 1) // _TB
    for blk in range(c0, c1):
        b = blk // nblk
        ta = (blk % nblk) * _TB
        tz = min(ta + _TB, T)
        for t in range(ta, tz):
            for u in range(U1):
                used[u] = _cell_used(counts, b, u, t)
                if not used[u]:
                    continue
                row = x[b, t, u]
                tmax[u], tsum[u] = row_exp_sum(row, 0, V, g[b, t, u] if keep else buf, ib, fast)
                md = row_max(row, V, D)
                dmax[u] = md
                for i in range(D):
                    dv[u * D + i] = row[V + i] - md
            exp_scaled_sum(dv, 0, U1 * D, zero, 1.0, de, ib, fast)
            for u in range(U1):
                if not used[u]:
                    continue
                cell = (b * T + t) * U1 + u
                row = x[b, t, u]
                mt, st, md = tmax[u], tsum[u], dmax[u]
                sd = 0.0
                if np.isfinite(md):
                    for i in range(D):
                        sd += de[u * D + i]  # NaN in the row: NaN
                inv[cell] = 1.0 / st if st != 0.0 else 0.0
                if st > 0.0 and sd > 0.0:
                    nsum = (mt + md) + np.log(st * sd)
                else:  # a normaliser not finite: each as _log_norm gives it
                    tn = mt + np.log(st) if st > 0.0 or st != st else mt
                    dn = md + np.log(sd) if sd > 0.0 or sd != sd else (np.nan if md == md and has_nan(row, V, D)
                                                                        else md)
                    nsum = tn + dn
                if keep and sd > 0.0:  # the duration softmax, where the gradient wants it
                    grow = g[b, t, u]
                    ivd = 1.0 / sd
                    for i in range(D):
                        grow[V + i] = de[u * D + i] * ivd
                sb = Sb[t - ta, u]
                ns = nsum + sigma
                xb = np.float64(row[blank])
                xl = np.float64(row[labels[b, u]])
                for i in range(D):
                    xd = np.float64(row[V + i])
                    sb[i] = (xb + xd) - ns
                    sb[D + i] = (xl + xd) - ns
        for n in range(ta, tz + U1 - 1):
            xrow = X[n]
            for t in range(max(ta, n - U1 + 1), min(tz, n + 1)):
                u = n - t
                sb = Sb[t - ta, u]
                for j in range(J):
                    if t < counts[b, u, j]:
                        xrow[colidx[b, u, j]] = sb[j]


@njit(nogil=True)
def tdt_grad_blocks(V: int, blank: int, labels: np.ndarray, counts: np.ndarray, colidx: np.ndarray, inv: np.ndarray,
                    post: np.ndarray, zero: np.ndarray, label_weight: float, clamp: float, g: np.ndarray, c0: int,
                    c1: int) -> None:
    """The TDT gradient rows of the cells of blocks ``c0 <= blk < c1`` (as
    :func:`tdt_gather_blocks`; see :mod:`chainfb.transducer.tdt`) from what
    :func:`tdt_gather_blocks` left in ``g [B, T, U1, V + D]`` (with ``keep``): with
    ``A_j`` the posterior of slot ``j`` (``post[t + u, colidx[b, u, j]]``,
    read diagonal by diagonal into a block-sized buffer), ``Pb``/``Pl`` the
    blank's/label's sums over durations, tokens ``softmax * (Pb + lw Pl) -
    Pb [k == blank] - lw Pl [k == label]`` (clamped when ``clamp > 0``),
    durations ``softmax_i * (Pb + Pl) - A_i - A_{D+i}``; rows where no arc
    reads the cell or ``zero[b]`` are zeroed (or left zero)."""
    B, T, U1, VD = g.shape
    D = VD - V
    J = 2 * D
    Pb = np.empty((_TB, U1, J))
    nblk = (T + _TB - 1) // _TB
    for blk in range(c0, c1):
        b = blk // nblk
        ta = (blk % nblk) * _TB
        tz = min(ta + _TB, T)
        if not zero[b]:
            for n in range(ta, tz + U1 - 1):
                prow = post[n]
                for t in range(max(ta, n - U1 + 1), min(tz, n + 1)):
                    u = n - t
                    pb_ = Pb[t - ta, u]
                    for j in range(J):
                        pb_[j] = prow[colidx[b, u, j]] if t < counts[b, u, j] else 0.0
        for t in range(ta, tz):
            for u in range(U1):
                if not _cell_used(counts, b, u, t):
                    continue  # nothing written there: zero
                grow = g[b, t, u]
                if zero[b]:
                    grow[:] = 0.0
                    continue
                A = Pb[t - ta, u]
                pb = 0.0
                pl = 0.0
                for i in range(D):
                    pb += A[i]
                    pl += A[D + i]
                occ = pb + pl
                wt = pb + label_weight * pl
                iv = inv[(b * T + t) * U1 + u]
                if wt != 0.0 and iv > 0.0:  # exp(x - max) from the gather: times wt / sum
                    f = wt * iv
                    for k in range(V):
                        grow[k] = grow[k] * f
                else:
                    grow[:V] = 0.0
                grow[blank] = grow[blank] - pb
                k = labels[b, u]
                grow[k] = grow[k] - label_weight * pl
                if clamp > 0.0:
                    _clamp(grow, V, clamp)
                for i in range(D):  # the duration softmax from the gather (0 where not finite)
                    grow[V + i] = grow[V + i] * occ - (A[i] + A[D + i])


@njit(nogil=True)
def move_blocks(S: np.ndarray, colidx: np.ndarray, counts: np.ndarray, T: int, X: np.ndarray, to_steps: bool, c0: int,
                c1: int) -> None:
    """Between the cell order and the engine's step-major matrix: with
    ``to_steps``, ``X[t + u, colidx[b, u, j]] = S[(b * T + t) * U1 + u, j]``
    for the kinds read at ``t``; else the reverse, ``S[cell, j] = X[t + u,
    colidx[b, u, j]]``, 0 for the kinds not read at ``t``.  Over blocks
    ``c0 <= blk < c1`` of ``_TB`` frames of an utterance, diagonal by
    diagonal: consecutive cells touch one row of ``X``, and the block's
    cells stay in the cache."""
    B, U1, J = colidx.shape
    nblk = (T + _TB - 1) // _TB
    for blk in range(c0, c1):
        b = blk // nblk
        ta = (blk % nblk) * _TB
        tz = min(ta + _TB, T)
        for n in range(ta, tz + U1 - 1):
            for t in range(max(ta, n - U1 + 1), min(tz, n + 1)):
                u = n - t
                cell = (b * T + t) * U1 + u
                for j in range(J):
                    read = t < counts[b, u, j]
                    if to_steps:
                        if read:
                            X[n, colidx[b, u, j]] = S[cell, j]
                    else:
                        S[cell, j] = X[n, colidx[b, u, j]] if read else 0.0


@njit(nogil=True)
def put_scores(src: np.ndarray, entry: np.ndarray, X: np.ndarray, c0: int, c1: int) -> None:
    """``X[entry[i]] = src[i]`` for ``c0 <= i < c1`` where ``entry[i] >= 0`` (flat arrays)."""
    for i in range(c0, c1):
        e = entry[i]
        if e >= 0:
            X[e] = src[i]


@njit(nogil=True)
def take_scores(post: np.ndarray, entry: np.ndarray, out: np.ndarray, c0: int, c1: int) -> None:
    """``out[i] = post[entry[i]]`` for ``c0 <= i < c1``, 0 where ``entry[i] < 0`` (flat arrays)."""
    for i in range(c0, c1):
        e = entry[i]
        out[i] = post[e] if e >= 0 else 0.0


@njit(nogil=True)
def additive_blocks(logr: np.ndarray, am: np.ndarray, lm: np.ndarray, am_scale: np.ndarray, lm_scale: np.ndarray,
                    sy: np.ndarray, blank: int, t_end: np.ndarray, px: np.ndarray, py: np.ndarray, c0: int,
                    c1: int) -> None:
    """The additive joiner's ``(px, py)`` (:func:`additive_logprobs`) for
    blocks ``c0 <= blk < c1`` of ``_TB`` frames of an utterance: the
    block's rows of ``am`` stay in the cache while every ``s`` reads them.
    The operations and their order are the torch score map's, so the
    numbers are the same to the bit."""
    B, S1, T = logr.shape
    S = S1 - 1
    pad = px.shape[2] > T
    nblk = (T + _TB - 1) // _TB
    for blk in range(c0, c1):
        b = blk // nblk
        ta = (blk % nblk) * _TB
        tz = min(ta + _TB, T)
        for s in range(S1):
            symbol = s < S  # the last row has only the blank
            y = sy[b, s] if symbol else blank
            lms, lmb, lmy = lm_scale[b, s, 0], lm[b, s, blank], lm[b, s, y]
            for t in range(ta, tz):
                n = logr[b, s, t] + lms + am_scale[b, t, 0]
                py[b, s, t] = -n + am[b, t, blank] + lmb
                if symbol:
                    px[b, s, t] = am[b, t, y] + (lmy - n)
            if symbol and pad:
                if ta <= t_end[b] < tz:
                    px[b, s, t_end[b]] = -np.inf
                if tz == T:
                    px[b, s, T] = -np.inf


@njit(nogil=True)
def grid_put_rows(px: np.ndarray, py: np.ndarray, bd: np.ndarray, colidx: np.ndarray, modified: bool, X: np.ndarray,
                  c0: int, c1: int) -> None:
    """The grid's scores (:mod:`~chainfb.transducer.grid`) into ``X`` for
    the rows ``c0 <= r < c1`` of ``py`` (``r = b * (S + 1) + s``): cell
    ``(s, t)`` of sequence ``b``, at ``k = s - s_begin`` and ``t - t_begin``
    inside its boundary, reaches step ``t - t_begin + k`` (regular) or ``t -
    t_begin`` (modified), column ``colidx[b, k, 0]`` (``py``) and
    ``colidx[b, k, 1]`` (``px``, ``T_b + 1`` frames when regular)."""
    S1 = py.shape[1]
    for r in range(c0, c1):
        b, s = r // S1, r % S1
        s0, t0, s1, t1 = bd[b, 0], bd[b, 1], bd[b, 2], bd[b, 3]
        if s < s0 or s > s1:
            continue
        k = s - s0
        row0 = -t0 if modified else k - t0
        cb = colidx[b, k, 0]
        for t in range(t0, t1):
            X[row0 + t, cb] = py[b, s, t]
        if s < s1:
            cs = colidx[b, k, 1]
            for t in range(t0, t1 if modified else t1 + 1):
                X[row0 + t, cs] = px[b, s, t]


@njit(nogil=True)
def grid_take_rows(post: np.ndarray, bd: np.ndarray, colidx: np.ndarray, modified: bool, gx: np.ndarray, gy: np.ndarray,
                   c0: int, c1: int) -> None:
    """The reverse of :func:`grid_put_rows`: every element of the rows ``c0 <= r
    < c1`` of ``gy`` (and of ``gx`` where ``s < S``) written, the engine's
    posterior of the cell's arc inside the boundary and 0 outside."""
    S1 = gy.shape[1]
    for r in range(c0, c1):
        b, s = r // S1, r % S1
        s0, t0, s1, t1 = bd[b, 0], bd[b, 1], bd[b, 2], bd[b, 3]
        inside = s0 <= s <= s1
        k = s - s0
        row0 = -t0 if modified else k - t0
        cb = colidx[b, k, 0] if inside else 0
        for t in range(gy.shape[2]):
            gy[b, s, t] = post[row0 + t, cb] if inside and t0 <= t < t1 else 0.0
        if s < S1 - 1:
            cs = colidx[b, k, 1] if inside and s < s1 else 0
            t2 = t1 if modified else t1 + 1
            for t in range(gx.shape[2]):
                gx[b, s, t] = post[row0 + t, cs] if inside and s < s1 and t0 <= t < t2 else 0.0


def blocks(B: int, T: int) -> int:
    """How many blocks of :func:`move_blocks` a batch has."""
    return B * ((T + _TB - 1) // _TB)


def run(fn: Callable[..., None], ncells: int, *args: Any) -> None:
    """``fn(*args, c0, c1)`` over ``[0, ncells)`` split into contiguous
    ranges (:func:`chainfb.engines.threads.split`, with the threshold of the
    kind of unit ``fn`` works on, :data:`_UNITS`) run on
    :func:`~chainfb.engines.get_num_threads` threads (the compiled kernels
    release the GIL)."""
    n = max(1, get_num_threads())
    ranges = split(ncells, n, n * MIN_PARALLEL_WORK[_UNITS.get(fn, "cells")])
    if len(ranges) == 1:
        fn(*args, 0, ncells)
        return
    parallel(lambda r: fn(*args, r[0], r[1]), ranges, n)


# the unit each kernel not over grid cells works on (its threshold in MIN_PARALLEL_WORK):
# blocks of cells, single scores (the score plans' moves) and rows of a grid
_UNITS = {move_blocks: "blocks", tdt_gather_blocks: "blocks", tdt_grad_blocks: "blocks", additive_blocks: "blocks",
          put_scores: "scores", take_scores: "scores", grid_put_rows: "rows", grid_take_rows: "rows"}
