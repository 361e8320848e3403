"""The LF-MMI (chain) objective as a torch loss: Kaldi's e2e
``ComputeChainObjfAndDeriv``.

For sequence ``n`` with weight ``w_n`` and ``L_n`` frames (network output
``y [N, T, P]`` used as pdf log-likelihoods):

    num_n  = w_n * log sum over numerator paths      (chainfb.forward_backward)
    den_n  = w_n * log sum over denominator paths    (leaky HMM, clamp(y, -30, 30))
    l2_n   = -0.5 * l2_regularize * w_n * sum_{t < L_n} ||y[n, t]||^2
    oor_n  = -0.5 * out_of_range_regularize * w_n * sum_{t < L_n} ||y[n, t] - clamp(y[n, t], -30, 30)||^2
    objf_n = num_n - den_n + l2_n + oor_n

The loss returned is ``-objf`` (to MINIMISE), summed over sequences
(``reduction="sum"``, Kaldi's scale), divided by the weighted frame count
``sum_n w_n L_n`` (``"frame"``), or per sequence (``"none"``).  Its
derivative w.r.t. ``y`` is ``-(w_n (num_post - den_post) - l2 w_n y -
oor w_n (y - clamp(y)))`` (the den posterior is not masked by the clamp,
as in Kaldi).  Kaldi's ``PenalizeOutOfRange`` adds only a derivative,
``-2 oor (y - clamp(y))`` on a random half of the minibatches; chainfb adds
its expectation on every call and reports the objective term it is the
gradient of.

Fallback (Kaldi): a sequence whose ``num_n - den_n`` is not finite (e.g.
its transcript does not fit its frames) gets ``-10 * w_n * L_n`` as its
chain objective and zero chain derivative, and a ``warnings.warn``; the
regularisers still apply.  A sequence whose output is not finite (NaN or
inf) in a valid frame gets the same fallback for the whole sequence: the
objective ``-10 * w_n * L_n`` with no regulariser terms and a zero
derivative, so the loss and the gradient stay finite.

:class:`ChainLoss` is a composition on the input's device: the numerator
(:func:`chainfb.fst_loglike`) and the leaky denominator
(:meth:`DenominatorGraph.loglike`), each one criterion through the engine
seam, and the regularisers as torch operations.  ``lengths`` are checked
once, on the host, and handed to both criteria as checked.  CUDA outputs
never leave the GPU: a call reads the device once, the summary that
fills ``info`` (the check that CUDA ``weights`` are finite rides on that
read), plus once more when ``lengths`` is a CUDA tensor (the graphs need
them on the host); only a call with fallback sequences reads more (for
its warning).  A module may be shared by threads: each call's result
depends on its own arguments only (``info`` holds the last call's).

After each call ``ChainLoss.info`` holds floats: ``num``, ``den``, ``l2``,
``oor`` (weighted sums of the objective pieces; the fallback sequences'
``-10`` per frame is counted in ``objf`` only), ``objf`` (total
objective), ``frames`` (``sum w_n L_n``), ``objf_per_frame``,
``num_fallback`` (count of fallback sequences).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from .. import checks
from .._arrays import Array, Ints, check_lengths
from ..batch import FstBatch
from ..fst import Fst
from ..api import PdfCriterion
from ..criterion import apply
from .denominator import CLAMP, DenominatorGraph

__all__ = ["ChainLoss"]

DEFAULT_OBJF = -10.0


class ChainLoss(torch.nn.Module):
    """LF-MMI loss (see the module docstring for the exact formula).

    Parameters
    ----------
    den_graph : DenominatorGraph or Fst
    leaky_hmm_coefficient : float in [0, 1) — Kaldi recipes use 0.1.
    l2_regularize : float >= 0 — Kaldi's l2 on the chain output.
    out_of_range_regularize : float >= 0 — penalty on outputs outside [-30, 30].
    reduction : ``"sum"`` (default, Kaldi's scale), ``"frame"`` (divided by
        the weighted frame count) or ``"none"`` (``[N]``).
    den_engine : ``"auto"``, ``"numpy"``, ``"shared"``, ``"cuda"`` or
        ``"cuda_shared"`` (see :func:`chainfb.engines.select`; ``"auto"``
        runs the denominator of CUDA outputs on the shared-graph kernels).

    ``forward(nnet_output [N, T, P], num_graphs, lengths=None, weights=None)``
    returns the loss (= minus the objective).  ``num_graphs``: list of N
    ``Fst`` or an ``FstBatch``; ``lengths`` ``[N]``; ``weights`` ``[N]``.
    """

    def __init__(self, den_graph: DenominatorGraph | Fst, leaky_hmm_coefficient: float = 0.1,
                 l2_regularize: float = 0.0, out_of_range_regularize: float = 0.01, reduction: str = "sum",
                 den_engine: str = "auto"):
        super().__init__()
        self.den_graph = den_graph if isinstance(den_graph, DenominatorGraph) else DenominatorGraph(den_graph)
        self.leaky_hmm_coefficient = checks.number(leaky_hmm_coefficient, "leaky_hmm_coefficient", 0.0, 1.0,
                                                   hi_open=True)
        self.l2_regularize = checks.number(l2_regularize, "l2_regularize", lo=0.0)
        self.out_of_range_regularize = checks.number(out_of_range_regularize, "out_of_range_regularize", lo=0.0)
        self.reduction = checks.reduction(reduction, ("sum", "frame", "none"))
        self.den_engine = den_engine
        self.info: dict = {}

    def forward(self, nnet_output: torch.Tensor, num_graphs: Sequence[Fst] | FstBatch, lengths: Ints | None = None,
                weights: Array | None = None) -> torch.Tensor:
        """``nnet_output [N, T, P]``, ``num_graphs`` (N graphs), ``lengths [N]``, ``weights [N]`` -> the loss
        (``[N]`` for ``"none"``, else a scalar)."""
        if not isinstance(nnet_output, torch.Tensor):
            raise TypeError(f"nnet_output: expected a torch.Tensor, got {type(nnet_output).__name__}")
        if nnet_output.dim() != 3:
            raise ValueError(f"nnet_output: expected [N, T, P], got shape {tuple(nnet_output.shape)}")
        if nnet_output.shape[2] < self.den_graph.num_pdfs:
            raise ValueError(f"nnet_output: P={nnet_output.shape[2]} but the denominator uses "
                             f"{self.den_graph.num_pdfs} pdfs")
        objf, frames = self._objective(nnet_output, num_graphs, lengths, weights)
        per_seq = (-objf).to(nnet_output.dtype)
        if self.reduction == "none":
            return per_seq
        total = per_seq.sum()
        if self.reduction == "frame" and frames > 0:  # (no frames at all: the sum, 0 or the fallback's)
            total = total / frames
        return total

    def _objective(self, y, num_graphs, lengths, weights):
        """``(objective [N] float64 on y's device, weighted frame count
        sum w_n L_n as a float)``; fills ``self.info``."""
        N, T, P = y.shape
        dev = y.device
        L = check_lengths(lengths, N, T)  # the one check: both criteria take L as checked
        w_ok = None  # CUDA weights: checked with the summary read below
        if weights is None:
            w = torch.ones(N, dtype=torch.float64, device=dev)
        else:
            w = torch.as_tensor(weights, dtype=torch.float64)
            if w.shape != (N,):
                raise ValueError(f"weights: expected {N} finite numbers >= 0, got shape {tuple(w.shape)}")
            if w.is_cuda and y.is_cuda:
                w_ok = (torch.isfinite(w) & (w >= 0)).all()
            elif not bool((torch.isfinite(w) & (w >= 0)).all()):
                raise ValueError(f"weights: expected {N} finite numbers >= 0, got {w.tolist()}")
            w = w.to(dev)
        mask = (torch.arange(T, device=dev)[None, :] < torch.as_tensor(L, device=dev)[:, None])[:, :, None]
        # Kaldi's fallback covers a sequence whose output is not finite in a valid frame too: the whole
        # sequence gets the default objective and zero derivative (its output is replaced by 0 below, so
        # no NaN reaches the numerator, the denominator or the regularisers)
        broken = ~torch.where(mask, torch.isfinite(y), True).all(dim=2).all(dim=1)
        if y.is_cuda or bool(broken.any()):  # on the GPU without asking (no device read)
            y = torch.where(broken[:, None, None], 0.0, y)
        num = apply(y, PdfCriterion(num_graphs, y.shape, L, value_dtype=np.float64, lengths_checked=True))
        den = self.den_graph._loglike_checked(y, L, self.leaky_hmm_coefficient, self.den_engine)
        frames = w * torch.as_tensor(L, dtype=torch.float64, device=dev)
        chain = w * (num - den)
        bad = ~torch.isfinite(chain) | broken
        objf = torch.where(bad, DEFAULT_OBJF * frames, chain)
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        l2 = oor = torch.zeros(N, dtype=torch.float64, device=dev)
        if self.l2_regularize:
            ym = torch.where(mask, y, 0.0).double()
            l2 = torch.where(broken, zero, -0.5 * self.l2_regularize * w * (ym * ym).sum(dim=(1, 2)))
        if self.out_of_range_regularize:
            excess = torch.where(mask, y - y.clamp(-CLAMP, CLAMP), 0.0).double()
            oor = torch.where(broken, zero, -0.5 * self.out_of_range_regularize * w * (excess * excess).sum(dim=(1, 2)))
        total = objf + l2 + oor
        good = ~bad
        pieces = [torch.where(good, w * num, zero).sum(), torch.where(good, w * den, zero).sum(), l2.sum(),
                  oor.sum(), total.sum(), frames.sum(), bad.sum().double()]
        if w_ok is not None:
            pieces.append(w_ok.double())
        summary = torch.stack(pieces).detach().cpu().tolist()  # the one device read
        if w_ok is not None and not summary.pop():
            raise ValueError(f"weights: expected {N} finite numbers >= 0, got {weights.tolist()}")
        info = dict(zip(("num", "den", "l2", "oor", "objf", "frames", "num_fallback"), summary))
        info["num_fallback"] = int(info["num_fallback"])
        info["objf_per_frame"] = info["objf"] / info["frames"] if info["frames"] else 0.0
        self.info = info
        if info["num_fallback"]:
            idx = torch.nonzero(bad).flatten().tolist()
            warnings.warn(
                f"ChainLoss: {len(idx)} sequence(s) {idx} have a non-finite objective (numerator "
                f"{num.detach()[bad].tolist()}, denominator {den.detach()[bad].tolist()}); using Kaldi's "
                f"fallback ({DEFAULT_OBJF} per frame, zero derivative)", RuntimeWarning,
                stacklevel=_caller_stacklevel())
        return total, info["frames"]


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning issued by the function calling this one to the first frame
    outside chainfb and torch's ``nn.Module`` call machinery: the line that called the loss (``loss(y, ...)`` or
    ``loss.forward(y, ...)``), however many frames lie between."""
    inside = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
              os.path.abspath(torch.nn.modules.module.__file__))
    frame, level = sys._getframe(2), 2  # level 1: the caller itself, a frame of this module
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level
