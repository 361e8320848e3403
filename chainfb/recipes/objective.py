"""The LF-MMI objective used by the recipe: :class:`chainfb.ChainLoss` (leaky-HMM denominator, l2 and
out-of-range regularizers) when the library has it, else num - den through :func:`chainfb.fst_loglike` (same engine,
no leaky HMM, no regularizers) so the recipe still runs on a library without the chain subpackage."""
from __future__ import annotations

import warnings
from typing import Sequence

import torch

from ..autograd import fst_loglike
from ..fst import Fst

__all__ = ["LfMmi", "have_chain_loss"]


def have_chain_loss() -> bool:
    """Whether ``chainfb.ChainLoss`` exists in this installation."""
    import chainfb

    return hasattr(chainfb, "ChainLoss")


class LfMmi:
    """``LfMmi(den_fst, leaky_hmm_coefficient, l2_regularize, out_of_range_regularize)``.

    ``__call__(scores [N, T, P], num_fsts (N Fst), lengths [N]) -> (loss, objective_sum)``: ``loss`` is the
    tensor to minimise (= -objective summed over sequences), ``objective_sum`` a float (num - den log-likelihood
    summed over sequences, without regularizers). ``self.backend`` says which implementation is used."""

    def __init__(self, den_fst: Fst, leaky_hmm_coefficient: float = 0.1, l2_regularize: float = 0.0,
                 out_of_range_regularize: float = 0.01, force_fallback: bool = False):
        self.den_fst = den_fst
        self.backend = "fallback"
        if have_chain_loss() and not force_fallback:
            import chainfb

            self.loss = chainfb.ChainLoss(den_fst, leaky_hmm_coefficient=leaky_hmm_coefficient,
                                          l2_regularize=l2_regularize,
                                          out_of_range_regularize=out_of_range_regularize)
            self.backend = "chainfb.ChainLoss"

    def __call__(self, scores: torch.Tensor, num_fsts: Sequence[Fst], lengths: torch.Tensor):
        if self.backend == "chainfb.ChainLoss":
            loss = self.loss(scores, list(num_fsts), lengths)
            info = getattr(self.loss, "info", {}) or {}
            num, den = info.get("num"), info.get("den")
            if num is not None and den is not None:
                obj = float(torch.as_tensor(num).sum()) - float(torch.as_tensor(den).sum())
            else:
                obj = -float(loss)
            return loss, obj
        num = fst_loglike(scores, list(num_fsts), lengths)
        den = fst_loglike(scores, self.den_fst, lengths)
        diff = num - den
        ok = torch.isfinite(diff)
        if not bool(ok.all()):
            warnings.warn(f"LF-MMI objective not finite for {int((~ok).sum())} sequence(s); they get zero gradient")
            diff = torch.where(ok, diff, torch.zeros_like(diff))
        return -diff.sum(), float(diff.detach().sum())
