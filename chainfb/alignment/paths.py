"""The one Viterbi call every aligner makes: a compiled criterion's lattice
and scores through :func:`chainfb.engines.best_path`, and the winning arcs
read back as graph-local facts (source state, pdf) per step.

Aligners differ only in what an arc *means* (a CTC label, a transducer
blank or label at ``(t, u)``, a pdf of an HMM state); that lives in their
own modules, never here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import engines
from .._arrays import Array, Ints

if TYPE_CHECKING:
    from ..lattice import Lattice

__all__ = ["StepArcs", "best_arcs"]


@dataclass
class StepArcs:
    """The best path of one sequence, one entry per step (frame): the arc
    read at that frame, or ``-1`` in all three arrays for a frame inside an
    arc that spans several frames.

    Attributes
    ----------
    arc : int64 ``[L]`` arc index in the sequence's own :class:`~chainfb.Fst`.
    src : int64 ``[L]`` the arc's source state (graph-local).
    pdf : int64 ``[L]`` the arc's pdf.
    score : float -- the path's score (``-inf``: no path; the arrays are then empty).
    """

    arc: np.ndarray
    src: np.ndarray
    pdf: np.ndarray
    score: float


def best_arcs(lattice: Lattice, X: Array, lengths: Ints) -> list[StepArcs]:
    """Viterbi over ``lattice`` with compact scores ``X [T, C]`` (NumPy or
    CuPy; CuPy is decoded on the host by the engine) for ``lengths [N]``
    steps: a list of N :class:`StepArcs`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    score, arcs = engines.best_path(lattice, X, lengths)
    score = np.asarray(score, dtype=np.float64)
    batch = lattice.batch
    g = batch.seq_to_graph
    out = []
    for n in range(len(lengths)):
        if not score[n] > -np.inf:
            e = np.zeros(0, dtype=np.int64)
            out.append(StepArcs(e, e, e, -np.inf))
            continue
        a = np.asarray(arcs[n, : lengths[n]], dtype=np.int64)
        read = a >= 0  # -1: a frame inside an arc that spans several frames

        def local(v, offset, a=a, read=read):
            return np.where(read, v[np.maximum(a, 0)].astype(np.int64) - offset, -1)

        out.append(StepArcs(np.where(read, a - batch.arc_offsets[g[n]], -1),
                            local(batch.src, batch.state_offsets[g[n]]), local(batch.pdf, 0), float(score[n])))
    return out
