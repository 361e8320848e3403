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

k2's names beyond fast_rnnt 1.3: ``joint_mutual_information_recursion``
(the total log-probability of the grid of ``sum_n px[n]``, ``sum_n py[n]``
split into one term per ``n``: the occupancies times each ``px[n]``,
``py[n]``, the first term also carrying the difference between the total
and the sum of the terms); the HAT loss (``rnnt_loss_pruned(...,
use_hat_loss=True)``, ``get_hat_logprobs_pruned``: Variani et al.'s Hybrid
Autoregressive Transducer, where the blank has probability
``sigmoid(logits[termination_symbol])`` and a symbol ``c`` has ``(1 -
sigmoid(logits[termination_symbol])) * softmax(logits[non-blank])[c]``, the
softmax over every class but the termination symbol); and
``get_rnnt_prune_ranges_deprecated`` (k2's older band choice: each window's
summed ``px_grad + py_grad``, no widening).  ``with_cuda()`` says whether
CUDA tensors can be computed (torch built with CUDA and a CuPy for it).

Deliberate differences:

- bad arguments raise ``ValueError``/``TypeError`` naming the argument where
  k2 asserts or silently truncates (float or bool ``boundary`` values are a
  ``TypeError``; ``s_range < 1`` is an error; k2 silently wraps a band that
  runs past ``S``, here ``ranges`` outside ``[0, S]`` is an error);
- ``get_rnnt_prune_ranges`` and ``get_rnnt_prune_ranges_deprecated`` take
  ``boundary=None`` (``[0, 0, S, T]``) and sequences with no symbols, where
  k2 asserts ``S >= 1``;
- ``use_hat_loss`` is keyword-only: k2's ``rnnt_loss_pruned`` has it as
  its 9th argument, where fast_rnnt 1.3 (and this module) has
  ``return_grad``;
- ``joint_mutual_information_recursion`` gives a sequence without a path
  ``-inf`` in its first term and zero occupancies (k2's are undefined there);
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

from collections.abc import Sequence

import torch

from .. import checks
from ..criterion import apply
from ..transducer import pruned as P
from ..transducer.grid import check_boundary, grid_loglike
from ..transducer.criterion import TransducerCriterion

__all__ = [
    "with_cuda",
    "mutual_information_recursion",
    "joint_mutual_information_recursion",
    "get_rnnt_logprobs",
    "get_rnnt_logprobs_joint",
    "get_rnnt_logprobs_smoothed",
    "get_rnnt_logprobs_pruned",
    "get_hat_logprobs_pruned",
    "rnnt_loss_simple",
    "rnnt_loss",
    "rnnt_loss_smoothed",
    "rnnt_loss_pruned",
    "get_rnnt_prune_ranges",
    "get_rnnt_prune_ranges_deprecated",
    "do_rnnt_pruning",
]

#: A loss ``[B]`` or reduced, or with ``return_grad=True`` ``(loss, (px_grad, py_grad))``.
LossOrGrads = torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def with_cuda() -> bool:
    """fast_rnnt's ``with_cuda()``: True when this install computes CUDA
    tensors -- torch built with CUDA and CuPy for the same CUDA major
    version importable (chainfb's GPU path) -- else False.  Like
    fast_rnnt's, it says what the install supports, not whether a GPU is
    free."""
    if not torch.version.cuda:
        return False
    from ..cuda.kernels import require_cupy

    try:
        require_cupy()
    except Exception:  # no CuPy, CuPy for another CUDA, or a CUDA runtime it cannot load
        return False
    return True


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


def mutual_information_recursion(px: torch.Tensor, py: torch.Tensor, boundary: torch.Tensor | None = None,
                                 return_grad: bool = False) -> LossOrGrads:
    """k2's ``mutual_information_recursion``: total log-probability ``[B]``
    of the ``(s, t)`` grid (``px [B, S, T + 1]`` or ``[B, S, T]``, ``py [B, S
    + 1, T]``, ``boundary [B, 4]``), or ``(total, (px_grad, py_grad))``."""
    return grid_loglike(px, py, boundary, return_grad)


def joint_mutual_information_recursion(px: Sequence[torch.Tensor], py: Sequence[torch.Tensor],
                                       boundary: torch.Tensor | None = None) -> torch.Tensor:
    """k2's ``joint_mutual_information_recursion``: the grid recursion of
    ``px_sum = sum_n px[n]``, ``py_sum = sum_n py[n]``, reported per term.

    Parameters
    ----------
    px : a sequence of ``N >= 1`` tensors, each ``[B, S, T + 1]`` (or ``[B,
        S, T]``, the modified grid), one shape and dtype.
    py : a sequence of ``N`` tensors, each ``[B, S + 1, T]``.
    boundary : ``[B, 4]`` ints ``[s_begin, t_begin, s_end, t_end]`` or None.

    Returns
    -------
    ``[N, B]``: term ``n`` is ``sum(occ_x * px[n]) + sum(occ_y * py[n])``
    with ``occ_x``, ``occ_y`` the arc occupancies of the summed grid
    (``-inf`` entries count as the dtype's lowest number); the first term
    also carries ``total - sum_n term_n``, so that the terms add up to the
    total log-probability (:func:`mutual_information_recursion` of the
    sums).  The gradient of term ``n`` w.r.t. ``px[n]``, ``py[n]`` is the
    occupancies (held constant).
    """
    px, py = _terms(px, "px"), _terms(py, "py")
    if len(px) != len(py):
        raise ValueError(f"px, py: expected sequences of one length, got {len(px)} and {len(py)}")
    with torch.no_grad():
        total, (occ_x, occ_y) = grid_loglike(sum(px[1:], px[0]), sum(py[1:], py[0]), boundary, return_grad=True)
    lo = torch.finfo(px[0].dtype).min
    terms = torch.stack([(occ_x * x.clamp(min=lo)).flatten(1).sum(1) + (occ_y * y.clamp(min=lo)).flatten(1).sum(1)
                         for x, y in zip(px, py)])
    offset = total - terms.detach().sum(0)
    return torch.cat([terms[:1] + offset, terms[1:]])


def _terms(xs, name):
    """A non-empty sequence of tensors of one shape and dtype, as a list."""
    if isinstance(xs, torch.Tensor) or not isinstance(xs, (list, tuple)):
        raise TypeError(f"{name}: expected a list or tuple of tensors, got {type(xs).__name__}")
    if not xs:
        raise ValueError(f"{name}: expected at least one tensor")
    first = checks.tensor(xs[0], f"{name}[0]", checks.FLOATS, 3)
    for n, x in enumerate(xs):
        checks.tensor(x, f"{name}[{n}]", checks.FLOATS, 3)
        if x.shape != first.shape or x.dtype != first.dtype or x.device != first.device:
            raise ValueError(f"{name}[{n}]: expected the shape, dtype and device of {name}[0] ({tuple(first.shape)}, "
                             f"{first.dtype}, {first.device}), got {tuple(x.shape)}, {x.dtype}, {x.device}")
    return list(xs)


def get_rnnt_logprobs(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor, termination_symbol: int,
                      rnnt_type: str = "regular", boundary: torch.Tensor | None = None, *,
                      modified: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(px, py)`` for the additive joiner (``lm [B, S + 1, C]``, ``am [B, T, C]``)."""
    return P.rnnt_logprobs(am, lm, symbols, termination_symbol, boundary, _type(rnnt_type, modified))


def get_rnnt_logprobs_joint(logits: torch.Tensor, symbols: torch.Tensor, termination_symbol: int,
                            rnnt_type: str = "regular", boundary: torch.Tensor | None = None, *,
                            modified: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(px, py)`` from joiner logits ``[B, T, S + 1, C]``."""
    return P.rnnt_logprobs_joint(logits, symbols, termination_symbol, boundary, _type(rnnt_type, modified))


def get_rnnt_logprobs_smoothed(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor, termination_symbol: int,
                               lm_only_scale: float = 0.1, am_only_scale: float = 0.1,
                               boundary: torch.Tensor | None = None, rnnt_type: str = "regular", *,
                               modified: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(px, py)`` of k2's smoothed loss."""
    l_s = checks.number(lm_only_scale, "lm_only_scale")
    a_s = checks.number(am_only_scale, "am_only_scale")
    return P.rnnt_logprobs(am, lm, symbols, termination_symbol, boundary, _type(rnnt_type, modified),
                           lm_only_scale=l_s or 1e-20, am_only_scale=a_s or 1e-20)


def get_rnnt_logprobs_pruned(logits: torch.Tensor, symbols: torch.Tensor, ranges: torch.Tensor,
                             termination_symbol: int, boundary: torch.Tensor | None = None,
                             rnnt_type: str = "regular", *,
                             modified: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(px, py)`` from joiner logits ``[B, T, s_range, C]`` on the band
    ``ranges [B, T, s_range]`` (``-inf`` outside)."""
    return P.rnnt_logprobs_pruned(logits, symbols, ranges, termination_symbol, boundary,
                                  _type(rnnt_type, modified))


def _hat_logits(logits, termination_symbol):
    """Logits whose log-softmax is HAT's log-probabilities: the termination
    symbol's logit ``b`` kept, every other logit less the log-sum-exp of the
    non-blank logits, so that the normaliser is ``log(1 + exp(b))``: the
    blank scores ``log sigmoid(b)``, a symbol ``c`` ``log sigmoid(-b) +
    log_softmax(non-blank)[c]``.  Half types are computed in float32."""
    x = checks.tensor(logits, "logits", checks.FLOATS, 4, "[B, T, s_range, C]")
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    C = x.shape[3]
    blank = checks.blank(termination_symbol, C, "termination_symbol")
    if C == 1:
        return x
    is_blank = torch.arange(C, device=x.device) == blank
    norm = torch.logsumexp(x.masked_fill(is_blank, -float("inf")), dim=3, keepdim=True)
    return torch.where(is_blank, x, x - norm)


def get_hat_logprobs_pruned(logits: torch.Tensor, symbols: torch.Tensor, ranges: torch.Tensor,
                            termination_symbol: int, boundary: torch.Tensor | None = None, rnnt_type: str = "regular",
                            *, modified: bool | None = None) -> tuple:
    """k2's ``get_hat_logprobs_pruned``: ``(px, py)`` of the HAT loss
    (module docstring) from joiner logits ``[B, T, s_range, C]`` on the band
    ``ranges [B, T, s_range]`` (``-inf`` outside), in float32 for half
    inputs."""
    return P.rnnt_logprobs_pruned(_hat_logits(logits, termination_symbol), symbols, ranges, termination_symbol,
                                  boundary, _type(rnnt_type, modified))


def rnnt_loss_simple(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor, termination_symbol: int,
                     boundary: torch.Tensor | None = None, rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     reduction: str = "mean", return_grad: bool = False, *,
                     modified: bool | None = None) -> LossOrGrads:
    """k2's ``rnnt_loss_simple``: ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    px, py = get_rnnt_logprobs(lm, am, symbols, termination_symbol, rnnt_type, boundary)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, return_grad, am.dtype)


def rnnt_loss_smoothed(lm: torch.Tensor, am: torch.Tensor, symbols: torch.Tensor, termination_symbol: int,
                       lm_only_scale: float = 0.1, am_only_scale: float = 0.1, boundary: torch.Tensor | None = None,
                       rnnt_type: str = "regular", delay_penalty: float = 0.0, reduction: str = "mean",
                       return_grad: bool = False, *, modified: bool | None = None) -> LossOrGrads:
    """k2's ``rnnt_loss_smoothed``: ``loss`` or ``(loss, (px_grad, py_grad))``."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    px, py = get_rnnt_logprobs_smoothed(lm, am, symbols, termination_symbol, lm_only_scale, am_only_scale,
                                        boundary, rnnt_type)
    return _loss(px, py, boundary, P._penalty(delay_penalty), reduction, return_grad, am.dtype)


def rnnt_loss(logits: torch.Tensor, symbols: torch.Tensor, termination_symbol: int,
              boundary: torch.Tensor | None = None, rnnt_type: str = "regular", delay_penalty: float = 0.0,
              reduction: str = "mean", return_grad: bool = False, *, modified: bool | None = None) -> LossOrGrads:
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


def rnnt_loss_pruned(logits: torch.Tensor, symbols: torch.Tensor, ranges: torch.Tensor, termination_symbol: int,
                     boundary: torch.Tensor | None = None, rnnt_type: str = "regular", delay_penalty: float = 0.0,
                     reduction: str = "mean", return_grad: bool = False, *, use_hat_loss: bool = False,
                     modified: bool | None = None) -> LossOrGrads:
    """k2's ``rnnt_loss_pruned`` on band logits ``[B, T, s_range, C]``:
    ``loss`` or ``(loss, (px_grad, py_grad))`` (occupancies of the full
    grid, zero outside the band); ``use_hat_loss=True``: the HAT loss
    (module docstring)."""
    rnnt_type, reduction = _type(rnnt_type, modified), checks.reduction(reduction)
    return_grad = checks.flag(return_grad, "return_grad")
    x = _hat_logits(logits, termination_symbol) if checks.flag(use_hat_loss, "use_hat_loss") else logits
    out = P._pruned_loss(x, symbols, ranges, termination_symbol, boundary, rnnt_type, P._penalty(delay_penalty),
                         reduction, return_grad)
    if x is logits:
        return out
    return (out[0].to(logits.dtype), out[1]) if return_grad else out.to(logits.dtype)


def get_rnnt_prune_ranges(px_grad: torch.Tensor, py_grad: torch.Tensor, boundary: torch.Tensor | None,
                          s_range: int) -> torch.Tensor:
    """k2's ``get_rnnt_prune_ranges``: int64 ``[B, T, s_range']``, with
    ``s_range'`` widened for the regular topology when ``s_range`` cannot
    reach every sequence's last symbol (a warning) and at most ``S + 1``;
    band scores summed as k2 sums them (module docstring)."""
    return P.prune_ranges(px_grad, py_grad, boundary, s_range, band_scores="input")


def get_rnnt_prune_ranges_deprecated(px_grad: torch.Tensor, py_grad: torch.Tensor, boundary: torch.Tensor | None,
                                     s_range: int) -> torch.Tensor:
    """k2's ``get_rnnt_prune_ranges_deprecated``: int64 ``[B, T,
    s_range']``.  Per frame, the window of ``s_range`` symbol positions
    whose summed ``px_grad + py_grad`` (a cumulative sum over positions, in
    the gradients' dtype; first maximum) is largest; then as
    :func:`get_rnnt_prune_ranges` (the last frame's band ends at
    ``s_end``; the start never falls, starts at 0 and rises by at most
    ``s_range - 1``, or 1 for the modified grid).  ``s_range`` is never
    widened; above ``S`` it becomes ``S + 1``; the regular grid needs
    ``s_range >= 2``."""
    s_range = checks.integer(s_range, "s_range", lo=1)
    checks.tensor(px_grad, "px_grad", checks.FLOATS, 3)
    checks.tensor(py_grad, "py_grad", checks.FLOATS, 3)
    B, S1, T = py_grad.shape
    S, T1 = S1 - 1, px_grad.shape[2]
    if px_grad.shape[:2] != (B, S) or T1 not in (T, T + 1):
        raise ValueError(f"px_grad: expected shape ({B}, {S}, {T} or {T + 1}), got {tuple(px_grad.shape)}")
    if T1 == T + 1 and s_range < 2:
        raise ValueError(f"s_range: the regular transducer needs a band of at least 2, got {s_range}")
    bd = check_boundary(boundary, B, S, T)
    s_range = min(s_range, S + 1)
    pxg, pyg = px_grad.detach(), py_grad.detach()
    tot = torch.cat([pxg, pxg.new_zeros((B, 1, T1))], dim=1) + torch.nn.functional.pad(pyg, (0, T1 - T))
    tot = torch.cat([tot.new_zeros((B, 1, T1)), tot], dim=1).cumsum(dim=1)  # [B, S + 2, T1]
    start = (tot[:, s_range:] - tot[:, :S + 2 - s_range]).argmax(dim=1)[:, :T]
    return P.ranges_from_starts(start, bd, s_range, T1 == T)


def do_rnnt_pruning(am: torch.Tensor, lm: torch.Tensor, ranges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k2's ``do_rnnt_pruning``: ``(am_pruned, lm_pruned)``, ``[B, T, s_range, C]`` each."""
    return P.prune(am, lm, ranges)
