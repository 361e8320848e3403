"""k2 / fast_rnnt's RNN-T functions (``import fast_rnnt`` -> ``from
chainfb.compat import fast_rnnt``), computed by chainfb's engine.

Same names, argument order (``lm`` before ``am``; ``do_rnnt_pruning(am, lm,
ranges)``; ``get_rnnt_logprobs`` and ``get_rnnt_logprobs_joint`` take
``rnnt_type`` before ``boundary``, ``get_rnnt_logprobs_smoothed`` and
``get_rnnt_logprobs_pruned`` ``boundary`` before ``rnnt_type``), keyword
arguments, shapes, dtypes and return values as k2's ``rnnt_loss.py`` /
``mutual_information.py`` (the version with ``rnnt_type``,
``delay_penalty`` and ``return_grad`` on every loss).  ``return_grad=True``
returns ``(loss, (px_grad, py_grad))``: the occupation probability of every
arc of the ``(s, t)`` grid, i.e. the gradient of the summed per-sequence
log-likelihoods with respect to the ``px``/``py`` that the loss built
(delay penalty included), whatever the reduction.  Everything runs through
:mod:`chainfb.transducer.pruned` and the grid lattice
(:mod:`chainfb.transducer.grid`): ``px``/``py`` from torch operations, then
the one engine.

Reproduced quirks: ``reduction="mean"`` is the batch mean; a negative
``delay_penalty`` is ignored (only ``> 0`` applies); the smoothed loss
counts a scale of exactly 0 as 1e-20.  ``get_rnnt_prune_ranges``: for the
regular topology an ``s_range`` too narrow for some sequence to reach its
last symbol is widened to ``max_b (S_b - 1) // T_b + 2`` with a warning
(``S_b``, ``T_b`` from ``boundary[:, 2:]``), an ``s_range`` above ``S``
becomes ``S + 1``, and the band scores are summed as k2 sums them (each
window on its own, in the gradients' dtype) so that tied bands -- frequent
in float32 on peaky occupancies -- resolve to the same first maximum.
``modified=True`` (the older fast_rnnt keyword) is accepted as
``rnnt_type="modified"``.

Deliberate differences:

- bad arguments raise ``ValueError``/``TypeError`` naming the argument where
  k2 asserts or silently truncates (float or bool ``boundary`` values are a
  ``TypeError``; ``s_range < 1`` is an error; k2 silently wraps a band that
  runs past ``S``, here ``ranges`` outside ``[0, S]`` is an error);
- ``get_rnnt_prune_ranges`` takes ``boundary=None`` (``[0, 0, S, T]``) and
  sequences with no symbols, where k2 asserts ``S >= 1``;
- the ``(px_grad, py_grad)`` of ``return_grad`` are fresh tensors, not the
  buffers later scaled in place by backward;
- float16 and bfloat16 inputs are accepted everywhere and computed in
  float32: the losses come back in the input dtype, the
  ``get_rnnt_logprobs*`` helpers' ``(px, py)`` and the losses' occupancies
  in float32; ``mutual_information_recursion`` returns its total and
  occupancies in the dtype of its ``px``/``py``;
- ``rnnt_loss`` with ``rnnt_type="regular"``, no delay penalty, no
  ``return_grad`` and a boundary starting at ``(0, 0)`` takes
  :func:`chainfb.rnnt_loss`'s fused route (same numbers, a fused gradient, no
  second 4-D tensor).
"""

from __future__ import annotations

import torch

from .. import checks
from ..criterion import apply
from ..transducer import pruned as P
from ..transducer.grid import check_boundary, grid_loglike
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
        return "modified" if checks.flag(modified, "modified") else "regular"
    return checks.choice(rnnt_type, "rnnt_type", P.RNNT_TYPES)


def _loss(px, py, boundary, delay_penalty, reduction, return_grad, dtype):
    """k2's tail of every loss: the delay penalty on ``px``, the grid, the
    reduction; ``(loss, (px_grad, py_grad))`` with ``return_grad``."""
    px = P.add_delay_penalty(px, boundary, delay_penalty, py.shape[2])
    out = grid_loglike(px, py, boundary, return_grad=return_grad)
    total, grads = out if return_grad else (out, None)
    loss = checks.reduce(-total, reduction).to(dtype)
    return (loss, grads) if return_grad else loss


def mutual_information_recursion(px, py, boundary=None, return_grad=False):
    """k2's ``mutual_information_recursion``: total log-probability ``[B]``
    of the ``(s, t)`` grid (``px [B, S, T + 1]`` or ``[B, S, T]``, ``py [B, S
    + 1, T]``, ``boundary [B, 4]``), or ``(total, (px_grad, py_grad))``."""
    return grid_loglike(px, py, boundary, return_grad)


def get_rnnt_logprobs(lm, am, symbols, termination_symbol, rnnt_type="regular", boundary=None, *, modified=None):
    """``(px, py)`` for the additive joiner (``lm [B, S + 1, C]``, ``am [B, T, C]``)."""
    return P.rnnt_logprobs(am, lm, symbols, termination_symbol, boundary, _type(rnnt_type, modified))


def get_rnnt_logprobs_joint(logits, symbols, termination_symbol, rnnt_type="regular", boundary=None, *,
                            modified=None):
    """``(px, py)`` from joiner logits ``[B, T, S + 1, C]``."""
    return P.rnnt_logprobs_joint(logits, symbols, termination_symbol, boundary, _type(rnnt_type, modified))


def get_rnnt_logprobs_smoothed(lm, am, symbols, termination_symbol, lm_only_scale=0.1, am_only_scale=0.1,
                               boundary=None, rnnt_type="regular", *, modified=None):
    """``(px, py)`` of k2's smoothed loss."""
    l_s = checks.number(lm_only_scale, "lm_only_scale")
    a_s = checks.number(am_only_scale, "am_only_scale")
    return P.rnnt_logprobs(am, lm, symbols, termination_symbol, boundary, _type(rnnt_type, modified),
                           lm_only_scale=l_s or 1e-20, am_only_scale=a_s or 1e-20)


def get_rnnt_logprobs_pruned(logits, symbols, ranges, termination_symbol, boundary=None, rnnt_type="regular", *,
                             modified=None):
    """``(px, py)`` from joiner logits ``[B, T, s_range, C]`` on the band
    ``ranges [B, T, s_range]`` (``-inf`` outside)."""
    return P.rnnt_logprobs_pruned(logits, symbols, ranges, termination_symbol, boundary,
                                  _type(rnnt_type, modified))


def rnnt_loss_simple(lm, am, symbols, termination_symbol, boundary=None, rnnt_type="regular", delay_penalty=0.0,
                     reduction="mean", return_grad=False, *, modified=None):
    """k2's ``rnnt_loss_simple``: ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    px, py = get_rnnt_logprobs(lm, am, symbols, termination_symbol, rnnt_type, boundary)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, return_grad, am.dtype)


def rnnt_loss_smoothed(lm, am, symbols, termination_symbol, lm_only_scale=0.1, am_only_scale=0.1, boundary=None,
                       rnnt_type="regular", delay_penalty=0.0, reduction="mean", return_grad=False, *,
                       modified=None):
    """k2's ``rnnt_loss_smoothed``: ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    px, py = get_rnnt_logprobs_smoothed(lm, am, symbols, termination_symbol, lm_only_scale, am_only_scale,
                                        boundary, rnnt_type)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, return_grad, am.dtype)


def rnnt_loss(logits, symbols, termination_symbol, boundary=None, rnnt_type="regular", delay_penalty=0.0,
              reduction="mean", return_grad=False, *, modified=None):
    """k2's ``rnnt_loss`` on full joiner logits ``[B, T, S + 1, C]``:
    ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    delay_penalty = P._penalty(delay_penalty)
    if (rnnt_type == "regular" and delay_penalty <= 0.0 and not return_grad and isinstance(logits, torch.Tensor)
            and logits.dim() == 4):
        B, T, S1, C = logits.shape
        bd = check_boundary(boundary, B, S1 - 1, T)
        if not bd[:, :2].any() and (bd[:, 3] > 0).all():
            P._symbols(symbols, B, S1 - 1, C)
            blank = P._blank(termination_symbol, C)
            crit = TransducerCriterion(logits.shape, symbols, bd[:, 3].copy(), bd[:, 2].copy(), blank)
            return checks.reduce(apply(logits, crit), reduction)
    px, py = get_rnnt_logprobs_joint(logits, symbols, termination_symbol, rnnt_type, boundary)
    return _loss(px, py, boundary, delay_penalty, reduction, return_grad, logits.dtype)


def rnnt_loss_pruned(logits, symbols, ranges, termination_symbol, boundary=None, rnnt_type="regular",
                     delay_penalty=0.0, reduction="mean", return_grad=False, *, modified=None):
    """k2's ``rnnt_loss_pruned`` on band logits ``[B, T, s_range, C]``:
    ``loss`` or ``(loss, (px_grad, py_grad))`` (occupancies of the full
    grid, zero outside the band)."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    return P._pruned_loss(logits, symbols, ranges, termination_symbol, boundary, rnnt_type,
                          P._penalty(delay_penalty), reduction, return_grad)


def get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range):
    """k2's ``get_rnnt_prune_ranges``: int64 ``[B, T, s_range']``, with
    ``s_range'`` widened for the regular topology when ``s_range`` cannot
    reach every sequence's last symbol (a warning) and at most ``S + 1``;
    band scores summed as k2 sums them (module docstring)."""
    return P.prune_ranges(px_grad, py_grad, boundary, s_range, band_scores="input")


def do_rnnt_pruning(am, lm, ranges):
    """k2's ``do_rnnt_pruning``: ``(am_pruned, lm_pruned)``, ``[B, T, s_range, C]`` each."""
    return P.prune(am, lm, ranges)
