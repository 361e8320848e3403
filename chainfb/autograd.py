"""Differentiable torch entry points over the engine."""

from __future__ import annotations

import torch

from .numerator import forward_backward

__all__ = ["fst_loglike", "NumeratorLoss"]


class _FstLoglike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, fsts, lengths):
        loglike, post = forward_backward(fsts, scores, lengths, need_posteriors=ctx.needs_input_grad[0])
        ctx.save_for_backward(post if post is not None else scores.new_zeros(0))
        return loglike

    @staticmethod
    def backward(ctx, grad):
        (post,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        # impossible sequences have all-zero posteriors; keep their gradient 0 even for a non-finite incoming grad
        g = torch.where(torch.isfinite(grad), grad, torch.zeros_like(grad))
        return post * g.to(post.dtype)[:, None, None], None, None


def fst_loglike(scores: torch.Tensor, fsts, lengths=None) -> torch.Tensor:
    """Differentiable log-likelihood of each sequence under its graph.

    Parameters
    ----------
    scores : ``[N, T, P]`` float32/float64 tensor of pdf log-likelihoods.
    fsts : Fst (shared), list of N Fst, or FstBatch.
    lengths : ``[N]`` frame counts, optional.

    Returns
    -------
    ``[N]`` tensor; its gradient w.r.t. ``scores`` is the pdf posteriors
    times the incoming gradient (zero for sequences with no path).
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores: expected a torch.Tensor, got {type(scores).__name__}")
    return _FstLoglike.apply(scores, fsts, lengths)


class NumeratorLoss(torch.nn.Module):
    """Negative log-likelihood of numerator graphs, as a loss object.

    ``forward(scores [N, T, P], fsts, lengths=None)`` returns
    ``-fst_loglike`` reduced by ``reduction``: ``"sum"``, ``"mean"`` (over
    sequences), ``"frame"`` (sum divided by the total number of frames) or
    ``"none"`` (``[N]``).
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in ("none", "sum", "mean", "frame"):
            raise ValueError(f"reduction: expected 'none', 'sum', 'mean' or 'frame', got {reduction!r}")
        self.reduction = reduction

    def forward(self, scores, fsts, lengths=None):
        nll = -fst_loglike(scores, fsts, lengths)
        if self.reduction == "none":
            return nll
        if self.reduction == "sum":
            return nll.sum()
        if self.reduction == "mean":
            return nll.mean()
        frames = scores.shape[0] * scores.shape[1] if lengths is None else torch.as_tensor(lengths).sum()
        return nll.sum() / frames
