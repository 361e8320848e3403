"""SpeechBrain-compatible transducer losses, on CPU or wherever chainfb
runs: today's functional ``speechbrain.nnet.losses.transducer_loss`` and
the older module ``speechbrain.nnet.loss.transducer_loss.TransducerLoss``
(which SpeechBrain's numba route of ``transducer_loss`` still uses).

:func:`transducer_loss` takes *relative* lengths, as SpeechBrain's data
loaders give them: ``input_lens [B]`` and ``target_lens [B]`` in ``[0,
1]``, made absolute as SpeechBrain does, ``(rel * logits.shape[1]).round()
.int()`` and ``(rel * targets.shape[1]).round().int()`` (``torch.round``:
halves go to the even integer, in the relative lengths' dtype).  Then:

- ``use_torchaudio=True`` (SpeechBrain's default) is torchaudio's
  ``rnnt_loss`` (:func:`chainfb.compat.torchaudio.rnnt_loss`, with its
  checks and errors): the cost ``-log P`` per utterance, ``"mean"`` the
  batch mean, ``"sum"``, ``"none"``, and the exact gradient;
- ``use_torchaudio=False`` is SpeechBrain's own numba loss
  (:class:`TransducerLoss`, quirks below).

``TransducerLoss``'s behaviour, reproduced:

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
from .torchaudio import rnnt_loss as _torchaudio_rnnt_loss

__all__ = ["TransducerLoss", "transducer_loss"]


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

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, T: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        """``logits [B, T, U + 1, V]``, ``labels [B, U]``, ``T [B]`` and ``U [B]`` lengths -> the loss reduced by
        ``reduction`` (module docstring)."""
        costs = rnnt_loss(logits, labels, T, U, blank=self.blank, reduction="none")
        per_frame = reduce_costs(_per_frame(costs, T.detach()), self.reduction)
        if self.true_gradient:
            return per_frame
        return _ShowValue.apply(costs, per_frame)


def _absolute(rel, size: int, name: str) -> torch.Tensor:
    """SpeechBrain's relative lengths ``rel [B]`` as int32 absolute lengths:
    ``(rel * size).round().int()``, checked to lie in ``[0, size]``."""
    checks.tensor(rel, name, ndim=1, layout="[B]")
    if rel.dtype.is_complex or rel.dtype == torch.bool:
        raise TypeError(f"{name}: expected relative lengths (a float tensor), got {rel.dtype}")
    n = (rel.detach() * size).round().int()
    if n.numel() and (int(n.min()) < 0 or int(n.max()) > size):
        raise ValueError(f"{name}: relative lengths must lie in [0, 1] (of {size}), got "
                         f"{rel.detach().min().item()} .. {rel.detach().max().item()}")
    return n


def transducer_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    input_lens: torch.Tensor,
    target_lens: torch.Tensor,
    blank_index: int,
    reduction: str = "mean",
    use_torchaudio: bool = True,
) -> torch.Tensor:
    """SpeechBrain's ``speechbrain.nnet.losses.transducer_loss``.

    Parameters
    ----------
    logits : ``[B, T, U + 1, V]`` joiner output (log-softmax applied inside).
    targets : ``[B, U]`` int labels, without blanks.
    input_lens : ``[B]`` relative frame counts in ``[0, 1]`` (of ``T``).
    target_lens : ``[B]`` relative label counts in ``[0, 1]`` (of ``U``).
    blank_index : the blank's index.
    reduction : ``"mean"``, ``"sum"`` or ``"none"``.
    use_torchaudio : torchaudio's loss (``True``) or SpeechBrain's numba
        loss (``False``: ``-log P / T_b`` per utterance, with its unscaled
        gradient; see the module docstring).

    Returns
    -------
    Scalar cost, or ``[B]`` with ``reduction="none"``.
    """
    checks.tensor(logits, "logits", checks.FLOATS, 4, "[B, T, U + 1, V]")
    checks.tensor(targets, "targets", checks.INTS, 2, "[B, U]")
    use_torchaudio = checks.flag(use_torchaudio, "use_torchaudio")
    T_b = _absolute(input_lens, logits.shape[1], "input_lens")
    U_b = _absolute(target_lens, targets.shape[1], "target_lens")
    if use_torchaudio:
        return _torchaudio_rnnt_loss(logits, targets.int(), T_b, U_b, blank=blank_index, reduction=reduction)
    return TransducerLoss(blank_index, reduction)(logits, targets, T_b, U_b)
