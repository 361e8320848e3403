"""The ``(s, t)`` grid lattice (k2's "mutual information" recursion) compiled
into step graphs for the engine.

A batch element ``b`` with boundary ``[s_begin, t_begin, s_end, t_end]``
(``S_b = s_end - s_begin`` symbols, ``T_b = t_end - t_begin`` frames) sums
over monotone paths from ``(s_begin, t_begin)`` to ``(s_end, t_end)``::

    regular  (px [B, S, T + 1]):  (s, t) -> (s + 1, t)      score px[b, s, t]
                                  (s, t) -> (s, t + 1)      score py[b, s, t]
    modified (px [B, S, T]):      (s, t) -> (s + 1, t + 1)  score px[b, s, t]
                                  (s, t) -> (s, t + 1)      score py[b, s, t]

(``py`` is ``[B, S + 1, T]``.)  As in :mod:`.graphs`, each path is a path
through a chain of ``S_b + 1`` states -- a self-loop on state ``s`` (the
``py`` arc, kind 0) and an arc ``s -> s + 1`` (the ``px`` arc, kind 1) --
that starts in state 0 and ends in state ``S_b``:

- regular: every arc advances ``s + t`` by one, so the graph runs ``S_b +
  T_b`` steps and at step ``n`` state ``s`` sits at ``t = n - s``; the score
  map reads ``py`` for ``0 <= t < T_b`` and ``px`` for ``0 <= t <= T_b``;
- modified: every arc consumes a frame, so the graph runs ``T_b`` steps and
  at step ``n`` every state sits at ``t = n``.

Everything else is ``-inf``.  The graph is exactly :func:`.graphs.step_graph`
(the RNN-T chain, kind 0 = self-loop, kind 1 = forward arc), so the layout
and the engine are shared with :mod:`.criterion`; only the gather differs
(it reads two ``[B, *, *]`` tensors instead of 4-D logits).  The value is
the total log-probability ``[B]``; its gradient w.r.t. ``px`` and ``py`` is
the engine's arc posteriors (the occupation probability of each grid arc),
scattered back.  Memory: ``O(B * S * T)``.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import checks
from .._arrays import as_array, wrap_like
from ..criterion import Criterion, apply
from ..lattice import concat_ranges
from .graphs import compile_layout

__all__ = ["GridCriterion", "grid_loglike", "check_boundary"]

_FLOATS = (torch.float32, torch.float64)


def check_boundary(boundary, B: int, S: int, T: int) -> np.ndarray:
    """``boundary`` as int64 NumPy ``[B, 4]`` (``[0, 0, S, T]`` rows when None),
    checked: ``0 <= s_begin <= s_end <= S`` and ``0 <= t_begin <= t_end <= T``."""
    if boundary is None:
        return np.tile(np.array([0, 0, S, T], dtype=np.int64), (B, 1))
    bd = checks.int_array(boundary, "boundary")  # floats and bools: TypeError
    if bd.shape != (B, 4):
        raise ValueError(f"boundary: expected shape ({B}, 4) [s_begin, t_begin, s_end, t_end], got {bd.shape}")
    s0, t0, s1, t1 = bd.T
    bad = (s0 < 0) | (s0 > s1) | (s1 > S) | (t0 < 0) | (t0 > t1) | (t1 > T)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(f"boundary: row {b} = {bd[b].tolist()} needs 0 <= s_begin <= s_end <= S={S} "
                         f"and 0 <= t_begin <= t_end <= T={T}")
    return bd


class _GridGatherPlan:
    """Where each grid arc goes in the engine's score map, for one (layout,
    boundary, shape, topology): for the ``px`` and the ``py`` arcs, their
    engine coordinates ``(row, col)`` and their flat index into ``px`` /
    ``py``.  It holds its layout, so the layout's ``id`` in the cache key
    stays its own while the plan is cached."""

    def __init__(self, lay, bd, S, T, modified):
        self.layout = lay
        r = lay.real
        b, s, j = lay.col_b[r], lay.col_u[r], lay.col_j[r]
        s0, t0, s1, t1 = (bd[:, k] for k in range(4))
        Tb = (t1 - t0)[b]
        n_t = np.where(j == 1, Tb + (0 if modified else 1), Tb)  # frames each column reads
        which = np.repeat(np.arange(len(r)), n_t)
        t = concat_ranges(np.zeros(len(r), dtype=np.int64), n_t) if len(r) else np.zeros(0, np.int64)
        bw, sw, jw = b[which], s[which], j[which]
        rows = t if modified else t + sw
        gs, gt = s0[bw] + sw, t0[bw] + t  # grid coordinates
        Tx = T if modified else T + 1
        is_px = jw == 1
        self.px = (rows[is_px], r[which][is_px], (bw[is_px] * S + gs[is_px]) * Tx + gt[is_px])
        self.py = (rows[~is_px], r[which][~is_px], (bw[~is_px] * (S + 1) + gs[~is_px]) * T + gt[~is_px])
        S_b, T_b = s1 - s0, t1 - t0
        self.lengths = T_b if modified else S_b + T_b
        self.num_rows = int(self.lengths.max()) if len(self.lengths) else 0


#: the gather plans of the most recent batches (thread-safe)
_PLANS = checks.LRU(16)


class GridCriterion(Criterion):
    """The grid lattice of a batch (module docstring) as a criterion over
    ``(px, py)``; value: total log-probability ``[B]`` in ``px``'s dtype.

    Parameters
    ----------
    px : ``[B, S, T + 1]`` (regular) or ``[B, S, T]`` (modified) float tensor.
    py : ``[B, S + 1, T]`` float tensor (same dtype and device).
    boundary : ``[B, 4]`` ints or None (``[0, 0, S, T]``).
    """

    def __init__(self, px, py, boundary=None):
        checks.tensor(px, "px", _FLOATS, 3)
        checks.tensor(py, "py", _FLOATS, 3)
        B, S1, T = py.shape
        S = S1 - 1
        if px.shape[:2] != (B, S) or px.shape[2] not in (T, T + 1):
            raise ValueError(f"px: expected shape ({B}, {S}, {T + 1}) or ({B}, {S}, {T}) for py of shape "
                             f"{tuple(py.shape)}, got {tuple(px.shape)}")
        if px.dtype != py.dtype or px.device != py.device:
            raise TypeError(f"px, py: expected one dtype and device, got {px.dtype} on {px.device} and "
                            f"{py.dtype} on {py.device}")
        self.modified = px.shape[2] == T
        self.shape = (B, S, T)
        bd = check_boundary(boundary, B, S, T)
        S_b = bd[:, 2] - bd[:, 0]
        lay = compile_layout(S_b, np.ones(B, dtype=np.int64), umax=S)  # every (S_b, T_b) has a path
        key = (id(lay), bd.tobytes(), S, T, self.modified)
        plan = _PLANS.get(key, lambda: _GridGatherPlan(lay, bd, S, T, self.modified))
        self.plan, self.lattice, self.lengths = plan, lay.lat, plan.lengths

    def gather(self, x, need_grad=True):
        px, py = x
        p = self.plan
        dev = px.device
        X = torch.full((p.num_rows, self.lattice.num_columns), -np.inf, dtype=torch.float64, device=dev)
        for src, (rows, cols, idx) in ((px, p.px), (py, p.py)):
            vals = src.detach().reshape(-1).index_select(0, torch.from_numpy(idx).to(dev)).to(torch.float64)
            X[torch.from_numpy(rows).to(dev), torch.from_numpy(cols).to(dev)] = vals
        return as_array(X, "px")[0]

    def finish(self, x, loglike, post):
        px, py = x
        ll = wrap_like(loglike, px) if not isinstance(loglike, np.ndarray) else torch.from_numpy(loglike)
        value = ll.to(device=px.device, dtype=px.dtype)
        if post is None:
            return value, None
        P = wrap_like(post, px) if not isinstance(post, np.ndarray) else torch.from_numpy(post)
        P = P.to(px.device)
        p = self.plan
        grads = []
        for src, (rows, cols, idx) in ((px, p.px), (py, p.py)):
            g = torch.zeros(src.numel(), dtype=src.dtype, device=src.device)
            dev = src.device
            g[torch.from_numpy(idx).to(dev)] = P[torch.from_numpy(rows).to(dev),
                                                  torch.from_numpy(cols).to(dev)].to(src.dtype)
            grads.append(g.view(src.shape))
        self.last_grads = tuple(grads)
        return value, self.last_grads


def grid_loglike(px: torch.Tensor, py: torch.Tensor, boundary=None, return_grad: bool = False):
    """Total log-probability of the grid lattice (module docstring), differentiable.

    Parameters
    ----------
    px : ``[B, S, T + 1]`` (regular) or ``[B, S, T]`` (modified) float tensor.
    py : ``[B, S + 1, T]``, same dtype and device.  float16 and bfloat16 are
        computed in float32; the results come back in the input dtype.
    boundary : ``[B, 4]`` ints ``[s_begin, t_begin, s_end, t_end]`` or None.
    return_grad : also return ``(px_grad, py_grad)``, the occupation
        probability of every arc (``d total / d px``, ``d total / d py``,
        whatever is later done with ``total``).

    Returns
    -------
    total ``[B]`` (``-inf`` where no path), or ``(total, (px_grad, py_grad))``.
    """
    return_grad = checks.flag(return_grad, "return_grad")
    checks.tensor(px, "px", checks.FLOATS, 3)
    checks.tensor(py, "py", checks.FLOATS, 3)
    dtype = px.dtype
    if py.dtype != dtype:
        raise TypeError(f"px, py: expected one dtype, got {px.dtype} and {py.dtype}")
    if dtype not in _FLOATS:  # half types: computed in float32 (differentiable casts)
        px, py = px.float(), py.float()
    crit = GridCriterion(px, py, boundary)
    crit.last_grads = None
    total = apply((px, py), crit)
    if return_grad:
        grads = crit.last_grads
        if grads is None:  # no input requires grad: the forward pass did not form them
            _, grads = crit.run((px, py), True)
        grads = tuple(g.detach().to(dtype, copy=True) for g in grads)
    total = total.to(dtype)
    return (total, grads) if return_grad else total
