"""The CUDA engine: the engine protocol (see :mod:`chainfb.engines`) through
the kernels of ``chainfb/cuda/engine.cu``, with exactly the contract of
:func:`chainfb.engines.numpy_log.forward_backward`, on the arrays of the
kernel backend it is given (CuPy's on the GPU, see :mod:`chainfb.cuda.kernels`).

The lattice's index arrays are converted once (CSR pointers by destination,
by source and by column, int32) and cached on the :class:`Lattice` per
device, stream and real type (see :func:`cached`); a call then only
allocates its outputs and launches two kernels, with no host
synchronisation.  The launch and the argument checks are shared with the
shared-graph engine, :mod:`chainfb.engines.cuda_shared`.
"""

from __future__ import annotations

import numpy as np

from ..lattice import Lattice

__all__ = ["forward_backward", "best_path", "lattice_arrays", "default_block_size", "run_engine"]

_REAL = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_I32_MAX = 2**31 - 1


def host_array(x):
    """``x`` as a NumPy array when it is already in host memory (checked
    there at no cost), else None (device data: the kernels guard it)."""
    return np.asarray(x) if isinstance(x, (np.ndarray, list, tuple)) else None


def _host_arrays(lat: Lattice) -> dict:
    """int32 CSR structure and float64 weights of a lattice (host side);
    the arcs' spans (``in_span``, ``out_span``, ``ca_span``) only when some
    arc spans several frames (None otherwise: the kernels read every span as
    1)."""
    S, C = lat.num_states, lat.num_columns
    A = lat.num_arcs
    if max(S, C, A) > _I32_MAX:
        raise ValueError(f"lattice too large for the CUDA engine (states {S}, columns {C}, arcs {A})")
    f, b = lat.fwd, lat.bwd
    i32 = np.int32
    order = np.argsort(b.col, kind="stable")
    col_sorted = b.col[order]
    spans = lat.max_span > 1
    return {
        "state_off": lat.state_offsets.astype(i32),
        "col_off": lat.col_offsets.astype(i32),
        "start": np.asarray(lat.start).astype(i32),
        "final": np.asarray(lat.final, dtype=np.float64),
        "in_ptr": f.ptr.astype(i32),
        "in_src": f.src.astype(i32),
        "in_lp": np.asarray(f.log_prob, dtype=np.float64),
        "in_col": f.col.astype(i32),
        "out_ptr": b.ptr.astype(i32),
        "out_dst": b.dst.astype(i32),
        "out_lp": np.asarray(b.log_prob, dtype=np.float64),
        "out_col": b.col.astype(i32),
        "ca_ptr": np.searchsorted(col_sorted, np.arange(C + 1)).astype(i32),
        "ca_src": b.src[order].astype(i32),
        "ca_dst": b.dst[order].astype(i32),
        "ca_lp": np.asarray(b.log_prob, dtype=np.float64)[order],
        "in_span": f.span.astype(i32) if spans else None,
        "out_span": b.span.astype(i32) if spans else None,
        "ca_span": b.span[order].astype(i32) if spans else None,
        "max_width": int(
            max(
                np.diff(lat.state_offsets).max(initial=0),
                np.diff(lat.col_offsets).max(initial=0),
            )
        ),
    }


def upload(backend, host: dict, dtype) -> dict:
    """``host`` (arrays, ints and Nones from :func:`lattice_host_arrays`) on
    ``backend``'s device, float arrays in ``dtype``."""
    xp = backend.xp
    out = {}
    for k, v in host.items():
        if isinstance(v, np.ndarray):
            v = v.astype(dtype) if v.dtype.kind == "f" else v
            out[k] = xp.ascontiguousarray(xp.asarray(v))
        else:
            out[k] = v
    return out


def cached(owner, attr: str, backend, dtype, build):
    """``build()``, cached in ``owner.attr`` per device, stream and dtype.

    The key includes the stream the arrays were made on (``backend.cache_key()``):
    device arrays are allocated, uploaded and freed in the stream-ordered pools
    of torch and CuPy, so arrays used only on the stream that made them need
    no cross-stream synchronisation -- neither before the first kernel reads
    them nor when the cache is dropped and the pool hands their memory out
    again.  A second stream gets its own copy."""
    cache = owner.__dict__.setdefault(attr, {})
    key = (backend.cache_key(), np.dtype(dtype).name)
    got = cache.get(key)
    if got is None:
        got = cache[key] = build()
    return got


def lattice_host_arrays(lat: Lattice) -> dict:
    """:func:`_host_arrays` of ``lat``, built once and cached on it."""
    host = lat.__dict__.get("_cuda_host_arrays")
    if host is None:
        host = lat._cuda_host_arrays = _host_arrays(lat)
    return host


def lattice_arrays(backend, lat: Lattice, dtype) -> dict:
    """The lattice's arrays on ``backend``'s device, weights in ``dtype``
    (built once, cached on ``lat``, see :func:`cached`)."""
    return cached(lat, "_cuda_arrays", backend, dtype, lambda: upload(backend, lattice_host_arrays(lat), dtype))


def default_block_size(max_width: int) -> int:
    """Threads per block: the widest sequence (states or columns) rounded up
    to a power of two, between 32 and 256."""
    b = 32
    while b < max_width and b < 256:
        b *= 2
    return b


def check_inputs(backend, lat: Lattice, X, lengths):
    """``(X, lengths, dtype)``: ``X [T, C]`` float32/float64 C-contiguous and
    ``lengths`` int64 ``[N]`` on ``backend``'s device, checked (host lengths
    must lie in ``[0, T]``; device ones are clamped by the kernels)."""
    xp = backend.xp
    if X.ndim != 2 or X.shape[1] != lat.num_columns:
        raise ValueError(f"X: expected shape [T, {lat.num_columns}], got {tuple(X.shape)}")
    dtype = np.dtype(X.dtype)
    if dtype not in _REAL:
        raise TypeError(f"X: expected dtype float32 or float64, got {dtype}")
    T, C = X.shape
    if T > _I32_MAX or C > _I32_MAX:
        raise ValueError(f"X: shape {tuple(X.shape)} too large")
    if not X.flags.c_contiguous:
        X = xp.ascontiguousarray(X)
    h = host_array(lengths)
    if h is not None:
        if h.dtype.kind in "iu" and h.size and (h.min() < 0 or h.max() > T):
            raise ValueError(f"lengths: every length must lie in [0, T={T}], got {h[(h < 0) | (h > T)][0]}")
    lengths = xp.asarray(lengths)
    N = lat.num_sequences
    if lengths.shape != (N,):
        raise ValueError(f"lengths: expected shape ({N},), got {tuple(lengths.shape)}")
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"lengths: expected integers, got dtype {lengths.dtype}")
    return X, xp.ascontiguousarray(lengths.astype(np.int64, copy=False)), dtype


def null_or(a):
    """``a``, or a null pointer (``uint64`` 0) for None: an optional kernel array."""
    return np.uint64(0) if a is None else a


def leak_log_c(leaky, dtype):
    """``log(c)`` of ``leaky = (c, log_init)`` in ``dtype`` (``-inf`` for
    ``c = 0``: no leak, but paths start from ``log_init``); 0 without a leak."""
    if leaky is None:
        return dtype.type(0)
    coef = float(leaky[0])
    if not 0.0 <= coef < 1.0:
        raise ValueError(f"leaky: the coefficient must lie in [0, 1), got {coef}")
    with np.errstate(divide="ignore"):
        return dtype.type(np.log(coef))


def check_log_init(xp, log_init, S: int, dtype):
    """``log_init`` as a contiguous ``[S]`` array of ``dtype`` on ``xp``."""
    out = xp.ascontiguousarray(xp.asarray(log_init, dtype=dtype))
    if out.shape != (S,):
        raise ValueError(f"leaky: log_init must have shape ({S},), got {tuple(out.shape)}")
    return out


def run_engine(backend, lat: Lattice, X, lengths, leaky, need_posteriors: bool, block_size, layout):
    """The engine protocol on ``backend`` through one pair of kernels, one
    block per sequence.

    ``layout(backend, lat, dtype, leaky)`` describes the pair: ``(prefix,
    fwd_head, bwd_head, log_init, max_width)`` -- the kernels
    ``chainfb::{prefix}_forward`` and ``chainfb::{prefix}_backward``, their
    own leading arguments (the arguments every engine kernel takes follow,
    see ``forward_backward.cuh``), the device ``log_init`` (None without a
    leak) and the widest sequence in states or columns (for the default
    block size).  The backward kernel keeps ``lat.max_span + 1`` rows of
    betas.  Returns ``(loglike [N], post [T, C] or None)``."""
    X, lengths, dtype = check_inputs(backend, lat, X, lengths)
    max_span = int(lat.max_span)
    if leaky is not None and max_span > 1:
        raise ValueError(f"leaky: the leaky HMM is not defined for arcs that span several frames (max span "
                         f"{max_span})")
    log_c = leak_log_c(leaky, dtype)
    xp = backend.xp
    T, C = X.shape
    N, S = lat.num_sequences, lat.num_states
    post = xp.zeros((T, C), dtype=dtype) if need_posteriors else None
    if N == 0:
        return xp.zeros(0, dtype=dtype), post
    prefix, fwd_head, bwd_head, log_init, max_width = layout(backend, lat, dtype, leaky)
    block = int(block_size) if block_size is not None else default_block_size(max_width)
    if not 1 <= block <= 1024:
        raise ValueError(f"block_size: expected 1..1024, got {block}")
    r = _REAL[dtype]
    init = log_init if log_init is not None else np.uint64(0)  # a null pointer: no leak
    alpha = xp.empty((T + 1, S), dtype=dtype)
    loglike = xp.empty(N, dtype=dtype)
    i32 = np.int32
    tail = [lengths, X, i32(T), i32(C), alpha, i32(S), init, log_c]
    backend.launch(f"chainfb::{prefix}_forward<{r}>", N, block, fwd_head + tail + [loglike])
    if not need_posteriors:
        return loglike, None
    beta = xp.empty((max_span + 1, S), dtype=dtype)
    backend.launch(f"chainfb::{prefix}_backward<{r}>", N, block,
                   bwd_head + tail + [loglike, beta, i32(max_span), post])
    return loglike, post


def _instance_log_init(xp, lat: Lattice, log_init, dtype):
    """``log_init`` as the lattice's ``[S]`` on the device: as given, or a
    graph-local ``[Sg]`` repeated for every sequence when all use one graph."""
    fst = lat.shared_fst
    if fst is not None and np.shape(log_init) == (fst.num_states,) != (lat.num_states,):
        log_init = xp.tile(xp.asarray(log_init, dtype=dtype), lat.num_sequences)
    return check_log_init(xp, log_init, lat.num_states, dtype)


def _lattice_layout(backend, lat: Lattice, dtype, leaky):
    """engine.cu's kernels over the lattice's own arrays (see :func:`run_engine`)."""
    a = lattice_arrays(backend, lat, dtype)
    log_init = None if leaky is None else _instance_log_init(backend.xp, lat, leaky[1], dtype)
    fwd = [a["state_off"], a["col_off"], a["start"], a["final"], a["in_ptr"], a["in_src"], a["in_lp"], a["in_col"],
           null_or(a["in_span"])]
    bwd = [a["state_off"], a["col_off"], a["final"], a["out_ptr"], a["out_dst"], a["out_lp"], a["out_col"],
           null_or(a["out_span"]), a["ca_ptr"], a["ca_src"], a["ca_dst"], a["ca_lp"], null_or(a["ca_span"])]
    return "fb", fwd, bwd, log_init, a["max_width"]


def forward_backward(backend, lat: Lattice, X, lengths, leaky=None, need_posteriors: bool = True,
                     block_size=None):
    """Forward-backward over a lattice through the kernels of ``engine.cu``.

    Same contract as :func:`chainfb.engines.numpy_log.forward_backward`, on
    ``backend``'s arrays.

    Parameters
    ----------
    backend : the kernel backend (:func:`chainfb.cuda.kernels.cupy_backend`
        on the GPU; interface in :mod:`chainfb.cuda.kernels`).
    lat : Lattice
    X : ``backend.xp`` float32/float64 ``[T, C]``
        Compact scores; frames ``t >= lengths[seq]`` are set to ``-inf`` in
        place (when ``X`` is C-contiguous).
    lengths : ``[N]`` ints in ``[0, T]`` (host or ``backend.xp``; a device
        array avoids any host-device copy).
    leaky : ``(coefficient, log_init [S])`` or None (refused when an arc
        spans several frames)
    need_posteriors : bool
    block_size : threads per block (1..1024), or None for
        :func:`default_block_size` of the widest sequence.

    Returns
    -------
    loglike : ``backend.xp`` ``[N]`` (dtype of ``X``)
    posteriors : ``backend.xp`` ``[T, C]`` or None
    """
    return run_engine(backend, lat, X, lengths, leaky, need_posteriors, block_size, _lattice_layout)


def best_path(lat: Lattice, X, lengths):
    """Viterbi for CuPy scores: there is no max-semiring kernel, so ``X`` is
    copied to the host and :func:`chainfb.engines.numpy_log.best_path` runs
    (same return values, NumPy arrays; arcs spanning several frames as
    there)."""
    from . import _check_spans, numpy_log

    _check_spans(lat, "numpy")

    def host(a):
        return a.get() if hasattr(a, "get") else a

    return numpy_log.best_path(lat, np.asarray(host(X), dtype=np.float64), np.asarray(host(lengths), dtype=np.int64))
