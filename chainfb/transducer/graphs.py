"""Transducer lattices compiled into step graphs for the generic engine.

An RNN-T alignment moves on the ``(t, u)`` grid: a blank goes
``(t, u) -> (t + 1, u)``, a label ``(t, u) -> (t, u + 1)``.  Both advance
``n = t + u`` by one, so over "steps" ``n`` the lattice is time-synchronous:
a chain of ``U_b + 1`` main states (state ``u`` = "u labels emitted"), a
blank self-loop on each and a label arc ``u -> u + 1``, start ``0``, final
``U_b``, run for ``T_b + U_b`` steps.  At step ``n`` state ``u`` sits at frame
``t = n - u``; the score map supplies ``-inf`` wherever that ``t`` is outside
``[0, T_b)``, so the engine never needs to know about the grid.

Multi-blank RNN-T (big blank ``i`` of duration ``d_i >= 2`` moves
``(t, u) -> (t + d_i, u)``): each main state ``u`` gets a chain of
``max(d) - 1`` auxiliary states ``r_1 .. r_{max(d)-1}``; big blank ``i``
enters ``r_{d_i - 1}``, and ``r_k -> r_{k-1}``, ``r_1 -> u`` carry the
*zero pdf* (score 0), so the big blank lands on ``u`` exactly ``d_i`` steps
later.  NeMo's boundary rules (inside the lattice iff ``t + d <= T - 1``; as
the last arc iff ``u = U`` and ``t + d == T``) then hold automatically: a
landing on a non-final row at ``t = T`` has no way on (all its scores are
``-inf``), a landing past step ``T_b + U_b`` is never counted.

pdf numbering (pinned, the GPU kernels rely on it): for main state ``u`` and
``M`` big blanks, ``pdf = u * (M + 2) + j`` with ``j = 0`` the standard blank
self-loop, ``j = 1`` the label arc (``u < U_b`` only), ``j = 2 + i`` big blank
``i``; the zero pdf is ``(U_b + 1) * (M + 2)``.  Arcs of real symbols carry
log-prob ``-sigma`` (multi-blank's logit under-normalisation), auxiliary
arcs 0.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from ..batch import FstBatch
from ..fst import Fst
from ..lattice import Lattice

__all__ = [
    "step_graph",
    "rnnt_graphs",
    "multiblank_graphs",
    "TransducerLayout",
    "compile_layout",
]


def step_graph(num_labels: int, durations: Sequence[int] = (), sigma: float = 0.0, possible: bool = True,
               max_duration: int | None = None) -> Fst:
    """The step graph of one utterance with ``num_labels`` (``U_b``) labels.

    ``durations`` are the big-blank durations (empty for plain RNN-T),
    ``sigma`` the log-prob subtracted on every real arc.  ``possible=False``
    (an utterance with no frames) gives the same graph with no final state
    weight (``-inf``), i.e. an impossible sequence.  Big blanks longer than
    ``max_duration`` (the batch's longest utterance: they can never be
    taken) get no arc, so the auxiliary chains stay at most that long
    whatever durations are asked for.
    """
    U = int(num_labels)
    if U < 0:
        raise ValueError(f"num_labels: expected >= 0, got {U}")
    durations = [int(d) for d in durations]
    M = len(durations)
    W = M + 2
    usable = [d for d in durations if max_duration is None or d <= max_duration]
    Dm = max(usable) if usable else 1
    naux = Dm - 1
    S = (U + 1) * (1 + naux)
    zero_pdf = (U + 1) * W
    u = np.arange(U + 1)
    srcs, dsts, pdfs, lps = [u], [u], [u * W], [np.full(U + 1, -sigma)]
    srcs.append(u[:-1]), dsts.append(u[:-1] + 1), pdfs.append(u[:-1] * W + 1), lps.append(np.full(U, -sigma))

    def aux(k):  # state id of r_k of every main state
        return U + 1 + u * naux + (k - 1)

    for i, d in enumerate(durations):
        if d > Dm:
            continue  # longer than any utterance of the batch: never taken
        srcs.append(u), dsts.append(aux(d - 1)), pdfs.append(u * W + 2 + i), lps.append(np.full(U + 1, -sigma))
    for k in range(1, Dm):
        srcs.append(aux(k)), dsts.append(aux(k - 1) if k > 1 else u)
        pdfs.append(np.full(U + 1, zero_pdf)), lps.append(np.zeros(U + 1))
    final = np.full(S, -np.inf)
    if possible:
        final[U] = 0.0
    return Fst(
        S, 0, np.concatenate(srcs), np.concatenate(dsts), np.concatenate(pdfs), np.concatenate(lps), final
    )


def _graphs(target_lengths, logit_lengths, durations, sigma) -> FstBatch:
    U = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
    ok = np.ones_like(U, dtype=bool) if logit_lengths is None else np.asarray(logit_lengths).reshape(-1) > 0
    cap = None if logit_lengths is None or not len(U) else max(int(np.max(logit_lengths)), 1)
    keys = list(zip(U.tolist(), ok.tolist()))
    distinct = sorted(set(keys))
    index = {k: i for i, k in enumerate(distinct)}
    fsts = [step_graph(u, durations, sigma, possible=o, max_duration=cap) for u, o in distinct]
    return FstBatch(fsts, np.array([index[k] for k in keys], dtype=np.int64))


def rnnt_graphs(target_lengths, logit_lengths=None) -> FstBatch:
    """The RNN-T step graphs of a batch: one :class:`FstBatch` whose sequence
    ``b`` runs the chain of ``target_lengths[b] + 1`` states (utterances with
    the same label count share a graph).  ``logit_lengths`` (optional,
    ``[B]``) marks utterances with zero frames as impossible.

    Run sequence ``b`` for ``logit_lengths[b] + target_lengths[b]`` steps."""
    return _graphs(target_lengths, logit_lengths, (), 0.0)


def multiblank_graphs(target_lengths, big_blank_durations, sigma: float = 0.0, logit_lengths=None) -> FstBatch:
    """The multi-blank RNN-T step graphs of a batch (see the module docstring
    for the auxiliary chains); ``sigma`` is subtracted on every real arc."""
    durations = [int(d) for d in big_blank_durations]
    if any(d < 2 for d in durations):
        raise ValueError(f"big_blank_durations: every duration must be >= 2, got {durations}")
    return _graphs(target_lengths, logit_lengths, durations, float(sigma))


class TransducerLayout:
    """Compiled batch: lattice plus the column bookkeeping the score map needs.

    Attributes
    ----------
    batch : FstBatch, lat : Lattice
    target_lengths, logit_lengths : int64 ``[B]``, ``U_b`` and ``T_b``.
    steps : int64 ``[B]``, ``T_b + U_b`` (the engine's lengths).
    num_steps : int, ``max(steps)`` (rows of the engine's score matrix).
    width : int, ``M + 2`` arc kinds per main state.
    colidx : int64 ``[B, Umax + 1, M + 2]``: column of ``(b, u, j)``, -1 if unused.
    col_b, col_u, col_j : int64 ``[C]`` per column (``col_j = -1`` for the zero pdf).
    real : int64 ``[R]`` the columns with ``col_j >= 0``.
    """

    def __init__(self, batch: FstBatch, target_lengths, logit_lengths, width: int, umax: int):
        self.batch = batch
        self.lat = lat = Lattice.of(batch)
        U = np.asarray(target_lengths, dtype=np.int64)
        T = np.asarray(logit_lengths, dtype=np.int64)
        self.target_lengths, self.logit_lengths = U, T
        self.steps = T + U
        self.num_steps = int(self.steps.max()) if len(U) else 0
        self.width = width
        b = lat.col_seq
        zero = lat.col_pdf == (U[b] + 1) * width
        self.col_b = b
        self.col_u = np.where(zero, 0, lat.col_pdf // width)
        self.col_j = np.where(zero, -1, lat.col_pdf % width)
        self.real = np.flatnonzero(~zero)
        self.colidx = np.full((len(U), umax + 1, width), -1, dtype=np.int64)
        r = self.real
        self.colidx[b[r], self.col_u[r], self.col_j[r]] = r


_CACHE: "OrderedDict[tuple, TransducerLayout]" = OrderedDict()
_CACHE_SIZE = 16


def compile_layout(target_lengths, logit_lengths, durations=(), sigma: float = 0.0, umax: int | None = None) -> TransducerLayout:
    """The :class:`TransducerLayout` of a batch (cached by the lengths, the
    durations and sigma: the graphs do not depend on the label values)."""
    U = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
    T = np.asarray(logit_lengths, dtype=np.int64).reshape(-1)
    durations = tuple(int(d) for d in durations)
    umax = int(U.max()) if umax is None and len(U) else int(umax or 0)
    key = (U.tobytes(), T.tobytes(), durations, float(sigma), umax)
    lay = _CACHE.get(key)
    if lay is not None:
        _CACHE.move_to_end(key)
        return lay
    batch = _graphs(U, T, durations, float(sigma))
    lay = TransducerLayout(batch, U, T, len(durations) + 2, umax)
    _CACHE[key] = lay
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return lay
