"""Per-sequence lattices: an FstBatch expanded to one graph instance per
sequence, with its arcs pointing into a compact column space.

This is the data the engine (NumPy or CUDA) runs on.  A *column* is a
distinct ``(sequence, pdf)`` pair some arc of that sequence's graph uses
(Kaldi's ``index_to_pdf``); the score map fills a ``[T, C]`` matrix of
scores for those columns, and the engine returns posteriors in the same
compact space.
"""

from __future__ import annotations

import numpy as np

from .batch import FstBatch

__all__ = ["Lattice", "concat_ranges", "balanced_ranges"]


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``concatenate([arange(l, h) for l, h in zip(lo, hi)])``, vectorised."""
    lens = (hi - lo).astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(lo.astype(np.int64) - starts, lens)


def balanced_ranges(work: np.ndarray, parts: int) -> list:
    """At most ``parts`` contiguous ``(start, stop)`` ranges of the items of
    ``work [N]`` (each item's cost), with about equal total cost each."""
    N = len(work)
    cum = np.concatenate([[0.0], np.cumsum(work, dtype=np.float64)])
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts)
    bounds = np.unique(np.clip(np.concatenate([[0], cuts, [N]]), 0, N))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


class _Side:
    """Arcs of all instances sorted by one end (``dst`` for forward, ``src``
    for backward), with the reduceat segments of that end; ``arc`` is each
    arc's index in the FstBatch's flat arc arrays."""

    __slots__ = ("arc", "src", "dst", "log_prob", "col", "seq", "key_states", "seg_starts")

    def __init__(self, arc, src, dst, log_prob, col, seq, key):
        self.arc, self.src, self.dst, self.log_prob, self.col, self.seq = arc, src, dst, log_prob, col, seq
        if key.size:
            change = np.flatnonzero(np.diff(key)) + 1
            self.seg_starts = np.concatenate([[0], change]).astype(np.int64)
        else:
            self.seg_starts = np.zeros(0, dtype=np.int64)
        self.key_states = key[self.seg_starts]


class Lattice:
    """One graph instance per sequence, arcs indexed into compact columns.

    Attributes
    ----------
    num_sequences ``N``, num_states ``S`` (all instances), num_columns ``C``.
    seq_of_state ``[S]``, start ``[N]`` (instance state ids), final ``[S]``.
    col_seq ``[C]``, col_pdf ``[C]``: the ``(sequence, pdf)`` of each column,
    sorted by sequence then pdf.
    fwd, bwd: arcs sorted by destination / by source (see ``_Side``).
    """

    def __init__(self, batch: FstBatch):
        self.batch = batch
        self._parts = {}
        g = batch.seq_to_graph
        N = len(g)
        so, ao = batch.state_offsets, batch.arc_offsets
        ns = np.diff(so)[g]
        self.num_sequences = N
        inst_state_off = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(ns, out=inst_state_off[1:])
        self.state_offsets = inst_state_off
        S = int(inst_state_off[-1])
        self.num_states = S
        seq_ids = np.arange(N, dtype=np.int64)
        self.seq_of_state = np.repeat(seq_ids, ns)
        gstate = concat_ranges(so[g], so[g + 1])
        self.final = batch.final[gstate]
        self.start = batch.start[g] - so[g] + inst_state_off[:-1]

        # compact columns: distinct pdfs of each graph, replicated per sequence
        local_col = np.zeros(batch.num_arcs, dtype=np.int64)
        graph_pdfs = []
        for gi in range(batch.num_graphs):
            a0, a1 = ao[gi], ao[gi + 1]
            u, inv = np.unique(batch.pdf[a0:a1], return_inverse=True)
            local_col[a0:a1] = inv
            graph_pdfs.append(u)
        ncols = np.array([len(graph_pdfs[gi]) for gi in g], dtype=np.int64)
        col_off = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(ncols, out=col_off[1:])
        self.num_columns = int(col_off[-1])
        self.col_seq = np.repeat(seq_ids, ncols)
        self.col_pdf = (
            np.concatenate([graph_pdfs[gi] for gi in g]) if N else np.zeros(0, dtype=np.int64)
        )

        def side(order, ptr):
            # arcs of graph g in `order` are contiguous: graphs own contiguous states
            pos = concat_ranges(ptr[so[g]], ptr[so[g + 1]])
            arc = order[pos]
            na = ptr[so[g + 1]] - ptr[so[g]]
            seq = np.repeat(seq_ids, na)
            shift = inst_state_off[:-1][seq] - so[g][seq]
            return arc, seq, batch.src[arc] + shift, batch.dst[arc] + shift

        arc, seq, src, dst = side(batch.fwd_order, batch.in_ptr)
        self.fwd = _Side(arc, src, dst, batch.log_prob[arc], col_off[seq] + local_col[arc], seq, dst)
        arc, seq, src, dst = side(batch.bwd_order, batch.out_ptr)
        self.bwd = _Side(arc, src, dst, batch.log_prob[arc], col_off[seq] + local_col[arc], seq, src)
        self.num_arcs = int(self.fwd.src.shape[0])

    def split(self, parts: int):
        """Sub-lattices over contiguous ranges of sequences with about equal
        numbers of arcs: a list of ``(seq_slice, state_slice, col_slice, Lattice)``.
        Their columns, states and sequences are exactly those slices of this
        lattice's (cached per ``parts``)."""
        if parts not in self._parts:
            arcs = np.bincount(self.fwd.seq, minlength=self.num_sequences)
            out = []
            for s0, s1 in balanced_ranges(arcs + 1.0, parts):
                sub = Lattice(FstBatch(self.batch.fsts, self.batch.seq_to_graph[s0:s1]))
                c0, c1 = np.searchsorted(self.col_seq, [s0, s1])
                st = slice(int(self.state_offsets[s0]), int(self.state_offsets[s1]))
                out.append((slice(s0, s1), st, slice(int(c0), int(c1)), sub))
            self._parts[parts] = out
        return self._parts[parts]

    @classmethod
    def of(cls, batch: FstBatch) -> "Lattice":
        """The lattice of ``batch``, built once and cached on it."""
        lat = getattr(batch, "_lattice", None)
        if lat is None:
            lat = cls(batch)
            batch._lattice = lat
        return lat
