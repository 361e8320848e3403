"""Vector math over one row of scores, compiled by Numba: the row maximum,
the NaN scan and the exponentials of a row, shared by the compiled engine
(:mod:`chainfb.engines.numba_log`) and the transducer score maps
(:mod:`chainfb.transducer.maps.cells`).

Each function reads a contiguous stretch of a 1-D array (``row[lo:lo + n]``
or the whole of ``x``) and is written so that the compiler vectorises its
loops: independent accumulators, no branch that depends on a previous
element.  The exponentials reduce the argument by ``ln 2`` and evaluate a
polynomial in vector lanes, because ``np.exp`` takes a slow path for every
``-inf`` (transducer and CTC scores hold many):

- :func:`exp_row`: float64 lanes, ``exp(x - m)`` within two units in the
  last place of ``np.exp`` (the engine's emissions);
- :func:`exp_scaled_sum`: float32 lanes (or ``np.exp``), ``exp(x - m)``
  times a scale and their float64 sum (the score maps' softmax rows), and
  :func:`row_exp_sum`, a row's maximum and that sum.

Without Numba these are the plain Python functions (slow, same numbers).
"""

from __future__ import annotations

import numpy as np

from .numba_cache import njit

__all__ = ["row_max", "has_nan", "exp_row", "exp_scaled_sum", "row_exp_sum"]


@njit(nogil=True)
def row_max(row: np.ndarray, lo: int, n: int) -> float:
    """The largest of ``row[lo:lo + n]`` (``n >= 1``), a NaN skipped unless it
    comes first (callers that care look for one with :func:`has_nan`); eight
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


@njit(nogil=True, inline="always")
def has_nan(row: np.ndarray, lo: int, n: int) -> bool:
    """Whether ``row[lo:lo + n]`` holds a NaN."""
    for k in range(lo, lo + n):
        if row[k] != row[k]:
            return True
    return False


# float64 exponential in vector lanes: exp(v) = 2**n * exp(r), n = round(v / ln 2),
# r = v - n ln 2 in [-ln 2 / 2, ln 2 / 2] (ln 2 split in two, the first part
# exact in 32 bits, so n ln 2 costs no rounding), exp(r) by its Taylor series to
# degree 13 (remainder below 1e-17 of it), 2**n as the bits of a float64
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238
_LN2_LO = 1.9082149292705877e-10
_EXP_LO = -708.0  # exp below this is under float64's smallest normal: 0 (the log-domain escape sees the score)
_EXP_C = tuple(1.0 / float(np.prod(np.arange(1, k + 1))) for k in range(14))


# fused multiply-adds allowed, no reassociation (it would undo the split of ln 2)
@njit(nogil=True, fastmath={"contract"})
def exp_row(x: np.ndarray, m: float, e: np.ndarray, bits: np.ndarray) -> int:
    """``e[k] = exp(x[k] - m)`` for ``k < len(x)`` (``x - m <= 0`` or NaN;
    ``bits`` an int64 scratch at least as long): within two units in the last
    places of ``np.exp``, 0 below ``exp(-708)``, NaN for NaN; returns how
    many NaN it wrote (counted in the second loop).  Two loops the
    compiler vectorises."""
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


# float32 exponential in vector lanes: the same reduction, ln 2 split with its
# first part exact in 16 bits, exp(r) to degree 7
_F32_LOG2E = np.float32(1.4426950408889634)
_F32_LN2_HI = np.float32(0.693145751953125)
_F32_LN2_LO = np.float32(1.4286068203094173e-06)
_F32_LO = np.float32(-87.0)  # exp below this is under float32's smallest normal: 0
_F32_HALF = np.float32(0.5)
_F32_C = tuple(np.float32(1.0 / f) for f in (1, 1, 2, 6, 24, 120, 720, 5040))


# reassociation allowed (vectorised sums), NaN and infinities kept
@njit(nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def exp_scaled_sum(row: np.ndarray, lo: int, n: int, m: float, scale: float, out: np.ndarray, ib: np.ndarray,
                   fast: bool) -> float:
    """``out[k] = exp(row[lo + k] - m) * scale`` for ``k < n``; returns the
    float64 sum of ``exp(row[lo + k] - m)``.  ``fast``: the float32-lane
    exponential (``ib`` an int32 scratch of at least ``n``; within a few
    units in the last place); else ``np.exp``.  NaN in gives NaN out."""
    s = 0.0
    if not fast:
        for k in range(n):
            e = np.exp(row[lo + k] - m)
            s += e
            out[k] = e * scale
        return s
    c0, c1, c2, c3, c4, c5, c6, c7 = _F32_C
    for k in range(n):
        v = row[lo + k] - m
        vc = v if v > _F32_LO else _F32_LO
        nf = np.floor(vc * _F32_LOG2E + _F32_HALF)
        r = (vc - nf * _F32_LN2_HI) - nf * _F32_LN2_LO
        out[k] = c0 + r * (c1 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))))
        ib[k] = (np.int32(nf) + np.int32(127)) << np.int32(23)
    pw = ib.view(np.float32)
    for k in range(n):
        v = row[lo + k] - m
        e = out[k] * pw[k]
        e = e if v >= _F32_LO else (np.float32(0.0) if v < _F32_LO else v)  # underflow to 0; NaN stays NaN
        s += e
        out[k] = e * scale
    return s


@njit(nogil=True, inline="always")
def row_exp_sum(row: np.ndarray, lo: int, n: int, buf: np.ndarray, ib: np.ndarray, fast: bool) -> tuple[float, float]:
    """``(max, sum_k exp(row[lo + k] - max))`` of ``row[lo:lo + n]`` (``n >=
    1``) in float64, with ``buf[k] = exp(row[lo + k] - max)`` when the
    maximum is finite (the sum NaN when a NaN is in the row); else ``(max,
    0)``, the maximum NaN when a NaN is in the row: the parts of a row's
    softmax and log-normaliser (``fast``, ``ib``: :func:`exp_scaled_sum`)."""
    m = row_max(row, lo, n)
    if not np.isfinite(m):
        for k in range(lo, lo + n):
            if row[k] != row[k]:
                return np.nan, 0.0
        return np.float64(m), 0.0
    return np.float64(m), exp_scaled_sum(row, lo, n, m, 1.0, buf, ib, fast)
