"""NeMo's RNN-T loss wrapper (``nemo.collections.asr.losses.rnnt``):
:class:`RNNTLoss` and :func:`resolve_rnnt_loss`, over the numba-loss
drop-ins of :mod:`chainfb.compat.espnet` (chainfb's engine, CPU or GPU).

``RNNTLoss(num_classes, reduction="mean_batch", loss_name="default",
loss_kwargs=None)``: the blank is ``num_classes`` (the last token logit:
``V`` for RNN-T and TDT, ``V + number of big blanks`` for multi-blank);
``forward(log_probs, targets, input_lengths, target_lengths)`` takes joiner
*logits* ``[B, T, U + 1, V + 1]`` (``+ D`` duration logits for TDT), casts
targets and lengths to int64, trims ``log_probs`` to ``max(input_lengths)``
frames and ``targets`` to ``max(target_lengths)`` columns, computes the
per-utterance losses and reduces them:

- ``"mean_batch"``: their batch mean;
- ``"mean"``: the batch mean of ``loss_b / U_b`` (``U_b`` clamped to
  ``>= 1``: an utterance without labels is divided by 1, where NeMo
  divides by 0);
- ``"sum"``; ``"mean_volume"``: the sum over ``sum_b U_b`` (1 when that is
  0); ``None``: the ``[B]`` vector.

``loss_name`` -> the loss module (each built with ``reduction="none"``,
its keyword arguments taken from ``loss_kwargs`` as NeMo takes them;
unused keys are named in a ``UserWarning``):

- ``"default"``, ``"warprnnt_numba"``: :class:`~chainfb.compat.espnet.
  RNNTLossNumba` (``fastemit_lambda``, ``clamp``);
- ``"warprnnt"``, ``"pytorch"``: the plain RNN-T loss (no keywords);
- ``"multiblank_rnnt"``: :class:`~chainfb.compat.espnet.
  MultiblankRNNTLossNumba` (``big_blank_durations``, ``sigma``,
  ``fastemit_lambda``, ``clamp``); ``"multiblank_rnnt_pytorch"``: the same
  with ``big_blank_durations`` and ``sigma`` only;
- ``"tdt"``: :class:`~chainfb.compat.espnet.TDTLossNumba` (``durations``,
  ``sigma``, ``omega``, ``fastemit_lambda``, ``clamp``); ``"tdt_pytorch"``:
  ``durations`` and ``sigma`` only.

NeMo's k2 and Triton losses (``"graph_rnnt"``, ``"graph_w_transducer"``,
``"flash_rnnt"``) have no counterpart here: a ``ValueError`` names them.
Like NeMo, every loss but ``"default"``/``"warprnnt_numba"`` computes in
float32 (``log_probs`` of any other dtype is cast, float64 included);
those two keep float32/float64 and compute half types in float32.
"""

from __future__ import annotations

import warnings

import torch

from .. import checks
from . import espnet

__all__ = ["RNNTLoss", "resolve_rnnt_loss", "resolve_rnnt_default_loss_name", "RNNT_LOSSES"]

#: the loss names :func:`resolve_rnnt_loss` takes, each with the ``loss_kwargs`` keys it reads
RNNT_LOSSES = {
    "default": ("fastemit_lambda", "clamp"),
    "warprnnt_numba": ("fastemit_lambda", "clamp"),
    "warprnnt": (),
    "pytorch": (),
    "multiblank_rnnt": ("big_blank_durations", "sigma", "fastemit_lambda", "clamp"),
    "multiblank_rnnt_pytorch": ("big_blank_durations", "sigma"),
    "tdt": ("durations", "sigma", "omega", "fastemit_lambda", "clamp"),
    "tdt_pytorch": ("durations", "sigma"),
}
_NOT_HERE = ("graph_rnnt", "graph_w_transducer", "flash_rnnt")
#: the losses that keep float64 (NeMo casts everything else to float32)
_KEEP_DTYPE = ("default", "warprnnt_numba")
#: ``RNNTLoss``'s reductions (``None``: the per-utterance vector)
REDUCTIONS = (None, "mean", "sum", "mean_batch", "mean_volume")


def resolve_rnnt_default_loss_name() -> str:
    """The loss ``"default"`` stands for: ``"warprnnt_numba"``."""
    return "warprnnt_numba"


def resolve_rnnt_loss(loss_name: str, blank_idx: int, loss_kwargs: dict | None = None) -> torch.nn.Module:
    """NeMo's ``resolve_rnnt_loss``: the per-utterance loss module
    (``reduction="none"``) that ``loss_name`` names (module docstring), with
    blank ``blank_idx`` and its keywords from ``loss_kwargs`` (a mapping;
    keys the loss does not read are named in a ``UserWarning``; the mapping
    itself is left as it was)."""
    if loss_name in _NOT_HERE:
        raise ValueError(f"loss_name: NeMo's {loss_name!r} (k2 / Triton) has no chainfb counterpart; "
                         f"chainfb resolves {', '.join(RNNT_LOSSES)}")
    checks.choice(loss_name, "loss_name", tuple(RNNT_LOSSES))
    blank_idx = checks.integer(blank_idx, "blank_idx", lo=0)
    if loss_kwargs is None:
        kwargs = {}
    elif hasattr(loss_kwargs, "items"):
        kwargs = dict(loss_kwargs.items())
    else:
        raise TypeError(f"loss_kwargs: expected a mapping or None, got {type(loss_kwargs).__name__}")
    reads = RNNT_LOSSES[loss_name]
    unused = sorted(set(kwargs) - set(reads))
    if unused:
        warnings.warn(f"loss_kwargs: {loss_name!r} does not use {', '.join(map(repr, unused))}; ignored",
                      UserWarning, stacklevel=2)
    kw = {k: kwargs[k] for k in reads if k in kwargs}
    if loss_name in ("default", "warprnnt_numba", "warprnnt", "pytorch"):
        return espnet.RNNTLossNumba(blank_idx, "none", kw.get("fastemit_lambda", 0.0), kw.get("clamp", -1.0))
    if loss_name.startswith("multiblank_rnnt"):
        return espnet.MultiblankRNNTLossNumba(blank_idx, kw.get("big_blank_durations", ()), "none",
                                              kw.get("fastemit_lambda", 0.0), kw.get("clamp", -1.0),
                                              kw.get("sigma", 0.0))
    return espnet.TDTLossNumba(blank_idx, kw.get("durations"), "none", kw.get("fastemit_lambda", 0.0),
                               kw.get("clamp", -1.0), kw.get("sigma", 0.0), kw.get("omega", 0.0))


class RNNTLoss(torch.nn.Module):
    """NeMo's ``RNNTLoss(num_classes, reduction="mean_batch",
    loss_name="default", loss_kwargs=None)`` (module docstring).

    ``forward(log_probs [B, T, U + 1, num_classes + 1 (+ D)], targets [B,
    >= U], input_lengths [B], target_lengths [B])`` returns the reduced loss
    (a scalar), or ``[B]`` with ``reduction=None``."""

    def __init__(self, num_classes: int, reduction: str | None = "mean_batch", loss_name: str = "default",
                 loss_kwargs: dict | None = None):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction: expected None, 'mean', 'sum', 'mean_batch' or 'mean_volume', "
                             f"got {reduction!r}")
        self._blank = checks.integer(num_classes, "num_classes", lo=0)
        self.reduction = reduction
        self._loss = resolve_rnnt_loss(loss_name, self._blank, loss_kwargs)
        self._force_float32 = loss_name not in _KEEP_DTYPE

    def reduce(self, losses: torch.Tensor | list[torch.Tensor],
               target_lengths: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """NeMo's ``RNNTLoss.reduce``: ``losses [B]`` (or a list of them,
        concatenated, with the list of their ``target_lengths``) reduced by
        ``self.reduction``."""
        if isinstance(losses, (list, tuple)):
            losses, target_lengths = torch.cat(list(losses), 0), torch.cat(list(target_lengths), 0)
        if self.reduction == "mean":
            U_b = target_lengths.to(device=losses.device, dtype=losses.dtype).clamp(min=1)
            return (losses / U_b).mean()
        return checks.reduce(losses, self.reduction or "none", target_lengths)

    def forward(self, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor) -> torch.Tensor:
        """The loss of joiner logits ``log_probs`` (class docstring)."""
        checks.tensor(log_probs, "log_probs", checks.FLOATS, 4, "[B, T, U + 1, V]")
        targets = checks.tensor(targets, "targets", checks.INTS, 2).long()
        input_lengths = checks.tensor(input_lengths, "input_lengths", checks.INTS, 1).long()
        target_lengths = checks.tensor(target_lengths, "target_lengths", checks.INTS, 1).long()
        if not input_lengths.numel() or not target_lengths.numel():
            raise ValueError("input_lengths, target_lengths: expected one length per utterance, got none")
        max_T, max_U = int(input_lengths.max()), int(target_lengths.max())
        if self._force_float32 and log_probs.dtype != torch.float32:
            log_probs = log_probs.float()
        if log_probs.shape[1] < max_T:
            raise ValueError(f"input_lengths: max length {max_T} exceeds log_probs' T = {log_probs.shape[1]}")
        if targets.shape[1] < max_U:
            raise ValueError(f"target_lengths: max length {max_U} exceeds targets' width {targets.shape[1]}")
        log_probs = log_probs.narrow(1, 0, max_T)
        targets = targets.narrow(1, 0, max_U)
        losses = self._loss(log_probs, targets, input_lengths, target_lengths)
        return losses if self.reduction is None else self.reduce(losses, target_lengths)
