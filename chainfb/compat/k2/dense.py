"""k2's dense intersection -- ``DenseFsaVec``, ``intersect_dense``,
``intersect_dense_pruned`` and the lattices' ``get_tot_scores`` -- computed
by chainfb's engine, exactly (no beam).

k2's rules, reproduced:

- ``DenseFsaVec(log_probs [N, T, C], supervision_segments [S, 3])``: row
  ``(sequence_index, start_frame, duration)`` is the segment
  ``log_probs[sequence_index, start_frame : start_frame + duration]``, with
  ``0 <= sequence_index < N``, ``0 <= start_frame < T``, ``duration > 0``
  and ``start_frame + duration <= T + allow_truncate`` (frames past ``T``
  are cut off).  k2 appends a final frame to each segment on which only
  label ``-1`` scores (0) and every other label ``-inf``.
- In ``intersect_dense(a_fsas, b_fsas)`` every arc reads one frame: an arc
  labelled ``l >= 0`` scores ``log_probs[..., t, l] + arc score`` (label 0
  is the blank, read like any other column: there is no epsilon in a dense
  intersection), and an arc labelled ``-1`` (into the final state) reads the
  appended frame.  A lattice path is therefore ``duration`` arcs with labels
  ``>= 0`` followed by one ``-1`` arc.
- ``a_fsas`` has one FSA per segment, or ``a_to_b_map[i]`` (non-decreasing)
  names the segment of FSA ``i``; the lattices come in ``a_fsas``'s order.
- ``get_tot_scores(use_double_scores, log_semiring)``: ``[num_fsas]``,
  float64 with ``use_double_scores`` else float32, on the log-probs'
  device; the log-sum over paths (``log_semiring=True``) or the best path's
  score; ``-inf`` where no path exists (zero gradient).  Differentiable
  with respect to the log-probs and to ``a_fsas.scores``: the gradient is
  the arc posteriors (the best path's arcs for ``log_semiring=False``).

How it runs: each FSA becomes a :class:`chainfb.Fst` over the columns of
the log-probs (an arc labelled ``l >= 0`` reads column ``l`` with its score
as weight; a state's ``-1`` arcs, which can only read the appended frame,
become its final weight: their log-sum, or their maximum for the best
path), and the criterion seam (:class:`chainfb.api.PdfCriterion` through
:func:`chainfb.criterion.apply`) runs the engine on the log-probs
themselves -- no copy when segment ``i`` is all of sequence ``i`` -- for
the log-sum and its gradient, :func:`chainfb.best_path` for the best path.
When ``a_fsas.scores`` requires grad, k2's dense layout is built (``[S,
duration + 1, C + 1]``, column 0 = label ``-1``) and every arc gets its own
column (its dense column plus its score, the ``-1`` arcs reading the
appended frame), so that its posterior is a column posterior: memory
``segments x frames x arcs``.  Identical FSAs (a replicated denominator)
share one graph.

Differences from k2: the result is exact where k2 prunes to
``output_beam`` (``intersect_dense_pruned``'s beams are ignored too); the
lattice is not materialised (no ``arcs``, no ``seqframe_idx_name`` /
``frame_idx_name`` attributes); float64 log-probs and scores are accepted
where k2 asserts float32; the supervision segments need not be sorted by
duration.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ... import checks
from ...api import PdfCriterion, best_path
from ...batch import FstBatch
from ...criterion import apply
from ...fst import Fst
from .fsa import Fsa, OnDevice
from .ragged import Device
from .vec import create_fsa_vec

__all__ = ["DenseFsaVec", "DenseLattice", "intersect_dense", "intersect_dense_pruned"]


class DenseFsaVec(OnDevice):
    """k2's ``DenseFsaVec``: log-probs ``[N, T, C]`` cut into supervision
    segments ``[S, 3]`` of ``(sequence_index, start_frame, duration)``
    (module docstring).

    Parameters
    ----------
    log_probs : float32 (or float64) tensor ``[N, T, C]``, CPU or CUDA;
        may require grad.
    supervision_segments : integer tensor ``[S, 3]`` (k2: int32 on the CPU).
    allow_truncate : int >= 0 -- how many frames a segment may run past ``T``.

    Attributes
    ----------
    duration : int32 ``[S]`` (after truncation), on the log-probs' device.
    log_probs : the tensor given.
    """

    def __init__(self, log_probs: torch.Tensor, supervision_segments: torch.Tensor, allow_truncate: int = 0):
        checks.tensor(log_probs, "log_probs", (torch.float32, torch.float64), ndim=3, layout="[N, T, C]")
        if not isinstance(supervision_segments, torch.Tensor):
            raise TypeError(f"supervision_segments: expected an int32 tensor [S, 3], got "
                            f"{type(supervision_segments).__name__}")
        seg = checks.int_array(supervision_segments, "supervision_segments")
        if seg.ndim != 2 or seg.shape[1] != 3:
            raise ValueError(f"supervision_segments: expected shape [S, 3], got {tuple(seg.shape)}")
        allow = checks.integer(allow_truncate, "allow_truncate", lo=0)
        N, T, C = log_probs.shape
        for i, (n, start, dur) in enumerate(seg.tolist()):
            where = f"supervision_segments[{i}] = ({n}, {start}, {dur})"
            if not 0 <= n < N:
                raise ValueError(f"{where}: sequence_index must lie in [0, N={N})")
            if not 0 <= start < T:
                raise ValueError(f"{where}: start_frame must lie in [0, T={T})")
            if dur <= 0:
                raise ValueError(f"{where}: duration must be > 0")
            if start + dur > T + allow:
                raise ValueError(f"{where}: start_frame + duration exceeds T={T}"
                                 + (f" + allow_truncate={allow}" if allow else ""))
        self.log_probs = log_probs
        self._seq = seg[:, 0].copy()
        self._start = seg[:, 1].copy()
        self._dur = np.minimum(seg[:, 1] + seg[:, 2], T) - seg[:, 1]
        self.duration = torch.as_tensor(self._dur.astype(np.int32), device=log_probs.device)
        self._dense = None

    def dim0(self) -> int:
        """The number of segments."""
        return len(self._dur)

    @property
    def device(self) -> torch.device:
        return self.log_probs.device

    def to(self, device: Device) -> DenseFsaVec:
        if torch.device(device) == self.device:
            return self
        seg = np.stack([self._seq, self._start, self._dur], 1).astype(np.int32)
        return DenseFsaVec(self.log_probs.to(device), torch.as_tensor(seg))

    def dense(self) -> torch.Tensor:
        """``[S, max_duration + 1, C + 1]``: k2's dense scores per segment
        (column 0 = label ``-1``; row ``duration`` the appended final
        frame; rows after it ``-inf``), differentiable w.r.t. ``log_probs``."""
        if self._dense is None:
            lp = self.log_probs
            N, T, C = lp.shape
            S, D = len(self._dur), int(self._dur.max()) if len(self._dur) else 0
            t = np.arange(D + 1)[None, :]
            inside = t < self._dur[:, None]
            rows = self._seq[:, None] * T + np.where(inside, self._start[:, None] + t, 0)
            dev = lp.device
            body = lp.reshape(N * T, C).index_select(0, torch.as_tensor(rows.reshape(-1), device=dev))
            body = body.view(S, D + 1, C)
            ninf = torch.tensor(-np.inf, dtype=lp.dtype, device=dev)
            body = torch.where(torch.as_tensor(inside, device=dev)[:, :, None], body, ninf)
            last = torch.as_tensor(t == self._dur[:, None], device=dev)
            col0 = torch.where(last, torch.zeros((), dtype=lp.dtype, device=dev), ninf)
            self._dense = torch.cat([col0[:, :, None], body], dim=2)
        return self._dense

    @property
    def scores(self) -> torch.Tensor:
        """k2's flat layout ``[sum(duration + 1), C + 1]``."""
        d = self.dense()
        return torch.cat([d[i, : int(n) + 1] for i, n in enumerate(self._dur)]) if len(self._dur) else d.reshape(0, -1)

    def __str__(self) -> str:
        return (f"DenseFsaVec(num_segments={self.dim0()}, durations={self._dur.tolist()}, "
                f"num_classes={self.log_probs.shape[2]}, device={self.device})")

    __repr__ = __str__


def _digest(*arrays) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(b"|")
    return h.digest()


class DenseLattice:
    """What :func:`intersect_dense` returns: the intersection of each FSA
    of ``a_fsas`` with its segment, kept implicit (its arcs are not
    materialised) and scored exactly by chainfb's engine.

    ``shape`` is ``(num_fsas, None, None)``; :meth:`get_tot_scores` as in
    k2 (module docstring).
    """

    def __init__(self, a_fsas: Fsa, b_fsas: DenseFsaVec, a_index: np.ndarray, b_index: np.ndarray):
        self.a_fsas, self.b_fsas, self._a, self._b = a_fsas, b_fsas, a_index, b_index
        self._graphs = {}

    @property
    def shape(self) -> tuple[int, None, None]:
        return (len(self._b), None, None)

    @property
    def device(self) -> torch.device:
        return self.b_fsas.device

    @property
    def requires_grad(self) -> bool:
        return self.a_fsas.requires_grad or self.b_fsas.log_probs.requires_grad

    def _batch(self, per_arc: bool, log_semiring: bool) -> FstBatch:
        """The FSAs as graphs for the engine, identical ones shared: over
        k2's dense columns, one per arc (``per_arc``, weights 0, ``-1``
        arcs reading the appended frame), or over the log-probs' columns
        with the arc scores as weights and the ``-1`` arcs as final weights
        (log-sum or max of the scores of a state's ``-1`` arcs)."""
        key = (per_arc, log_semiring or per_arc)
        got = self._graphs.get(key)
        if got is None:
            a = self.a_fsas
            lab = a.labels.cpu().numpy().astype(np.int64)
            score = a.scores.detach().cpu().numpy().astype(np.float64)
            fsts, ids, which = [], {}, []
            for S, a0, a1 in a._parts():
                src, dst, lb = a._src[a0:a1], a._dst[a0:a1], lab[a0:a1]
                w = np.zeros(a1 - a0) if per_arc else score[a0:a1]
                digest = _digest(np.array([S]), src, dst, lb, w)
                g = ids.get(digest)
                if g is None:
                    g = ids[digest] = len(fsts)
                    fsts.append(_arc_fst(S, src, dst, lb) if per_arc else _label_fst(S, src, dst, lb, w, log_semiring))
                which.append(g)
            got = self._graphs[key] = FstBatch(fsts, np.array(which, dtype=np.int64)[self._a])
        return got

    def _frames(self) -> torch.Tensor:
        """Each lattice's log-probs ``[num_fsas, frames, C]``: the tensor
        itself when lattice ``i`` is all of sequence ``i`` (no copy), else
        its segments' rows."""
        d = self.b_fsas
        lp = d.log_probs
        N, T, C = lp.shape
        seq, start = d._seq[self._b], d._start[self._b]
        if len(seq) == N and (seq == np.arange(N)).all() and not start.any():
            return lp
        D = int(d._dur[self._b].max()) if len(seq) else 0
        t = np.arange(D)[None, :]
        rows = seq[:, None] * T + np.minimum(start[:, None] + t, T - 1)
        return lp.reshape(N * T, C).index_select(0, torch.as_tensor(rows.reshape(-1), device=lp.device)).view(
            len(seq), D, C)

    def _arc_scores(self) -> torch.Tensor:
        """``[num_fsas, max_duration + 1, arcs]``: each arc's dense column
        (label ``l`` -> column ``l + 1``) plus its score."""
        dense = self.b_fsas.dense()
        dense = dense.index_select(0, torch.as_tensor(self._b, device=dense.device))
        a = self.a_fsas
        counts = np.diff(a._arc_splits)[self._a]
        F, A = len(counts), int(counts.max()) if len(counts) else 0
        col = np.arange(A)[None, :]
        real = col < counts[:, None]
        arc = np.where(real, a._arc_splits[self._a][:, None] + col, 0)
        lab = a.labels.cpu().numpy().astype(np.int64)
        cols = torch.as_tensor(np.where(real, lab[arc] + 1, 0), device=dense.device)
        read = torch.gather(dense, 2, cols[:, None, :].expand(F, dense.shape[1], A))
        w = a.scores.to(device=dense.device).index_select(0, torch.as_tensor(arc.reshape(-1), device=dense.device))
        w = torch.where(torch.as_tensor(real.reshape(-1), device=dense.device), w.to(read.dtype),
                        torch.tensor(-np.inf, dtype=read.dtype, device=dense.device))
        return read + w.view(F, 1, A)

    def get_tot_scores(self, use_double_scores: bool = True, log_semiring: bool = True) -> torch.Tensor:
        """Total score per FSA ``[num_fsas]`` (module docstring): float64 with
        ``use_double_scores``, else float32; the log-sum over paths, or the
        best path's score with ``log_semiring=False``; ``-inf`` without a
        path.  Differentiable w.r.t. the log-probs and ``a_fsas.scores``."""
        dtype = torch.float64 if checks.flag(use_double_scores, "use_double_scores") else torch.float32
        log_semiring = checks.flag(log_semiring, "log_semiring")
        s = self.a_fsas.scores
        per_arc = s.numel() > 0 and ((s.requires_grad and torch.is_grad_enabled()) or not bool(
            torch.all(torch.isfinite(s) | (s == -np.inf))))
        batch = self._batch(per_arc, log_semiring)
        Y = self._arc_scores() if per_arc else self._frames()
        lengths = self.b_fsas._dur[self._b] + (1 if per_arc else 0)
        if not log_semiring:
            return _best_path_scores(Y, batch, lengths, dtype)
        crit = PdfCriterion(batch, tuple(Y.shape), lengths,
                            value_dtype=np.float64 if dtype == torch.float64 else np.float32)
        return apply(Y, crit)


def _empty_fst() -> Fst:
    return Fst(1, 0, [], [], [], [], [-np.inf])


def _arc_fst(S: int, src, dst, label) -> Fst:
    """A k2 FSA over k2's dense columns with one column per arc: arc ``a``
    reads column ``a`` (its dense column plus its score), weight 0; the
    final state ``S - 1`` is final."""
    if S == 0:
        return _empty_fst()
    final = np.full(S, -np.inf)
    final[S - 1] = 0.0
    return Fst(S, 0, src, dst, np.arange(len(src)), np.zeros(len(src)), final)


def _label_fst(S: int, src, dst, label, weight, log_semiring: bool) -> Fst:
    """A k2 FSA over the log-probs' columns: arcs labelled ``l >= 0`` read
    column ``l`` with their score as weight; a state's ``-1`` arcs become
    its final weight (they read k2's appended frame, which scores 0)."""
    if S == 0:
        return _empty_fst()
    fin = label == -1
    final = np.full(S, -np.inf)
    (np.logaddexp if log_semiring else np.maximum).at(final, src[fin], weight[fin])
    return Fst(S, 0, src[~fin], dst[~fin], label[~fin], weight[~fin], final)


def _best_path_scores(Y: torch.Tensor, batch: FstBatch, lengths: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The best path's score per sequence (``dtype``), as a sum of the
    scores ``Y`` it reads plus its (constant) arc weights and final weight:
    differentiable, the gradient is 1 on the path's cells (k2's tropical
    gradient)."""
    score, paths = best_path(batch, Y.detach(), lengths)
    seq, frame, col, const = [], [], [], np.zeros(len(score))
    for n, p in enumerate(paths):
        if not np.isfinite(score[n]):
            continue
        f = batch.fsts[batch.seq_to_graph[n]]
        seq.append(np.full(len(p), n)), frame.append(np.arange(len(p))), col.append(f.pdf[p])
        const[n] = f.log_prob[p].sum() + f.final[f.dst[p[-1]] if len(p) else f.start]
    dev = Y.device
    tot = torch.as_tensor(const, dtype=dtype, device=dev)
    if seq:
        idx = [torch.as_tensor(np.concatenate(v), device=dev) for v in (seq, frame, col)]
        tot = tot.index_add(0, idx[0], Y[idx[0], idx[1], idx[2]].to(dtype))
    fixed = torch.as_tensor(score, dtype=dtype, device=dev)
    return torch.where(torch.as_tensor(np.isfinite(score), device=dev), tot, fixed)


def _check_labels(a_fsas: Fsa, C: int) -> None:
    lab = a_fsas.labels
    if lab.numel() and (int(lab.min()) < -1 or int(lab.max()) >= C):
        bad = lab[(lab < -1) | (lab >= C)][0].item()
        raise ValueError(f"a_fsas: label {bad} is outside [-1, C={C}) (the log-probs' columns; -1 is final)")


def _inputs(a_fsas, b_fsas, output_beam: float, a_to_b_map, shared_ok: bool):
    """Checked ``(a_fsas as an FsaVec, b_fsas, a_index, b_index)``: lattice
    ``i`` intersects FSA ``a_index[i]`` with segment ``b_index[i]``."""
    if not isinstance(a_fsas, Fsa):
        raise TypeError(f"a_fsas: expected a chainfb.compat.k2.Fsa, got {type(a_fsas).__name__}")
    if not isinstance(b_fsas, DenseFsaVec):
        raise TypeError(f"b_fsas: expected a DenseFsaVec, got {type(b_fsas).__name__}")
    checks.number(output_beam, "output_beam", lo=0.0, lo_open=True, finite=False)
    if not a_fsas._vec:
        a_fsas = create_fsa_vec([a_fsas])
    if a_fsas.device != b_fsas.device:
        raise ValueError(f"a_fsas: on {a_fsas.device} but b_fsas on {b_fsas.device}")
    _check_labels(a_fsas, b_fsas.log_probs.shape[2])
    F, S = a_fsas.shape[0], b_fsas.dim0()
    if a_to_b_map is None:
        if F == S:
            return a_fsas, b_fsas, np.arange(S, dtype=np.int64), np.arange(S, dtype=np.int64)
        if shared_ok and F == 1:
            return a_fsas, b_fsas, np.zeros(S, dtype=np.int64), np.arange(S, dtype=np.int64)
        raise ValueError(f"a_fsas: {F} FSAs but b_fsas has {S} segments (give a_to_b_map"
                         + (", or one FSA to share" if shared_ok else "") + ")")
    m = checks.int_array(a_to_b_map, "a_to_b_map", 1)
    if m.shape[0] != F:
        raise ValueError(f"a_to_b_map: expected {F} entries (one per FSA of a_fsas), got {m.shape[0]}")
    if m.size and (m.min() < 0 or m.max() >= S):
        raise ValueError(f"a_to_b_map: segment indexes must lie in [0, {S}), got {m[(m < 0) | (m >= S)][0]}")
    if (np.diff(m) < 0).any():
        raise ValueError(f"a_to_b_map: must be non-decreasing (k2 requires it), got {m.tolist()}")
    return a_fsas, b_fsas, np.arange(F, dtype=np.int64), m.astype(np.int64)


def _no_attribute(name: str, value) -> None:
    if value is not None:
        raise ValueError(f"{name}: not supported -- the lattice's arcs are not materialised here "
                         f"(its total scores are computed exactly by chainfb's engine)")


def intersect_dense(a_fsas: Fsa, b_fsas: DenseFsaVec, output_beam: float, a_to_b_map: torch.Tensor | None = None,
                    seqframe_idx_name: str | None = None, frame_idx_name: str | None = None) -> DenseLattice:
    """k2's ``intersect_dense``, exact (``output_beam`` is checked, not
    used: nothing is pruned).  ``a_fsas``: an FsaVec with one FSA per
    segment of ``b_fsas`` (a single FSA counts as an FsaVec of one), or any
    number of FSAs with ``a_to_b_map [num_fsas]`` (non-decreasing segment
    indexes).  Returns a :class:`DenseLattice`; see the module docstring."""
    _no_attribute("seqframe_idx_name", seqframe_idx_name)
    _no_attribute("frame_idx_name", frame_idx_name)
    return DenseLattice(*_inputs(a_fsas, b_fsas, output_beam, a_to_b_map, shared_ok=False))


def intersect_dense_pruned(a_fsas: Fsa, b_fsas: DenseFsaVec, search_beam: float, output_beam: float,
                           min_active_states: int, max_active_states: int,
                           seqframe_idx_name: str | None = None,
                           frame_idx_name: str | None = None, allow_partial: bool = False) -> DenseLattice:
    """k2's ``intersect_dense_pruned`` signature, computed exactly (beams
    and active-state limits are checked, not used).  ``a_fsas`` has one FSA
    per segment, or one FSA shared by all (the denominator)."""
    checks.number(search_beam, "search_beam", lo=0.0, lo_open=True, finite=False)
    lo = checks.integer(min_active_states, "min_active_states", lo=0)
    checks.integer(max_active_states, "max_active_states", lo=lo)
    if checks.flag(allow_partial, "allow_partial"):
        raise ValueError("allow_partial: not supported (a partial path has no total score here)")
    _no_attribute("seqframe_idx_name", seqframe_idx_name)
    _no_attribute("frame_idx_name", frame_idx_name)
    return DenseLattice(*_inputs(a_fsas, b_fsas, output_beam, None, shared_ok=True))
