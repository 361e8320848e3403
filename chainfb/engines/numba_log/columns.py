"""A sequence's columns of the score and posterior matrices: its frame
maxima ``m_t``, its emissions ``E[t, c] = exp(X[t, c] - m_t)`` and the
zeroing of its posterior columns.

Sequence ``n`` owns the columns ``c0 .. c1`` of ``X [T, C]`` and of the
posteriors (``col_off[n] .. col_off[n + 1]``), so threads working on
different sequences never write the same posterior.  The emissions are
formed with the vector exponential of :mod:`chainfb.engines.vector_math`:
one ``exp`` per column and frame, none per arc.
"""

from __future__ import annotations

import numpy as np

from ..numba_cache import njit
from ..vector_math import exp_row, has_nan, row_max

__all__ = ["frame_max", "sequence_emissions", "emission_row", "zero_columns"]


@njit(nogil=True, inline="always")
def frame_max(xt: np.ndarray, c0: int, c1: int, nan_check: bool = True) -> float:
    """A sequence's largest score in one frame (its columns ``c0 .. c1`` of
    the row ``xt [C]``): 0 when all are ``-inf`` (or it has no column); NaN
    or ``+inf`` when a score is -- without ``nan_check``, a NaN is found
    only when it comes first (the caller finds the others as NaN emissions,
    which saves a pass over the row)."""
    if c1 <= c0:
        return 0.0
    m = row_max(xt, c0, c1 - c0)
    if m != m or (nan_check and has_nan(xt, c0, c1 - c0)):
        return np.nan
    return m if m > -np.inf else 0.0


@njit(nogil=True, inline="always")
def sequence_emissions(X: np.ndarray, c0: int, c1: int, Mrow: np.ndarray, E: np.ndarray, bits: np.ndarray) -> bool:
    """A sequence's emissions ``E[t, c - c0] = exp(X[t, c] - Mrow[t])`` for
    its columns ``c0 .. c1`` and the frames ``t < len(E)`` (``E [L, c1 -
    c0]``, ``bits`` an int64 scratch of ``c1 - c0``); whether one is NaN
    (with every ``Mrow[t]`` finite: whether a score is)."""
    nans = 0
    for t in range(E.shape[0]):
        nans += exp_row(X[t, c0:c1], Mrow[t], E[t], bits)
    return nans > 0


@njit(nogil=True, inline="always")
def emission_row(X: np.ndarray, t: int, c0: int, c1: int, Mrow: np.ndarray, Es: np.ndarray, ew: np.ndarray,
                 bits: np.ndarray) -> np.ndarray:
    """Frame ``t``'s emissions of a sequence ``[c1 - c0]``: its row of ``Es``
    when they are held (``Es`` has rows), else formed now in ``ew``."""
    if Es.shape[0] == 0:
        et = ew[:c1 - c0]
        exp_row(X[t, c0:c1], Mrow[t], et, bits)
        return et
    return Es[t]


@njit(nogil=True, inline="always")
def zero_columns(post: np.ndarray, t0: int, t1: int, c0: int, c1: int) -> None:
    """``post[t0:t1, c0:c1] = 0`` (one sequence's columns over some frames)."""
    for t in range(t0, t1):
        for c in range(c0, c1):
            post[t, c] = 0.0
