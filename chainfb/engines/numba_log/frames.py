"""One frame of the one-frame pass: the cells of frame ``t + 1`` from those
of frame ``t`` (the forward step, :func:`band_frame` over the in-arcs) or
``B_t`` from ``beta_{t+1}`` (the backward step, over the out-arcs), over
each frame's band, block by block, with the log-domain escape for the
cells whose scaled sum falls below the safe range.

A frame's cells are one-array cells (:mod:`.cells`) of its band: cell
``i`` of a frame whose band starts at ``lo`` is state ``base + lo + i``
(``base``: the sequence's first state); block ``q`` of the frame's block
references is the ``q``-th block the band touches.  Column ``c``'s
emission is ``E[c - cb]`` (``cb``: the sequence's first column) and its
score ``xt[c]``; ``shift = m_t + wshift`` is the frame's scale.
"""

from __future__ import annotations

import numpy as np

from ..numba_cache import njit
from .arrays import Side
from .cells import LOG_SAFE, SAFE, block_div, log1, lse_push, store1

__all__ = ["cell_log_domain", "low_cells_log_domain", "band_frame", "beta_frame_fused"]


@njit(nogil=True, inline="always")
def cell_log_domain(Pp: np.ndarray, Rp: np.ndarray, plo: int, sh: int, side: Side, xt: np.ndarray, base: int, k: int,
                    shift: float, ref: float, Pn: np.ndarray, j: int) -> None:
    """Cell ``j`` of ``Pn`` in the log domain (its scaled sum was below the
    safe range): the log-sum-exp of ``log(far end) + its block's reference -
    ref + log_prob + score - shift`` over the arcs of state ``k`` of
    ``side`` (:class:`~.arrays.Side`); far ends outside ``Pp``'s band (local
    index ``plo + i``) are zero."""
    ptr, other, lp, col = side.ptr, side.other, side.log_prob, side.col
    m = -np.inf
    acc = 0.0
    pw = Pp.shape[0]
    pb0 = plo >> sh
    for a in range(ptr[k], ptr[k + 1]):
        i = other[a] - base - plo
        if i < 0 or i >= pw:
            continue
        v = Pp[i]
        if v == 0.0:
            continue
        m, acc = lse_push(m, acc, log1(v) + Rp[((i + plo) >> sh) - pb0] - ref + lp[a] + xt[col[a]] - shift)
    if acc != acc:
        Pn[j] = acc
    elif acc == 0.0:
        Pn[j] = 0.0
    else:
        store1(m + np.log(acc), Pn, j)


@njit(nogil=True)
def low_cells_log_domain(Pp: np.ndarray, Rp: np.ndarray, plo: int, Pb: np.ndarray, blo: int, side: Side, xt: np.ndarray,
                         base: int, shift: float, sh: int, ref: float) -> float:
    """The cells of a block ``Pb`` (scaled sums just formed from ``Pp``
    along ``side``; cell ``j`` is state ``base + blo + j``) whose sum is
    below the safe range: zero when no far end holds a path, else their
    exact value in the log domain (:func:`cell_log_domain`, relative to
    ``ref``); returns the largest scaled cell of the block after that (0 if
    none)."""
    ptr, other = side.ptr, side.other
    pw = Pp.shape[0]
    c = 0.0
    for j in range(Pb.shape[0]):
        s = Pb[j]
        if s >= SAFE or s != s:
            if s > c:
                c = s
            continue
        Pb[j] = 0.0
        k = base + blo + j
        for a in range(ptr[k], ptr[k + 1]):
            i = other[a] - base - plo
            if i >= 0 and i < pw and Pp[i] != 0.0:  # a path: its exact value in the log domain
                cell_log_domain(Pp, Rp, plo, sh, side, xt, base, k, shift, ref, Pb, j)
                if Pb[j] > c:
                    c = Pb[j]
                break
    return c


@njit(nogil=True, inline="always")
def band_frame(Pp: np.ndarray, Rp: np.ndarray, plo: int, Pn: np.ndarray, Rn: np.ndarray, nlo: int, side: Side,
               xt: np.ndarray, E: np.ndarray, cb: int, base: int, shift: float, sh: int, bmin: np.ndarray,
               bmax: np.ndarray, fac: np.ndarray) -> None:
    """One frame of either direction over bands of blocks: cell ``j`` of
    ``Pn`` (state ``base + nlo + j``) from the far ends in ``Pp`` (state
    ``base + plo + i``; those outside the band are zero) along the arcs of
    ``side`` (the in-arcs: alpha; the out-arcs: ``B_t``).  Block ``kb`` (of
    ``2**sh`` states) reads blocks ``bmin[kb] .. bmax[kb]`` of ``Pp`` and is
    computed relative to their largest reference ``ref``, each far end's
    product taken ``exp(Rp[its block] - ref) <= 1`` times: the scaled sum
    when it is safe (or NaN), else the exact log-domain value (the sums in
    one pass, the cells below the safe range in a second, when there are
    any: the first pass's loop holds no escape); then the
    block is divided by its largest cell and ``Rn[block]`` set to ``ref``
    plus its log (``-inf``: all zero).  ``fac``: a work array of ``Pp``'s
    block count."""
    ptr, other, w, col = side.ptr, side.other, side.w, side.col
    pw = Pp.shape[0]
    nw = Pn.shape[0]
    pb0 = plo >> sh
    npb = Rp.shape[0]
    nb0 = nlo >> sh
    for kb in range(nb0, nb0 + Rn.shape[0]):
        j0 = max(nlo, kb << sh) - nlo
        j1 = min(nlo + nw, (kb + 1) << sh) - nlo
        q0 = max(bmin[kb], pb0) - pb0
        q1 = min(bmax[kb], pb0 + npb - 1) - pb0
        ref = -np.inf
        for q in range(q0, q1 + 1):  # the blocks read, and their largest reference
            if Rp[q] > ref:
                ref = Rp[q]
        Pb = Pn[j0:j1]
        if ref == -np.inf:  # every block read is all zero
            for j in range(Pb.shape[0]):
                Pb[j] = 0.0
            Rn[kb - nb0] = -np.inf
            continue
        single = q0 == q1  # one block read: its factor is 1
        if not single:
            for q in range(q0, q1 + 1):
                fac[q] = np.exp(Rp[q] - ref)
        c = 0.0  # the block's largest scaled cell
        low = 0
        for j in range(j0, j1):
            k = base + nlo + j
            s = 0.0
            if single:
                for a in range(ptr[k], ptr[k + 1]):
                    i = other[a] - base - plo
                    if i < 0 or i >= pw:
                        continue
                    p = Pp[i]  # a zero far end adds an exact 0 (w E is finite)
                    if p < 0.0:
                        p = np.exp(p + LOG_SAFE)
                    s += p * w[a] * E[col[a] - cb]
            else:
                for a in range(ptr[k], ptr[k + 1]):
                    i = other[a] - base - plo
                    if i < 0 or i >= pw:
                        continue
                    p = Pp[i]
                    if p < 0.0:
                        p = np.exp(p + LOG_SAFE)
                    s += p * w[a] * E[col[a] - cb] * fac[((i + plo) >> sh) - pb0]
            Pn[j] = s
            if s > c:
                c = s
            low += s < SAFE
        if low:  # cells below the safe range: zero, or their exact value in the log domain
            c = low_cells_log_domain(Pp, Rp, plo, Pb, nlo + j0, side, xt, base, shift, sh, ref)
        Rn[kb - nb0] = ref + block_div(Pb, c)


@njit(nogil=True, inline="always")
def beta_frame_fused(Qn: np.ndarray, Rq: np.ndarray, qlo: int, Pt: np.ndarray, Bt: np.ndarray, tlo: int, side: Side,
                     xt: np.ndarray, et: np.ndarray, cb: int, base: int, shift: float, sh: int, pt: np.ndarray,
                     slow: np.ndarray) -> tuple[float, float, int]:
    """The backward frame of a sequence whose frames are one block each, fused
    with its arc posteriors: ``B_t`` into ``Bt`` (from ``beta_{t+1}`` in
    ``Qn``, one block of reference ``Rq[0]``, along the out-arcs ``side``;
    divided by its largest, whose log is returned second) and, for every
    arc whose alpha and beta cells are both scaled, ``alpha_t(i) w E
    beta_{t+1}(j)`` added to ``pt`` -- the posterior times the frame's
    total, which is returned first (``sum_i alpha_t(i) B_t(i)`` over the
    scaled cells, before the division).  The states whose posteriors need
    more (an alpha or a far end kept as a log, or NaN) go to ``slow``; their
    count is returned third.  The ``B_t`` cells below the safe range, if
    any, take the log domain in a second pass.  Column ``c``'s emission is
    ``et[c - cb]``."""
    ptr, dst, w, col = side.ptr, side.other, side.w, side.col
    qw = Qn.shape[0]
    c = 0.0
    z = 0.0
    ns = 0
    low = 0
    for i in range(Bt.shape[0]):
        k = base + tlo + i
        p = Pt[i]
        s = 0.0
        logs = not p >= 0.0
        for a in range(ptr[k], ptr[k + 1]):
            d = dst[a] - base - qlo
            if d < 0 or d >= qw:
                continue
            qv = Qn[d]  # a zero far end adds an exact 0 (w E is finite)
            if qv < 0.0:
                logs = True
                s += w[a] * et[col[a] - cb] * np.exp(qv + LOG_SAFE)
            else:
                u = w[a] * et[col[a] - cb] * qv
                s += u
                if p > 0.0:
                    pt[col[a]] += p * u
        if logs:
            slow[ns] = i
            ns += 1
        Bt[i] = s
        if s > c:
            c = s
        if s < SAFE:
            low += 1
        elif p > 0.0:  # (or s is NaN)
            z += p * s
    if low:  # cells below the safe range: zero, or their exact value in the log domain
        c = low_cells_log_domain(Qn, Rq, qlo, Bt, tlo, side, xt, base, shift, sh, Rq[0])
    return z, block_div(Bt, c), ns
