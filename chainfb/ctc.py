"""CTC compiled into the engine: :func:`ctc_graph` (the CTC topology as one
acceptor over vocabulary indices per sequence) and :func:`ctc_loss`
(``torch.nn.functional.ctc_loss``'s signature and numbers).

The graph of a label sequence ``y_1..y_U`` walks the extended sequence
``l' = (blank, y_1, blank, y_2, ..., y_U, blank)``.  State 0 is the start
(nothing read yet); state ``p + 1`` means "the last frame was read as
``l'_p``", so every arc into state ``p + 1`` carries pdf ``l'_p``:

- the start goes to ``l'_0`` (blank) and ``l'_1`` (``y_1``);
- every position has a self-loop (a blank or a label repeated over frames)
  and an arc to the next position;
- a label position ``p`` is also reached from ``p - 2`` (skipping the blank
  between two labels) when ``y`` differs there (``l'_p != l'_{p-2}``);
- the last blank and the last label are final (the start too when ``U =
  0``, so that zero frames and zero labels cost 0, as in torch).

All arc and final weights are 0: the scores are the log-probs, gathered
per frame by the pdf score map (Kaldi's strided column gather) straight
from ``log_probs [T, N, C]``, viewed as ``[N, T, C]`` without a copy.  The
engine does the rest; there is no CTC recursion here.

Gradient convention: the gradient w.r.t. ``log_probs`` is the true one
(minus the label posteriors, as for free inputs; it passes
``gradcheck``).  ``torch.nn.functional.ctc_loss`` returns ``exp(log_probs)
- posteriors`` instead, which differs from it by a term that
``log_softmax``'s backward removes: for log-probs computed by
``log_softmax`` the gradients w.r.t. the logits are the same.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from ._arrays import as_array, check_tensor, wrap_like
from .batch import FstBatch
from .criterion import Criterion, apply
from .fst import Fst
from .lattice import Lattice
from .score_map import PdfScoreMap

__all__ = ["ctc_graph", "ctc_loss", "CtcCriterion"]

_REDUCTIONS = ("none", "mean", "sum")


def _int_array(x, name):
    """``x`` (tensor, array, list or int) as an int64 NumPy array."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor, got dtype {x.dtype}")
        return x.detach().cpu().to(torch.int64).numpy()
    try:
        arr = np.asarray(x)
    except Exception:  # noqa: BLE001 -- ragged lists and other non-arrays
        raise TypeError(f"{name}: expected integers, got {type(x).__name__}") from None
    if arr.size == 0:
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _label_rows(targets, target_lengths, N=None):
    """Per-sequence label arrays from padded ``[N, S]`` or concatenated 1-D
    targets (or a list of label lists)."""
    if isinstance(targets, (list, tuple)) and targets and not np.isscalar(targets[0]) and target_lengths is None:
        rows = [_int_array(r, f"targets[{i}]").reshape(-1) for i, r in enumerate(targets)]
        for i, r in enumerate(rows):
            if r.ndim != 1:
                raise ValueError(f"targets[{i}]: expected a 1-D label list")
        return rows
    tg = _int_array(targets, "targets")
    if tg.ndim == 2:
        n, S = tg.shape
        if target_lengths is None:
            lens = np.full(n, S, dtype=np.int64)
        else:
            lens = _int_array(target_lengths, "target_lengths").reshape(-1) if np.ndim(target_lengths) else None
            if lens is None or lens.shape != (n,):
                raise ValueError(f"target_lengths: expected shape ({n},) to match targets [N={n}, S], "
                                 f"got {tuple(np.shape(target_lengths))}")
        if n and (lens.min() < 0 or lens.max() > S):
            bad = lens[(lens < 0) | (lens > S)][0]
            raise ValueError(f"target_lengths: every length must lie in [0, S={S}] (targets' width), got {bad}")
        return [tg[i, : lens[i]] for i in range(n)]
    if tg.ndim == 1:
        if target_lengths is None:
            return [tg]
        lens = _int_array(target_lengths, "target_lengths").reshape(-1)
        if lens.size and lens.min() < 0:
            raise ValueError(f"target_lengths: lengths must be >= 0, got {lens.min()}")
        if int(lens.sum()) != tg.shape[0]:
            raise ValueError(f"target_lengths: concatenated targets hold {tg.shape[0]} labels but the lengths "
                             f"sum to {int(lens.sum())}")
        ends = np.cumsum(lens)
        return [tg[e - l: e] for l, e in zip(lens.tolist(), ends.tolist())]
    raise ValueError(f"targets: expected a padded [N, S] or a concatenated 1-D tensor, got shape {tuple(tg.shape)}")


def _ctc_fst(y: np.ndarray, blank: int) -> Fst:
    """The CTC acceptor of one label sequence (see the module docstring)."""
    U = len(y)
    P = 2 * U + 1
    lab = np.full(P, blank, dtype=np.int64)  # l'
    lab[1::2] = y
    pos = np.arange(P)
    # start -> l'_0, l'_1; self-loops; p -> p + 1; p - 2 -> p for labels that differ
    first = pos[: min(2, P)]
    skip = pos[3::2][y[1:] != y[:-1]] if U > 1 else np.zeros(0, np.int64)
    src = np.concatenate([np.zeros(len(first), np.int64), pos + 1, pos[:-1] + 1, skip - 1])
    dst = np.concatenate([first + 1, pos + 1, pos[1:] + 1, skip + 1])
    final = np.full(P + 1, -np.inf)
    final[P] = 0.0
    final[P - 1] = 0.0  # the last label (the start itself when U = 0)
    return Fst(P + 1, 0, src, dst, lab[dst - 1], np.zeros(len(src)), final)


def ctc_graph(targets, target_lengths=None, blank: int = 0) -> FstBatch:
    """The CTC topology of each label sequence, as one :class:`FstBatch`
    (one acceptor per sequence over pdfs = vocabulary indices).

    Parameters
    ----------
    targets : padded ``[N, S]`` or concatenated 1-D integer tensor/array,
        or a list of N label lists.
    target_lengths : ``[N]`` ints, optional (default: full rows of a padded
        ``targets``; required to split concatenated targets into several
        sequences).
    blank : int >= 0, the blank's index.

    Returns
    -------
    FstBatch
        Sequence ``n``'s acceptor has ``2 U_n + 2`` states (start 0, then
        one per position of ``blank, y_1, blank, ..., y_U, blank``) and arc
        weights 0; with scores ``log_probs[n]`` (``[T, C]``) its
        log-likelihood over ``T`` frames is minus the CTC loss.  Mix it with
        other graphs through :func:`chainfb.forward_backward` /
        :class:`chainfb.PdfCriterion`.
    """
    blank = _check_blank(blank)
    rows = _label_rows(targets, target_lengths)
    if not rows:
        raise ValueError("targets: expected at least one sequence")
    for i, r in enumerate(rows):
        if r.size and r.min() < 0:
            raise ValueError(f"targets: label {r.min()} (sequence {i}) is negative")
    return FstBatch([_ctc_fst(r, blank) for r in rows])


def _check_blank(blank):
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)):
        raise TypeError(f"blank: expected an int, got {type(blank).__name__}")
    if blank < 0:
        raise ValueError(f"blank: expected an index >= 0, got {blank}")
    return int(blank)


class _Cache:
    """Small LRU of compiled lattices keyed by (labels, blank)."""

    def __init__(self, size=8):
        self.size, self.items = size, OrderedDict()

    def get(self, rows, blank):
        key = (blank, len(rows), np.array([len(r) for r in rows]).tobytes(),
               (np.concatenate(rows) if rows else np.zeros(0, np.int64)).tobytes())
        lat = self.items.get(key)
        if lat is None:
            lat = Lattice.of(FstBatch([_ctc_fst(r, blank) for r in rows]))
            self.items[key] = lat
            if len(self.items) > self.size:
                self.items.popitem(last=False)
        else:
            self.items.move_to_end(key)
        return lat


_cache = _Cache()


class CtcCriterion(Criterion):
    """CTC over ``log_probs [T, N, C]``: value = minus the CTC loss per
    sequence (the log-likelihood of the targets), gradient w.r.t.
    ``log_probs``.  It runs on ``log_probs.transpose(0, 1)``, the zero-copy
    ``[N, T, C]`` view, through the pdf column gather; the gradient is
    returned in that view of a buffer laid out like ``log_probs``."""

    def __init__(self, lattice: Lattice, input_lengths: np.ndarray):
        self.lattice = lattice
        self.lengths = input_lengths
        self.score_map = PdfScoreMap(lattice.col_seq, lattice.col_pdf)

    def gather(self, x, need_grad=True):
        arr, xp = as_array(x, "log_probs")  # the [N, T, C] view of [T, N, C]
        return self.score_map.gather(xp, arr)

    def finish(self, x, loglike, post):
        arr, xp = as_array(x, "log_probs")
        value = wrap_like(xp.asarray(loglike).astype(arr.dtype), x)
        if post is None:
            return value, None
        N, T, C = arr.shape
        grad = xp.zeros((T, N, C), dtype=arr.dtype).transpose(1, 0, 2)  # laid out like log_probs
        self.score_map.scatter_add(xp, grad, post, accumulate=False)
        return value, wrap_like(grad, x)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False):
    """The CTC loss, ``torch.nn.functional.ctc_loss``'s signature and numbers.

    Parameters
    ----------
    log_probs : ``[T, N, C]`` (or unbatched ``[T, C]``) float32/float64
        tensor, CPU or CUDA: per-frame log-probabilities (e.g.
        ``log_softmax`` outputs).
    targets : padded ``[N, S]`` or concatenated 1-D (``sum(target_lengths)``)
        integer tensor of labels in ``[0, C)``, none equal to ``blank``.
    input_lengths, target_lengths : ``[N]`` ints (tensors or sequences; an
        int for unbatched input).
    blank : int in ``[0, C)``.
    reduction : ``"none"`` (``[N]``), ``"sum"``, or ``"mean"``: each loss
        divided by its target length (clamped to at least 1), then the
        batch mean.
    zero_infinity : bool
        Infinite losses (no alignment fits) become 0, with zero gradient.

    Returns
    -------
    The loss, dtype of ``log_probs``, on its device.  Its gradient w.r.t.
    ``log_probs`` is the true gradient (minus the label posteriors per
    frame); see the module docstring for how it relates to torch's.
    """
    check_tensor(log_probs, "log_probs", (torch.float32, torch.float64))
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs = log_probs.unsqueeze(1)
        if isinstance(targets, torch.Tensor) and targets.dim() == 1:
            targets = targets.unsqueeze(0)
        input_lengths = np.reshape(_int_array(input_lengths, "input_lengths"), (1,))
        target_lengths = np.reshape(_int_array(target_lengths, "target_lengths"), (1,))
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs: expected a 3-D tensor [T, N, C], got shape {tuple(log_probs.shape)}")
    T, N, C = log_probs.shape
    blank = _check_blank(blank)
    if blank >= C:
        raise ValueError(f"blank: index {blank} is outside the vocabulary [0, C={C})")
    il = _int_array(input_lengths, "input_lengths").reshape(-1)
    tl = _int_array(target_lengths, "target_lengths").reshape(-1)
    if il.shape != (N,):
        raise ValueError(f"input_lengths: expected {N} lengths (log_probs' batch size), got {il.shape[0]}")
    if tl.shape != (N,):
        raise ValueError(f"target_lengths: expected {N} lengths (log_probs' batch size), got {tl.shape[0]}")
    if N and (il.min() < 0 or il.max() > T):
        bad = il[(il < 0) | (il > T)][0]
        raise ValueError(f"input_lengths: every length must lie in [0, T={T}], got {bad}")
    if isinstance(targets, torch.Tensor) and targets.dim() not in (1, 2):
        raise ValueError(f"targets: expected a padded [N, S] or a concatenated 1-D tensor, "
                         f"got shape {tuple(targets.shape)}")
    if isinstance(targets, torch.Tensor) and targets.dim() == 2 and targets.shape[0] != N:
        raise ValueError(f"targets: batch size {targets.shape[0]} does not match log_probs' batch size {N}")
    rows = _label_rows(targets, tl)
    for i, r in enumerate(rows):
        if r.size and (r.min() < 0 or r.max() >= C):
            bad = r[(r < 0) | (r >= C)][0]
            raise ValueError(f"targets: label {bad} (sequence {i}) is outside the vocabulary [0, C={C})")
    if N == 0:
        costs = log_probs.sum((0, 2)) * 0
    else:
        costs = -apply(log_probs.transpose(0, 1), CtcCriterion(_cache.get(rows, blank), il))
    if zero_infinity:
        costs = torch.where(torch.isinf(costs), torch.zeros_like(costs), costs)
    if unbatched:
        costs = costs.squeeze(0)
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    div = torch.as_tensor(tl, device=costs.device).clamp(min=1).to(costs.dtype)
    return (costs / (div[0] if unbatched else div)).mean()
