"""The shared-graph CUDA engine: the engine protocol (see
:mod:`chainfb.engines`) for lattices whose sequences all use ONE graph (the
LF-MMI denominator), through the kernels of ``chainfb/cuda/shared_graph.cu``.

Same contract and, for the same block size, the same bits as
:mod:`chainfb.engines.cuda`, which reads one graph instance per sequence;
here every block reads the one graph's CSR (graph-local state ids, the
graph's sorted distinct pdfs as its ``K`` columns), so the device holds one
copy of the graph instead of ``N``.  Sequence ``n``'s states are ``n*Sg ..
(n+1)*Sg - 1`` of the lattice and its columns ``n*K .. (n+1)*K - 1``, the
layout :class:`~chainfb.lattice.Lattice` gives such a lattice.

Cached per graph (on the graph's one-sequence lattice,
:meth:`~chainfb.lattice.Lattice.graph_lattice`, so every batch size of a
denominator shares them) and per device, stream and real type (see
:func:`chainfb.engines.cuda.cached`): the graph's arrays and the device copy
of the leaky HMM's ``log_init``.  A host ``log_init`` given as the graph's
``[Sg]`` (the denominator's), or as ``[S]`` whose per-sequence rows are all
equal, is kept as the graph's ``[Sg]``; it is compared with the cached copy
on the host each call and uploaded again only when it changed.  A device
``[Sg]`` is used for every sequence; other ``log_init`` (rows that differ,
or a device ``[S]``) are used per sequence as given.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from .._arrays import Array
from ..cuda.kernels import KernelBackend, null_or
from ..lattice import Lattice
from .cuda import (best_path, cached, check_log_init, chunk_args, host_array, lattice_arrays, layout_shape,
                   run_engine)

__all__ = ["forward_backward", "best_path", "graph_arrays"]


def graph_arrays(backend: KernelBackend, lat: Lattice, dtype: DTypeLike) -> dict:
    """The arrays of the graph every sequence of ``lat`` uses, graph-local
    (those of its one-sequence lattice), on ``backend``'s device with
    weights in ``dtype``; cached per graph."""
    if lat.shared_fst is None:
        raise ValueError("lat: the shared-graph CUDA engine needs every sequence to use one graph")
    return lattice_arrays(backend, lat.graph_lattice(), dtype)


def _log_init(backend, lat: Lattice, log_init, Sg: int, dtype):
    """``(device log_init, per_seq)``: the graph's ``[Sg]`` (``per_seq =
    0``) when ``log_init`` is ``[Sg]`` or a host ``[S]`` with equal rows,
    else ``[S]`` as given (``per_seq = 1``)."""
    xp = backend.xp
    N = lat.num_sequences
    h = host_array(log_init)
    if h is None:
        if np.shape(log_init) == (Sg,):
            return check_log_init(xp, log_init, Sg, dtype), 0
        return check_log_init(xp, log_init, N * Sg, dtype), 1
    h = np.asarray(h, dtype=np.float64)
    if h.shape == (N * Sg,) and h.shape != (Sg,):
        rows = h.reshape(N, Sg)
        if not (rows == rows[:1]).all():
            return check_log_init(xp, h, N * Sg, dtype), 1
        h = rows[0]
    elif h.shape != (Sg,):
        raise ValueError(f"leaky: log_init must have shape ({Sg},) or ({N * Sg},), got {h.shape}")
    cache = cached(lat.graph_lattice(), "log_init", backend, dtype, dict)
    got = cache.get("pair")  # (host, device), replaced as one (threads may share the graph)
    if got is None or not np.array_equal(got[0], h):
        got = cache["pair"] = (h.copy(), check_log_init(xp, h, Sg, dtype))
    return got[1], 0


def _shared_layout(backend, lat: Lattice, dtype, leaky):
    """shared_graph.cu's kernels over the graph's arrays (see
    :func:`chainfb.engines.cuda.run_engine`)."""
    g = graph_arrays(backend, lat, dtype)
    N = lat.num_sequences
    Sg, K = lat.shared_fst.num_states, lat.num_columns // N  # every sequence: the graph's states and columns
    log_init, per_seq = (None, 0) if leaky is None else _log_init(backend, lat, leaky[1], Sg, dtype)
    i32 = np.int32
    rec = [g["start"], g["final"], g["in_ptr"], g["in_src"], g["in_lp"], g["in_col"], null_or(g["in_span"]),
           g["out_ptr"], g["out_dst"], g["out_lp"], g["out_col"], null_or(g["out_span"]), i32(lat.max_span), i32(Sg),
           i32(K), i32(per_seq)]
    post = chunk_args(g, null_or(g["ca_span"])) + [i32(len(g["chunk_col"])), i32(len(g["mc_col"])), i32(Sg), i32(K)]
    return "fb_shared", rec, post, log_init, layout_shape(g)


def forward_backward(backend: KernelBackend, lat: Lattice, X: Array, lengths: Array,
                     leaky: tuple[float, Array] | None = None, need_posteriors: bool = True,
                     block_size: int | None = None, cluster: int = 1) -> tuple[Array, Array | None]:
    """Forward-backward of a lattice whose sequences all use one graph,
    through the kernels of ``shared_graph.cu`` on ``backend``: parameters and
    return values as :func:`chainfb.engines.cuda.forward_backward` (``X [T,
    C]`` with ``C = N * K``, ``K`` the graph's distinct pdfs), but for
    ``cluster``: these kernels run one block a sequence (1; any other value
    is a ``ValueError``)."""
    return run_engine(backend, lat, X, lengths, leaky, need_posteriors, block_size, _shared_layout, cluster)
