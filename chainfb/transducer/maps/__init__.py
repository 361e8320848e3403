"""The transducer score maps: one module per backend, one place that picks.

A score map turns the user's tensors into the engine's compact scores ``X
[num_steps, C]`` (the gather) and the engine's posteriors back into a
gradient.  Every backend is a module with the same six functions, of the
same signatures, for the three transducer criteria of this package
(``crit`` the criterion object, read only; ``x`` its input: the logits, or
the pair ``(px, py)`` of a grid)::

    rnnt_gather(crit, x, need_grad) -> (X, state)       rnnt_gradient(crit, x, loglike, post, state) -> grad
    tdt_gather(crit, x, need_grad)  -> (X, state)       tdt_gradient(crit, x, loglike, post, state)  -> grad
    grid_gather(crit, x, need_grad) -> (X, state)       grid_gradient(crit, x, loglike, post, state)
                                                        -> (px_grad, py_grad)

``state`` is whatever the gather leaves for the gradient (row normalisers,
the gradient-to-be); it travels in the :class:`Context` that :func:`gather`
returns, so a criterion object keeps nothing between the two halves and may
be reused, and shared by threads.  A backend whose ``DEFERS`` is true (the
kernels') also takes ``scale [B]`` as the last argument of ``rnnt_gradient``
and ``tdt_gradient``: each utterance's factor, applied as the gradient is
written (its criteria then write the gradient in backward).

The backends:

- :mod:`~chainfb.transducer.maps.torch_ops` -- torch operations; any device
  and dtype (float16 and bfloat16 compute in float32);
- :mod:`~chainfb.transducer.maps.compiled` -- CPU float32 / float64 tensors
  with Numba: one compiled pass over the logits each way, on
  :func:`chainfb.engines.get_num_threads` threads;
- :mod:`~chainfb.transducer.maps.cuda` -- the score-map kernels of
  ``chainfb/cuda/transducer.cu`` on the kernel backend of the tensor
  (:func:`chainfb.cuda.kernels.backend_for`: CUDA tensors, or the kernels'
  CPU emulation in the tests), a thin layer over the launchers of
  :mod:`chainfb.cuda.transducer_maps`.  The grid has no kernels of its own:
  this backend runs it on the host backend that serves the tensor.

:func:`select` is the only place that picks one.  The helpers shared by the
backends and the criteria (the layout's index tables on a device, the
compute dtype) live here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...cuda import kernels
from ...cuda.interop import torch_place
from ..._arrays import Array
from ..graphs import TransducerLayout

if TYPE_CHECKING:
    from ...criterion import Criterion

__all__ = ["BACKENDS", "FAMILIES", "Context", "select", "gather", "gradient", "host_backend", "layout_tables",
           "torch_compute_dtype", "as_tensor"]

#: the backends, in the order :func:`select` considers them
BACKENDS = ("cuda", "compiled", "torch_ops")
#: the criteria every backend serves (the prefixes of its function names)
FAMILIES = ("rnnt", "tdt", "grid")


@dataclass(frozen=True)
class Context:
    """What a gather hands to its gradient: the backend module that ran it
    and the backend's ``state``."""

    backend: ModuleType
    state: object = None


def _module(name: str) -> ModuleType:
    if name == "cuda":
        from . import cuda

        return cuda
    if name == "compiled":
        from . import compiled

        return compiled
    from . import torch_ops

    return torch_ops


def host_backend(x: torch.Tensor) -> ModuleType:
    """The backend without kernels that serves tensor ``x``: the compiled
    one for CPU float32 / float64 tensors when Numba runs
    (:func:`chainfb.transducer.maps.compiled.available`), torch ops otherwise."""
    if x.device.type == "cpu":
        compiled = _module("compiled")
        if compiled.available(x.dtype):
            return compiled
    return _module("torch_ops")


def select(x: torch.Tensor | tuple[torch.Tensor, ...]) -> ModuleType:
    """The backend module that runs the score map of ``x`` (a tensor, or a
    tuple of tensors on one device): the kernels when
    :func:`chainfb.cuda.kernels.backend_for` gives a backend for it, else
    :func:`host_backend`."""
    first = x[0] if isinstance(x, tuple) else x
    if kernels.backend_for(first) is not None:
        return _module("cuda")
    return host_backend(first)


def gather(family: str, crit: Criterion, x: torch.Tensor | tuple[torch.Tensor, ...], need_grad: bool = True) -> tuple:
    """``(X, Context)``: the engine's scores of criterion ``crit`` (of
    ``family``, one of :data:`FAMILIES`) from ``x``, on the backend
    :func:`select` picks."""
    backend = select(x)
    X, state = getattr(backend, family + "_gather")(crit, x, need_grad)
    return X, Context(backend, state)


def gradient(family: str, crit: Criterion, x: torch.Tensor | tuple[torch.Tensor, ...], loglike: Array,
             post: Array | None, ctx: Context, scale: Array | None = None) -> Any:
    """The gradient w.r.t. ``x`` from the engine's ``loglike [B]`` and
    ``post [num_steps, C]``, on the backend of ``ctx`` (from :func:`gather`);
    ``scale [B]``, each utterance's factor, only on a backend that
    ``DEFERS`` (the kernels')."""
    fn = getattr(ctx.backend, family + "_gradient")
    return fn(crit, x, loglike, post, ctx.state) if scale is None else fn(crit, x, loglike, post, ctx.state, scale)


def torch_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, float16 and bfloat16 compute in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_tensor(arr: Array, device: torch.device | str) -> torch.Tensor:
    """An engine output (NumPy, or an array of a kernel backend) as a torch tensor on ``device``."""
    if isinstance(arr, np.ndarray):
        return torch.from_numpy(arr).to(device)
    return torch.from_dlpack(arr).to(device)


def layout_tables(layout: TransducerLayout, device: torch.device | str, T: int | None = None) -> dict:
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

    return layout.cache(("torch", T) + torch_place(device), build)
