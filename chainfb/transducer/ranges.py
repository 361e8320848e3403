"""The range search of the pruned RNN-T family (:mod:`chainfb.transducer.pruned`):
the narrowest band that reaches every sequence's last symbol
(:func:`min_s_range`), the band of ``s_range`` symbol positions per frame
that holds most of the simple loss's arc occupancy (:func:`prune_ranges`),
and the joiner inputs on that band (:func:`prune`, k2's
``do_rnnt_pruning``).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from .._arrays import Array
from .. import checks
from .grid import check_boundary

__all__ = ["BAND_SCORES", "min_s_range", "prune_ranges", "ranges_from_starts", "prune"]

#: how :func:`prune_ranges` sums the band scores (its ``band_scores`` argument)
BAND_SCORES = ("float64", "input")


def _check_ranges(ranges, B, T, S):
    checks.tensor(ranges, "ranges", checks.INTS)
    if ranges.dim() != 3 or tuple(ranges.shape[:2]) != (B, T) or ranges.shape[2] < 1:
        raise ValueError(f"ranges: expected shape ({B}, {T}, s_range >= 1), got {tuple(ranges.shape)}")
    if ranges.numel():
        lo, hi = int(ranges.min()), int(ranges.max())
        if lo < 0 or hi > S:
            raise ValueError(f"ranges: symbol positions must lie in [0, S={S}], got [{lo}, {hi}]")
    return ranges.to(torch.int64)


def _reverse_cummin(x, dim):
    return torch.flip(torch.cummin(torch.flip(x, (dim,)), dim=dim)[0], (dim,))


def _s_range_needs(bd: np.ndarray) -> np.ndarray:
    """``[B]``: each row's narrowest regular band, ``(S_b - 1) // T_b + 2``
    (1 for rows with ``S_b = 0`` or ``T_b = 0``)."""
    S_b, T_b = bd[:, 2], bd[:, 3]
    live = (S_b >= 1) & (T_b >= 1)
    return np.where(live, (S_b - 1) // np.maximum(T_b, 1) + 2, 1)


def min_s_range(boundary: Array) -> int:
    """The narrowest band with which every sequence of a regular transducer
    can reach its last symbol: ``max_b (S_b - 1) // T_b + 2`` over the rows
    with ``S_b >= 1`` and ``T_b >= 1`` (``S_b``, ``T_b`` are ``boundary[:,
    2]`` and ``boundary[:, 3]``, as in k2), 1 when there is none.  The band
    start rises by at most ``s_range - 1`` per frame, so in ``T_b`` frames
    its end reaches at most symbol ``(s_range - 1) * T_b``.

    ``boundary`` : ``[B, 4]`` ints (``B >= 1``)."""
    bd = checks.int_array(boundary, "boundary", 2)
    if bd.shape[1:] != (4,):
        raise ValueError(f"boundary: expected shape (B, 4), got {bd.shape}")
    return int(_s_range_needs(bd).max()) if len(bd) else 1


def _band_scores(pxg, pyg, s_range, how):
    """Score ``[B, J, T]`` of the band starting at each ``j`` of ``J = S + 2 -
    s_range``: the occupancy of its blank arcs minus the symbol arc entering
    it (``px_grad[j - 1]``, nothing for ``j = 0``)."""
    B, S1, T = pyg.shape
    J = S1 + 1 - s_range
    if how == "float64":  # window sums as differences of a float64 cumulative sum
        pyg, pxg = pyg.double(), pxg.double()
        cs = torch.cat([pyg.new_zeros((B, 1, T)), pyg.cumsum(dim=1)], dim=1)  # [B, S + 2, T]
        score = cs[:, s_range:s_range + J] - cs[:, :J]
    else:  # k2's form: each window summed on its own, in the gradients' dtype
        pxg = pxg.to(pyg.dtype)
        score = pyg.unfold(1, s_range, 1).permute(0, 1, 3, 2).sum(dim=2)  # [B, J, s_range, T] -> [B, J, T]
    entering = torch.cat([pxg.new_zeros((B, 1, T)), pxg[:, :J - 1]], dim=1)
    return score - entering


def prune_ranges(px_grad: torch.Tensor, py_grad: torch.Tensor, boundary: Array | None, s_range: int, *,
                 band_scores: str = "float64") -> torch.Tensor:
    """k2's ``get_rnnt_prune_ranges``: per frame, the ``s_range`` consecutive
    symbol positions that hold the most occupancy.

    Parameters
    ----------
    px_grad : ``[B, S, T + 1]`` (regular) or ``[B, S, T]``; py_grad : ``[B, S
        + 1, T]``: arc occupancies (``return_grad`` of :func:`simple_rnnt_loss`).
    boundary : ``[B, 4]`` ints ``[s_begin, t_begin, s_end, t_end]`` or None.
    s_range : int >= 1, the band width asked for.  For the regular topology
        (``px_grad`` with ``T + 1`` columns) a band narrower than
        :func:`min_s_range` cannot reach the last symbol of some sequence
        (its pruned loss would be ``inf``): it is widened to that width with a
        ``UserWarning``, as k2 does.  Above ``S`` it becomes ``S + 1`` (the
        whole grid).
    band_scores : how the score of each candidate band is summed:
        ``"float64"`` (default) in float64, as differences of a cumulative
        sum; ``"input"`` as k2 sums it, each window on its own in the
        gradients' dtype, so that bands whose float32 scores tie (common on
        peaky occupancies) break the tie as k2 does (the first maximum).

    Returns
    -------
    ranges : int64 ``[B, T, s_range]`` (the width after widening),
        ``ranges[b, t, k] = start[b, t] + k`` with ``start[b, 0] = 0``,
        ``start`` non-decreasing in ``t``, rising by at most ``s_range - 1``
        per frame (1 when px has ``T`` columns) and every entry in ``[0,
        S]``; from frame ``t_end - 1`` on the band ends at ``s_end``.
    """
    s_range = checks.integer(s_range, "s_range", lo=1)
    checks.choice(band_scores, "band_scores", BAND_SCORES)
    checks.tensor(px_grad, "px_grad", checks.FLOATS, 3)
    checks.tensor(py_grad, "py_grad", checks.FLOATS, 3)
    B, S1, T = py_grad.shape
    S = S1 - 1
    T1 = px_grad.shape[2]
    if px_grad.shape[:2] != (B, S) or T1 not in (T, T + 1):
        raise ValueError(f"px_grad: expected shape ({B}, {S}, {T} or {T + 1}), got {tuple(px_grad.shape)}")
    bd = check_boundary(boundary, B, S, T)
    if T1 == T + 1 and B:
        needs = _s_range_needs(bd)
        b = int(needs.argmax())
        if s_range < needs[b]:
            warnings.warn(f"s_range: a band of {s_range} cannot reach the last symbol of sequence {b} ({bd[b, 2]} "
                          f"symbols in {bd[b, 3]} frames); widened to {needs[b]}", UserWarning, stacklevel=2)
            s_range = int(needs[b])
    if s_range > S:
        s_range = S + 1
    score = _band_scores(px_grad.detach()[:, :, :T], py_grad.detach(), s_range, band_scores)
    start = score.transpose(1, 2).contiguous().argmax(dim=2)  # the first maximum: [B, T] (reduced where contiguous)
    return ranges_from_starts(start, bd, s_range, T1 == T)


def ranges_from_starts(start: torch.Tensor, bd: np.ndarray, s_range: int, modified: bool) -> torch.Tensor:
    """k2's last steps of the prune ranges: the band start ``start [B, T]``
    (each frame's best) set to ``max(s_end - s_range + 1, 0)`` from frame
    ``t_end - 1`` on, then lowered until it starts at 0, never falls and
    rises by at most ``s_range - 1`` per frame (1 for ``modified``, px of
    ``T`` columns); ``ranges [B, T, s_range]``.  ``bd``: the boundary
    ``[B, 4]`` (int64 NumPy)."""
    dev, T = start.device, start.shape[1]
    t = torch.arange(T, device=dev)
    s_end = torch.as_tensor(bd[:, 2], device=dev)
    t_end = torch.as_tensor(bd[:, 3], device=dev)
    last = (s_end - s_range + 1).clamp(min=0)
    start = torch.where(t[None, :] >= (t_end - 1)[:, None], last[:, None], start)
    r = 2 if modified else s_range
    x = _reverse_cummin(start, 1)
    y = (r - 1) * t[None, :] - x
    y = _reverse_cummin(y, 1).clamp(min=0)
    start = (r - 1) * t[None, :] - y
    return start[:, :, None] + torch.arange(s_range, device=dev)


def prune(am: torch.Tensor, lm: torch.Tensor, ranges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k2's ``do_rnnt_pruning``: ``(am_pruned, lm_pruned)``, both ``[B, T,
    s_range, D]``: ``am_pruned[b, t, k] = am[b, t]``, ``lm_pruned[b, t, k] =
    lm[b, ranges[b, t, k]]`` (``am [B, T, D]``, ``lm [B, S + 1, D]``)."""
    checks.tensor(am, "am", ndim=3, layout="[B, T, D]")
    checks.tensor(lm, "lm", ndim=3, layout="[B, S + 1, D]")
    B, T, D = am.shape
    if lm.shape[0] != B or lm.shape[2] != D:
        raise ValueError(f"lm: expected shape ({B}, S + 1, {D}), got {tuple(lm.shape)}")
    S1 = lm.shape[1]
    rg = _check_ranges(ranges, B, T, S1 - 1)
    R = rg.shape[2]
    am_pruned = am[:, :, None, :].expand(B, T, R, D)
    # whole rows of lm by their index in [B * (S + 1), D]: a row copy each (its backward adds rows); an
    # element-wise gather, an index per element, takes 8-14x the time
    rows = (rg + torch.arange(B, device=rg.device)[:, None, None] * S1).reshape(-1)
    lm_pruned = torch.index_select(lm.reshape(B * S1, D), 0, rows).reshape(B, T, R, D)
    return am_pruned, lm_pruned
