"""SpeechBrain-compatible transducer loss
(``speechbrain.nnet.loss.transducer_loss.TransducerLoss``), on CPU or
wherever chainfb runs.

SpeechBrain's behaviour, reproduced:

- ``forward(logits [B, T, U + 1, V], labels [B, >= U], T [B], U [B])``
  applies log-softmax itself; the per-utterance loss is ``-log P / T_b``
  (normalised by the utterance's frame count); ``"mean"`` is the batch mean
  of that, ``"sum"`` the sum, ``"none"`` the ``[B]`` vector.
- Its gradient is NOT the gradient of what it returns: backward multiplies
  the saved ``d(-log P)/d logits`` of each utterance by the incoming
  gradient, so with ``"mean"`` or ``"sum"`` the gradient is neither divided
  by ``T_b`` nor by the batch size.  ``true_gradient=True`` gives the exact
  gradient of the returned value instead.
"""

from __future__ import annotations

import torch

from .. import checks
from ..transducer.loss import reduce_costs, rnnt_loss

__all__ = ["TransducerLoss"]


def _per_frame(values, frames):
    """``values [B] / T_b``, the frame counts (host integers or a tensor) taken
    in ``values``' dtype on ``values``' device (CUDA costs are divided on the GPU)."""
    return values / torch.as_tensor(frames).to(device=values.device, dtype=values.dtype)


class _ShowValue(torch.autograd.Function):
    """Returns ``shown``; backward hands the incoming gradient to ``through``
    unchanged (broadcast to its shape) -- SpeechBrain's value/gradient pair."""

    @staticmethod
    def forward(ctx, through, shown):
        ctx.shape = through.shape
        return shown.detach().clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.shape), None


class TransducerLoss(torch.nn.Module):
    """SpeechBrain's ``TransducerLoss(blank=0, reduction="mean")`` (plus
    ``true_gradient=False``; see the module docstring)."""

    def __init__(self, blank: int = 0, reduction: str = "mean", true_gradient: bool = False):
        super().__init__()
        self.blank = checks.integer(blank, "blank")
        self.reduction = checks.reduction(reduction)
        self.true_gradient = checks.flag(true_gradient, "true_gradient")

    def forward(self, logits, labels, T, U):
        costs = rnnt_loss(logits, labels, T, U, blank=self.blank, reduction="none")
        per_frame = reduce_costs(_per_frame(costs, T.detach()), self.reduction)
        if self.true_gradient:
            return per_frame
        return _ShowValue.apply(costs, per_frame)
