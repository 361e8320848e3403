"""Kaldi's chain API in one place: ``Supervision`` and
``GenericNumeratorComputation`` (chain-generic-numerator.h) and
``DenominatorComputation`` (chain-denominator.h).

The network output is 2-D, ``[frames_per_sequence * num_sequences,
num_pdfs]`` with row ``t * num_sequences + seq`` (its row stride may be wider
than ``num_pdfs``).  It is viewed, without copying, as a strided ``[N, T, P]``
array and goes through the same score map and engine as
:func:`chainfb.forward_backward`.

Differences from Kaldi, on purpose: variable-length sequences; exact
log-domain arithmetic (no start-state offset, so start states with
self-loops are exact); the total log-likelihood is multiplied by the
supervision weight like the derivatives (Kaldi forgets to).

This is chainfb's Kaldi drop-in, beside the others in :mod:`chainfb.compat`;
``chainfb.kaldi``, its old path, and the package (``from chainfb import
GenericNumeratorComputation``) re-export it.  ``Supervision`` is defined
with the chain package (:mod:`chainfb.chain.supervision`, as Kaldi keeps it
in ``chain/``), whose examples make it.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import engines
from .. import checks
from .._arrays import Array, Ints, as_array, check_lengths, is_torch
from ..chain.denominator import DenominatorGraph
from ..chain.supervision import Supervision
from ..cuda.interop import cuda_device_of, on_torch_stream, torch_stream
from ..lattice import Lattice
from ..score_map import PdfScoreMap

__all__ = ["Supervision", "GenericNumeratorComputation", "DenominatorComputation"]


def _kaldi_view(xp, arr, N: int, T: int, name: str):
    """The ``[N, T, P]`` strided view of a Kaldi-layout ``[T*N, P]`` matrix."""
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix [T*N, num_pdfs], got shape {tuple(arr.shape)}")
    if arr.shape[0] != T * N:
        raise ValueError(
            f"{name}: expected frames_per_sequence*num_sequences = {T}*{N} = {T * N} rows, got {arr.shape[0]}"
        )
    rs, cs = arr.strides
    if rs < 0 or cs < 0:
        raise ValueError(f"{name}: strides must be non-negative, got {arr.strides}")
    return xp.lib.stride_tricks.as_strided(arr, shape=(N, T, arr.shape[1]), strides=(rs, N * rs, cs))


class GenericNumeratorComputation:
    """Forward-backward of e2e numerator graphs over a Kaldi-layout output.

    Parameters
    ----------
    supervision : Supervision
    nnet_output : ``[T * N, >= num_pdfs]`` NumPy/CuPy array or torch tensor
        Row ``t * N + seq``.  Only the columns the graphs use are read.
    """

    @on_torch_stream
    def __init__(self, supervision: Supervision, nnet_output: Array):
        if not isinstance(supervision, Supervision):
            raise TypeError(f"supervision: expected chainfb.Supervision, got {type(supervision).__name__}")
        self.supervision = supervision
        self._device = cuda_device_of(nnet_output)  # CUDA tensors: CuPy work on torch's stream (torch_stream)
        self._arr, self._xp = as_array(nnet_output, "nnet_output")
        N, T = supervision.num_sequences, supervision.frames_per_sequence
        self._view = _kaldi_view(self._xp, self._arr, N, T, "nnet_output")
        self.lattice = Lattice.of(supervision.batch)
        self.score_map = PdfScoreMap(self.lattice.col_seq, self.lattice.col_pdf, "nnet_output")
        if supervision.batch.num_pdfs > self._arr.shape[1]:
            raise ValueError(
                f"nnet_output: the graphs use pdf {supervision.batch.num_pdfs - 1} "
                f"but nnet_output has {self._arr.shape[1]} columns"
            )

    def _run(self, need_posteriors: bool):
        X = self.score_map.gather(self._xp, self._view)
        return engines.forward_backward(self.lattice, X, self.supervision.lengths, need_posteriors=need_posteriors)

    def compute_objf(self) -> float:
        """Weighted total log-likelihood (forward pass only)."""
        with torch_stream(self._device):
            loglike, _ = self._run(False)
            return self.supervision.weight * float(loglike.sum())

    def forward_backward(self, nnet_output_deriv: Array) -> tuple[bool, float]:
        """Add ``weight * posteriors`` into ``nnet_output_deriv`` (same layout).

        Returns ``(ok, total_loglike)`` where ``total_loglike`` is the weighted
        sum over sequences.  ``ok`` is False when the total is not finite or a
        sequence's posteriors at some frame do not sum to 1 within 5% (Kaldi's
        check; a relative error beyond 1e-3 warns).
        """
        sup = self.supervision
        N, T = sup.num_sequences, sup.frames_per_sequence
        if is_torch(nnet_output_deriv) and nnet_output_deriv.requires_grad:
            raise ValueError("nnet_output_deriv: must not require grad (it is written in place)")
        with torch_stream(self._device):
            deriv, _ = as_array(nnet_output_deriv, "nnet_output_deriv")
            dview = _kaldi_view(self._xp, deriv, N, T, "nnet_output_deriv")
            if sup.batch.num_pdfs > deriv.shape[1]:
                raise ValueError(
                    f"nnet_output_deriv: the graphs use pdf {sup.batch.num_pdfs - 1} "
                    f"but it has {deriv.shape[1]} columns"
                )
            loglike, post = self._run(True)
            self.score_map.scatter_add(self._xp, dview, post, sup.weight, name="nnet_output_deriv")
            total = sup.weight * float(loglike.sum())
            # Kaldi's CheckValues: per sequence and frame, the posteriors sum to 1
            # (ok and the total are host values, so the posteriors come to the host)
            post_host = post if self._xp is np else post.get()
        ok = bool(np.isfinite(total))
        sums = np.zeros((N, post_host.shape[0]))
        if post_host.size:
            np.add.at(sums, self.lattice.col_seq, post_host.T)
        valid = np.arange(sums.shape[1])[None, :] < sup.lengths[:, None]
        err = np.abs(sums - 1.0)[valid]
        if err.size:
            worst = np.inf if np.isnan(err).any() else float(err.max())
            if worst > 0.05:
                ok = False
            elif worst > 1e-3:
                warnings.warn(f"GenericNumeratorComputation: posterior sums deviate from 1 by {worst:.3g}",
                              stacklevel=2)
        return ok, total


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
    engine : see :meth:`chainfb.chain.DenominatorGraph.forward_backward`.

    ``forward()`` returns the total log-likelihood (sum over sequences);
    ``backward(deriv_weight, nnet_output_deriv)`` adds ``deriv_weight *
    posteriors`` into ``nnet_output_deriv`` (same layout) and returns ``ok``:
    False when the total is not finite or the posteriors of some frame do
    not sum to the number of sequences within 1% (Kaldi's check).
    """

    def __init__(self, den_graph: DenominatorGraph, num_sequences: int, nnet_output: Array,
                 leaky_hmm_coefficient: float = 1e-5, lengths: Ints | None = None, engine: str = "auto"):
        if not isinstance(den_graph, DenominatorGraph):
            raise TypeError(f"den_graph: expected DenominatorGraph, got {type(den_graph).__name__}")
        arr, xp = as_array(nnet_output, "nnet_output")
        N = checks.integer(num_sequences, "num_sequences", lo=1)
        if arr.ndim != 2 or arr.shape[0] % N:
            raise ValueError(f"nnet_output: expected [T * {N}, P] rows, got shape {tuple(arr.shape)}")
        self.den_graph, self.N, self.T = den_graph, N, arr.shape[0] // N
        self._xp = xp
        self._view = _kaldi_view(xp, arr, N, self.T, "nnet_output")
        self.lengths = check_lengths(lengths, N, self.T)
        self.leaky = checks.number(leaky_hmm_coefficient, "leaky_hmm_coefficient", 0.0, 1.0, hi_open=True)
        self.engine = engine
        self._post = None

    def forward(self) -> float:
        """Total denominator log-likelihood over the sequences."""
        ll, self._post = self.den_graph.forward_backward(self._view, self.lengths, self.leaky, True, self.engine)
        self._total = float(np.asarray(ll).sum())
        return self._total

    def backward(self, deriv_weight: float, nnet_output_deriv: Array) -> bool:
        """Add ``deriv_weight * posteriors`` into ``nnet_output_deriv``; returns ok."""
        deriv_weight = checks.number(deriv_weight, "deriv_weight")
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
