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

from ..transducer.loss import _TransducerCost, check_inputs, transducer_costs

__all__ = ["TransducerLoss"]


def _per_frame(values, Tb):
    """``values [B] / T_b``, with ``T_b`` (host integers) converted to a tensor of ``values``' dtype on
    ``values``' device, so that CUDA costs are divided on the GPU."""
    return values / torch.as_tensor(Tb).to(device=values.device, dtype=values.dtype)


class _SpeechBrainTransducer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, Tb, Ub, blank, reduction):
        loglike, grad = transducer_costs(logits, labels, Tb, Ub, blank, need_gradient=ctx.needs_input_grad[0])
        ctx.save_for_backward(grad if grad is not None else logits.new_zeros(0))
        loss = _per_frame(-loglike, Tb).to(logits.dtype)
        if reduction == "mean":
            return loss.mean()
        if reduction == "sum":
            return loss.sum()
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return grad * grad_out.to(grad.dtype).view(-1, 1, 1, 1), None, None, None, None, None


class TransducerLoss(torch.nn.Module):
    """SpeechBrain's ``TransducerLoss(blank=0, reduction="mean")`` (plus
    ``true_gradient=False``; see the module docstring)."""

    def __init__(self, blank: int = 0, reduction: str = "mean", true_gradient: bool = False):
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
        self.blank = blank
        self.reduction = reduction
        self.true_gradient = bool(true_gradient)

    def forward(self, logits, labels, T, U):
        b, Tb, Ub = check_inputs(logits, labels, T, U, self.blank)
        if not self.true_gradient:
            return _SpeechBrainTransducer.apply(logits, labels, Tb, Ub, b, self.reduction)
        costs = _TransducerCost.apply(logits, labels, Tb, Ub, b, (), 0.0, True, 0.0, -1.0)
        loss = _per_frame(costs, Tb)
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss
