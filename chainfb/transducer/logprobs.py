"""The arc log-probs ``px``/``py`` of the ``(s, t)`` grid from a joiner, for
the pruned RNN-T family (:mod:`chainfb.transducer.pruned`, whose docstring
gives the definitions): the argument checks shared by the family, the
topologies' fixes (the regular topology's last column, ``"constrained"``,
the delay penalty), the additive joiner ``am[t] + lm[s]`` of the simple
loss (:func:`rnnt_logprobs`, its normaliser a product of exponentials) and
full joiner logits (:func:`rnnt_logprobs_joint`), both through one
autograd Function each.
"""

from __future__ import annotations


import numpy as np
import torch

from .._arrays import Array
from .. import checks
from ..criterion import first_order_backward
from .maps import compiled
from .grid import check_boundary

__all__ = ["RNNT_TYPES", "rnnt_logprobs", "rnnt_logprobs_joint", "add_delay_penalty"]

RNNT_TYPES = ("regular", "modified", "constrained")


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


def add_delay_penalty(px: torch.Tensor, boundary: np.ndarray, delay_penalty: float, num_frames: int) -> torch.Tensor:
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


def rnnt_logprobs(am: torch.Tensor, lm: torch.Tensor, symbols: torch.Tensor, blank: int, boundary: Array | None = None,
                  rnnt_type: str = "regular", delay_penalty: float = 0.0, lm_only_scale: float = 0.0,
                  am_only_scale: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
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


def rnnt_logprobs_joint(logits: torch.Tensor, symbols: torch.Tensor, blank: int, boundary: Array | None = None,
                        rnnt_type: str = "regular", delay_penalty: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
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
