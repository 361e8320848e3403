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

Two engine paths compute the same numbers:

* ``"lattice"``: the one generic engine
  (:func:`chainfb.engine.forward_backward_lattice`, or its CUDA twin) on
  ``FstBatch([fst], seq_to_graph=zeros(N))`` with ``leaky=(c, log_init)``;
* ``"shared"``: :class:`chainfb.shared_engine.SharedGraphEngine`, the
  sparse shared-graph path (CPU), much faster at Kaldi's scale.

``"auto"`` picks ``"shared"`` for NumPy/CPU inputs and ``"lattice"``
otherwise.
"""

from __future__ import annotations

import numpy as np

from .._arrays import as_array, check_lengths, engine_for, wrap_like
from ..batch import FstBatch
from ..fst import Fst
from ..lattice import Lattice
from ..score_map import PdfScoreMap
from ..shared_engine import SharedGraphEngine

__all__ = ["DenominatorGraph", "DenominatorComputation", "initial_probs"]

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
        :func:`chainfb.chain.phone_lm.den_graph`).  Its final probabilities
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
        self._shared = None
        self._lattices: dict = {}

    @property
    def num_states(self) -> int:
        return self.fst.num_states

    @property
    def num_arcs(self) -> int:
        return self.fst.num_arcs

    @classmethod
    def read(cls, path, num_pdfs: int | None = None) -> "DenominatorGraph":
        """From an OpenFst text file (label = pdf + 1)."""
        return cls(Fst.read(path), num_pdfs)

    def __repr__(self) -> str:
        return f"DenominatorGraph(num_states={self.num_states}, num_arcs={self.num_arcs}, num_pdfs={self.num_pdfs})"

    def shared_engine(self) -> SharedGraphEngine:
        if self._shared is None:
            self._shared = SharedGraphEngine(self.fst)
        return self._shared

    def _lattice(self, N: int):
        got = self._lattices.get(N)
        if got is None:
            batch = FstBatch([self.fst], np.zeros(N, dtype=np.int64))
            lat = Lattice.of(batch)
            got = (lat, PdfScoreMap(lat.col_seq, lat.col_pdf), np.tile(self.log_init, N))
            self._lattices = {N: got}  # keep one size cached (memory)
        return got

    def forward_backward(self, scores, lengths=None, leaky_hmm_coefficient: float = 0.1,
                         need_posteriors: bool = True, engine: str = "auto"):
        """Denominator log-likelihood per sequence and its pdf posteriors.

        Parameters
        ----------
        scores : ``[N, T, P]`` NumPy array or torch tensor (float32/64) —
            network output; clamped to ``[-30, 30]`` here.
        lengths : ``[N]`` ints in ``[0, T]``, optional (default ``T``).
        leaky_hmm_coefficient : float in ``(0, 1)``; 0 disables the leak
            (then the path starts in the start state).
        engine : ``"auto"``, ``"lattice"`` or ``"shared"``.

        Returns
        -------
        loglike : ``[N]`` float64 (same array type as ``scores``).
        posteriors : ``[N, T, P]`` float64 or None — ``d loglike / d y``
            (Kaldi: not masked by the clamp).  Each valid frame's
            posteriors sum to 1.
        """
        arr, xp = as_array(scores, "scores")
        if arr.ndim != 3:
            raise ValueError(f"scores: expected a 3-D array [N, T, P], got shape {tuple(arr.shape)}")
        N, T, P = arr.shape
        if P < self.fst.num_pdfs:
            raise ValueError(f"scores: the denominator graph uses pdf {self.fst.num_pdfs - 1} but P={P}")
        c = float(leaky_hmm_coefficient)
        if not 0.0 <= c < 1.0:
            raise ValueError(f"leaky_hmm_coefficient: expected a value in [0, 1), got {leaky_hmm_coefficient}")
        if engine not in ("auto", "lattice", "shared"):
            raise ValueError(f"engine: expected 'auto', 'lattice' or 'shared', got {engine!r}")
        lengths = check_lengths(lengths, N, T)
        if engine == "auto":
            engine = "shared" if xp is np else "lattice"
        if engine == "shared":
            if xp is not np:
                raise ValueError("engine: 'shared' runs on the CPU only")
            eng = self.shared_engine()
            X = np.clip(arr[:, :, eng.pdfs].astype(np.float64), -CLAMP, CLAMP)
            leaky = (c, self.log_init) if c > 0 else None
            loglike, post = eng.forward_backward(X, lengths, need_posteriors, leaky)
            posteriors = None
            if need_posteriors:
                posteriors = np.zeros((N, T, P))
                posteriors[:, :, eng.pdfs] = post
                posteriors = wrap_like(posteriors, scores)
            return wrap_like(loglike, scores), posteriors
        lat, smap, log_init = self._lattice(N)
        X = xp.clip(smap.gather(xp, arr), -CLAMP, CLAMP)
        leaky = (c, log_init if xp is np else xp.asarray(log_init)) if c > 0 else None
        loglike, post = engine_for(xp)(lat, X, lengths, need_posteriors, leaky)
        posteriors = None
        if need_posteriors:
            posteriors = xp.zeros((N, T, P), dtype=xp.float64)
            smap.scatter_add(xp, posteriors, post)
            posteriors = wrap_like(posteriors, scores)
        return wrap_like(xp.asarray(loglike, dtype=xp.float64), scores), posteriors


class DenominatorComputation:
    """Kaldi's ``chain::DenominatorComputation`` API over a Kaldi-layout output.

    Parameters
    ----------
    den_graph : DenominatorGraph
    num_sequences : int ``N``
    nnet_output : ``[T * N, >= num_pdfs]`` NumPy array or CPU torch tensor,
        row ``t * N + seq`` (Kaldi's layout).
    leaky_hmm_coefficient : float — Kaldi's option default ``1e-5`` (recipes use 0.1).
    lengths : ``[N]`` optional (chainfb extension; Kaldi has fixed lengths).
    engine : see :meth:`DenominatorGraph.forward_backward`.

    ``forward()`` returns the total log-likelihood (sum over sequences);
    ``backward(deriv_weight, nnet_output_deriv)`` adds ``deriv_weight *
    posteriors`` into ``nnet_output_deriv`` (same layout) and returns ``ok``:
    False when the total is not finite or the posteriors of some frame do
    not sum to the number of sequences within 1% (Kaldi's check).
    """

    def __init__(self, den_graph: DenominatorGraph, num_sequences: int, nnet_output,
                 leaky_hmm_coefficient: float = 1e-5, lengths=None, engine: str = "auto"):
        from ..kaldi import _kaldi_view

        if not isinstance(den_graph, DenominatorGraph):
            raise TypeError(f"den_graph: expected DenominatorGraph, got {type(den_graph).__name__}")
        arr, xp = as_array(nnet_output, "nnet_output")
        N = int(num_sequences)
        if N <= 0 or arr.ndim != 2 or arr.shape[0] % N:
            raise ValueError(f"nnet_output: expected [T * {N}, P] rows, got shape {tuple(arr.shape)}")
        self.den_graph, self.N, self.T = den_graph, N, arr.shape[0] // N
        self._xp = xp
        self._view = _kaldi_view(xp, arr, N, self.T, "nnet_output")
        self.lengths = check_lengths(lengths, N, self.T)
        self.leaky = float(leaky_hmm_coefficient)
        self.engine = engine
        self._post = None

    def forward(self) -> float:
        """Total denominator log-likelihood over the sequences."""
        ll, self._post = self.den_graph.forward_backward(self._view, self.lengths, self.leaky, True, self.engine)
        self._total = float(np.asarray(ll).sum())
        return self._total

    def backward(self, deriv_weight: float, nnet_output_deriv) -> bool:
        """Add ``deriv_weight * posteriors`` into ``nnet_output_deriv``; returns ok."""
        from ..kaldi import _kaldi_view

        if self._post is None:
            self.forward()
        deriv, _ = as_array(nnet_output_deriv, "nnet_output_deriv")
        dview = _kaldi_view(self._xp, deriv, self.N, self.T, "nnet_output_deriv")
        post = np.asarray(self._post)
        dview += (deriv_weight * post).astype(deriv.dtype, copy=False)
        sums = post.sum(axis=(0, 2))
        expected = (np.arange(self.T)[:, None] < self.lengths[None, :]).sum(axis=1)
        ok = bool(np.isfinite(self._total)) and bool(np.all(np.abs(sums - expected) <= 0.01 * np.maximum(expected, 1)))
        return ok
