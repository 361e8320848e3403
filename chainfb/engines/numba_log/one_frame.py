"""The one-frame pass: the forward-backward of lattices whose arcs all span
one frame, for a range of sequences (:func:`run`).

Per sequence: its frame maxima and emissions (:mod:`.columns`), the
forward pass (:func:`alpha_pass`: :func:`.frames.band_frame` over the
in-arcs, frame by frame), the log-likelihood (:func:`sequence_loglike`),
and the backward pass with the arc posteriors (:func:`beta_pass`: per
frame, ``B_t`` and the posteriors fused in one pass over the arcs when
the frames are one block each, else ``B_t`` by :func:`.frames.band_frame`
over the out-arcs, the frame's total :func:`frame_log_total` and
:func:`arc_posteriors`).  The representation and why it is exact: the
package docstring.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..numba_cache import njit
from .arrays import Blocks, Distances, LatticeArrays, Side
from .bands import band_layout, sequence_band
from .cells import LOG_NEGLIGIBLE, LOG_SAFE, SAFE_TOTAL, block_norm, final_max, log1, lse_push, renorm, store1
from .columns import emission_row, frame_max, sequence_emissions, zero_columns
from .frames import band_frame, beta_frame_fused

__all__ = ["Sequence", "Work", "run", "alpha_pass", "sequence_loglike", "beta_pass", "frame_log_total",
           "arc_posteriors", "arc_posteriors_log"]


class Sequence(NamedTuple):
    """One sequence of the pass: its states, columns, frames and bands."""

    s0: int  #: its first state
    W: int  #: its number of states
    L: int  #: its length (frames)
    c0: int  #: its first column
    c1: int  #: one past its last column
    lo: np.ndarray  #: int64 ``[L + 1]``: the first live state of each frame's band (local)
    off: np.ndarray  #: int64 ``[L + 2]``: frame ``t``'s cells are ``A[off[t]:off[t + 1]]``
    rof: np.ndarray  #: int64 ``[L + 2]``: frame ``t``'s block references are ``RA[rof[t]:rof[t + 1]]``
    in_bmin: np.ndarray  #: int64 ``[its blocks]``: the first block each block's in-arcs come from
    in_bmax: np.ndarray  #: int64 ``[its blocks]``: the last one
    out_bmin: np.ndarray  #: int64 ``[its blocks]``: the first block each block's out-arcs go to
    out_bmax: np.ndarray  #: int64 ``[its blocks]``: the last one


class Work(NamedTuple):
    """The work arrays of a range of sequences, allocated once for them all
    (``width``: the widest band, ``nb = (width >> sh) + 2`` blocks)."""

    A: np.ndarray  #: float64 ``[cells]``: alpha of every frame's band, one-array cells
    RA: np.ndarray  #: float64 ``[refs]``: each frame's block references, relative to its largest
    Q: np.ndarray  #: float64 ``[width]``: ``beta_{t+1}``
    RQ: np.ndarray  #: float64 ``[nb]``: its block references
    BP: np.ndarray  #: float64 ``[width]``: ``B_t``
    RB: np.ndarray  #: float64 ``[nb]``: its block references
    left: np.ndarray  #: int64 ``[width]``: the states the fused backward frame leaves to the log domain
    fac: np.ndarray  #: float64 ``[nb]``: per block read, ``exp(R[block] - ref)``
    gb: np.ndarray  #: float64 ``[nb]``: per block of betas, the posterior factor ``exp(R_alpha + R_beta - lz)``
    Ebuf: np.ndarray  #: float64 ``[most]``: the held emissions of a sequence (``[L, c1 - c0]``)
    ew: np.ndarray  #: float64 ``[widest sequence's columns]``: one frame's emissions, when not held
    bits: np.ndarray  #: int64 ``[widest sequence's columns]``: the vector exponential's scratch
    Mrow: np.ndarray  #: float64 ``[longest]``: the frame maxima ``m_t``


@njit(nogil=True, inline="always")
def _work(n0, n1, bands, sh, col_off, lengths, ebytes):
    """The :class:`Work` of the sequences ``n0 <= n < n1`` (``bands``: their
    :class:`~.bands.Bands`), emissions held for the sequences whose
    ``[L, c1 - c0]`` float64 take at most ``ebytes``."""
    width = bands.width
    nb = (width >> sh) + 2
    cw = 0  # the widest sequence (columns), and the most emissions held
    most = 0
    maxL = 0
    for n in range(n0, n1):
        w = col_off[n + 1] - col_off[n]
        cw = max(cw, w)
        maxL = max(maxL, lengths[n])
        if 8 * lengths[n] * w <= ebytes:
            most = max(most, lengths[n] * w)
    return Work(np.empty(bands.cells), np.empty(bands.refs), np.empty(width), np.empty(nb), np.empty(width),
                np.empty(nb), np.empty(width, np.int64), np.empty(nb), np.empty(nb), np.empty(most), np.empty(cw),
                np.empty(cw, np.int64), np.empty(maxL))


@njit(nogil=True)
def run(n0: int, n1: int, la: LatticeArrays, dist: Distances, blocks: Blocks, X: np.ndarray, lengths: np.ndarray,
        ebytes: int, need_post: bool, loglike: np.ndarray, post: np.ndarray) -> None:
    """Sequences ``n0 <= n < n1`` of the lattice ``la``
    (:class:`~.arrays.LatticeArrays`; ``dist``: its
    :class:`~.arrays.Distances`, ``blocks`` its :class:`~.arrays.Blocks`):
    ``loglike[n]`` and, if ``need_post``, their columns of ``post [T, C]``
    (every row written), from the scores ``X [T, C]``.  The emissions
    ``exp(X[t, c] - m_t)`` are formed at the sequence's start into a work
    array of its frames and columns when that takes at most ``ebytes`` (the
    next sequence reuses it), else a frame's row at a time where it is read.
    Only the cells of each frame's live band are computed and stored."""
    sh = blocks.shift
    bands = band_layout(n0, n1, la.state_off, dist, sh, lengths)
    work = _work(n0, n1, bands, sh, la.col_off, lengths, ebytes)
    Mrow, out_ptr, out_col = work.Mrow, la.bwd.ptr, la.bwd.col
    for n in range(n0, n1):
        s0 = la.state_off[n]
        W = la.state_off[n + 1] - s0
        L = lengths[n]
        c0, c1 = la.col_off[n], la.col_off[n + 1]
        b0, b1 = blocks.offsets[n], blocks.offsets[n + 1]
        lo, hi, off, rof = sequence_band(bands, n - n0)
        seq = Sequence(s0, W, L, c0, c1, lo, off, rof, blocks.in_min[b0:b1], blocks.in_max[b0:b1],
                       blocks.out_min[b0:b1], blocks.out_max[b0:b1])
        if need_post:  # the frames past the sequence's length: zero posteriors
            zero_columns(post, L, post.shape[0], c0, c1)
        held = 8 * L * (c1 - c0) <= ebytes  # else each frame's row is formed where it is read
        Es = work.Ebuf[:L * (c1 - c0) if held else 0].reshape((L if held else 0, c1 - c0))
        bad = False  # a NaN or +inf score in a frame: NaN out, whatever the band
        for t in range(L):
            Mrow[t] = frame_max(X[t], c0, c1, not held)
            if Mrow[t] != Mrow[t] or Mrow[t] == np.inf:
                bad = True
        if not bad and held:  # the held emissions, formed now: a NaN among them is a NaN score
            bad = sequence_emissions(X, c0, c1, Mrow, Es, work.bits)
        if bad:
            loglike[n] = np.nan
            if need_post:
                for t in range(L):
                    for a in range(out_ptr[s0], out_ptr[s0 + W]):
                        post[t, out_col[a]] = np.nan
            continue
        empty = False
        for t in range(L + 1):
            if hi[t] < lo[t]:
                empty = True
        if empty:  # no path of exactly L arcs reaches a final state
            loglike[n] = -np.inf
            if need_post:
                zero_columns(post, 0, L, c0, c1)
            continue
        offset = alpha_pass(la.fwd, la.start[n], seq, sh, la.wshift, X, Es, work)
        loglike[n] = sequence_loglike(la.final, seq, sh, work, offset)
        if not need_post:
            continue
        if loglike[n] == -np.inf:  # no complete path: zero posteriors
            zero_columns(post, 0, L, c0, c1)
            continue
        beta_pass(la.bwd, la.final, seq, sh, la.wshift, X, Es, work, post)


@njit(nogil=True)
def alpha_pass(fwd: Side, start: int, seq: Sequence, sh: int, wshift: float, X: np.ndarray, Es: np.ndarray,
               work: Work) -> float:
    """The forward pass of one sequence: alpha of every frame ``0 .. L``
    into ``work.A`` (frame ``t``'s band at ``seq.off[t]``), its block
    references into ``work.RA``, from the start state ``start`` along the
    in-arcs ``fwd``; returns the sequence's log offset (the frames' shifts
    and normalisers, summed)."""
    A, RA, Mrow, ew, bits, fac = work.A, work.RA, work.Mrow, work.ew, work.bits, work.fac
    s0, L, c0, c1, lo, off, rof = seq.s0, seq.L, seq.c0, seq.c1, seq.lo, seq.off, seq.rof
    bmin, bmax = seq.in_bmin, seq.in_bmax
    P0 = A[0:off[1]]
    for j in range(P0.shape[0]):
        P0[j] = 0.0
    R0 = RA[0:rof[1]]
    for q in range(R0.shape[0]):
        R0[q] = -np.inf
    P0[start - s0 - lo[0]] = 1.0  # the start is live at frame 0 (dstart = 0)
    R0[((start - s0) >> sh) - (lo[0] >> sh)] = 0.0
    offset = 0.0
    for t in range(L):
        shift = Mrow[t] + wshift
        et = emission_row(X, t, c0, c1, Mrow, Es, ew, bits)
        Rn = RA[rof[t + 1]:rof[t + 2]]
        band_frame(A[off[t]:off[t + 1]], RA[rof[t]:rof[t + 1]], lo[t], A[off[t + 1]:off[t + 2]], Rn, lo[t + 1],
                   fwd, X[t], et, c0, s0, shift, sh, bmin, bmax, fac)
        offset += shift + renorm(Rn)
    return offset


@njit(nogil=True, inline="always")
def sequence_loglike(final: np.ndarray, seq: Sequence, sh: int, work: Work, offset: float) -> float:
    """The log-likelihood of one sequence: the log-sum-exp of ``alpha_L +
    final`` plus its log ``offset`` (``-inf``: no complete path)."""
    s0, L, lo = seq.s0, seq.L, seq.lo
    fmax = final_max(final, s0, seq.W)
    m = -np.inf
    acc = 0.0
    PL = work.A[seq.off[L]:seq.off[L + 1]]
    RL = work.RA[seq.rof[L]:seq.rof[L + 1]]
    lb = lo[L] >> sh
    for j in range(PL.shape[0]):
        m, acc = lse_push(m, acc, log1(PL[j]) + RL[((lo[L] + j) >> sh) - lb] + final[s0 + lo[L] + j] - fmax)
    return (m + np.log(acc) + fmax + offset) if acc != 0.0 else -np.inf


@njit(nogil=True)
def beta_pass(bwd: Side, final: np.ndarray, seq: Sequence, sh: int, wshift: float, X: np.ndarray, Es: np.ndarray,
              work: Work, post: np.ndarray) -> None:
    """The backward pass of one sequence with a complete path, along the
    out-arcs ``bwd``: ``B_t`` frame by frame from ``beta_L = final`` and
    the arc posteriors of every frame ``t < L`` into its columns of
    ``post`` (each frame's columns zeroed first), from the alphas of
    :func:`alpha_pass` in ``work``."""
    s0, L, c0, c1, lo, off, rof = seq.s0, seq.L, seq.c0, seq.c1, seq.lo, seq.off, seq.rof
    A, RA, Mrow, gb, left = work.A, work.RA, work.Mrow, work.gb, work.left
    ew, bits, fac = work.ew, work.bits, work.fac
    Q, RQ, BP, RB = work.Q, work.RQ, work.BP, work.RB
    bmin, bmax = seq.out_bmin, seq.out_bmax
    out_ptr, out_col = bwd.ptr, bwd.col
    W = seq.W
    fmax = final_max(final, s0, W)
    qlo = lo[L]
    qw = off[L + 1] - off[L]
    nqb = rof[L + 1] - rof[L]
    lb = qlo >> sh
    for j in range(qw):
        store1(final[s0 + qlo + j] - fmax, Q, j)
    for q in range(nqb):
        j0 = max(qlo, (lb + q) << sh) - qlo
        j1 = min(qlo + qw, (lb + q + 1) << sh) - qlo
        RQ[q] = block_norm(Q[j0:j1])
    for t in range(L - 1, -1, -1):
        xt, pt = X[t], post[t]
        shift = Mrow[t] + wshift
        et = emission_row(X, t, c0, c1, Mrow, Es, ew, bits)
        Qn = Q[:qw]
        Rq = RQ[:nqb]
        Pt = A[off[t]:off[t + 1]]
        Ra = RA[rof[t]:rof[t + 1]]
        tw = Pt.shape[0]
        ntb = Ra.shape[0]
        tlo = lo[t]
        Bt = BP[:tw]
        Rb = RB[:ntb]
        fused = False
        zero_columns(post, t, t + 1, c0, c1)  # the frame's columns, before the arcs add to them
        if ntb == 1 and nqb == 1 and Ra[0] > -np.inf and Rq[0] > -np.inf:
            # one block each: B_t and the posteriors times Z in one pass over the arcs
            z, lc, ns = beta_frame_fused(Qn, Rq, qlo, Pt, Bt, tlo, bwd, xt, et, c0, s0, shift, sh, pt, left)
            Rb[0] = Rq[0] + lc
            if z >= SAFE_TOTAL and z < np.inf:
                # every term left out of z is below 1e-88 of it, and every posterior p above 1e-88
                # of it was formed as p z > 1e-288 without underflow: times 1 / z
                fused = True
                g = 1.0 / z  # at most 1e200
                for c in range(c0, c1):
                    pt[c] *= g
                lz = Ra[0] + Rq[0] + np.log(z)
                ra = Ra[0] - lz
                gb[0] = np.exp(ra + Rq[0])
                for q in range(ns):  # the arcs the fused pass left: in the log domain
                    i = left[q]
                    p = Pt[i]
                    if p == 0.0 or (p < 0.0 and ra + p + LOG_SAFE < LOG_NEGLIGIBLE):
                        continue
                    arc_posteriors_log(pt, p, p > 0.0, ra, s0 + tlo + i, bwd, Qn, Rq, gb, s0, qlo, sh, xt, et, c0,
                                       shift)
            else:  # a small total: start the frame's posteriors again below
                zero_columns(post, t, t + 1, c0, c1)
        else:
            band_frame(Qn, Rq, qlo, Bt, Rb, tlo, bwd, xt, et, c0, s0, shift, sh, bmin, bmax, fac)
        if not fused:
            lz = frame_log_total(Pt, Ra, Bt, Rb, tlo, sh)
            if lz != lz or lz == np.inf:  # NaN in: NaN out
                for a in range(out_ptr[s0], out_ptr[s0 + W]):
                    pt[out_col[a]] = np.nan
            elif lz > -np.inf:
                arc_posteriors(pt, Pt, Ra, tlo, Qn, Rq, qlo, lz, bwd, s0, c0, bmin, bmax, gb, sh, xt, et, shift)
        Q, BP = BP, Q  # B_t becomes the next frame's beta_{t+1}
        RQ, RB = RB, RQ
        renorm(RQ[:ntb])
        qw = tw
        qlo = tlo
        nqb = ntb


@njit(nogil=True, inline="always")
def frame_log_total(Pt: np.ndarray, Ra: np.ndarray, Bt: np.ndarray, Rb: np.ndarray, tlo: int, sh: int) -> float:
    """The log of frame ``t``'s total ``Z_t = sum_i alpha_t(i) B_t(i)``,
    block by block (``Pt``, ``Bt``: the band's cells from ``tlo``; ``Ra``,
    ``Rb``: their block references): scaled products where a block's sum is
    safe, else the block in the log domain; NaN when a term is."""
    tw = Pt.shape[0]
    tb0 = tlo >> sh
    m = -np.inf
    acc = 0.0
    for q in range(Ra.shape[0]):
        if Ra[q] == -np.inf or Rb[q] == -np.inf:
            continue
        j0 = max(tlo, (tb0 + q) << sh) - tlo
        j1 = min(tlo + tw, (tb0 + q + 1) << sh) - tlo
        z = 0.0
        for i in range(j0, j1):
            p = Pt[i]
            b = Bt[i]
            if p != 0.0 and b != 0.0 and not (p < 0.0 or b < 0.0):
                z += p * b
        if z >= SAFE_TOTAL and z < np.inf:
            # every term left out (a cell kept as a log) is below 1e-88 of z
            m, acc = lse_push(m, acc, Ra[q] + Rb[q] + np.log(z))
        elif z != z or z == np.inf:
            m, acc = lse_push(m, acc, z)
        else:  # a small total: the block in the log domain
            for i in range(j0, j1):
                m, acc = lse_push(m, acc, log1(Pt[i]) + log1(Bt[i]) + Ra[q] + Rb[q])
    return m + np.log(acc) if acc != 0.0 else -np.inf


@njit(nogil=True, inline="always")
def arc_posteriors(pt: np.ndarray, Pt: np.ndarray, Ra: np.ndarray, tlo: int, Qn: np.ndarray, Rq: np.ndarray, qlo: int,
                   lz: float, bwd: Side, s0: int, c0: int, bmin: np.ndarray, bmax: np.ndarray, gb: np.ndarray, sh: int,
                   xt: np.ndarray, et: np.ndarray, shift: float) -> None:
    """The posteriors of the arcs read at frame ``t`` into its row ``pt``:
    ``alpha w E beta exp(Ra[its block] + Rq[its block] - lz)`` with ``lz``
    the frame's log total, the factor formed per block of sources for the
    blocks its arcs reach (``gb``); scaled products where they are exact
    (:func:`scaled_arc`), the others by :func:`arc_posteriors_log` (``s0``,
    ``c0``: the sequence's first state and column; ``bmin .. bmax``: the
    blocks each of its blocks' out-arcs reach)."""
    ptr, dst, w, col = bwd.ptr, bwd.other, bwd.w, bwd.col
    qw = Qn.shape[0]
    nqb = Rq.shape[0]
    qb0 = qlo >> sh
    tb0 = tlo >> sh
    qa = -1
    ra = 0.0
    for i in range(Pt.shape[0]):
        p = Pt[i]
        if p == 0.0:
            continue
        if ((tlo + i) >> sh) - tb0 != qa:
            qa = ((tlo + i) >> sh) - tb0
            ra = Ra[qa] - lz
            g0 = max(bmin[tb0 + qa], qb0) - qb0
            g1 = min(bmax[tb0 + qa], qb0 + nqb - 1) - qb0
            for q in range(g0, g1 + 1):
                gb[q] = np.exp(ra + Rq[q])
        if p < 0.0 and ra + p + LOG_SAFE < LOG_NEGLIGIBLE:
            continue  # every arc's posterior is below 1e-88 (beta cells and factors <= 1)
        fast = p > 0.0
        slow = False
        k = s0 + tlo + i
        for a in range(ptr[k], ptr[k + 1]):
            d = dst[a] - s0 - qlo
            if d < 0 or d >= qw:
                continue
            qv = Qn[d]
            if qv == 0.0:
                continue
            g = gb[((d + qlo) >> sh) - qb0]
            c = col[a]
            if scaled_arc(fast, qv, g, et[c - c0], xt[c]):
                # g * p is finite and the other factors are <= 1: the product is exact
                # unless it underflows, and then it is below DBL_MIN
                pt[c] += g * p * w[a] * et[c - c0] * qv
            else:
                slow = True
        if slow:
            arc_posteriors_log(pt, p, fast, ra, k, bwd, Qn, Rq, gb, s0, qlo, sh, xt, et, c0, shift)


@njit(nogil=True, inline="always")
def scaled_arc(fast: bool, qv: float, g: float, e: float, x: float) -> bool:
    """Whether an arc's posterior is taken from the scaled product ``g p w e
    qv`` (alpha cell scaled, beta cell ``qv`` scaled, factor ``g`` finite,
    and the emission ``e`` nonzero unless the score ``x`` is ``-inf``: an
    emission that underflowed, times a large ``g``, need not be negligible);
    else :func:`arc_posteriors_log` takes it in the log domain."""
    return fast and qv > 0.0 and g < np.inf and (e > 0.0 or x == -np.inf)


@njit(nogil=True)
def arc_posteriors_log(pt: np.ndarray, p: float, fast: bool, ra: float, k: int, bwd: Side, Qn: np.ndarray,
                       Rq: np.ndarray, gb: np.ndarray, s0: int, qlo: int, sh: int, xt: np.ndarray, et: np.ndarray,
                       cb: int, shift: float) -> None:
    """The arc posteriors of state ``k`` (alpha cell ``p``, ``fast``: scaled)
    that its scaled loop left: a far end kept as a log (or NaN), a factor
    ``gb`` out of range, or an emission ``et`` that underflowed -- in the
    log domain, those below 1e-88 left out (column ``c``'s emission is
    ``et[c - cb]``)."""
    ptr, dst, lp, col = bwd.ptr, bwd.other, bwd.log_prob, bwd.col
    qw = Qn.shape[0]
    qb0 = qlo >> sh
    for a in range(ptr[k], ptr[k + 1]):
        d = dst[a] - s0 - qlo
        if d < 0 or d >= qw:
            continue
        qv = Qn[d]
        qb = ((d + qlo) >> sh) - qb0
        if qv == 0.0 or scaled_arc(fast, qv, gb[qb], et[col[a] - cb], xt[col[a]]):
            continue
        lb = ra + Rq[qb]  # a bound on the log (w E <= 1, scaled cells <= 1)
        if p < 0.0:
            lb += p + LOG_SAFE
        if qv < 0.0:
            lb += qv + LOG_SAFE
        if lb < LOG_NEGLIGIBLE:  # a posterior below 1e-88 (the frame's sum is 1)
            continue
        c = col[a]
        pt[c] += np.exp(log1(p) + lp[a] + xt[c] - shift + log1(qv) + ra + Rq[qb])
