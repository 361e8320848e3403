"""The transducer criterion, :class:`TransducerCriterion`: the RNN-T /
multi-blank step graphs of :mod:`.graphs` plus the transducer score map,
with the backends of :mod:`chainfb.transducer.maps` behind it (torch ops,
the compiled CPU map, the CUDA kernels or their CPU emulation).

Arc meanings live here and nowhere else.  Main state ``u`` of utterance
``b`` has arc kinds ``j`` (see :mod:`.graphs`); :func:`symbol_table` gives
the vocabulary index each kind reads, ``sym[b, u, j]`` (``j = 0`` the
blank, ``j = 1`` the label ``targets[b, u]`` for ``u < U_b``, ``j = 2 + i``
big blank ``i``; ``-1`` where unused), and ``kind_weight[j]`` scales the
gradient terms of kind ``j`` (FastEmit: ``1 + lambda`` on the label kind).
The score-map kernels only see these two tables.

Gather (fused log-softmax + skewed gather): column ``c = colidx[b, u, j]``
of the engine's ``X[n, c]`` holds ``lp[b, t = n - u, u, sym[b, u, j]]`` for
``t`` in ``[0, T_b)`` and ``-inf`` elsewhere, where ``lp = logits -
logsumexp_V(logits)`` (or the logits themselves when
``fused_log_softmax=False``).  NeMo's boundary rules for big blanks follow
from the exact-length rule (:class:`~chainfb.transducer.graphs.ScoreEntries`).

Gradient of the cost ``-(1 + lambda) loglike`` w.r.t. the logits, written
into one new tensor the size of the logits (the buffer that held the
softmax during the gather)::

    grad[b,t,u,k] = softmax_k(b,t,u) * sum_j w_j(t,u)  -  sum_j w_j(t,u) [k == sym_j]
    w_j = kind_weight[j] * post_j(t, u)

with ``post_j(t, u)`` the engine posterior of column ``(b, u, j)`` at step
``t + u``; no softmax term when not fused; clamped to ``[-clamp, clamp]``
when ``clamp > 0``; zero for utterances whose cost is not finite.  With
``kind_weight = 1`` this is ``d(-loglike)/d logits``; FastEmit's label
weight ``1 + lambda`` gives NeMo's FastEmit gradient.  Nothing else 4-D is
built: the normaliser is kept per ``(b, t, u)``.

The score map's backends (torch ops, the compiled CPU map, the CUDA
kernels) live in :mod:`chainfb.transducer.maps`, which picks one per call
from where the logits live; the index tables are fixed per layout and
cached on it per device and stream, so a call uploads no metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._arrays import Array
from ..criterion import Criterion, DeferredGrad
from ..cuda.interop import cuda_device_of
from . import maps
from .graphs import compile_layout
from .maps import layout_tables, torch_compute_dtype  # noqa: F401 -- their old import path
from .maps.cuda import kernel_gather, kernel_gradient, kernel_tables  # noqa: F401 -- their old import path

__all__ = ["TransducerCriterion", "symbol_table", "host_symbols", "layout_symbols", "torch_compute_dtype",
           "layout_tables", "kernel_tables", "kernel_gather", "kernel_gradient"]


def symbol_table(targets: torch.Tensor, target_lengths: Array, U1: int, blank: int,
                 big_blanks: Sequence[int] = ()) -> torch.Tensor:
    """``sym [B, U1, 2 + M]`` int32 on ``targets``' device: the vocabulary
    index arc kind ``j`` of main state ``u`` reads (``-1`` for the label
    kind at ``u >= U_b``).

    targets ``[B, >= max(U_b)]`` ints (tensor or NumPy); target_lengths
    ``[B]`` (a tensor on ``targets``' device is used as is; NumPy is copied
    there); ``big_blanks[i]`` the index of big blank ``i``."""
    if not isinstance(targets, torch.Tensor):
        targets = torch.from_numpy(np.asarray(targets))
    dev = targets.device
    B = targets.shape[0]
    M = len(big_blanks)
    sym = torch.empty((B, U1, 2 + M), dtype=torch.int32, device=dev)
    sym[:, :, 0] = int(blank)
    lab = torch.full((B, U1), -1, dtype=torch.int32, device=dev)
    k = min(U1, targets.shape[1])
    lab[:, :k] = targets[:, :k].to(torch.int32)
    if isinstance(target_lengths, torch.Tensor):
        ul = target_lengths.to(dev)
    else:
        ul = torch.as_tensor(np.asarray(target_lengths), device=dev)
    lab.masked_fill_(torch.arange(U1, device=dev)[None, :] >= ul[:, None], -1)
    sym[:, :, 1] = lab
    for i, s in enumerate(big_blanks):
        sym[:, :, 2 + i] = int(s)
    return sym


def host_symbols(targets: np.ndarray, target_lengths: np.ndarray, U1: int, blank: int,
                 big_blanks: Sequence[int] = ()) -> np.ndarray:
    """:func:`symbol_table` from host
    (NumPy) targets ``[B, >= max(U_b)]`` and ``U_b`` ``[B]``: int64 ``[B, U1, 2 + M]``."""
    B = targets.shape[0]
    sym = np.empty((B, U1, 2 + len(big_blanks)), dtype=np.int64)
    sym[:, :, 0] = int(blank)
    lab = np.full((B, U1), -1, dtype=np.int64)
    k = min(U1, targets.shape[1])
    lab[:, :k] = targets[:, :k]
    lab[np.arange(U1)[None, :] >= np.asarray(target_lengths)[:, None]] = -1
    sym[:, :, 1] = lab
    for i, s in enumerate(big_blanks):
        sym[:, :, 2 + i] = int(s)
    return sym


def layout_symbols(targets: Array, layout: Any, U1: int, blank: int, big_blanks: Sequence[int] = (),
                   host_table: np.ndarray | None = None) -> torch.Tensor:
    """:func:`symbol_table` of a batch whose lengths ``layout`` holds (a
    :class:`~chainfb.transducer.graphs.TransducerLayout`).  For CUDA targets
    whose table the host already has (``host_table``, :func:`host_symbols`
    of the targets read there), the table reaches the GPU in one asynchronous
    copy from pinned memory, where the device-side build is seven small
    kernels and four allocations."""
    if host_table is not None and isinstance(targets, torch.Tensor) and targets.is_cuda:
        return torch.from_numpy(host_table.astype(np.int32)).pin_memory().to(targets.device, non_blocking=True)
    ul = layout_tables(layout, targets.device)["target_lengths"] if isinstance(targets, torch.Tensor) else \
        layout.target_lengths
    return symbol_table(targets, ul, U1, blank, big_blanks)


class MappedCriterion(Criterion):
    """A transducer criterion whose score map is one of
    :mod:`chainfb.transducer.maps`' kinds (``kind``: ``"rnnt"`` for RNN-T and
    multi-blank, ``"tdt"``): value ``-(1 + fastemit_lambda) * loglike``
    ``[B]`` in the logits' dtype; the gather's work reaches the gradient in
    the context :meth:`start` returns, so the object keeps no per-call
    state."""

    kind = ""
    fastemit_lambda = 0.0

    def start(self, x: torch.Tensor, need_grad: bool = True) -> tuple[Any, Any]:
        """``(X [num_steps, C], ctx)``: the engine's scores of the logits ``x
        [B, T, U1, V]`` (TDT: ``V + D``) and what :meth:`complete` needs of this call."""
        return maps.gather(self.kind, self, x, need_grad)

    def gather(self, x: torch.Tensor, need_grad: bool = True) -> Any:
        """The engine's scores ``X [num_steps, C]`` of ``x`` (the gather half alone)."""
        return self.start(x, need_grad)[0]

    def complete(self, x: torch.Tensor, loglike: Any, post: Any | None,
                 ctx: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(loss [B], grad like x or None)`` from the engine's ``loglike [B]``
        and ``post [num_steps, C]`` (None: no gradient) and :meth:`start`'s ``ctx``."""
        value = (-(1.0 + self.fastemit_lambda) * maps.as_tensor(loglike, x.device)).to(x.dtype)
        if post is None:
            return value, None
        return value, maps.gradient(self.kind, self, x, loglike, post, ctx)

    def complete_deferred(self, x: torch.Tensor, loglike: Any, post: Any | None,
                          ctx: Any) -> tuple[torch.Tensor, torch.Tensor | DeferredGrad | None]:
        """:meth:`complete`, with the gradient left as a :class:`~chainfb.criterion.DeferredGrad` on a score-map
        backend that ``DEFERS`` (the kernels'): backward then runs the gradient kernel with each utterance's
        incoming gradient as its scale -- no dense multiply, no host read of the incoming gradient, and no
        gradient the size of the logits between forward and backward."""
        if post is None or not getattr(ctx.backend, "DEFERS", False):
            return self.complete(x, loglike, post, ctx)
        value, _ = self.complete(x, loglike, None, ctx)
        return value, DeferredGrad(tuple(x.shape), lambda scale: maps.gradient(self.kind, self, x, loglike, post, ctx,
                                                                                scale), cuda_device_of(x))

    def finish(self, x: torch.Tensor, loglike: Any, post: Any | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``complete`` after a gather of its own (this criterion keeps nothing between calls)."""
        return self.complete(x, loglike, post, self.start(x, post is not None)[1])


class TransducerCriterion(MappedCriterion):
    """RNN-T (``durations=()``) or multi-blank RNN-T compiled for a batch.

    Value: the cost ``-(1 + fastemit_lambda) * loglike`` ``[B]`` in the
    logits' dtype; gradient as in the module docstring.

    Parameters
    ----------
    shape : ``(B, T, U1, V)`` of the logits.
    targets : ``[B, >= max(U_b)]`` int tensor.
    logit_lengths, target_lengths : int64 NumPy ``[B]`` (``T_b``, ``U_b``), validated.
    blank : vocabulary index of the blank; durations : big-blank durations
        (big blank ``i`` at ``blank - 1 - i``); sigma : subtracted on real arcs.
    fused_log_softmax, fastemit_lambda, clamp : see :func:`chainfb.rnnt_loss`.
    host_targets : optional int NumPy copy of ``targets`` (the compiled CPU
        score map builds its symbol table from it without reading ``targets``).

    The score map runs on the backend :func:`chainfb.transducer.maps.select`
    picks for the logits; the gather's work reaches the gradient in the
    context :meth:`start` returns, so the object keeps no per-call state.
    """

    kind = "rnnt"

    def __init__(self, shape: tuple[int, ...], targets: Array, logit_lengths: np.ndarray,
                 target_lengths: np.ndarray, blank: int, durations: Sequence[int] = (), sigma: float = 0.0,
                 fused_log_softmax: bool = True, fastemit_lambda: float = 0.0, clamp: float = -1.0,
                 host_targets: Array | None = None):
        B, T, U1, V = shape
        self.layout = lay = compile_layout(target_lengths, logit_lengths, durations, sigma, umax=U1 - 1)
        self.lattice, self.lengths = lay.lat, lay.steps
        big = [blank - 1 - i for i in range(len(durations))]
        # the compiled CPU score map reads the symbol table from host targets when given (no crossing)
        self.host_sym = (None if host_targets is None
                         else host_symbols(np.asarray(host_targets), lay.target_lengths, U1, blank, big))
        self.sym = layout_symbols(targets, lay, U1, blank, big, self.host_sym)
        self.kind_weight = np.ones(2 + len(big))
        self.kind_weight[1] += fastemit_lambda
        self.fastemit_lambda, self.clamp, self.fused = float(fastemit_lambda), float(clamp), bool(fused_log_softmax)
