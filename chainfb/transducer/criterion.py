"""The transducer criterion, :class:`TransducerCriterion`: the RNN-T /
multi-blank step graphs of :mod:`.graphs` plus the transducer score map,
with a torch backend (CPU) and a CUDA-kernel backend (GPU, or the kernels'
CPU emulation) behind it.

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

Crossings.  The score map's index tables are fixed per layout and cached on
it per device and stream (:func:`layout_tables`, :func:`kernel_tables`), so
a call uploads no metadata.  On the CPU a call converts the gathered scores
to NumPy once and the engine's log-likelihoods and posteriors back once
each; everything else stays in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..criterion import Criterion
from ..cuda import kernels
from . import cpu_maps
from .graphs import TransducerLayout, compile_layout

__all__ = ["TransducerCriterion", "symbol_table", "torch_compute_dtype", "layout_tables", "kernel_tables",
           "kernel_gather", "kernel_gradient"]


def torch_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, float16 and bfloat16 compute in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _place(device: torch.device) -> tuple:
    """Where torch tensors made now live and are ordered: the device and,
    on a GPU, torch's current stream (arrays used only on the stream that
    allocated them need no cross-stream synchronisation)."""
    if device.type != "cuda":
        return (device.type,)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return ("cuda", index, torch.cuda.current_stream(index).cuda_stream)


def layout_tables(layout: TransducerLayout, device, T: int | None = None) -> dict:
    """The layout's index tables as int64 torch tensors on ``device``, built
    once per device and stream and kept with the layout: ``target_lengths``
    ``[B]`` and, given the logits' frame
    count ``T``, the :class:`~chainfb.transducer.graphs.ScoreEntries`
    ``rows``, ``cols``, ``flat``, ``cells``, ``slots``, ``kinds``, ``arcs`` ``[E]``."""
    device = torch.device(device)

    def build():
        out = {"target_lengths": layout.target_lengths}
        if T is not None:
            e = layout.entries(T)
            out.update(rows=e.rows, cols=e.cols, flat=e.flat, cells=e.cells, slots=e.slots, kinds=e.kinds,
                       arcs=e.arcs)
        return {k: torch.from_numpy(v).to(device) for k, v in out.items()}

    return layout.memo(("torch", T) + _place(device), build)


def kernel_tables(layout: TransducerLayout, backend) -> dict:
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

    return layout.memo(("kernels", backend.cache_key()), build)


def _kernel_weights(layout: TransducerLayout, backend, kind_weight: np.ndarray, dtype):
    """``kind_weight [J]`` on ``backend``'s device in ``dtype``, built once per
    device, stream, dtype and value and kept with the layout."""
    key = ("kind_weight", backend.cache_key(), np.dtype(dtype).name, tuple(np.asarray(kind_weight).tolist()))
    return layout.memo(key, lambda: backend.xp.asarray(np.asarray(kind_weight).astype(dtype)))


def _kernel_args(layout: TransducerLayout, backend, sym) -> tuple:
    """The arguments both score-map kernels take from a layout: ``(sym,
    colidx, logit_lengths, target_lengths)`` and, for TDT, the duration
    keywords (``num_durations``, ``kind_duration``, ``counts``)."""
    m = kernel_tables(layout, backend)
    kw = {}
    if layout.family == "tdt":
        kw = dict(num_durations=len(layout.durations), kind_duration=m["kind_duration"], counts=m["counts"])
    return (sym, m["colidx"], m["logit_lengths"], m["target_lengths"]), kw


def kernel_gather(backend, layout: TransducerLayout, x: torch.Tensor, sym, fused: bool = True, shift: float = 0.0):
    """The engine's scores of a compiled transducer batch through the gather
    kernel on ``backend``: ``x [B, T, U1, V (+ D)]`` the logits, ``sym [B,
    U1, J]`` the token each arc kind reads (:func:`symbol_table`, or TDT's),
    ``shift`` subtracted from every score.  Returns ``X [num_steps, C]``
    (``backend.xp``, the kernels' compute dtype) and the state
    :func:`kernel_gradient` takes: the contiguous logits and the row
    normalisers."""
    from ..cuda.transducer_maps import transducer_gather

    xc = x.detach().contiguous()
    args, kw = _kernel_args(layout, backend, sym)
    X, lse = transducer_gather(backend, xc, *args, layout.num_steps, layout.lat.num_columns, fused_log_softmax=fused,
                               shift=shift, every_column=True, **kw)
    return X, (xc, lse)


def kernel_gradient(backend, layout: TransducerLayout, sym, state, loglike, post, kind_weight, clamp: float,
                    fused: bool = True):
    """The gradient ``[B, T, U1, V (+ D)]`` (the logits' type and dtype)
    through the gradient kernel: ``state`` from :func:`kernel_gather`,
    ``loglike [B]`` and ``post`` the engine's outputs, ``kind_weight [J]``
    each arc kind's weight, ``clamp`` on the token part; utterances whose
    log-likelihood is not finite get a zero gradient."""
    from ..cuda.transducer_maps import transducer_grad

    xc, lse = state
    scale = backend.xp.isfinite(loglike).astype(lse.dtype)
    args, kw = _kernel_args(layout, backend, sym)
    return transducer_grad(backend, xc, *args, post, lse, scale, _kernel_weights(layout, backend, kind_weight, lse.dtype),
                           clamp=clamp, fused_log_softmax=fused, **kw)


def symbol_table(targets: torch.Tensor, target_lengths, U1: int, blank: int, big_blanks=()) -> torch.Tensor:
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


class TransducerCriterion(Criterion):
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

    The score map runs on the kernel backend of the logits
    (:func:`chainfb.cuda.kernels.backend_for`: CUDA kernels for CUDA
    logits), the torch backend otherwise.
    """

    def __init__(self, shape, targets, logit_lengths, target_lengths, blank, durations=(), sigma=0.0,
                 fused_log_softmax=True, fastemit_lambda=0.0, clamp=-1.0, host_targets=None):
        B, T, U1, V = shape
        self.layout = lay = compile_layout(target_lengths, logit_lengths, durations, sigma, umax=U1 - 1)
        self.lattice, self.lengths = lay.lat, lay.steps
        big = [blank - 1 - i for i in range(len(durations))]
        # the compiled CPU score map reads the symbol table from host targets when given (no crossing)
        self._host_sym = (None if host_targets is None
                          else cpu_maps.host_symbols(np.asarray(host_targets), lay.target_lengths, U1, blank, big))
        if isinstance(targets, torch.Tensor):
            ul = layout_tables(lay, targets.device)["target_lengths"]
        else:
            ul = lay.target_lengths
        self.sym = symbol_table(targets, ul, U1, blank, big)
        self.kind_weight = np.ones(2 + len(big))
        self.kind_weight[1] += fastemit_lambda
        self.fastemit_lambda, self.clamp, self.fused = float(fastemit_lambda), float(clamp), bool(fused_log_softmax)
        self._state = self._backend = None

    def gather(self, x, need_grad=True):
        kb = self._backend = kernels.backend_for(x)  # finish runs on the same backend
        if kb is None and cpu_maps.available(x.dtype):
            xn = x.detach().contiguous().numpy()
            sym = self._host_sym if self._host_sym is not None else self.sym.cpu().numpy()
            grad, out = cpu_maps.new_gradient(xn.shape, x.dtype) if need_grad else (None, None)
            X, norm, inv = cpu_maps.rnnt_gather(xn, sym, self.layout, self.fused, out)
            self._state = ("compiled", xn, sym, norm, inv, grad, out)
            return X
        if kb is None:
            X, self._state = _torch_gather(x, self.sym, self.layout, self.fused, need_grad)
            return X
        X, self._state = kernel_gather(kb, self.layout, x, self.sym, self.fused)
        return X

    def finish(self, x, loglike, post):
        kb = self._backend
        if kb is None:
            ll = torch.from_numpy(np.asarray(loglike))
        elif kb.xp is np:
            ll = torch.from_numpy(loglike)
        else:
            ll = torch.from_dlpack(loglike)
        value = (-(1.0 + self.fastemit_lambda) * ll).to(x.dtype)
        state, self._state = self._state, None
        if post is None:
            return value, None
        if kb is None and isinstance(state, tuple):  # the compiled score map
            _, xn, sym, norm, inv, grad, out = state
            cpu_maps.rnnt_gradient(xn, sym, self.layout, norm, inv, post, self.kind_weight, ~np.isfinite(loglike),
                                   self.clamp, self.fused, out, kept=True)
            return value, grad
        if kb is None:
            bad = ~torch.isfinite(ll)
            grad = _torch_gradient(state, post, self.kind_weight, self.clamp, bad, out_dtype=x.dtype)
            return value, grad
        return value, kernel_gradient(kb, self.layout, self.sym, state, loglike, post, self.kind_weight, self.clamp,
                                      self.fused)


@dataclass
class ScoreMapState:
    """What :func:`_torch_gather` keeps for :func:`_torch_gradient`.

    ``work``: ``[B, T, U, V]`` compute-dtype buffer holding the softmax
    (becomes the gradient; zeros when not fused) or ``None``; ``tables``:
    the layout's torch index tables (:func:`layout_tables`: engine
    coordinates ``rows``/``cols``, flat ``(b, t, u)`` ``cells`` and arc
    ``kinds`` of every gathered entry ``[E]``); ``elems``: flat
    ``(b, t, u, sym)`` index ``[E]``.
    """

    work: torch.Tensor | None
    tables: dict
    elems: torch.Tensor
    shape: tuple
    fused: bool


def _torch_gather(logits: torch.Tensor, sym: torch.Tensor, layout, fused_log_softmax: bool = True,
                  need_gradient: bool = True):
    """Engine scores of a compiled transducer batch (torch backend).

    Parameters
    ----------
    logits : ``[B, T, U, V]`` CPU tensor (any float dtype; read, never
        written; a non-contiguous tensor is copied once).
    sym : ``[B, U, J]`` int symbol table (:func:`symbol_table`).
    layout : the batch's :class:`~chainfb.transducer.graphs.TransducerLayout`.

    Returns
    -------
    X : float64 NumPy ``[num_steps, C]`` and a :class:`ScoreMapState`.
    """
    B, T, U1, V = logits.shape
    x = logits.detach()
    if not x.is_contiguous():  # flat indexing below; a non-contiguous input costs one copy
        x = x.contiguous()
    ct = torch_compute_dtype(x.dtype)
    work = None
    if fused_log_softmax:
        if need_gradient:
            # the one new 4-D tensor: softmax (one fused pass), later turned into the gradient
            mx = x.amax(dim=-1).to(ct)
            work = torch.softmax(x, dim=-1, dtype=ct)
            # normaliser from the row maximum, whose probability (>= 1/V) never underflows
            norm = mx - work.amax(dim=-1).log_()
            bad_rows = ~torch.isfinite(mx)
            if bool(bad_rows.any()):  # all -inf / inf / NaN rows: no usable softmax there (CPU: no sync cost)
                work[bad_rows] = 0.0
        else:
            norm = torch.logsumexp(x.to(ct) if x.dtype != ct else x, dim=-1)
    elif need_gradient:
        work = torch.zeros((B, T, U1, V), dtype=ct)

    tab = layout_tables(layout, x.device, T)
    symbols = sym.to(x.device).reshape(-1).index_select(0, tab["slots"]).to(torch.int64)
    if bool((symbols < 0).any()):
        raise ValueError("sym: an arc of the graph reads no symbol (-1 in the symbol table)")
    elems = tab["cells"] * V + symbols
    vals = x.reshape(-1).index_select(0, elems).to(torch.float64)
    if fused_log_softmax:
        vals -= norm.reshape(-1).index_select(0, tab["cells"]).to(torch.float64)
    X = torch.full((layout.num_steps, layout.lat.num_columns), -np.inf, dtype=torch.float64)
    X.view(-1)[tab["flat"]] = vals
    return X.numpy(), ScoreMapState(work, tab, elems, (B, T, U1, V), fused_log_softmax)


def _torch_gradient(state: ScoreMapState, post, kind_weight, clamp: float = -1.0, zero_samples=None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gradient ``[B, T, U, V]`` (module docstring), written into ``state.work``.

    ``post`` float64 ``[num_steps, C]`` engine posteriors (NumPy, converted
    once, or a tensor); ``kind_weight`` ``[J]``.  ``clamp > 0`` clamps every
    element to ``[-clamp, clamp]``; ``zero_samples`` bool ``[B]`` (tensor
    or NumPy) zeroes whole samples (non-finite costs).  Returned in
    ``out_dtype`` (default: the compute dtype).
    """
    B, T, U1, V = state.shape
    g = state.work
    if g is None:
        raise ValueError("state: the gather ran without need_gradient")
    tab = state.tables
    P = post if isinstance(post, torch.Tensor) else torch.from_numpy(np.asarray(post))
    kw = torch.tensor(np.asarray(kind_weight, dtype=np.float64).tolist(), dtype=torch.float64)
    w = P.reshape(-1).index_select(0, tab["flat"]) * kw[tab["kinds"]]
    if state.fused:
        occ = torch.zeros(B * T * U1, dtype=torch.float64).index_add_(0, tab["cells"], w)
        g.mul_(occ.to(g.dtype).view(B, T, U1, 1))  # softmax * occupancy; cells never visited get exactly 0
    g.view(-1).index_add_(0, state.elems, w.to(g.dtype), alpha=-1)
    if clamp is not None and clamp > 0:
        g.clamp_(-clamp, clamp)
    if zero_samples is not None:
        z = zero_samples if isinstance(zero_samples, torch.Tensor) else torch.tensor(
            np.asarray(zero_samples, dtype=bool).tolist(), dtype=torch.bool)
        if bool(z.any()):  # a CPU tensor: no sync to avoid, and a pass over the gradient saved
            g[z] = 0.0
    if out_dtype is not None and out_dtype != g.dtype:
        g = g.to(out_dtype)
    state.work = None
    return g
