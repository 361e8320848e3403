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

Cached on the lattice per device, stream and real type (see
:func:`chainfb.engines.cuda.cached`): the graph's arrays and the device copy
of the leaky HMM's ``log_init``.  A host ``log_init [S]`` whose per-sequence
rows are all equal (the denominator's: ``DenominatorGraph`` tiles its
initial probabilities) is kept as the graph's ``[Sg]``; it is compared with
the cached copy on the host each call and uploaded again only when it
changed.  Other ``log_init`` (rows that differ, or a device array) are used
per sequence as given.
"""

from __future__ import annotations

import numpy as np

from ..batch import FstBatch
from ..lattice import Lattice
from .cuda import best_path, cached, check_log_init, host_array, lattice_host_arrays, run_engine, upload
from .scipy_shared import shared_graph

__all__ = ["forward_backward", "best_path", "graph_arrays"]


def graph_arrays(backend, lat: Lattice, dtype) -> dict:
    """The arrays of the graph every sequence of ``lat`` uses, graph-local
    (those of a one-sequence lattice of it), on ``backend``'s device with
    weights in ``dtype``; cached on ``lat``."""
    fst = shared_graph(lat)
    if fst is None:
        raise ValueError("lat: the shared-graph CUDA engine needs every sequence to use one graph")

    def build():
        host = lat.__dict__.get("_cuda_graph_host_arrays")
        if host is None:
            host = lat._cuda_graph_host_arrays = lattice_host_arrays(Lattice(FstBatch([fst])))
        return upload(backend, host, dtype)

    return cached(lat, "_cuda_graph_arrays", backend, dtype, build)


def _log_init(backend, lat: Lattice, log_init, Sg: int, dtype):
    """``(device log_init, per_seq)``: the graph's ``[Sg]`` (``per_seq =
    0``) when a host ``log_init [S]`` has equal rows, else ``[S]`` as given
    (``per_seq = 1``)."""
    xp = backend.xp
    N = lat.num_sequences
    h = host_array(log_init)
    if h is None:
        return check_log_init(xp, log_init, N * Sg, dtype), 1
    h = np.asarray(h, dtype=np.float64)
    if h.shape != (N * Sg,):
        raise ValueError(f"leaky: log_init must have shape ({N * Sg},), got {h.shape}")
    rows = h.reshape(N, Sg)
    if not (rows == rows[:1]).all():
        return check_log_init(xp, h, N * Sg, dtype), 1
    cache = cached(lat, "_cuda_log_init", backend, dtype, dict)
    if not np.array_equal(cache.get("host"), rows[0]):
        cache["device"] = check_log_init(xp, rows[0], Sg, dtype)
        cache["host"] = rows[0].copy()
    return cache["device"], 0


def _shared_layout(backend, lat: Lattice, dtype, leaky):
    """shared_graph.cu's kernels over the graph's arrays (see
    :func:`chainfb.engines.cuda.run_engine`)."""
    g = graph_arrays(backend, lat, dtype)
    N = lat.num_sequences
    Sg, K = lat.num_states // N, lat.num_columns // N  # every sequence: the graph's states and columns
    log_init, per_seq = (None, 0) if leaky is None else _log_init(backend, lat, leaky[1], Sg, dtype)
    i32 = np.int32
    shape = [i32(Sg), i32(K), i32(per_seq)]
    fwd = [g["start"], g["final"], g["in_ptr"], g["in_src"], g["in_lp"], g["in_col"]] + shape
    bwd = [g["final"], g["out_ptr"], g["out_dst"], g["out_lp"], g["out_col"], g["ca_ptr"], g["ca_src"], g["ca_dst"],
           g["ca_lp"]] + shape
    return "fb_shared", fwd, bwd, log_init, g["max_width"]


def forward_backward(backend, lat: Lattice, X, lengths, leaky=None, need_posteriors: bool = True,
                     block_size=None):
    """Forward-backward of a lattice whose sequences all use one graph,
    through the kernels of ``shared_graph.cu`` on ``backend``: parameters and
    return values as :func:`chainfb.engines.cuda.forward_backward` (``X [T,
    C]`` with ``C = N * K``, ``K`` the graph's distinct pdfs)."""
    return run_engine(backend, lat, X, lengths, leaky, need_posteriors, block_size, _shared_layout)
