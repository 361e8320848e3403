"""The CUDA engine's index arrays of a new lattice by compiled passes, already in int32.

``engine.cu`` reads a lattice as int32 CSR arrays: its in-arcs by
destination (the forward recursion), its out-arcs by source (the backward),
the out-arcs again by column (the posteriors), and those cut into chunks of
at most ``chunk_arcs`` arcs (a column with several chunks is summed by a
fixed-order tree: see ``forward_backward.cuh``).  The NumPy way to these
(:func:`chainfb.engines.cuda._host_arrays` without Numba) builds
``Lattice.fwd`` and ``bwd`` first, then sorts and cuts them in a dozen array
operations, each with its own temporaries.  With new labels every training
step that is host time on every step, so where Numba runs this module
writes them in compiled passes over the batch's arcs, already in int32:

1. the in-arcs and the out-arcs of every sequence's graph instance in the
   batch's orders (``fwd_order``, ``bwd_order``), shifted to the instance's
   state and column ids (:func:`~chainfb.engines.numba_log.arrays.instance_arcs`,
   the CPU engine's pass, writing int32), and each column's arcs counted;
2. the out-arcs dropped into their places among the arcs by column (a
   counting sort by those counts: stable, so the same order as
   ``np.argsort(kind="stable")``);
3. the chunks of each column (``ceil(arcs / chunk_arcs)``, ``chunk_arcs``
   doubled while a sequence would have over ``max_chunks`` of them, until
   each column is one chunk) and the columns with several;
4. the sizes the launch plan reads (widest sequence, largest degree...).

``N`` sequences, ``S`` states, ``A`` arcs, ``C`` columns and ``J`` chunks in
all, ``M`` columns with several chunks; the arrays are those of
:func:`chainfb.engines.cuda._host_arrays` (which packs them).
"""

from __future__ import annotations

import numpy as np

from ..lattice import Lattice
from .numba_cache import njit
from .numba_log.arrays import instance_arcs

__all__ = ["index_arrays"]


@njit(nogil=True)
def _by_column(out_ptr, out_dst, out_col, out_lp, col_ptr):
    """Step 2: the out-arcs (CSR by source) dropped into their places among the arcs by column (``col_ptr [C +
    1]``: column ``c``'s are ``col_ptr[c] .. col_ptr[c + 1]``), in the out-arcs' order within a column: ``(ca_src,
    ca_dst [A] int32, ca_lp [A])``."""
    A = out_dst.shape[0]
    ca_src = np.empty(A, np.int32)
    ca_dst = np.empty(A, np.int32)
    ca_lp = np.empty(A, np.float64)
    fill = col_ptr[:-1].copy()
    for s in range(out_ptr.shape[0] - 1):
        for a in range(out_ptr[s], out_ptr[s + 1]):
            j = fill[out_col[a]]
            fill[out_col[a]] = j + 1
            ca_src[j] = s
            ca_dst[j] = out_dst[a]
            ca_lp[j] = out_lp[a]
    return ca_src, ca_dst, ca_lp


@njit(nogil=True)
def _chunk_arrays(col_ptr, co, chunk_arcs, max_chunks):
    """Step 3: ``(chunk_ptr [N + 1], mc_ptr [N + 1], chunk_arc [J + 1], chunk_col [J], chunk_sole [J], mc_col [M],
    mc_begin [M], mc_end [M], chunk_arcs, widest)`` -- the chunks of at most ``chunk_arcs`` arcs (doubled while a
    sequence would have over ``max_chunks``, until each column is one chunk), ``widest`` the most chunks of one
    sequence."""
    C = col_ptr.shape[0] - 1
    N = co.shape[0] - 1
    first = np.empty(C + 1, np.int64)
    widest_column = 0
    for c in range(C):
        widest_column = max(widest_column, col_ptr[c + 1] - col_ptr[c])
    size = chunk_arcs
    while True:
        first[0] = 0
        for c in range(C):
            first[c + 1] = first[c] + (col_ptr[c + 1] - col_ptr[c] + size - 1) // size
        widest = 0
        for n in range(N):
            widest = max(widest, first[co[n + 1]] - first[co[n]])
        if widest <= max_chunks or size >= widest_column:  # (or one chunk a column: as few as can be)
            break
        size *= 2
    J = first[C]
    M = 0
    for c in range(C):
        if first[c + 1] - first[c] > 1:
            M += 1
    chunk_arc = np.empty(J + 1, np.int32)
    chunk_col = np.empty(J, np.int32)
    chunk_sole = np.empty(J, np.int32)
    mc_col = np.empty(M, np.int32)
    mc_begin = np.empty(M, np.int32)
    mc_end = np.empty(M, np.int32)
    mc_before = np.empty(C + 1, np.int64)  # the columns with several chunks before column c
    m = 0
    for c in range(C):
        mc_before[c] = m
        several = first[c + 1] - first[c] > 1
        for j in range(first[c], first[c + 1]):
            chunk_arc[j] = col_ptr[c] + (j - first[c]) * size
            chunk_col[j] = c
            chunk_sole[j] = 0 if several else 1
        if several:
            mc_col[m] = c
            mc_begin[m] = first[c]
            mc_end[m] = first[c + 1]
            m += 1
    mc_before[C] = m
    chunk_arc[J] = col_ptr[C]
    chunk_ptr = np.empty(N + 1, np.int32)
    mc_ptr = np.empty(N + 1, np.int32)
    for n in range(N + 1):
        chunk_ptr[n] = first[co[n]]
        mc_ptr[n] = mc_before[co[n]]
    return chunk_ptr, mc_ptr, chunk_arc, chunk_col, chunk_sole, mc_col, mc_begin, mc_end, size, widest


@njit(nogil=True)
def _sizes(so, co, in_ptr, out_ptr):
    """Step 4: ``(max_states, max_degree, max_arcs, max_columns)``: the most states, and columns, of one sequence,
    the most in- or out-arcs of one state, the most in-arcs of one sequence."""
    N = so.shape[0] - 1
    max_states = max_arcs = max_columns = max_degree = 0
    for n in range(N):
        max_states = max(max_states, so[n + 1] - so[n])
        max_columns = max(max_columns, co[n + 1] - co[n])
        max_arcs = max(max_arcs, in_ptr[so[n + 1]] - in_ptr[so[n]])
    for s in range(in_ptr.shape[0] - 1):
        max_degree = max(max_degree, in_ptr[s + 1] - in_ptr[s], out_ptr[s + 1] - out_ptr[s])
    return max_states, max_degree, max_arcs, max_columns


def index_arrays(lat: Lattice, chunk_arcs: int, max_chunks: int) -> tuple[dict, dict, dict]:
    """``(ints, floats, sizes)`` of a lattice without spanning arcs, where
    Numba runs: the int32 arrays of ``engine.cu`` (``in_ptr [S + 1]``,
    ``in_src``, ``in_col``, ``out_ptr [S + 1]``, ``out_dst``, ``out_col``,
    ``ca_src``, ``ca_dst`` ``[A]``, and the chunks: ``chunk_ptr``,
    ``mc_ptr [N + 1]``, ``chunk_arc [J + 1]``, ``chunk_col``,
    ``chunk_sole [J]``, ``mc_col``, ``mc_begin``, ``mc_end [M]``), the
    float64 weights (``in_lp``, ``out_lp``, ``ca_lp [A]``), and the sizes
    (``chunk_arcs``, ``max_chunks``, ``max_states``, ``max_degree``,
    ``max_arcs``, ``max_columns``)."""
    so = np.asarray(lat.state_offsets, dtype=np.int64)
    co = np.ascontiguousarray(lat.col_offsets, dtype=np.int64)
    C = lat.num_columns
    (in_ptr, in_src, in_lp, in_col), (out_ptr, out_dst, out_lp, out_col) = instance_arcs(lat, np.int32)
    col_ptr = np.zeros(C + 1, np.int64)
    np.cumsum(np.bincount(in_col, minlength=C), out=col_ptr[1:])
    ca_src, ca_dst, ca_lp = _by_column(out_ptr, out_dst, out_col, out_lp, col_ptr)
    (chunk_ptr, mc_ptr, chunk_arc, chunk_col, chunk_sole, mc_col, mc_begin, mc_end, size,
     widest) = _chunk_arrays(col_ptr, co, chunk_arcs, max_chunks)
    max_states, max_degree, max_arcs, max_columns = _sizes(so, co, in_ptr, out_ptr)
    ints = {"in_ptr": in_ptr, "in_src": in_src, "in_col": in_col, "out_ptr": out_ptr, "out_dst": out_dst,
            "out_col": out_col, "ca_src": ca_src, "ca_dst": ca_dst, "chunk_ptr": chunk_ptr, "mc_ptr": mc_ptr,
            "chunk_arc": chunk_arc, "chunk_col": chunk_col, "chunk_sole": chunk_sole, "mc_col": mc_col,
            "mc_begin": mc_begin, "mc_end": mc_end}
    floats = {"in_lp": in_lp, "out_lp": out_lp, "ca_lp": ca_lp}
    sizes = {"chunk_arcs": int(size), "max_chunks": int(widest), "max_states": int(max_states),
             "max_degree": int(max_degree), "max_arcs": int(max_arcs), "max_columns": int(max_columns)}
    return ints, floats, sizes
