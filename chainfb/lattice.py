"""Per-sequence lattices: an FstBatch expanded to one graph instance per
sequence, with its arcs pointing into a compact column space.

This is the data the engine (NumPy or CUDA) runs on.  A *column* is a
distinct ``(sequence, pdf)`` pair some arc of that sequence's graph uses
(Kaldi's ``index_to_pdf``); the score map fills a ``[T, C]`` matrix of
scores for those columns, and the engine returns posteriors in the same
compact space.

Building a lattice costs O(sequences + columns): the per-instance arcs
(``fwd``, ``bwd``), ``final`` and ``seq_of_state`` -- O(sequences x arcs)
-- are built on first use, by the engines that run one graph instance per
sequence.  The shared-graph engines never ask for them: they read
:meth:`Lattice.graph_lattice` and data cached per graph by the batch
(:meth:`~chainfb.batch.FstBatch.cache`), so a lattice whose sequences all share one graph (the LF-MMI
denominator) costs O(arcs) once per graph and O(sequences x pdfs) per batch
size.

What the engines and score maps derive from a lattice (their arrays, device
copies, sub-lattices) is kept by :meth:`Lattice.cache`, one memo per lattice
(:mod:`chainfb._cache`).
"""

from __future__ import annotations

import numpy as np

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from ._cache import Memo
from .batch import FstBatch
from .fst import Fst

__all__ = ["Lattice", "concat_ranges"]


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``concatenate([arange(l, h) for l, h in zip(lo, hi)])``, vectorised."""
    lens = (hi - lo).astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(lo.astype(np.int64) - starts, lens)


class _Side:
    """Arcs of all instances sorted by one end (``dst`` for forward, ``src``
    for backward): ``arc`` is each arc's index in the FstBatch's flat arc
    arrays; ``span`` the frames it covers; ``ptr [S+1]`` the CSR pointer by that end (the arcs of state
    ``s`` are ``ptr[s]:ptr[s+1]``); ``key_states`` the states with at least
    one arc and ``seg_starts`` where their arcs start (reduceat segments)."""

    __slots__ = ("arc", "src", "dst", "log_prob", "col", "seq", "span", "ptr", "key_states", "seg_starts")

    def __init__(self, arc, src, dst, log_prob, col, seq, counts, span):
        self.arc, self.src, self.dst, self.log_prob, self.col, self.seq = arc, src, dst, log_prob, col, seq
        self.span = span
        self.ptr = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.ptr[1:])
        self.key_states = np.flatnonzero(counts)
        self.seg_starts = self.ptr[self.key_states]


class Lattice:
    """One graph instance per sequence, arcs indexed into compact columns.

    Attributes
    ----------
    num_sequences ``N``, num_states ``S`` (all instances), num_arcs ``A``
    (all instances), num_columns ``C``.
    state_offsets ``[N+1]``, arc_offsets ``[N+1]``, col_offsets ``[N+1]``:
    sequence ``n`` owns instance states ``state_offsets[n]:state_offsets[n+1]``,
    and arcs and columns likewise.
    start ``[N]`` (instance state ids).
    col_seq ``[C]``, col_pdf ``[C]``: the ``(sequence, pdf)`` of each column,
    sorted by sequence then pdf.
    graph, shared_fst: the index in the batch and the Fst of the one graph
    every sequence uses, or None.  max_span: the most frames one arc covers
    (1 when every arc reads one frame).
    Built on first use: seq_of_state ``[S]``, final ``[S]``, and fwd, bwd:
    arcs sorted by destination / by source (see ``_Side``).  memo: what
    :meth:`cache` keeps.
    """

    def __init__(self, batch: FstBatch):
        self.batch = batch
        self.memo = Memo()
        g = batch.seq_to_graph
        N = len(g)
        self.num_sequences = N
        so = batch.state_offsets
        self.state_offsets = _offsets(np.diff(so)[g])
        self.num_states = int(self.state_offsets[-1])
        self.arc_offsets = _offsets(np.diff(batch.arc_offsets)[g])
        self.num_arcs = int(self.arc_offsets[-1])
        self.start = batch.start[g] - so[g] + self.state_offsets[:-1]
        self.graph = int(g[0]) if N and not (g != g[0]).any() else None
        self.max_span = batch.max_span

        # compact columns: the distinct pdfs of each graph, replicated per sequence
        cptr, cpdf, _ = batch.columns()
        ncols = np.diff(cptr)[g]
        self.col_offsets = _offsets(ncols)
        self.num_columns = int(self.col_offsets[-1])
        self.col_seq = np.repeat(np.arange(N, dtype=np.int64), ncols)
        self.col_pdf = cpdf[concat_ranges(cptr[g], cptr[g + 1])]

    @cached_property
    def shared_fst(self) -> Fst | None:
        """The :class:`~chainfb.fst.Fst` every sequence uses, or None."""
        return self.batch.fsts[self.graph] if self.graph is not None else None

    @cached_property
    def seq_of_state(self) -> np.ndarray:
        """``[S]``: the sequence of each instance state."""
        return np.repeat(np.arange(self.num_sequences, dtype=np.int64), np.diff(self.state_offsets))

    @property
    def _own_graphs(self) -> bool:
        """Whether sequence ``n`` uses graph ``n`` of the batch, for every ``n``
        (a numerator batch): instance ids are then the batch's own."""
        g = self.batch.seq_to_graph
        return len(g) == self.batch.num_graphs and bool((g == np.arange(len(g))).all())

    @cached_property
    def _graph_states(self) -> np.ndarray:
        """``[S]``: each instance state's state in the batch."""
        g, so = self.batch.seq_to_graph, self.batch.state_offsets
        return concat_ranges(so[g], so[g + 1])

    @cached_property
    def final(self) -> np.ndarray:
        """``[S]``: final log-prob of each instance state."""
        return self.batch.final[self._graph_states]

    def _side(self, order, ptr) -> _Side:
        batch = self.batch
        g, so = batch.seq_to_graph, batch.state_offsets
        N = self.num_sequences
        seq = np.repeat(np.arange(N, dtype=np.int64), np.diff(self.arc_offsets))
        if self._own_graphs:  # the instances are the batch's graphs, in order: its arcs and ids as they are
            arc, shift, counts = order, None, np.diff(ptr)
        else:
            # arcs of graph g in `order` are contiguous: graphs own contiguous states
            arc = order[concat_ranges(ptr[so[g]], ptr[so[g + 1]])]
            shift = (self.state_offsets[:-1] - so[g])[seq]
            counts = np.diff(ptr)[self._graph_states]
        # the batch's arcs already in this order (CTC's by source): views of its arrays, not copies
        pick = slice(None) if shift is None and _is_identity(arc) else arc
        src, dst = batch.src[pick], batch.dst[pick]
        if shift is not None:
            src, dst = src + shift, dst + shift
        col = self.col_offsets[:-1][seq] + batch.columns()[2][pick]
        return _Side(arc, src, dst, batch.log_prob[pick], col, seq, counts, batch.span[pick])

    @cached_property
    def fwd(self) -> _Side:
        """Arcs of all instances sorted by destination (the forward pass)."""
        return self._side(self.batch.fwd_order, self.batch.in_ptr)

    @cached_property
    def bwd(self) -> _Side:
        """Arcs of all instances sorted by source (the backward pass)."""
        return self._side(self.batch.bwd_order, self.batch.out_ptr)

    def graph_lattice(self) -> Lattice:
        """The one-sequence lattice of the graph every sequence uses
        (graph-local states and columns), cached per graph in the batch's
        memo (:meth:`~chainfb.batch.FstBatch.cache`) -- this lattice itself
        when it has one sequence (a new graph of one sequence, e.g. CTC's
        labels of a batch of one, then builds its arrays once, not twice);
        ValueError when the sequences use several graphs."""
        if self.graph is None:
            raise ValueError("lat: every sequence must use one graph")
        if self.num_sequences == 1:
            return self
        g = self.graph
        # (its batch has its own graph memo: the one that keeps it must not be reachable from it, see `of`)
        return self.batch.cache(("lattice", "graph", g),
                                lambda: Lattice(self.batch.with_sequences(np.array([g]), share_memo=False)))

    def cache(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per ``key`` and kept with the lattice
        (thread-safe, :class:`chainfb._cache.Memo`).  Keys are tuples whose
        first element names the user: ``("numpy", "segments")``, ``("numba",
        "arrays")``, ``("cuda", "arrays", device_and_stream, dtype)``."""
        return self.memo.get(key, build)

    def clear_cache(self) -> None:
        """Drop what :meth:`cache` keeps (it is rebuilt on the next use)."""
        self.memo.clear()

    def state_values(self, v: np.ndarray, name: str = "leaky: log_init") -> np.ndarray:
        """A per-state host vector as the lattice's ``[S]``: ``v`` itself when
        it is ``[S]``, or, when every sequence uses one graph of ``Sg``
        states, a graph-local ``[Sg]`` repeated for every sequence."""
        v = np.asarray(v, dtype=np.float64)
        if v.shape == (self.num_states,):
            return v
        if self.graph is not None and v.shape == (self.shared_fst.num_states,):
            return np.tile(v, self.num_sequences)
        raise ValueError(f"{name} must have shape ({self.num_states},), got {v.shape}")

    def parts(self, ranges: Sequence[tuple[int, int]]) -> list:
        """Sub-lattices over contiguous ranges of sequences ``ranges`` (``(start,
        stop)`` pairs covering the sequences in order, e.g. from
        :func:`chainfb.engines.threads.split`): a list of ``(seq_slice,
        state_slice, col_slice, Lattice)``.  Their columns, states and
        sequences are exactly those slices of this lattice's (kept per
        ``ranges``)."""
        ranges = tuple((int(a), int(b)) for a, b in ranges)

        def build():
            out = []
            for s0, s1 in ranges:
                sub = Lattice(self.batch.with_sequences(self.batch.seq_to_graph[s0:s1]))
                st = slice(int(self.state_offsets[s0]), int(self.state_offsets[s1]))
                cs = slice(int(self.col_offsets[s0]), int(self.col_offsets[s1]))
                out.append((slice(s0, s1), st, cs, sub))
            return out

        return self.cache(("lattice", "parts", ranges), build)

    @classmethod
    def of(cls, batch: FstBatch) -> Lattice:
        """The lattice of ``batch``, built once and kept by it
        (:meth:`~chainfb.batch.FstBatch.cache`, per batch).

        The lattice holds a view of ``batch`` (:meth:`~chainfb.batch.FstBatch.with_sequences`:
        the same arrays and graph memo, its own per-batch memo), not ``batch``
        itself: the batch keeps the lattice, and a lattice that kept the batch
        would make a reference cycle, freed only by Python's cyclic collector
        -- a graph compiled every step (new labels) would leave its arrays
        behind until then, and each step would write fresh pages."""
        return batch.cache(("lattice", "of"), lambda: cls(batch.with_sequences(batch.seq_to_graph)), per_batch=True)


def _is_identity(order: np.ndarray) -> bool:
    """Whether ``order`` is ``arange(len(order))`` (one comparison pass)."""
    n = len(order)
    return n == 0 or (int(order[0]) == 0 and int(order[-1]) == n - 1 and bool((order[1:] - order[:-1] == 1).all()))


def _offsets(counts: np.ndarray) -> np.ndarray:
    """``[len(counts) + 1]`` int64 running totals starting at 0."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out
