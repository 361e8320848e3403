"""A NumPy float64 reference for the LF-MMI objective of
:class:`chainfb.ChainLoss` (module docstring of :mod:`chainfb.chain.loss`):
the numerator and the leaky denominator through the array API
(:func:`chainfb.forward_backward`,
:meth:`chainfb.DenominatorGraph.forward_backward`), the regularisers and
Kaldi's fallback written out with NumPy.  It does not apply ChainLoss's
rule for sequences whose output is not finite.
"""

import warnings

import numpy as np
import torch

from chainfb._arrays import check_lengths
from chainfb.api import forward_backward as num_forward_backward
from chainfb.chain.denominator import CLAMP, DenominatorGraph
from chainfb.chain.loss import DEFAULT_OBJF


def chain_objective(nnet_output, num_graphs, den_graph: DenominatorGraph, lengths=None, weights=None,
                    leaky_hmm_coefficient=0.1, l2_regularize=0.0, out_of_range_regularize=0.01,
                    den_engine="auto"):
    """The objective of :class:`chainfb.ChainLoss` in NumPy, float64 (the reference).

    Parameters
    ----------
    nnet_output : float64 NumPy ``[N, T, P]``
    num_graphs : Fst / list of Fst / FstBatch (one per sequence).
    den_graph : DenominatorGraph
    lengths : ``[N]`` or None; weights : ``[N]`` or None (default 1).

    Returns
    -------
    objf : float64 ``[N]`` per-sequence objective (to maximise);
    deriv : float64 ``[N, T, P]`` ``d objf_n / d y`` (rows of other sequences are 0);
    info : dict of floats (see module docstring).
    """
    y = nnet_output
    N, T, P = y.shape
    lengths = check_lengths(lengths, N, T)
    if weights is None:
        w = np.ones(N)
    else:
        w = np.asarray(weights.detach().cpu().numpy() if isinstance(weights, torch.Tensor) else weights,
                       dtype=np.float64)
        if w.shape != (N,) or not np.isfinite(w).all():
            raise ValueError(f"weights: expected {N} finite numbers, got shape {w.shape}")
    num_ll, num_post = num_forward_backward(num_graphs, y, lengths)
    den_ll, den_post = den_graph.forward_backward(y, lengths, leaky_hmm_coefficient, engine=den_engine)
    with np.errstate(invalid="ignore"):
        chain = num_ll - den_ll
    bad = ~np.isfinite(chain)
    deriv = (num_post - den_post) * w[:, None, None]
    frames = w * lengths
    if bad.any():
        warnings.warn(
            f"ChainLoss: {int(bad.sum())} sequence(s) {np.flatnonzero(bad).tolist()} have a non-finite "
            f"objective (numerator {num_ll[bad].tolist()}, denominator {den_ll[bad].tolist()}); "
            f"using Kaldi's fallback ({DEFAULT_OBJF} per frame, zero derivative)",
            RuntimeWarning, stacklevel=3)
        deriv[bad] = 0.0
    objf = np.where(bad, DEFAULT_OBJF * frames, w * np.where(bad, 0.0, chain))
    mask = (np.arange(T)[None, :] < lengths[:, None])[:, :, None]
    l2 = np.zeros(N)
    if l2_regularize:
        ym = np.where(mask, y, 0.0)
        l2 = -0.5 * l2_regularize * w * (ym ** 2).sum(axis=(1, 2))
        deriv -= l2_regularize * w[:, None, None] * ym
    oor = np.zeros(N)
    if out_of_range_regularize:
        excess = np.where(mask, y - np.clip(y, -CLAMP, CLAMP), 0.0)
        oor = -0.5 * out_of_range_regularize * w * (excess ** 2).sum(axis=(1, 2))
        deriv -= out_of_range_regularize * w[:, None, None] * excess
    total = objf + l2 + oor
    good = ~bad
    info = {
        "num": float((w * num_ll)[good].sum()),
        "den": float((w * den_ll)[good].sum()),
        "l2": float(l2.sum()),
        "oor": float(oor.sum()),
        "objf": float(total.sum()),
        "frames": float(frames.sum()),
        "num_fallback": int(bad.sum()),
    }
    info["objf_per_frame"] = info["objf"] / info["frames"] if info["frames"] else 0.0
    return total, deriv, info
