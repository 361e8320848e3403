"""Cells: how the compiled engine keeps one state's alpha or beta at one
frame, and the operations on a frame's cells (store, read back as a log,
normalise).

A cell holds a number relative to its frame's scale (its block's, in the
one-frame pass).  It is kept as a *scaled probability* when it is at least
:data:`SAFE` (then its sum is exact to float64's rounding even if some
terms underflowed: each lost term is below ``DBL_MIN ~ 2.2e-308``, under
``1e-17`` of the sum), and as its *log* otherwise (the log-domain escape:
exact however far below the others it lies).  Normalising a frame divides
its scaled cells by the largest and brings the logs that come into the
safe range back to scaled values, so a cell kept as a log is always below
``SAFE`` of its frame's largest.  Two encodings:

- **one array** (the one-frame pass, :mod:`.one_frame`): one float64 ``v``
  per cell: ``v >= 0`` a scaled probability (0 a true zero), ``v < 0`` the
  log ``r`` stored as ``v = r - LOG_SAFE`` (never ambiguous, whatever the
  threshold), NaN for NaN -- :func:`log1`, :func:`store1`,
  :func:`divide1`, with the per-block references :func:`block_div`,
  :func:`block_norm`, :func:`renorm`;
- **two arrays** (the spanning pass, :mod:`.spanning`): ``P`` the scaled
  probability (0 when the cell is kept as a log) and ``LV`` the log
  (``-inf`` when the cell is scaled or a true zero) -- :func:`logval`,
  :func:`store`, :func:`store_lse`, :func:`normalise`, :func:`live`.

The two hold the same information (the one-array encoding rounds a log
once more, ``(r - LOG_SAFE) + LOG_SAFE``); each pass keeps its own, so that
its results stay the same to the bit.
"""

from __future__ import annotations

import numpy as np

from ..numba_cache import njit

__all__ = ["SAFE", "LOG_SAFE", "SAFE_TOTAL", "LOG_NEGLIGIBLE", "lse_push", "final_max",
           "logval", "store", "store_lse", "normalise", "live",
           "log1", "store1", "largest", "divide1", "block_div", "block_norm", "renorm"]

# a sum of scaled probabilities at least this large is exact to float64's
# rounding even if some of its terms underflowed (each lost term is below
# DBL_MIN ~ 2.2e-308, so the relative error is below 1e-17 per term)
SAFE = 1e-290
LOG_SAFE = float(np.log(SAFE))
# frame totals (alpha * beta) above this: posteriors from the scaled values
SAFE_TOTAL = 1e-200
# arc posteriors below this (of a frame's total 1) are left out, as in the scaled products
LOG_NEGLIGIBLE = float(np.log(1e-88))


@njit(nogil=True, inline="always")
def lse_push(m: float, acc: float, v: float) -> tuple[float, float]:
    """The term ``v`` into a running log-sum-exp ``(max m, sum acc of
    exp(. - m))``: ``-inf`` adds nothing, NaN makes ``acc`` NaN."""
    if v > m:
        return v, acc * np.exp(m - v) + 1.0
    if v != v:
        return m, v
    if v > -np.inf:
        return m, acc + np.exp(v - m)
    return m, acc


@njit(nogil=True, inline="always")
def final_max(final: np.ndarray, s0: int, W: int) -> float:
    """The largest final log-weight of the states ``s0 .. s0 + W`` (0 if none
    is final): the shift that keeps the final sum in range."""
    fmax = -np.inf
    for j in range(W):
        if final[s0 + j] > fmax:
            fmax = final[s0 + j]
    return fmax if fmax > -np.inf else 0.0


# ---------------------------------------------------------------------------
# two arrays: P (scaled) and LV (log)


@njit(nogil=True, inline="always")
def logval(p: float, lv: float) -> float:
    """The log of a cell kept as a scaled probability ``p`` or, when ``p`` is
    0, as its log ``lv`` (``-inf``: a true zero)."""
    return np.log(p) if p != 0.0 else lv


@njit(nogil=True, inline="always")
def store(r: float, P: np.ndarray, LV: np.ndarray, j: int) -> None:
    """Keep the log value ``r`` in cell ``j``: scaled when safe, else as a log."""
    if r >= LOG_SAFE:
        P[j] = np.exp(r)
        LV[j] = -np.inf
    else:
        P[j] = 0.0
        LV[j] = r


@njit(nogil=True, inline="always")
def store_lse(m: float, acc: float, P: np.ndarray, LV: np.ndarray, j: int) -> None:
    """Keep the log-sum-exp ``m + log(acc)`` (:func:`lse_push`) in cell
    ``j``: NaN stays NaN, an empty sum is 0."""
    if acc != acc:
        P[j], LV[j] = acc, -np.inf
    elif acc == 0.0:
        P[j], LV[j] = 0.0, -np.inf
    else:
        store(m + np.log(acc), P, LV, j)


@njit(nogil=True)
def normalise(P: np.ndarray, LV: np.ndarray) -> float:
    """Divide a frame's cells by their largest value; return its log (0 if
    none).  Cells kept as logs that the division brings into the safe range
    become scaled again, so a cell kept as a log is always below ``SAFE``."""
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
            store(LV[j] - lc, P, LV, j)
    return lc


@njit(nogil=True, inline="always")
def live(P: np.ndarray, LV: np.ndarray) -> bool:
    """Whether a frame holds any path (a nonzero cell, or NaN)."""
    for j in range(P.shape[0]):
        if P[j] != 0.0 or LV[j] > -np.inf:
            return True
    return False


# ---------------------------------------------------------------------------
# one array: v >= 0 scaled, v < 0 the log r as r - LOG_SAFE


@njit(nogil=True, inline="always")
def log1(v: float) -> float:
    """The log of a one-array cell ``v`` (``-inf`` for 0, NaN for NaN)."""
    if v > 0.0:
        return np.log(v)
    if v < 0.0:
        return v + LOG_SAFE
    if v == 0.0:
        return -np.inf
    return v


@njit(nogil=True, inline="always")
def store1(r: float, A: np.ndarray, j: int) -> None:
    """Keep the log value ``r`` in one-array cell ``j``: scaled when safe,
    else as ``r - LOG_SAFE < 0``; ``-inf`` is a true zero, NaN stays NaN."""
    if r >= LOG_SAFE:
        A[j] = np.exp(r)
    elif r > -np.inf:
        A[j] = r - LOG_SAFE
    elif r == -np.inf:
        A[j] = 0.0
    else:
        A[j] = r


@njit(nogil=True, inline="always")
def largest(A: np.ndarray) -> float:
    """The largest scaled cell of ``A`` (0 if none)."""
    c = 0.0
    for j in range(A.shape[0]):
        if A[j] > c:
            c = A[j]
    return c


@njit(nogil=True, inline="always")
def divide1(A: np.ndarray, c: float) -> float:
    """Normalise one-array cells given ``c``, the largest scaled cell of
    ``A`` (0 if none): divide the scaled cells by it, re-store the logs
    relative to it, return its log (0 if no cell is nonzero)."""
    if c > 0.0 and c < np.inf:
        lc = np.log(c)
    elif c == 0.0:  # every cell tiny (kept as logs) or zero
        lc = -np.inf
        for j in range(A.shape[0]):
            if A[j] < 0.0 and A[j] + LOG_SAFE > lc:
                lc = A[j] + LOG_SAFE
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
            store1(v + LOG_SAFE - lc, A, j)
    return lc


@njit(nogil=True, inline="always")
def block_div(A: np.ndarray, c: float) -> float:
    """:func:`divide1` on one block's cells (``c`` its largest scaled cell,
    0 if none), returning ``-inf`` when they are all 0."""
    lc = divide1(A, c)
    if lc == 0.0 and c != 1.0:
        for j in range(A.shape[0]):
            if A[j] != 0.0:
                return 0.0
        return -np.inf
    return lc


@njit(nogil=True, inline="always")
def block_norm(A: np.ndarray) -> float:
    """:func:`block_div` with the block's largest scaled cell found here."""
    return block_div(A, largest(A))


@njit(nogil=True, inline="always")
def renorm(R: np.ndarray) -> float:
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
