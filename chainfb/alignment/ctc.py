"""CTC forced alignment through the engine: :func:`forced_align`
(``torchaudio.functional.forced_align``'s signature and outputs, for any
batch size) and :func:`merge_tokens` / :class:`TokenSpan`.

Each target sequence is compiled by :func:`chainfb.ctc_graph` (the CTC
topology as an acceptor over vocabulary indices) and the engine's max
semiring (:func:`chainfb.engines.best_path`) finds the best path; the pdf of
each winning arc is the frame's label.  There is no CTC recursion here.

Ties.  Where several paths share the best score, the engine keeps, for
every state and frame, the incoming arc from the lowest-numbered state: a
label position is reached by skipping a blank before advancing by one
before staying, so among equally good paths the one whose labels come as
late as possible wins; at the end the path on the last label wins over the
one on the trailing blank.  torchaudio breaks ties the other way round
(staying first, labels as early as possible), so the two agree wherever
the best path is unique, and may differ only between paths of equal
score.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import checks
from .._arrays import Array, Ints
from ..api import PdfCriterion
from ..ctc import ctc_graph
from ..cuda.interop import on_torch_stream
from .paths import best_arcs

__all__ = ["forced_align", "merge_tokens", "TokenSpan", "ctc_min_frames"]


def ctc_min_frames(labels: Ints) -> int:
    """Frames a CTC alignment of ``labels`` needs: their number plus one
    blank between each pair of equal neighbours."""
    y = np.asarray(labels).reshape(-1)
    return int(len(y) + (np.count_nonzero(y[1:] == y[:-1]) if len(y) > 1 else 0))


def _rows(targets, target_lengths, B, C, blank):
    tg = checks.tensor(targets, "targets", checks.INTS, 2, "[B, L]")
    if tg.shape[0] != B:
        raise ValueError(f"targets: batch size {tg.shape[0]} does not match log_probs' batch size {B}")
    L = tg.shape[1]
    tl = checks.lengths(target_lengths, "target_lengths", B, L, bound="targets.shape[1]")
    arr = tg.detach().cpu().to(torch.int64).numpy()
    rows = [arr[b, : tl[b]] for b in range(B)]
    for b, r in enumerate(rows):
        if r.size and (r.min() < 0 or r.max() >= C):
            bad = r[(r < 0) | (r >= C)][0]
            raise ValueError(f"targets: label {bad} (utterance {b}) is outside the vocabulary [0, C={C})")
        if (r == blank).any():
            raise ValueError(f"targets: utterance {b} contains the blank index {blank}")
    return rows


@on_torch_stream
def forced_align(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Ints | None = None,
                 target_lengths: Ints | None = None, blank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The best (Viterbi) CTC alignment of each utterance.

    Parameters
    ----------
    log_probs : ``[B, T, C]`` float16/bfloat16/float32/float64 tensor, CPU or
        CUDA: per-frame log-probabilities (e.g. ``log_softmax`` outputs).
        Any ``B`` (torchaudio takes ``B = 1`` only).
    targets : ``[B, L]`` int32/int64 tensor of labels in ``[0, C)``, none
        equal to ``blank`` (only the first ``target_lengths[b]`` are read).
    input_lengths : ``[B]`` ints in ``[0, T]`` or None (all ``T``).
    target_lengths : ``[B]`` ints in ``[0, L]`` or None (all ``L``).
    blank : int in ``[0, C)``.

    Returns
    -------
    alignments : ``[B, T]`` tensor, ``targets``' dtype, on ``log_probs``'
        device: the label of every frame on the best path (``blank`` past
        ``input_lengths[b]``).
    scores : ``[B, T]`` tensor, ``log_probs``' dtype and device:
        ``log_probs[b, t, alignments[b, t]]`` (0 past ``input_lengths[b]``);
        their sum over ``t`` is the best path's log-probability.

    Raises
    ------
    ValueError
        For an utterance with no alignment: fewer frames than
        :func:`ctc_min_frames` of its labels, or every path through a
        ``-inf`` log-probability.  The message names the utterance.

    CUDA inputs: the scores are gathered on the GPU and the best path is
    decoded on the host by the engine; the results come back on the GPU.
    """
    checks.tensor(log_probs, "log_probs", checks.FLOATS, 3, "[B, T, C]")
    B, T, C = log_probs.shape
    if C == 0:
        raise ValueError("log_probs: the vocabulary dimension C is 0")
    blank = checks.blank(blank, C)
    rows = _rows(targets, target_lengths, B, C, blank)
    il = checks.lengths(input_lengths, "input_lengths", B, T)
    align = torch.full((B, T), blank, dtype=targets.dtype)
    if B:
        x = log_probs.detach()
        if x.dtype == torch.float16:  # the engine reads float32/float64
            x = x.float()
        crit = PdfCriterion(ctc_graph([r for r in rows], blank=blank), x.shape, il)
        for b, p in enumerate(best_arcs(crit.lattice, crit.gather(x), crit.lengths)):
            if p.score == -np.inf:
                need = ctc_min_frames(rows[b])
                why = (f"its {len(rows[b])} labels need at least {need} frames, it has {il[b]}" if il[b] < need
                       else "every alignment passes through a -inf log-probability")
                raise ValueError(f"log_probs: utterance {b} has no CTC alignment ({why})")
            align[b, : il[b]] = torch.from_numpy(p.pdf)
    align = align.to(log_probs.device)
    scores = log_probs.gather(2, align.to(torch.int64)[..., None])[..., 0].detach()
    past = torch.arange(T, device=log_probs.device)[None, :] >= torch.as_tensor(il, device=log_probs.device)[:, None]
    scores = scores.masked_fill(past, 0)
    return align, scores


@dataclass
class TokenSpan:
    """One token of an alignment: frames ``[start, end)`` (``end``
    exclusive) and ``score``, the mean of the frames' scores."""

    token: int
    start: int
    end: int
    score: float

    def __len__(self) -> int:
        return self.end - self.start


def merge_tokens(tokens: Array, scores: Array, blank: int = 0) -> list[TokenSpan]:
    """The token spans of one alignment: runs of equal labels, blanks dropped.

    Parameters
    ----------
    tokens : ``[T]`` int tensor or array, e.g. ``forced_align(...)[0][b, :T_b]``.
    scores : ``[T]`` float tensor or array, e.g. ``forced_align(...)[1][b, :T_b]``
        (log-probs, or their ``exp()`` for mean probabilities).
    blank : the blank index.

    Returns
    -------
    list of :class:`TokenSpan` in time order: each maximal run of one
    non-blank label (a repeated label is two spans only with a blank, or
    another label, between its copies), ``score`` the mean of ``scores``
    over the run.
    """
    tok = checks.int_array(tokens, "tokens")
    if isinstance(scores, torch.Tensor):
        sc = scores.detach().cpu().to(torch.float64).numpy()
    else:
        sc = np.asarray(scores, dtype=np.float64)
    if tok.ndim != 1 or sc.ndim != 1:
        raise ValueError(f"tokens, scores: expected 1-D sequences, got shapes {tok.shape} and {sc.shape}")
    if len(tok) != len(sc):
        raise ValueError(f"tokens, scores: expected equal lengths, got {len(tok)} and {len(sc)}")
    blank = checks.integer(blank, "blank")
    if not len(tok):
        return []
    starts = np.flatnonzero(np.r_[True, tok[1:] != tok[:-1]])
    ends = np.r_[starts[1:], len(tok)]
    return [TokenSpan(int(tok[s]), int(s), int(e), float(sc[s:e].mean()))
            for s, e in zip(starts.tolist(), ends.tolist()) if tok[s] != blank]
