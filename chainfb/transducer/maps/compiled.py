"""The compiled backend of the transducer score maps (CPU tensors of float32
or float64 with Numba): the gather and the gradient of RNN-T / multi-blank,
TDT and the ``(px, py)`` grids as one pass each over the logits, through the
kernels of :mod:`~chainfb.transducer.maps.cells`.  The backend functions
(``rnnt_gather``, ``rnnt_gradient``, ``tdt_gather``, ``tdt_gradient``,
``grid_gather``, ``grid_gradient``) have the signatures every backend shares
(:mod:`chainfb.transducer.maps`); the functions below them take NumPy arrays
(``additive_logprobs`` also serves the pruned family's joiner).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import DTypeLike

from ...engines import numba_log
from ..._arrays import Array
from ..graphs import TransducerLayout
from . import cells

if TYPE_CHECKING:
    from ..criterion import TransducerCriterion
    from ..grid import BandGridCriterion, GridCriterion
    from ..tdt import TDTCriterion

__all__ = ["available", "new_gradient", "rnnt_gather", "rnnt_gradient", "tdt_gather", "tdt_gradient", "grid_gather",
           "grid_gradient", "additive_logprobs"]


def available(dtype: torch.dtype | None = None) -> bool:
    """Whether the compiled score maps can run (Numba present and not
    disabled, see :mod:`chainfb.engines.numba_log`), for logits of torch
    ``dtype`` when given (float32 and float64 only)."""
    if not numba_log.available():
        return False
    if dtype is None:
        return True
    return dtype in (torch.float32, torch.float64)


def new_gradient(shape: tuple[int, ...], dtype: torch.dtype) -> tuple:
    """A zero CPU tensor of ``shape`` and torch ``dtype`` for a gradient the
    kernels write, and the NumPy array it views.  The memory comes from
    ``np.zeros``: a large block is fresh zero pages from the OS, which the
    kernels leave untouched where the gradient is 0 (cells no arc reads:
    the padding of a batch), so those pages are never faulted in or
    written; NumPy also asks Linux for transparent huge pages, so the pages
    written take a few hundred faults instead of one per 4 KiB."""
    a = np.zeros(shape, dtype=np.float32 if dtype == torch.float32 else np.float64)
    return torch.from_numpy(a), a


def _numpy(x: torch.Tensor) -> np.ndarray:
    """The C-contiguous NumPy view of CPU tensor ``x`` (one copy when it is not contiguous)."""
    return x.detach().contiguous().numpy()


def _zero_rows(loglike) -> np.ndarray:
    """bool ``[B]``: the utterances whose log-likelihood is not finite (a zero gradient)."""
    return ~np.isfinite(np.asarray(loglike))


def rnnt_gather(crit: TransducerCriterion, x: torch.Tensor, need_grad: bool) -> tuple:
    """``(X [num_steps, C] float64, state)`` of an RNN-T / multi-blank criterion
    (:class:`~chainfb.transducer.TransducerCriterion`) over CPU logits ``x [B, T, U1, V]``."""
    xn = _numpy(x)
    sym = crit.host_sym if crit.host_sym is not None else crit.sym.cpu().numpy()
    grad, out = new_gradient(xn.shape, x.dtype) if need_grad else (None, None)
    X, norm, inv = rnnt_scores(xn, sym, crit.layout, crit.fused, out)
    return X, (xn, sym, norm, inv, grad, out)


def rnnt_gradient(crit: TransducerCriterion, x: torch.Tensor, loglike: Array, post: Array, state: Any) -> torch.Tensor:
    """The gradient ``[B, T, U1, V]`` (``x``'s dtype) from :func:`rnnt_gather`'s ``state``."""
    xn, sym, norm, inv, grad, out = state
    rnnt_grad(xn, sym, crit.layout, norm, inv, post, crit.kind_weight, _zero_rows(loglike), crit.clamp, crit.fused,
              out, kept=True)
    return grad


def tdt_gather(crit: TDTCriterion, x: torch.Tensor, need_grad: bool) -> tuple:
    """``(X, state)`` of a TDT criterion (:class:`~chainfb.transducer.TDTCriterion`)
    over CPU logits ``x [B, T, U1, V + D]``."""
    xn = _numpy(x)
    labels = crit.labels.cpu().numpy()
    grad, out = new_gradient(xn.shape, x.dtype) if need_grad else (None, None)
    X, inv = tdt_scores(xn, crit.V, crit.blank, labels, crit.layout, crit.sigma, out)
    return X, (labels, inv, grad, out)


def tdt_gradient(crit: TDTCriterion, x: torch.Tensor, loglike: Array, post: Array, state: Any) -> torch.Tensor:
    """The TDT gradient ``[B, T, U1, V + D]`` from :func:`tdt_gather`'s ``state``."""
    labels, inv, grad, out = state
    tdt_grad(crit.V, crit.blank, labels, crit.layout, inv, post, _zero_rows(loglike), crit.fastemit_lambda,
             crit.clamp, out)
    return grad


def grid_gather(crit: GridCriterion | BandGridCriterion, x: tuple, need_grad: bool) -> tuple:
    """``(X, None)`` of a grid criterion over CPU ``(px, py)`` (its score plan
    ``crit.plan``: the full grid's or a band's)."""
    px, py = (_numpy(t) for t in x)
    plan = crit.plan
    shape = (plan.num_rows, plan.num_columns)
    if plan.full_grid:
        return grid_scores(px, py, plan.boundary, plan.layout.colidx, plan.modified, shape), None
    return planned_scores((px, py), (plan.px, plan.py), shape), None


def grid_gradient(crit: GridCriterion | BandGridCriterion, x: tuple, loglike: Array, post: Array, state: Any) -> tuple:
    """``(px_grad, py_grad)`` (CPU tensors) of a grid criterion from the engine's posteriors."""
    px, py = (t.detach() for t in x)
    plan = crit.plan
    post = np.asarray(post)
    if plan.full_grid:
        grads = grid_gradients(post, plan.boundary, plan.layout.colidx, plan.modified, px.shape, py.shape,
                               py.numpy().dtype)
    else:
        grads = tuple(planned_gradient(post, entry, src.shape, src.numpy().dtype)
                      for src, entry in zip((px, py), (plan.px, plan.py)))
    return tuple(map(torch.from_numpy, grads))


def _grid(layout, T: int, x: np.ndarray) -> tuple:
    """``(colidx, counts)`` of ``layout`` as int64 NumPy and the scores
    matrix ``X [num_steps, C]`` of ``-inf`` for logits with ``T`` frames."""
    X = np.full((layout.num_steps, layout.lat.num_columns), -np.inf)
    counts = layout.slot_counts()  # at most T_b <= T
    if counts.shape[1] != x.shape[2]:
        raise ValueError(f"logits: {x.shape[2]} label positions, the layout has {counts.shape[1]}")
    return layout.colidx, counts, X


def _no_rows(x: np.ndarray) -> np.ndarray:
    """A stand-in for the gradient when the gather keeps no rows."""
    return np.zeros((1, 1, 1, 1), dtype=x.dtype)


def rnnt_scores(x: np.ndarray, sym: np.ndarray, layout: TransducerLayout, fused: bool,
                out: np.ndarray | None = None) -> tuple:
    """Engine scores of an RNN-T / multi-blank batch.

    x : ``[B, T, U1, V]`` float32/float64 C-contiguous NumPy logits;
    sym : int ``[B, U1, J]`` (:func:`~chainfb.transducer.criterion.symbol_table`);
    layout : the batch's :class:`~chainfb.transducer.graphs.TransducerLayout`;
    out : the gradient-to-be (:func:`new_gradient`, zero) or None: when
        given (and ``fused``), the rows' exponentials are left there and
        :func:`rnnt_grad` scales them instead of recomputing them.

    Returns ``X`` float64 ``[num_steps, C]`` and the cells' log-normalisers
    and softmax factors, float64 ``[B * T * U1]`` each (for :func:`rnnt_grad`)."""
    B, T, U1, V = x.shape
    colidx, counts, X = _grid(layout, T, x)
    norm, inv = np.zeros(B * T * U1), np.zeros(B * T * U1)
    sym = np.ascontiguousarray(sym, dtype=np.int64)
    keep = out is not None and bool(fused)
    S = np.empty((B * T * U1, colidx.shape[2]))
    cells.run(cells.rnnt_gather_cells, B * T * U1, x, sym, counts, bool(fused), x.dtype == np.float32, S, norm, inv,
           out if keep else _no_rows(x), keep)
    cells.run(cells.move_blocks, cells.blocks(B, T), S, colidx, counts, T, X, True)
    return X, norm, inv


def rnnt_grad(x: np.ndarray, sym: np.ndarray, layout: TransducerLayout, norm: np.ndarray, inv: np.ndarray,
              post: np.ndarray, kind_weight: np.ndarray, zero: np.ndarray, clamp: float, fused: bool, out: np.ndarray,
              kept: bool = False) -> np.ndarray:
    """The RNN-T / multi-blank gradient ``[B, T, U1, V]`` written into ``out``
    (same shape and dtype as ``x``: zero on entry, :func:`new_gradient`, or
    with ``kept`` as :func:`rnnt_scores` left it): see :func:`cells.rnnt_grad_cells`;
    ``post`` float64 ``[num_steps, C]``, ``kind_weight`` ``[J]``, ``zero``
    bool ``[B]``."""
    B, T, U1, V = x.shape
    colidx, counts = layout.colidx, layout.slot_counts()
    sym = np.ascontiguousarray(sym, dtype=np.int64)
    kw = np.ascontiguousarray(kind_weight, dtype=np.float64)
    post = np.ascontiguousarray(post, dtype=np.float64)
    P = np.empty((B * T * U1, colidx.shape[2]))
    cells.run(cells.move_blocks, cells.blocks(B, T), P, colidx, counts, T, post, False)
    cells.run(cells.rnnt_grad_cells, B * T * U1, x, sym, counts, norm, inv, P, kw,
           np.ascontiguousarray(zero, dtype=np.bool_), float(clamp), bool(fused), x.dtype == np.float32,
           bool(kept and fused), out)
    return out


def tdt_scores(x: np.ndarray, V: int, blank: int, labels: np.ndarray, layout: TransducerLayout, sigma: float,
               out: np.ndarray | None = None) -> tuple:
    """Engine scores of a TDT batch: ``x [B, T, U1, V + D]`` float32/float64
    C-contiguous NumPy, ``labels`` int ``[B, U1]`` (the label read at
    ``(b, u)``; the blank where there is none); ``out``: the gradient-to-be
    (:func:`new_gradient`, zero) or None: when given, the token rows'
    exponentials and the duration softmax are left there for
    :func:`tdt_grad`.  Returns ``X`` float64 ``[num_steps, C]`` and the
    token softmax factors float64 ``[B * T * U1]``."""
    B, T, U1, _ = x.shape
    colidx, counts, X = _grid(layout, T, x)
    inv = np.zeros(B * T * U1)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    keep = out is not None
    cells.run(cells.tdt_gather_blocks, cells.blocks(B, T), x, int(V), int(blank), labels, counts, colidx, float(sigma),
           x.dtype == np.float32, X, inv, out if keep else _no_rows(x), keep)
    return X, inv


def tdt_grad(V: int, blank: int, labels: np.ndarray, layout: TransducerLayout, inv: np.ndarray, post: np.ndarray,
             zero: np.ndarray, fastemit_lambda: float, clamp: float, out: np.ndarray) -> np.ndarray:
    """The TDT gradient ``[B, T, U1, V + D]`` written into ``out``, the
    gradient-to-be that :func:`tdt_scores` filled (see :func:`cells.tdt_grad_blocks`;
    FastEmit scales the label's token terms by ``1 + fastemit_lambda``);
    ``inv`` from :func:`tdt_scores`, ``post`` float64 ``[num_steps, C]``,
    ``zero`` bool ``[B]``."""
    B, T = out.shape[:2]
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    post = np.ascontiguousarray(post, dtype=np.float64)
    cells.run(cells.tdt_grad_blocks, cells.blocks(B, T), int(V), int(blank), labels, layout.slot_counts(),
              layout.colidx, inv, post, np.ascontiguousarray(zero, dtype=np.bool_), 1.0 + float(fastemit_lambda),
              float(clamp), out)
    return out


def planned_scores(sources: Sequence[np.ndarray], entries: Sequence[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """The engine's scores ``X`` of ``shape`` from a score plan
    (:class:`~chainfb.transducer.grid._ScorePlan`): element ``i`` of each
    C-contiguous NumPy source (float32/float64) at ``X.flat[entry[i]]``
    (``entry[i] < 0``: on no arc), ``-inf`` elsewhere.  float32 when every
    source is (the compiled engine reads float32 scores as they are: half
    the memory, the same numbers), else float64."""
    f32 = all(src.dtype == np.float32 for src in sources)
    X = np.full(shape, -np.inf, dtype=np.float32 if f32 else np.float64)
    flat = X.reshape(-1)
    for src, entry in zip(sources, entries):
        cells.run(cells.put_scores, entry.shape[0], src.reshape(-1), entry, flat)
    return X


def planned_gradient(post: np.ndarray, entry: np.ndarray, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """A source's gradient ``shape`` in NumPy ``dtype`` from the engine's
    posteriors: ``post.flat[entry[i]]`` at element ``i``, 0 where
    ``entry[i] < 0`` (see :func:`planned_scores`)."""
    out = np.empty(shape, dtype=dtype)
    cells.run(cells.take_scores, entry.shape[0], np.ascontiguousarray(post, dtype=np.float64).reshape(-1), entry,
           out.reshape(-1))
    return out


def grid_scores(px: np.ndarray, py: np.ndarray, boundary: np.ndarray, colidx: np.ndarray, modified: bool,
                shape: tuple[int, int]) -> np.ndarray:
    """The engine's scores ``X`` of ``shape`` for the grid lattice of
    ``(px [B, S, T + 1] or [B, S, T], py [B, S + 1, T])`` (C-contiguous NumPy,
    one float dtype), ``boundary`` int64 ``[B, 4]`` and the step graphs'
    ``colidx [B, >= S + 1, 2]`` (:class:`~chainfb.transducer.grid.GridCriterion`):
    ``-inf`` off the cells, float32 when the sources are."""
    X = np.full(shape, -np.inf, dtype=py.dtype)
    B, S1, _ = py.shape
    cells.run(cells.grid_put_rows, B * S1, px, py, boundary, colidx, bool(modified), X)
    return X


def grid_gradients(post: np.ndarray, boundary: np.ndarray, colidx: np.ndarray, modified: bool,
                   px_shape: tuple[int, ...], py_shape: tuple[int, ...], dtype: DTypeLike) -> tuple:
    """``(px_grad, py_grad)`` in NumPy ``dtype`` from the engine's
    posteriors ``[rows, C]``: the reverse of :func:`grid_scores`, 0 off the
    cells."""
    gx, gy = np.empty(px_shape, dtype=dtype), np.empty(py_shape, dtype=dtype)
    B, S1, _ = py_shape
    cells.run(cells.grid_take_rows, B * S1, np.ascontiguousarray(post, dtype=np.float64), boundary, colidx,
              bool(modified), gx, gy)
    return gx, gy


def additive_logprobs(log_r: np.ndarray, am: np.ndarray, lm: np.ndarray, am_scale: np.ndarray,
                      lm_scale: np.ndarray, symbols: np.ndarray, blank: int, t_end: np.ndarray | None) -> tuple:
    """``(px, py)`` of the additive joiner ``am[t] + lm[s]`` from the log of
    its normalisers' scaled sums of exponentials ``log_r [B, S + 1, T]``
    (C-contiguous NumPy, one float dtype with the rest): ``norm = log_r +
    lm_scale + am_scale``, ``py = -norm + am[t, blank] + lm[s, blank]``,
    ``px = am[t, y_s] + (lm[s, y_s] - norm)``; ``am [B, T, C]``, ``lm [B, S
    + 1, C]``, the rows' log-scales ``am_scale [B, T, 1]`` and ``lm_scale
    [B, S + 1, 1]``, ``symbols`` int64 ``[B, S]``.  With ``t_end`` (int64
    ``[B]``, the regular topology) ``px`` is ``[B, S, T + 1]``, ``-inf`` at
    ``t = T`` and at ``t = t_end``; without, ``[B, S, T]``."""
    B, S1, T = log_r.shape
    pad = t_end is not None
    px = np.empty((B, S1 - 1, T + 1 if pad else T), dtype=log_r.dtype)
    py = np.empty((B, S1, T), dtype=log_r.dtype)
    te = np.ascontiguousarray(t_end if pad else np.full(B, T), dtype=np.int64)
    cells.run(cells.additive_blocks, cells.blocks(B, T), log_r, am, lm, am_scale, lm_scale,
           np.ascontiguousarray(symbols, dtype=np.int64), int(blank), te, px, py)
    return px, py
