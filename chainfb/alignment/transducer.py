"""Transducer forced alignment through the engine: the Viterbi path of
every utterance over the same compiled step graph its loss uses.

- :func:`rnnt_align`: RNN-T, and multi-blank RNN-T with
  ``big_blank_durations`` (the lattice of :func:`chainfb.rnnt_loss` /
  :func:`chainfb.multiblank_rnnt_loss`, via
  :class:`~chainfb.transducer.TransducerCriterion`);
- :func:`tdt_align`: the Token-and-Duration Transducer
  (:func:`chainfb.tdt_loss`'s lattice, :class:`~chainfb.transducer.TDTCriterion`);
- :func:`grid_align` / :func:`pruned_rnnt_align`: the ``(s, t)`` grid of the
  pruned family (:class:`~chainfb.transducer.GridCriterion`), from ``(px,
  py)`` or from joiner logits on a pruned band.

Each compiles the batch with the criterion, gathers the engine's scores
(on the GPU for CUDA inputs), runs :func:`chainfb.engines.best_path` (CuPy
scores are decoded on the host), and reads each winning arc back as a move
on the ``(t, u)`` grid: the step graphs' pdf numbering says which main
state ``u`` and which kind (blank, label, big blank / duration) an arc is,
and on main state ``u`` at step ``n`` the frame is ``t = n - u`` (``t = n``
for the modified grid).  A big blank or a duration is one arc spanning
several steps: the steps it covers (``-1`` in the engine's best path) are
not moves.

Result: one :class:`TransducerAlignment` per utterance.  An utterance with
no alignment (no frames, an impossible duration set, ``-inf`` scores on
every path) gets ``score = -inf`` and empty ``frames`` / ``moves``; no
error is raised, so a batch always aligns.  Ties between equally good
paths go, at every state, to the incoming arc from the lowest-numbered
state: the label arc before the blank, so among equally good paths labels
are emitted as late as possible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import checks
from .._arrays import Ints
from ..cuda.interop import on_torch_stream
from ..transducer import GridCriterion, TransducerCriterion, boundary_from_lengths, check_inputs, rnnt_logprobs_pruned
from ..transducer.loss import check_durations
from ..transducer.tdt import TDTCriterion, check_tdt_durations
from .paths import best_arcs

__all__ = ["TransducerAlignment", "rnnt_align", "tdt_align", "grid_align", "pruned_rnnt_align",
           "BLANK", "LABEL"]

#: move kinds in :attr:`TransducerAlignment.moves` (big blank ``i`` is ``2 + i``)
BLANK, LABEL = 0, 1


@dataclass
class TransducerAlignment:
    """The best alignment of one utterance.

    Attributes
    ----------
    frames : int64 tensor ``[U_b]`` -- the frame ``t`` at which label ``u``
        is emitted (non-decreasing; empty when there is no alignment).
    durations : int64 tensor ``[U_b]`` or None -- TDT: the duration taken
        by each label's arc (frames it advances); None for the other kinds.
    score : float -- the path's log-probability (the sum of its arcs'
        scores, as in the loss: ``-sigma`` per arc where the loss has one);
        ``-inf`` when the utterance has no alignment.
    moves : int64 tensor ``[K, 4]`` -- the whole path as ``(t, u, kind,
        duration)`` rows in order: ``kind`` 0 blank, 1 label, ``2 + i`` big
        blank ``i``; ``duration`` the frames the move advances (RNN-T: 1 for
        a blank, 0 for a label; multi-blank: ``d_i``; TDT: the duration
        taken; grid: ``u`` is the symbol position ``s``, a modified-grid
        symbol advances 1).  Grid coordinates include the boundary's
        ``(s_begin, t_begin)``.
    """

    frames: torch.Tensor
    durations: torch.Tensor | None
    score: float
    moves: torch.Tensor


def _empty(with_durations):
    e = torch.zeros(0, dtype=torch.int64)
    return TransducerAlignment(e, e.clone() if with_durations else None, -float("inf"),
                               torch.zeros((0, 4), dtype=torch.int64))


def _result(moves, U, with_durations, score):
    """A :class:`TransducerAlignment` from rows ``(t, u, kind, duration)`` of one path."""
    mv = np.asarray(moves, dtype=np.int64).reshape(-1, 4)
    lab = mv[mv[:, 2] == LABEL]
    if len(lab) != U:  # cannot happen on a complete path; guards the arc reading
        raise RuntimeError(f"alignment: the best path emits {len(lab)} labels, expected {U}")
    order = np.argsort(lab[:, 1], kind="stable")  # label u leaves row u (s_begin + k on the grid)
    frames, durs = lab[order, 0].copy(), lab[order, 3].copy()
    return TransducerAlignment(torch.from_numpy(frames), torch.from_numpy(durs) if with_durations else None,
                               float(score), torch.from_numpy(mv))


def _step_moves(p, width, kind_of, dur_of, modified=False, s0=0, t0=0):
    """Rows ``(t, u, kind, duration)`` of the arcs of one step graph path
    ``p`` (:class:`~chainfb.alignment.paths.StepArcs`): pdf ``u * width +
    j``, read at step ``n`` (steps inside an arc that spans several, ``-1``,
    are skipped); ``kind_of[j]`` and ``dur_of[j]`` give each ``j``'s kind
    and duration."""
    n = np.arange(len(p.pdf), dtype=np.int64)
    keep = p.arc >= 0
    u, j, n = p.pdf[keep] // width, p.pdf[keep] % width, n[keep]
    t = n if modified else n - u
    return np.stack([t + t0, u + s0, np.asarray(kind_of)[j], np.asarray(dur_of)[j]], axis=1)


def _check_common(logits, targets, logit_lengths, target_lengths, blank, num_big_blanks=0):
    return check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_big_blanks)


@on_torch_stream
@torch.no_grad()
def rnnt_align(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: Ints, target_lengths: Ints,
               blank: int = -1,
               big_blank_durations: Sequence[int] = (), sigma: float = 0.0,
               fused_log_softmax: bool = True) -> list[TransducerAlignment]:
    """The Viterbi alignment of each utterance under RNN-T (or multi-blank
    RNN-T with ``big_blank_durations``).

    Parameters
    ----------
    logits : ``[B, T, U + 1, V]`` float tensor (CPU or CUDA), the joiner
        output (``fused_log_softmax=False``: already log-probs).
    targets : ``[B, >= max(U_b)]`` int32/int64; logit_lengths, target_lengths : ``[B]`` ints.
    blank : blank index (``< 0`` means ``V + blank``, as :func:`chainfb.rnnt_loss`).
    big_blank_durations : multi-blank durations ``d_i >= 2`` (big blank ``i``
        at ``blank - 1 - i``, as :func:`chainfb.multiblank_rnnt_loss`).
    sigma : subtracted from every arc's log-prob (multi-blank's logit
        under-normalisation; it favours paths of fewer arcs).

    Returns
    -------
    list of B :class:`TransducerAlignment` (``durations`` None).
    """
    checks.tensor(logits, "logits", checks.FLOATS, 4, "[B, T, U + 1, V]")
    durations = tuple(check_durations(big_blank_durations, logits.shape[-1])) if len(big_blank_durations) else ()
    sigma = checks.number(sigma, "sigma")
    fused = checks.flag(fused_log_softmax, "fused_log_softmax")
    blank, Tb, Ub = _check_common(logits, targets, logit_lengths, target_lengths, blank, len(durations))
    crit = TransducerCriterion(logits.shape, targets, Tb, Ub, blank, durations, sigma, fused_log_softmax=fused)
    dur_of = np.array([1, 0, *durations], dtype=np.int64)
    return _align_steps(crit, logits, Ub, np.arange(len(durations) + 2), dur_of, False)


@on_torch_stream
@torch.no_grad()
def tdt_align(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: Ints, target_lengths: Ints, blank: int,
              durations: Sequence[int], sigma: float = 0.0) -> list[TransducerAlignment]:
    """The Viterbi alignment of each utterance under the Token-and-Duration
    Transducer (:func:`chainfb.tdt_loss`'s lattice and arguments).

    Parameters
    ----------
    logits : ``[B, T, U + 1, V + D]``: ``V`` token logits, then ``D`` duration logits.
    targets, logit_lengths, target_lengths : as :func:`chainfb.tdt_loss`.
    blank : blank among the ``V`` token logits (``< 0``: ``V + blank``).
    durations : the ``D`` durations (ints ``>= 0``, at least one ``> 0``).
    sigma : subtracted from every token arc's log-prob.

    Returns
    -------
    list of B :class:`TransducerAlignment` with ``durations [U_b]``: label
    ``u`` is emitted at frame ``frames[u]`` with duration ``durations[u]``
    (the next arc leaves frame ``frames[u] + durations[u]``).
    """
    checks.tensor(logits, "logits", checks.FLOATS, 4, "[B, T, U + 1, V + D]")
    durs = check_tdt_durations(durations, logits.shape[-1])
    sigma = checks.number(sigma, "sigma")
    V = logits.shape[-1] - len(durs)
    blank, Tb, Ub = _check_common(logits[..., :V], targets, logit_lengths, target_lengths, blank)
    crit = TDTCriterion(logits.shape, targets, Tb, Ub, blank, durs, sigma)
    D = len(durs)
    kind_of = np.r_[np.full(D, BLANK), np.full(D, LABEL)]
    return _align_steps(crit, logits, Ub, kind_of, np.r_[durs, durs], True)


def _align_steps(crit, logits, Ub, kind_of, dur_of, with_durations: bool) -> list:
    """The best path of each utterance of a compiled step-graph criterion
    read back as moves: arc kind ``j`` (of ``len(kind_of)`` per state) is
    move kind ``kind_of[j]`` advancing ``dur_of[j]`` frames."""
    out = []
    for b, p in enumerate(best_arcs(crit.lattice, crit.gather(logits, need_grad=False), crit.lengths)):
        if p.score == -np.inf:
            out.append(_empty(with_durations))
            continue
        mv = _step_moves(p, len(kind_of), kind_of, dur_of)
        out.append(_result(mv, int(Ub[b]), with_durations, p.score))
    return out


@on_torch_stream
@torch.no_grad()
def grid_align(px: torch.Tensor, py: torch.Tensor,
               boundary: torch.Tensor | None = None) -> list[TransducerAlignment]:
    """The best path through the ``(s, t)`` grid of the pruned family
    (:func:`chainfb.transducer.grid_loglike`'s lattice and arguments).

    Parameters
    ----------
    px : ``[B, S, T + 1]`` (regular) or ``[B, S, T]`` (modified / constrained)
        symbol-arc log-probs; py : ``[B, S + 1, T]`` blank-arc log-probs.
    boundary : ``[B, 4]`` ints ``[s_begin, t_begin, s_end, t_end]`` or None.

    Returns
    -------
    list of B :class:`TransducerAlignment`: ``frames[k]`` the frame of
    symbol ``s_begin + k`` (``k < s_end - s_begin``); ``moves`` in grid
    coordinates.
    """
    crit = GridCriterion(px, py, boundary)
    B, S, T = crit.shape
    bd = checks.int_array(boundary, "boundary") if boundary is not None else np.tile([0, 0, S, T], (B, 1))
    modified = crit.modified
    kind_of = np.array([BLANK, LABEL])
    dur_of = np.array([1, 1 if modified else 0])
    out = []
    for b, p in enumerate(best_arcs(crit.lattice, crit.gather((px, py), need_grad=False), crit.lengths)):
        if p.score == -np.inf:
            out.append(_empty(False))
            continue
        mv = _step_moves(p, 2, kind_of, dur_of, modified, int(bd[b, 0]), int(bd[b, 1]))
        out.append(_result(mv, int(bd[b, 2] - bd[b, 0]), False, p.score))
    return out


def pruned_rnnt_align(logits: torch.Tensor, targets: torch.Tensor, ranges: torch.Tensor, logit_lengths: Ints,
                      target_lengths: Ints, blank: int, rnnt_type: str = "regular") -> list[TransducerAlignment]:
    """The best alignment from joiner logits on a pruned band
    (:func:`chainfb.transducer.pruned_rnnt_loss`'s arguments): ``(px, py)``
    by :func:`chainfb.transducer.rnnt_logprobs_pruned` (``-inf`` outside the
    band), then :func:`grid_align`.

    Parameters
    ----------
    logits : ``[B, T, s_range, C]``; ranges : ``[B, T, s_range]`` ints;
    targets : ``[B, U]``; logit_lengths, target_lengths : ``[B]``; blank : int;
    rnnt_type : ``"regular"``, ``"modified"`` or ``"constrained"``.

    Returns
    -------
    list of B :class:`TransducerAlignment` (``frames [U_b]``: the frame of
    each label; ``-inf`` score where the band holds no complete path).
    """
    with torch.no_grad():
        bd = boundary_from_lengths(logit_lengths, target_lengths)
        px, py = rnnt_logprobs_pruned(logits.detach(), targets, ranges, blank, bd, rnnt_type)
    return grid_align(px, py, bd)
