"""The pruned RNN-T family (k2 / fast_rnnt), compiled into the grid lattice:
the losses and the pruned joiner's log-probs here, the other log-probs in
:mod:`.logprobs`, the range search in :mod:`.ranges` (all served from here).

Every loss here is "compute the arc log-probs ``px``/``py`` of the ``(s, t)``
grid, then run the one engine" (:func:`.grid.grid_loglike`); nothing has a
recursion of its own.  With ``S`` symbols, ``T`` frames and vocabulary
``C`` (blank = ``blank``, symbols ``y_s``)::

    px[b, s, t] = log P(y_s    | s, t)   symbol arc (s, t) -> (s + 1, t)
    py[b, s, t] = log P(blank  | s, t)   blank arc  (s, t) -> (s, t + 1)

``rnnt_type``: ``"regular"`` (px ``[B, S, T + 1]``, its last column and
column ``t_end`` ``-inf``: the final arc is a blank), ``"modified"`` (px
``[B, S, T]``: a symbol also consumes a frame) and ``"constrained"`` (px
``[B, S, T]``, regular topology, but a symbol's arc also carries the blank
that follows it: ``px[b, s, t] += py[b, s + 1, t]``, so at most one symbol
per frame).  ``delay_penalty > 0`` adds ``delay_penalty * ((t_end - 1) / 2
- t)`` to every symbol arc (earlier symbols score higher).

Where the log-probs come from:

- :func:`rnnt_logprobs`: a joiner that is the sum ``am[t] + lm[s]``; the
  normaliser ``log sum_c exp(am[t, c] + lm[s, c])`` is a product of
  exponentials (``[B, S + 1, T]``), never ``[B, T, S + 1, C]``; with
  ``lm_only_scale``/``am_only_scale`` it is k2's smoothed version;
- :func:`rnnt_logprobs_joint`: full joiner logits ``[B, T, S + 1, C]``;
- :func:`rnnt_logprobs_pruned`: joiner logits on a band ``[B, T, s_range,
  C]`` around the likely alignments, ``ranges [B, T, s_range]`` (from
  :func:`prune_ranges` on the simple loss's arc occupancies), ``-inf``
  outside the band.

The pruned pipeline: :func:`simple_rnnt_loss` with ``return_grad=True`` ->
:func:`prune_ranges` -> :func:`prune` (``am``, ``lm`` on the band) -> the
joiner on ``[B, T, s_range, ...]`` -> :func:`pruned_rnnt_loss`.  Memory of
the pruned part: ``O(B * T * s_range * C)`` plus ``O(B * T * S)``.  For the
regular topology a band narrower than :func:`min_s_range` (``S_b``
symbols in ``T_b`` frames need ``(S_b - 1) // T_b + 2``) cannot reach the
last symbol, so :func:`prune_ranges` widens it with a warning, as k2 does.
Its band scores are summed in float64 by default; ``band_scores="input"``
sums them as k2 does (in the gradients' dtype, window by window), which is
what :mod:`chainfb.compat.fast_rnnt` uses to pick k2's band where float32
scores tie.  Every loss takes ``return_grad=True`` for ``(loss, (px_grad,
py_grad))``, the occupancy of each grid arc.

Padding never reaches a gradient: values outside each sequence (frames of
``am`` outside ``[t_begin, t_end)``, rows of ``lm`` outside ``[s_begin,
s_end]``, joiner cells outside both), finite or not (``-inf``, NaN,
``+inf``), change neither the losses nor the gradients of the other
entries, and get a zero gradient.  (With smoothing, ``lm``'s padding rows
enter k2's batch unigram: finite values count there, as in k2, and
non-finite ones count as 0.)

Half-precision inputs are computed in float32; values come back in the
input dtype.  Lengths-based entry points build the boundary ``[0, 0, U_b,
T_b]`` from integer lengths (floats and bools are a ``TypeError``, never
truncated); the ``boundary=`` forms take k2's ``[s_begin, t_begin, s_end,
t_end]``.
"""

from __future__ import annotations

import numpy as np
import torch

from .._arrays import Array, Ints
from .. import checks
from .grid import band_loglike, band_start, check_boundary, grid_loglike
from .logprobs import (RNNT_TYPES, _blank, _band_logprobs, _check_frames, _check_type, _finish, _float, _penalty,
                       _symbols, add_delay_penalty, rnnt_logprobs, rnnt_logprobs_joint)
from .logprobs import _AdditiveLogprobs, _BandLogprobs, _softmax_scale  # noqa: F401 -- served from here too
from .ranges import _check_ranges, min_s_range, prune, prune_ranges
from .ranges import BAND_SCORES, ranges_from_starts  # noqa: F401 -- served from here too

__all__ = [
    "RNNT_TYPES",
    "rnnt_logprobs",
    "rnnt_logprobs_joint",
    "rnnt_logprobs_pruned",
    "prune_ranges",
    "min_s_range",
    "prune",
    "simple_rnnt_loss",
    "pruned_rnnt_loss",
    "grid_rnnt_loss",
    "boundary_from_lengths",
    "add_delay_penalty",
]


def _pruned_inputs(logits, symbols, ranges, blank, boundary, rnnt_type, delay_penalty):
    """The checked arguments of the band functions: ``(x [B, T, R, C] float,
    symbols [B, S] int64, ranges [B, T, R] int64, blank, boundary [B, 4]
    NumPy, delay_penalty)``."""
    _check_type(rnnt_type)
    delay_penalty = _penalty(delay_penalty)
    x = _float(logits, "logits", 4)
    B, T, R, C = x.shape
    if not isinstance(symbols, torch.Tensor) or symbols.dim() != 2:
        raise ValueError("symbols: expected a [B, S] integer tensor")
    S = symbols.shape[1]
    sy = _symbols(symbols, B, S, C)
    blank = _blank(blank, C)
    rg = _check_ranges(ranges, B, T, S)
    if rg.shape[2] != R:
        raise ValueError(f"ranges: expected s_range = logits.shape[2] = {R}, got {rg.shape[2]}")
    _check_frames(rnnt_type, S, T)
    bd = check_boundary(boundary, B, S, T)
    return x, sy, rg, blank, bd, delay_penalty


def _band_to_grid(px_band, py_band, rg, S, fill=-np.inf):
    """Band values ``[B, T, R]`` into the full grids ``[B, S, T]`` and ``[B,
    S + 1, T]`` (``fill`` elsewhere; position ``S`` of ``px`` is dropped)."""
    B, T, R = px_band.shape
    idx = rg.transpose(1, 2)  # [B, R, T]
    px = px_band.new_full((B, S + 1, T), fill).scatter(1, idx, px_band.transpose(1, 2))[:, :S]
    py = py_band.new_full((B, S + 1, T), fill).scatter(1, idx, py_band.transpose(1, 2))
    return px, py


def rnnt_logprobs_pruned(logits: torch.Tensor, symbols: torch.Tensor, ranges: torch.Tensor, blank: int,
                         boundary: Array | None = None, rnnt_type: str = "regular",
                         delay_penalty: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(px, py)`` of the full grid from joiner logits on a band.

    Parameters
    ----------
    logits : ``[B, T, s_range, C]``: ``logits[b, t, k]`` is the joiner at
        ``(s = ranges[b, t, k], t)``.
    ranges : ``[B, T, s_range]`` int (from :func:`prune_ranges`), values in ``[0, S]``.
    symbols : ``[B, S]``; blank, boundary, rnnt_type, delay_penalty as :func:`rnnt_logprobs`.

    Returns
    -------
    px, py as :func:`rnnt_logprobs`, ``-inf`` outside the band.
    """
    x, sy, rg, blank, bd, delay_penalty = _pruned_inputs(logits, symbols, ranges, blank, boundary, rnnt_type,
                                                         delay_penalty)
    px, py = _band_to_grid(*_band_logprobs(x, sy, rg, blank), rg, sy.shape[1])
    return _finish(px, py, bd, rnnt_type, delay_penalty, x.shape[1])


def _pruned_loss(logits, symbols, ranges, blank, boundary, rnnt_type, delay_penalty, reduction, return_grad):
    """The pruned loss (:func:`pruned_rnnt_loss`, k2's ``rnnt_loss_pruned``)
    from ``boundary`` (``[B, 4]`` or None).  A regular band as
    :func:`prune_ranges` makes it runs on the band's own graph
    (:class:`~chainfb.transducer.grid.BandGridCriterion`, ``s_range``
    states); any other on the full grid with ``-inf`` outside the band."""
    x, sy, rg, blank, bd, delay_penalty = _pruned_inputs(logits, symbols, ranges, blank, boundary, rnnt_type,
                                                         delay_penalty)
    start = band_start(rg, bd) if rnnt_type == "regular" else None
    if start is None:
        px, py = _band_to_grid(*_band_logprobs(x, sy, rg, blank), rg, sy.shape[1])
        px, py = _finish(px, py, bd, rnnt_type, delay_penalty, x.shape[1])
        return _loss(px, py, bd, reduction, return_grad, logits.dtype)
    px_band, py_band = _band_logprobs(x, sy, rg, blank)
    if delay_penalty > 0.0:
        T = x.shape[1]
        offset = torch.as_tensor((bd[:, 3] - 1) / 2.0, dtype=x.dtype, device=x.device)
        t = torch.arange(T, dtype=x.dtype, device=x.device)
        px_band = px_band + (delay_penalty * (offset[:, None] - t[None, :]))[:, :, None]
    out = band_loglike(px_band, py_band, start, bd, return_grad=return_grad)
    total, grads = out if return_grad else (out, None)
    loss = checks.reduce(-total, reduction).to(logits.dtype)
    if not return_grad:
        return loss
    px_grad, py_grad = _band_to_grid(*grads, rg, sy.shape[1], fill=0.0)
    px_grad = torch.cat([px_grad, px_grad.new_zeros((px_grad.shape[0], px_grad.shape[1], 1))], dim=2)
    return loss, (px_grad, py_grad)


def boundary_from_lengths(logit_lengths: Ints, target_lengths: Ints, T: int | None = None,
                          U: int | None = None) -> torch.Tensor:
    """``[B, 4]`` int64 ``[0, 0, U_b, T_b]`` (on ``logit_lengths``' device
    when it is a tensor): both ``[B]`` integers (floats and bools are a
    ``TypeError``), ``T_b`` in ``[0, T]`` and ``U_b`` in ``[0, U]`` when the
    bounds are given."""
    T_b = checks.int_array(logit_lengths, "logit_lengths", 1)
    T_b = checks.lengths(T_b, "logit_lengths", len(T_b), T)
    U_b = checks.lengths(target_lengths, "target_lengths", len(T_b), U)
    z = np.zeros_like(T_b)
    bd = torch.from_numpy(np.stack([z, z, U_b, T_b], axis=1))
    return bd.to(logit_lengths.device) if isinstance(logit_lengths, torch.Tensor) else bd


def _loss(px, py, boundary, reduction, return_grad, dtype):
    """``reduce(-total)`` in ``dtype``, or ``(loss, (px_grad, py_grad))``
    with the occupancies of the grid's arcs (``d total / d px``, ``d total /
    d py``: the gradient of the summed log-likelihoods, whatever the
    reduction)."""
    out = grid_loglike(px, py, boundary, return_grad=return_grad)
    total, grads = out if return_grad else (out, None)
    loss = checks.reduce(-total, reduction).to(dtype)
    return (loss, grads) if return_grad else loss


def simple_rnnt_loss(am: torch.Tensor, lm: torch.Tensor, targets: torch.Tensor, logit_lengths: Ints,
                     target_lengths: Ints, blank: int, rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     lm_only_scale: float = 0.0, am_only_scale: float = 0.0, reduction: str = "mean",
                     return_grad: bool = False,
                     ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """RNN-T loss of the additive joiner ``am[t] + lm[s]`` (k2's simple /
    smoothed loss), without a 4-D tensor.

    Parameters
    ----------
    am : ``[B, T, C]``; lm : ``[B, U + 1, C]`` (float16/bfloat16/float32/float64).
    targets : ``[B, U]`` ints; logit_lengths, target_lengths : ``[B]`` ints.
    blank : int; rnnt_type, delay_penalty, lm_only_scale, am_only_scale:
        see :func:`rnnt_logprobs`; reduction : ``"mean"`` (over the batch),
        ``"sum"`` or ``"none"``.
    return_grad : also return ``(px_grad, py_grad)``, the arc occupancies
        that :func:`prune_ranges` needs.

    Returns
    -------
    loss (``[B]`` or scalar, in ``am``'s dtype), or ``(loss, (px_grad, py_grad))``.
    """
    reduction = checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    bd = boundary_from_lengths(logit_lengths, target_lengths, _size(am, 3, 1), _size(lm, 3, 1, 1))
    px, py = rnnt_logprobs(am, lm, targets, blank, bd, rnnt_type, delay_penalty, lm_only_scale, am_only_scale)
    return _loss(px, py, bd, reduction, return_grad, am.dtype)


def _size(x, ndim: int, dim: int, minus: int = 0):
    """``x.shape[dim] - minus`` when ``x`` is a tensor of ``ndim``
    dimensions, else None (the function that reads ``x`` checks it)."""
    return x.shape[dim] - minus if isinstance(x, torch.Tensor) and x.dim() == ndim else None


def pruned_rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, ranges: torch.Tensor, logit_lengths: Ints,
                     target_lengths: Ints, blank: int, rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     reduction: str = "mean", return_grad: bool = False,
                     ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """RNN-T loss from joiner logits on the band ``ranges`` (k2's pruned loss).

    Parameters
    ----------
    logits : ``[B, T, s_range, C]``; ranges : ``[B, T, s_range]`` ints.
    targets, logit_lengths, target_lengths, blank, rnnt_type, delay_penalty,
    reduction, return_grad : as :func:`simple_rnnt_loss` (the occupancies
    are those of the full ``(s, t)`` grid, zero outside the band).
    """
    reduction = checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    bd = boundary_from_lengths(logit_lengths, target_lengths, _size(logits, 4, 1), _size(targets, 2, 1))
    return _pruned_loss(logits, targets, ranges, blank, bd, rnnt_type, delay_penalty, reduction, return_grad)


def grid_rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: Ints, target_lengths: Ints, blank: int,
                   rnnt_type: str = "regular", delay_penalty: float = 0.0, reduction: str = "mean",
                   return_grad: bool = False) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """RNN-T loss of full joiner logits ``[B, T, U + 1, C]`` through the grid
    lattice, for every ``rnnt_type`` and the delay penalty (for the regular
    type without a penalty :func:`chainfb.rnnt_loss` gives the same numbers
    with a fused gradient and less memory); ``return_grad`` as
    :func:`simple_rnnt_loss`."""
    reduction = checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    bd = boundary_from_lengths(logit_lengths, target_lengths, _size(logits, 4, 1), _size(logits, 4, 2, 1))
    px, py = rnnt_logprobs_joint(logits, targets, blank, bd, rnnt_type, delay_penalty)
    return _loss(px, py, bd, reduction, return_grad, logits.dtype)
