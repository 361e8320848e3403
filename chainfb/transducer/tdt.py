"""The Token-and-Duration Transducer (TDT, Xu et al., arXiv 2304.06795;
the semantics of NeMo's ``TDTLossNumba``) compiled into step graphs for the generic engine.

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

Step graph: :func:`~chainfb.transducer.graphs.tdt_step_graph` (states
``u = 0 .. U_b``, start 0, final ``U_b``, run for ``T_b + U_b`` steps; a
duration is an arc spanning several steps), compiled, batched and cached by
the one transducer compiler, :func:`~chainfb.transducer.graphs.compile_layout`
(``family="tdt"``), which also lists the ``(column, t)`` entries where each
move is allowed (:class:`~chainfb.transducer.graphs.ScoreEntries`).

Score map: column ``(b, u, j)`` at step ``t + u`` reads ``S[b, t, u, kind,
i]``, the arc score above, for the ``t`` where the move is allowed, ``-inf``
elsewhere; ``S [B, T, U + 1, 2, D]`` comes from one token-normaliser and one
duration-normaliser per ``(b, t, u)``.  Three backends, picked by where the
logits live: for CUDA logits the transducer kernels
(:func:`~chainfb.transducer.criterion.kernel_gather` /
:func:`~chainfb.transducer.criterion.kernel_gradient`: arc kind ``j = kind * D
+ i`` reads the blank or the label and duration logit ``i``, at the frames
the layout's counts allow; one read of each row per kernel, the scores and
the engine in float32 for 16/32-bit logits, float64 for float64); on the CPU
the compiled map of :mod:`~chainfb.transducer.cpu_maps` (float32/float64
logits with Numba), else torch ops.

Gradient of the cost ``-(1 + lambda) loglike`` (NeMo's TDT gradient):
with ``P[b, t, u, kind, i]`` the arc posteriors, ``Pb``/``Pl`` their sums over
durations for the blank/the label, and ``w = Pb + (1 + lambda) Pl``::

    token k:      softmax_k * w  -  Pb [k == blank]  -  (1 + lambda) Pl [k == targets[u]]
    duration i:   softmax_i * (Pb + Pl)  -  (P[.., 0, i] + P[.., 1, i])

(FastEmit scales only the token terms of the label arcs, and ``clamp``
clamps only the token part, as NeMo's kernel does; the duration part is the
plain derivative).  Every backend is deterministic.  On the torch backend
``P`` is filled by assignment and reduced with dense torch ops, and the one
4-D buffer besides the logits holds the token softmax (times its row sum,
which the gradient divides out) during the gather and becomes the gradient.
The index tables are the layout's, cached per device
(:func:`~chainfb.transducer.criterion.layout_tables`,
:func:`~chainfb.transducer.criterion.kernel_tables`): a call uploads no
metadata.

Validation is shared with RNN-T (:func:`~chainfb.transducer.loss.check_inputs`
and :mod:`chainfb.checks`), reductions are :func:`chainfb.checks.reduce`.
:func:`tdt_loss` is deterministic: ``omega`` weights the RNN-T loss in
(its expectation); NeMo's random per-call draw lives in
:class:`chainfb.compat.espnet.TDTLossNumba`.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import checks
from .._arrays import as_array
from ..criterion import Criterion, apply
from . import cpu_maps
from ..cuda import kernels
from .criterion import (TransducerCriterion, kernel_gather, kernel_gradient, layout_tables, symbol_table,
                        torch_compute_dtype)
from .graphs import MAX_DURATION, compile_layout
from .loss import check_inputs, check_options

__all__ = ["TDTCriterion", "tdt_loss", "check_tdt_durations", "TDT_REDUCTIONS"]

#: reductions of :func:`tdt_loss` (NeMo's names included, see :data:`chainfb.checks.REDUCTIONS`)
TDT_REDUCTIONS = ("none", "sum", "mean", "mean_batch", "mean_volume")


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
        self.layout = lay = compile_layout(target_lengths, logit_lengths, self.durations, umax=U1 - 1, family="tdt")
        self.lattice, self.lengths = lay.lat, lay.steps
        self.blank = int(blank)
        # the blank and the label read at (b, u) ([B, U1, 2]; the label -1 for u >= U_b)
        self._sym = symbol_table(targets, layout_tables(lay, targets.device)["target_lengths"], U1, self.blank)
        self.sigma, self.fastemit_lambda, self.clamp = float(sigma), float(fastemit_lambda), float(clamp)
        self.kind_weight = np.repeat([1.0, 1.0 + self.fastemit_lambda], D)  # blanks, then labels of each duration
        self._work = self._backend = None

    @property
    def labels(self) -> torch.Tensor:
        """int64 ``[B, U1]``: the label read at ``(b, u)``, ``targets[b, u]``
        for ``u < U_b`` and the blank elsewhere (its weight is 0 there)."""
        lab = self._sym[..., 1]
        return torch.where(lab < 0, self.blank, lab).to(torch.int64)

    def _entries(self, dev, T):
        """rows, cols and the flat index into ``S [B, T, U1, 2, D]`` of every entry, on ``dev``."""
        tab = layout_tables(self.layout, dev, T)
        return tab, tab["arcs"]

    def gather(self, x, need_grad=True):
        B, T, U1, VD = x.shape
        V, D = self.V, len(self.durations)
        dev = x.device
        kb = self._backend = kernels.backend_for(x)  # finish runs on the same backend
        if kb is not None:  # the kernels: arc kind j = kind * D + i reads token sym[kind] and duration i
            sym = self._sym[..., None].expand(B, U1, 2, D).reshape(B, U1, 2 * D)
            X, state = kernel_gather(kb, self.layout, x, sym, shift=self.sigma)
            self._work = ("kernels", sym, state)
            return X
        xd = x.detach()
        if not xd.is_contiguous():
            xd = xd.contiguous()
        if dev.type == "cpu" and cpu_maps.available(x.dtype):  # the compiled score map: one pass
            xn = xd.numpy()
            labels = self.labels.cpu().numpy()
            grad, out = cpu_maps.new_gradient(xn.shape, x.dtype) if need_grad else (None, None)
            X, inv = cpu_maps.tdt_gather(xn, V, self.blank, labels, self.layout, self.sigma, out)
            self._work = ("compiled", labels, inv, grad, out)
            return X
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
        self._work = (work, tok_total, dur, dur_norm) if need_grad else None
        # the blank and the label at every (b, t, u), in one gather: [B, T, U1, 2]
        tok = xd[..., :V].gather(-1, self._symbols(dev, T)).to(torch.float64)
        tok -= (tok_norm.to(torch.float64) + self.sigma)[..., None]
        S = tok[..., :, None] + dur[..., None, :]  # [B, T, U1, 2, D]
        tab, sidx = self._entries(dev, T)
        X = torch.full((self.layout.num_steps, self.lattice.num_columns), -np.inf, dtype=torch.float64, device=dev)
        X.view(-1)[tab["flat"]] = S.reshape(-1).index_select(0, sidx)
        return as_array(X, "logits")[0]

    def _symbols(self, dev, T):
        """``[B, T, U1, 2]`` int64: the blank and the label read at each ``(b, t, u)`` (an expanded view)."""
        lab = self.labels.to(dev)
        both = torch.stack([torch.full_like(lab, self.blank), lab], dim=-1)  # [B, U1, 2]
        return both[:, None].expand(lab.shape[0], T, lab.shape[1], 2)

    def finish(self, x, loglike, post):
        ll = _as_torch(loglike, x.device)
        value = (-(1.0 + self.fastemit_lambda) * ll).to(x.dtype)
        work, self._work = self._work, None
        if post is None:
            return value, None
        if work[0] == "kernels":
            _, sym, state = work
            return value, kernel_gradient(self._backend, self.layout, sym, state, loglike, post, self.kind_weight,
                                          self.clamp)
        if work[0] == "compiled":
            _, labels, inv, grad, out = work
            cpu_maps.tdt_gradient(self.V, self.blank, labels, self.layout, inv, post, ~np.isfinite(np.asarray(loglike)),
                                  self.fastemit_lambda, self.clamp, out)
            return value, grad
        g, tok_total, dur, dur_norm = work
        B, T, U1, VD = x.shape
        V, D = self.V, len(self.durations)
        dev = x.device
        tab, sidx = self._entries(dev, T)
        P = _as_torch(post, dev)
        A = torch.zeros(B * T * U1 * 2 * D, dtype=torch.float64, device=dev)
        A[sidx] = P.reshape(-1).index_select(0, tab["flat"])
        # impossible utterances (non-finite cost): no posteriors, so a zero gradient (the softmaxes are finite)
        A = torch.where(torch.isfinite(ll).view(-1, 1), A.view(B, -1), 0.0).view(B, T, U1, 2, D)
        # sums over the durations as one matrix-vector product (torch's reductions over a short last dim are slow)
        Pk = (A.view(-1, D) @ torch.ones(D, dtype=torch.float64, device=dev)).view(B, T, U1, 2)  # blank, label
        occ = Pk[..., 0] + Pk[..., 1]  # Pb + Pl
        Pd = A[..., 0, :] + A[..., 1, :]  # [B, T, U1, D]: both kinds of each duration
        Pk[..., 1] *= 1.0 + self.fastemit_lambda  # FastEmit scales the label's token terms
        ct = g.dtype
        tokg = g[..., :V]
        w = Pk[..., 0] + Pk[..., 1]
        tokg.mul_((w / tok_total.to(torch.float64)).to(ct)[..., None])  # softmax * (Pb + (1 + l) Pl)
        # minus Pb at the blank and (1 + l) Pl at the label (where u >= U_b the "label" is the blank, weight 0)
        tokg.scatter_add_(-1, self._symbols(dev, T), (-Pk).to(ct))
        if self.clamp > 0:
            tokg.clamp_(-self.clamp, self.clamp)
        # durations: softmax * (Pb + Pl) - P_i (the plain derivative, no FastEmit); rows without a
        # finite normaliser have a softmax of 0
        dsm = torch.where(torch.isfinite(dur_norm), dur.exp(), 0.0)
        g[..., V:] = dsm * occ[..., None] - Pd
        return value, g.to(x.dtype) if g.dtype != x.dtype else g


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


def check_tdt_durations(durations, num_outputs: int) -> list:
    """``durations`` as a list of ints, checked: a non-empty sequence (list,
    tuple, 1-D integer tensor or array) of integers in ``[0, MAX_DURATION]``,
    at least one ``> 0`` (every alignment ends with a blank of positive
    duration), fewer than ``num_outputs`` (the logits' last dimension, which
    also holds the token logits)."""
    out = checks.durations(durations, "durations", 0, MAX_DURATION)
    if max(out) == 0:
        raise ValueError(f"durations: at least one duration must be > 0 (the last arc is a blank), got {out}")
    if len(out) >= num_outputs:
        raise ValueError(f"durations: {len(out)} durations leave no token logits in a last dimension of "
                         f"{num_outputs} (expected V + {len(out)} with V >= 1)")
    return out


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
    omega : weight in ``[0, 1]`` of the plain RNN-T loss of the token
        logits (no sigma, no durations): the cost is ``(1 - omega) * TDT +
        omega * RNNT``.  Deterministic: NeMo instead *samples* the RNN-T
        loss for a whole batch with probability ``omega`` on every call;
        this is that loss's expectation (same expected value and gradient,
        no sampling noise, no random state read).
        :class:`chainfb.compat.espnet.TDTLossNumba` makes NeMo's draw.
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
    reduction = checks.reduction(reduction, TDT_REDUCTIONS)
    clamp, fastemit_lambda = check_options(clamp, fastemit_lambda)
    sigma = checks.number(sigma, "sigma")
    omega = checks.number(omega, "omega", 0.0, 1.0)
    checks.tensor(logits, "logits", checks.FLOATS, 4, "[B, T, U, V + D]")
    durations = check_tdt_durations(durations, logits.shape[-1])
    V = logits.shape[-1] - len(durations)
    blank, Tb, Ub = check_inputs(logits[..., :V], targets, logit_lengths, target_lengths, blank)
    parts = []
    if omega < 1.0:
        crit = TDTCriterion(logits.shape, targets, Tb, Ub, blank, durations, sigma, fastemit_lambda, clamp)
        tdt = apply(logits, crit)
        parts.append(tdt if omega == 0.0 else (1.0 - omega) * tdt)
    if omega > 0.0:
        tokens = logits[..., :V]
        crit = TransducerCriterion(tokens.shape, targets, Tb, Ub, blank, fastemit_lambda=fastemit_lambda,
                                   clamp=clamp)
        rnnt = apply(tokens, crit)
        parts.append(rnnt if omega == 1.0 else omega * rnnt)
    costs = parts[0] if len(parts) == 1 else parts[0] + parts[1]
    return checks.reduce(costs, reduction, total=int(Ub.sum()))
