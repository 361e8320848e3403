"""RNN-T and multi-blank RNN-T losses: validate (:func:`check_inputs` and
:mod:`chainfb.checks`, once, at the public function), compile the batch
into a :class:`~chainfb.transducer.criterion.TransducerCriterion`, and run
it through :func:`chainfb.criterion.apply` (per-utterance costs and their
gradient in one pass; backward scales the saved gradient).  Reductions are
:func:`chainfb.checks.reduce` on the cost vector (plain torch ops), so every
reduction gets the right gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._arrays import Array
from .. import checks
from ..criterion import apply
from .criterion import TransducerCriterion
from .graphs import MAX_DURATION

__all__ = ["rnnt_loss", "multiblank_rnnt_loss", "check_inputs", "checked_inputs", "check_options", "check_durations",
           "reduce_costs"]


def _host_ints(named: dict) -> dict:
    """Integer tensors ``{name: tensor}`` as int64 NumPy arrays, read to the
    host in one copy per device (one synchronisation for a GPU batch)."""
    out, by_device = {}, {}
    for name, t in named.items():
        by_device.setdefault(t.device, []).append(name)
    for device, names in by_device.items():
        ts = [named[n].detach() for n in names]
        flat = torch.cat([t.reshape(-1).to(torch.int64) for t in ts]) if len(ts) > 1 else ts[0].reshape(-1)
        host = (flat.cpu() if device.type != "cpu" else flat).numpy()
        host = host.astype(np.int64, copy=False)
        at = 0
        for n, t in zip(names, ts):
            out[n] = host[at:at + t.numel()].reshape(t.shape)
            at += t.numel()
    return out


def check_inputs(
    logits: Any,
    targets: Any,
    logit_lengths: Any,
    target_lengths: Any,
    blank: int,
    num_big_blanks: int = 0,
    exact_shapes: bool = False,
) -> tuple[int, np.ndarray, np.ndarray]:
    """Validate a transducer batch; returns ``(blank, T_b int64 [B], U_b int64 [B])``
    with ``blank`` resolved (``blank < 0`` means ``V + blank``).

    logits ``[B, T, U, V]`` float; targets ``[B, >= max(U_b)]`` int32/int64;
    logit_lengths, target_lengths ``[B]`` int32/int64.  With
    ``exact_shapes`` (torchaudio's rule) ``T == max(T_b)`` and
    ``U == max(U_b) + 1`` are required; otherwise ``>=``.  The three integer
    tensors are read to the host together, in one copy.
    """
    return checked_inputs(logits, targets, logit_lengths, target_lengths, blank, num_big_blanks, exact_shapes)[:3]


def checked_inputs(logits: Any, targets: Any, logit_lengths: Any, target_lengths: Any, blank: int,
                   num_big_blanks: int = 0,
                   exact_shapes: bool = False) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`check_inputs`, also returning the targets read to the host: ``(blank, T_b [B], U_b [B], targets [B,
    S])``, int64 NumPy."""
    checks.tensor(logits, "logits", checks.FLOATS, 4, "[B, T, U, V]")
    if logits.device.type not in ("cpu", "cuda"):
        raise ValueError(f"logits: expected a CPU or CUDA tensor, got a tensor on {logits.device}")
    B, T, U1, V = logits.shape
    if B == 0:
        raise ValueError("logits: expected a batch of at least one utterance, got B = 0")
    if V == 0:
        raise ValueError("logits: the vocabulary dimension V is 0")
    if U1 == 0:
        raise ValueError("logits: the label dimension U (max target length + 1) is 0")
    checks.tensor(targets, "targets", checks.INTS, 2)
    checks.tensor(logit_lengths, "logit_lengths", checks.INTS, 1)
    checks.tensor(target_lengths, "target_lengths", checks.INTS, 1)
    host = _host_ints({"targets": targets, "logit_lengths": logit_lengths, "target_lengths": target_lengths})
    tg = host["targets"]
    if tg.shape[0] != B:
        raise ValueError(f"targets: batch size {tg.shape[0]} does not match logits' batch size {B}")
    Tb = checks.lengths(host["logit_lengths"], "logit_lengths", B)
    Ub = checks.lengths(host["target_lengths"], "target_lengths", B)
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
    b = checks.blank(blank, V, negative=True, reserved=num_big_blanks)
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
    return b, Tb, Ub, tg


def check_options(clamp: Any, fastemit_lambda: Any) -> tuple:
    """``(clamp, fastemit_lambda)`` as floats: ``clamp`` any number but NaN
    (``<= 0`` disables clamping), ``fastemit_lambda`` finite and ``>= 0``."""
    clamp = checks.number(clamp, "clamp", lo=-np.inf, finite=False)
    return clamp, checks.number(fastemit_lambda, "fastemit_lambda", lo=0.0)


def reduce_costs(costs: torch.Tensor, reduction: str) -> torch.Tensor:
    """``"none"`` ``[B]``, ``"sum"`` or ``"mean"`` (batch mean) of per-utterance
    costs (:func:`chainfb.checks.reduce`; the name is checked)."""
    return checks.reduce(costs, checks.reduction(reduction))


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
    fused_log_softmax : ``True`` or ``False`` (anything else, e.g. the
        string ``"False"``, is a ``TypeError``); ``False`` treats ``logits``
        as log-probabilities (the gradient is then minus the arc posteriors
        only).
    fastemit_lambda : FastEmit regularisation as NeMo defines it: cost
        ``-(1 + lambda) log P`` and the label-arc gradient terms scaled by
        ``1 + lambda``, plus ``lambda * softmax * P(label arc)``.

    Returns
    -------
    Scalar cost, or ``[B]`` with ``reduction="none"``, in ``logits``' dtype.
    An utterance with no alignment (or non-finite logits) costs ``inf``/NaN
    and gets zero gradient.
    """
    reduction = checks.reduction(reduction)
    clamp, fastemit_lambda = check_options(clamp, fastemit_lambda)
    fused_log_softmax = checks.flag(fused_log_softmax, "fused_log_softmax")
    blank, Tb, Ub, host = checked_inputs(logits, targets, logit_lengths, target_lengths, blank)
    crit = TransducerCriterion(logits.shape, targets, Tb, Ub, blank, fused_log_softmax=fused_log_softmax,
                               fastemit_lambda=fastemit_lambda, clamp=clamp, host_targets=host)
    return checks.reduce(apply(logits, crit), reduction)


def check_durations(big_blank_durations: Any, V: int, name: str = "big_blank_durations") -> list:
    """The big-blank durations as a list of ints: a non-empty sequence of
    integers (no strings, no fractions) in ``[2, MAX_DURATION]`` (a big
    blank longer than every utterance is never taken: the step graphs leave
    it out, so memory stays bounded whatever the durations), fewer than the
    vocabulary size ``V`` (the standard blank needs an index too)."""
    durations = checks.durations(big_blank_durations, name, 2, MAX_DURATION)
    if len(durations) >= V:
        raise ValueError(f"{name}: {len(durations)} big blanks do not fit a vocabulary of {V}")
    return durations


def multiblank_rnnt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    big_blank_durations: Sequence[int] | Array,
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
    reduction = checks.reduction(reduction)
    clamp, fastemit_lambda = check_options(clamp, fastemit_lambda)
    sigma = checks.number(sigma, "sigma")
    checks.tensor(logits, "logits")
    V = logits.shape[-1] if logits.dim() == 4 else 0
    durations = check_durations(big_blank_durations, max(V, 1))
    blank, Tb, Ub, host = checked_inputs(logits, targets, logit_lengths, target_lengths, blank, len(durations))
    crit = TransducerCriterion(logits.shape, targets, Tb, Ub, blank, tuple(durations), sigma,
                               fastemit_lambda=fastemit_lambda, clamp=clamp, host_targets=host)
    return checks.reduce(apply(logits, crit), reduction)
