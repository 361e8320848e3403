"""torchaudio-compatible RNN-T loss (``torchaudio.functional.rnnt_loss`` and
``torchaudio.transforms.RNNTLoss``) computed by chainfb's engine.

Quirks reproduced from torchaudio's code:

- ``logits`` must have ``T == max(logit_lengths)`` and ``U == max(target_lengths) + 1``;
  ``targets`` must be ``[B, U - 1]``; targets and lengths must be int32.
- ``clamp > 0`` clamps each gradient element to ``[-clamp, clamp]`` per
  sample, before the incoming gradient (e.g. the batch mean's ``1/B``) is
  applied.  (The CUDA kernel source reads as if only the lower bound were
  applied; torchaudio 2.9's CPU build clamps both sides, which is what the
  peer comparison in the tests measures and what is reproduced here.)
- A sample whose cost is inf/NaN gets an all-zero gradient.

Extension: float64 logits are accepted too (torchaudio takes float32/float16;
float16 and bfloat16 are computed in float32 here).
"""

from __future__ import annotations

import torch

from .. import checks
from ..transducer.loss import check_inputs, rnnt_loss as _rnnt_loss

__all__ = ["rnnt_loss", "RNNTLoss"]


def rnnt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = -1,
    clamp: float = -1,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
) -> torch.Tensor:
    """torchaudio's ``rnnt_loss``: logits ``[B, T, U + 1, V]``, targets
    ``[B, U]`` int32, logit_lengths ``[B]`` int32, target_lengths ``[B]``
    int32; ``blank < 0`` means ``V + blank``; reduction ``"mean"`` (batch
    mean), ``"sum"`` or ``"none"`` (``[B]``).  See the module docstring for
    the reproduced quirks."""
    reduction = checks.reduction(reduction)
    fused_log_softmax = checks.flag(fused_log_softmax, "fused_log_softmax")
    for name, x in (("targets", targets), ("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        if isinstance(x, torch.Tensor) and x.dtype != torch.int32:
            raise TypeError(f"{name}: torchaudio requires dtype int32, got {x.dtype}")
    check_inputs(logits, targets, logit_lengths, target_lengths, blank, exact_shapes=True)
    if targets.shape[1] != logits.shape[2] - 1:
        raise ValueError(
            f"targets: expected shape [B, {logits.shape[2] - 1}] (logits.shape[2] - 1), got {tuple(targets.shape)}"
        )
    return _rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=blank, clamp=clamp,
                      reduction=reduction, fused_log_softmax=fused_log_softmax)


class RNNTLoss(torch.nn.Module):
    """torchaudio's ``RNNTLoss(blank=-1, clamp=-1.0, reduction="mean",
    fused_log_softmax=True)``; ``forward(logits, targets, logit_lengths,
    target_lengths)`` calls :func:`rnnt_loss`."""

    def __init__(self, blank: int = -1, clamp: float = -1.0, reduction: str = "mean", fused_log_softmax: bool = True):
        super().__init__()
        self.blank = blank
        self.clamp = clamp
        self.reduction = reduction
        self.fused_log_softmax = fused_log_softmax

    def forward(self, logits, targets, logit_lengths, target_lengths):
        return rnnt_loss(
            logits, targets, logit_lengths, target_lengths, self.blank, self.clamp, self.reduction, self.fused_log_softmax
        )
