"""The criterion seam: a criterion is a graph compiler plus a score map, and
one autograd Function runs any of them.

A :class:`Criterion` is what a compiler produces for one batch:

- ``lattice`` (:class:`~chainfb.lattice.Lattice`), the engine ``lengths
  [N]`` and, optionally, ``leaky`` and an ``engine`` name -- the graph side;
- ``gather(x, need_grad) -> X [T, C]``: the engine's compact scores from the user's
  tensor ``x`` -- the score map's forward half;
- ``finish(x, loglike, post) -> (value [N], grad)``: the per-sequence value
  the criterion reports and its gradient w.r.t. ``x`` (``post`` is the
  engine's ``d loglike / d X``, or None when no gradient is needed) -- the
  score map's backward half.

A criterion whose two halves share work (row normalisers, a gradient
buffer) passes it from one to the other in a context object instead of
keeping it on itself: ``start(x, need_grad) -> (X, ctx)`` and ``complete(x,
loglike, post, ctx) -> (value, grad)``, which :meth:`Criterion.run` calls.
Their defaults are ``gather`` (with no context) and ``finish``; the
criteria of this package define them, so one criterion object may be
reused, and run from several threads at once.  An input's gradient is batch-first like the
  input (row ``n``: ``d value[n] / d x[n]``), or, for an input shared by
  the ``N`` sequences (a parameter ``w``), the per-sequence gradients ``[N,
  *w.shape]`` (``d value[n] / d w``), which backward sums weighted by the
  incoming gradient; any other shape is a ``ValueError`` when the
  criterion runs.

What the arcs mean (blank, label, big blank, pdf, duration) lives only in
the criterion's score map; the engine sees columns.  A score map may have
several backends behind it (torch on the CPU, CUDA kernels on the GPU); it
picks one from where ``x`` lives.

:func:`apply` is the differentiable entry point: it computes value and
gradient in the forward pass (the gradient is saved, like torchaudio's
RNN-T), and backward scales the saved gradient per sequence by the
incoming gradient, in place unless the criterion ``shares_grad`` (a
non-finite incoming gradient for a sequence counts as 0, so impossible
sequences keep a zero gradient).  A criterion may give, through
:meth:`Criterion.complete_deferred`, a :class:`DeferredGrad` instead: what
it takes to write the gradient (the pdf criteria: the compact posteriors),
which backward writes once, already scaled -- no dense multiply, and no
dense buffer between the two passes.  A
second backward through the same graph recomputes it.

Second derivatives are not implemented.  With ``create_graph=True`` the
gradient is still given (the first derivative), as a node of the graph
that depends on the criterion's input (:func:`first_order`): differentiating
it through that input -- a gradient penalty differentiated w.r.t. any
parameter upstream, whatever lies in between (a ``log_softmax``, a
reduction, a layer) -- raises a ``RuntimeError`` (:data:`SECOND_DERIVATIVE`)
instead of silently treating the posteriors as constants, as torch's own
``ctc_loss`` raises.  Its dependence on the incoming gradient (linear) is
exact.  :func:`first_order_backward` gives the same to a hand-written
``backward``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import engines
from ._arrays import as_array
from .checks import values_like
from .cuda.interop import on_torch_stream, torch_stream

if TYPE_CHECKING:
    from .lattice import Lattice

__all__ = ["Criterion", "DeferredGrad", "apply", "first_order", "first_order_backward", "SECOND_DERIVATIVE"]


class Criterion:
    """Base class of a compiled criterion (see the module docstring).

    Attributes
    ----------
    lattice : Lattice
    lengths : int64 NumPy ``[N]`` -- frames (steps) each sequence runs.
    leaky : ``(c, log_init [S])`` or None
    engine : engine name for :func:`chainfb.engines.select` (``"auto"``).
    shares_grad : the gradient ``finish`` gives is also kept by the caller:
        backward scales it out of place (see also ``apply``'s ``return_grad``).
    """

    lattice: Lattice | None = None
    lengths: np.ndarray | None = None
    leaky: tuple[float, Any] | None = None
    engine = "auto"
    shares_grad = False
    #: backward multiplies the gradient by the incoming one on the device without first asking the host
    #: whether the incoming gradient is all ones (a synchronisation that stalls the step; worth it only where
    #: the gradient is large enough for a multiply by ones to cost more, as the transducers' logits are)
    scale_on_device = False

    def gather(self, x: Any, need_grad: bool = True) -> Any:
        """Compact engine scores ``X [T, C]`` from ``x`` (``need_grad``: a
        gradient will be asked for)."""
        raise NotImplementedError

    def finish(self, x: Any, loglike: Any, post: Any | None) -> tuple[Any, Any | None]:
        """``(value [N] tensor on x's device, grad like x or None)`` (for an
        input shared by the sequences, its gradient per sequence: ``[N,
        *shape]``; see the module docstring)."""
        raise NotImplementedError

    def start(self, x: Any, need_grad: bool = True) -> tuple[Any, Any]:
        """``(X [T, C], ctx)``: the engine's scores and what :meth:`complete`
        needs of this call (default: :meth:`gather`, no context)."""
        return self.gather(x, need_grad), None

    def complete(self, x: Any, loglike: Any, post: Any | None, ctx: Any) -> tuple[Any, Any | None]:
        """``(value [N], grad or None)`` from the engine's outputs and the
        context :meth:`start` gave (default: :meth:`finish`)."""
        return self.finish(x, loglike, post)

    def complete_deferred(self, x: Any, loglike: Any, post: Any | None, ctx: Any) -> tuple[Any, Any | None]:
        """:meth:`complete` for :func:`apply`, which may take the gradient
        as a :class:`DeferredGrad` (written in backward, already scaled by
        the incoming gradient); default: :meth:`complete`."""
        return self.complete(x, loglike, post, ctx)

    @on_torch_stream
    def run(self, x: Any, need_grad: bool = True, defer: bool = False) -> tuple[Any, Any | None]:
        """Start, the engine, complete: ``(value [N], grad or None)``; with
        ``defer``, :meth:`complete_deferred` (the gradient may then be a
        :class:`DeferredGrad`).  For CUDA tensors the CuPy work runs on
        torch's current stream and allocator, and CuPy's own state is left as
        it was (:func:`chainfb.cuda.interop.torch_stream`)."""
        X, ctx = self.start(x, need_grad)
        loglike, post = engines.forward_backward(self.lattice, X, self.lengths, leaky=self.leaky,
                                                 need_posteriors=need_grad, engine=self.engine)
        complete = self.complete_deferred if defer else self.complete
        return complete(x, loglike, post if need_grad else None, ctx)


class DeferredGrad:
    """A batch-first gradient ``[N, ...]`` not yet written: what it takes to
    write it (the posteriors in the engine's compact space, the score map),
    kept from forward to backward instead of the dense array.  ``build(scale)``
    writes it once, each sequence's part times ``scale[n]`` (an array of the
    input's array module ``[N]``, or None for the gradient itself), inside
    the input's torch stream scope.  So backward writes the gradient already
    scaled by the incoming one -- no dense multiply -- and no dense buffer
    lives between the two passes.

    ``shape``: the gradient's shape; ``device``: the input's CUDA device index
    (None off the GPU)."""

    def __init__(self, shape: tuple, build: Callable[[Any | None], Any], device: int | None = None):
        self.shape = tuple(shape)
        self.device = device
        self._build = build

    def dim(self) -> int:
        return len(self.shape)

    def materialize(self, scale: torch.Tensor | None = None) -> Any:
        """The gradient (a tensor like the input), times ``scale [N]`` per
        sequence when it is given (a torch tensor on the input's device)."""
        with torch_stream(self.device):
            return self._build(None if scale is None else as_array(scale, "grad_output", float_dtypes=None)[0])


def _dense(g: Any) -> Any:
    """``g`` itself, or the gradient a :class:`DeferredGrad` writes."""
    return g.materialize() if isinstance(g, DeferredGrad) else g


#: the error a second derivative raises
SECOND_DERIVATIVE = ("chainfb: trying to differentiate twice a criterion's gradient (second derivatives, "
                     "e.g. a gradient penalty, are not implemented; take the gradient without create_graph=True)")


class _FirstOrder(torch.autograd.Function):
    """``first_order``'s node: the first ``n`` inputs come out unchanged;
    being differentiated at all raises."""

    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(t.view_as(t) for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(SECOND_DERIVATIVE)


def first_order(grads: Iterable[torch.Tensor | None],
                depends: Iterable[object]) -> tuple[torch.Tensor | None, ...]:
    """``grads`` (tensors computed without a graph, or None) tied to the
    tensors ``depends`` they were computed from: under ``create_graph=True``
    the result is a node of the graph whose inputs are those of ``depends``
    that require grad, so any derivative of it that reaches one of them (or
    anything upstream of one) raises :data:`SECOND_DERIVATIVE`.  (A node on
    detached copies, as torch's ``once_differentiable`` makes, is never
    reached by ``torch.autograd.grad(..., inputs=upstream)``, which then
    silently leaves those terms out.)  Returns a tuple like ``grads``."""
    grads = tuple(grads)
    live = [t for t in depends if isinstance(t, torch.Tensor) and t.requires_grad]
    if not torch.is_grad_enabled() or not live:
        return grads
    present = [g for g in grads if g is not None]
    tied = iter(_FirstOrder.apply(len(present), *present, *live))
    return tuple(None if g is None else next(tied) for g in grads)


def first_order_backward(backward: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for the ``backward`` of a ``torch.autograd.Function``
    whose gradient is formed without a graph: it runs under ``no_grad``
    and, with ``create_graph=True``, its results are tied
    (:func:`first_order`) to the incoming gradients and to the tensors the
    Function saved with ``save_for_backward`` -- which must include the
    inputs the gradient depends on."""

    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        with torch.no_grad():
            out = backward(ctx, *grad_outputs)
        if not torch.is_grad_enabled():
            return out
        single = not isinstance(out, tuple)
        out = first_order((out,) if single else out, (*ctx.saved_tensors, *grad_outputs))
        return out[0] if single else out

    return wrapper


class _CriterionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, criterion, returned, weights, *xs):
        need = any(ctx.needs_input_grad[3:])
        x = xs[0] if len(xs) == 1 else xs
        value, grad = criterion.run(x, need or returned is not None, defer=returned is None)
        if returned is not None:  # the caller keeps the gradient: backward scales it out of place
            returned.append(grad)
        ctx.criterion, ctx.grad, ctx.several = criterion, grad, len(xs) > 1
        ctx.shares_grad = criterion.shares_grad or returned is not None
        ctx.shared = _shared_inputs(criterion, xs, grad if ctx.several else (grad,), value.shape[0]) if need else ()
        if need:
            ctx.save_for_backward(*xs)
        ctx.weights = None
        if weights is not None:  # the weighted total: one kernel, and backward weighs the incoming gradient
            ctx.weights = _weights_like(weights, value)
            return torch.dot(value, ctx.weights)
        return value

    @staticmethod
    def backward(ctx, grad_out):
        # the inputs as they were: an input changed in place since forward is autograd's usual error here (a
        # DeferredGrad may still read it: the transducers' gradient kernel reads the logits in backward)
        ctx.saved_tensors  # noqa: B018 -- read for autograd's version check
        if ctx.weights is not None:  # d total / d value[n] = weights[n]
            grad_out = ctx.weights * grad_out
        if not torch.is_grad_enabled():
            return _CriterionFunction._gradients(ctx, grad_out)
        # create_graph=True: the gradient, tied to the saved input (its derivative through the input
        # raises), times the incoming gradient by differentiable operations (exact in grad_out)
        with torch.no_grad():
            grads = tuple(_dense(g) for g in _CriterionFunction._unscaled(ctx))
        grads = first_order(grads, ctx.saved_tensors)
        go = torch.nan_to_num(grad_out, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite: 0 (one kernel)
        out = [None if g is None else g * go.to(g.dtype).view((-1,) + (1,) * (g.dim() - 1)) for g in grads]
        return (None, None, None, *(g.sum(dim=0) if shared else g for g, shared in zip(out, ctx.shared)))

    @staticmethod
    def _unscaled(ctx) -> tuple:
        """The gradients ``finish`` gave (recomputed on a second backward)."""
        grad, ctx.grad = ctx.grad, None
        if grad is None:  # a second backward through this graph: recompute
            xs = ctx.saved_tensors
            grad = ctx.criterion.run(xs if ctx.several else xs[0], True, defer=True)[1]
        return grad if ctx.several else (grad,)

    @staticmethod
    def _gradients(ctx, grad_out):
        grads = _CriterionFunction._unscaled(ctx)
        go = torch.nan_to_num(grad_out, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite: 0 (one kernel)
        ones = []  # whether go is all ones: a host synchronisation, asked only where it can save a dense multiply

        def all_ones() -> bool:
            if not ones:
                ones.append(bool((go == 1).all()))
            return ones[0]

        out = []
        shared = ctx.shares_grad
        for g, per_sequence in zip(grads, ctx.shared):
            if isinstance(g, DeferredGrad) and not per_sequence:  # written now, already scaled: no dense multiply
                out.append(g.materialize(go))
                continue
            g = _dense(g)
            if g is None:
                pass
            elif per_sequence:  # an input shared by the sequences: sum_n go[n] * g[n]
                g = g.sum(dim=0) if all_ones() else torch.tensordot(go.to(g.dtype), g, dims=1)
            elif ctx.criterion.scale_on_device or not all_ones():
                factor = go.to(g.dtype).view((-1,) + (1,) * (g.dim() - 1))
                g = g * factor if shared else g.mul_(factor)
            out.append(g)
        return (None, None, None, *out)


def _shared_inputs(criterion, xs, grads, N: int) -> tuple:
    """For each input, whether ``finish`` gave the per-sequence gradients of
    an input shared by the ``N`` sequences (``[N, *x.shape]``) rather than a
    batch-first gradient (``x.shape``, row ``n`` = sequence ``n``); any other
    shape is a ``ValueError`` naming the criterion."""
    out = []
    for i, (x, g) in enumerate(zip(xs, grads)):
        if g is None or (tuple(g.shape) == tuple(x.shape) and x.dim() and x.shape[0] == N):
            out.append(False)
        elif tuple(g.shape) == (N, *x.shape):
            out.append(True)
        else:
            raise ValueError(
                f"{type(criterion).__name__}.finish: the gradient of input {i} has shape {tuple(g.shape)}; expected "
                f"{tuple(x.shape)} (batch first, row n for sequence n) or, for an input shared by the {N} "
                f"sequences, their per-sequence gradients {(N, *x.shape)}")
    return tuple(out)


def _weights_like(weights: np.ndarray | torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``weights [N]`` as a tensor of ``value``'s dtype on its device (host weights without blocking: see
    :func:`chainfb.checks.values_like`)."""
    w = values_like(weights, value)
    if tuple(w.shape) != tuple(value.shape):
        raise ValueError(f"weights: expected shape {tuple(value.shape)} (one a sequence), got {tuple(w.shape)}")
    return w


def apply(x: torch.Tensor | tuple[torch.Tensor, ...], criterion: Criterion,
          return_grad: bool = False, weights: np.ndarray | torch.Tensor | None = None
          ) -> torch.Tensor | tuple[torch.Tensor, Any]:
    """The criterion's per-sequence value ``[N]``, differentiable w.r.t. ``x``
    (a tensor, or a tuple of tensors when the criterion reads several; its
    ``gather`` and ``finish`` then take and give tuples).  Each input is
    batch-first (``[N, ...]``) or shared by the sequences, its gradient
    given per sequence (module docstring).

    With ``weights`` (``[N]``: a NumPy array or a tensor), the scalar
    ``sum_n weights[n] * value[n]`` instead: a loss's ``"sum"`` or
    ``"mean"`` in one kernel, whose backward weighs the incoming gradient
    per sequence before the gradient is written -- where ``value`` then a
    negation, a division and a mean would each add a kernel and an
    autograd node to both passes.

    With ``return_grad``, ``(value, grad)``: also the gradient ``finish``
    gave (computed in the same run; ``d value[n] / d x`` unscaled), which
    backward then scales out of place."""
    xs = x if isinstance(x, tuple) else (x,)
    for i, t in enumerate(xs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(t).__name__}" + (f" at {i}" if len(xs) > 1 else ""))
    returned = [] if return_grad else None
    value = _CriterionFunction.apply(criterion, returned, weights, *xs)
    return (value, returned[0]) if return_grad else value
