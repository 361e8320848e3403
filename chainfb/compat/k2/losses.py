"""k2's ``ctc_loss`` / ``CtcLoss`` (``k2/python/k2/ctc_loss.py``): the CTC
loss of any decoding graph -- ``-get_tot_scores(log_semiring=True)`` of
its :func:`~chainfb.compat.k2.intersect_dense` with the network output --
so a graph with several pronunciations, or a modified topology, is a CTC
loss too.  Blank is label 0.  Computed by chainfb's engine, exactly
(``output_beam`` is not used); equal to :func:`chainfb.ctc_loss` on
:func:`~chainfb.compat.k2.ctc_graph` graphs.

k2's conventions: the loss is float32 whatever ``use_double_scores`` (the
total scores are computed in float64 with it); ``reduction="sum"`` is the
default; ``"mean"`` divides each loss by its ``target_lengths`` entry
before the batch mean.  ``delay_penalty`` > 0 is not supported.
"""

from __future__ import annotations


import torch

from ... import checks
from .dense import DenseFsaVec, intersect_dense
from .fsa import Fsa

__all__ = ["ctc_loss", "CtcLoss"]


class CtcLoss(torch.nn.Module):
    """k2's ``CtcLoss(output_beam, reduction="sum", use_double_scores=True)``.

    ``forward(decoding_graph, dense_fsa_vec, delay_penalty=0.0,
    target_lengths=None)`` returns the loss (float32): ``[S]`` for
    ``"none"``, else a scalar.
    """

    def __init__(self, output_beam: float, reduction: str = "sum", use_double_scores: bool = True):
        super().__init__()
        self.output_beam = checks.number(output_beam, "output_beam", lo=0.0, lo_open=True, finite=False)
        self.reduction = checks.reduction(reduction)
        self.use_double_scores = checks.flag(use_double_scores, "use_double_scores")

    def forward(self, decoding_graph: Fsa, dense_fsa_vec: DenseFsaVec, delay_penalty: float = 0.0,
                target_lengths: torch.Tensor | None = None) -> torch.Tensor:
        if checks.number(delay_penalty, "delay_penalty") != 0.0:
            raise ValueError(f"delay_penalty: only 0 is supported, got {delay_penalty}")
        lengths = None
        if self.reduction == "mean":
            if target_lengths is None:
                raise ValueError('target_lengths: needed for reduction="mean"')
            lengths = checks.lengths(target_lengths, "target_lengths", dense_fsa_vec.dim0())
        lattice = intersect_dense(decoding_graph, dense_fsa_vec, self.output_beam)
        loss = -lattice.get_tot_scores(log_semiring=True, use_double_scores=self.use_double_scores)
        loss = loss.to(torch.float32)
        if self.reduction == "none":
            return loss
        if self.reduction == "sum":
            return loss.sum()
        return (loss / torch.as_tensor(lengths, dtype=loss.dtype, device=loss.device)).mean()


def ctc_loss(decoding_graph: Fsa, dense_fsa_vec: DenseFsaVec, output_beam: float = 10, delay_penalty: float = 0.0,
             reduction: str = "sum", use_double_scores: bool = True,
             target_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """k2's ``ctc_loss``: :class:`CtcLoss` in one call.

    Parameters
    ----------
    decoding_graph : FsaVec, one graph per segment (e.g. :func:`ctc_graph`
        or ``compose(ctc_topo, transcript)``); blank is label 0.
    dense_fsa_vec : :class:`DenseFsaVec` over log-probs ``[N, T, C]``.
    output_beam : k2's pruning beam (> 0; not used: the loss is exact).
    delay_penalty : must be 0.
    reduction : ``"sum"`` (default), ``"mean"`` (each loss divided by its
        target length, then the batch mean) or ``"none"`` (``[S]``).
    use_double_scores : compute the total scores in float64 (the loss is float32).
    target_lengths : ``[S]``, needed for ``"mean"``.
    """
    return CtcLoss(output_beam, reduction, use_double_scores)(decoding_graph, dense_fsa_vec, delay_penalty,
                                                             target_lengths)
