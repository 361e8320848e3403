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

``forced_align`` and ``merge_tokens`` are :func:`chainfb.forced_align` and
:func:`chainfb.merge_tokens` under torchaudio's names (any batch size, where
torchaudio takes one utterance).

Errors.  torchaudio checks its inputs in C++ and raises ``RuntimeError``;
code written for it catches that.  Every input error of this module is an
:class:`InputError` (a ``ValueError`` and a ``RuntimeError``) or, for a
wrong type or dtype, an :class:`InputTypeError` (a ``TypeError`` and a
``RuntimeError``), with chainfb's message naming the argument.
"""

from __future__ import annotations

import functools

import torch

from .. import checks
from ..alignment.ctc import TokenSpan, forced_align as _forced_align, merge_tokens as _merge_tokens
from ..transducer.loss import check_inputs, rnnt_loss as _rnnt_loss

__all__ = ["rnnt_loss", "RNNTLoss", "forced_align", "merge_tokens", "TokenSpan", "InputError", "InputTypeError"]


class InputError(ValueError, RuntimeError):
    """A bad argument value given to a torchaudio drop-in: chainfb's
    ``ValueError``, and the ``RuntimeError`` that torchaudio raises for it."""


class InputTypeError(TypeError, RuntimeError):
    """A bad argument type or dtype given to a torchaudio drop-in: chainfb's
    ``TypeError``, and the ``RuntimeError`` that torchaudio raises for it."""


def _torchaudio_errors(fn):
    """``fn`` with its ``ValueError``/``TypeError`` raised as
    :class:`InputError`/:class:`InputTypeError` (same message, same traceback)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, InputTypeError):
            raise
        except ValueError as e:
            raise InputError(*e.args).with_traceback(e.__traceback__) from None
        except TypeError as e:
            raise InputTypeError(*e.args).with_traceback(e.__traceback__) from None

    return wrapped


@_torchaudio_errors
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
    the reproduced quirks; bad input raises :class:`InputError` /
    :class:`InputTypeError`."""
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

    def forward(self, logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                target_lengths: torch.Tensor) -> torch.Tensor:
        """``logits [B, T, U + 1, V]``, ``targets [B, U]``, ``logit_lengths [B]``, ``target_lengths [B]`` -> the
        loss (``[B]`` for ``"none"``, else a scalar), as :func:`rnnt_loss`."""
        return rnnt_loss(
            logits, targets, logit_lengths, target_lengths, self.blank, self.clamp, self.reduction,
            self.fused_log_softmax
        )


@_torchaudio_errors
def forced_align(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor | None = None,
    target_lengths: torch.Tensor | None = None,
    blank: int = 0,
) -> tuple:
    """torchaudio's ``forced_align``: ``(alignments [B, T], scores [B, T])``
    for ``log_probs [B, T, C]``, ``targets [B, L]``, optional
    ``input_lengths [B]`` and ``target_lengths [B]`` (see
    :func:`chainfb.forced_align`; any ``B``, torchaudio takes ``B = 1``).
    Bad input, or an utterance with no CTC alignment, raises
    :class:`InputError` / :class:`InputTypeError`."""
    return _forced_align(log_probs, targets, input_lengths, target_lengths, blank)


@_torchaudio_errors
def merge_tokens(tokens: torch.Tensor, scores: torch.Tensor, blank: int = 0) -> list:
    """torchaudio's ``merge_tokens``: the :class:`TokenSpan` list of one
    alignment ``tokens [T]`` with its ``scores [T]`` (see
    :func:`chainfb.merge_tokens`)."""
    return _merge_tokens(tokens, scores, blank)
