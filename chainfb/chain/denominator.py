"""The LF-MMI denominator: one phone-LM graph shared by every sequence,
Kaldi's leaky HMM, scores clamped to ``[-30, 30]``.

Kaldi (``chain-denominator.*``): all states are final with probability 1;
the initial distribution ``init`` is the state occupancy averaged over 100
iterations of propagating probability mass from the start state
(renormalised each iteration, pdfs ignored); with leaky coefficient ``c``
every frame's alphas become ``alpha'(i) = alpha(i) + c * sum_j alpha(j) *
init(i)`` (and the betas the transpose).  The network output enters as
``exp(clamp(y, -30, 30))``; the derivative is the posterior, not masked by
the clamp (Kaldi's choice; the out-of-range regulariser of
:class:`~chainfb.chain.loss.ChainLoss` pulls outputs back into range).

The denominator is a :class:`~chainfb.api.PdfCriterion` on a lattice whose
sequences all share the one graph, with the clip to ``[-30, 30]`` in its
gather and ``leaky=(c, log_init)``; :func:`chainfb.engines.select` runs it on
the SciPy shared-graph engine on the CPU (the log-domain engine when asked,
``engine="numpy"``) and, for CUDA tensors, on the shared-graph CUDA engine
(:mod:`chainfb.engines.cuda_shared`: one copy of the graph on the device,
read by every sequence's block; ``engine="cuda"`` runs the per-sequence
kernels instead).  As in Kaldi,
the computation always starts from the initial distribution, whatever the
leaky coefficient (0 included).

Cost of a batch size: the graph is packed once (an
:class:`~chainfb.batch.FstBatch` of the one graph); a batch of ``N``
sequences is that batch with ``N`` sequences mapped to the graph
(:meth:`~chainfb.batch.FstBatch.with_sequences`), whose lattice costs
O(``N`` x pdfs) -- the per-sequence arcs are built only if a per-sequence
engine (``"numpy"``, ``"cuda"``) asks for them -- and the shared-graph
engines' sparse matrices and device arrays are cached per graph, so a new
``N`` costs nothing there.  The initial probabilities travel as the
graph's ``log_init [S]``, not repeated per sequence.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from .._arrays import Array, Ints, as_array
from .._cache import LRU
from ..api import PdfCriterion
from ..batch import FstBatch
from ..criterion import apply
from ..cuda.interop import on_torch_stream
from ..fst import Fst
from ..lattice import Lattice

__all__ = ["DenominatorGraph", "initial_probs", "CLAMP"]

CLAMP = 30.0


def initial_probs(fst: Fst, num_iters: int = 100) -> np.ndarray:
    """Kaldi's initial distribution ``[S]`` (``DenominatorGraph::SetInitialProbs``).

    Each state's outgoing mass is first normalised to sum to one *including
    its final probability* (the graph's own finals, before the denominator
    treats every state as final); starting with all mass on the start
    state, the distribution is propagated through the arcs (pdfs ignored)
    and renormalised ``num_iters`` times, and the distributions before each
    propagation are averaged.
    """
    S = fst.num_states
    p = np.exp(fst.log_prob)
    tot = np.exp(fst.final) + np.bincount(fst.src, weights=p, minlength=S)
    norm = np.where(tot > 0, 1.0 / np.where(tot > 0, tot, 1.0), 0.0)
    cur = np.zeros(S)
    cur[fst.start] = 1.0
    avg = np.zeros(S)
    for _ in range(num_iters):
        avg += cur / num_iters
        nxt = np.bincount(fst.dst, weights=(cur * norm)[fst.src] * p, minlength=S)
        total = nxt.sum()
        if not total > 0:
            break  # no mass can move: keep the average so far
        cur = nxt / total
    return avg / avg.sum()


class DenominatorGraph:
    """A denominator graph and its Kaldi initial probabilities.

    Parameters
    ----------
    fst : Fst
        Epsilon-free pdf acceptor (e.g. from
        :func:`chainfb.chain.graphs.phone_lm.den_graph`).  Its final probabilities
        only enter the initial probabilities (as in Kaldi); the computation
        treats every state as final with probability 1.
    num_pdfs : int, optional — the network output dimension ``P``
        (default: one more than the largest pdf in ``fst``).

    Attributes
    ----------
    fst : Fst (the graph with all finals set to 0)
    init_probs : float64 ``[S]``; ``log_init`` its log.
    """

    def __init__(self, fst: Fst, num_pdfs: int | None = None):
        if isinstance(fst, DenominatorGraph):
            fst = fst.fst
        if not isinstance(fst, Fst):
            raise TypeError(f"fst: expected chainfb.Fst, got {type(fst).__name__}")
        self.init_probs = initial_probs(fst)  # Kaldi: from the graph as given (its finals included)
        self.fst = Fst(fst.num_states, fst.start, fst.src, fst.dst, fst.pdf, fst.log_prob,
                       np.zeros(fst.num_states))
        self.num_pdfs = self.fst.num_pdfs if num_pdfs is None else int(num_pdfs)
        if self.num_pdfs < self.fst.num_pdfs:
            raise ValueError(f"num_pdfs: the graph uses pdf {self.fst.num_pdfs - 1} but num_pdfs={num_pdfs}")
        with np.errstate(divide="ignore"):
            self.log_init = np.log(self.init_probs)
        self._batch = FstBatch([self.fst])
        self._lattices = LRU(1)

    @property
    def num_states(self) -> int:
        return self.fst.num_states

    @property
    def num_arcs(self) -> int:
        return self.fst.num_arcs

    @classmethod
    def read(cls, path: str | os.PathLike, num_pdfs: int | None = None) -> DenominatorGraph:
        """From an OpenFst text file or a binary one, as Kaldi's
        ``chain-make-den-fst`` writes ``den.fst`` (label = pdf + 1)."""
        return cls(Fst.read(path), num_pdfs)

    def __repr__(self) -> str:
        return f"DenominatorGraph(num_states={self.num_states}, num_arcs={self.num_arcs}, num_pdfs={self.num_pdfs})"

    def _lattice(self, N: int) -> Lattice:
        """The lattice of ``N`` sequences on the graph (the last size cached:
        another costs O(``N`` x pdfs), and per-sequence arcs a per-sequence
        engine built for one size are not kept beside another's)."""
        return self._lattices.get(N, lambda: Lattice(self._batch.with_sequences(np.zeros(N, dtype=np.int64))))

    def criterion(self, shape: Sequence[int], lengths: Ints | None = None, leaky_hmm_coefficient: float = 0.1,
                  engine: str = "auto") -> PdfCriterion:
        """The denominator as a :class:`~chainfb.api.PdfCriterion` for scores
        of ``shape`` ``[N, T, P]`` (value: float64 log-likelihood ``[N]``)."""
        return self._criterion(shape, lengths, leaky_hmm_coefficient, engine, False)

    def _criterion(self, shape, lengths, leaky_hmm_coefficient, engine, lengths_checked):
        if len(shape) != 3:
            raise ValueError(f"scores: expected a 3-D array [N, T, P], got shape {tuple(shape)}")
        N, T, P = shape
        if P < self.fst.num_pdfs:
            raise ValueError(f"scores: the denominator graph uses pdf {self.fst.num_pdfs - 1} but P={P}")
        c = float(leaky_hmm_coefficient)
        if not 0.0 <= c < 1.0:
            raise ValueError(f"leaky_hmm_coefficient: expected a value in [0, 1), got {leaky_hmm_coefficient}")
        return PdfCriterion(None, shape, lengths, clamp=(-CLAMP, CLAMP), leaky=(c, self.log_init), engine=engine,
                            value_dtype=np.float64, lattice=self._lattice(N), lengths_checked=lengths_checked)

    def loglike(self, nnet_output: torch.Tensor, lengths: Ints | None = None, leaky_hmm_coefficient: float = 0.1,
                engine: str = "auto") -> torch.Tensor:
        """Differentiable denominator log-likelihood ``[N]`` (float64, on
        ``nnet_output``'s device) of ``nnet_output [N, T, P]``; its gradient
        is the posterior (Kaldi: not masked by the clamp)."""
        crit = self.criterion(tuple(nnet_output.shape), lengths, leaky_hmm_coefficient, engine)
        return apply(nnet_output, crit)

    def _loglike_checked(self, nnet_output: torch.Tensor, lengths: np.ndarray, leaky_hmm_coefficient: float,
                         engine: str) -> torch.Tensor:
        """:meth:`loglike` with ``lengths`` already int64 ``[N]`` in ``[0, T]``
        (checked once by :class:`~chainfb.chain.loss.ChainLoss`)."""
        crit = self._criterion(tuple(nnet_output.shape), lengths, leaky_hmm_coefficient, engine, True)
        return apply(nnet_output, crit)

    @on_torch_stream
    def forward_backward(self, scores: Array, lengths: Ints | None = None, leaky_hmm_coefficient: float = 0.1,
                         need_posteriors: bool = True, engine: str = "auto") -> tuple[Array, Array | None]:
        """Denominator log-likelihood per sequence and its pdf posteriors.

        Parameters
        ----------
        scores : ``[N, T, P]`` NumPy/CuPy array or torch tensor (float32/64)
            -- network output; clamped to ``[-30, 30]`` here.
        lengths : ``[N]`` ints in ``[0, T]``, optional (default ``T``).
        leaky_hmm_coefficient : float in ``[0, 1)``; 0 disables the leak
            (the path still starts from the initial distribution, as in Kaldi).
        engine : ``"auto"``, ``"numpy"``, ``"shared"``, ``"cuda"`` or
            ``"cuda_shared"`` (see :func:`chainfb.engines.select`).

        Returns
        -------
        loglike : ``[N]`` float64 (same array type as ``scores``).
        posteriors : ``[N, T, P]`` in the scores' dtype, or None --
            ``d loglike / d y`` (Kaldi: not masked by the clamp).  Each valid
            frame's posteriors sum to 1.
        """
        arr, _ = as_array(scores, "scores")
        return self.criterion(arr.shape, lengths, leaky_hmm_coefficient, engine).run(scores, need_posteriors)
