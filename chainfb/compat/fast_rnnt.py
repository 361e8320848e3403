"""k2 / fast_rnnt's RNN-T functions (``import fast_rnnt`` -> ``from
chainfb.compat import fast_rnnt``), computed by chainfb's engine.

Same names, argument order (``lm`` before ``am``; ``do_rnnt_pruning(am, lm,
ranges)``), keyword arguments, shapes, dtypes and return values as k2's
``rnnt_loss.py`` / ``mutual_information.py`` (the version with ``rnnt_type``
and ``delay_penalty``), including ``(loss, (px_grad, py_grad))`` for
``return_grad=True``.  Everything runs through
:mod:`chainfb.transducer.pruned` and the grid lattice
(:mod:`chainfb.transducer.grid`): ``px``/``py`` from torch operations, then
the one engine.

Reproduced quirks: ``reduction="mean"`` is the batch mean; a negative
``delay_penalty`` is ignored (only ``> 0`` applies); in
``get_rnnt_prune_ranges`` an ``s_range`` above ``S`` becomes ``S + 1``; the
smoothed loss counts a scale of exactly 0 as 1e-20.  ``modified=True`` (the
older fast_rnnt keyword) is accepted as ``rnnt_type="modified"``.

Deliberate differences:

- bad arguments raise ``ValueError``/``TypeError`` naming the argument where
  k2 asserts (and k2 silently wraps a band that runs past ``S``; here
  ``ranges`` outside ``[0, S]`` is an error);
- ``mutual_information_recursion``'s ``(px_grad, py_grad)`` are fresh
  tensors, not the buffers later scaled in place by backward;
- float16 and bfloat16 inputs are computed in float32 (results in the input dtype);
- ``rnnt_loss`` with ``rnnt_type="regular"``, no delay penalty and a
  boundary starting at ``(0, 0)`` takes :func:`chainfb.rnnt_loss`'s fused
  route (same numbers, a fused gradient, no second 4-D tensor).
"""

from __future__ import annotations

import torch

from ..criterion import apply
from ..transducer import pruned as P
from ..transducer.grid import check_boundary, grid_loglike
from ..transducer.loss import reduce_costs
from ..transducer.criterion import TransducerCriterion

__all__ = [
    "mutual_information_recursion",
    "get_rnnt_logprobs",
    "get_rnnt_logprobs_joint",
    "get_rnnt_logprobs_smoothed",
    "get_rnnt_logprobs_pruned",
    "rnnt_loss_simple",
    "rnnt_loss",
    "rnnt_loss_smoothed",
    "rnnt_loss_pruned",
    "get_rnnt_prune_ranges",
    "do_rnnt_pruning",
]


def _type(rnnt_type, modified):
    if modified is not None:
        return "modified" if modified else "regular"
    return rnnt_type


def _loss(px, py, boundary, delay_penalty, reduction, return_grad, dtype):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
    px = P.add_delay_penalty(px, boundary, delay_penalty, py.shape[2])
    out = grid_loglike(px, py, boundary, return_grad=return_grad)
    total, grads = out if return_grad else (out, None)
    loss = reduce_costs(-total, reduction).to(dtype)
    return (loss, grads) if return_grad else loss


def mutual_information_recursion(px, py, boundary=None, return_grad=False):
    """k2's ``mutual_information_recursion``: total log-probability ``[B]``
    of the ``(s, t)`` grid (``px [B, S, T + 1]`` or ``[B, S, T]``, ``py [B, S
    + 1, T]``, ``boundary [B, 4]``), or ``(total, (px_grad, py_grad))``."""
    return grid_loglike(px, py, boundary, return_grad)


def get_rnnt_logprobs(lm, am, symbols, termination_symbol, boundary=None, rnnt_type="regular", *, modified=None):
    """``(px, py)`` for the additive joiner (``lm [B, S + 1, C]``, ``am [B, T, C]``)."""
    return P.rnnt_logprobs(am, lm, symbols, termination_symbol, boundary, _type(rnnt_type, modified))


def get_rnnt_logprobs_joint(logits, symbols, termination_symbol, boundary=None, rnnt_type="regular", *,
                            modified=None):
    """``(px, py)`` from joiner logits ``[B, T, S + 1, C]``."""
    return P.rnnt_logprobs_joint(logits, symbols, termination_symbol, boundary, _type(rnnt_type, modified))


def get_rnnt_logprobs_smoothed(lm, am, symbols, termination_symbol, lm_only_scale=0.1, am_only_scale=0.1,
                               boundary=None, rnnt_type="regular", *, modified=None):
    """``(px, py)`` of k2's smoothed loss."""
    l_s, a_s = float(lm_only_scale), float(am_only_scale)
    return P.rnnt_logprobs(am, lm, symbols, termination_symbol, boundary, _type(rnnt_type, modified),
                           lm_only_scale=l_s or 1e-20, am_only_scale=a_s or 1e-20)


def get_rnnt_logprobs_pruned(logits, symbols, ranges, termination_symbol, boundary, rnnt_type="regular", *,
                             modified=None):
    """``(px, py)`` from joiner logits on the band ``ranges`` (``-inf`` outside)."""
    return P.rnnt_logprobs_pruned(logits, symbols, ranges, termination_symbol, boundary,
                                  _type(rnnt_type, modified))


def rnnt_loss_simple(lm, am, symbols, termination_symbol, boundary=None, rnnt_type="regular", delay_penalty=0.0,
                     reduction="mean", return_grad=False, *, modified=None):
    """k2's ``rnnt_loss_simple``: ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type = _type(rnnt_type, modified)
    px, py = get_rnnt_logprobs(lm, am, symbols, termination_symbol, boundary, rnnt_type)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, return_grad, am.dtype)


def rnnt_loss_smoothed(lm, am, symbols, termination_symbol, lm_only_scale=0.1, am_only_scale=0.1, boundary=None,
                       rnnt_type="regular", delay_penalty=0.0, reduction="mean", return_grad=False, *,
                       modified=None):
    """k2's ``rnnt_loss_smoothed``: ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type = _type(rnnt_type, modified)
    px, py = get_rnnt_logprobs_smoothed(lm, am, symbols, termination_symbol, lm_only_scale, am_only_scale,
                                        boundary, rnnt_type)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, return_grad, am.dtype)


def rnnt_loss(logits, symbols, termination_symbol, boundary=None, rnnt_type="regular", delay_penalty=0.0,
              reduction="mean", *, modified=None):
    """k2's ``rnnt_loss`` on full joiner logits ``[B, T, S + 1, C]``."""
    rnnt_type = _type(rnnt_type, modified)
    delay_penalty = P._penalty(delay_penalty)
    if rnnt_type == "regular" and delay_penalty <= 0.0 and isinstance(logits, torch.Tensor) and logits.dim() == 4:
        B, T, S1, C = logits.shape
        bd = check_boundary(boundary, B, S1 - 1, T)
        if not bd[:, :2].any() and (bd[:, 3] > 0).all():
            if reduction not in ("none", "mean", "sum"):
                raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
            P._symbols(symbols, B, S1 - 1, C)
            P._blank(termination_symbol, C)
            crit = TransducerCriterion(logits.shape, symbols, bd[:, 3].copy(), bd[:, 2].copy(),
                                       int(termination_symbol))
            return reduce_costs(apply(logits, crit), reduction)
    px, py = get_rnnt_logprobs_joint(logits, symbols, termination_symbol, boundary, rnnt_type)
    return _loss(px, py, boundary, delay_penalty, reduction, False, logits.dtype)


def rnnt_loss_pruned(logits, symbols, ranges, termination_symbol, boundary=None, rnnt_type="regular",
                     delay_penalty=0.0, reduction="mean", *, modified=None):
    """k2's ``rnnt_loss_pruned`` on band logits ``[B, T, s_range, C]``."""
    rnnt_type = _type(rnnt_type, modified)
    px, py = get_rnnt_logprobs_pruned(logits, symbols, ranges, termination_symbol, boundary, rnnt_type)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, False, logits.dtype)


def get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range):
    """k2's ``get_rnnt_prune_ranges``: int64 ``[B, T, s_range]``."""
    return P.prune_ranges(px_grad, py_grad, boundary, s_range)


def do_rnnt_pruning(am, lm, ranges):
    """k2's ``do_rnnt_pruning``: ``(am_pruned, lm_pruned)``, ``[B, T, s_range, C]`` each."""
    return P.prune(am, lm, ranges)
