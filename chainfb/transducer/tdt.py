"""The Token-and-Duration Transducer (TDT, Xu et al., arXiv 2304.06795;
NeMo's ``TDTLossNumba``) compiled into step graphs for the generic engine.

The joiner output ``logits [B, T, U + 1, V + D]`` holds ``V`` token logits
(log-softmax over ``V``, minus ``sigma`` -- on the blank too) and ``D``
duration logits (log-softmax over ``D``) for ``durations = [d_0 .. d_{D-1}]``.
From grid point ``(t, u)``, with score ``token_lp - sigma + duration_lp``:

- the label ``targets[u]`` with duration ``d`` (``d = 0`` allowed) moves to
  ``(t + d, u + 1)``, allowed iff ``t + d <= T_b - 1``;
- the blank with duration ``d > 0`` moves to ``(t + d, u)``, allowed iff
  ``t + d <= T_b - 1``, or ``t + d == T_b`` on the last row ``u == U_b``
  (the final arc: every alignment ends with a blank landing on
  ``(T_b, U_b)``).

Step graph.  With step ``n = t + u`` a blank of duration ``d`` advances
``d`` steps and a label of duration ``d`` advances ``d + 1``, so every move
advances at least one step.  Main states ``u = 0 .. U_b`` (``t = n - u`` on
state ``u``); each main state ``u`` owns a chain of auxiliary states ``r^u_1
.. r^u_L`` (``r^u_k`` = "lands on ``u`` in ``k`` steps", ``r^u_k -> r^u_{k-1}``
and ``r^u_1 -> u`` carry the zero pdf, score 0).  A blank of duration ``d``
from ``u`` goes to ``r^u_{d-1}`` (``u`` itself for ``d = 1``), a label of
duration ``d`` from ``u`` goes to ``r^{u+1}_d`` (``u + 1`` itself for
``d = 0``).  Start 0, final ``U_b``, run for ``T_b + U_b`` steps.  Durations
longer than every utterance of the batch can never be taken (NeMo skips them
too): they get no arcs, and ``L = min(max(durations), max(T_b))``, so the
graph never grows with an unusable duration.

pdf numbering: main state ``u``, duration index ``i``: ``u * 2D + i`` the
blank of duration ``d_i`` (``d_i > 0``), ``u * 2D + D + i`` the label of
duration ``d_i`` (``u < U_b``); the zero pdf is ``(U_b + 1) * 2D``.

Score map (torch ops on the logits' device, so CUDA logits stay on the GPU
and the CUDA engine runs them): column ``(b, u, j)`` at step ``t + u`` reads
``S[b, t, u, kind, i]``, the arc score above, for the ``t`` where the move is
allowed, ``-inf`` elsewhere.  ``S [B, T, U + 1, 2, D]`` is built from one
token-normaliser and one duration-normaliser per ``(b, t, u)``.

Gradient of the cost ``-(1 + lambda) loglike`` (NeMo's TDT gradient):
with ``P[b, t, u, kind, i]`` the arc posteriors, ``Pb``/``Pl`` their sums over
durations for the blank/the label, and ``w = Pb + (1 + lambda) Pl``::

    token k:      softmax_k * w  -  Pb [k == blank]  -  (1 + lambda) Pl [k == targets[u]]
    duration i:   softmax_i * (Pb + Pl)  -  (P[.., 0, i] + P[.., 1, i])

(FastEmit scales only the token terms of the label arcs, and ``clamp``
clamps only the token part, as NeMo's kernel does; the duration part is the
plain derivative).  ``P`` is filled by assignment and reduced with dense
torch ops, so the gradient is deterministic on the GPU; the one 4-D buffer
besides the logits holds the softmaxes during the gather and becomes the
gradient.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch

from .._arrays import check_tensor
from ..batch import FstBatch
from ..criterion import Criterion, apply
from ..fst import Fst
from ..lattice import Lattice, concat_ranges
from .loss import _check_common, check_inputs, rnnt_loss
from .score_map import compute_dtype

__all__ = ["tdt_step_graph", "tdt_graphs", "TDTCriterion", "tdt_loss", "check_tdt_durations", "TDT_REDUCTIONS"]

#: reductions of :func:`tdt_loss`
TDT_REDUCTIONS = ("none", "sum", "mean", "mean_batch", "mean_volume")


def tdt_step_graph(num_labels: int, durations: Sequence[int], max_frames: int | None = None,
                   possible: bool = True) -> Fst:
    """The TDT step graph of one utterance with ``num_labels`` (``U_b``) labels.

    ``durations``: the duration of each duration index; those longer than
    ``max_frames`` (default: no limit) get no arcs.  ``possible=False``
    gives no final state (an utterance with no frames)."""
    U = int(num_labels)
    if U < 0:
        raise ValueError(f"num_labels: expected >= 0, got {U}")
    durations = [int(d) for d in durations]
    D = len(durations)
    J = 2 * D
    usable = [d <= max_frames if max_frames is not None else True for d in durations]
    L = max([d for d, ok in zip(durations, usable) if ok], default=0)
    S = (U + 1) * (1 + L)
    zero_pdf = (U + 1) * J
    u = np.arange(U + 1)

    def state(v, k):  # r^v_k (k >= 1), or v itself for k == 0
        return np.where(k == 0, v, U + 1 + v * L + (k - 1))

    srcs, dsts, pdfs = [], [], []
    for i, d in enumerate(durations):
        if not usable[i]:
            continue
        if d > 0:  # blank
            srcs.append(u), dsts.append(state(u, np.full_like(u, d - 1))), pdfs.append(u * J + i)
        if U > 0:  # label
            v = u[:-1]
            srcs.append(v), dsts.append(state(v + 1, np.full_like(v, d))), pdfs.append(v * J + D + i)
    for k in range(1, L + 1):
        srcs.append(state(u, np.full_like(u, k))), dsts.append(state(u, np.full_like(u, k - 1)))
        pdfs.append(np.full(U + 1, zero_pdf))
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int64)
    pdf = np.concatenate(pdfs) if pdfs else np.zeros(0, np.int64)
    final = np.full(S, -np.inf)
    if possible:
        final[U] = 0.0
    return Fst(S, 0, src, dst, pdf, np.zeros(len(src)), final)


def tdt_graphs(target_lengths, durations: Sequence[int], logit_lengths=None) -> FstBatch:
    """The TDT step graphs of a batch as one :class:`~chainfb.FstBatch`
    (utterances with the same label count share a graph).  With
    ``logit_lengths`` (``[B]``), utterances with no frames are impossible
    and durations longer than ``max(logit_lengths)`` get no arcs.  Run
    sequence ``b`` for ``logit_lengths[b] + target_lengths[b]`` steps."""
    U = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
    if logit_lengths is None:
        ok, maxT = np.ones(len(U), dtype=bool), None
    else:
        Tb = np.asarray(logit_lengths, dtype=np.int64).reshape(-1)
        ok, maxT = Tb > 0, int(Tb.max()) if len(Tb) else 0
    keys = list(zip(U.tolist(), ok.tolist()))
    distinct = sorted(set(keys))
    index = {k: i for i, k in enumerate(distinct)}
    fsts = [tdt_step_graph(u, durations, maxT, possible=o) for u, o in distinct]
    return FstBatch(fsts, np.array([index[k] for k in keys], dtype=np.int64))


class _Plan:
    """A compiled batch: the lattice and, for every score-map entry, its
    engine coordinates ``(rows, cols)`` and its flat index ``sidx`` into
    ``S [B, T, U1, 2, D]``."""

    def __init__(self, Ub, Tb, durations, T, U1):
        self.batch = batch = tdt_graphs(Ub, durations, Tb)
        self.lat = lat = Lattice.of(batch)
        self.steps = Tb + Ub
        self.num_rows = int(self.steps.max()) if len(Ub) else 0
        D = len(durations)
        J = 2 * D
        b = lat.col_seq
        zero = lat.col_pdf == (Ub[b] + 1) * J
        self.zero_cols = np.flatnonzero(zero)
        r = np.flatnonzero(~zero)
        b, pdf = b[r], lat.col_pdf[r]
        u, j = pdf // J, pdf % J
        kind, i = j // D, j % D
        d = np.asarray(durations, dtype=np.int64)[i]
        n_t = np.maximum(Tb[b] - d + ((kind == 0) & (u == Ub[b])), 0)  # allowed t: [0, n_t)
        which = np.repeat(np.arange(len(r)), n_t)
        t = concat_ranges(np.zeros(len(r), dtype=np.int64), n_t)
        bw, uw = b[which], u[which]
        self.rows = t + uw
        self.cols = r[which]
        self.sidx = ((bw * T + t) * U1 + uw) * J + j[which]


_PLANS: "OrderedDict[tuple, _Plan]" = OrderedDict()


def _plan(Ub, Tb, durations, T, U1) -> _Plan:
    key = (Ub.tobytes(), Tb.tobytes(), tuple(durations), T, U1)
    p = _PLANS.get(key)
    if p is None:
        p = _PLANS[key] = _Plan(Ub, Tb, durations, T, U1)
        if len(_PLANS) > 16:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    return p


def _softmax_(a: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of ``a`` in place; returns the log-normaliser
    ``[...]``.  Rows without a finite normaliser (all ``-inf``, ``inf``,
    NaN) are set to 0 (their utterances get a non-finite cost)."""
    mx = a.amax(dim=-1, keepdim=True)
    safe = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    a.sub_(safe).exp_()
    s = a.sum(dim=-1, keepdim=True)
    a.div_(s)
    norm = (safe + s.log()).squeeze(-1)
    a.masked_fill_(~torch.isfinite(norm)[..., None], 0.0)  # no host sync
    return norm


def _as_torch(arr, device):
    if isinstance(arr, np.ndarray):
        return torch.from_numpy(arr).to(device)
    return torch.from_dlpack(arr).to(device)


class TDTCriterion(Criterion):
    """The TDT lattice of a batch (module docstring) as a criterion over the
    joiner output; value ``-(1 + fastemit_lambda) * loglike`` ``[B]`` in the
    logits' dtype.

    Parameters
    ----------
    shape : ``(B, T, U1, V + D)`` of the logits.
    targets : ``[B, >= max(U_b)]`` int tensor (validated).
    logit_lengths, target_lengths : int64 NumPy ``[B]``.
    blank : index of the blank among the ``V`` token logits.
    durations : the ``D`` durations (validated, :func:`check_tdt_durations`).
    sigma, fastemit_lambda, clamp : see :func:`tdt_loss`.
    """

    def __init__(self, shape, targets, logit_lengths, target_lengths, blank, durations, sigma=0.0,
                 fastemit_lambda=0.0, clamp=-1.0):
        B, T, U1, VD = shape
        self.durations = tuple(int(d) for d in durations)
        D = len(self.durations)
        self.V = VD - D
        Ub = np.asarray(target_lengths, dtype=np.int64)
        Tb = np.asarray(logit_lengths, dtype=np.int64)
        self.plan = p = _plan(Ub, Tb, self.durations, T, U1)
        self.lattice, self.lengths = p.lat, p.steps
        self.blank = int(blank)
        # label index read at (b, u): targets[b, u] for u < U_b, the blank elsewhere (its weight is 0 there)
        lab = torch.full((B, U1), self.blank, dtype=torch.int64, device=targets.device)
        k = min(U1, targets.shape[1])
        lab[:, :k] = targets[:, :k].to(torch.int64)
        mask = torch.arange(U1, device=targets.device)[None, :] >= torch.as_tensor(Ub, device=targets.device)[:, None]
        lab[mask] = self.blank
        self.labels = lab
        self.sigma, self.fastemit_lambda, self.clamp = float(sigma), float(fastemit_lambda), float(clamp)
        self._work = None

    def gather(self, x, need_grad=True):
        B, T, U1, VD = x.shape
        V = self.V
        dev = x.device
        xd = x.detach()
        ct = compute_dtype(x.dtype)
        if need_grad:
            work = xd.to(ct, copy=True).contiguous()  # becomes the gradient
            tok_norm = _softmax_(work[..., :V])
            dur_norm = _softmax_(work[..., V:])
            self._work = work
        else:
            xc = xd.to(ct)
            tok_norm = torch.logsumexp(xc[..., :V], dim=-1)
            dur_norm = torch.logsumexp(xc[..., V:], dim=-1)
        lab = self.labels.to(dev)[:, None, :, None].expand(B, T, U1, 1)
        tok = torch.stack([xd[..., self.blank], xd[..., :V].gather(-1, lab).squeeze(-1)], dim=-1)
        tok = tok.to(torch.float64) - tok_norm.to(torch.float64)[..., None] - self.sigma  # [B, T, U1, 2]
        dur = xd[..., V:].to(torch.float64) - dur_norm.to(torch.float64)[..., None]  # [B, T, U1, D]
        S = tok[..., :, None] + dur[..., None, :]  # [B, T, U1, 2, D]
        p = self.plan
        X = torch.full((p.num_rows, self.lattice.num_columns), -np.inf, dtype=torch.float64, device=dev)
        X[torch.from_numpy(p.rows).to(dev), torch.from_numpy(p.cols).to(dev)] = \
            S.reshape(-1).index_select(0, torch.from_numpy(p.sidx).to(dev))
        if p.zero_cols.size:
            X[:, torch.from_numpy(p.zero_cols).to(dev)] = 0.0
        from .._arrays import as_array

        return as_array(X, "logits")[0]

    def finish(self, x, loglike, post):
        ll = _as_torch(loglike, x.device)
        value = (-(1.0 + self.fastemit_lambda) * ll).to(x.dtype)
        work, self._work = self._work, None
        if post is None:
            return value, None
        B, T, U1, VD = x.shape
        V, D = self.V, len(self.durations)
        dev = x.device
        p = self.plan
        P = _as_torch(post, dev)
        A = torch.zeros(B * T * U1 * 2 * D, dtype=torch.float64, device=dev)
        A[torch.from_numpy(p.sidx).to(dev)] = P[torch.from_numpy(p.rows).to(dev), torch.from_numpy(p.cols).to(dev)]
        A = A.view(B, T, U1, 2, D)
        Pk = A.sum(-1)  # [B, T, U1, 2]: blank, label
        Pb, Pl = Pk[..., 0], Pk[..., 1]
        wl = (1.0 + self.fastemit_lambda) * Pl
        g = work
        ct = g.dtype
        tokg = g[..., :V]
        tokg.mul_((Pb + wl).to(ct)[..., None])
        g[..., self.blank].sub_(Pb.to(ct))
        lab = self.labels.to(dev)[:, None, :, None].expand(B, T, U1, 1)
        tokg.scatter_add_(-1, lab, (-wl).to(ct)[..., None])  # one element per (b, t, u): no collisions
        if self.clamp > 0:
            tokg.clamp_(-self.clamp, self.clamp)
        durg = g[..., V:]
        durg.mul_((Pb + Pl).to(ct)[..., None])
        durg.sub_(A.sum(-2).to(ct))
        g.masked_fill_(~torch.isfinite(ll).view(-1, 1, 1, 1), 0.0)  # impossible utterances: zero gradient
        return value, g.to(x.dtype) if g.dtype != x.dtype else g


def check_tdt_durations(durations, num_outputs: int):
    """``durations`` as a list of ints, checked: a non-empty sequence of
    integers ``>= 0``, at least one ``> 0`` (every alignment ends with a
    blank of positive duration), fewer than ``num_outputs`` (the logits'
    last dimension, which also holds the token logits)."""
    if isinstance(durations, (str, bytes)) or durations is None:
        raise TypeError(f"durations: expected a sequence of ints, got {type(durations).__name__}")
    if isinstance(durations, torch.Tensor):
        if durations.dtype.is_floating_point or durations.dim() != 1:
            raise TypeError(f"durations: expected a 1-D integer tensor, got {durations.dtype} {tuple(durations.shape)}")
        durations = durations.tolist()
    try:
        items = list(durations)
    except TypeError:
        raise TypeError(f"durations: expected a sequence of ints, got {type(durations).__name__}") from None
    out = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"durations: expected ints, got {d!r} ({type(d).__name__})")
        out.append(int(d))
    if not out:
        raise ValueError("durations: expected at least one duration, e.g. [0, 1, 2, 3, 4]")
    if min(out) < 0:
        raise ValueError(f"durations: every duration must be >= 0, got {out}")
    if max(out) == 0:
        raise ValueError(f"durations: at least one duration must be > 0 (the last arc is a blank), got {out}")
    if len(out) >= num_outputs:
        raise ValueError(f"durations: {len(out)} durations leave no token logits in a last dimension of "
                         f"{num_outputs} (expected V + {len(out)} with V >= 1)")
    return out


def _reduce(costs, reduction, Ub):
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    if reduction in ("mean", "mean_batch"):
        return costs.mean()
    return costs.sum() / torch.as_tensor(Ub, device=costs.device).sum().to(costs.dtype)  # mean_volume


def tdt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    logit_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
    durations,
    sigma: float = 0.0,
    omega: float = 0.0,
    fastemit_lambda: float = 0.0,
    clamp: float = -1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Token-and-Duration Transducer loss (arXiv 2304.06795; NeMo's
    ``TDTLossNumba`` semantics) compiled into chainfb's engine.

    Parameters
    ----------
    logits : ``[B, T, U + 1, V + D]`` float32/float64/float16/bfloat16 joiner
        output: ``V`` token logits then ``D`` duration logits (both
        log-softmaxed inside; half types compute in float32).  CPU or CUDA.
    targets : ``[B, >= U]`` int32/int64 labels (``!= blank``, ``< V``).
    logit_lengths : ``[B]`` frame counts ``T_b <= T`` (``0``: impossible).
    target_lengths : ``[B]`` label counts ``U_b`` (``0`` allowed).
    blank : blank index among the ``V`` token logits (negative: ``V + blank``;
        NeMo puts it last, ``V - 1``).
    durations : the ``D`` durations, ints ``>= 0`` with at least one ``> 0``
        (NeMo uses e.g. ``[0, 1, 2, 3, 4]``); a label of duration ``d`` at
        ``(t, u)`` moves to ``(t + d, u + 1)`` if ``t + d <= T_b - 1``, a
        blank of duration ``d > 0`` to ``(t + d, u)`` if ``t + d <= T_b - 1``
        or, as the last arc, ``u = U_b`` and ``t + d = T_b``.  Durations
        longer than every utterance are simply never taken.
    sigma : logit under-normalisation: every token arc (blank included)
        scores ``token_lp - sigma``; duration log-probs are not shifted.
    omega : weight of the plain RNN-T loss of the token logits (no sigma,
        no durations): the cost is ``(1 - omega) * TDT + omega * RNNT``.
        NeMo instead *samples* the RNN-T loss for a whole batch with
        probability ``omega``; this is that loss's expectation (same
        expected value and gradient, no sampling noise).
        :class:`chainfb.compat.espnet.TDTLossNumba` samples like NeMo.
    fastemit_lambda : FastEmit as NeMo: cost ``-(1 + lambda) log P``; the
        label arcs' token-gradient terms scaled by ``1 + lambda`` plus
        ``lambda * softmax * P(label arcs)``; duration gradients unchanged.
    clamp : ``> 0`` clamps the token-logit gradient elements to
        ``[-clamp, clamp]`` per utterance (NeMo leaves the duration
        gradient unclamped); ``<= 0`` disables.
    reduction : ``"none"`` ``[B]``, ``"sum"``, ``"mean"`` or ``"mean_batch"``
        (batch mean, as NeMo's ``TDTLossNumba`` and ``RNNTLoss(
        reduction="mean_batch")``), ``"mean_volume"`` (sum over the
        summed target lengths).  NeMo's ``RNNTLoss(reduction="mean")``,
        the mean of ``cost / U_b``, is ``(tdt_loss(..., reduction="none")
        / target_lengths).mean()``.

    Returns
    -------
    Scalar cost, or ``[B]`` with ``reduction="none"``, in ``logits``' dtype.
    An utterance with no alignment (or non-finite logits) costs ``inf``/NaN
    and gets zero gradient from the TDT term.
    """
    if reduction not in TDT_REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(map(repr, TDT_REDUCTIONS))}, got {reduction!r}")
    _check_common("none", clamp, fastemit_lambda)
    for name, v in (("sigma", sigma), ("omega", omega)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
            raise TypeError(f"{name}: expected a number, got {type(v).__name__}")
        if not np.isfinite(v):
            raise ValueError(f"{name}: expected a finite number, got {v}")
    if not 0.0 <= omega <= 1.0:
        raise ValueError(f"omega: expected a weight in [0, 1], got {omega}")
    check_tensor(logits, "logits", ndim=4, layout="[B, T, U, V + D]")
    durations = check_tdt_durations(durations, logits.shape[-1])
    V = logits.shape[-1] - len(durations)
    blank, Tb, Ub = check_inputs(logits[..., :V], targets, logit_lengths, target_lengths, blank)
    parts = []
    if omega < 1.0:
        crit = TDTCriterion(logits.shape, targets, Tb, Ub, blank, durations, float(sigma),
                            float(fastemit_lambda), float(clamp))
        tdt = apply(logits, crit)
        parts.append(tdt if omega == 0.0 else (1.0 - omega) * tdt)
    if omega > 0.0:
        r = rnnt_loss(logits[..., :V], targets, logit_lengths, target_lengths, blank=blank, clamp=float(clamp),
                      reduction="none", fastemit_lambda=float(fastemit_lambda))
        parts.append(r if omega == 1.0 else omega * r)
    costs = parts[0] if len(parts) == 1 else parts[0] + parts[1]
    return _reduce(costs, reduction, Ub)


def sample_rnnt(omega: float) -> bool:
    """NeMo's per-call draw: use the plain RNN-T loss for this batch iff
    ``random.uniform(0, 1) < omega`` (Python's ``random`` module, so
    ``random.seed`` reproduces the draws)."""
    return random.uniform(0, 1) < omega
