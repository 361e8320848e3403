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

Blocks (the span-1 pass, in lattices with a sequence of more than
``_MIN_BLOCKED_STATES`` states whose arcs stay within a few blocks of the
numbering): one scale per frame leaves most of a long band below ``_SAFE``
of the frame's largest (alpha spreads over thousands of nats across it), so
each block of ``2**_BLOCK_SHIFT`` states keeps its own log reference instead.
Block ``b`` of frame ``t + 1`` is formed relative to the largest reference
``ref`` of the blocks its arcs read (cached per lattice as a range of
blocks); each far end's product is multiplied by ``exp(R_t[its block] -
ref) <= 1`` (nothing overflows; a cell whose scaled sum falls below
``_SAFE`` takes the log-domain escape with the same offsets), and the block
is then divided by its largest cell.  The references are kept relative to
the frame's largest, whose log joins the sequence's offset.  An arc
posterior is ``alpha w E beta exp(R_alpha + R_beta - log Z_t)``, one factor
``g`` per pair of blocks (``g p`` finite and the other factors at most 1: the
product is exact unless it underflows below ``DBL_MIN``); an arc with a cell
kept as a log takes the log domain, unless a bound on its posterior (cells
and ``w E`` at most 1) is below ``1e-88`` of the frame's total, the terms the
scaled products leave out.  The emissions are formed inside the pass,
with a compiled vector exponential: a sequence's, at its start, into a
work array that the next sequence reuses (it stays in cache) when they
take up to ``_EMISSIONS_BYTES``; a longer sequence's a frame's row at a
time where it is read.  No second ``[T, C]`` array is held.  Float32
scores are read as they are (each widened exactly where it is read: the
numbers of a float64 copy at half its memory).

Arc posteriors at frame ``t`` are ``alpha_t(i) w E beta_{t+1}(j) / Z_t``
with the frame's own total ``Z_t = sum_i alpha_t(i) B_t(i)``, as the NumPy
engine normalises them.  When the scaled total is at least ``1e-200``,
every term left out of it (a cell kept as a log, below ``1e-290`` times at
most the out-degree) is below ``1e-88`` of it and the scaled products are
used; a frame with a smaller total is done in the log domain.  A backward
frame whose cells (and its successor's) are one block -- every frame when
no sequence has more than ``_MIN_BLOCKED_STATES`` states -- is fused with its
posteriors: while ``B_t(i)`` is summed, each arc whose alpha and beta cells
are both scaled adds ``alpha w E beta`` (its posterior times ``Z_t``) to its
column and ``Z_t`` is summed along; the sequence's columns of the frame are
then multiplied by ``1 / Z_t``.  With ``Z_t >= 1e-200``, a posterior above
``1e-88`` was formed as a number above ``1e-288`` (no underflow); the
states with a cell kept as a log finish their arcs in the log domain
afterwards, and a frame with a smaller total clears its columns and takes
the path above.

Arcs that span frames (``lat.max_span > 1``, semantics in
:mod:`chainfb.engines`: an arc read at frame ``t`` lands at ``t + span``)
run in a second compiled pass, chosen once per call, so one-frame lattices
keep the pass above unchanged.  It forms a sequence's emissions itself,
into work arrays of that sequence's frames and columns that the next
sequence reuses (they stay in cache; no ``[T, C]`` array besides the
scores and posteriors).  An arc from frame ``t + 1 - k`` into frame
``t + 1`` combines cells of different frames' scales: each frame's log
offset is kept as a double-double running sum, so the scale between two
frames is one difference exact to its own rounding (no large offsets
cancel, however long the span), and frame ``t + 1`` is
formed relative to the largest of its source frames' references ``O_s + m_s``
(frames without any path left out), each source frame's products rescaled
by ``exp`` of its difference to it -- at most 1, so nothing overflows, and a
cell whose scaled sum falls below ``_SAFE`` takes the log-domain escape as
above, exact however far it lies below.  The betas are kept for every frame
(an arc reads ``beta_{t+k}``); the posteriors of frame ``t`` are normalised
by the frame's own total, the paths through a state at ``t``
(``alpha_t B_t``) plus those on an arc read before ``t`` that lands after
it (scaled, or in the log domain when that total is small).  The backward
reads each arc once per frame: one pass gives the beta sums, the
posteriors' numerators and the per-span sums of the arcs read at the frame;
the frames' totals, which need the arcs read at earlier frames (window sums
of those per-span sums), and the division by them follow the backward.  A
frame's work is its arcs plus a few terms per distinct span, and no array
grows with a span's length: an arc longer than every sequence is left out
(it is on no path), and a duration of 999 frames costs what one of 4 does.

Sequences are independent: the compiled function releases the GIL and
contiguous ranges of sequences, a few per thread of about equal work, run
on :func:`chainfb.engines.get_num_threads` threads, the largest first, each
thread taking the next range left; columns belong to one sequence, so the
threads never write the same posterior.  NaN in a sequence's scores gives NaN out for that sequence
only.  ``CHAINFB_NUMBA=0`` in the environment leaves Numba unused (``auto``
then picks the NumPy engine).  No leaky HMM and no Viterbi here (those run
on the NumPy engines; :func:`chainfb.engines.select` knows).
"""

from __future__ import annotations

import os

import numpy as np

from ..lattice import Lattice
from . import numba_cache
from .threads import PARTS_PER_THREAD, get_num_threads, parallel

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
    return numba_cache.njit(nogil=True)(fn) if numba is not None else fn


def _inline(fn):
    """A helper compiled into its callers (no call per cell)."""
    return numba_cache.njit(nogil=True, inline="always")(fn) if numba is not None else fn


# a sum of scaled probabilities at least this large is exact to float64's
# rounding even if some of its terms underflowed (each lost term is below
# DBL_MIN ~ 2.2e-308, so the relative error is below 1e-17 per term)
_SAFE = 1e-290
_LOG_SAFE = float(np.log(_SAFE))
# frame totals (alpha * beta) above this: posteriors from the scaled values
_SAFE_TOTAL = 1e-200
# arc posteriors below this (of a frame's total 1) are left out, as in the scaled products
_LOG_NEGLIGIBLE = float(np.log(1e-88))
# the span-1 pass keeps a log reference per block of 2**_BLOCK_SHIFT states
_BLOCK_SHIFT = 5
# ... unless its blocks' arcs reach more blocks than this on average (then one block per sequence)
_MAX_BLOCK_SPREAD = 4.0
# ... and only in lattices with a sequence of more states than this (below it, the frame's one
# scale leaves few cells to the log-domain escape, and blocks would cost more than they save)
_MIN_BLOCKED_STATES = 512
# a sequence's emissions (float64, frames x columns) up to this size: the span-1 pass forms them at
# the sequence's start into a work array the next sequence reuses; larger ones, a frame's row at a
# time where it is read (twice, once per direction)
_EMISSIONS_BYTES = 8 << 20


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


@_inline
def _final_max(final, s0, W):
    """The largest final log-weight of the states ``s0 .. s0 + W`` (0 if none
    is final): the shift that keeps the final sum in range."""
    fmax = -np.inf
    for j in range(W):
        if final[s0 + j] > fmax:
            fmax = final[s0 + j]
    return fmax if fmax > -np.inf else 0.0


@_inline
def _store_lse(m, acc, P, LV, j):
    """Keep the log-sum-exp ``m + log(acc)`` (:func:`_lse_push`) in cell
    ``j``: NaN stays NaN, an empty sum is 0."""
    if acc != acc:
        P[j], LV[j] = acc, -np.inf
    elif acc == 0.0:
        P[j], LV[j] = 0.0, -np.inf
    else:
        _store(m + np.log(acc), P, LV, j)


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


# ---------------------------------------------------------------------------
# The span-1 pass stores each cell in one float64: a scaled probability
# (``v >= 0``; 0 is a true zero), or, for a cell below ``_SAFE`` of its
# frame's largest, its log ``r`` as ``v = r - _LOG_SAFE < 0`` (so never
# ambiguous, whatever the threshold), or NaN.  Only each frame's band of live states is computed and stored.


@_inline
def _log1(v):
    """The log of a one-array cell ``v`` (``-inf`` for 0, NaN for NaN)."""
    if v > 0.0:
        return np.log(v)
    if v < 0.0:
        return v + _LOG_SAFE
    if v == 0.0:
        return -np.inf
    return v


@_inline
def _store1(r, A, j):
    """Keep the log value ``r`` in one-array cell ``j``: scaled when safe,
    else as ``r - _LOG_SAFE < 0``; ``-inf`` is a true zero, NaN stays NaN."""
    if r >= _LOG_SAFE:
        A[j] = np.exp(r)
    elif r > -np.inf:
        A[j] = r - _LOG_SAFE
    elif r == -np.inf:
        A[j] = 0.0
    else:
        A[j] = r


@_inline
def _normalise1(A):
    """:func:`_normalise` for one-array cells: divide the scaled cells by the
    largest, re-store the logs relative to it, return its log (0 if none)."""
    return _divide1(A, _largest(A))


@_inline
def _largest(A):
    """The largest scaled cell of ``A`` (0 if none)."""
    c = 0.0
    for j in range(A.shape[0]):
        if A[j] > c:
            c = A[j]
    return c


@_inline
def _divide1(A, c):
    """:func:`_normalise1` given ``c``, the largest scaled cell of ``A`` (0 if none)."""
    if c > 0.0 and c < np.inf:
        lc = np.log(c)
    elif c == 0.0:  # every cell tiny (kept as logs) or zero
        lc = -np.inf
        for j in range(A.shape[0]):
            if A[j] < 0.0 and A[j] + _LOG_SAFE > lc:
                lc = A[j] + _LOG_SAFE
        if lc == -np.inf:
            return 0.0
    else:  # +inf: leave the frame as it is
        return 0.0
    if lc == 0.0:  # the largest is 1: every cell stays as it is
        return lc
    # c is a sum of products of factors <= 1 (cells, weights, emissions), so at most
    # an arc count: 1 / c is normal, and each product within an ulp of the quotient
    inv = 1.0 / c if c > 0.0 else 0.0  # (c == 0: no cell is scaled)
    for j in range(A.shape[0]):
        v = A[j]
        if v > 0.0:
            A[j] = v * inv
        elif v < 0.0:
            _store1(v + _LOG_SAFE - lc, A, j)
    return lc


@_compile
def _slow1(Pp, Rp, plo, sh, ptr, other, lp, col, xt, base, k, shift, ref, Pn, j):
    """Cell ``j`` of ``Pn`` in the log domain (its scaled sum was below the
    safe range): the log-sum-exp of ``log(far end) + its block's reference -
    ref + log_prob + score - shift`` over the arcs of state ``k``; far ends
    outside ``Pp``'s band (local index ``plo + i``) are zero."""
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
        m, acc = _lse_push(m, acc, _log1(v) + Rp[((i + plo) >> sh) - pb0] - ref + lp[a] + xt[col[a]] - shift)
    if acc != acc:
        Pn[j] = acc
    elif acc == 0.0:
        Pn[j] = 0.0
    else:
        _store1(m + np.log(acc), Pn, j)


@_inline
def _block_norm(A):
    """:func:`_normalise1` on one block's cells; ``-inf`` when they are all 0."""
    return _block_div(A, _largest(A))


@_inline
def _block_div(A, c):
    """:func:`_block_norm` given ``c``, the largest scaled cell of ``A`` (0 if none)."""
    lc = _divide1(A, c)
    if lc == 0.0 and c != 1.0:
        for j in range(A.shape[0]):
            if A[j] != 0.0:
                return 0.0
        return -np.inf
    return lc


@_inline
def _renorm(R):
    """Subtract a frame's largest block reference from its references; return it (0 if none)."""
    r = -np.inf
    for q in range(R.shape[0]):
        if R[q] > r:
            r = R[q]
    if r == -np.inf:
        return 0.0
    for q in range(R.shape[0]):
        R[q] -= r
    return r


@_inline
def _band_frame(Pp, Rp, plo, Pn, Rn, nlo, ptr, other, w, lp, col, xt, E, cb, base, shift, sh, bmin, bmax, fac):
    """One frame of either direction over bands of blocks: cell ``j`` of
    ``Pn`` (state ``base + nlo + j``) from the far ends in ``Pp`` (state
    ``base + plo + i``; those outside the band are zero).  Block ``kb`` (of
    ``2**sh`` states) reads blocks ``bmin[kb] .. bmax[kb]`` of ``Pp`` and is
    computed relative to their largest reference ``ref``, each far end's
    product taken ``exp(Rp[its block] - ref) <= 1`` times: the scaled sum
    when it is safe (or NaN), else the exact log-domain value (the sums in
    one pass, the cells below the safe range in a second, when there are
    any: the first pass's loop holds no escape); then the
    block is divided by its largest cell and ``Rn[block]`` set to ``ref``
    plus its log (``-inf``: all zero).  Column ``c``'s emission is ``E[c -
    cb]``, its score ``xt[c]``.  ``fac``: a work array of ``Pp``'s block
    count."""
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
                        p = np.exp(p + _LOG_SAFE)
                    s += p * w[a] * E[col[a] - cb]
            else:
                for a in range(ptr[k], ptr[k + 1]):
                    i = other[a] - base - plo
                    if i < 0 or i >= pw:
                        continue
                    p = Pp[i]
                    if p < 0.0:
                        p = np.exp(p + _LOG_SAFE)
                    s += p * w[a] * E[col[a] - cb] * fac[((i + plo) >> sh) - pb0]
            Pn[j] = s
            if s > c:
                c = s
            low += s < _SAFE
        if low:  # cells below the safe range: zero, or their exact value in the log domain
            c = 0.0
            for j in range(j0, j1):
                s = Pn[j]
                if s >= _SAFE or s != s:
                    if s > c:
                        c = s
                    continue
                Pn[j] = 0.0
                k = base + nlo + j
                for a in range(ptr[k], ptr[k + 1]):
                    i = other[a] - base - plo
                    if i >= 0 and i < pw and Pp[i] != 0.0:  # a path: its exact value in the log domain
                        _slow1(Pp, Rp, plo, sh, ptr, other, lp, col, xt, base, k, shift, ref, Pn, j)
                        if Pn[j] > c:
                            c = Pn[j]
                        break
        Rn[kb - nb0] = ref + _block_div(Pb, c)


@_inline
def _back_fused(Qn, Rq, qlo, Pt, Bt, tlo, ptr, dst, w, lp, col, xt, et, cb, base, shift, sh, pt, slow):
    """The backward frame of a sequence whose frames are one block each, fused
    with its arc posteriors: ``B_t`` into ``Bt`` (from ``beta_{t+1}`` in
    ``Qn``, one block of reference ``Rq[0]``; divided by its largest, whose log is
    returned second) and, for every arc whose alpha and beta cells are both
    scaled, ``alpha_t(i) w E beta_{t+1}(j)`` added to ``pt`` -- the posterior
    times the frame's total, which is returned first (``sum_i alpha_t(i)
    B_t(i)`` over the scaled cells, before the division).  The states whose
    posteriors need more (an alpha or a far end kept as a log, or NaN) go to
    ``slow``; their count is returned third.  The ``B_t`` cells below the
    safe range, if any, take the log domain in a second pass.  Column
    ``c``'s emission is ``et[c - cb]``."""
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
                s += w[a] * et[col[a] - cb] * np.exp(qv + _LOG_SAFE)
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
        if s < _SAFE:
            low += 1
        elif p > 0.0:  # (or s is NaN)
            z += p * s
    if low:  # cells below the safe range: zero, or their exact value in the log domain
        c = 0.0
        for i in range(Bt.shape[0]):
            s = Bt[i]
            if s >= _SAFE or s != s:
                if s > c:
                    c = s
                continue
            Bt[i] = 0.0
            k = base + tlo + i
            for a in range(ptr[k], ptr[k + 1]):
                d = dst[a] - base - qlo
                if d >= 0 and d < qw and Qn[d] != 0.0:  # a path: its exact value in the log domain
                    _slow1(Qn, Rq, qlo, sh, ptr, dst, lp, col, xt, base, k, shift, Rq[0], Bt, i)
                    if Bt[i] > c:
                        c = Bt[i]
                    break
    return z, _block_div(Bt, c), ns


@_inline
def _find(nxt, t):
    """The first frame ``>= t`` not yet given a bound (union-find, path halving)."""
    while nxt[t] != t:
        nxt[t] = nxt[nxt[t]]
        t = nxt[t]
    return t


@_compile
def _bands(dstart, dfinal, s0, W, L, lo, hi, nxt):
    """The live range ``lo[t] .. hi[t]`` (local state indices; ``lo > hi``:
    empty) of every frame ``t <= L`` of the sequence with states ``s0 ..
    s0 + W``: the first and last state ``j`` with ``dstart[j] <= t`` and
    ``dfinal[j] <= L - t``.  A state outside it holds no path of exactly
    ``L`` arcs at ``t`` (alpha or beta is 0).  Each state is live over an
    interval of frames; the frames still without a bound are skipped in
    near-constant time, so the cost is ``O(W + L)``."""
    for t in range(L + 1):
        lo[t] = W
        hi[t] = -1
    for side in range(2):
        for t in range(L + 2):
            nxt[t] = t
        for q in range(W):
            j = q if side == 0 else W - 1 - q
            a = dstart[s0 + j]
            b = L - dfinal[s0 + j]
            if a > b:
                continue
            t = _find(nxt, a)
            while t <= b:
                if side == 0:
                    lo[t] = j
                else:
                    hi[t] = j
                nxt[t] = t + 1
                t = _find(nxt, t + 1)


@_compile
def _block_ranges(state_off, ptr, other, sh):
    """``(blk_off [N+1], bmin, bmax)``: sequence ``n``'s blocks of ``2**sh``
    states are ``blk_off[n] .. blk_off[n + 1]``; the arcs of the states of
    block ``kb`` (CSR ``ptr``, far ends ``other``) reach local blocks
    ``bmin[kb] .. bmax[kb]`` (``bmin > bmax``: no arcs)."""
    N = state_off.shape[0] - 1
    blk_off = np.zeros(N + 1, np.int64)
    for n in range(N):
        W = state_off[n + 1] - state_off[n]
        blk_off[n + 1] = blk_off[n] + (((W - 1) >> sh) + 1 if W > 0 else 0)
    bmin = np.full(blk_off[N], np.int64(2) ** 62)
    bmax = np.full(blk_off[N], np.int64(-1))
    for n in range(N):
        s0 = state_off[n]
        for k in range(s0, state_off[n + 1]):
            kb = blk_off[n] + ((k - s0) >> sh)
            for a in range(ptr[k], ptr[k + 1]):
                q = (other[a] - s0) >> sh
                bmin[kb] = min(bmin[kb], q)
                bmax[kb] = max(bmax[kb], q)
    return blk_off, bmin, bmax


@_compile
def _distances(start, final, in_ptr, in_src, out_ptr, out_dst):
    """``(dstart, dfinal)`` ``[S]``: the fewest arcs from the start state of
    each state's sequence, and to a state with a final weight (``2**62``
    where there is no such path); breadth-first over the lattice."""
    S = final.shape[0]
    big = np.int64(2) ** 62
    dist = np.full((2, S), big)
    queue = np.empty(S, np.int64)
    for side in range(2):
        d = dist[side]
        tail = 0
        if side == 0:
            for n in range(start.shape[0]):
                if d[start[n]] != 0:
                    d[start[n]] = 0
                    queue[tail] = start[n]
                    tail += 1
            ptr, nbr = out_ptr, out_dst
        else:
            for s in range(S):
                if final[s] > -np.inf or final[s] != final[s]:
                    d[s] = 0
                    queue[tail] = s
                    tail += 1
            ptr, nbr = in_ptr, in_src
        head = 0
        while head < tail:
            s = queue[head]
            head += 1
            for a in range(ptr[s], ptr[s + 1]):
                r = nbr[a]
                if d[r] == big:
                    d[r] = d[s] + 1
                    queue[tail] = r
                    tail += 1
    return dist[0], dist[1]


@_inline
def _scaled_arc(fast, qv, g, e, x):
    """Whether an arc's posterior is taken from the scaled product ``g p w e
    qv`` (alpha cell scaled, beta cell ``qv`` scaled, factor ``g`` finite,
    and the emission ``e`` nonzero unless the score ``x`` is ``-inf``: an
    emission that underflowed, times a large ``g``, need not be negligible);
    else :func:`_post_slow` takes it in the log domain."""
    return fast and qv > 0.0 and g < np.inf and (e > 0.0 or x == -np.inf)


@_compile
def _post_slow(pt, p, fast, ra, k, ptr, dst, lp, col, Qn, Rq, gb, s0, qlo, sh, xt, et, cb, shift):
    """The arc posteriors of state ``k`` (alpha cell ``p``, ``fast``: scaled)
    that its scaled loop left: a far end kept as a log (or NaN), a factor
    ``gb`` out of range, or an emission ``et`` that underflowed -- in the
    log domain, those below 1e-88 left out (column ``c``'s emission is
    ``et[c - cb]``)."""
    qw = Qn.shape[0]
    qb0 = qlo >> sh
    for a in range(ptr[k], ptr[k + 1]):
        d = dst[a] - s0 - qlo
        if d < 0 or d >= qw:
            continue
        qv = Qn[d]
        qb = ((d + qlo) >> sh) - qb0
        if qv == 0.0 or _scaled_arc(fast, qv, gb[qb], et[col[a] - cb], xt[col[a]]):
            continue
        lb = ra + Rq[qb]  # a bound on the log (w E <= 1, scaled cells <= 1)
        if p < 0.0:
            lb += p + _LOG_SAFE
        if qv < 0.0:
            lb += qv + _LOG_SAFE
        if lb < _LOG_NEGLIGIBLE:  # a posterior below 1e-88 (the frame's sum is 1)
            continue
        c = col[a]
        pt[c] += np.exp(_log1(p) + lp[a] + xt[c] - shift + _log1(qv) + ra + Rq[qb])


def _row_max(row, lo, n):
    """The largest of ``row[lo:lo + n]`` (``n >= 1``), a NaN skipped unless it
    comes first (callers that care look for one with :func:`_has_nan`); eight
    independent maxima written out, so the compiler vectorises them (the
    same loop over an array of eight maxima runs at 0.6x the speed)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[lo]
    k = lo
    end = lo + n
    while k + 8 <= end:
        v = row[k]
        m0 = v if v > m0 else m0
        v = row[k + 1]
        m1 = v if v > m1 else m1
        v = row[k + 2]
        m2 = v if v > m2 else m2
        v = row[k + 3]
        m3 = v if v > m3 else m3
        v = row[k + 4]
        m4 = v if v > m4 else m4
        v = row[k + 5]
        m5 = v if v > m5 else m5
        v = row[k + 6]
        m6 = v if v > m6 else m6
        v = row[k + 7]
        m7 = v if v > m7 else m7
        k += 8
    for j in range(k, end):
        v = row[j]
        m0 = v if v > m0 else m0
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


_row_max = _compile(_row_max)


@_inline
def _has_nan(row, lo, n):
    """Whether ``row[lo:lo + n]`` holds a NaN."""
    for k in range(lo, lo + n):
        if row[k] != row[k]:
            return True
    return False


@_inline
def _frame_max(xt, c0, c1, nan_check=True):
    """A sequence's largest score in one frame (its columns ``c0 .. c1``):
    0 when all are ``-inf`` (or it has no column); NaN or ``+inf`` when a
    score is -- without ``nan_check``, a NaN is found only when it comes
    first (the caller finds the others as NaN emissions, which saves a pass
    over the row)."""
    if c1 <= c0:
        return 0.0
    m = _row_max(xt, c0, c1 - c0)
    if m != m or (nan_check and _has_nan(xt, c0, c1 - c0)):
        return np.nan
    return m if m > -np.inf else 0.0


# float64 exponential in vector lanes: exp(v) = 2**n * exp(r), n = round(v / ln 2),
# r = v - n ln 2 in [-ln 2 / 2, ln 2 / 2] (ln 2 split in two, the first part
# exact in 32 bits, so n ln 2 costs no rounding), exp(r) by its Taylor series to
# degree 13 (remainder below 1e-17 of it), 2**n as the bits of a float64
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238
_LN2_LO = 1.9082149292705877e-10
_EXP_LO = -708.0  # exp below this is under float64's smallest normal: 0 (the log-domain escape sees the score)
_EXP_C = tuple(1.0 / float(np.prod(np.arange(1, k + 1))) for k in range(14))


def _exp_row(x, m, e, bits):
    """``e[k] = exp(x[k] - m)`` for ``k < len(x)`` (``x - m <= 0`` or NaN;
    ``bits`` an int64 scratch at least as long): within two units in the last
    places of ``np.exp``, 0 below ``exp(-708)``, NaN for NaN; returns how
    many NaN it wrote (counted in the second loop).  Two loops the
    compiler vectorises; NumPy's own exp takes a slow path for every
    ``-inf`` (transducer and CTC scores hold many), this one does not."""
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13 = _EXP_C
    for k in range(x.shape[0]):
        v = x[k] - m
        vc = v if v > _EXP_LO else _EXP_LO
        nf = np.floor(vc * _LOG2E + 0.5)
        r = (vc - nf * _LN2_HI) - nf * _LN2_LO
        e[k] = c0 + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * (c7 + r * (
            c8 + r * (c9 + r * (c10 + r * (c11 + r * (c12 + r * c13))))))))))))
        bits[k] = (np.int64(nf) + np.int64(1023)) << np.int64(52)
    scale = bits.view(np.float64)
    nans = 0
    for k in range(x.shape[0]):
        v = x[k] - m
        p = e[k] * scale[k]
        e[k] = p if v >= _EXP_LO else (0.0 if v < _EXP_LO else v)  # NaN stays NaN
        nans += 1 if v != v else 0
    return nans


if numba is not None:  # fused multiply-adds allowed, no reassociation (it would undo the split of ln 2)
    _exp_row = numba_cache.njit(nogil=True, fastmath={"contract"})(_exp_row)


@_inline
def _sequence_emissions(X, c0, c1, Mrow, E, bits):
    """A sequence's emissions ``E[t, c - c0] = exp(X[t, c] - Mrow[t])`` for
    its columns ``c0 .. c1`` and the frames ``t < len(E)``; whether one is
    NaN (with every ``Mrow[t]`` finite: whether a score is)."""
    nans = 0
    for t in range(E.shape[0]):
        nans += _exp_row(X[t, c0:c1], Mrow[t], E[t], bits)
    return nans > 0


@_inline
def _emission_row(X, t, c0, c1, Mrow, Es, ew, bits):
    """Frame ``t``'s emissions of a sequence: its row of ``Es`` when they are
    held (``Es`` has rows), else formed now in ``ew``."""
    if Es.shape[0] == 0:
        et = ew[:c1 - c0]
        _exp_row(X[t, c0:c1], Mrow[t], et, bits)
        return et
    return Es[t]


@_inline
def _zero_columns(post, t0, t1, c0, c1):
    """``post[t0:t1, c0:c1] = 0`` (one sequence's columns over some frames)."""
    for t in range(t0, t1):
        for c in range(c0, c1):
            post[t, c] = 0.0


@_compile
def _run(n0, n1, state_off, start, final, in_ptr, in_src, in_lp, in_w, in_col,
         out_ptr, out_dst, out_lp, out_w, out_col, wshift, dstart, dfinal, col_off, sh, blk_off, in_bmin, in_bmax,
         out_bmin, out_bmax, X, ebytes, lengths, need_post,
         loglike, post):
    """Sequences ``n0 <= n < n1``: ``loglike[n]`` and, if ``need_post``,
    their columns of ``post [T, C]`` (every row written), from the scores ``X``
    (sequence ``n``'s columns are ``col_off[n] .. col_off[n + 1]``).  The
    emissions ``exp(X[t, c] - m_t)`` (``m_t`` the frame's largest score in
    the sequence) are formed at the sequence's start into a work array of
    its frames and columns when that takes at most ``ebytes`` (the next
    sequence reuses it), else a frame's row at a time where it is read.
    Only the cells of each frame's live band (:func:`_bands`) are computed
    and stored (ragged, one float64 each), in blocks of ``2**sh`` states
    with a log reference each (sequence ``n``'s blocks ``blk_off[n] ..
    blk_off[n + 1]``; block ``kb``'s in-arcs come from blocks ``in_bmin[kb]
    .. in_bmax[kb]``, its out-arcs go to ``out_bmin[kb] .. out_bmax[kb]``); the work arrays are allocated once for all
    the sequences.  See the module docstring for the representation and
    why it is exact."""
    ninf = -np.inf
    # the bands of every sequence, and the largest work arrays they need
    nf = 0
    maxL = 0
    for n in range(n0, n1):
        nf += lengths[n] + 1
        maxL = max(maxL, lengths[n])
    blo = np.empty(nf, np.int64)
    bhi = np.empty(nf, np.int64)
    boff = np.empty(nf + (n1 - n0), np.int64)
    roff = np.empty(nf + (n1 - n0), np.int64)
    nxt = np.empty(maxL + 2, np.int64)
    cells = 0
    refs = 0
    width = 0
    f0 = 0
    for n in range(n0, n1):
        L = lengths[n]
        s0 = state_off[n]
        lo, hi = blo[f0:f0 + L + 1], bhi[f0:f0 + L + 1]
        off = boff[f0 + n - n0:f0 + n - n0 + L + 2]
        rof = roff[f0 + n - n0:f0 + n - n0 + L + 2]
        _bands(dstart, dfinal, s0, state_off[n + 1] - s0, L, lo, hi, nxt)
        off[0] = 0
        rof[0] = 0
        for t in range(L + 1):
            wt = max(hi[t] - lo[t] + 1, 0)
            off[t + 1] = off[t] + wt
            rof[t + 1] = rof[t] + (((hi[t] >> sh) - (lo[t] >> sh) + 1) if wt > 0 else 0)
            width = max(width, wt)
        cells = max(cells, off[L + 1])
        refs = max(refs, rof[L + 1])
        f0 += L + 1
    A = np.empty(cells)
    RA = np.empty(refs)  # each block's log reference, relative to the frame's
    nb = (width >> sh) + 2
    Q = np.empty(width)  # beta_{t+1}, one-array cells
    RQ = np.empty(nb)
    BP = np.empty(width)  # B_t
    left = np.empty(width, np.int64)  # states left by the fused backward frame
    RB = np.empty(nb)
    fac = np.empty(nb)
    gb = np.empty(nb)
    cw = 0  # the widest sequence (columns), and the most emissions held
    most = 0
    for n in range(n0, n1):
        w = col_off[n + 1] - col_off[n]
        cw = max(cw, w)
        if 8 * lengths[n] * w <= ebytes:
            most = max(most, lengths[n] * w)
    Ebuf = np.empty(most)
    ew = np.empty(cw)  # one frame's row, for a sequence whose emissions are not held
    bits = np.empty(cw, np.int64)  # the exponential's scratch
    Mrow = np.empty(maxL)
    f0 = 0
    for n in range(n0, n1):
        s0 = state_off[n]
        W = state_off[n + 1] - s0
        L = lengths[n]
        c0, c1 = col_off[n], col_off[n + 1]
        ib0, ib1 = in_bmin[blk_off[n]:blk_off[n + 1]], in_bmax[blk_off[n]:blk_off[n + 1]]
        ob0, ob1 = out_bmin[blk_off[n]:blk_off[n + 1]], out_bmax[blk_off[n]:blk_off[n + 1]]
        lo, hi = blo[f0:f0 + L + 1], bhi[f0:f0 + L + 1]
        off = boff[f0 + n - n0:f0 + n - n0 + L + 2]
        rof = roff[f0 + n - n0:f0 + n - n0 + L + 2]
        f0 += L + 1
        if need_post:  # the frames past the sequence's length: zero posteriors
            _zero_columns(post, L, post.shape[0], c0, c1)
        held = 8 * L * (c1 - c0) <= ebytes  # else each frame's row is formed where it is read
        Es = Ebuf[:L * (c1 - c0) if held else 0].reshape((L if held else 0, c1 - c0))
        bad = False  # a NaN or +inf score in a frame: NaN out, whatever the band
        for t in range(L):
            Mrow[t] = _frame_max(X[t], c0, c1, not held)
            if Mrow[t] != Mrow[t] or Mrow[t] == np.inf:
                bad = True
        if not bad and held:  # the held emissions, formed now: a NaN among them is a NaN score
            bad = _sequence_emissions(X, c0, c1, Mrow, Es, bits)
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
            loglike[n] = ninf
            if need_post:
                _zero_columns(post, 0, L, c0, c1)
            continue
        P0 = A[0:off[1]]
        for j in range(P0.shape[0]):
            P0[j] = 0.0
        R0 = RA[0:rof[1]]
        for q in range(R0.shape[0]):
            R0[q] = ninf
        P0[start[n] - s0 - lo[0]] = 1.0  # the start is live at frame 0 (dstart = 0)
        R0[((start[n] - s0) >> sh) - (lo[0] >> sh)] = 0.0
        offset = 0.0
        for t in range(L):
            shift = Mrow[t] + wshift
            et = _emission_row(X, t, c0, c1, Mrow, Es, ew, bits)
            Rn = RA[rof[t + 1]:rof[t + 2]]
            _band_frame(A[off[t]:off[t + 1]], RA[rof[t]:rof[t + 1]], lo[t], A[off[t + 1]:off[t + 2]], Rn, lo[t + 1],
                        in_ptr, in_src, in_w, in_lp, in_col, X[t], et, c0, s0, shift, sh, ib0, ib1, fac)
            offset += shift + _renorm(Rn)
        fmax = _final_max(final, s0, W)
        m = ninf
        acc = 0.0
        PL = A[off[L]:off[L + 1]]
        RL = RA[rof[L]:rof[L + 1]]
        lb = lo[L] >> sh
        for j in range(PL.shape[0]):  # loglike: the log-sum-exp of alpha_L + final
            m, acc = _lse_push(m, acc, _log1(PL[j]) + RL[((lo[L] + j) >> sh) - lb] + final[s0 + lo[L] + j] - fmax)
        loglike[n] = (m + np.log(acc) + fmax + offset) if acc != 0.0 else ninf
        if not need_post:
            continue
        if loglike[n] == ninf:  # no complete path: zero posteriors
            _zero_columns(post, 0, L, c0, c1)
            continue
        qw = PL.shape[0]
        qlo = lo[L]
        nqb = RL.shape[0]
        for j in range(qw):
            _store1(final[s0 + qlo + j] - fmax, Q, j)
        for q in range(nqb):
            j0 = max(qlo, (lb + q) << sh) - qlo
            j1 = min(qlo + qw, (lb + q + 1) << sh) - qlo
            RQ[q] = _block_norm(Q[j0:j1])
        for t in range(L - 1, -1, -1):
            xt, pt = X[t], post[t]
            shift = Mrow[t] + wshift
            et = _emission_row(X, t, c0, c1, Mrow, Es, ew, bits)
            Qn = Q[:qw]
            Rq = RQ[:nqb]
            qb0 = qlo >> sh
            Pt = A[off[t]:off[t + 1]]
            Ra = RA[rof[t]:rof[t + 1]]
            tw = Pt.shape[0]
            ntb = Ra.shape[0]
            tlo = lo[t]
            tb0 = tlo >> sh
            Bt = BP[:tw]
            Rb = RB[:ntb]
            fused = False
            _zero_columns(post, t, t + 1, c0, c1)  # the frame's columns, before the arcs add to them
            if ntb == 1 and nqb == 1 and Ra[0] > ninf and Rq[0] > ninf:
                # one block each: B_t and the posteriors times Z in one pass over the arcs
                z, lc, ns = _back_fused(Qn, Rq, qlo, Pt, Bt, tlo, out_ptr, out_dst, out_w, out_lp, out_col, xt, et,
                                        c0, s0, shift, sh, pt, left)
                Rb[0] = Rq[0] + lc
                if z >= _SAFE_TOTAL and z < np.inf:
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
                        if p == 0.0 or (p < 0.0 and ra + p + _LOG_SAFE < _LOG_NEGLIGIBLE):
                            continue
                        _post_slow(pt, p, p > 0.0, ra, s0 + tlo + i, out_ptr, out_dst, out_lp, out_col, Qn, Rq, gb,
                                   s0, qlo, sh, xt, et, c0, shift)
                else:  # a small total: start the frame's posteriors again below
                    _zero_columns(post, t, t + 1, c0, c1)
            else:
                _band_frame(Qn, Rq, qlo, Bt, Rb, tlo, out_ptr, out_dst, out_w, out_lp, out_col, xt, et, c0, s0,
                            shift, sh, ob0, ob1, fac)
            if not fused:
                # the frame's total Z = sum_i alpha_t(i) B_t(i), block by block (log lz)
                m = ninf
                acc = 0.0
                for q in range(ntb):
                    if Ra[q] == ninf or Rb[q] == ninf:
                        continue
                    j0 = max(tlo, (tb0 + q) << sh) - tlo
                    j1 = min(tlo + tw, (tb0 + q + 1) << sh) - tlo
                    z = 0.0
                    for i in range(j0, j1):
                        p = Pt[i]
                        b = Bt[i]
                        if p != 0.0 and b != 0.0 and not (p < 0.0 or b < 0.0):
                            z += p * b
                    if z >= _SAFE_TOTAL and z < np.inf:
                        # every term left out (a cell kept as a log) is below 1e-88 of z
                        m, acc = _lse_push(m, acc, Ra[q] + Rb[q] + np.log(z))
                    elif z != z or z == np.inf:
                        m, acc = _lse_push(m, acc, z)
                    else:  # a small total: the block in the log domain
                        for i in range(j0, j1):
                            m, acc = _lse_push(m, acc, _log1(Pt[i]) + _log1(Bt[i]) + Ra[q] + Rb[q])
                lz = m + np.log(acc) if acc != 0.0 else ninf
                if lz != lz or lz == np.inf:  # NaN in: NaN out
                    for a in range(out_ptr[s0], out_ptr[s0 + W]):
                        pt[out_col[a]] = np.nan
                elif lz > ninf:
                    # arc posterior: alpha w E beta exp(Ra[its block] + Rq[its block] - lz), the factor
                    # formed per block of sources for the blocks its arcs reach (gb)
                    qa = -1
                    ra = 0.0
                    for i in range(tw):
                        p = Pt[i]
                        if p == 0.0:
                            continue
                        if ((tlo + i) >> sh) - tb0 != qa:
                            qa = ((tlo + i) >> sh) - tb0
                            ra = Ra[qa] - lz
                            g0 = max(ob0[tb0 + qa], qb0) - qb0
                            g1 = min(ob1[tb0 + qa], qb0 + nqb - 1) - qb0
                            for q in range(g0, g1 + 1):
                                gb[q] = np.exp(ra + Rq[q])
                        if p < 0.0 and ra + p + _LOG_SAFE < _LOG_NEGLIGIBLE:
                            continue  # every arc's posterior is below 1e-88 (beta cells and factors <= 1)
                        fast = p > 0.0
                        slow = False
                        k = s0 + tlo + i
                        for a in range(out_ptr[k], out_ptr[k + 1]):
                            d = out_dst[a] - s0 - qlo
                            if d < 0 or d >= qw:
                                continue
                            qv = Qn[d]
                            if qv == 0.0:
                                continue
                            g = gb[((d + qlo) >> sh) - qb0]
                            c = out_col[a]
                            if _scaled_arc(fast, qv, g, et[c - c0], xt[c]):
                                # g * p is finite and the other factors are <= 1: the product is exact
                                # unless it underflows, and then it is below DBL_MIN
                                pt[c] += g * p * out_w[a] * et[c - c0] * qv
                            else:
                                slow = True
                        if slow:
                            _post_slow(pt, p, fast, ra, k, out_ptr, out_dst, out_lp, out_col, Qn, Rq, gb, s0, qlo,
                                       sh, xt, et, c0, shift)
            Q, BP = BP, Q  # B_t becomes the next frame's beta_{t+1}
            RQ, RB = RB, RQ
            _renorm(RQ[:ntb])
            qw = tw
            qlo = tlo
            nqb = ntb


# ---------------------------------------------------------------------------
# Arcs that span several frames (``Lattice.max_span > 1``): the same cells and
# escapes, with the scale products between frames (see the module docstring).


@_inline
def _live(P, LV):
    """Whether a frame holds any path (a nonzero cell, or NaN)."""
    for j in range(P.shape[0]):
        if P[j] != 0.0 or LV[j] > -np.inf:
            return True
    return False


@_inline
def _span_in_sum(P, LV, t1, ptr, other, span, w, col, E, cb, X, r, base, k):
    """Forward cell ``k`` at frame ``t1`` as the scaled sum over its in-arcs,
    each read at frame ``t1 - span`` and rescaled by ``r[span]`` (column
    ``c``'s emission at ``E[frame, c - cb]``, its score at ``X[frame, c]``); and
    whether the log domain must decide a sum of 0: an arc whose scaled
    product is 0 with a live far end and a score above ``-inf``, or a NaN
    score (which the log domain propagates)."""
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


@_compile
def _span_in_slow(P, LV, t1, ptr, other, span, lp, col, X, off, base, k, out_P, out_LV, j):
    """Forward cell ``k`` at frame ``t1`` in the log domain: the log-sum-exp
    of ``log(far end) + log_prob + score + off[span]``."""
    m = -np.inf
    acc = 0.0
    for a in range(ptr[k], ptr[k + 1]):
        f = t1 - span[a]
        if f < 0:
            continue
        i = other[a] - base
        m, acc = _lse_push(m, acc, _logval(P[f, i], LV[f, i]) + lp[a] + X[f, col[a]] + off[span[a]])
    _store_lse(m, acc, out_P, out_LV, j)


@_inline
def _span_out_post(Q, LQ, t, L, ptr, other, span, w, col, Et, cb, xt, r, base, k, ai, pt, gs):
    """Backward cell ``k`` at frame ``t`` as the scaled sum over its
    out-arcs, each landing at frame ``t + span <= L`` rescaled by
    ``r[span]`` (column ``c``'s emission at ``Et[c - cb]``), and whether an arc whose scaled product is 0 may still
    carry a path (see :func:`_span_in_sum`); with ``ai != 0`` (cell ``k``'s
    scaled alpha at frame ``t``) each arc's product times ``ai`` is added to
    its column of ``pt`` (a posterior before the frame's normalisation) and,
    without ``r[span]`` (in the units of frame ``t + span``), to
    ``gs[span]``."""
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


@_compile
def _span_out_slow(Q, LQ, t, L, ptr, other, span, lp, col, xt, off, base, k, out_P, out_LV, j):
    """Backward cell ``k`` at frame ``t`` in the log domain."""
    m = -np.inf
    acc = 0.0
    for a in range(ptr[k], ptr[k + 1]):
        f = t + span[a]
        if f > L:
            continue
        i = other[a] - base
        m, acc = _lse_push(m, acc, _logval(Q[f, i], LQ[f, i]) + lp[a] + xt[col[a]] + off[span[a]])
    _store_lse(m, acc, out_P, out_LV, j)


@_inline
def _scales(g, r, off, R, ks):
    """``r[k] = exp(g[k] - R)`` and ``off[k] -= R`` for the spans ``k`` in
    ``ks`` (``g[k] = -inf`` marks a frame not in use: ``r[k] = 0``)."""
    for q in range(ks.shape[0]):
        k = ks[q]
        if g[k] == -np.inf:
            r[k] = 0.0
        else:
            r[k] = np.exp(g[k] - R)
        off[k] -= R


@_inline
def _max_ref(g, ks):
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


# Frame offsets as running sums in double-double (a float64 pair ``hi + lo``):
# the difference of two frames' offsets is then exact to its own rounding,
# however large the offsets, in O(1) -- a span of any length reads its
# frames' scales without summing the increments in between.

@_inline
def _two_sum(a, b):
    """``(s, e)``: ``s = fl(a + b)`` and its rounding error, ``a + b = s + e``."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@_inline
def _dd_add(h, lo, x):
    """The double-double ``h + lo`` plus the float ``x``."""
    s, e = _two_sum(h, x)
    e += lo
    hs = s + e
    return hs, e - (hs - s)


@_inline
def _dd_diff(ah, al, bh, bl):
    """``(ah + al) - (bh + bl)`` as a float."""
    s, e = _two_sum(ah, -bh)
    return s + (e + (al - bl))


@_inline
def _dd_sum_minus(ah, al, bh, bl, c):
    """``(ah + al) + (bh + bl) - c`` as a float."""
    s1, e1 = _two_sum(ah, bh)
    s2, e2 = _two_sum(s1, -c)
    return s2 + (e2 + e1 + (al + bl))


@_compile
def _run_spans(n0, n1, state_off, start, final, in_ptr, in_src, in_lp, in_w, in_col, in_span,
               out_ptr, out_dst, out_lp, out_w, out_col, out_span, sp_ptr, sp_dst, sp_lp, sp_w, sp_col, sp_span,
               ks, col_off, wshift, X, lengths, need_post, loglike, post):
    """:func:`_run` for arcs that span frames (``in_span`` / ``out_span`` per
    arc; ``sp_*`` the out-arcs of span > 1 by source; ``ks`` the distinct
    spans, ascending, of the arcs that can be on a path -- none longer than
    the longest sequence --; ``col_off [N+1]`` each sequence's columns).
    A sequence's emissions and frame maxima are formed first, into work
    arrays of its frames and columns (reused by the next sequence, so they
    stay in cache).  The forward and backward log offsets ``O_t``, ``OB_t``
    are kept per frame as double-double running sums, so the scale between
    any two frames is one exact difference: a frame's work is its arcs plus
    one term per distinct span, and no array grows with a span's length.

    The frames' totals (the paths through a state at ``t`` plus those on an
    arc read before ``t`` that lands after it) take the arcs in flight from
    running sums: each span ``k``'s arcs read at ``s`` have their mass, as a
    fraction of the sequence's total ``exp(loglike)``, in ``V[s]``, so frame
    ``t``'s in-flight mass is a window sum ``s in [t - k + 1, t - 1]`` of
    prefix sums (absolute error ``L`` times float64's rounding of a total
    near 1), and the largest scale in the window -- which decides, as for
    one-frame arcs, whether the frame's scaled total is safe -- a sliding
    maximum."""
    ninf = -np.inf
    log_safe_total = np.log(_SAFE_TOTAL)
    nks = ks.shape[0]
    K = ks[nks - 1] if nks else 1
    g = np.empty(K + 1)
    r = np.empty(K + 1)
    off = np.empty(K + 1)
    gs = np.zeros(K + 1)
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
    maxL = 0
    width = 0
    for n in range(n0, n1):
        maxL = max(maxL, lengths[n])
        width = max(width, col_off[n + 1] - col_off[n])
    Ebuf = np.empty(maxL * width)
    Mrow = np.empty(maxL)
    bits = np.empty(width, np.int64)  # the exponential's scratch
    for n in range(n0, n1):
        cs0, cs1 = col_off[n], col_off[n + 1]
        s0 = state_off[n]
        W = state_off[n + 1] - s0
        L = lengths[n]
        for t in range(L):
            Mrow[t] = _frame_max(X[t], cs0, cs1)
        E = Ebuf[:L * (cs1 - cs0)].reshape((L, cs1 - cs0))  # E[t, c - cs0] = exp(X[t, c] - Mrow[t])
        _sequence_emissions(X, cs0, cs1, Mrow, E, bits)
        P = np.zeros((L + 1, W))
        LV = np.full((L + 1, W), ninf)
        live = np.zeros(L + 1, np.bool_)
        Oh = np.zeros(L + 1)  # O_t = Oh[t] + Ol[t]
        Ol = np.zeros(L + 1)
        P[0, start[n] - s0] = 1.0
        live[0] = True
        offset = 0.0
        for t1 in range(1, L + 1):
            # frame s = t1 - k relative to frame t1 - 1: O_s - O_{t1-1}
            for q in range(nks):
                k = ks[q]
                s = t1 - k
                if s < 0:
                    g[k] = ninf
                    off[k] = 0.0
                    continue
                d = _dd_diff(Oh[s], Ol[s], Oh[t1 - 1], Ol[t1 - 1])
                off[k] = d
                g[k] = d + Mrow[s] + wshift if live[s] else ninf
            R = _max_ref(g, ks)
            _scales(g, r, off, R, ks)
            Pn, LVn = P[t1], LV[t1]
            for j in range(W):
                v, maybe = _span_in_sum(P, LV, t1, in_ptr, in_src, in_span, in_w, in_col, E, cs0, X, r, s0, s0 + j)
                if v >= _SAFE or v != v or (v == 0.0 and not maybe):
                    Pn[j] = v
                    LVn[j] = ninf
                else:
                    _span_in_slow(P, LV, t1, in_ptr, in_src, in_span, in_lp, in_col, X, off, s0, s0 + j, Pn, LVn, j)
            lc = _normalise(Pn, LVn)
            live[t1] = _live(Pn, LVn)
            inc = R + lc
            offset += inc
            Oh[t1], Ol[t1] = _dd_add(Oh[t1 - 1], Ol[t1 - 1], inc)
        fmax = _final_max(final, s0, W)
        m = ninf
        acc = 0.0
        for j in range(W):
            m, acc = _lse_push(m, acc, _logval(P[L, j], LV[L, j]) + final[s0 + j] - fmax)
        loglike[n] = (m + np.log(acc) + fmax + offset) if acc != 0.0 else ninf
        if not need_post or loglike[n] == ninf:
            continue
        A = loglike[n]  # the reference of the in-flight masses (any value would do: they are divided by their sum)
        # V[s, rank[k]]: the arcs of span k read at s, alpha_s w E beta_{s + k} summed, as a fraction of exp(A);
        # Hd[s, rank[k]]: the log of their scale relative to exp(A) (-inf where the frames hold no path)
        V = np.zeros((L + 1, max(nsp, 1)))
        Hd = np.full((L + 1, max(nsp, 1)), ninf)
        zt = np.zeros(L + 1)  # alpha_t B_t summed, in the units of alpha_t's scale and frame t's R
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
            _store(final[s0 + j] - fmax, Q[L], LQ[L], j)
        liveb[L] = _live(Q[L], LQ[L])
        for t in range(L - 1, -1, -1):
            xt, et, pt = X[t], E[t], post[t]
            shift = Mrow[t] + wshift
            # frame t + k relative to frame t + 1: OB_{t+k} - OB_{t+1}
            for q in range(nks):
                k = ks[q]
                f = t + k
                if f > L:
                    g[k] = ninf
                    off[k] = 0.0
                    continue
                d = _dd_diff(Bh[f], Bl[f], Bh[t + 1], Bl[t + 1])
                off[k] = d - shift
                g[k] = d if liveb[f] else ninf
            R = _max_ref(g, ks)
            _scales(g, r, off, R, ks)
            # one pass over the out-arcs of frame t: the beta sums B_t and, where alpha_t is scaled and nonzero,
            # the posteriors' numerators alpha_t w E beta_{t+k} r[k] into pt (divided by the frame's total in the
            # pass below) and the per-span sums gs
            Pt = P[t]
            z = 0.0
            for q in range(nks):
                gs[ks[q]] = 0.0
            if need_post:  # written before the arcs add to it: a fresh page is mapped once, not read then copied
                _zero_columns(post, t, t + 1, cs0, cs1)
            for i in range(W):
                ai = Pt[i] if live[t] else 0.0
                v, maybe = _span_out_post(Q, LQ, t, L, out_ptr, out_dst, out_span, out_w, out_col, et, cs0, xt, r,
                                          s0, s0 + i, ai, pt, gs)
                if v >= _SAFE or v != v or (v == 0.0 and not maybe):
                    BP[i] = v
                    BL[i] = ninf
                else:
                    _span_out_slow(Q, LQ, t, L, out_ptr, out_dst, out_span, out_lp, out_col, xt, off, s0, s0 + i,
                                   BP, BL, i)
                if ai != 0.0 and BP[i] != 0.0:
                    z += ai * BP[i]
            for q in range(nsp):
                k = long[q]
                f = t + k
                if f <= L and live[t] and liveb[f]:
                    h = _dd_sum_minus(Oh[t], Ol[t], Bh[f], Bl[f], A) + shift  # gs[k]'s scale, relative to exp(A)
                    Hd[t, q] = h
                    G = gs[k]
                    V[t, q] = np.exp(np.log(G) + h) if G > 0.0 else G  # (0 stays 0, NaN stays NaN)
            zt[t] = z
            Rb[t] = R
            Qt, LQt = Q[t], LQ[t]
            for i in range(W):
                Qt[i] = BP[i]
                LQt[i] = BL[i]
            lc = _normalise(Qt, LQt)
            lcb[t] = lc
            liveb[t] = _live(Qt, LQt)
            Bh[t], Bl[t] = _dd_add(Bh[t + 1], Bl[t + 1], shift + R + lc)
        # the frames' totals and the posteriors divided by them; PV: V's prefix sums over the frames, dq: per
        # span, the frames of its window by decreasing Hd (the sliding maximum)
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
            if not live[t]:
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
                off[k] = _dd_diff(Bh[f], Bl[f], Bh[t + 1], Bl[t + 1]) - shift - R
            # paths through a state at t (alpha_t B_t), plus those on an arc read at s = t - dd < t that lands at
            # s + k > t; relative to exp(A) (cA: the log of alpha_t's and B_t's units relative to exp(A))
            cA = _dd_sum_minus(Oh[t], Ol[t], Bh[t + 1], Bl[t + 1], A) + shift + R
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
                _zero_columns(post, t, t + 1, cs0, cs1)
                Pt, LVt, Qt, LQt = P[t], LV[t], Q[t], LQ[t]
                m = ninf
                acc = 0.0
                for i in range(W):
                    m, acc = _lse_push(m, acc, _logval(Pt[i], LVt[i]) + _logval(Qt[i], LQt[i]) + lcb[t])
                for dd in range(1, min(K, t + 1)):
                    s = t - dd
                    da = _dd_diff(Oh[s], Ol[s], Oh[t], Ol[t])  # O_s - O_t
                    for i in range(W):
                        la = _logval(P[s, i], LV[s, i])
                        if la == ninf:
                            continue
                        for a in range(sp_ptr[s0 + i], sp_ptr[s0 + i + 1]):
                            k = sp_span[a]
                            if k <= dd or s + k > L:
                                continue
                            jd = sp_dst[a] - s0
                            fl = da + _dd_diff(Bh[s + k], Bl[s + k], Bh[t + 1], Bl[t + 1]) - shift - R
                            m, acc = _lse_push(m, acc, la + sp_lp[a] + X[s, sp_col[a]]
                                               + _logval(Q[s + k, jd], LQ[s + k, jd]) + fl)
                if acc != 0.0:
                    lz = m + np.log(acc)
                    for i in range(W):
                        ai = _logval(Pt[i], LVt[i]) - lz
                        if ai == ninf:
                            continue
                        for a in range(out_ptr[s0 + i], out_ptr[s0 + i + 1]):
                            k = out_span[a]
                            if t + k > L:
                                continue
                            jd = out_dst[a] - s0
                            pt[out_col[a]] += np.exp(ai + out_lp[a] + xt[out_col[a]] + off[k]
                                                     + _logval(Q[t + k, jd], LQ[t + k, jd]))


@_compile
def _instance_side(seq_to_graph, batch_so, lat_so, lat_co, num_arcs, ptr, order, other, log_prob, local_col):
    """One side of every sequence's graph instance as CSR arrays, from the
    batch's (``ptr``, ``order``: its arcs by the key end; ``other``: their
    far ends): ``(ptr [S + 1], far end [A], log_prob [A], column [A])`` with
    instance state and column ids -- :attr:`Lattice.fwd` / ``bwd``'s arrays,
    in their order, in one pass over the arcs."""
    N = seq_to_graph.shape[0]
    out_ptr = np.empty(lat_so[N] + 1, np.int64)
    out_other = np.empty(num_arcs, np.int64)
    out_lp = np.empty(num_arcs)
    out_col = np.empty(num_arcs, np.int64)
    out_ptr[0] = 0
    a = 0
    for n in range(N):
        g = seq_to_graph[n]
        shift = lat_so[n] - batch_so[g]
        for k in range(batch_so[g], batch_so[g + 1]):
            for i in range(ptr[k], ptr[k + 1]):
                arc = order[i]
                out_other[a] = other[arc] + shift
                out_lp[a] = log_prob[arc]
                out_col[a] = lat_co[n] + local_col[arc]
                a += 1
            out_ptr[k + shift + 1] = a
    return out_ptr, out_other, out_lp, out_col


def _arrays(lat: Lattice) -> tuple:
    """The lattice as CSR arrays (in-arcs by destination, out-arcs by source),
    cached on it: the arrays of ``lat.fwd`` and ``lat.bwd``, built by
    :func:`_instance_side` without them (a new batch's lattice costs one
    compiled pass per side, not a dozen array operations)."""
    arrs = lat.__dict__.get("_numba_arrays")
    if arrs is None:
        batch = lat.batch
        so, co = np.asarray(lat.state_offsets, dtype=np.int64), np.asarray(lat.col_offsets, dtype=np.int64)
        g = np.asarray(batch.seq_to_graph, dtype=np.int64)
        lp, local = np.asarray(batch.log_prob, dtype=np.float64), batch.columns()[2]
        f_ptr, f_src, lp_in, f_col = _instance_side(g, batch.state_offsets, so, co, lat.num_arcs, batch.in_ptr,
                                                    batch.fwd_order, batch.src, lp, local)
        b_ptr, b_dst, lp_out, b_col = _instance_side(g, batch.state_offsets, so, co, lat.num_arcs, batch.out_ptr,
                                                     batch.bwd_order, batch.dst, lp, local)
        finite = lp_in[np.isfinite(lp_in)]
        # arc weights as probabilities relative to the largest (every path of L frames takes L arcs)
        wshift = float(finite.max()) if finite.size else 0.0
        arrs = (
            so, np.asarray(lat.start, dtype=np.int64), np.asarray(lat.final, dtype=np.float64),
            f_ptr, f_src, lp_in, np.exp(lp_in - wshift), f_col,
            b_ptr, b_dst, lp_out, np.exp(lp_out - wshift), b_col, wshift,
        )
        lat._numba_arrays = arrs
    return arrs


def _distance_arrays(lat: Lattice) -> tuple:
    """``(dstart, dfinal)`` of :func:`_distances`, cached on the lattice."""
    d = lat.__dict__.get("_numba_distances")
    if d is None:
        so, st, fi, ip, isrc, _, _, _, op, od, *_ = _arrays(lat)
        d = lat._numba_distances = _distances(st, fi, ip, isrc, op, od)
    return d


def _block_arrays(lat: Lattice, sh: int) -> tuple:
    """``(sh, blk_off, in_bmin, in_bmax, out_bmin, out_bmax)`` of
    :func:`_block_ranges` for both directions, cached on the lattice.  Where
    the arcs are not local in the state numbering (a block reads more than
    ``_MAX_BLOCK_SPREAD`` blocks on average), or where no sequence has more
    than ``_MIN_BLOCKED_STATES`` states, each sequence is one block."""
    cache = lat.__dict__.setdefault("_numba_blocks", {})
    b = cache.get((sh, _MAX_BLOCK_SPREAD, _MIN_BLOCKED_STATES))
    if b is None:
        so, _, _, ip, isrc, _, _, _, op, od, *_ = _arrays(lat)
        s = sh if np.diff(so).max(initial=0) > _MIN_BLOCKED_STATES else 62
        while True:
            off, imin, imax = _block_ranges(so, ip, isrc, s)
            _, omin, omax = _block_ranges(so, op, od, s)
            if s >= 62:  # one block per sequence: nothing to weigh
                break
            has = (imax >= imin) & (omax >= omin)
            spread = max(float(np.mean((imax - imin + 1)[has])), float(np.mean((omax - omin + 1)[has]))) \
                if has.any() else 1.0
            if spread <= _MAX_BLOCK_SPREAD:
                break
            s = 62
        b = cache[sh, _MAX_BLOCK_SPREAD, _MIN_BLOCKED_STATES] = (s, off, imin, imax, omin, omax)
    return b


def _span_arrays(lat: Lattice) -> tuple:
    """What :func:`_run_spans` needs beyond :func:`_arrays`: each side's arc
    spans, the out-arcs of span > 1 by source (CSR), the distinct spans of
    the arcs (ascending) and the sequences' column offsets, cached on the
    lattice.  Nothing here grows with a span's length."""
    arrs = lat.__dict__.get("_numba_span_arrays")
    if arrs is None:
        f, b = lat.fwd, lat.bwd
        in_span = np.asarray(f.span, dtype=np.int64)
        out_span = np.asarray(b.span, dtype=np.int64)
        long = np.flatnonzero(out_span > 1)  # still sorted by source
        sp_ptr = np.zeros(lat.num_states + 1, dtype=np.int64)
        np.cumsum(np.bincount(b.src[long], minlength=lat.num_states), out=sp_ptr[1:])
        lp = np.asarray(b.log_prob, dtype=np.float64)[long]
        wshift = _arrays(lat)[-1]
        arrs = (in_span, out_span, sp_ptr, np.asarray(b.dst, dtype=np.int64)[long], lp, np.exp(lp - wshift),
                np.asarray(b.col, dtype=np.int64)[long], out_span[long], np.unique(in_span),
                np.ascontiguousarray(lat.col_offsets, dtype=np.int64))
        lat._numba_span_arrays = arrs
    return arrs


def _span_bound(lat: Lattice, lengths: np.ndarray) -> np.ndarray:
    """The distinct arc spans (ascending) that the spanning pass works with
    for sequences of ``lengths``: those no longer than the longest sequence
    (an arc longer than every sequence is on no path, and costs nothing)."""
    spans = _span_arrays(lat)[-2]
    longest = int(lengths.max()) if len(lengths) else 0
    return spans[spans <= longest]


def _split(work: np.ndarray, parts: int) -> list:
    """At most ``parts`` contiguous ``(start, stop)`` ranges of the
    sequences, ``work [N]`` each one's cost: each cut is the one whose
    cumulative cost is nearest to its share (not the first past it: with
    few long sequences that would leave one thread most of the work)."""
    N = len(work)
    if N == 0 or parts <= 1:
        return [(0, N)]
    cum = np.concatenate([[0.0], np.cumsum(work, dtype=np.float64)])
    goal = cum[-1] * np.arange(1, parts) / parts
    hi = np.clip(np.searchsorted(cum, goal), 1, N)
    cuts = np.where(goal - cum[hi - 1] < cum[hi] - goal, hi - 1, hi)
    bounds = np.unique(np.concatenate([[0], cuts, [N]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def forward_backward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, leaky=None, need_posteriors: bool = True):
    """Forward-backward over a lattice (the engine protocol, see
    :mod:`chainfb.engines`), compiled.

    Parameters
    ----------
    lat : Lattice
    X : float64 (or float32) ``[T, C]`` compact scores (entries past a sequence's length are not read).
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
    # float32 scores are read as they are by the one-frame pass (each widened
    # exactly where it is read: the same numbers as a float64 copy, half its memory)
    X = np.ascontiguousarray(X, dtype=np.float32 if X.dtype == np.float32 and lat.max_span == 1 else np.float64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    N = lat.num_sequences
    T, C = X.shape
    loglike = np.empty(N)
    # the one-frame pass writes every posterior of its sequences; the spanning one adds into zeros
    post = (np.empty if lat.max_span == 1 else np.zeros)((T, C) if need_posteriors else (0, 0))
    arrs = _arrays(lat)
    work = np.diff(lat.arc_offsets) * (lengths + 1.0) + 1.0  # arcs x frames per sequence
    if lat.max_span == 1:
        run = _run
        args = arrs + _distance_arrays(lat) + (np.asarray(lat.col_offsets, dtype=np.int64),
                                               *_block_arrays(lat, _BLOCK_SHIFT), X, _EMISSIONS_BYTES)
    else:  # arcs that span frames: the in-arcs' and out-arcs' spans join each side's arrays
        (in_span, out_span, sp_ptr, sp_dst, sp_lp, sp_w, sp_col, sp_span, _, col_off), \
            (so, st, fi, ip, isrc, ilp, iw, ic, op, od, olp, ow, oc, ws) = _span_arrays(lat), arrs
        run = _run_spans
        args = (so, st, fi, ip, isrc, ilp, iw, ic, in_span, op, od, olp, ow, oc, out_span, sp_ptr, sp_dst, sp_lp,
                sp_w, sp_col, sp_span, _span_bound(lat, lengths), col_off, ws, X)
    threads = max(1, get_num_threads())
    if threads < 2 or N < 2 or work.sum() < _MIN_PARALLEL_WORK:
        run(0, N, *args, lengths, need_posteriors, loglike, post)
    else:  # a few parts per thread, the largest first
        ranges = sorted(_split(work, PARTS_PER_THREAD * threads), key=lambda r: -work[r[0]:r[1]].sum())
        parallel(lambda r: run(r[0], r[1], *args, lengths, need_posteriors, loglike, post), ranges, threads)
    return loglike, (post if need_posteriors else None)
