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

The pruned loss's scores are ``-inf`` outside a band of ``R`` consecutive
symbol positions per frame.  :class:`BandGridCriterion` compiles the regular
grid restricted to such a band into a graph of ``R`` states (the position in
the band) that runs the same ``S_b + T_b`` steps, so the engine's work is
``O(R)`` per step instead of ``O(S)``, with the same numbers.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .._cache import LRU, Memo
from .. import checks
from .._arrays import Array, wrap_like
from ..criterion import Criterion, apply
from . import maps
from .graphs import compile_layout

__all__ = ["GridCriterion", "BandGridCriterion", "grid_loglike", "band_loglike", "band_start", "check_boundary"]

_FLOATS = (torch.float32, torch.float64)


def check_boundary(boundary: Array | None, B: int, S: int, T: int) -> np.ndarray:
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


class _ScorePlan:
    """Where each arc score goes in the engine's scores ``[rows, C]``:

    - ``px``, ``py``: for every element of ``px`` / ``py``, its entry in the
      scores (``-1``: the arc is on no path), so the compiled score map moves
      each score in and each gradient out in one pass;
    - ``gather`` ``[rows * C]`` (formed when first asked for: the torch
      score map's): for every entry of the engine's scores, its index into
      ``px.flat ++ py.flat ++ [-inf]`` (the last: no arc), so the scores are
      one gather;
    - ``num_rows``, ``num_columns`` and ``lengths`` (the engine's steps per
      sequence).

    The score maps of :mod:`chainfb.transducer.maps` read the plan: the
    compiled one moves scores by ``px`` and ``py`` (or, for the full grid,
    ``full_grid``, by the rules of its boundary and layout); index tensors
    for the torch one are kept per device (:meth:`on`)."""

    full_grid = False

    def __init__(self):
        self._on = Memo()

    @functools.cached_property
    def gather(self):
        n_px, n_py = self.px.shape[0], self.py.shape[0]
        g = np.full(self.num_rows * self.num_columns, n_px + n_py, dtype=np.int64)
        sx, sy = np.flatnonzero(self.px >= 0), np.flatnonzero(self.py >= 0)
        g[self.px[sx]] = sx
        g[self.py[sy]] = n_px + sy
        return g

    def on(self, dev):
        """``(gather, px, py)`` as torch index tensors on ``dev`` (kept per device)."""
        return self._on.get(dev, lambda: tuple(torch.from_numpy(a).to(dev) for a in (self.gather, self.px, self.py)))


class _GridGatherPlan(_ScorePlan):
    """The :class:`_ScorePlan` of the grid for one (layout, boundary, shape,
    topology).  It holds its layout, so the layout's ``id`` in the cache key
    stays its own while the plan is cached.

    Sequence ``b``'s symbol arc at grid cell ``(s, t)`` (relative to its
    boundary's start) is read at step ``t + s`` (regular) or ``t``
    (modified), in the column ``colidx[b, s, 1]`` of its ``(s, symbol)``
    arc; the blank arc in ``colidx[b, s, 0]``.  The compiled score map
    moves them by these rules (``full_grid``); the per-element entries
    ``px``, ``py`` (one slice per sequence) are formed when first asked
    for, by the torch score map."""

    full_grid = True

    def __init__(self, lay, bd, S, T, modified):
        super().__init__()
        self.layout, self.boundary = lay, bd
        self.shape, self.modified = (S, T), modified
        self.num_columns = lay.lat.num_columns
        S_b, T_b = bd[:, 2] - bd[:, 0], bd[:, 3] - bd[:, 1]
        self.lengths = T_b if modified else S_b + T_b
        self.num_rows = int(self.lengths.max()) if len(bd) else 0

    @functools.cached_property
    def _entries(self):
        lay, bd, (S, T), modified = self.layout, self.boundary, self.shape, self.modified
        B, C = len(bd), self.num_columns
        col = lay.colidx  # the column of (b, s, blank / symbol)
        s0, t0, s1, t1 = (bd[:, k] for k in range(4))
        S_b, T_b = s1 - s0, t1 - t0
        px = np.full((B, S, T if modified else T + 1), -1, dtype=np.int64)
        py = np.full((B, S + 1, T), -1, dtype=np.int64)
        for b in range(B):
            sb, tb, a, c = int(S_b[b]), int(T_b[b]), int(s0[b]), int(t0[b])
            s = np.arange(sb + 1)[:, None]
            rows = np.arange(tb + 1)[None, :] + (0 if modified else s)  # [S_b + 1, T_b + 1]: the step
            py[b, a:a + sb + 1, c:c + tb] = rows[:, :tb] * C + col[b, :sb + 1, 0][:, None]
            n = tb if modified else tb + 1
            px[b, a:a + sb, c:c + n] = rows[:sb, :n] * C + col[b, :sb, 1][:, None]
        return px.reshape(-1), py.reshape(-1)

    @property
    def px(self):
        return self._entries[0]

    @property
    def py(self):
        return self._entries[1]


#: the gather plans of the most recent batches (thread-safe)
_PLANS = LRU(16)


def _value(loglike, like):
    ll = wrap_like(loglike, like) if not isinstance(loglike, np.ndarray) else torch.from_numpy(loglike)
    return ll.to(device=like.device, dtype=like.dtype)


class _PlannedCriterion(Criterion):
    """``start`` and ``complete`` of a criterion over ``(px, py)`` through
    its :class:`_ScorePlan` ``self.plan``, on the score map's backend
    :func:`chainfb.transducer.maps.select` picks."""

    name = "px"

    def start(self, x, need_grad=True):
        return maps.gather("grid", self, x, need_grad)

    def gather(self, x, need_grad=True):
        """The engine's scores ``X [num_rows, C]`` of ``(px, py)`` (the gather half alone)."""
        return self.start(x, need_grad)[0]

    def complete(self, x, loglike, post, ctx):
        value = _value(loglike, x[0])
        if post is None:
            return value, None
        return value, maps.gradient("grid", self, x, loglike, post, ctx)

    def finish(self, x, loglike, post):
        """``complete`` after a gather of its own (this criterion keeps nothing between calls)."""
        return self.complete(x, loglike, post, self.start(x, post is not None)[1])


class GridCriterion(_PlannedCriterion):
    """The grid lattice of a batch (module docstring) as a criterion over
    ``(px, py)``; value: total log-probability ``[B]`` in ``px``'s dtype.

    Parameters
    ----------
    px : ``[B, S, T + 1]`` (regular) or ``[B, S, T]`` (modified) float tensor.
    py : ``[B, S + 1, T]`` float tensor (same dtype and device).
    boundary : ``[B, 4]`` ints or None (``[0, 0, S, T]``).
    """

    def __init__(self, px: torch.Tensor, py: torch.Tensor, boundary: Array | None = None):
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


def band_start(ranges: torch.Tensor, boundary: np.ndarray) -> np.ndarray | None:
    """The band's first symbol position ``start [B, T]`` (int64 NumPy) when
    the regular grid restricted to the band ``ranges`` can run as a
    :class:`BandGridCriterion`, else None.

    It can when every row of ``ranges [B, T, R]`` is ``start[b, t] + (0, 1,
    ..., R - 1)``, every sequence (``boundary [B, 4]``, NumPy) starts at
    ``(0, 0)`` and has a frame, ``start[b, 0] == 0``, ``start`` is
    non-decreasing over the sequence's frames, and its last frame's band
    holds ``s_end`` -- as :func:`~chainfb.transducer.prune_ranges` makes
    them.  (Otherwise the full grid, with ``-inf`` outside the band, gives
    the numbers.)"""
    B, T, R = ranges.shape
    if not B or not T or boundary[:, :2].any() or (boundary[:, 3] < 1).any():
        return None
    rg = ranges.detach()
    first = rg[:, :, :1]
    if not bool((rg - first == torch.arange(R, device=rg.device)).all()):
        return None
    st = first[:, :, 0].cpu().numpy().astype(np.int64)
    S_b, T_b = boundary[:, 2], boundary[:, 3]
    frames = np.arange(T)
    falls = (frames[None, 1:] < T_b[:, None]) & (np.diff(st, axis=1) < 0)
    last = S_b - st[np.arange(B), T_b - 1]
    if (st[:, 0] != 0).any() or falls.any() or (last < 0).any() or (last >= R).any():
        return None
    return st


class _BandPlan(_ScorePlan):
    """The :class:`_ScorePlan` of a band (``px_band``, ``py_band`` in the
    places of ``px``, ``py``)."""

    def __init__(self, st, bd, R):
        super().__init__()
        B, T = st.shape
        P = _band_pdfs(R)
        C = B * P
        S_b, T_b = bd[:, 2], bd[:, 3]
        k = np.arange(R)
        frames = np.arange(T)
        live_t = frames[None, :] < T_b[:, None]  # [B, T]
        d = np.zeros((B, T), dtype=np.int64)  # the band's rise to the next frame (0 into the final cell)
        d[:, :-1] = np.diff(st, axis=1)
        d[frames[None, :] + 1 >= T_b[:, None]] = 0
        # per frame: its cells' common part of the entry (row s + t at start[t], sequence's columns)
        row0 = ((st + frames) * C + (np.arange(B) * P)[:, None])[:, :, None]  # [B, T, 1]
        s = st[:, :, None] + k  # [B, T, R]
        room = S_b[:, None, None] - s  # symbols left after the cell
        step = k * (C + 1)  # k more symbols: k rows down and k columns right
        sym_ok = live_t[:, :, None] & (room > 0) & (k < R - 1)
        blank_ok = live_t[:, :, None] & (room >= 0) & (d[:, :, None] <= k)
        self.px = np.where(sym_ok, row0 + step, -1).reshape(-1)
        blank_col = (R - 1) + k * (k + 1) // 2 - k  # the blank of rise d of state k: column blank_col + k + d
        self.py = np.where(blank_ok, row0 + step + blank_col + np.minimum(d[:, :, None], k), -1).reshape(-1)
        self.lengths = (S_b + T_b).astype(np.int64)
        self.num_rows = int(self.lengths.max())
        self.num_columns = C
        self.lattice = _band_lattice(R, tuple((S_b - st[np.arange(B), T_b - 1]).tolist()))


def _band_pdfs(R: int) -> int:
    """Pdfs (arc kinds) of the band graph of ``R`` states: ``R - 1`` symbol
    arcs and ``R (R + 1) / 2`` blank arcs."""
    return R - 1 + R * (R + 1) // 2


def _band_graph(R: int, final: int):
    """The band graph: states ``k = s - start[t]`` (``0 .. R - 1``); a symbol
    arc ``k -> k + 1`` (pdf ``k``) and, for every rise ``d <= k`` of the
    band, a blank arc ``k -> k - d`` (pdf ``R - 1 + k (k + 1) / 2 + d``);
    start 0, final ``final``."""
    from ..fst import Fst

    ks = np.arange(R - 1)
    bk = np.concatenate([np.full(k + 1, k) for k in range(R)])
    bd = np.concatenate([np.arange(k + 1) for k in range(R)])
    src = np.concatenate([ks, bk])
    dst = np.concatenate([ks + 1, bk - bd])
    pdf = np.concatenate([ks, R - 1 + bk * (bk + 1) // 2 + bd])
    fin = np.full(R, -np.inf)
    fin[final] = 0.0
    return Fst(R, 0, src, dst, pdf, np.zeros(len(src)), fin)


_BAND_LATTICES = LRU(16)


def _band_lattice(R: int, finals: tuple):
    """The lattice of a batch of band graphs (final state per sequence), cached."""
    from ..batch import FstBatch
    from ..lattice import Lattice

    def build():
        distinct = sorted(set(finals))
        index = {f: i for i, f in enumerate(distinct)}
        batch = FstBatch([_band_graph(R, f) for f in distinct], np.array([index[f] for f in finals]))
        return Lattice.of(batch)

    return _BAND_LATTICES.get((R, finals), build)


class BandGridCriterion(_PlannedCriterion):
    """The regular grid lattice (module docstring) restricted to a band of
    ``R`` consecutive symbol positions per frame, as a criterion over the
    band's arc scores ``(px_band, py_band)``; value: total log-probability
    ``[B]`` in ``px_band``'s dtype, the same as :class:`GridCriterion` on
    the full grid with ``-inf`` outside the band.

    The band graph has ``R`` states, ``k = s - start[t]``: the engine runs
    ``S_b + T_b`` steps of ``R`` states instead of ``S_b + 1``.  Cell ``(s,
    t)`` sits at step ``s + t`` in state ``k`` (``t + start[t]`` grows with
    ``t``, so a state at a step is at most one cell); its symbol arc goes to
    ``k + 1``, its blank arc to ``k - (start[t + 1] - start[t])`` (the rise
    is 0 into the final cell ``(s_end, t_end)``, state ``s_end - start[t_end
    - 1]``).  Arcs that leave the band, and cells past ``s_end`` or
    ``t_end``, are on no path of the full grid either and get no entry.

    Parameters
    ----------
    px_band : ``[B, T, R]`` float tensor: ``px[b, start[b, t] + k, t]``.
    py_band : ``[B, T, R]`` float tensor: ``py[b, start[b, t] + k, t]``.
    start : int64 NumPy ``[B, T]`` from :func:`band_start`.
    boundary : int64 NumPy ``[B, 4]`` (``[0, 0, S_b, T_b]`` rows).
    """

    name = "px_band"

    def __init__(self, px_band: torch.Tensor, py_band: torch.Tensor, start: np.ndarray, boundary: np.ndarray):
        B, T, R = px_band.shape
        self.plan = _BandPlan(start, boundary, R)
        self.lattice, self.lengths = self.plan.lattice, self.plan.lengths


def grid_loglike(px: torch.Tensor, py: torch.Tensor, boundary: Array | None = None,
                 return_grad: bool = False) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
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
    total, grads = _total_and_grads(GridCriterion(px, py, boundary), (px, py), return_grad)
    total = total.to(dtype)
    return (total, tuple(g.to(dtype) for g in grads)) if return_grad else total


def band_loglike(px_band: torch.Tensor, py_band: torch.Tensor, start: np.ndarray, boundary: np.ndarray,
                 return_grad: bool = False) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Total log-probability of the regular grid restricted to a band
    (:class:`BandGridCriterion`), differentiable w.r.t. ``px_band`` and
    ``py_band`` (``[B, T, R]``, float32 or float64).  ``start`` and
    ``boundary`` from :func:`band_start` (trusted).  With ``return_grad``,
    also ``(px_band_grad, py_band_grad)``, the occupancy of every band arc."""
    total, grads = _total_and_grads(BandGridCriterion(px_band, py_band, start, boundary), (px_band, py_band),
                                    return_grad)
    return (total, grads) if return_grad else total


def _total_and_grads(crit, x, return_grad: bool):
    """``crit``'s total ``[B]``, differentiable w.r.t. the tensors ``x``,
    and with ``return_grad`` its gradients (the arc occupancies) from the
    same engine run -- one run whether or not ``x`` requires grad.  The
    gradients returned are the ones autograd keeps (backward scales them
    out of place, :func:`chainfb.criterion.apply`)."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in x):
        total, grads = crit.run(x, return_grad)  # nothing to differentiate
    elif return_grad:
        total, grads = apply(x, crit, return_grad=True)
    else:
        total, grads = apply(x, crit), None
    return total, (tuple(g.detach() for g in grads) if return_grad else None)
