"""NeMo / ESPnet numba RNN-T losses (``RNNTLossNumba``,
``MultiblankRNNTLossNumba``, ``TDTLossNumba``) computed by chainfb's engine
through the public :func:`chainfb.rnnt_loss` /
:func:`chainfb.multiblank_rnnt_loss` / :func:`chainfb.tdt_loss` (CPU, or the
GPU for CUDA tensors).

Quirks reproduced from the NeMo code (ESPnet vendors a copy):

- ``reduction="mean"`` divides the *summed* cost and the gradient by the
  batch size (the docstring claims a division by the target lengths; the
  code does not do that); ``"mean"`` and ``"sum"`` return a tensor of shape
  ``[1]`` (``costs.sum().unsqueeze(-1)``), ``"none"`` (or ``None``, which
  NeMo's ``RNNTLoss`` sets on the module) returns ``[B]``.
- FastEmit: the cost is ``-(1 + lambda) log P``; the gradient's label-arc
  terms are scaled by ``1 + lambda`` and ``lambda * softmax * P(label arc)``
  is added (this is NeMo's FastEmit gradient, not the derivative of the cost).
- ``clamp > 0`` clamps every gradient element to ``[-clamp, clamp]`` per
  sample before the batch scaling; the modules treat ``clamp <= 0`` as
  "off", the functional ``rnnt_loss`` rejects a negative clamp.
- Multi-blank: standard blank at ``blank`` (NeMo puts it last), big blank
  ``i`` at ``blank - 1 - i``; every arc carries ``lp - sigma``.
- TDT: ``acts [B, T, U + 1, V + D]`` (token logits, then one logit per
  duration); every token arc carries ``lp - sigma`` (the blank too), the
  duration log-softmax is not shifted.  ``omega`` is NeMo's *sampling*
  probability: each call draws ``random.uniform(0, 1)`` (Python's
  ``random``, as NeMo) and computes the plain RNN-T loss of the token logits
  (no sigma, zero duration gradient) for the whole batch when the draw is
  below ``omega``, the TDT loss otherwise (:func:`sample_rnnt`; the native
  :func:`chainfb.tdt_loss` is deterministic and takes the draw's
  expectation instead).  FastEmit scales only the token gradient of label
  arcs; ``clamp`` clamps only the token gradient.

Functional forms in NeMo's argument order (``nemo.collections.asr.parts.
numba.rnnt_loss``; ESPnet's ``rnnt_multi_blank`` has the same):
``rnnt_loss(acts, labels, act_lens, label_lens, blank=0, reduction="mean",
fastemit_lambda=0.0, clamp=0.0)``, ``multiblank_rnnt_loss(acts, labels,
act_lens, label_lens, blank, big_blank_durations, reduction="mean",
fastemit_lambda=0.0, clamp=0.0, *, sigma=0.0)`` and ``tdt_loss(acts,
labels, act_lens, label_lens, blank, durations, reduction="mean",
fastemit_lambda=0.0, clamp=0.0, *, sigma=0.0, omega=0.0)``: the
reduction is the 7th positional argument (chainfb's own
:func:`chainfb.multiblank_rnnt_loss` has ``sigma`` there).  Each is the
module of the same name applied once, and a negative ``clamp`` is a
``ValueError``.  NeMo's own functional multi-blank and TDT forms cannot be
called (their autograd functions take ``sigma``/``omega`` and the split
TDT logits, which the functional forms do not pass), so ``sigma`` and
``omega`` are keyword-only extensions here, with the modules' defaults.

:func:`certify_inputs` is NeMo's input check (int64 labels and lengths,
contiguous tensors, ``T == max(act_lens)``, ``U == max(label_lens) + 1``);
the losses here are more lenient (int32 too, ``T``/``U`` at least the
maxima) and check their inputs themselves.

Arguments are checked with :mod:`chainfb.checks` when a module is built;
tensors and lengths by the native losses.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from .. import checks
from ..transducer.loss import check_options, multiblank_rnnt_loss as _multiblank_rnnt_loss, rnnt_loss as _rnnt_loss
from ..transducer.tdt import tdt_loss as _tdt_loss

__all__ = ["rnnt_loss", "multiblank_rnnt_loss", "tdt_loss", "certify_inputs", "RNNTLossNumba",
           "MultiblankRNNTLossNumba", "TDTLossNumba", "sample_rnnt"]


def _nemo_reduce(costs, reduction):
    if reduction not in ("sum", "mean"):  # "none", or None set on the module (NeMo's RNNTLoss does)
        return costs
    total = costs.sum().unsqueeze(-1)
    return total / costs.shape[0] if reduction == "mean" else total


def _check(reduction, fastemit_lambda, clamp):
    """``(reduction, fastemit_lambda, clamp)`` checked; a clamp ``<= 0`` is off (0)."""
    reduction = "none" if reduction is None else checks.reduction(reduction)
    clamp, fastemit_lambda = check_options(clamp, fastemit_lambda)
    return reduction, fastemit_lambda, clamp if clamp > 0 else 0.0


def sample_rnnt(omega: float) -> bool:
    """NeMo's per-call draw for TDT's ``omega``: use the plain RNN-T loss for
    this batch iff ``random.uniform(0, 1) < omega`` (Python's ``random``
    module, so ``random.seed`` reproduces the draws)."""
    return random.uniform(0, 1) < omega


def _functional_clamp(clamp) -> float:
    """The functional forms' ``clamp``: ``0`` (off) or positive; negative is a ``ValueError``."""
    if checks.number(clamp, "clamp", lo=-float("inf"), finite=False) < 0:
        raise ValueError(f"clamp: must be 0.0 or a positive value, got {clamp}")
    return clamp


def rnnt_loss(acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor, label_lens: torch.Tensor,
              blank: int = 0, reduction: str = "mean", fastemit_lambda: float = 0.0,
              clamp: float = 0.0) -> torch.Tensor:
    """NeMo's functional ``rnnt_loss``: as :class:`RNNTLossNumba`, but a
    negative ``clamp`` is a ``ValueError`` (``0`` disables clamping)."""
    clamp = _functional_clamp(clamp)
    return RNNTLossNumba(blank, reduction, fastemit_lambda, clamp)(acts, labels, act_lens, label_lens)


def multiblank_rnnt_loss(acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor,
                         label_lens: torch.Tensor, blank: int, big_blank_durations: Sequence[int] = (),
                         reduction: str = "mean", fastemit_lambda: float = 0.0, clamp: float = 0.0, *,
                         sigma: float = 0.0) -> torch.Tensor:
    """NeMo's functional ``multiblank_rnnt_loss`` (its argument order:
    ``reduction`` is the 7th): :class:`MultiblankRNNTLossNumba` applied to
    ``acts [B, T, U + 1, V]`` (standard blank ``blank``, big blank ``i`` at
    ``blank - 1 - i``); ``[1]`` for ``"mean"``/``"sum"``, ``[B]`` for
    ``"none"``.  A negative ``clamp`` is a ``ValueError``."""
    clamp = _functional_clamp(clamp)
    loss = MultiblankRNNTLossNumba(blank, big_blank_durations, reduction, fastemit_lambda, clamp, sigma)
    return loss(acts, labels, act_lens, label_lens)


def tdt_loss(acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor, label_lens: torch.Tensor,
             blank: int, durations: Sequence[int] = (), reduction: str = "mean", fastemit_lambda: float = 0.0,
             clamp: float = 0.0,
             *, sigma: float = 0.0, omega: float = 0.0) -> torch.Tensor:
    """NeMo's functional ``tdt_loss`` (``reduction`` is the 7th argument):
    :class:`TDTLossNumba` applied to ``acts [B, T, U + 1, V + D]`` (``V``
    token logits, then one per duration); ``[1]`` for ``"mean"``/``"sum"``,
    ``[B]`` for ``"none"``.  A negative ``clamp`` is a ``ValueError``;
    ``omega`` draws the RNN-T loss as :class:`TDTLossNumba` does."""
    clamp = _functional_clamp(clamp)
    loss = TDTLossNumba(blank, durations, reduction, fastemit_lambda, clamp, sigma, omega)
    return loss(acts, labels, act_lens, label_lens)


def certify_inputs(log_probs: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor,
                   label_lengths: torch.Tensor) -> None:
    """NeMo's ``certify_inputs``: ``labels [B, U]``, ``lengths [B]`` and
    ``label_lengths [B]`` int64 (else ``TypeError``); every tensor
    contiguous, ``log_probs`` 4-D ``[B, T, U + 1, V]``, one length per
    utterance, ``T == max(lengths)`` and ``U + 1 == max(label_lengths) +
    1`` for ``log_probs [B, T, U + 1, V]`` (else ``ValueError``).  Returns
    None."""
    named = (("log_probs", log_probs), ("labels", labels), ("lengths", lengths), ("label_lengths", label_lengths))
    for name, x in named:
        checks.tensor(x, name)
    for name, x in named[1:]:
        if x.dtype != torch.int64:
            raise TypeError(f"{name}: must be torch.int64, got {x.dtype}")
    for name, x in named:
        if not x.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    for (name, x), ndim in zip(named, (4, 2, 1, 1)):
        if x.dim() != ndim:
            raise ValueError(f"{name}: must be {ndim}-D, got shape {tuple(x.shape)}")
    B = log_probs.shape[0]
    for name, x in named[2:]:
        if x.shape[0] != B:
            raise ValueError(f"{name}: must have a length per example: {x.shape[0]} lengths, log_probs has B = {B}")
    if B == 0:
        raise ValueError("log_probs: expected at least one example, got B = 0")
    T, U = log_probs.shape[1:3]
    max_T, max_U = int(lengths.max()), int(label_lengths.max())
    if T != max_T:
        raise ValueError(f"lengths: input length mismatch, log_probs has T = {T}, max(lengths) = {max_T}")
    if U != max_U + 1:
        raise ValueError(f"label_lengths: output length mismatch, log_probs has U = {U}, max(label_lengths) + 1 = "
                         f"{max_U + 1}")


class RNNTLossNumba(torch.nn.Module):
    """NeMo's ``RNNTLossNumba(blank=0, reduction="mean", fastemit_lambda=0.0,
    clamp=-1)``.  ``forward(acts [B, T, U + 1, V], labels [B, >= U],
    act_lens [B], label_lens [B])`` returns the cost (see the module
    docstring for shapes and quirks)."""

    def __init__(self, blank: int = 0, reduction: str = "mean", fastemit_lambda: float = 0.0, clamp: float = -1):
        super().__init__()
        self.reduction, self.fastemit_lambda, self.clamp = _check(reduction, fastemit_lambda, clamp)
        self.blank = blank

    def forward(self, acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor,
                label_lens: torch.Tensor) -> torch.Tensor:
        """``acts [B, T, U + 1, V]``, ``labels [B, >= U]``, ``act_lens [B]``, ``label_lens [B]`` -> the cost
        (``[1]`` for ``"mean"`` / ``"sum"``, ``[B]`` for ``"none"``)."""
        costs = _rnnt_loss(acts, labels, act_lens, label_lens, blank=self.blank, clamp=self.clamp,
                           reduction="none", fastemit_lambda=self.fastemit_lambda)
        return _nemo_reduce(costs, self.reduction)


class MultiblankRNNTLossNumba(torch.nn.Module):
    """NeMo's ``MultiblankRNNTLossNumba(blank, big_blank_durations,
    reduction="mean", fastemit_lambda=0.0, clamp=-1, sigma=0.0)``;
    ``forward(acts, labels, act_lens, label_lens)``.  Runs on CPU too (NeMo's
    version needs CUDA)."""

    def __init__(self, blank: int, big_blank_durations: Sequence[int], reduction: str = "mean",
                 fastemit_lambda: float = 0.0, clamp: float = -1, sigma: float = 0.0):
        super().__init__()
        self.reduction, self.fastemit_lambda, self.clamp = _check(reduction, fastemit_lambda, clamp)
        self.blank = blank
        self.big_blank_durations = list(big_blank_durations)
        self.sigma = checks.number(sigma, "sigma")

    def forward(self, acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor,
                label_lens: torch.Tensor) -> torch.Tensor:
        """``acts [B, T, U + 1, V]`` (big blanks below ``blank``), ``labels [B, >= U]``, ``act_lens [B]``,
        ``label_lens [B]`` -> the cost (``[1]`` for ``"mean"`` / ``"sum"``, ``[B]`` for ``"none"``)."""
        if not isinstance(acts, torch.Tensor):
            raise TypeError(f"acts: expected a torch.Tensor, got {type(acts).__name__}")
        costs = _multiblank_rnnt_loss(acts, labels, act_lens, label_lens, blank=self.blank,
                                     big_blank_durations=self.big_blank_durations, sigma=self.sigma,
                                     fastemit_lambda=self.fastemit_lambda, clamp=self.clamp, reduction="none")
        return _nemo_reduce(costs, self.reduction)


class TDTLossNumba(torch.nn.Module):
    """NeMo's ``TDTLossNumba(blank, durations=None, reduction="mean",
    fastemit_lambda=0.0, clamp=-1, sigma=0.0, omega=0.0)``;
    ``forward(acts [B, T, U + 1, V + D], labels, act_lens, label_lens)``.
    ``blank`` indexes the ``V`` token logits (NeMo: ``V - 1``).  Runs on the
    CPU too (NeMo's version needs CUDA).  ``omega`` samples the RNN-T loss
    per call as NeMo does (:func:`sample_rnnt`, module docstring);
    :func:`chainfb.tdt_loss` takes its expectation instead."""

    def __init__(self, blank: int, durations: Sequence[int] | None = None, reduction: str = "mean",
                 fastemit_lambda: float = 0.0, clamp: float = -1, sigma: float = 0.0, omega: float = 0.0):
        super().__init__()
        self.reduction, self.fastemit_lambda, self.clamp = _check(reduction, fastemit_lambda, clamp)
        self.blank = blank
        self.durations = list(durations) if durations is not None else []
        self.sigma = checks.number(sigma, "sigma")
        self.omega = checks.number(omega, "omega", 0.0, 1.0)

    def forward(self, acts: torch.Tensor, labels: torch.Tensor, act_lens: torch.Tensor,
                label_lens: torch.Tensor) -> torch.Tensor:
        """``acts [B, T, U + 1, V + D]``, ``labels [B, >= U]``, ``act_lens [B]``, ``label_lens [B]`` -> the cost
        (``[1]`` for ``"mean"`` / ``"sum"``, ``[B]`` for ``"none"``)."""
        rnnt = sample_rnnt(self.omega)  # drawn on every call, like NeMo
        costs = _tdt_loss(acts, labels, act_lens, label_lens, blank=self.blank, durations=self.durations,
                         sigma=self.sigma, omega=1.0 if rnnt else 0.0, fastemit_lambda=self.fastemit_lambda,
                         clamp=self.clamp, reduction="none")
        return _nemo_reduce(costs, self.reduction)
