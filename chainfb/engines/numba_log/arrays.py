"""The arrays of a lattice as the compiled passes read them: named tuples of
CSR arrays, built once per lattice and cached on it.

``S`` states and ``A`` arcs in all (every sequence's graph instance), ``N``
sequences, ``C`` columns.  Sequence ``n`` owns the states ``state_off[n] ..
state_off[n + 1]`` and the columns ``col_off[n] .. col_off[n + 1]``; a
:class:`Side` lists the arcs by one of their ends (in-arcs by destination
for the forward pass, out-arcs by source for the backward pass), in the
order of :attr:`chainfb.lattice.Lattice.fwd` / ``bwd``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import DTypeLike

from ...lattice import Lattice
from ..numba_cache import njit
from .bands import block_ranges, distances

__all__ = ["Side", "LatticeArrays", "Distances", "Blocks", "SpanArrays", "lattice_arrays", "distance_arrays",
           "block_arrays", "span_arrays", "span_bound", "instance_side_into", "instance_arcs", "counting_order"]


class Side(NamedTuple):
    """The arcs of one side, CSR by their key end (the destination of an
    in-arc, the source of an out-arc)."""

    ptr: np.ndarray  #: int64 ``[S + 1]``: state ``k``'s arcs are ``ptr[k] .. ptr[k + 1]``
    other: np.ndarray  #: int64 ``[A]``: each arc's far end (source of an in-arc, destination of an out-arc)
    log_prob: np.ndarray  #: float64 ``[A]``: each arc's log weight
    w: np.ndarray  #: float64 ``[A]``: ``exp(log_prob - wshift)``, the weight as a scaled probability
    col: np.ndarray  #: int64 ``[A]``: each arc's column of ``X``


class LatticeArrays(NamedTuple):
    """A lattice as the compiled passes read it (:func:`lattice_arrays`)."""

    state_off: np.ndarray  #: int64 ``[N + 1]``: each sequence's states
    start: np.ndarray  #: int64 ``[N]``: each sequence's start state
    final: np.ndarray  #: float64 ``[S]``: final log weights (``-inf``: not final)
    col_off: np.ndarray  #: int64 ``[N + 1]``: each sequence's columns
    fwd: Side  #: in-arcs by destination
    bwd: Side  #: out-arcs by source
    wshift: float  #: the largest finite arc log weight (the weights' scale)


class Distances(NamedTuple):
    """The fewest arcs from the start state of each state's sequence, and to
    a final state (``2**62``: no such path) -- :func:`.bands.distances`."""

    dstart: np.ndarray  #: int64 ``[S]``
    dfinal: np.ndarray  #: int64 ``[S]``


class Blocks(NamedTuple):
    """The blocks of ``2**shift`` states of every sequence and the blocks
    their arcs reach (:func:`.bands.block_ranges`); ``shift = 62``: each
    sequence is one block."""

    shift: int  #: ``sh``: a block holds ``2**shift`` states
    offsets: np.ndarray  #: int64 ``[N + 1]``: sequence ``n``'s blocks are ``offsets[n] .. offsets[n + 1]``
    in_min: np.ndarray  #: int64 ``[blocks]``: the first block (local) a block's in-arcs come from
    in_max: np.ndarray  #: int64 ``[blocks]``: the last one (``in_min > in_max``: none)
    out_min: np.ndarray  #: int64 ``[blocks]``: the first block a block's out-arcs go to
    out_max: np.ndarray  #: int64 ``[blocks]``: the last one


class SpanArrays(NamedTuple):
    """What the spanning pass reads beyond :class:`LatticeArrays`
    (:func:`span_arrays`); nothing here grows with a span's length."""

    in_span: np.ndarray  #: int64 ``[A]``: the span of each arc of ``fwd``
    out_span: np.ndarray  #: int64 ``[A]``: the span of each arc of ``bwd``
    long: Side  #: the out-arcs of span > 1, CSR by source (``A_long`` arcs)
    long_span: np.ndarray  #: int64 ``[A_long]``: their spans
    spans: np.ndarray  #: int64 ``[distinct]``: the distinct spans of the arcs, ascending


@njit(nogil=True)
def instance_side_into(seq_to_graph: np.ndarray, batch_so: np.ndarray, lat_so: np.ndarray, lat_co: np.ndarray,
                       ptr: np.ndarray, order: np.ndarray, other: np.ndarray, log_prob: np.ndarray,
                       local_col: np.ndarray, out_ptr: np.ndarray, out_other: np.ndarray, out_lp: np.ndarray,
                       out_col: np.ndarray) -> None:
    """One side of every sequence's graph instance as CSR arrays, from the
    batch's (``ptr``, ``order``: its arcs by the key end; ``other``: their
    far ends), written into ``out_ptr [S + 1]``, ``out_other [A]`` (far
    end), ``out_lp [A]`` and ``out_col [A]`` (of any integer and float
    dtypes that hold them) with instance state and column ids --
    :attr:`Lattice.fwd` / ``bwd``'s arrays, in their order, in one pass over
    the arcs."""
    N = seq_to_graph.shape[0]
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


@njit(nogil=True)
def counting_order(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order [n], ptr [bound + 1])``: ``keys [n]`` (integers in ``[0,
    bound)``) sorted stably by a counting sort -- ``order`` is
    ``np.argsort(keys, kind="stable")`` and key ``k``'s entries are
    ``order[ptr[k] .. ptr[k + 1]]``."""
    n = keys.shape[0]
    ptr = np.zeros(bound + 1, np.int64)
    for i in range(n):
        ptr[keys[i] + 1] += 1
    for k in range(bound):
        ptr[k + 1] += ptr[k]
    fill = ptr[:bound].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        order[fill[keys[i]]] = i
        fill[keys[i]] += 1
    return order, ptr


#: the key of :func:`lattice_arrays`' entry in a lattice's cache
ARRAYS = ("numba", "arrays")


def lattice_arrays(lat: Lattice) -> LatticeArrays:
    """The lattice as CSR arrays (in-arcs by destination, out-arcs by source),
    kept by :meth:`~chainfb.lattice.Lattice.cache` under :data:`ARRAYS`: the arrays of ``lat.fwd``
    and ``lat.bwd``, built by :func:`instance_side_into` without them (a new batch's lattice costs one
    compiled pass per side, not a dozen array operations)."""
    return lat.cache(ARRAYS, lambda: _lattice_arrays(lat))


def instance_arcs(lat: Lattice, index_dtype: DTypeLike = np.int64) -> tuple[tuple, tuple]:
    """``((ptr, src, log_prob, col), (ptr, dst, log_prob, col))``: the arrays
    of ``lat.fwd`` and ``lat.bwd`` (in-arcs by destination, out-arcs by
    source), by :func:`instance_side_into` without building them; the
    indexes in ``index_dtype`` (the CUDA engine's: int32), the weights in
    float64."""
    batch = lat.batch
    so, co = np.asarray(lat.state_offsets, dtype=np.int64), np.ascontiguousarray(lat.col_offsets, dtype=np.int64)
    g = np.asarray(batch.seq_to_graph, dtype=np.int64)
    lp, local = np.asarray(batch.log_prob, dtype=np.float64), batch.columns()[2]
    S, A = lat.num_states, lat.num_arcs
    sides = []
    for ptr, order, other in ((batch.in_ptr, batch.fwd_order, batch.src), (batch.out_ptr, batch.bwd_order, batch.dst)):
        side = (np.empty(S + 1, index_dtype), np.empty(A, index_dtype), np.empty(A, np.float64),
                np.empty(A, index_dtype))
        instance_side_into(g, batch.state_offsets, so, co, ptr, order, other, lp, local, *side)
        sides.append(side)
    return sides[0], sides[1]


def _lattice_arrays(lat: Lattice) -> LatticeArrays:
    so, co = np.asarray(lat.state_offsets, dtype=np.int64), np.ascontiguousarray(lat.col_offsets, dtype=np.int64)
    (f_ptr, f_src, lp_in, f_col), (b_ptr, b_dst, lp_out, b_col) = instance_arcs(lat)
    finite = lp_in[np.isfinite(lp_in)]
    # arc weights as probabilities relative to the largest (every path of L frames takes L arcs)
    wshift = float(finite.max()) if finite.size else 0.0
    return LatticeArrays(
        so, np.asarray(lat.start, dtype=np.int64), np.asarray(lat.final, dtype=np.float64), co,
        Side(f_ptr, f_src, lp_in, np.exp(lp_in - wshift), f_col),
        Side(b_ptr, b_dst, lp_out, np.exp(lp_out - wshift), b_col), wshift)


def distance_arrays(lat: Lattice) -> Distances:
    """The lattice's :class:`Distances`, kept by :meth:`~chainfb.lattice.Lattice.cache`."""

    def build():
        a = lattice_arrays(lat)
        return Distances(*distances(a.start, a.final, a.fwd.ptr, a.fwd.other, a.bwd.ptr, a.bwd.other))

    return lat.cache(("numba", "distances"), build)


def block_arrays(lat: Lattice, sh: int, max_spread: float, min_states: int) -> Blocks:
    """The lattice's :class:`Blocks` of ``2**sh`` states, kept by
    :meth:`~chainfb.lattice.Lattice.cache`.
    Where the arcs are not local in the state numbering (a block reads more
    than ``max_spread`` blocks on average), or where no sequence has more
    than ``min_states`` states, each sequence is one block."""

    def build():
        a = lattice_arrays(lat)
        so = a.state_off
        s = sh if np.diff(so).max(initial=0) > min_states else 62
        while True:
            off, imin, imax = block_ranges(so, a.fwd.ptr, a.fwd.other, s)
            _, omin, omax = block_ranges(so, a.bwd.ptr, a.bwd.other, s)
            if s >= 62:  # one block per sequence: nothing to weigh
                break
            has = (imax >= imin) & (omax >= omin)
            spread = max(float(np.mean((imax - imin + 1)[has])), float(np.mean((omax - omin + 1)[has]))) \
                if has.any() else 1.0
            if spread <= max_spread:
                break
            s = 62
        return Blocks(s, off, imin, imax, omin, omax)

    return lat.cache(("numba", "blocks", sh, max_spread, min_states), build)


def span_arrays(lat: Lattice) -> SpanArrays:
    """The lattice's :class:`SpanArrays`, kept by :meth:`~chainfb.lattice.Lattice.cache`."""

    def build():
        f, b = lat.fwd, lat.bwd
        in_span = np.asarray(f.span, dtype=np.int64)
        out_span = np.asarray(b.span, dtype=np.int64)
        long = np.flatnonzero(out_span > 1)  # still sorted by source
        sp_ptr = np.zeros(lat.num_states + 1, dtype=np.int64)
        np.cumsum(np.bincount(b.src[long], minlength=lat.num_states), out=sp_ptr[1:])
        lp = np.asarray(b.log_prob, dtype=np.float64)[long]
        wshift = lattice_arrays(lat).wshift
        return SpanArrays(
            in_span, out_span,
            Side(sp_ptr, np.asarray(b.dst, dtype=np.int64)[long], lp, np.exp(lp - wshift),
                 np.asarray(b.col, dtype=np.int64)[long]),
            out_span[long], np.unique(in_span))

    return lat.cache(("numba", "span_arrays"), build)


def span_bound(lat: Lattice, lengths: np.ndarray) -> np.ndarray:
    """The distinct arc spans (ascending) that the spanning pass works with
    for sequences of ``lengths``: those no longer than the longest sequence
    (an arc longer than every sequence is on no path, and costs nothing)."""
    spans = span_arrays(lat).spans
    longest = int(lengths.max()) if len(lengths) else 0
    return spans[spans <= longest]
