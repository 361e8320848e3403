"""Bands and blocks: which states of a frame can hold a path, and how the
one-frame pass groups a frame's states under log references.

The *band* of frame ``t`` of a sequence of length ``L`` is the range of
states ``lo[t] .. hi[t]`` (local indices, ``lo > hi``: empty) outside of
which no path of exactly ``L`` arcs passes at ``t``: a state ``j`` is live
at ``t`` when ``dstart[j] <= t`` and ``dfinal[j] <= L - t``, with
``dstart`` / ``dfinal`` the fewest arcs from the start and to a final
state (:func:`distances`).  The one-frame pass computes and stores only
the cells of each frame's band (ragged arrays, :class:`Bands`).

A *block* is ``2**sh`` consecutive states of a sequence; each block of a
frame keeps its own log reference (see the package docstring).  For each
block :func:`block_ranges` gives the range of blocks its arcs reach, so
that a frame's block is computed relative to the largest reference among
the blocks it reads.  ``sh = 62`` makes each sequence one block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..numba_cache import njit

if TYPE_CHECKING:  # .arrays imports this module
    from .arrays import Distances

__all__ = ["Bands", "distances", "block_ranges", "live_range", "band_layout", "sequence_band"]


class Bands(NamedTuple):
    """The bands of the sequences ``n0 <= n < n1`` of one call, each
    sequence's ``L + 1`` frames after the previous one's (``F = sum (L_n +
    1)`` frames in all; sequence ``n``'s are ``frame0[i] .. frame0[i + 1]``
    with ``i = n - n0``)."""

    frame0: np.ndarray  #: int64 ``[n1 - n0 + 1]``: where each sequence's frames start in ``lo`` / ``hi``
    lo: np.ndarray  #: int64 ``[F]``: the first live state of each frame (local index)
    hi: np.ndarray  #: int64 ``[F]``: the last live state (``lo > hi``: no state is live)
    cell_off: np.ndarray  #: int64 ``[F + n1 - n0]``: per sequence, ``L + 2`` offsets of its frames' cells
    ref_off: np.ndarray  #: int64 ``[F + n1 - n0]``: per sequence, ``L + 2`` offsets of its frames' block references
    cells: int  #: the most cells of one sequence (the size of the alpha work array)
    refs: int  #: the most block references of one sequence
    width: int  #: the widest band of any frame


@njit(nogil=True)
def distances(start: np.ndarray, final: np.ndarray, in_ptr: np.ndarray, in_src: np.ndarray, out_ptr: np.ndarray,
              out_dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


@njit(nogil=True)
def block_ranges(state_off: np.ndarray, ptr: np.ndarray, other: np.ndarray,
                 sh: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


@njit(nogil=True, inline="always")
def _find(nxt, t):
    """The first frame ``>= t`` not yet given a bound (union-find, path halving)."""
    while nxt[t] != t:
        nxt[t] = nxt[nxt[t]]
        t = nxt[t]
    return t


@njit(nogil=True)
def live_range(dstart: np.ndarray, dfinal: np.ndarray, s0: int, W: int, L: int, lo: np.ndarray, hi: np.ndarray,
               nxt: np.ndarray) -> None:
    """The live range ``lo[t] .. hi[t]`` (local state indices; ``lo > hi``:
    empty) of every frame ``t <= L`` of the sequence with states ``s0 ..
    s0 + W``: the first and last state ``j`` with ``dstart[j] <= t`` and
    ``dfinal[j] <= L - t``.  A state outside it holds no path of exactly
    ``L`` arcs at ``t`` (alpha or beta is 0).  Each state is live over an
    interval of frames; the frames still without a bound are skipped in
    near-constant time, so the cost is ``O(W + L)`` (``nxt``: a scratch of
    ``L + 2``)."""
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


@njit(nogil=True, inline="always")
def band_layout(n0: int, n1: int, state_off: np.ndarray, dist: Distances, sh: int, lengths: np.ndarray) -> Bands:
    """The :class:`Bands` of the sequences ``n0 <= n < n1`` (``dist``: the
    lattice's :class:`~.arrays.Distances`, blocks of ``2**sh`` states), and
    the largest work arrays they need."""
    nf = 0
    maxL = 0
    frame0 = np.empty(n1 - n0 + 1, np.int64)
    frame0[0] = 0
    for n in range(n0, n1):
        nf += lengths[n] + 1
        frame0[n - n0 + 1] = nf
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
        live_range(dist.dstart, dist.dfinal, s0, state_off[n + 1] - s0, L, lo, hi, nxt)
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
    return Bands(frame0, blo, bhi, boff, roff, cells, refs, width)


@njit(nogil=True, inline="always")
def sequence_band(b: Bands, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, hi, off, rof)`` of the ``i``-th sequence of :class:`Bands`
    ``b`` (length ``L``): its frames' bands ``[L + 1]`` and the offsets
    ``[L + 2]`` of their cells and block references in its work arrays."""
    f0, f1 = b.frame0[i], b.frame0[i + 1]
    return b.lo[f0:f1], b.hi[f0:f1], b.cell_off[f0 + i:f1 + i + 1], b.ref_off[f0 + i:f1 + i + 1]
