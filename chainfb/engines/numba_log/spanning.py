"""The spanning pass: the forward-backward of lattices with arcs that span
several frames (``Lattice.max_span > 1``), for a range of sequences
(:func:`run`).

An arc read at frame ``s`` with span ``k`` lands at frame ``s + k``, so
frame ``t + 1`` sums over arcs from frames ``t + 1 - k`` for every distinct
span ``k``, each frame's cells at its own scale.  Each frame's log offset
is kept as a double-double running sum (``O_t = Oh[t] + Ol[t]`` forward,
``OB_t = Bh[t] + Bl[t]`` backward), so the scale between two frames is one
difference exact to its own rounding, however long the span: a frame's
work is its arcs plus one term per distinct span, and no array grows with
a span's length.  Cells are two-array cells (:mod:`.cells`), every
frame's kept (an arc reads ``beta_{t+k}``).

Per sequence: :func:`alpha_pass`, the log-likelihood, :func:`beta_pass`
(the betas, the posteriors' numerators and the mass of the arcs in flight
per span, in one pass over the out-arcs of each frame), then
:func:`frame_totals` divides each frame's posteriors by its total: the
paths through a state at ``t`` plus those on an arc read before ``t`` that
lands after it (window sums of the in-flight masses, and a sliding maximum
of their scales, which decides whether the scaled total is safe).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..numba_cache import njit
from .arrays import LatticeArrays, Side, SpanArrays
from .cells import SAFE, SAFE_TOTAL, final_max, live, logval, lse_push, normalise, store, store_lse
from .columns import frame_max, sequence_emissions, zero_columns

__all__ = ["SpanWork", "Alphas", "Betas", "run", "alpha_pass", "beta_pass", "frame_totals"]


class SpanWork(NamedTuple):
    """The distinct spans of a call and their per-span scratch (``K``: the
    longest span, ``nsp``: how many spans are longer than 1)."""

    ks: np.ndarray  #: int64 ``[nks]``: the distinct spans, ascending
    long: np.ndarray  #: int64 ``[max(nsp, 1)]``: the spans > 1 (``V``'s columns)
    nsp: int  #: how many spans are > 1
    g: np.ndarray  #: float64 ``[K + 1]``: per span, the log scale of the frame it reads, relative to the frame before
    r: np.ndarray  #: float64 ``[K + 1]``: per span, ``exp(g - R)`` (``R``: the largest ``g``)
    off: np.ndarray  #: float64 ``[K + 1]``: per span, the log offset the log domain adds
    gs: np.ndarray  #: float64 ``[K + 1]``: per span, the mass of the arcs read at a frame (backward)


class Alphas(NamedTuple):
    """The forward pass of one sequence (``L`` frames, ``W`` states)."""

    P: np.ndarray  #: float64 ``[L + 1, W]``: normalised alphas, scaled (0: kept as a log)
    LV: np.ndarray  #: float64 ``[L + 1, W]``: the logs of the cells not scaled (``-inf``: none)
    live: np.ndarray  #: bool ``[L + 1]``: whether the frame holds a path
    Oh: np.ndarray  #: float64 ``[L + 1]``: the frames' log offsets ``O_t = Oh[t] + Ol[t]``
    Ol: np.ndarray  #: float64 ``[L + 1]``


class Betas(NamedTuple):
    """The backward pass of one sequence."""

    Q: np.ndarray  #: float64 ``[L + 1, W]``: normalised betas, scaled (0: kept as a log)
    LQ: np.ndarray  #: float64 ``[L + 1, W]``: the logs of the cells not scaled
    live: np.ndarray  #: bool ``[L + 1]``: whether the frame holds a path
    Bh: np.ndarray  #: float64 ``[L + 1]``: the frames' log offsets ``OB_t = Bh[t] + Bl[t]`` (``OB_L = fmax``)
    Bl: np.ndarray  #: float64 ``[L + 1]``
    zt: np.ndarray  #: float64 ``[L + 1]``: ``alpha_t B_t`` summed, in alpha_t's units and frame t's ``R``
    Rb: np.ndarray  #: float64 ``[L + 1]``: each frame's ``R`` (the largest scale it reads)
    lcb: np.ndarray  #: float64 ``[L + 1]``: the log its betas were divided by
    V: np.ndarray  #: float64 ``[L + 1, nsp]``: per span, the mass of its arcs read at ``s``, a fraction of ``exp(A)``
    Hd: np.ndarray  #: float64 ``[L + 1, nsp]``: the log of their scale relative to ``exp(A)`` (``-inf``: no path)


# Frame offsets as running sums in double-double (a float64 pair ``hi + lo``):
# the difference of two frames' offsets is then exact to its own rounding,
# however large the offsets, in O(1) -- a span of any length reads its
# frames' scales without summing the increments in between.

@njit(nogil=True, inline="always")
def _two_sum(a, b):
    """``(s, e)``: ``s = fl(a + b)`` and its rounding error, ``a + b = s + e``."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit(nogil=True, inline="always")
def dd_add(h: float, lo: float, x: float) -> tuple[float, float]:
    """The double-double ``h + lo`` plus the float ``x``."""
    s, e = _two_sum(h, x)
    e += lo
    hs = s + e
    return hs, e - (hs - s)


@njit(nogil=True, inline="always")
def dd_diff(ah: float, al: float, bh: float, bl: float) -> float:
    """``(ah + al) - (bh + bl)`` as a float."""
    s, e = _two_sum(ah, -bh)
    return s + (e + (al - bl))


@njit(nogil=True, inline="always")
def dd_sum_minus(ah: float, al: float, bh: float, bl: float, c: float) -> float:
    """``(ah + al) + (bh + bl) - c`` as a float."""
    s1, e1 = _two_sum(ah, bh)
    s2, e2 = _two_sum(s1, -c)
    return s2 + (e2 + e1 + (al + bl))


@njit(nogil=True, inline="always")
def scales(g: np.ndarray, r: np.ndarray, off: np.ndarray, R: float, ks: np.ndarray) -> None:
    """``r[k] = exp(g[k] - R)`` and ``off[k] -= R`` for the spans ``k`` in
    ``ks`` (``g[k] = -inf`` marks a frame not in use: ``r[k] = 0``)."""
    for q in range(ks.shape[0]):
        k = ks[q]
        if g[k] == -np.inf:
            r[k] = 0.0
        else:
            r[k] = np.exp(g[k] - R)
        off[k] -= R


@njit(nogil=True, inline="always")
def max_ref(g: np.ndarray, ks: np.ndarray) -> float:
    """The largest of ``g[k]`` over the spans ``k`` in ``ks`` (NaN if one is
    NaN; 0 if all are ``-inf``)."""
    R = -np.inf
    for q in range(ks.shape[0]):
        v = g[ks[q]]
        if v != v:
            return v
        if v > R:
            R = v
    return R if R > -np.inf else 0.0


@njit(nogil=True, inline="always")
def alpha_sum(P: np.ndarray, LV: np.ndarray, t1: int, fwd: Side, span: np.ndarray, E: np.ndarray, cb: int,
              X: np.ndarray, r: np.ndarray, base: int, k: int) -> tuple[float, bool]:
    """Forward cell ``k`` at frame ``t1`` as the scaled sum over its in-arcs
    (``fwd``, spans ``span``), each read at frame ``t1 - span`` and rescaled
    by ``r[span]`` (column ``c``'s emission at ``E[frame, c - cb]``, its
    score at ``X[frame, c]``); and whether the log domain must decide a sum
    of 0: an arc whose scaled product is 0 with a live far end and a score
    above ``-inf``, or a NaN score (which the log domain propagates)."""
    ptr, other, w, col = fwd.ptr, fwd.other, fwd.w, fwd.col
    s = 0.0
    maybe = False
    for a in range(ptr[k], ptr[k + 1]):
        f = t1 - span[a]
        if f < 0:
            continue
        i = other[a] - base
        p = P[f, i]
        if p == 0.0:
            if LV[f, i] == -np.inf:
                if X[f, col[a]] != X[f, col[a]]:
                    maybe = True  # NaN in: the log domain makes the cell NaN
                continue
            p = np.exp(LV[f, i])
        v = p * w[a] * E[f, col[a] - cb] * r[span[a]]
        if v == 0.0:
            if not X[f, col[a]] == -np.inf:
                maybe = True
        else:
            s += v
    return s, maybe


@njit(nogil=True)
def alpha_log_domain(P: np.ndarray, LV: np.ndarray, t1: int, fwd: Side, span: np.ndarray, X: np.ndarray,
                     off: np.ndarray, base: int, k: int, out_P: np.ndarray, out_LV: np.ndarray, j: int) -> None:
    """Forward cell ``k`` at frame ``t1`` in the log domain: the log-sum-exp
    of ``log(far end) + log_prob + score + off[span]``."""
    ptr, other, lp, col = fwd.ptr, fwd.other, fwd.log_prob, fwd.col
    m = -np.inf
    acc = 0.0
    for a in range(ptr[k], ptr[k + 1]):
        f = t1 - span[a]
        if f < 0:
            continue
        i = other[a] - base
        m, acc = lse_push(m, acc, logval(P[f, i], LV[f, i]) + lp[a] + X[f, col[a]] + off[span[a]])
    store_lse(m, acc, out_P, out_LV, j)


@njit(nogil=True, inline="always")
def beta_sum(Q: np.ndarray, LQ: np.ndarray, t: int, L: int, bwd: Side, span: np.ndarray, Et: np.ndarray, cb: int,
             xt: np.ndarray, r: np.ndarray, base: int, k: int, ai: float, pt: np.ndarray,
             gs: np.ndarray) -> tuple[float, bool]:
    """Backward cell ``k`` at frame ``t`` as the scaled sum over its
    out-arcs (``bwd``, spans ``span``), each landing at frame ``t + span <=
    L`` rescaled by ``r[span]`` (column ``c``'s emission at ``Et[c - cb]``),
    and whether an arc whose scaled product is 0 may still carry a path (see
    :func:`alpha_sum`); with ``ai != 0`` (cell ``k``'s scaled alpha at frame
    ``t``) each arc's product times ``ai`` is added to its column of ``pt``
    (a posterior before the frame's normalisation) and, without
    ``r[span]`` (in the units of frame ``t + span``), to ``gs[span]``."""
    ptr, other, w, col = bwd.ptr, bwd.other, bwd.w, bwd.col
    s = 0.0
    maybe = False
    for a in range(ptr[k], ptr[k + 1]):
        sp = span[a]
        f = t + sp
        if f > L:
            continue
        j = other[a] - base
        c = col[a]
        q = Q[f, j]
        if q == 0.0:
            if LQ[f, j] == -np.inf:
                if xt[c] != xt[c]:
                    maybe = True  # NaN in: the log domain makes the cell NaN
                continue
            q = np.exp(LQ[f, j])
        u = q * w[a] * Et[c - cb]
        v = u * r[sp]
        if v == 0.0:
            if not xt[c] == -np.inf:
                maybe = True
        else:
            s += v
            if ai != 0.0:
                pt[c] += ai * v
        if ai != 0.0:
            gs[sp] += ai * u
    return s, maybe


@njit(nogil=True)
def beta_log_domain(Q: np.ndarray, LQ: np.ndarray, t: int, L: int, bwd: Side, span: np.ndarray, xt: np.ndarray,
                    off: np.ndarray, base: int, k: int, out_P: np.ndarray, out_LV: np.ndarray, j: int) -> None:
    """Backward cell ``k`` at frame ``t`` in the log domain."""
    ptr, other, lp, col = bwd.ptr, bwd.other, bwd.log_prob, bwd.col
    m = -np.inf
    acc = 0.0
    for a in range(ptr[k], ptr[k + 1]):
        f = t + span[a]
        if f > L:
            continue
        i = other[a] - base
        m, acc = lse_push(m, acc, logval(Q[f, i], LQ[f, i]) + lp[a] + xt[col[a]] + off[span[a]])
    store_lse(m, acc, out_P, out_LV, j)


@njit(nogil=True, inline="always")
def _span_work(ks):
    """The :class:`SpanWork` of the distinct spans ``ks`` (ascending)."""
    nks = ks.shape[0]
    K = ks[nks - 1] if nks else 1
    rank = np.full(K + 1, -1, np.int64)  # spans > 1, numbered: V's columns
    nsp = 0
    for q in range(nks):
        if ks[q] > 1:
            rank[ks[q]] = nsp
            nsp += 1
    long = np.empty(max(nsp, 1), np.int64)  # the spans > 1, by rank
    for q in range(nks):
        if ks[q] > 1:
            long[rank[ks[q]]] = ks[q]
    return SpanWork(ks, long, nsp, np.empty(K + 1), np.empty(K + 1), np.empty(K + 1), np.zeros(K + 1))


@njit(nogil=True)
def run(n0: int, n1: int, la: LatticeArrays, sa: SpanArrays, ks: np.ndarray, X: np.ndarray, lengths: np.ndarray,
        need_post: bool, loglike: np.ndarray, post: np.ndarray) -> None:
    """The one-frame pass's :func:`~.one_frame.run` for arcs that span
    frames: sequences ``n0 <= n < n1`` of ``la``
    (:class:`~.arrays.LatticeArrays`, ``sa`` its
    :class:`~.arrays.SpanArrays`; ``ks`` the distinct spans, ascending, of
    the arcs that can be on a path -- none longer than the longest sequence
    --), ``loglike[n]`` and their columns of ``post`` (which starts as
    zeros).  A sequence's emissions and frame maxima are formed first, into
    work arrays of its frames and columns (reused by the next sequence, so
    they stay in cache)."""
    sw = _span_work(ks)
    final = la.final
    maxL = 0
    width = 0
    for n in range(n0, n1):
        maxL = max(maxL, lengths[n])
        width = max(width, la.col_off[n + 1] - la.col_off[n])
    Ebuf = np.empty(maxL * width)
    Mrow = np.empty(maxL)
    bits = np.empty(width, np.int64)  # the exponential's scratch
    for n in range(n0, n1):
        cs0, cs1 = la.col_off[n], la.col_off[n + 1]
        s0 = la.state_off[n]
        W = la.state_off[n + 1] - s0
        L = lengths[n]
        for t in range(L):
            Mrow[t] = frame_max(X[t], cs0, cs1)
        E = Ebuf[:L * (cs1 - cs0)].reshape((L, cs1 - cs0))  # E[t, c - cs0] = exp(X[t, c] - Mrow[t])
        sequence_emissions(X, cs0, cs1, Mrow, E, bits)
        al, offset = alpha_pass(la.fwd, sa.in_span, la.start[n], s0, W, L, cs0, X, E, Mrow, la.wshift, sw)
        fmax = final_max(final, s0, W)
        PL, LVL = al.P[L], al.LV[L]
        m = -np.inf
        acc = 0.0
        for j in range(W):
            m, acc = lse_push(m, acc, logval(PL[j], LVL[j]) + final[s0 + j] - fmax)
        loglike[n] = (m + np.log(acc) + fmax + offset) if acc != 0.0 else -np.inf
        if not need_post or loglike[n] == -np.inf:
            continue
        # loglike[n]: the reference of the in-flight masses (any value would do: they are divided by their sum)
        be = beta_pass(la.bwd, sa.out_span, final, fmax, loglike[n], s0, W, L, cs0, cs1, X, E, Mrow, la.wshift,
                       sw, al, post)
        frame_totals(la.bwd, sa.out_span, sa.long, sa.long_span, loglike[n], s0, W, L, cs0, cs1, X, Mrow, la.wshift,
                     sw, al, be, post)


@njit(nogil=True)
def alpha_pass(fwd: Side, in_span: np.ndarray, start: int, s0: int, W: int, L: int, cs0: int, X: np.ndarray,
               E: np.ndarray, Mrow: np.ndarray, wshift: float, sw: SpanWork) -> tuple[Alphas, float]:
    """The forward pass of one sequence (states ``s0 .. s0 + W``, ``L``
    frames, emissions ``E``): its :class:`Alphas` and log offset."""
    ks, g, r, off = sw.ks, sw.g, sw.r, sw.off
    P = np.zeros((L + 1, W))
    LV = np.full((L + 1, W), -np.inf)
    lv = np.zeros(L + 1, np.bool_)
    Oh = np.zeros(L + 1)  # O_t = Oh[t] + Ol[t]
    Ol = np.zeros(L + 1)
    P[0, start - s0] = 1.0
    lv[0] = True
    offset = 0.0
    for t1 in range(1, L + 1):
        # frame s = t1 - k relative to frame t1 - 1: O_s - O_{t1-1}
        for q in range(ks.shape[0]):
            k = ks[q]
            s = t1 - k
            if s < 0:
                g[k] = -np.inf
                off[k] = 0.0
                continue
            d = dd_diff(Oh[s], Ol[s], Oh[t1 - 1], Ol[t1 - 1])
            off[k] = d
            g[k] = d + Mrow[s] + wshift if lv[s] else -np.inf
        R = max_ref(g, ks)
        scales(g, r, off, R, ks)
        Pn, LVn = P[t1], LV[t1]
        for j in range(W):
            v, maybe = alpha_sum(P, LV, t1, fwd, in_span, E, cs0, X, r, s0, s0 + j)
            if v >= SAFE or v != v or (v == 0.0 and not maybe):
                Pn[j] = v
                LVn[j] = -np.inf
            else:
                alpha_log_domain(P, LV, t1, fwd, in_span, X, off, s0, s0 + j, Pn, LVn, j)
        lc = normalise(Pn, LVn)
        lv[t1] = live(Pn, LVn)
        inc = R + lc
        offset += inc
        Oh[t1], Ol[t1] = dd_add(Oh[t1 - 1], Ol[t1 - 1], inc)
    return Alphas(P, LV, lv, Oh, Ol), offset


@njit(nogil=True)
def beta_pass(bwd: Side, out_span: np.ndarray, final: np.ndarray, fmax: float, A: float, s0: int, W: int, L: int,
              cs0: int, cs1: int, X: np.ndarray, E: np.ndarray, Mrow: np.ndarray, wshift: float, sw: SpanWork,
              al: Alphas, post: np.ndarray) -> Betas:
    """The backward pass of one sequence with a complete path: its
    :class:`Betas` (``A``: the reference of the in-flight masses) and, in
    its columns of ``post``, the posteriors' numerators ``alpha_t w E
    beta_{t+k} r[k]`` of every frame (divided by the frames' totals in
    :func:`frame_totals`).  One pass over the out-arcs of each frame."""
    ks, long, nsp, g, r, off, gs = sw.ks, sw.long, sw.nsp, sw.g, sw.r, sw.off, sw.gs
    P, lv, Oh, Ol = al.P, al.live, al.Oh, al.Ol
    ninf = -np.inf
    V = np.zeros((L + 1, max(nsp, 1)))
    Hd = np.full((L + 1, max(nsp, 1)), ninf)
    zt = np.zeros(L + 1)
    Rb = np.zeros(L + 1)
    lcb = np.zeros(L + 1)
    Q = np.zeros((L + 1, W))  # normalised betas of every frame, tiny cells as logs
    LQ = np.full((L + 1, W), ninf)
    liveb = np.zeros(L + 1, np.bool_)
    Bh = np.zeros(L + 1)  # OB_t = Bh[t] + Bl[t], OB_L = fmax
    Bl = np.zeros(L + 1)
    Bh[L] = fmax
    BP = np.empty(W)
    BL = np.empty(W)
    for j in range(W):
        store(final[s0 + j] - fmax, Q[L], LQ[L], j)
    liveb[L] = live(Q[L], LQ[L])
    for t in range(L - 1, -1, -1):
        xt, et, pt = X[t], E[t], post[t]
        shift = Mrow[t] + wshift
        # frame t + k relative to frame t + 1: OB_{t+k} - OB_{t+1}
        for q in range(ks.shape[0]):
            k = ks[q]
            f = t + k
            if f > L:
                g[k] = ninf
                off[k] = 0.0
                continue
            d = dd_diff(Bh[f], Bl[f], Bh[t + 1], Bl[t + 1])
            off[k] = d - shift
            g[k] = d if liveb[f] else ninf
        R = max_ref(g, ks)
        scales(g, r, off, R, ks)
        # one pass over the out-arcs of frame t: the beta sums B_t and, where alpha_t is scaled and nonzero,
        # the posteriors' numerators alpha_t w E beta_{t+k} r[k] into pt (divided by the frame's total in
        # frame_totals) and the per-span sums gs
        Pt = P[t]
        z = 0.0
        for q in range(ks.shape[0]):
            gs[ks[q]] = 0.0
        # written before the arcs add to it: a fresh page is mapped once, not read then copied
        zero_columns(post, t, t + 1, cs0, cs1)
        for i in range(W):
            ai = Pt[i] if lv[t] else 0.0
            v, maybe = beta_sum(Q, LQ, t, L, bwd, out_span, et, cs0, xt, r, s0, s0 + i, ai, pt, gs)
            if v >= SAFE or v != v or (v == 0.0 and not maybe):
                BP[i] = v
                BL[i] = ninf
            else:
                beta_log_domain(Q, LQ, t, L, bwd, out_span, xt, off, s0, s0 + i, BP, BL, i)
            if ai != 0.0 and BP[i] != 0.0:
                z += ai * BP[i]
        for q in range(nsp):
            k = long[q]
            f = t + k
            if f <= L and lv[t] and liveb[f]:
                h = dd_sum_minus(Oh[t], Ol[t], Bh[f], Bl[f], A) + shift  # gs[k]'s scale, relative to exp(A)
                Hd[t, q] = h
                G = gs[k]
                V[t, q] = np.exp(np.log(G) + h) if G > 0.0 else G  # (0 stays 0, NaN stays NaN)
        zt[t] = z
        Rb[t] = R
        Qt, LQt = Q[t], LQ[t]
        for i in range(W):
            Qt[i] = BP[i]
            LQt[i] = BL[i]
        lc = normalise(Qt, LQt)
        lcb[t] = lc
        liveb[t] = live(Qt, LQt)
        Bh[t], Bl[t] = dd_add(Bh[t + 1], Bl[t + 1], shift + R + lc)
    return Betas(Q, LQ, liveb, Bh, Bl, zt, Rb, lcb, V, Hd)


@njit(nogil=True)
def frame_totals(bwd: Side, out_span: np.ndarray, sp: Side, sp_span: np.ndarray, A: float, s0: int, W: int, L: int,
                 cs0: int, cs1: int, X: np.ndarray, Mrow: np.ndarray, wshift: float, sw: SpanWork, al: Alphas,
                 be: Betas, post: np.ndarray) -> None:
    """Each frame's posteriors (one sequence, numerators from
    :func:`beta_pass`) divided by the frame's total: the paths through a
    state at ``t`` (``alpha_t B_t``) plus those on an arc read at ``s < t``
    that lands after ``t`` -- per span ``k``, a window sum ``s in [t - k +
    1, t - 1]`` of the in-flight masses ``V`` (prefix sums ``PV``: absolute
    error ``L`` times float64's rounding of a total near 1), and the
    largest scale in the window (a sliding maximum over ``Hd``), which
    decides, as for one-frame arcs, whether the scaled total is safe; a
    frame with a small total is done again in the log domain (``sp``,
    ``sp_span``: the out-arcs of span > 1 and their spans; ``A``: the
    reference of :func:`beta_pass`)."""
    ks, long, nsp, off = sw.ks, sw.long, sw.nsp, sw.off
    P, LV, lv, Oh, Ol = al.P, al.LV, al.live, al.Oh, al.Ol
    Q, LQ, Bh, Bl, zt, Rb, lcb, V, Hd = be.Q, be.LQ, be.Bh, be.Bl, be.zt, be.Rb, be.lcb, be.V, be.Hd
    out_ptr, out_dst, out_lp, out_col = bwd.ptr, bwd.other, bwd.log_prob, bwd.col
    sp_ptr, sp_dst, sp_lp, sp_col = sp.ptr, sp.other, sp.log_prob, sp.col
    ninf = -np.inf
    log_safe_total = np.log(SAFE_TOTAL)
    nks = ks.shape[0]
    K = ks[nks - 1] if nks else 1
    # PV: V's prefix sums over the frames, dq: per span, the frames of its window by decreasing Hd (the sliding
    # maximum)
    PV = np.zeros((L + 2, max(nsp, 1)))
    for s in range(L + 1):
        for q in range(nsp):
            PV[s + 1, q] = PV[s, q] + V[s, q]
    dq = np.empty((max(nsp, 1), L + 1), np.int64)
    head = np.zeros(max(nsp, 1), np.int64)
    tail = np.zeros(max(nsp, 1), np.int64)
    for t in range(L):
        for q in range(nsp):  # frame t's window of span long[q]: s in [t - k + 1, t - 1]
            if t >= 1:
                h = Hd[t - 1, q]
                while tail[q] > head[q] and not Hd[dq[q, tail[q] - 1], q] > h:
                    tail[q] -= 1
                dq[q, tail[q]] = t - 1
                tail[q] += 1
            while head[q] < tail[q] and dq[q, head[q]] < t - long[q] + 1:
                head[q] += 1
        if not lv[t]:
            continue
        xt, pt = X[t], post[t]
        shift = Mrow[t] + wshift
        R = Rb[t]
        for q in range(nks):
            k = ks[q]
            f = t + k
            if f > L:
                off[k] = 0.0
                continue
            off[k] = dd_diff(Bh[f], Bl[f], Bh[t + 1], Bl[t + 1]) - shift - R
        # paths through a state at t (alpha_t B_t), plus those on an arc read at s = t - dd < t that lands at
        # s + k > t; relative to exp(A) (cA: the log of alpha_t's and B_t's units relative to exp(A))
        cA = dd_sum_minus(Oh[t], Ol[t], Bh[t + 1], Bl[t + 1], A) + shift + R
        zz = zt[t]
        tot = np.exp(np.log(zz) + cA) if zz > 0.0 else zz
        ref = 0.0  # the largest scale among the terms, in the units of frame t (as the scaled products see them)
        for q in range(nsp):
            lo = max(t - long[q] + 1, 0)
            if lo <= t - 1:
                tot += PV[t, q] - PV[lo, q]
            if head[q] < tail[q]:
                e = Hd[dq[q, head[q]], q] - cA
                if e > ref or e != e:
                    ref = e
        lt = np.log(tot) - cA - ref if tot > 0.0 else ninf  # the scaled total's log, as for one-frame arcs
        if tot != tot or tot == np.inf or ref != ref:  # NaN in: NaN out
            for a in range(out_ptr[s0], out_ptr[s0 + W]):
                pt[out_col[a]] = np.nan
        elif lt >= log_safe_total:
            inv = np.exp(cA - np.log(tot))
            for c in range(cs0, cs1):
                pt[c] *= inv
        else:  # a small total: the frame in the log domain (B_t from its normalised betas)
            zero_columns(post, t, t + 1, cs0, cs1)
            Pt, LVt, Qt, LQt = P[t], LV[t], Q[t], LQ[t]
            m = ninf
            acc = 0.0
            for i in range(W):
                m, acc = lse_push(m, acc, logval(Pt[i], LVt[i]) + logval(Qt[i], LQt[i]) + lcb[t])
            for dd in range(1, min(K, t + 1)):
                s = t - dd
                da = dd_diff(Oh[s], Ol[s], Oh[t], Ol[t])  # O_s - O_t
                for i in range(W):
                    la = logval(P[s, i], LV[s, i])
                    if la == ninf:
                        continue
                    for a in range(sp_ptr[s0 + i], sp_ptr[s0 + i + 1]):
                        k = sp_span[a]
                        if k <= dd or s + k > L:
                            continue
                        jd = sp_dst[a] - s0
                        fl = da + dd_diff(Bh[s + k], Bl[s + k], Bh[t + 1], Bl[t + 1]) - shift - R
                        m, acc = lse_push(m, acc, la + sp_lp[a] + X[s, sp_col[a]]
                                          + logval(Q[s + k, jd], LQ[s + k, jd]) + fl)
            if acc != 0.0:
                lz = m + np.log(acc)
                for i in range(W):
                    ai = logval(Pt[i], LVt[i]) - lz
                    if ai == ninf:
                        continue
                    for a in range(out_ptr[s0 + i], out_ptr[s0 + i + 1]):
                        k = out_span[a]
                        if t + k > L:
                            continue
                        jd = out_dst[a] - s0
                        pt[out_col[a]] += np.exp(ai + out_lp[a] + xt[out_col[a]] + off[k]
                                                 + logval(Q[t + k, jd], LQ[t + k, jd]))
