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
``(t, u) -> (t + d_i, u)``): one self-loop on main state ``u`` that spans
``d_i`` steps (read at step ``n = t + u``, it lands at step ``n + d_i``,
still on row ``u``).  NeMo's boundary rules (inside the lattice iff ``t +
d <= T - 1``; as the last arc iff ``u = U`` and ``t + d == T``) then hold
by the exact-length rule: a landing on a non-final row at ``t = T`` has no
way on (all its scores are ``-inf``), a landing past step ``T_b + U_b`` is
never counted.  The graph has ``U_b + 1`` states whatever the durations.

pdf numbering (pinned, the GPU kernels rely on it): for main state ``u`` and
``M`` big blanks, ``pdf = u * (M + 2) + j`` with ``j = 0`` the standard blank
self-loop, ``j = 1`` the label arc (``u < U_b`` only), ``j = 2 + i`` big blank
``i``.  Every arc carries log-prob ``-sigma`` (multi-blank's logit
under-normalisation).

TDT (token-and-duration transducer, durations ``d_0 .. d_{D-1}``, ``d = 0``
allowed for labels): a blank of duration ``d > 0`` is a self-loop on ``u``
spanning ``d`` steps, a label of duration ``d`` an arc ``u -> u + 1``
spanning ``d + 1`` steps (``t`` advances ``d``, ``u`` one).  Main states
``u = 0 .. U_b`` only; durations longer than every utterance of the batch
get no arcs.  pdf numbering: ``u * 2D + i`` the blank of duration ``d_i``
(``d_i > 0``), ``u * 2D + D + i`` the label of duration ``d_i`` (``u <
U_b``); arcs carry log-prob 0 (the scores, ``- sigma`` included, come from
the score map).  Which ``t`` each TDT arc may be taken at (NeMo's boundary
rules) is the score map's business: :meth:`TransducerLayout.entries` lists
them.

Both families share one compiler, :func:`compile_layout`: the batch's
distinct graphs, the lattice, the column bookkeeping and the per-layout
tables derived from it (score-map entries, device copies), cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._arrays import Ints
from .._cache import LRU
from .. import checks
from ..batch import FstBatch
from ..fst import Fst
from ..lattice import Lattice, concat_ranges

#: the longest duration (big blank or TDT) accepted; longer ones could never be taken anyway
MAX_DURATION = 2**31 - 1

#: graph families :func:`compile_layout` knows
FAMILIES = ("rnnt", "tdt")

__all__ = [
    "step_graph",
    "rnnt_graphs",
    "multiblank_graphs",
    "tdt_step_graph",
    "tdt_graphs",
    "TransducerLayout",
    "ScoreEntries",
    "compile_layout",
]


def step_graph(num_labels: int, durations: Sequence[int] = (), sigma: float = 0.0, possible: bool = True,
               max_duration: int | None = None) -> Fst:
    """The step graph of one utterance with ``num_labels`` (``U_b``) labels:
    ``U_b + 1`` states, a blank self-loop on each, a label arc ``u -> u + 1``
    and, per big blank ``d``, a self-loop spanning ``d`` steps.

    ``durations`` are the big-blank durations (empty for plain RNN-T),
    ``sigma`` the log-prob subtracted on every arc.  ``possible=False``
    (an utterance with no frames) gives the same graph with no final state
    weight (``-inf``), i.e. an impossible sequence.  Big blanks longer than
    ``max_duration`` (the batch's longest utterance: they can never be
    taken) get no arc.
    """
    U = int(num_labels)
    if U < 0:
        raise ValueError(f"num_labels: expected >= 0, got {U}")
    durations = [int(d) for d in durations]
    W = len(durations) + 2
    u = np.arange(U + 1)
    srcs, dsts, pdfs, spans = [u, u[:-1]], [u, u[:-1] + 1], [u * W, u[:-1] * W + 1], [np.ones(U + 1), np.ones(U)]
    for i, d in enumerate(durations):
        if max_duration is not None and d > max_duration:
            continue  # longer than any utterance of the batch: never taken
        srcs.append(u), dsts.append(u), pdfs.append(u * W + 2 + i), spans.append(np.full(U + 1, d))
    src = np.concatenate(srcs)
    final = np.full(U + 1, -np.inf)
    if possible:
        final[U] = 0.0
    return Fst(U + 1, 0, src, np.concatenate(dsts), np.concatenate(pdfs), np.full(len(src), -float(sigma)), final,
               np.concatenate(spans).astype(np.int64))


def tdt_step_graph(num_labels: int, durations: Sequence[int], max_frames: int | None = None,
                   possible: bool = True) -> Fst:
    """The TDT step graph of one utterance with ``num_labels`` (``U_b``)
    labels (module docstring): ``U_b + 1`` states; a blank of duration
    ``d > 0`` is a self-loop spanning ``d`` steps, a label of duration ``d``
    an arc ``u -> u + 1`` spanning ``d + 1``.

    ``durations``: the duration of each duration index; those longer than
    ``max_frames`` (default: no limit) get no arcs.  ``possible=False``
    gives no final state (an utterance with no frames)."""
    U = int(num_labels)
    if U < 0:
        raise ValueError(f"num_labels: expected >= 0, got {U}")
    durations = [int(d) for d in durations]
    D = len(durations)
    J = 2 * D
    u = np.arange(U + 1)
    v = u[:-1]
    srcs, dsts, pdfs, spans = [], [], [], []
    for i, d in enumerate(durations):
        if max_frames is not None and d > max_frames:
            continue
        if d > 0:  # blank
            srcs.append(u), dsts.append(u), pdfs.append(u * J + i), spans.append(np.full(U + 1, d))
        if U > 0:  # label
            srcs.append(v), dsts.append(v + 1), pdfs.append(v * J + D + i), spans.append(np.full(U, d + 1))

    def cat(parts):
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    src = cat(srcs)
    final = np.full(U + 1, -np.inf)
    if possible:
        final[U] = 0.0
    return Fst(U + 1, 0, src, cat(dsts), cat(pdfs), np.zeros(len(src)), final, cat(spans))


def _builder(family: str, durations: tuple, sigma: float, logit_lengths) -> Callable[[int, bool], Fst]:
    """``build(num_labels, possible)`` of a family's step graph for a batch
    whose frame counts are ``logit_lengths`` (None: unknown).  The graphs
    are kept (thread-safe LRU), so a new batch builds only the lengths no
    recent batch had."""
    if family == "tdt":
        max_frames = None if logit_lengths is None else int(np.max(logit_lengths, initial=0))
        return lambda u, ok: _STEP_GRAPHS.get((family, u, ok, durations, max_frames),
                                              lambda: tdt_step_graph(u, durations, max_frames, possible=ok))
    cap = None if logit_lengths is None or not len(logit_lengths) else max(int(np.max(logit_lengths)), 1)
    return lambda u, ok: _STEP_GRAPHS.get((family, u, ok, durations, sigma, cap),
                                          lambda: step_graph(u, durations, sigma, possible=ok, max_duration=cap))


_STEP_GRAPHS = LRU(1024)


def _batch_graphs(target_lengths, logit_lengths, build) -> FstBatch:
    """One :class:`FstBatch` of ``build(U_b, T_b > 0)`` graphs, one per
    distinct ``(U_b, possible)`` (the graphs do not depend on the labels)."""
    U = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
    ok = np.ones(len(U), dtype=bool) if logit_lengths is None else np.asarray(logit_lengths).reshape(-1) > 0
    keys = list(zip(U.tolist(), ok.tolist()))
    distinct = sorted(set(keys))
    index = {k: i for i, k in enumerate(distinct)}
    fsts = [build(u, o) for u, o in distinct]
    return FstBatch(fsts, np.array([index[k] for k in keys], dtype=np.int64))


#: label counts below which a family's step graphs are packed once for every count
_PACKED_MAX = 256

_PACKED = LRU(8)


def _packed_graphs(family: str, durations: tuple, sigma: float, target_lengths, logit_lengths) -> FstBatch:
    """The step graphs of a batch as a sequence-to-graph map on one
    :class:`FstBatch` holding the family's graph for every label count
    ``u`` below a power of two above ``max(U_b)``, possible and not (graph
    ``2 u + possible``), packed once per family, durations kept, sigma and
    that bound (thread-safe LRU): a new batch's graphs cost no packing.
    Past :data:`_PACKED_MAX` labels (the packed arcs grow with its square),
    the batch's distinct graphs as :func:`_batch_graphs` packs them."""
    U = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
    ok = np.asarray(logit_lengths).reshape(-1) > 0
    top = int(U.max()) if len(U) else 0
    build = _builder(family, durations, sigma, logit_lengths)
    if not len(U) or top >= _PACKED_MAX:
        return _batch_graphs(U, logit_lengths, build)
    cap = 1 << max(top, 15).bit_length()  # > max(U_b), at least 16
    longest = max(int(np.max(logit_lengths)), 1 if family == "rnnt" else 0)
    kept = tuple(d <= longest for d in durations)  # the durations the graphs have arcs for
    packed = _PACKED.get((family, durations, kept, sigma, cap),
                         lambda: FstBatch([build(u, o) for u in range(cap) for o in (False, True)]))
    return packed.with_sequences(2 * U + ok)


def _durations(value, name: str, lo: int) -> tuple:
    return tuple(checks.durations(value, name, lo, MAX_DURATION))


def rnnt_graphs(target_lengths: Ints, logit_lengths: Ints | None = None) -> FstBatch:
    """The RNN-T step graphs of a batch: one :class:`FstBatch` whose sequence
    ``b`` runs the chain of ``target_lengths[b] + 1`` states (utterances with
    the same label count share a graph).  ``logit_lengths`` (optional,
    ``[B]``) marks utterances with zero frames as impossible.

    Run sequence ``b`` for ``logit_lengths[b] + target_lengths[b]`` steps."""
    return _batch_graphs(target_lengths, logit_lengths, _builder("rnnt", (), 0.0, logit_lengths))


def multiblank_graphs(target_lengths: Ints, big_blank_durations: Sequence[int], sigma: float = 0.0,
                      logit_lengths: Ints | None = None) -> FstBatch:
    """The multi-blank RNN-T step graphs of a batch (see the module docstring
    for the big blanks' arcs spanning frames); ``sigma`` is subtracted on every arc."""
    durations = _durations(big_blank_durations, "big_blank_durations", 2)
    sigma = checks.number(sigma, "sigma")
    return _batch_graphs(target_lengths, logit_lengths, _builder("rnnt", durations, sigma, logit_lengths))


def tdt_graphs(target_lengths: Ints, durations: Sequence[int], logit_lengths: Ints | None = None) -> FstBatch:
    """The TDT step graphs of a batch as one :class:`~chainfb.FstBatch`
    (utterances with the same label count share a graph).  With
    ``logit_lengths`` (``[B]``), utterances with no frames are impossible
    and durations longer than ``max(logit_lengths)`` get no arcs.  Run
    sequence ``b`` for ``logit_lengths[b] + target_lengths[b]`` steps."""
    durations = _durations(durations, "durations", 0)
    return _batch_graphs(target_lengths, logit_lengths, _builder("tdt", durations, 0.0, logit_lengths))


class ScoreEntries:
    """Every ``(column, t)`` a score map fills for logits with ``T`` frames:
    int64 ``[E]`` arrays ``rows`` (step ``t + u``), ``cols`` (engine column),
    ``flat`` (``rows * C + cols``, the flat index into the engine's ``[num_steps,
    C]``), ``cells`` (flat ``(b, t, u)`` index into ``[B, T, U1]``), ``slots``
    (flat ``(b, u, j)`` index into a ``[B, U1, width]`` table), ``kinds``
    (``j``) and ``arcs`` (flat ``(b, t, u, j)`` index into ``[B, T, U1, width]``).

    RNN-T / multi-blank: every ``t`` in ``[0, T_b)`` (a big blank landing
    past ``T_b``, or at ``T_b`` on a row other than ``U_b``, is on no path:
    the engine counts paths of exactly ``T_b + U_b`` steps and every score
    at ``t = T_b`` is ``-inf``).  TDT: the ``t`` at which the move is
    allowed, ``t + d <= T_b - 1``, or ``t + d == T_b`` for a blank on the
    last row ``u == U_b`` (NeMo's rules)."""

    def __init__(self, layout: TransducerLayout, T: int):
        r = layout.real
        b, u, j = layout.col_b[r], layout.col_u[r], layout.col_j[r]
        Tb = layout.logit_lengths[b]
        if layout.family == "tdt":
            D = layout.width // 2
            kind, d = j // D, np.asarray(layout.durations, dtype=np.int64)[j % D]
            last_blank = (kind == 0) & (u == layout.target_lengths[b])
            count = np.maximum(Tb - d + last_blank, 0)
        else:
            count = Tb
        which = np.repeat(np.arange(len(r)), count)
        t = concat_ranges(np.zeros(len(r), dtype=np.int64), count)
        bw, uw = b[which], u[which]
        U1 = layout.umax + 1
        self.T = int(T)
        self.rows = t + uw
        self.cols = r[which]
        self.cells = (bw * self.T + t) * U1 + uw
        self.kinds = j[which]
        self.slots = (bw * U1 + uw) * layout.width + self.kinds
        self.flat = self.rows * layout.lat.num_columns + self.cols
        self.arcs = self.cells * layout.width + self.kinds


class TransducerLayout:
    """Compiled batch: lattice plus the column bookkeeping the score map needs.

    Attributes
    ----------
    batch : FstBatch, lat : Lattice
    family : ``"rnnt"`` (RNN-T, multi-blank) or ``"tdt"``; durations : the
        big-blank (``"rnnt"``) or TDT durations.
    target_lengths, logit_lengths : int64 ``[B]``, ``U_b`` and ``T_b``.
    steps : int64 ``[B]``, ``T_b + U_b`` (the engine's lengths).
    num_steps : int, ``max(steps)`` (rows of the engine's score matrix).
    width : int, arc kinds per main state (``M + 2``; TDT ``2D``).
    umax : int, ``U1 - 1`` of the logits the layout serves.
    colidx : int64 ``[B, umax + 1, width]``: column of ``(b, u, j)``, -1 if unused.
    col_b, col_u, col_j : int64 ``[C]`` per column.
    real : int64 ``[C]`` every column (each arc of the step graphs reads a
        symbol: there are no auxiliary arcs).

    Tables derived from the layout (:meth:`entries`, device copies) are kept
    in :meth:`memo`, so a batch shape seen again costs no compilation and no
    upload.
    """

    def __init__(self, batch: FstBatch, target_lengths: Ints, logit_lengths: Ints, width: int, umax: int,
                 family: str = "rnnt", durations: tuple = ()):
        self.batch = batch
        self.lat = lat = Lattice.of(batch)
        self.family, self.durations = family, tuple(durations)
        U = np.asarray(target_lengths, dtype=np.int64)
        T = np.asarray(logit_lengths, dtype=np.int64)
        self.target_lengths, self.logit_lengths = U, T
        self.steps = T + U
        self.num_steps = int(self.steps.max()) if len(U) else 0
        self.width, self.umax = width, umax
        b = lat.col_seq
        self.col_b = b
        self.col_u = lat.col_pdf // width
        self.col_j = lat.col_pdf % width
        self.real = np.arange(lat.num_columns, dtype=np.int64)
        self.colidx = np.full((len(U), umax + 1, width), -1, dtype=np.int64)
        r = self.real
        self.colidx[b[r], self.col_u[r], self.col_j[r]] = r
        self._memo = LRU(16)

    def cache(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per ``key`` and kept with the layout
        (thread-safe, :class:`chainfb._cache.LRU`; at most 16 keys: frame
        counts, devices, streams)."""
        return self._memo.get(key, build)

    def entries(self, T: int) -> ScoreEntries:
        """The :class:`ScoreEntries` for logits with ``T`` frames (cached)."""
        return self.cache(("entries", int(T)), lambda: ScoreEntries(self, T))

    def slot_counts(self) -> np.ndarray:
        """int64 ``[B, umax + 1, width]``: how many frames ``t = 0, 1, ..``
        arc kind ``j`` of main state ``u`` is read at (the same rule as
        :class:`ScoreEntries`; 0 for an unused slot), cached."""

        def build():
            r = self.real
            b, u, j = self.col_b[r], self.col_u[r], self.col_j[r]
            count = self.logit_lengths[b]
            if self.family == "tdt":
                D = self.width // 2
                d = np.asarray(self.durations, dtype=np.int64)[j % D]
                last_blank = (j // D == 0) & (u == self.target_lengths[b])
                count = np.maximum(count - d + last_blank, 0)
            out = np.zeros(self.colidx.shape, dtype=np.int64)
            out[b, u, j] = count
            return out

        return self.cache(("slot_counts",), build)


_LAYOUTS = LRU(16)


def compile_layout(target_lengths: Ints, logit_lengths: Ints, durations: Sequence[int] = (), sigma: float = 0.0,
                   umax: int | None = None, family: str = "rnnt") -> TransducerLayout:
    """The :class:`TransducerLayout` of a batch: ``family="rnnt"`` (RNN-T,
    or multi-blank with big-blank ``durations`` and ``sigma`` on real arcs)
    or ``"tdt"`` (TDT ``durations``).  Cached (thread-safe LRU) by the
    lengths ``[B]``, the family, the durations, sigma and ``umax`` (the
    logits' ``U1 - 1``, default ``max(U_b)``): the graphs do not depend on
    the label values.  Arguments are trusted (the public losses check them)."""
    U = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
    T = np.asarray(logit_lengths, dtype=np.int64).reshape(-1)
    durations = tuple(int(d) for d in durations)
    umax = int(U.max()) if umax is None and len(U) else int(umax or 0)
    key = (family, U.tobytes(), T.tobytes(), durations, float(sigma), umax)

    def build():
        batch = _packed_graphs(family, durations, float(sigma), U, T)
        width = 2 * len(durations) if family == "tdt" else len(durations) + 2
        return TransducerLayout(batch, U, T, width, umax, family, durations)

    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    return _LAYOUTS.get(key, build)
