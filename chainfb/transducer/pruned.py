"""The pruned RNN-T family (k2 / fast_rnnt), compiled into the grid lattice.

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

import warnings

import numpy as np
import torch

from .. import checks
from ..criterion import first_order_backward
from .maps import compiled
from .grid import band_loglike, band_start, check_boundary, grid_loglike

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

RNNT_TYPES = ("regular", "modified", "constrained")
#: how :func:`prune_ranges` sums the band scores (its ``band_scores`` argument)
BAND_SCORES = ("float64", "input")


def _check_type(rnnt_type):
    checks.choice(rnnt_type, "rnnt_type", RNNT_TYPES)


def _float(x, name, ndim):
    checks.tensor(x, name, checks.FLOATS, ndim)
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _symbols(symbols, B, S, C, name="symbols"):
    checks.tensor(symbols, name, checks.INTS)
    if tuple(symbols.shape) != (B, S):
        raise ValueError(f"{name}: expected shape ({B}, {S}), got {tuple(symbols.shape)}")
    if symbols.numel():
        lo, hi = int(symbols.min()), int(symbols.max())
        if lo < 0 or hi >= C:
            raise ValueError(f"{name}: symbols must lie in [0, C={C}), got [{lo}, {hi}]")
    return symbols.to(torch.int64)


def _blank(blank, C, name="blank"):
    return checks.blank(blank, C, name)


def _check_frames(rnnt_type, S, T):
    if rnnt_type == "modified" and T < S:
        raise ValueError(f"rnnt_type: 'modified' needs T >= S (a symbol consumes a frame), got T={T}, S={S}")


def _finish(px, py, bd, rnnt_type, delay_penalty, T):
    """k2's post-processing of (px, py): the regular topology's ``-inf`` at
    ``t_end`` (:func:`_regular_column`, unless ``px`` already has the column
    ``t = T``), the constrained blank folded into the symbol arcs, and the
    delay penalty on the symbol arcs."""
    if rnnt_type == "regular" and px.shape[2] == T:
        px = _with_regular_column(px, bd, T)
    elif rnnt_type == "constrained":
        px = px + py[:, 1:, :]
    return add_delay_penalty(px, bd, delay_penalty, T), py


def _with_regular_column(px, bd, T):
    """``px [B, S, T]`` of the regular topology with its column ``t = T``
    and its ``t = t_end`` at ``-inf``: ``[B, S, T + 1]``."""
    px = torch.nn.functional.pad(px, (0, 1), value=-np.inf)
    _regular_column(px, bd, T)
    return px


def _regular_column(px, bd, T, value=-np.inf):
    """``px [B, S, >= T]`` gets ``value`` at ``t = t_end`` where that is
    before ``T``: the regular topology's ``-inf`` there (no symbol after the
    last frame; the column ``t = T`` is ``-inf`` already), or its gradient's
    0."""
    rows = np.flatnonzero(bd[:, 3] < T)
    if rows.size:
        dev = px.device
        px[torch.as_tensor(rows, device=dev)[:, None], torch.arange(px.shape[1], device=dev)[None, :],
           torch.as_tensor(bd[rows, 3], device=dev)[:, None]] = value


def add_delay_penalty(px, boundary, delay_penalty: float, num_frames: int):
    """``px + delay_penalty * ((t_end - 1) / 2 - t)`` on every symbol arc
    (k2's delay penalty; nothing when ``delay_penalty <= 0``); ``t_end``
    from ``boundary`` (default ``num_frames``, the ``T`` of ``py``)."""
    if not delay_penalty > 0.0:
        return px
    bd = check_boundary(boundary, px.shape[0], px.shape[1], num_frames)
    offset = torch.as_tensor((bd[:, 3] - 1) / 2.0, dtype=px.dtype, device=px.device)
    t = torch.arange(px.shape[2], dtype=px.dtype, device=px.device)
    return px + delay_penalty * (offset[:, None, None] - t[None, None, :])


def _penalty(delay_penalty):
    return checks.number(delay_penalty, "delay_penalty")


def _softmax_scale(x):
    """``(softmax(x), log_scale)`` over the last axis of ``x [B, N, C]``:
    ``exp(x) = softmax(x) * exp(log_scale)``, ``log_scale [B, N, 1] =
    max(x) - log(max(softmax(x)))`` (the largest softmax entry is ``exp(0) /
    Z``, so this is ``log sum exp(x)`` without a pass of its own): torch's
    fused softmax and two maxima, where the exponentials ``exp(x - max)``
    take a maximum, a subtraction and an exponential over the whole tensor."""
    e = torch.softmax(x, dim=2)
    return e, x.amax(dim=2, keepdim=True).sub_(e.amax(dim=2, keepdim=True).log_())


def _without_bad_rows(e, scale):
    """``e`` (``softmax(x)``, in place) with 0 in the rows whose log-scale is
    not finite -- rows of ``x`` with a NaN or ``+inf`` or only ``-inf``, whose
    softmax is NaN (padding, typically): through the batched products they
    would reach every row of the other factor, and its gradient.  Their own
    cells stay NaN through ``scale``."""
    bad = ~torch.isfinite(scale)
    if e.is_cuda or bool(bad.any()):  # (no device read on the GPU)
        e.masked_fill_(bad, 0.0)
    return e


def _finite_padding(x, begin, end):
    """``x [B, N, C]`` with 0 in place of the non-finite entries of the rows
    outside ``[begin[b], end[b])`` (NumPy ``[B]``), differentiably (no
    gradient reaches those entries)."""
    n = torch.arange(x.shape[1], device=x.device)[None, :]
    b, e = (torch.as_tensor(v, device=x.device)[:, None] for v in (begin, end))
    return torch.where(((n < b) | (n >= e))[:, :, None] & ~torch.isfinite(x), 0.0, x)


class _AdditiveLogprobs(torch.autograd.Function):
    """``(px [B, S, T], py [B, S + 1, T])`` of the additive joiner ``am[t] +
    lm[s]`` (``am [B, T, C]``, ``lm [B, S + 1, C]``, one dtype): ``px = am[t,
    y_s] + lm[s, y_s] - norm``, ``py = am[t, blank] + lm[s, blank] - norm``,
    ``norm = log R + l_s + a_t`` with ``R = softmax(lm) softmax(am)^T`` (one
    batched matrix product) and ``l``, ``a`` the rows' log-scales
    (:func:`_softmax_scale`: ``norm`` is ``log sum_c exp(am[t, c] + lm[s,
    c])``).  With ``bd`` (the boundary ``[B, 4]`` NumPy, the regular
    topology) ``px`` is ``[B, S, T + 1]``: ``-inf`` at ``t = T`` and at ``t =
    t_end``.  After the product, the compiled score map
    (:func:`~chainfb.transducer.maps.compiled.additive_logprobs`, CPU float32 /
    float64) forms both in one pass, else torch does.

    Backward, with ``g_n = -(g_x + g_y)`` the gradient of ``norm`` and ``W =
    g_n / R``: ``d am = softmax(am) * (W^T softmax(lm))`` and ``d lm =
    softmax(lm) * (W softmax(am))`` (two matrix products; each row's scale
    cancels), plus ``g_x`` scattered to the symbols and the sums of ``g_y``
    to the blank (``g_x`` at the ``-inf`` entries, constants, left out).
    Rows of ``am`` / ``lm`` with a NaN softmax (non-finite padding) take no
    part in the products (:func:`_without_bad_rows`), so they reach no
    other row and get no gradient unless their own cells do."""

    @staticmethod
    def forward(ctx, am, lm, sy, blank, bd):
        B, T, C = am.shape
        S = lm.shape[1] - 1
        am_e, am_scale = _softmax_scale(am)
        lm_e, lm_scale = _softmax_scale(lm)
        am_e, lm_e = _without_bad_rows(am_e, am_scale), _without_bad_rows(lm_e, lm_scale)
        R = torch.bmm(lm_e, am_e.transpose(1, 2)).add_(torch.finfo(am.dtype).tiny)  # [B, S + 1, T]
        if am.device.type == "cpu" and compiled.available(am.dtype):
            px, py = compiled.additive_logprobs(
                torch.log(R).numpy(), am.detach().contiguous().numpy(), lm.detach().contiguous().numpy(),
                am_scale.numpy(), lm_scale.numpy(), sy.numpy(), blank, None if bd is None else bd[:, 3])
            px, py = torch.from_numpy(px), torch.from_numpy(py)
        else:
            norm = torch.log(R).add_(lm_scale).add_(am_scale.transpose(1, 2))
            py = norm.neg().add_(am[:, :, blank][:, None, :]).add_(lm[:, :, blank][:, :, None])
            if S:
                px = torch.gather(am, 2, sy[:, None, :].expand(B, T, S)).transpose(1, 2)
                px = px + (torch.gather(lm[:, :S], 2, sy[:, :, None]) - norm[:, :S])
            else:
                px = am.new_zeros((B, 0, T))
            if bd is not None:
                px = _with_regular_column(px, bd, T)
        ctx.save_for_backward(am_e, lm_e, R, sy, am, lm)  # am, lm: what a second derivative would need
        ctx.blank, ctx.bd = blank, bd
        return px, py

    @staticmethod
    @first_order_backward
    def backward(ctx, gx, gy):
        am_e, lm_e, R, sy = ctx.saved_tensors[:4]
        B, T, C = am_e.shape
        S = lm_e.shape[1] - 1
        gx = R.new_zeros((B, S, T)) if gx is None else gx[:, :, :T]
        bd = ctx.bd
        if bd is not None and (bd[:, 3] < T).any():  # the -inf at t_end: a constant
            gx = gx.clone()
            _regular_column(gx, bd, T, 0.0)
        gy = torch.zeros_like(R) if gy is None else gy
        gn = gy.clone()
        gn[:, :S] += gx
        W = gn.div_(R).neg_()  # d loss / d R
        g_am = torch.bmm(W.transpose(1, 2), lm_e).mul_(am_e)  # [B, T, C]
        g_lm = torch.bmm(W, am_e).mul_(lm_e)  # [B, S + 1, C]
        if S:
            g_am.scatter_add_(2, sy[:, None, :].expand(B, T, S), gx.transpose(1, 2))
            g_lm[:, :S].scatter_add_(2, sy[:, :, None], gx.sum(dim=2, keepdim=True))
        g_am[:, :, ctx.blank] += gy.sum(dim=1)
        g_lm[:, :, ctx.blank] += gy.sum(dim=2)
        return g_am, g_lm, None, None, None


def rnnt_logprobs(am, lm, symbols, blank, boundary=None, rnnt_type="regular", delay_penalty=0.0,
                  lm_only_scale=0.0, am_only_scale=0.0):
    """``(px, py)`` of the grid for the additive joiner ``am[t] + lm[s]``.

    Parameters
    ----------
    am : ``[B, T, C]`` float; lm : ``[B, S + 1, C]`` float.
    symbols : ``[B, S]`` int32/int64; blank : the termination symbol.
    boundary : ``[B, 4]`` or None; rnnt_type, delay_penalty : module docstring.
    lm_only_scale, am_only_scale : k2's smoothing: ``(1 - l - a) *
        combined + l * lm_only + a * am_only`` with ``lm_only`` the
        log-softmax of ``lm`` alone and ``am_only`` the log-softmax of ``am``
        under the batch-average unigram of ``softmax(lm)``; a scale of
        exactly 0 counts as 1e-20 when the other is not 0 (k2).

    Returns
    -------
    px ``[B, S, T + 1]`` (regular) or ``[B, S, T]``; py ``[B, S + 1, T]``.
    """
    _check_type(rnnt_type)
    delay_penalty = _penalty(delay_penalty)
    lm_only_scale = checks.number(lm_only_scale, "lm_only_scale")
    am_only_scale = checks.number(am_only_scale, "am_only_scale")
    am, lm = _float(am, "am", 3), _float(lm, "lm", 3)
    B, T, C = am.shape
    if lm.shape[0] != B or lm.shape[2] != C or lm.shape[1] < 1:
        raise ValueError(f"lm: expected shape ({B}, S + 1, {C}) for am of shape {tuple(am.shape)}, "
                         f"got {tuple(lm.shape)}")
    dtype = torch.promote_types(am.dtype, lm.dtype)
    am, lm = am.to(dtype), lm.to(dtype)
    S = lm.shape[1] - 1
    sy = _symbols(symbols, B, S, C)
    blank = _blank(blank, C)
    _check_frames(rnnt_type, S, T)
    bd = check_boundary(boundary, B, S, T)
    smoothed = bool(lm_only_scale or am_only_scale)
    # the regular column comes with the joiner's (px, py) unless the smoothing terms are added first
    px, py = _AdditiveLogprobs.apply(am, lm, sy, blank, bd if rnnt_type == "regular" and not smoothed else None)
    if smoothed:
        l_s = lm_only_scale or 1e-20
        a_s = am_only_scale or 1e-20
        c_s = 1.0 - lm_only_scale - am_only_scale
        # non-finite padding (frames outside [t_begin, t_end), rows outside [s_begin, s_end]) as 0, so that
        # it reaches no gradient through the normalisers below (lm's padding rows still enter k2's unigram)
        am = _finite_padding(am, bd[:, 1], bd[:, 3])
        lm = _finite_padding(lm, bd[:, 0], bd[:, 2] + 1)
        lm_lp = lm.log_softmax(dim=2)
        unigram = lm.softmax(dim=2).mean(dim=(0, 1)) + torch.finfo(dtype).tiny  # [C]
        log_u = unigram.log()
        am_norm = torch.logsumexp(am + log_u, dim=2)  # [B, T]
        px_lm = torch.gather(lm_lp[:, :S], 2, sy[:, :, None])  # [B, S, 1]
        px_am = torch.gather((am + log_u).transpose(1, 2), 1, sy[:, :, None].expand(B, S, T)) - am_norm[:, None, :]
        py_lm = lm_lp[:, :, blank][:, :, None]
        py_am = (am[:, :, blank] + log_u[blank] - am_norm)[:, None, :]
        px = c_s * px + l_s * px_lm + a_s * px_am
        py = c_s * py + l_s * py_lm + a_s * py_am
    return _finish(px, py, bd, rnnt_type, delay_penalty, T)


def rnnt_logprobs_joint(logits, symbols, blank, boundary=None, rnnt_type="regular", delay_penalty=0.0):
    """``(px, py)`` of the grid from full joiner logits ``[B, T, S + 1, C]``
    (log-softmax over ``C``); arguments as :func:`rnnt_logprobs`."""
    _check_type(rnnt_type)
    delay_penalty = _penalty(delay_penalty)
    x = _float(logits, "logits", 4)
    B, T, S1, C = x.shape
    S = S1 - 1
    sy = _symbols(symbols, B, S, C)
    blank = _blank(blank, C)
    _check_frames(rnnt_type, S, T)
    bd = check_boundary(boundary, B, S, T)
    with_blank = torch.cat([sy, sy.new_full((B, 1), blank)], dim=1)  # [B, S + 1]: each row's symbol
    px, py = _BandLogprobs.apply(x, with_blank[:, None, :].expand(B, T, S + 1), blank)  # [B, T, S + 1] each
    return _finish(px[:, :, :S].transpose(1, 2).contiguous(), py.transpose(1, 2).contiguous(), bd, rnnt_type,
                   delay_penalty, T)


def _check_ranges(ranges, B, T, S):
    checks.tensor(ranges, "ranges", checks.INTS)
    if ranges.dim() != 3 or tuple(ranges.shape[:2]) != (B, T) or ranges.shape[2] < 1:
        raise ValueError(f"ranges: expected shape ({B}, {T}, s_range >= 1), got {tuple(ranges.shape)}")
    if ranges.numel():
        lo, hi = int(ranges.min()), int(ranges.max())
        if lo < 0 or hi > S:
            raise ValueError(f"ranges: symbol positions must lie in [0, S={S}], got [{lo}, {hi}]")
    return ranges.to(torch.int64)


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


class _BandLogprobs(torch.autograd.Function):
    """``(px_band, py_band)`` from band logits ``x [B, T, R, C]`` (or the full
    joiner output, ``R = S + 1``) and each cell's symbol ``sym [B, T, R]``:
    ``log_softmax(x)`` at the symbol and at the blank.  Backward: ``d x =
    onehot(sym) g_x + onehot(blank) g_y - softmax(x) (g_x + g_y)``, formed in
    one tensor (no dense gradient per gather); 0 in the cells that no
    gradient reaches, whatever their logits."""

    @staticmethod
    def forward(ctx, x, sym, blank):
        lsm = torch.log_softmax(x, dim=3)
        px, py = torch.gather(lsm, 3, sym[..., None])[..., 0], lsm[..., blank]
        ctx.save_for_backward(lsm, sym, px, py)
        ctx.blank = blank
        return px, py

    @staticmethod
    @first_order_backward
    def backward(ctx, gx, gy):
        lsm, sym, px, py = ctx.saved_tensors
        gx = torch.zeros_like(gy) if gx is None else gx
        gy = torch.zeros_like(gx) if gy is None else gy
        out = torch.exp(lsm)
        out.mul_(-(gx + gy)[..., None])
        # a cell with a NaN or +inf logit, or only -inf ones, has a NaN softmax (and a px or py that is not
        # finite): where no gradient reaches it (padding) its gradient is 0, not 0 * NaN
        idle = (gx == 0) & (gy == 0) & ~(torch.isfinite(px) & torch.isfinite(py))
        if out.is_cuda:  # (no device read on the GPU)
            out.masked_fill_(idle[..., None], 0.0)
        elif bool(idle.any()):
            out[idle] = 0.0
        out.scatter_add_(3, sym[..., None], gx[..., None])
        out[..., ctx.blank] += gy
        return out, None, None


def _band_logprobs(x, sy, rg, blank):
    """``(px_band, py_band)`` ``[B, T, R]``: the symbol and blank
    log-probabilities of the band's cells ``(ranges[b, t, k], t)``."""
    B, T, R, C = x.shape
    with_blank = torch.cat([sy, sy.new_full((B, 1), blank)], dim=1)  # [B, S + 1]
    sym = torch.gather(with_blank, 1, rg.reshape(B, T * R)).reshape(B, T, R)
    return _BandLogprobs.apply(x, sym, blank)


def _band_to_grid(px_band, py_band, rg, S, fill=-np.inf):
    """Band values ``[B, T, R]`` into the full grids ``[B, S, T]`` and ``[B,
    S + 1, T]`` (``fill`` elsewhere; position ``S`` of ``px`` is dropped)."""
    B, T, R = px_band.shape
    idx = rg.transpose(1, 2)  # [B, R, T]
    px = px_band.new_full((B, S + 1, T), fill).scatter(1, idx, px_band.transpose(1, 2))[:, :S]
    py = py_band.new_full((B, S + 1, T), fill).scatter(1, idx, py_band.transpose(1, 2))
    return px, py


def rnnt_logprobs_pruned(logits, symbols, ranges, blank, boundary=None, rnnt_type="regular", delay_penalty=0.0):
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


def _reverse_cummin(x, dim):
    return torch.flip(torch.cummin(torch.flip(x, (dim,)), dim=dim)[0], (dim,))


def _s_range_needs(bd: np.ndarray) -> np.ndarray:
    """``[B]``: each row's narrowest regular band, ``(S_b - 1) // T_b + 2``
    (1 for rows with ``S_b = 0`` or ``T_b = 0``)."""
    S_b, T_b = bd[:, 2], bd[:, 3]
    live = (S_b >= 1) & (T_b >= 1)
    return np.where(live, (S_b - 1) // np.maximum(T_b, 1) + 2, 1)


def min_s_range(boundary) -> int:
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


def prune_ranges(px_grad, py_grad, boundary, s_range: int, *, band_scores: str = "float64"):
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


def ranges_from_starts(start, bd: np.ndarray, s_range: int, modified: bool):
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


def prune(am, lm, ranges):
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


def boundary_from_lengths(logit_lengths, target_lengths, T: int | None = None, U: int | None = None) -> torch.Tensor:
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


def simple_rnnt_loss(am, lm, targets, logit_lengths, target_lengths, blank, rnnt_type="regular",
                     delay_penalty=0.0, lm_only_scale=0.0, am_only_scale=0.0, reduction="mean",
                     return_grad=False):
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


def pruned_rnnt_loss(logits, targets, ranges, logit_lengths, target_lengths, blank, rnnt_type="regular",
                     delay_penalty=0.0, reduction="mean", return_grad=False):
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


def grid_rnnt_loss(logits, targets, logit_lengths, target_lengths, blank, rnnt_type="regular", delay_penalty=0.0,
                   reduction="mean", return_grad=False):
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
