"""The transducer score map: fused log-softmax + skewed gather from the 4-D
logits into the engine's compact score matrix, and the matching one-pass
gradient.

Column ``c = colidx[b, u, j]`` of the engine's ``X[n, c]`` holds
``lp[b, t = n - u, u, sym_j]`` for ``t`` in ``[0, T_b)`` and ``-inf``
elsewhere, where ``lp = logits - logsumexp_V(logits)`` (or the logits
themselves when ``fused_log_softmax=False``), ``sym_0`` = blank,
``sym_1 = targets[b, u]``, ``sym_{2+i}`` = big blank ``i``.  The zero pdf's
column scores 0 at every step.

The gradient w.r.t. the logits, written into one new tensor the size of the
logits (the buffer that held the softmax during the gather), is::

    grad[b,t,u,k] = softmax_k(b,t,u) * occ(t,u) - sum_j w_j(t,u) [k == sym_j]
    w_j = post_j * (1 + lambda [j == label]),   occ = sum_j w_j

(``post_j(t, u)`` = engine posterior of column ``(b, u, j)`` at step
``t + u``; ``lambda`` = FastEmit, which adds ``lambda * softmax * post_label``
and scales the label term, as NeMo does).  Nothing else 4-D is built: the
normaliser is kept per ``(b, t, u)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..lattice import concat_ranges
from .graphs import TransducerLayout

__all__ = ["ScoreMapState", "gather", "gradient", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, float16 and bfloat16 compute in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class ScoreMapState:
    """What :func:`gather` keeps for :func:`gradient`.

    ``work``: ``[B, T, U, V]`` compute-dtype buffer holding the softmax
    (becomes the gradient; zeros when not fused) or ``None``;
    ``norm``: ``[B, T, U]`` log-softmax normaliser (zeros when not fused);
    ``rows``/``cols``: engine coordinates ``(n, c)`` of every gathered entry
    ``[E]``; ``cells``: flat ``(b, t, u)`` index ``[E]``; ``elems``: flat
    ``(b, t, u, sym)`` index ``[E]``; ``is_label``: bool ``[E]``.
    """

    work: torch.Tensor | None
    norm: torch.Tensor
    rows: np.ndarray
    cols: np.ndarray
    cells: np.ndarray
    elems: np.ndarray
    is_label: np.ndarray
    shape: tuple
    fused: bool


def gather(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: np.ndarray,
    layout: TransducerLayout,
    blank: int,
    big_blanks=(),
    fused_log_softmax: bool = True,
    need_gradient: bool = True,
):
    """Engine scores of a compiled transducer batch.

    Parameters
    ----------
    logits : ``[B, T, U, V]`` tensor (any float dtype; read, never written;
        a non-contiguous tensor is copied once).
    targets : ``[B, >= U - 1]`` integer tensor.
    logit_lengths : int64 ``[B]`` (NumPy).
    layout : the batch's :class:`TransducerLayout`.
    blank : standard blank index; ``big_blanks`` : vocabulary index of big blank ``i``.

    Returns
    -------
    X : float64 NumPy ``[num_steps, C]`` and a :class:`ScoreMapState`.
    """
    B, T, U1, V = logits.shape
    x = logits.detach()
    if not x.is_contiguous():  # flat indexing below; a non-contiguous input costs one copy
        x = x.contiguous()
    ct = compute_dtype(x.dtype)
    work = None
    if fused_log_softmax:
        if need_gradient:
            # the one new 4-D tensor: softmax (one fused pass), later turned into the gradient
            mx = x.amax(dim=-1).to(ct)
            work = torch.softmax(x, dim=-1, dtype=ct)
            # normaliser from the row maximum, whose probability (>= 1/V) never underflows
            norm = mx - work.amax(dim=-1).log_()
            bad_rows = ~torch.isfinite(mx)
            if bool(bad_rows.any()):  # all -inf / inf / NaN rows: no usable softmax there
                work[bad_rows] = 0.0
        else:
            norm = torch.logsumexp(x.to(ct) if x.dtype != ct else x, dim=-1)
    else:
        norm = torch.zeros((B, T, U1), dtype=ct)
        if need_gradient:
            work = torch.zeros((B, T, U1, V), dtype=ct)

    lat = layout.lat
    r = layout.real
    b, u, j = layout.col_b[r], layout.col_u[r], layout.col_j[r]
    Tb = np.asarray(logit_lengths, dtype=np.int64)[b]
    # every (column, t) with t in [0, T_b)
    which = np.repeat(np.arange(len(r)), Tb)
    t = concat_ranges(np.zeros(len(r), dtype=np.int64), Tb) if len(r) else np.zeros(0, dtype=np.int64)
    tg = targets.detach().cpu().to(torch.int64).numpy()
    nb = len(big_blanks)
    symtab = np.empty(len(r), dtype=np.int64)
    symtab[j == 0] = blank
    lab = j == 1
    symtab[lab] = tg[b[lab], u[lab]] if lab.any() else 0
    for i in range(nb):
        symtab[j == 2 + i] = big_blanks[i]
    cw, uw = b[which], u[which]
    cells = (cw * T + t) * U1 + uw
    elems = cells * V + symtab[which]
    rows = t + uw
    cols = r[which]
    ei = torch.from_numpy(elems)
    vals = x.reshape(-1).index_select(0, ei).to(torch.float64)
    if fused_log_softmax:
        vals -= norm.reshape(-1).index_select(0, torch.from_numpy(cells)).to(torch.float64)
    X = np.full((layout.num_steps, lat.num_columns), -np.inf)
    X[rows, cols] = vals.numpy()
    X[:, layout.col_j < 0] = 0.0
    state = ScoreMapState(work, norm, rows, cols, cells, elems, lab[which], (B, T, U1, V), fused_log_softmax)
    return X, state


def gradient(
    state: ScoreMapState,
    post: np.ndarray,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
    zero_samples: np.ndarray | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Gradient ``[B, T, U, V]`` of ``-loglike`` w.r.t. the logits (FastEmit
    version when ``fastemit_lambda > 0``), written into ``state.work``.

    ``post`` float64 ``[num_steps, C]`` engine posteriors.  ``clamp > 0``
    clamps every element to ``[-clamp, clamp]``; ``zero_samples`` bool
    ``[B]`` zeroes whole samples (non-finite costs).  Returned in
    ``out_dtype`` (default: the compute dtype).
    """
    B, T, U1, V = state.shape
    g = state.work
    if g is None:
        raise ValueError("state: gather() was called with need_gradient=False")
    w = post[state.rows, state.cols]
    if fastemit_lambda:
        w = np.where(state.is_label, w * (1.0 + fastemit_lambda), w)
    wt = torch.from_numpy(w).to(g.dtype)
    if state.fused:
        occ = np.bincount(state.cells, weights=w, minlength=B * T * U1)
        occ_t = torch.from_numpy(occ).to(g.dtype).view(B, T, U1)
        g.mul_(occ_t.unsqueeze(-1))  # softmax * occupancy; cells never visited get exactly 0
    g.view(-1).index_add_(0, torch.from_numpy(state.elems), wt, alpha=-1)
    if clamp is not None and clamp > 0:
        g.clamp_(-clamp, clamp)
    if zero_samples is not None and zero_samples.any():
        g[torch.from_numpy(np.asarray(zero_samples, dtype=bool))] = 0.0
    if out_dtype is not None and out_dtype != g.dtype:
        g = g.to(out_dtype)
    state.work = None
    return g
