"""``forward_backward``: total log-likelihood and pdf posteriors of graphs
given frame-level pdf scores (the e2e chain numerator)."""

from __future__ import annotations

import numpy as np

from ._arrays import as_array, check_lengths, engine_for, is_cuda, is_torch, wrap_like
from .batch import FstBatch
from .lattice import Lattice
from .score_map import PdfScoreMap

__all__ = ["forward_backward", "best_path", "prepare"]


def prepare(fsts, shape, lengths):
    """Coerce ``fsts`` to an FstBatch for scores of ``shape`` ``[N, T, P]``,
    check it against the scores, and return ``(lattice, score_map, lengths)``."""
    if len(shape) != 3:
        raise ValueError(f"scores: expected a 3-D array [N, T, P], got shape {tuple(shape)}")
    N, T, P = shape
    batch = FstBatch.coerce(fsts, N)
    if batch.num_pdfs > P:
        raise ValueError(
            f"scores: the graphs use pdf {batch.num_pdfs - 1} but scores has only P={P} columns"
        )
    lengths = check_lengths(lengths, N, T)
    lat = Lattice.of(batch)
    return lat, PdfScoreMap(lat.col_seq, lat.col_pdf), lengths


def forward_backward(fsts, scores, lengths=None, need_posteriors: bool = True):
    """Log-likelihood of each sequence under its graph, and its posteriors.

    Parameters
    ----------
    fsts : Fst, list of Fst or FstBatch
        One Fst is shared by all sequences; a list has one graph per
        sequence; an FstBatch may map many sequences to one graph.
    scores : ``[N, T, P]`` NumPy/CuPy array or torch tensor, float32/float64
        Pdf log-likelihoods (any strides).  CUDA inputs run on the GPU.
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
    arr, xp = as_array(scores, "scores")
    lat, smap, lengths = prepare(fsts, arr.shape, lengths)
    X = smap.gather(xp, arr)
    loglike, post = engine_for(xp)(lat, X, lengths, need_posteriors)
    posteriors = None
    if need_posteriors:
        posteriors = xp.zeros(arr.shape, dtype=arr.dtype)
        smap.scatter_add(xp, posteriors, post, accumulate=False)
        posteriors = wrap_like(posteriors, scores)
    return wrap_like(loglike.astype(arr.dtype), scores), posteriors


def best_path(fsts, scores, lengths=None):
    """The best (Viterbi) path of each sequence through its graph, by the
    engine's max-plus pass (CPU; CUDA inputs are copied to the host).

    Parameters
    ----------
    fsts : Fst, list of Fst or FstBatch (as for :func:`forward_backward`).
    scores : ``[N, T, P]`` NumPy array or torch tensor of pdf log-likelihoods.
    lengths : ``[N]`` ints in ``[0, T]``, optional.

    Returns
    -------
    score : float64 NumPy ``[N]``
        Max over paths of exactly ``lengths[n]`` arcs of arc log-probs +
        scores + final log-prob (``-inf`` when there is no path).
    paths : list of N int64 arrays
        The arcs of each best path (``lengths[n]`` of them, empty when there
        is no path), as indices into that sequence's own Fst.
    """
    from .engine import best_path_lattice

    if is_cuda(scores):
        scores = scores.detach().cpu() if is_torch(scores) else scores.get()
    arr, xp = as_array(scores, "scores")
    lat, smap, lengths = prepare(fsts, arr.shape, lengths)
    score, arcs = best_path_lattice(lat, smap.gather(np, arr), lengths)
    batch = lat.batch
    first_arc = batch.arc_offsets[batch.seq_to_graph]
    paths = [arcs[n, : lengths[n]] - first_arc[n] if score[n] > -np.inf else np.zeros(0, np.int64)
             for n in range(len(score))]
    return score, paths
