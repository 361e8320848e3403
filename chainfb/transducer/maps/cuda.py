"""The CUDA-kernel backend of the transducer score maps: the gather and
gradient kernels of ``chainfb/cuda/transducer.cu`` on the kernel backend of
the tensor (:func:`chainfb.cuda.kernels.backend_for`: CUDA tensors, or the
kernels' CPU emulation in the tests), a thin layer over the launchers of
:mod:`chainfb.cuda.transducer_maps`.  Same functions and signatures as every
backend (:mod:`chainfb.transducer.maps`).

RNN-T and multi-blank read ``sym [B, U1, J]`` directly; TDT's arc kind ``j =
kind * D + i`` reads the blank or the label and duration logit ``i``, at the
frames the layout's counts allow.  One read of each row per kernel; the
scores and the engine in float32 for 16/32-bit logits, float64 for float64.
The layout's tables are cached per device and stream (:func:`kernel_tables`):
a call uploads no metadata.  The grid has no kernels: :func:`grid_gather`
and :func:`grid_gradient` run on the host backend that serves the tensors
(:func:`chainfb.transducer.maps.host_backend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..._arrays import Array
from ...cuda import kernels
from ...cuda.kernels import KernelBackend
from ..graphs import TransducerLayout
from . import host_backend

if TYPE_CHECKING:
    from ..criterion import TransducerCriterion
    from ..grid import BandGridCriterion, GridCriterion
    from ..tdt import TDTCriterion

__all__ = ["DEFERS", "kernel_tables", "kernel_gather", "kernel_gradient", "rnnt_gather", "rnnt_gradient",
           "tdt_gather", "tdt_gradient", "grid_gather", "grid_gradient"]

#: the RNN-T and TDT gradients may be written in backward (``rnnt_gradient`` / ``tdt_gradient``'s ``scale``: the
#: incoming gradient, applied in the gradient kernel's one pass): no dense multiply, no host read of the incoming
#: gradient, and no gradient the size of the logits between forward and backward
#: (:meth:`chainfb.transducer.criterion.MappedCriterion.complete_deferred`)
DEFERS = True


def kernel_tables(layout: TransducerLayout, backend: KernelBackend) -> dict:
    """The layout's tables as the score-map kernels take them, int32 arrays
    on ``backend``'s device (``colidx [B, U1, J]``, ``logit_lengths``,
    ``target_lengths`` ``[B]``; for TDT also ``counts [B, U1, J]``, the
    frames each arc is read at, and ``kind_duration [J]``, the duration
    index of each arc kind), built once per device and stream
    (``backend.cache_key()``) and kept with the layout."""

    def build():
        xp = backend.xp

        def up(a):
            return None if a is None else xp.ascontiguousarray(xp.asarray(a.astype(np.int32)))

        out = {"colidx": up(layout.colidx), "logit_lengths": up(layout.logit_lengths),
               "target_lengths": up(layout.target_lengths)}
        if layout.family == "tdt":
            D = len(layout.durations)
            out.update(counts=up(layout.slot_counts()), kind_duration=up(np.tile(np.arange(D), 2)))
        return out

    return layout.cache(("kernels", backend.cache_key()), build)


def _kernel_weights(layout: TransducerLayout, backend, kind_weight: np.ndarray, dtype):
    """``kind_weight [J]`` on ``backend``'s device in ``dtype``, built once per
    device, stream, dtype and value and kept with the layout."""
    key = ("kind_weight", backend.cache_key(), np.dtype(dtype).name, tuple(np.asarray(kind_weight).tolist()))
    return layout.cache(key, lambda: backend.xp.asarray(np.asarray(kind_weight).astype(dtype)))


def _kernel_args(layout: TransducerLayout, backend, sym) -> tuple:
    """The arguments both score-map kernels take from a layout: ``(sym,
    colidx, logit_lengths, target_lengths)`` and, for TDT, the duration
    keywords (``num_durations``, ``kind_duration``, ``counts``)."""
    m = kernel_tables(layout, backend)
    kw = {}
    if layout.family == "tdt":
        kw = dict(num_durations=len(layout.durations), kind_duration=m["kind_duration"], counts=m["counts"])
    return (sym, m["colidx"], m["logit_lengths"], m["target_lengths"]), kw


def kernel_gather(backend: KernelBackend, layout: TransducerLayout, x: torch.Tensor, sym: Array, fused: bool = True,
                  shift: float = 0.0) -> tuple[Array, tuple[torch.Tensor, Array]]:
    """The engine's scores of a compiled transducer batch through the gather
    kernel on ``backend``: ``x [B, T, U1, V (+ D)]`` the logits, ``sym [B,
    U1, J]`` the token each arc kind reads (:func:`symbol_table`, or TDT's),
    ``shift`` subtracted from every score.  Returns ``X [num_steps, C]``
    (``backend.xp``, the kernels' compute dtype) and the state
    :func:`kernel_gradient` takes: the contiguous logits and the row
    normalisers."""
    from ...cuda.transducer_maps import transducer_gather

    xc = x.detach().contiguous()
    args, kw = _kernel_args(layout, backend, sym)
    X, lse = transducer_gather(backend, xc, *args, layout.num_steps, layout.lat.num_columns, fused_log_softmax=fused,
                               shift=shift, every_column=True, **kw)
    return X, (xc, lse)


def kernel_gradient(backend: KernelBackend, layout: TransducerLayout, sym: Array, state: tuple[torch.Tensor, Array],
                    loglike: Array, post: Array, kind_weight: np.ndarray, clamp: float,
                    fused: bool = True, seq_scale: Array | None = None) -> torch.Tensor:
    """The gradient ``[B, T, U1, V (+ D)]`` (the logits' type and dtype)
    through the gradient kernel: ``state`` from :func:`kernel_gather`,
    ``loglike [B]`` and ``post`` the engine's outputs, ``kind_weight [J]``
    each arc kind's weight, ``clamp`` on the token part; utterances whose
    log-likelihood is not finite get a zero gradient; with ``seq_scale
    [B]`` (finite) each utterance's gradient times its factor, in the same
    pass."""
    from ...cuda.transducer_maps import transducer_grad

    xc, lse = state
    scale = backend.xp.isfinite(loglike).astype(lse.dtype)
    if seq_scale is not None:
        scale = scale * backend.xp.asarray(seq_scale).astype(lse.dtype)
    args, kw = _kernel_args(layout, backend, sym)
    weights = _kernel_weights(layout, backend, kind_weight, lse.dtype)
    return transducer_grad(backend, xc, *args, post, lse, scale, weights, clamp=clamp, fused_log_softmax=fused, **kw)


def rnnt_gather(crit: TransducerCriterion, x: torch.Tensor, need_grad: bool) -> tuple:
    """``(X, state)`` of an RNN-T / multi-blank criterion through the gather kernel."""
    kb = kernels.backend_for(x)
    X, state = kernel_gather(kb, crit.layout, x, crit.sym, crit.fused)
    return X, (kb, crit.sym, state)


def rnnt_gradient(crit: TransducerCriterion, x: torch.Tensor, loglike: Array, post: Array, state: Any,
                  scale: Array | None = None) -> torch.Tensor:
    """The gradient ``[B, T, U1, V]`` through the gradient kernel (times ``scale [B]`` per utterance)."""
    kb, sym, state = state
    return kernel_gradient(kb, crit.layout, sym, state, loglike, post, crit.kind_weight, crit.clamp, crit.fused,
                           seq_scale=scale)


def _tdt_symbols(crit, x: torch.Tensor):
    """``[B, U1, 2 D]``: arc kind ``j = kind * D + i`` reads token ``sym[kind]`` and duration ``i``."""
    B, T, U1, _ = x.shape
    D = len(crit.durations)
    return crit.sym[..., None].expand(B, U1, 2, D).reshape(B, U1, 2 * D)


def tdt_gather(crit: TDTCriterion, x: torch.Tensor, need_grad: bool) -> tuple:
    """``(X, state)`` of a TDT criterion through the gather kernel (``sigma`` subtracted from every score)."""
    kb, sym = kernels.backend_for(x), _tdt_symbols(crit, x)
    X, state = kernel_gather(kb, crit.layout, x, sym, shift=crit.sigma)
    return X, (kb, sym, state)


def tdt_gradient(crit: TDTCriterion, x: torch.Tensor, loglike: Array, post: Array, state: Any,
                 scale: Array | None = None) -> torch.Tensor:
    """The TDT gradient ``[B, T, U1, V + D]`` through the gradient kernel (times ``scale [B]`` per utterance)."""
    kb, sym, state = state
    return kernel_gradient(kb, crit.layout, sym, state, loglike, post, crit.kind_weight, crit.clamp, seq_scale=scale)


def grid_gather(crit: GridCriterion | BandGridCriterion, x: tuple, need_grad: bool) -> tuple:
    """``(X, state)`` of a grid criterion on the host backend that serves ``(px, py)``."""
    return host_backend(x[0]).grid_gather(crit, x, need_grad)


def grid_gradient(crit: GridCriterion | BandGridCriterion, x: tuple, loglike: Array, post: Array, state: Any) -> tuple:
    """``(px_grad, py_grad)`` on the host backend that serves ``(px, py)``."""
    return host_backend(x[0]).grid_gradient(crit, x, loglike, post, state)
