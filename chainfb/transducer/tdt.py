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
duration-normaliser per ``(b, t, u)``.  Three backends
(:mod:`chainfb.transducer.maps`), picked by where the logits live: for CUDA
logits the transducer kernels (:mod:`~chainfb.transducer.maps.cuda`: arc
kind ``j = kind * D + i`` reads the blank or the label and duration logit
``i``, at the frames the layout's counts allow; one read of each row per
kernel, the scores and the engine in float32 for 16/32-bit logits, float64
for float64); on the CPU the compiled map
(:mod:`~chainfb.transducer.maps.compiled`, float32/float64 logits with
Numba), else torch ops (:mod:`~chainfb.transducer.maps.torch_ops`).

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
(:func:`~chainfb.transducer.maps.layout_tables`,
:func:`~chainfb.transducer.maps.cuda.kernel_tables`): a call uploads no
metadata.

Validation is shared with RNN-T (:func:`~chainfb.transducer.loss.check_inputs`
and :mod:`chainfb.checks`), reductions are :func:`chainfb.checks.reduce`.
:func:`tdt_loss` is deterministic: ``omega`` weights the RNN-T loss in
(its expectation); NeMo's random per-call draw lives in
:class:`chainfb.compat.espnet.TDTLossNumba`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._arrays import Ints
from .. import checks
from ..criterion import Criterion, apply
from .criterion import MappedCriterion, TransducerCriterion, host_symbols, layout_symbols
from .graphs import MAX_DURATION, compile_layout
from .loss import check_options, checked_inputs

__all__ = ["TDTCriterion", "tdt_loss", "check_tdt_durations", "TDT_REDUCTIONS"]

#: reductions of :func:`tdt_loss` (NeMo's names included, see :data:`chainfb.checks.REDUCTIONS`)
TDT_REDUCTIONS = ("none", "sum", "mean", "mean_batch", "mean_volume")


class TDTCriterion(MappedCriterion):
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
    host_targets : optional int NumPy copy of ``targets``: the symbol table is
        then built on the host and copied to the logits' device once
        (:func:`~chainfb.transducer.criterion.layout_symbols`).
    """

    kind = "tdt"

    def __init__(self, shape: tuple[int, ...], targets: torch.Tensor, logit_lengths: np.ndarray,
                 target_lengths: np.ndarray, blank: int, durations: Sequence[int], sigma: float = 0.0,
                 fastemit_lambda: float = 0.0, clamp: float = -1.0, host_targets: np.ndarray | None = None):
        B, T, U1, VD = shape
        self.durations = tuple(int(d) for d in durations)
        D = len(self.durations)
        self.V = VD - D
        self.layout = lay = compile_layout(target_lengths, logit_lengths, self.durations, umax=U1 - 1, family="tdt")
        self.lattice, self.lengths = lay.lat, lay.steps
        self.blank = int(blank)
        # the blank and the label read at (b, u) ([B, U1, 2]; the label -1 for u >= U_b)
        host = None if host_targets is None else host_symbols(np.asarray(host_targets), lay.target_lengths, U1,
                                                               self.blank)
        self.sym = layout_symbols(targets, lay, U1, self.blank, host_table=host)
        self.sigma, self.fastemit_lambda, self.clamp = float(sigma), float(fastemit_lambda), float(clamp)
        self.kind_weight = np.repeat([1.0, 1.0 + self.fastemit_lambda], D)  # blanks, then labels of each duration

    @property
    def labels(self) -> torch.Tensor:
        """int64 ``[B, U1]``: the label read at ``(b, u)``, ``targets[b, u]``
        for ``u < U_b`` and the blank elsewhere (its weight is 0 there)."""
        lab = self.sym[..., 1]
        return torch.where(lab < 0, self.blank, lab).to(torch.int64)


def check_tdt_durations(durations: Ints, num_outputs: int) -> list:
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
    durations: Ints,
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
    blank, Tb, Ub, host = checked_inputs(logits[..., :V], targets, logit_lengths, target_lengths, blank)
    parts = []
    if omega < 1.0:
        crit: Criterion = TDTCriterion(logits.shape, targets, Tb, Ub, blank, durations, sigma, fastemit_lambda, clamp,
                                       host)
        tdt = apply(logits, crit)
        parts.append(tdt if omega == 0.0 else (1.0 - omega) * tdt)
    if omega > 0.0:
        tokens = logits[..., :V]
        crit = TransducerCriterion(tokens.shape, targets, Tb, Ub, blank, fastemit_lambda=fastemit_lambda,
                                   clamp=clamp, host_targets=host)
        rnnt = apply(tokens, crit)
        parts.append(rnnt if omega == 1.0 else omega * rnnt)
    costs = parts[0] if len(parts) == 1 else parts[0] + parts[1]
    return checks.reduce(costs, reduction, total=int(Ub.sum()))
