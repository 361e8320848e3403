"""The torch backend of the transducer score maps: torch operations on any
device and dtype (float16 and bfloat16 compute in float32), for the
criteria the other backends do not serve (float16, bfloat16, CPU without
Numba, CUDA tensors of a grid).  Same functions and signatures as every
backend (:mod:`chainfb.transducer.maps`).

Gathers read the layout's index tables (:func:`~chainfb.transducer.maps.layout_tables`,
cached per device and stream): a call uploads no metadata.  On the CPU a call
converts the gathered scores to NumPy once and the engine's log-likelihoods
and posteriors back once each; everything else stays in torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..._arrays import Array, as_array, wrap_like
from . import as_tensor, layout_tables, torch_compute_dtype

if TYPE_CHECKING:
    from ..criterion import TransducerCriterion
    from ..grid import BandGridCriterion, GridCriterion
    from ..tdt import TDTCriterion

__all__ = ["ScoreMapState", "rnnt_gather", "rnnt_gradient", "tdt_gather", "tdt_gradient", "grid_gather",
           "grid_gradient"]


@dataclass
class ScoreMapState:
    """What :func:`_torch_gather` keeps for :func:`_torch_gradient`.

    ``work``: ``[B, T, U, V]`` compute-dtype buffer holding the softmax
    (becomes the gradient; zeros when not fused) or ``None``; ``tables``:
    the layout's torch index tables (:func:`layout_tables`: engine
    coordinates ``rows``/``cols``, flat ``(b, t, u)`` ``cells`` and arc
    ``kinds`` of every gathered entry ``[E]``); ``elems``: flat
    ``(b, t, u, sym)`` index ``[E]``.
    """

    work: torch.Tensor | None
    tables: dict
    elems: torch.Tensor
    shape: tuple
    fused: bool


def _torch_gather(logits: torch.Tensor, sym: torch.Tensor, layout, fused_log_softmax: bool = True,
                  need_gradient: bool = True):
    """Engine scores of a compiled transducer batch (torch backend).

    Parameters
    ----------
    logits : ``[B, T, U, V]`` CPU tensor (any float dtype; read, never
        written; a non-contiguous tensor is copied once).
    sym : ``[B, U, J]`` int symbol table (:func:`symbol_table`).
    layout : the batch's :class:`~chainfb.transducer.graphs.TransducerLayout`.

    Returns
    -------
    X : float64 NumPy ``[num_steps, C]`` and a :class:`ScoreMapState`.
    """
    B, T, U1, V = logits.shape
    x = logits.detach()
    if not x.is_contiguous():  # flat indexing below; a non-contiguous input costs one copy
        x = x.contiguous()
    ct = torch_compute_dtype(x.dtype)
    work = None
    if fused_log_softmax:
        if need_gradient:
            # the one new 4-D tensor: softmax (one fused pass), later turned into the gradient
            mx = x.amax(dim=-1).to(ct)
            work = torch.softmax(x, dim=-1, dtype=ct)
            # normaliser from the row maximum, whose probability (>= 1/V) never underflows
            norm = mx - work.amax(dim=-1).log_()
            bad_rows = ~torch.isfinite(mx)
            if bool(bad_rows.any()):  # all -inf / inf / NaN rows: no usable softmax there (CPU: no sync cost)
                work[bad_rows] = 0.0
        else:
            norm = torch.logsumexp(x.to(ct) if x.dtype != ct else x, dim=-1)
    elif need_gradient:
        work = torch.zeros((B, T, U1, V), dtype=ct)

    tab = layout_tables(layout, x.device, T)
    symbols = sym.to(x.device).reshape(-1).index_select(0, tab["slots"]).to(torch.int64)
    if bool((symbols < 0).any()):
        raise ValueError("sym: an arc of the graph reads no symbol (-1 in the symbol table)")
    elems = tab["cells"] * V + symbols
    vals = x.reshape(-1).index_select(0, elems).to(torch.float64)
    if fused_log_softmax:
        vals -= norm.reshape(-1).index_select(0, tab["cells"]).to(torch.float64)
    X = torch.full((layout.num_steps, layout.lat.num_columns), -np.inf, dtype=torch.float64)
    X.view(-1)[tab["flat"]] = vals
    return X.numpy(), ScoreMapState(work, tab, elems, (B, T, U1, V), fused_log_softmax)


def _torch_gradient(state: ScoreMapState, post, kind_weight, clamp: float = -1.0, zero_samples=None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gradient ``[B, T, U, V]`` (module docstring), written into ``state.work``.

    ``post`` float64 ``[num_steps, C]`` engine posteriors (NumPy, converted
    once, or a tensor); ``kind_weight`` ``[J]``.  ``clamp > 0`` clamps every
    element to ``[-clamp, clamp]``; ``zero_samples`` bool ``[B]`` (tensor
    or NumPy) zeroes whole samples (non-finite costs).  Returned in
    ``out_dtype`` (default: the compute dtype).
    """
    B, T, U1, V = state.shape
    g = state.work
    if g is None:
        raise ValueError("state: the gather ran without need_gradient")
    tab = state.tables
    P = post if isinstance(post, torch.Tensor) else torch.from_numpy(np.asarray(post))
    kw = torch.tensor(np.asarray(kind_weight, dtype=np.float64).tolist(), dtype=torch.float64)
    w = P.reshape(-1).index_select(0, tab["flat"]) * kw[tab["kinds"]]
    if state.fused:
        occ = torch.zeros(B * T * U1, dtype=torch.float64).index_add_(0, tab["cells"], w)
        g.mul_(occ.to(g.dtype).view(B, T, U1, 1))  # softmax * occupancy; cells never visited get exactly 0
    g.view(-1).index_add_(0, state.elems, w.to(g.dtype), alpha=-1)
    if clamp is not None and clamp > 0:
        g.clamp_(-clamp, clamp)
    if zero_samples is not None:
        z = zero_samples if isinstance(zero_samples, torch.Tensor) else torch.tensor(
            np.asarray(zero_samples, dtype=bool).tolist(), dtype=torch.bool)
        if bool(z.any()):  # a CPU tensor: no sync to avoid, and a pass over the gradient saved
            g[z] = 0.0
    if out_dtype is not None and out_dtype != g.dtype:
        g = g.to(out_dtype)
    state.work = None
    return g


def rnnt_gather(crit: TransducerCriterion, x: torch.Tensor, need_grad: bool) -> tuple:
    """``(X [num_steps, C] float64 NumPy, ScoreMapState)`` of an RNN-T /
    multi-blank criterion over logits ``x [B, T, U1, V]``."""
    return _torch_gather(x, crit.sym, crit.layout, crit.fused, need_grad)


def rnnt_gradient(crit: TransducerCriterion, x: torch.Tensor, loglike: Array, post: Array, state: Any) -> torch.Tensor:
    """The gradient ``[B, T, U1, V]`` in ``x``'s dtype (zero for utterances whose ``loglike`` is not finite)."""
    bad = ~torch.isfinite(torch.from_numpy(np.asarray(loglike)))
    return _torch_gradient(state, post, crit.kind_weight, crit.clamp, bad, out_dtype=x.dtype)


def _token_exp(x: torch.Tensor, V: int, out: torch.Tensor) -> tuple:
    """``exp(x - max)`` of the token logits ``x[..., :V]`` (``x [B, T, U1, V +
    D]`` contiguous) written into ``out[..., :V]`` (``out`` the same shape,
    the compute dtype): the token softmax times its row sum.  Returns
    ``(norm, total)`` ``[B, T, U1]`` in the compute dtype: the
    log-normaliser ``max + log(total)`` and the row sums (the softmax is
    ``out[..., :V] / total``).

    The subtraction and the exponential run over whole contiguous rows of
    ``out`` (its duration columns get values that are never read: the
    gradient overwrites them), which is several times faster than over the
    strided token columns.  Rows whose maximum is not finite (all ``-inf``,
    ``inf``, NaN) get it as their normaliser, zeros in ``out`` and a row sum
    of 1 (their utterances get a non-finite cost)."""
    VD = x.shape[-1]
    xr, orow = x.view(-1, VD), out.view(-1, VD)
    mx = xr[:, :V].amax(dim=-1)
    torch.sub(xr, mx[:, None], out=orow)
    orow.exp_()
    ov = orow[:, :V]
    total = ov.sum(dim=-1)
    mx = mx.to(out.dtype)
    ok = torch.isfinite(mx)
    norm = torch.where(ok, mx + total.log(), mx)
    if x.device.type != "cpu":
        ov.masked_fill_(~ok[:, None], 0.0)
        total.masked_fill_(~ok, 1.0)
    elif not bool(ok.all()):  # a CPU tensor: no sync to avoid
        ov[~ok] = 0.0
        total[~ok] = 1.0
    return norm.view(x.shape[:-1]), total.view(x.shape[:-1])




def _tdt_symbols(crit, dev, T: int) -> torch.Tensor:
    """``[B, T, U1, 2]`` int64: the blank and the label read at each ``(b, t, u)`` (an expanded view)."""
    lab = crit.labels.to(dev)
    both = torch.stack([torch.full_like(lab, crit.blank), lab], dim=-1)  # [B, U1, 2]
    return both[:, None].expand(lab.shape[0], T, lab.shape[1], 2)


def tdt_gather(crit: TDTCriterion, x: torch.Tensor, need_grad: bool) -> tuple:
    """``(X [num_steps, C] float64, state)`` of a TDT criterion over logits ``x [B, T, U1, V + D]``."""
    B, T, U1, VD = x.shape
    V = crit.V
    dev = x.device
    xd = x.detach()
    if not xd.is_contiguous():
        xd = xd.contiguous()
    ct = torch_compute_dtype(x.dtype)
    if need_grad:
        work = torch.empty((B, T, U1, VD), dtype=ct, device=dev)  # becomes the gradient
        tok_norm, tok_total = _token_exp(xd, V, work)
    else:
        tok_norm, tok_total = torch.logsumexp(xd[..., :V].to(ct), dim=-1), None
    # durations: [B, T, U1, D], small; log-softmax in float64 (non-finite rows: x - their normaliser)
    dx = xd[..., V:].to(torch.float64, copy=True)
    dur_norm = torch.logsumexp(dx, dim=-1, keepdim=True)
    dur = dx.sub_(dur_norm)
    state = (work, tok_total, dur, dur_norm) if need_grad else None
    # the blank and the label at every (b, t, u), in one gather: [B, T, U1, 2]
    tok = xd[..., :V].gather(-1, _tdt_symbols(crit, dev, T)).to(torch.float64)
    tok -= (tok_norm.to(torch.float64) + crit.sigma)[..., None]
    S = tok[..., :, None] + dur[..., None, :]  # [B, T, U1, 2, D]
    tab = layout_tables(crit.layout, dev, T)
    X = torch.full((crit.layout.num_steps, crit.lattice.num_columns), -np.inf, dtype=torch.float64, device=dev)
    X.view(-1)[tab["flat"]] = S.reshape(-1).index_select(0, tab["arcs"])
    return as_array(X, "logits")[0], state


def tdt_gradient(crit: TDTCriterion, x: torch.Tensor, loglike: Array, post: Array, state: Any) -> torch.Tensor:
    """The TDT gradient ``[B, T, U1, V + D]`` in ``x``'s dtype (:mod:`chainfb.transducer.tdt`)."""
    g, tok_total, dur, dur_norm = state
    B, T, U1, VD = x.shape
    V, D = crit.V, len(crit.durations)
    dev = x.device
    ll = as_tensor(loglike, dev)
    tab = layout_tables(crit.layout, dev, T)
    sidx = tab["arcs"]
    P = as_tensor(post, dev)
    A = torch.zeros(B * T * U1 * 2 * D, dtype=torch.float64, device=dev)
    A[sidx] = P.reshape(-1).index_select(0, tab["flat"])
    # impossible utterances (non-finite cost): no posteriors, so a zero gradient (the softmaxes are finite)
    A = torch.where(torch.isfinite(ll).view(-1, 1), A.view(B, -1), 0.0).view(B, T, U1, 2, D)
    # sums over the durations as one matrix-vector product (torch's reductions over a short last dim are slow)
    Pk = (A.view(-1, D) @ torch.ones(D, dtype=torch.float64, device=dev)).view(B, T, U1, 2)  # blank, label
    occ = Pk[..., 0] + Pk[..., 1]  # Pb + Pl
    Pd = A[..., 0, :] + A[..., 1, :]  # [B, T, U1, D]: both kinds of each duration
    Pk[..., 1] *= 1.0 + crit.fastemit_lambda  # FastEmit scales the label's token terms
    ct = g.dtype
    tokg = g[..., :V]
    w = Pk[..., 0] + Pk[..., 1]
    tokg.mul_((w / tok_total.to(torch.float64)).to(ct)[..., None])  # softmax * (Pb + (1 + l) Pl)
    # minus Pb at the blank and (1 + l) Pl at the label (where u >= U_b the "label" is the blank, weight 0)
    tokg.scatter_add_(-1, _tdt_symbols(crit, dev, T), (-Pk).to(ct))
    if crit.clamp > 0:
        tokg.clamp_(-crit.clamp, crit.clamp)
    # durations: softmax * (Pb + Pl) - P_i (the plain derivative, no FastEmit); rows without a
    # finite normaliser have a softmax of 0
    dsm = torch.where(torch.isfinite(dur_norm), dur.exp(), 0.0)
    g[..., V:] = dsm * occ[..., None] - Pd
    return g.to(x.dtype) if g.dtype != x.dtype else g


def _scores(sources, gather, shape):
    """The engine's float64 scores ``[rows, C]``: ``gather`` into the
    concatenation of the flattened ``sources`` and ``-inf``."""
    first = sources[0]
    sizes = [x.numel() for x in sources]
    ext = torch.empty(sum(sizes) + 1, dtype=torch.float64, device=first.device)
    o = 0
    for x, n in zip(sources, sizes):
        ext[o:o + n] = x.detach().reshape(-1)  # the float64 cast, once per element
        o += n
    ext[o] = -np.inf
    return torch.index_select(ext, 0, gather).view(shape)


def grid_gather(crit: GridCriterion | BandGridCriterion, x: tuple, need_grad: bool) -> tuple:
    """``(X, None)`` of a grid criterion over ``(px, py)`` through its score
    plan ``crit.plan`` (one gather from the sources and ``-inf``)."""
    px, py = x
    shape = (crit.plan.num_rows, crit.lattice.num_columns)
    X = _scores((px, py), crit.plan.on(px.device)[0], shape)
    return as_array(X, crit.name)[0], None


def grid_gradient(crit: GridCriterion | BandGridCriterion, x: tuple, loglike: Array, post: Array, state: Any) -> tuple:
    """``(px_grad, py_grad)``: the engine's posteriors scattered back through the plan (0 on no arc)."""
    px, py = x
    P = wrap_like(post, px) if not isinstance(post, np.ndarray) else torch.from_numpy(post)
    P = P.reshape(-1).to(px.device)
    if not P.numel():  # no step at all (every grid a single point): no arc, so no gradient
        return tuple(torch.zeros_like(src) for src in x)
    grads = []
    for src, entry in zip(x, crit.plan.on(px.device)[1:]):
        g = torch.index_select(P, 0, entry.clamp(min=0)).masked_fill_(entry < 0, 0.0)
        grads.append(g.to(src.dtype).view(src.shape))
    return tuple(grads)
