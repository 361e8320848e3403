"""The CUDA engine: the engine protocol (see :mod:`chainfb.engines`) through
the kernels of ``chainfb/cuda/engine.cu``, with exactly the contract of
:func:`chainfb.engines.numpy_log.forward_backward` (CuPy arrays in and out).

The lattice's index arrays are converted once (CSR pointers by destination,
by source and by column, int32) and cached on the :class:`Lattice` per device
and real type; a call then only allocates its outputs and launches two
kernels, with no host synchronisation.
"""

from __future__ import annotations

import numpy as np

from ..cuda.kernels import cupy_backend
from ..lattice import Lattice

__all__ = ["forward_backward", "best_path", "forward_backward_on", "lattice_arrays", "default_block_size"]

_REAL = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_I32_MAX = 2**31 - 1


def host_array(x):
    """``x`` as a NumPy array when it is already in host memory (checked
    there at no cost), else None (device data: the kernels guard it)."""
    return np.asarray(x) if isinstance(x, (np.ndarray, list, tuple)) else None


def _host_arrays(lat: Lattice) -> dict:
    """int32 CSR structure and float64 weights of a lattice (host side)."""
    N, S, C = lat.num_sequences, lat.num_states, lat.num_columns
    A = lat.num_arcs
    if max(S, C, A) > _I32_MAX:
        raise ValueError(f"lattice too large for the CUDA engine (states {S}, columns {C}, arcs {A})")
    f, b = lat.fwd, lat.bwd
    if A and (np.any(np.diff(f.dst) < 0) or np.any(np.diff(b.src) < 0)):
        raise ValueError("lattice: arcs must be sorted by destination (fwd) and by source (bwd)")
    i32 = np.int32
    states = np.arange(S + 1)
    order = np.argsort(b.col, kind="stable")
    col_sorted = b.col[order]
    return {
        "state_off": lat.state_offsets.astype(i32),
        "col_off": np.searchsorted(lat.col_seq, np.arange(N + 1)).astype(i32),
        "start": np.asarray(lat.start).astype(i32),
        "final": np.asarray(lat.final, dtype=np.float64),
        "in_ptr": np.searchsorted(f.dst, states).astype(i32),
        "in_src": f.src.astype(i32),
        "in_lp": np.asarray(f.log_prob, dtype=np.float64),
        "in_col": f.col.astype(i32),
        "out_ptr": np.searchsorted(b.src, states).astype(i32),
        "out_dst": b.dst.astype(i32),
        "out_lp": np.asarray(b.log_prob, dtype=np.float64),
        "out_col": b.col.astype(i32),
        "ca_ptr": np.searchsorted(col_sorted, np.arange(C + 1)).astype(i32),
        "ca_src": b.src[order].astype(i32),
        "ca_dst": b.dst[order].astype(i32),
        "ca_lp": np.asarray(b.log_prob, dtype=np.float64)[order],
        "max_width": int(
            max(
                np.diff(lat.state_offsets).max(initial=0),
                np.diff(np.searchsorted(lat.col_seq, np.arange(N + 1))).max(initial=0),
            )
        ),
    }


def lattice_arrays(backend, lat: Lattice, dtype) -> dict:
    """The lattice's arrays on ``backend``'s device, weights in ``dtype``
    (built once, cached on ``lat``)."""
    cache = lat.__dict__.setdefault("_cuda_arrays", {})
    key = (backend.device_key(), np.dtype(dtype).name)
    arrs = cache.get(key)
    if arrs is None:
        host = lat.__dict__.get("_cuda_host_arrays")
        if host is None:
            host = _host_arrays(lat)
            lat._cuda_host_arrays = host
        xp = backend.xp
        arrs = {}
        for k, v in host.items():
            if isinstance(v, np.ndarray):
                v = v.astype(dtype) if v.dtype.kind == "f" else v
                arrs[k] = xp.ascontiguousarray(xp.asarray(v))
            else:
                arrs[k] = v
        cache[key] = arrs
    return arrs


def default_block_size(max_width: int) -> int:
    """Threads per block: the widest sequence (states or columns) rounded up
    to a power of two, between 32 and 256."""
    b = 32
    while b < max_width and b < 256:
        b *= 2
    return b


def forward_backward_on(backend, lat: Lattice, X, lengths, leaky=None, need_posteriors=True, block_size=None):
    """:func:`forward_backward` on any kernel backend (the GPU or the host
    emulation); arrays belong to ``backend.xp``."""
    xp = backend.xp
    if X.ndim != 2 or X.shape[1] != lat.num_columns:
        raise ValueError(f"X: expected shape [T, {lat.num_columns}], got {tuple(X.shape)}")
    dtype = np.dtype(X.dtype)
    if dtype not in _REAL:
        raise TypeError(f"X: expected dtype float32 or float64, got {dtype}")
    T, C = X.shape
    N, S = lat.num_sequences, lat.num_states
    if T > _I32_MAX or C > _I32_MAX:
        raise ValueError(f"X: shape {tuple(X.shape)} too large")
    if not X.flags.c_contiguous:
        X = xp.ascontiguousarray(X)
    h = host_array(lengths)  # host lengths are checked; device ones are clamped to [0, T] by the kernels
    if h is not None:
        if h.dtype.kind in "iu" and h.size and (h.min() < 0 or h.max() > T):
            raise ValueError(f"lengths: every length must lie in [0, T={T}], got {h[(h < 0) | (h > T)][0]}")
    lengths = xp.asarray(lengths)
    if lengths.shape != (N,):
        raise ValueError(f"lengths: expected shape ({N},), got {tuple(lengths.shape)}")
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"lengths: expected integers, got dtype {lengths.dtype}")
    lengths = xp.ascontiguousarray(lengths.astype(np.int64, copy=False))
    post = xp.zeros((T, C), dtype=dtype) if need_posteriors else None
    if N == 0:
        return xp.zeros(0, dtype=dtype), post
    r = _REAL[dtype]
    a = lattice_arrays(backend, lat, dtype)
    if leaky is not None:
        coef = float(leaky[0])
        if not 0.0 <= coef < 1.0:
            raise ValueError(f"leaky: the coefficient must lie in [0, 1), got {coef}")
        log_init = xp.ascontiguousarray(xp.asarray(leaky[1], dtype=dtype))
        if log_init.shape != (S,):
            raise ValueError(f"leaky: log_init must have shape ({S},), got {tuple(log_init.shape)}")
        with np.errstate(divide="ignore"):
            log_c = dtype.type(np.log(coef))  # 0: no leak, but the path starts from log_init
    else:
        log_init = np.uint64(0)  # null pointer: no leak
        log_c = dtype.type(0)
    block = int(block_size) if block_size is not None else default_block_size(a["max_width"])
    if not 1 <= block <= 1024:
        raise ValueError(f"block_size: expected 1..1024, got {block}")
    alpha = xp.empty((T + 1, S), dtype=dtype)
    loglike = xp.empty(N, dtype=dtype)
    i32 = np.int32
    backend.launch(
        f"chainfb::fb_forward<{r}>",
        N,
        block,
        [a["state_off"], a["col_off"], a["start"], a["final"], a["in_ptr"], a["in_src"], a["in_lp"], a["in_col"],
         lengths, X, i32(T), i32(C), alpha, i32(S), log_init, log_c, loglike],
    )
    if not need_posteriors:
        return loglike, None
    beta = xp.empty((2, S), dtype=dtype)
    backend.launch(
        f"chainfb::fb_backward<{r}>",
        N,
        block,
        [a["state_off"], a["col_off"], a["final"], a["out_ptr"], a["out_dst"], a["out_lp"], a["out_col"],
         a["ca_ptr"], a["ca_src"], a["ca_dst"], a["ca_lp"], lengths, X, i32(T), i32(C), alpha, i32(S), log_init,
         log_c, loglike, beta, post],
    )
    return loglike, post


def forward_backward(lat: Lattice, X, lengths, leaky=None, need_posteriors: bool = True):
    """Forward-backward over a lattice on the GPU.

    Same contract as :func:`chainfb.engines.numpy_log.forward_backward`.

    Parameters
    ----------
    lat : Lattice
    X : CuPy float32/float64 ``[T, C]``
        Compact scores; frames ``t >= lengths[seq]`` are set to ``-inf`` in
        place (when ``X`` is C-contiguous).
    lengths : ``[N]`` ints in ``[0, T]`` (NumPy or CuPy; a CuPy array avoids
        any host-device copy).
    leaky : ``(coefficient, log_init [S])`` or None
    need_posteriors : bool

    Returns
    -------
    loglike : CuPy ``[N]`` (dtype of ``X``)
    posteriors : CuPy ``[T, C]`` or None
    """
    return forward_backward_on(cupy_backend(), lat, X, lengths, leaky, need_posteriors)


def best_path(lat: Lattice, X, lengths):
    """Viterbi for CuPy scores: there is no max-semiring kernel, so ``X`` is
    copied to the host and :func:`chainfb.engines.numpy_log.best_path` runs
    (same return values, NumPy arrays)."""
    from . import numpy_log

    def host(a):
        return a.get() if hasattr(a, "get") else a

    return numpy_log.best_path(lat, np.asarray(host(X), dtype=np.float64), np.asarray(host(lengths), dtype=np.int64))
