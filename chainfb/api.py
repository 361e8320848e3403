"""The generic public API over pdf graphs: graphs labelled with pdfs,
scored by frame-level pdf log-likelihoods ``[N, T, P]`` (Kaldi's e2e chain
numerator), as a criterion for the engine.  Everything here is also
:mod:`chainfb`'s own (``chainfb.forward_backward`` and so on).  It sits
above :mod:`chainfb.criterion` and :mod:`chainfb.engines`, and below the
losses that build on it (:mod:`chainfb.ctc`, :mod:`chainfb.chain`) and the
drop-ins (:mod:`chainfb.compat`); ``docs/layout.md`` has the layers.

- :class:`PdfCriterion`: the criterion (graphs -> lattice; score map =
  :class:`~chainfb.score_map.PdfScoreMap`).
- :func:`forward_backward`, :func:`best_path`: plain array functions (NumPy,
  CuPy or torch in, the same kind out).
- :func:`fst_loglike`, :class:`NumeratorLoss`: differentiable torch entry
  points through :func:`chainfb.criterion.apply`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from . import checks, engines
from ._arrays import Array, Ints, as_array, check_lengths, is_torch, wrap_like
from .batch import FstBatch
from .criterion import Criterion, DeferredGrad, apply
from .cuda.interop import cuda_device_of, on_torch_stream
from .fst import Fst
from .lattice import Lattice
from .score_map import PdfScoreMap

__all__ = ["PdfCriterion", "forward_backward", "best_path", "fst_loglike", "NumeratorLoss"]

#: The graphs of a batch: one Fst shared by all sequences, one Fst per sequence, or an FstBatch.
Graphs = Fst | Sequence[Fst] | FstBatch


class PdfCriterion(Criterion):
    """Pdf-labelled graphs over scores ``[N, T, P]``: value = log-likelihood.

    Parameters
    ----------
    fsts : Fst (shared by all sequences), list of N Fst, or FstBatch.
    shape : ``(N, T, P)`` of the scores.
    lengths : ``[N]`` ints in ``[0, T]`` or None (all ``T``).
    clamp : ``(lo, hi)`` or None -- scores are clipped before the engine
        (the LF-MMI denominator's ``[-30, 30]``); the gradient is the
        posterior, not masked by the clip (Kaldi).
    leaky : ``(c, log_init [S])`` or None; engine : see :func:`chainfb.engines.select`.
    value_dtype : dtype of the value (default: the scores' dtype); float64 runs the engine in float64 also
        for float32 scores.

    The scores cross from torch to NumPy/CuPy once per call: ``start``
    hands the array view it made to ``complete`` in its context (nothing
    is kept on the object between calls).
    given : ``(x, array, xp)``, the array view of tensor ``x`` its caller
        already made (used whenever ``x`` itself is passed), or None.
    lattice : the lattice of ``fsts``, when the caller has it (``fsts`` is then not read).
    lengths_checked : ``lengths`` is already int64 ``[N]`` in ``[0, T]``
        (checked once by the caller, e.g. :class:`chainfb.ChainLoss`).
    """

    #: the argument named in errors
    name = "scores"
    #: the gradient of the scores is scaled on the device, with no host synchronisation in backward
    scale_on_device = True

    def __init__(self, fsts: Graphs | None, shape: Sequence[int], lengths: Ints | None = None,
                 clamp: tuple[float, float] | None = None, leaky: tuple[float, Array] | None = None,
                 engine: str = "auto", value_dtype: npt.DTypeLike | None = None, lattice: Lattice | None = None,
                 lengths_checked: bool = False, given: tuple | None = None):
        if len(shape) != 3:
            raise ValueError(f"{self.name}: expected a 3-D array [N, T, P], got shape {tuple(shape)}")
        N, T, P = shape
        if lattice is None:
            batch = FstBatch.coerce(fsts, N)
            if batch.num_pdfs > P:
                raise ValueError(
                    f"{self.name}: the graphs use pdf {batch.num_pdfs - 1} but scores has only P={P} columns"
                )
            lattice = Lattice.of(batch)
        self.lattice = lattice
        self.lengths = lengths if lengths_checked else check_lengths(lengths, N, T)
        self.score_map = PdfScoreMap(lattice.col_seq, lattice.col_pdf, self.name)
        self.clamp, self.leaky, self.engine, self.value_dtype = clamp, leaky, engine, value_dtype
        self._given = given

    def _array(self, x):
        """``(array, xp)`` of ``x``: the view the caller gave for it, else a new one."""
        given = self._given
        if given is not None and given[0] is x:
            return given[1], given[2]
        return as_array(x, self.name)

    def start(self, x: Array, need_grad: bool = True) -> tuple[Array, tuple]:
        """Compact engine scores ``X [T, C]`` from ``x [N, T, P]`` (clamped when ``clamp`` is set), and the
        context ``complete`` takes: the array view of ``x`` and its array module."""
        arr, xp = self._array(x)
        # float32 scores stay float32 (half the memory; the compiled CPU engine
        # widens each one exactly as it reads it, the NumPy engine converts, and
        # the CUDA kernels run the normalised recursion in float32, as torch's
        # CUDA losses do for float32 inputs) unless a float64 value is asked for
        # (k2's use_double_scores): then the engine runs in float64 everywhere
        single = arr.dtype == np.float32 and (self.value_dtype is None or np.dtype(self.value_dtype) != np.float64)
        X = self.score_map.gather(xp, arr, dtype=np.float32 if single else np.float64, clip=self.clamp)
        return X, (arr, xp)

    def gather(self, x: Array, need_grad: bool = True) -> Array:
        """The engine's scores ``X [T, C]`` of ``x`` (the gather half alone)."""
        return self.start(x, need_grad)[0]

    def _grad_buffer(self, xp, arr):
        """A zero gradient buffer for ``arr`` ``[N, T, P]`` (contiguous)."""
        return xp.zeros(arr.shape, dtype=arr.dtype)

    def finish(self, x: Array, loglike: Array, post: Array | None) -> tuple[Array, Array | None]:
        """``complete`` without a context: ``x`` is viewed again."""
        return self.complete(x, loglike, post, self._array(x))

    def complete(self, x: Array, loglike: Array, post: Array | None, ctx: tuple) -> tuple[Array, Array | None]:
        """``(value [N], grad [N, T, P] like x or None)`` from the engine's ``loglike [N]`` and ``post [T, C]``."""
        arr, xp = ctx
        dtype = arr.dtype if self.value_dtype is None else self.value_dtype
        value = _like_input(wrap_like(xp.asarray(loglike).astype(dtype, copy=False), x), x,
                            self.value_dtype is None)
        if post is None:
            return value, None
        grad = self._grad_buffer(xp, arr)
        self.score_map.scatter_add(xp, grad, post, accumulate=False)
        return value, _like_input(wrap_like(grad, x), x)


    def complete_deferred(self, x: Array, loglike: Array, post: Array | None,
                          ctx: tuple) -> tuple[Array, DeferredGrad | None]:
        """:meth:`complete` with the gradient left as a :class:`~chainfb.criterion.DeferredGrad`: backward
        writes the ``[N, T, P]`` array once, each sequence's columns scaled by the incoming gradient in the
        compact ``[T, C]`` space (the posteriors scaled in place: they are this gradient's alone), and no dense
        buffer lives from forward to backward.  Where the posteriors are more than half the size of the
        gradient (most pdfs used: the LF-MMI denominator), keeping them would save nothing: the gradient is
        written now, as :meth:`complete` does."""
        arr, xp = ctx
        if post is None or 2 * post.size > arr.size:
            return self.complete(x, loglike, post, ctx)
        value, _ = self.complete(x, loglike, None, ctx)

        def build(scale):
            grad = self._grad_buffer(xp, arr)
            self.score_map.scatter_add(xp, grad, post, accumulate=False, seq_scale=scale)
            return _like_input(wrap_like(grad, x), x)

        return value, DeferredGrad(arr.shape, build, cuda_device_of(x))


def _like_input(out, x, same_dtype=True):
    """bfloat16 tensors are computed in float32 (NumPy and CuPy have no
    bfloat16); results come back in bfloat16."""
    if same_dtype and is_torch(x) and x.dtype == torch.bfloat16:
        return out.to(torch.bfloat16)
    return out


@on_torch_stream
def forward_backward(fsts: Graphs, scores: Array, lengths: Ints | None = None,
                     need_posteriors: bool = True) -> tuple[Array, Array | None]:
    """Log-likelihood of each sequence under its graph, and its posteriors.

    Parameters
    ----------
    fsts : Fst, list of Fst or FstBatch
        One Fst is shared by all sequences; a list has one graph per
        sequence; an FstBatch may map many sequences to one graph.
    scores : ``[N, T, P]`` NumPy/CuPy array or torch tensor, float32/float64
        (or a bfloat16 tensor, computed in float32) -- pdf log-likelihoods
        (any strides).  CUDA inputs run on the GPU.
    lengths : ``[N]`` ints in ``[0, T]``, optional
        Frames per sequence (default ``T``).
    need_posteriors : bool
        When False only the forward pass runs and ``posteriors`` is None.

    Returns
    -------
    loglike : ``[N]``
        Log of the sum over all paths of exactly ``lengths[n]`` arcs from the
        start state to a final state of ``exp(arc log-probs + scores + final)``;
        ``-inf`` where there is no such path.
    posteriors : ``[N, T, P]``
        ``d loglike / d scores`` (zero past each length and for impossible
        sequences).  Same array type, device and dtype as ``scores``.
    """
    need_posteriors = checks.flag(need_posteriors, "need_posteriors")
    arr, xp = as_array(scores, "scores")
    crit = PdfCriterion(fsts, arr.shape, lengths, given=(scores, arr, xp))  # converted once, here
    return crit.run(scores, need_posteriors)


@on_torch_stream
def best_path(fsts: Graphs, scores: Array, lengths: Ints | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """The best (Viterbi) path of each sequence through its graph: the
    engine's recursion in the max semiring (CUDA scores are decoded on the
    host).

    Parameters
    ----------
    fsts : Fst, list of Fst or FstBatch (as for :func:`forward_backward`).
    scores : ``[N, T, P]`` NumPy/CuPy array or torch tensor of pdf log-likelihoods.
    lengths : ``[N]`` ints in ``[0, T]``, optional.

    Returns
    -------
    score : float64 NumPy ``[N]``
        Max over paths of exactly ``lengths[n]`` arcs of arc log-probs +
        scores + final log-prob (``-inf`` when there is no path).
    paths : list of N int64 arrays
        The arcs of each best path in order (``lengths[n]`` of them when
        every arc spans one frame, empty when there is no path), as indices
        into that sequence's own Fst.
    """
    arr, xp = as_array(scores, "scores")
    crit = PdfCriterion(fsts, arr.shape, lengths, given=(scores, arr, xp))  # converted once, here
    lat, lengths = crit.lattice, crit.lengths
    score, arcs = engines.best_path(lat, crit.gather(scores), lengths)
    batch = lat.batch
    first_arc = batch.arc_offsets[batch.seq_to_graph]
    read = [arcs[n, : lengths[n]] for n in range(len(score))]  # -1: inside a spanning arc
    paths = [read[n][read[n] >= 0] - first_arc[n] if score[n] > -np.inf else np.zeros(0, np.int64)
             for n in range(len(score))]
    return score, paths


def fst_loglike(scores: torch.Tensor, fsts: Graphs, lengths: Ints | None = None) -> torch.Tensor:
    """Differentiable log-likelihood of each sequence under its graph.

    Parameters
    ----------
    scores : ``[N, T, P]`` float32/float64 tensor of pdf log-likelihoods.
    fsts : Fst (shared), list of N Fst, or FstBatch.
    lengths : ``[N]`` frame counts, optional.

    Returns
    -------
    ``[N]`` tensor; its gradient w.r.t. ``scores`` is the pdf posteriors
    times the incoming gradient (zero for sequences with no path).
    """
    checks.tensor(scores, "scores", ndim=3, layout="[N, T, P]")
    return apply(scores, PdfCriterion(fsts, scores.shape, lengths))


class NumeratorLoss(torch.nn.Module):
    """Negative log-likelihood of numerator graphs, as a loss object.

    ``forward(scores [N, T, P], fsts, lengths=None)`` returns
    ``-fst_loglike`` reduced by ``reduction``: ``"sum"``, ``"mean"`` (over
    sequences), ``"frame"`` (sum divided by the total number of frames) or
    ``"none"`` (``[N]``).
    """

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = checks.reduction(reduction, ("none", "sum", "mean", "frame"))

    def forward(self, scores: torch.Tensor, fsts: Graphs, lengths: Ints | None = None) -> torch.Tensor:
        """``scores [N, T, P]``, ``fsts`` (Fst, list of N Fst or FstBatch),
        ``lengths [N]`` (default all ``T``) -> the reduced loss."""
        nll = -fst_loglike(scores, fsts, lengths)
        frames = None
        if self.reduction == "frame":  # the lengths were checked by fst_loglike
            frames = scores.shape[0] * scores.shape[1] if lengths is None else lengths
        return checks.reduce(nll, self.reduction, frames)
