"""RNN-T and multi-blank RNN-T losses: validate, compile the batch into a
:class:`~chainfb.transducer.score_map.TransducerCriterion`, and run it
through :func:`chainfb.criterion.apply` (per-utterance costs and their
gradient in one pass; backward scales the saved gradient).  Reductions are
plain torch ops on the cost vector, so every reduction gets the right
gradient.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from .._arrays import FLOATS, INTS, check_tensor
from ..criterion import apply
from .score_map import TransducerCriterion

__all__ = ["rnnt_loss", "multiblank_rnnt_loss", "check_inputs", "check_durations", "reduce_costs"]

def _int_tensor(x, name, ndim):
    return check_tensor(x, name, INTS, ndim).detach().cpu().to(torch.int64).numpy()


def check_inputs(
    logits,
    targets,
    logit_lengths,
    target_lengths,
    blank: int,
    num_big_blanks: int = 0,
    exact_shapes: bool = False,
):
    """Validate a transducer batch; returns ``(blank, T_b int64 [B], U_b int64 [B])``
    with ``blank`` resolved (``blank < 0`` means ``V + blank``).

    logits ``[B, T, U, V]`` float; targets ``[B, >= max(U_b)]`` int32/int64;
    logit_lengths, target_lengths ``[B]`` int32/int64.  With
    ``exact_shapes`` (torchaudio's rule) ``T == max(T_b)`` and
    ``U == max(U_b) + 1`` are required; otherwise ``>=``.
    """
    check_tensor(logits, "logits", FLOATS, 4, "[B, T, U, V]")
    if logits.device.type not in ("cpu", "cuda"):
        raise ValueError(f"logits: expected a CPU or CUDA tensor, got a tensor on {logits.device}")
    B, T, U1, V = logits.shape
    if B == 0:
        raise ValueError("logits: expected a batch of at least one utterance, got B = 0")
    if V == 0:
        raise ValueError("logits: the vocabulary dimension V is 0")
    if U1 == 0:
        raise ValueError("logits: the label dimension U (max target length + 1) is 0")
    tg = _int_tensor(targets, "targets", 2)
    Tb = _int_tensor(logit_lengths, "logit_lengths", 1)
    Ub = _int_tensor(target_lengths, "target_lengths", 1)
    for name, arr in (("targets", tg), ("logit_lengths", Tb), ("target_lengths", Ub)):
        if arr.shape[0] != B:
            raise ValueError(f"{name}: batch size {arr.shape[0]} does not match logits' batch size {B}")
    if Tb.min() < 0:
        raise ValueError(f"logit_lengths: lengths must be >= 0, got {Tb.min()}")
    if Ub.min() < 0:
        raise ValueError(f"target_lengths: lengths must be >= 0, got {Ub.min()}")
    if Tb.max() > T:
        raise ValueError(f"logit_lengths: max length {Tb.max()} exceeds logits' time dimension T = {T}")
    if Ub.max() + 1 > U1:
        raise ValueError(
            f"target_lengths: max length {Ub.max()} needs logits.shape[2] >= {Ub.max() + 1}, got {U1}"
        )
    if exact_shapes:
        if Tb.max() != T:
            raise ValueError(f"logits: time dimension T = {T} must equal max(logit_lengths) = {Tb.max()}")
        if Ub.max() + 1 != U1:
            raise ValueError(
                f"logits: label dimension U = {U1} must equal max(target_lengths) + 1 = {Ub.max() + 1}"
            )
    if tg.shape[1] < Ub.max():
        raise ValueError(f"targets: {tg.shape[1]} columns cannot hold max(target_lengths) = {Ub.max()} labels")
    if not isinstance(blank, (int, np.integer)) or isinstance(blank, bool):
        raise TypeError(f"blank: expected an int, got {type(blank).__name__}")
    b = int(blank) + V if blank < 0 else int(blank)
    if not num_big_blanks <= b < V:
        lo = num_big_blanks - V if num_big_blanks == 0 else num_big_blanks
        raise ValueError(f"blank: expected an index in [{lo}, {V}) for vocabulary size {V}, got {blank}")
    valid = np.arange(tg.shape[1])[None, :] < Ub[:, None]
    used = tg[valid]
    if used.size:
        if used.min() < 0 or used.max() >= V:
            bad = used[(used < 0) | (used >= V)][0]
            raise ValueError(f"targets: label {bad} is outside the vocabulary [0, {V})")
        reserved = np.arange(b - num_big_blanks, b + 1)
        hit = np.isin(used, reserved)
        if hit.any():
            what = "the blank" if num_big_blanks == 0 else "a blank or big blank"
            raise ValueError(f"targets: label {used[hit][0]} is {what} (index {used[hit][0]})")
    return b, Tb, Ub


def reduce_costs(costs: torch.Tensor, reduction: str) -> torch.Tensor:
    """``"none"`` ``[B]``, ``"sum"`` or ``"mean"`` (batch mean) of per-utterance costs."""
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    if reduction == "mean":
        return costs.mean()
    raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")


def check_number(value, name: str) -> float:
    """``value`` as a float: any real number (Python or NumPy scalar), not a
    bool, a string or a tensor; NaN is left to the caller."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    return float(value)


def _check_common(reduction, clamp, fastemit_lambda):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
    if np.isnan(check_number(clamp, "clamp")):
        raise ValueError("clamp: expected a number (<= 0 disables clamping), got NaN")
    fastemit_lambda = check_number(fastemit_lambda, "fastemit_lambda")
    if fastemit_lambda < 0 or not np.isfinite(fastemit_lambda):
        raise ValueError(f"fastemit_lambda: expected a finite value >= 0, got {fastemit_lambda}")


def rnnt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = -1,
    clamp: float = -1,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    fastemit_lambda: float = 0.0,
) -> torch.Tensor:
    """RNN-T loss (Graves 2012) compiled into chainfb's engine.

    Parameters
    ----------
    logits : ``[B, T, U + 1, V]`` float32/float64/float16/bfloat16 joiner
        output (half types are computed in float32; the gradient comes back
        in the input dtype).
    targets : ``[B, >= U]`` int32/int64 labels (only the first
        ``target_lengths[b]`` of each row are read).
    logit_lengths : ``[B]`` int32/int64 frame counts ``T_b`` (``<= T``).
        ``T_b = 0`` is an impossible utterance (cost ``inf``, zero gradient).
    target_lengths : ``[B]`` int32/int64 label counts ``U_b`` (``0`` allowed).
    blank : blank index; ``blank < 0`` means ``V + blank`` (torchaudio).
    clamp : ``> 0`` clamps each gradient element to ``[-clamp, clamp]``
        (before any reduction scaling); ``<= 0`` disables.
    reduction : ``"mean"`` (batch mean), ``"sum"`` or ``"none"`` (``[B]``).
    fused_log_softmax : ``False`` treats ``logits`` as log-probabilities
        (the gradient is then minus the arc posteriors only).
    fastemit_lambda : FastEmit regularisation as NeMo defines it: cost
        ``-(1 + lambda) log P`` and the label-arc gradient terms scaled by
        ``1 + lambda``, plus ``lambda * softmax * P(label arc)``.

    Returns
    -------
    Scalar cost, or ``[B]`` with ``reduction="none"``, in ``logits``' dtype.
    An utterance with no alignment (or non-finite logits) costs ``inf``/NaN
    and gets zero gradient.
    """
    _check_common(reduction, clamp, fastemit_lambda)
    blank, Tb, Ub = check_inputs(logits, targets, logit_lengths, target_lengths, blank)
    crit = TransducerCriterion(logits.shape, targets, Tb, Ub, blank, fused_log_softmax=bool(fused_log_softmax),
                               fastemit_lambda=float(fastemit_lambda), clamp=float(clamp))
    return reduce_costs(apply(logits, crit), reduction)


def check_durations(big_blank_durations, V, T=None, name="big_blank_durations"):
    """The big-blank durations as a list of ints: a sequence of integers (no
    strings, no fractions), each ``>= 2`` and, given the logits' time
    dimension ``T`` (a longer big blank can never be taken: the step graphs
    leave it out, so memory stays bounded whatever the durations)."""
    if isinstance(big_blank_durations, (str, bytes)) or not hasattr(big_blank_durations, "__iter__"):
        raise TypeError(f"{name}: expected a sequence of ints, got {type(big_blank_durations).__name__}")
    durations = []
    for d in big_blank_durations:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (numbers.Integral, np.integer)):
            raise TypeError(f"{name}: expected integer durations, got {d!r}")
        durations.append(int(d))
    if not durations:
        raise ValueError("big_blank_durations: expected at least one big-blank duration (use rnnt_loss otherwise)")
    if any(d < 2 for d in durations):
        raise ValueError(f"big_blank_durations: every duration must be >= 2, got {durations}")
    if len(durations) >= V:
        raise ValueError(f"big_blank_durations: {len(durations)} big blanks do not fit a vocabulary of {V}")
    return durations


def multiblank_rnnt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    big_blank_durations,
    sigma: float = 0.0,
    fastemit_lambda: float = 0.0,
    clamp: float = -1,
    reduction: str = "mean",
) -> torch.Tensor:
    """Multi-blank RNN-T loss (Xu et al., arXiv 2211.03541; NeMo's layout);
    CUDA logits run through the GPU kernels, like :func:`rnnt_loss`.

    Parameters
    ----------
    logits : ``[B, T, U + 1, V]`` float tensor (log-softmax over all ``V``).
    targets, logit_lengths, target_lengths : as :func:`rnnt_loss`.
    blank : the standard blank (NeMo: the last index, ``V - 1``; negative
        means ``V + blank``); big blank ``i`` is at ``blank - 1 - i``.
    big_blank_durations : durations ``d_i >= 2``; big blank ``i`` moves
        ``(t, u) -> (t + d_i, u)``, allowed inside the lattice iff
        ``t + d_i <= T_b - 1`` and as the last arc iff ``u = U_b`` and
        ``t + d_i = T_b`` (NeMo's boundary rules).
    sigma : logit under-normalisation: every real arc (blank, label, big
        blank) carries ``lp - sigma``.
    fastemit_lambda, clamp, reduction : as :func:`rnnt_loss`.

    Returns
    -------
    Scalar cost (or ``[B]``): ``-(1 + lambda) * log P_sigma``.
    """
    _check_common(reduction, clamp, fastemit_lambda)
    check_tensor(logits, "logits")
    V = logits.shape[-1] if logits.dim() == 4 else 0
    durations = check_durations(big_blank_durations, max(V, 1), logits.shape[1] if logits.dim() == 4 else None)
    if not np.isfinite(check_number(sigma, "sigma")):
        raise ValueError(f"sigma: expected a finite number, got {sigma!r}")
    blank, Tb, Ub = check_inputs(logits, targets, logit_lengths, target_lengths, blank, len(durations))
    crit = TransducerCriterion(logits.shape, targets, Tb, Ub, blank, tuple(durations), float(sigma),
                               fastemit_lambda=float(fastemit_lambda), clamp=float(clamp))
    return reduce_costs(apply(logits, crit), reduction)
