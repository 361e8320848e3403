"""Packing many FSTs into flat CSR arrays (``FstBatch``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import checks
from ._arrays import Ints
from ._cache import Memo
from ._sort import stable_order
from .fst import Fst

__all__ = ["FstBatch"]


def _csr(keys: np.ndarray, num_rows: int):
    """Stable permutation sorting ``keys`` and the CSR row pointer ``[num_rows + 1]``."""
    order = stable_order(keys, num_rows)
    ptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=num_rows), out=ptr[1:])
    return order, ptr


def _check_seq_to_graph(seq_to_graph, G: int) -> np.ndarray:
    """``seq_to_graph`` as int64 ``[N]`` graph ids in ``[0, G)`` (default ``arange(G)``)."""
    if seq_to_graph is None:
        return np.arange(G, dtype=np.int64)
    seq_to_graph = checks.int_array(seq_to_graph, "seq_to_graph", ndim=1)
    if seq_to_graph.size and (seq_to_graph.min() < 0 or seq_to_graph.max() >= G):
        raise ValueError(f"seq_to_graph: graph ids must lie in [0, {G})")
    return seq_to_graph


class FstBatch:
    """Many graphs packed into flat arrays, and the sequences that use them.

    Parameters
    ----------
    fsts : Fst or sequence of Fst
        The distinct graphs ``G``.
    seq_to_graph : array-like of int ``[N]``, optional
        Graph index of each sequence.  Default: sequence ``n`` uses graph
        ``n`` (``N = G``).  Many sequences may share one graph (the
        denominator case).

    Attributes (all NumPy, global state ids)
    ----------------------------------------
    state_offsets ``[G+1]``, arc_offsets ``[G+1]``: graph ``g`` owns states
    ``state_offsets[g]:state_offsets[g+1]`` and arcs likewise.
    start ``[G]``, final ``[S]``, src/dst/pdf/log_prob/span ``[A]``;
    max_span: the most frames one arc covers (1 for graphs of span-1 arcs).
    fwd_order ``[A]``, in_ptr ``[S+1]``: arcs sorted by destination (forward).
    bwd_order ``[A]``, out_ptr ``[S+1]``: arcs sorted by source (backward).

    Per-graph data derived from these arrays (each graph's distinct pdfs, the
    one-sequence lattice of a graph, the shared-graph engines' sparse
    matrices) is kept by :meth:`cache`, in a memo shared by every batch
    :meth:`with_sequences` derives from this one: a new sequence-to-graph
    map (another batch size) costs nothing per graph.  Data of this batch's
    sequences (its lattice) is kept there too, per batch (``per_batch``).
    """

    def __init__(self, fsts: Fst | Sequence[Fst], seq_to_graph: Ints | None = None):
        if isinstance(fsts, Fst):
            fsts = [fsts]
        fsts = list(fsts)
        if not fsts:
            raise ValueError("fsts: expected at least one Fst")
        for i, f in enumerate(fsts):
            if not isinstance(f, Fst):
                raise TypeError(f"fsts[{i}]: expected chainfb.Fst, got {type(f).__name__}")
        ns = np.array([f.num_states for f in fsts], dtype=np.int64)
        na = np.array([f.num_arcs for f in fsts], dtype=np.int64)
        so = np.concatenate([[0], np.cumsum(ns)])
        self._adopt(fsts, _check_seq_to_graph(seq_to_graph, len(fsts)), so, np.concatenate([[0], np.cumsum(na)]),
                    np.array([f.start for f in fsts], dtype=np.int64) + so[:-1],
                    np.concatenate([f.final for f in fsts]),
                    np.concatenate([f.src + o for f, o in zip(fsts, so)]),
                    np.concatenate([f.dst + o for f, o in zip(fsts, so)]),
                    np.concatenate([f.pdf for f in fsts]), np.concatenate([f.log_prob for f in fsts]),
                    np.concatenate([f.span for f in fsts]), max(f.max_span for f in fsts))

    def _adopt(self, fsts, seq_to_graph, state_offsets, arc_offsets, start, final, src, dst, pdf, log_prob, span,
               max_span, index=None) -> None:
        """Take the packed arrays (the class docstring's attributes; ``fsts``
        None: cut from them on first use) and index the arcs both ways
        (``index``: ``(fwd_order, in_ptr, bwd_order, out_ptr)`` already built)."""
        self._fsts = fsts
        self._graph_memo = Memo()  # shared with the batches with_sequences derives
        self._memo = Memo()
        self.seq_to_graph = seq_to_graph
        self.state_offsets, self.arc_offsets, self.start, self.final = state_offsets, arc_offsets, start, final
        self.src, self.dst, self.pdf, self.log_prob, self.span = src, dst, pdf, log_prob, span
        self.max_span = max_span
        if index is None:
            index = (*_csr(dst, self.num_states), *_csr(src, self.num_states))
        self.fwd_order, self.in_ptr, self.bwd_order, self.out_ptr = index

    @classmethod
    def packed(cls, state_offsets: np.ndarray, arc_offsets: np.ndarray, start: np.ndarray, final: np.ndarray,
               src: np.ndarray, dst: np.ndarray, pdf: np.ndarray,
               index: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
               columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> FstBatch:
        """A batch of ``G`` graphs, one sequence each, from arrays a graph
        compiler built for all graphs at once: ``state_offsets [G+1]``,
        ``arc_offsets [G+1]``, ``start [G]``, ``final [S]``, ``src``, ``dst``,
        ``pdf [A]`` (int64, global state ids; every arc weight 0 and span 1).
        The compiler vouches for them: each graph's arcs in the canonical
        order of :class:`Fst` (its start state's arcs first, then by source),
        ids in range, ``final`` without NaN or +inf.  The :class:`Fst`
        objects of :attr:`fsts` are cut from the arrays on first use.

        A compiler that built the arcs' indexes along with them may hand
        them over, vouching for them too (the values the batch would derive,
        equal to the element): ``index = (fwd_order, in_ptr, bwd_order,
        out_ptr)`` (the class docstring's attributes) and ``columns =
        (ptr [G+1], pdfs [K], local_col [A])`` (:meth:`columns`)."""
        G = len(state_offsets) - 1
        if G < 1:
            raise ValueError("state_offsets: expected at least one graph")
        out = object.__new__(cls)
        out._adopt(None, np.arange(G, dtype=np.int64), state_offsets, arc_offsets, start, final, src, dst, pdf,
                   np.zeros(len(src)), np.ones(len(src), dtype=np.int64), 1, index)
        if columns is not None:
            out.cache(("batch", "columns"), lambda: columns)
        return out

    @property
    def fsts(self) -> list[Fst]:
        """The ``G`` distinct graphs, graph-local state ids."""
        if self._fsts is None:
            so, ao = self.state_offsets, self.arc_offsets
            self._fsts = [
                Fst(int(so[g + 1] - so[g]), int(self.start[g] - so[g]), self.src[ao[g]:ao[g + 1]] - so[g],
                    self.dst[ao[g]:ao[g + 1]] - so[g], self.pdf[ao[g]:ao[g + 1]], self.log_prob[ao[g]:ao[g + 1]],
                    self.final[so[g]:so[g + 1]], self.span[ao[g]:ao[g + 1]])
                for g in range(len(so) - 1)
            ]
        return self._fsts

    def with_sequences(self, seq_to_graph: Ints, share_memo: bool = True) -> FstBatch:
        """A batch over the same graphs with another sequence-to-graph map
        ``[N]``: the packed arrays and the per-graph memo of :meth:`cache` are
        shared, not copied (``share_memo`` False: the new batch gets a copy
        of the per-graph memo, the same values in a memo of its own -- for a
        batch that this batch's memo will itself keep, which must not hold
        that memo: the two would make a reference cycle)."""
        out = object.__new__(FstBatch)
        out.__dict__.update(self.__dict__)
        out._memo = Memo()
        if not share_memo:
            out._graph_memo = self._graph_memo.copy()
        out.seq_to_graph = _check_seq_to_graph(seq_to_graph, self.num_graphs)
        return out

    def cache(self, key: tuple, build: Callable[[], Any], per_batch: bool = False) -> Any:
        """``build()``, computed once per ``key`` (a tuple whose first element
        names its user, e.g. ``("scipy_shared", g)``) and kept: in the memo of
        the graphs, shared by every batch :meth:`with_sequences` derives, or
        with ``per_batch`` in this batch's own (data that depends on the
        sequence-to-graph map).  Thread-safe (:class:`chainfb._cache.Memo`)."""
        return (self._memo if per_batch else self._graph_memo).get(key, build)

    def clear_cache(self) -> None:
        """Drop what :meth:`cache` keeps: this batch's own and the graphs'
        (which the batches :meth:`with_sequences` derives share)."""
        self._memo.clear()
        self._graph_memo.clear()

    def graph_columns(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """``(pdfs [K_g], local_col [A_g])`` of graph ``g``: its distinct pdfs,
        sorted, and each of its arcs' index into them (:meth:`columns`)."""
        ptr, pdfs, local = self.columns()
        a0, a1 = self.arc_offsets[g], self.arc_offsets[g + 1]
        return pdfs[ptr[g]:ptr[g + 1]], local[a0:a1]

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every graph's distinct pdfs at once: ``(ptr [G+1], pdfs [K],
        local_col [A])`` -- graph ``g``'s sorted distinct pdfs are
        ``pdfs[ptr[g]:ptr[g+1]]`` and each arc's index among its graph's is
        ``local_col`` (one pass for the batch's graphs -- the (graph, pdf)
        pairs used marked where there are few of them, else one sort --, kept
        by :meth:`cache`)."""
        return self.cache(("batch", "columns"), self._columns)

    def _columns(self):
        """The arrays :meth:`columns` keeps."""
        graph = np.repeat(np.arange(self.num_graphs, dtype=np.int64), np.diff(self.arc_offsets))
        width = int(self.pdf.max()) + 1 if len(self.pdf) else 1
        keys = self.num_graphs * width
        key = graph * width + self.pdf if keys < 2**62 else None  # by graph, then pdf
        if keys <= 4 * len(self.pdf) + 2**16:  # few (graph, pdf) pairs: mark those used, no sort
            used = np.zeros(keys, dtype=bool)
            used[key] = True
            distinct = np.flatnonzero(used)  # by graph, then pdf
            rank = np.cumsum(used) - 1
            ptr = np.searchsorted(distinct // width, np.arange(self.num_graphs + 1))
            return ptr, (distinct % width).astype(np.int64), rank[key] - ptr[graph]
        if key is not None:  # one stable sort of one key
            order = stable_order(key, keys)
        else:
            order = np.lexsort((self.pdf, graph))
        g, p = graph[order], self.pdf[order]
        first = np.ones(len(order), dtype=bool)  # the first arc of each distinct (graph, pdf)
        first[1:] = (g[1:] != g[:-1]) | (p[1:] != p[:-1])
        pdfs = p[first].astype(np.int64)
        ptr = np.searchsorted(g[first], np.arange(self.num_graphs + 1))
        local = np.empty(len(order), dtype=np.int64)
        local[order] = np.cumsum(first) - 1
        local -= ptr[graph]
        return ptr, pdfs, local

    @property
    def num_graphs(self) -> int:
        return len(self.state_offsets) - 1

    @property
    def num_sequences(self) -> int:
        return int(self.seq_to_graph.shape[0])

    @property
    def num_states(self) -> int:
        return int(self.state_offsets[-1])

    @property
    def num_arcs(self) -> int:
        return int(self.arc_offsets[-1])

    @property
    def num_pdfs(self) -> int:
        """One more than the largest pdf any graph uses."""
        return int(self.pdf.max()) + 1 if len(self.pdf) else 0

    def __len__(self) -> int:
        return self.num_sequences

    def __repr__(self) -> str:
        return (
            f"FstBatch(num_sequences={self.num_sequences}, num_graphs={self.num_graphs}, "
            f"num_states={self.num_states}, num_arcs={self.num_arcs})"
        )

    @classmethod
    def coerce(cls, fsts: Fst | Sequence[Fst] | FstBatch, num_sequences: int | None = None) -> FstBatch:
        """An FstBatch from an Fst (shared by all sequences), a list, or a batch."""
        if isinstance(fsts, FstBatch):
            batch = fsts
        elif isinstance(fsts, Fst):
            n = 1 if num_sequences is None else checks.integer(num_sequences, "num_sequences", lo=0)
            batch = cls([fsts], np.zeros(n, dtype=np.int64))
        elif isinstance(fsts, (list, tuple)):
            batch = cls(fsts)
        else:
            raise TypeError(
                f"fsts: expected an Fst, a list of Fst or an FstBatch, got {type(fsts).__name__}"
            )
        if num_sequences is not None and batch.num_sequences != num_sequences:
            raise ValueError(
                f"fsts: the batch has {batch.num_sequences} sequences but scores has {num_sequences}"
            )
        return batch
