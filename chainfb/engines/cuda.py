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

Arcs may span several frames (``lat.max_span > 1``): the arcs' spans are
uploaded with the lattice's arrays and the backward kernel keeps
``max_span + 1`` rows of betas; the leaky HMM is refused with spans.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .._arrays import Array
from .._sort import stable_order
from ..cuda.kernels import REAL_TYPES, KernelBackend, null_or
from ..lattice import Lattice
from . import numba_log
from .cuda_memory import scratch, upload
from .cuda_index import index_arrays

__all__ = ["forward_backward", "best_path", "lattice_arrays", "default_block_size", "lanes_per_state", "recursion_plan",
           "run_engine"]

_I32_MAX = 2**31 - 1


def host_array(x: object) -> np.ndarray | None:
    """``x`` as a NumPy array when it is already in host memory (checked
    there at no cost), else None (device data: the kernels guard it)."""
    return np.asarray(x) if isinstance(x, (np.ndarray, list, tuple)) else None


#: the most arcs one chunk of a column holds (see forward_backward.cuh); more
#: when a sequence would have over :data:`MAX_CHUNKS` chunks
CHUNK_ARCS = 16
#: the most chunks of one sequence (their sums are kept in shared memory per frame)
MAX_CHUNKS = 4096


def _chunks(ca_ptr: np.ndarray, col_off: np.ndarray) -> dict:
    """The columns' arcs (``[ca_ptr[c], ca_ptr[c + 1])`` of the arcs sorted
    by column) cut into chunks of at most ``CHUNK_ARCS`` arcs (more when a
    sequence would have over ``MAX_CHUNKS`` chunks, until each column is one
    chunk), and the columns with several chunks; ``col_off [N + 1]``: each sequence's columns.  The arrays
    of engine.cu (int64 here: :func:`_host_arrays` converts them to int32),
    plus ``max_chunks`` and ``chunk_arcs``."""
    counts = np.diff(ca_ptr)
    size = CHUNK_ARCS
    while True:
        nch = -(-counts // size)
        first = np.concatenate([[0], np.cumsum(nch)])
        widest = int(np.diff(first[col_off]).max(initial=0))
        if widest <= MAX_CHUNKS or size >= counts.max(initial=0):  # (or one chunk a column: as few as can be)
            break
        size *= 2
    J = int(first[-1])
    col = np.repeat(np.arange(len(counts)), nch)
    k = np.arange(J) - first[col]  # the chunk's index within its column
    multi = nch > 1
    mcols = np.flatnonzero(multi)
    return {
        "chunk_ptr": first[col_off],
        "mc_ptr": np.concatenate([[0], np.cumsum(multi)])[col_off],
        "chunk_arc": np.concatenate([ca_ptr[col] + k * size, [ca_ptr[-1]]]),
        "chunk_col": col,
        "chunk_sole": ~multi[col],
        "mc_col": mcols,
        "mc_begin": first[mcols],
        "mc_end": first[mcols + 1],
        "chunk_arcs": size,
        "max_chunks": widest,
    }


def _host_arrays(lat: Lattice) -> dict:
    """int32 CSR structure, chunks and float64 weights of a lattice (host
    side); the arcs' spans (``in_span``, ``out_span``, ``ca_span``) only when
    some arc spans several frames (None otherwise: the kernels read every
    span as 1), which :func:`~chainfb.engines.cuda_memory.upload` packs into one buffer and copies to the
    device in one transfer.  Where Numba runs and no arc
    spans several frames, compiled passes write them (:func:`~chainfb.engines.cuda_index.index_arrays`);
    else array operations over ``lat.fwd`` and ``lat.bwd``, to the same arrays."""
    S, C = lat.num_states, lat.num_columns
    A = lat.num_arcs
    if max(S, C, A) > _I32_MAX:
        raise ValueError(f"lattice too large for the CUDA engine (states {S}, columns {C}, arcs {A})")
    spans = lat.max_span > 1
    heads = {"state_off": lat.state_offsets, "col_off": lat.col_offsets, "start": np.asarray(lat.start)}
    if not spans and numba_log.available():
        ints, floats, sizes = index_arrays(lat, CHUNK_ARCS, MAX_CHUNKS)
    else:
        ints, floats, sizes = _numpy_index_arrays(lat, spans)
    return {
        "in_span": None, "out_span": None, "ca_span": None,  # (replaced by the spans' arrays where there are any)
        **{k: np.asarray(v, dtype=np.int32) for k, v in {**heads, **ints}.items()},
        "final": np.asarray(lat.final, dtype=np.float64),
        **floats,
        "max_span": int(lat.max_span),
        **sizes,
    }


def _numpy_index_arrays(lat: Lattice, spans: bool) -> tuple[dict, dict, dict]:
    """:func:`~chainfb.engines.cuda_index.index_arrays` by array operations over ``lat.fwd`` and ``lat.bwd``
    (any lattice; the ints in int64, which :func:`_host_arrays` converts), with the arcs' spans among the ints
    where ``spans``."""
    C = lat.num_columns
    f, b = lat.fwd, lat.bwd
    order = stable_order(b.col, C)
    ca_ptr = np.searchsorted(b.col[order], np.arange(C + 1))
    widths = np.diff(lat.state_offsets)
    chunks = _chunks(ca_ptr, lat.col_offsets)
    ints = {
        "in_ptr": f.ptr, "in_src": f.src, "in_col": f.col,
        "out_ptr": b.ptr, "out_dst": b.dst, "out_col": b.col,
        "ca_src": b.src[order], "ca_dst": b.dst[order],
        **({"in_span": f.span, "out_span": b.span, "ca_span": b.span[order]} if spans else {}),
        **{k: v for k, v in chunks.items() if isinstance(v, np.ndarray)},
    }
    floats = {"in_lp": np.asarray(f.log_prob, dtype=np.float64), "out_lp": np.asarray(b.log_prob, dtype=np.float64),
              "ca_lp": np.asarray(b.log_prob, dtype=np.float64)[order]}
    sizes = {
        "chunk_arcs": chunks["chunk_arcs"],
        "max_chunks": chunks["max_chunks"],
        "max_states": int(widths.max(initial=0)),
        "max_degree": int(max(np.diff(f.ptr).max(initial=0), np.diff(b.ptr).max(initial=0))),
        "max_arcs": int(np.diff(f.ptr[lat.state_offsets]).max(initial=0)),
        "max_columns": int(np.diff(lat.col_offsets).max(initial=0)),
    }
    return ints, floats, sizes


def cached(owner: Lattice, name: str, backend: KernelBackend, dtype: DTypeLike, build: Callable[[], Any]) -> Any:
    """``build()``, kept by ``owner.cache`` (a :class:`~chainfb.lattice.Lattice`)
    under ``("cuda", name, device_and_stream, dtype)``: per device, stream and dtype.

    The key includes the stream the arrays were made on (``backend.cache_key()``):
    device arrays are allocated, uploaded and freed in the stream-ordered pools
    of torch and CuPy, so arrays used only on the stream that made them need
    no cross-stream synchronisation -- neither before the first kernel reads
    them nor when the cache is dropped and the pool hands their memory out
    again.  A second stream gets its own copy."""
    return owner.cache(("cuda", name, backend.cache_key(), np.dtype(dtype).name), build)


#: the key of :func:`lattice_host_arrays`' entry in a lattice's cache
HOST_ARRAYS = ("cuda", "host_arrays")


def lattice_host_arrays(lat: Lattice) -> dict:
    """:func:`_host_arrays` of ``lat``, built once and kept by it (:meth:`~chainfb.lattice.Lattice.cache`
    under :data:`HOST_ARRAYS`)."""
    return lat.cache(HOST_ARRAYS, lambda: _host_arrays(lat))


def lattice_arrays(backend: KernelBackend, lat: Lattice, dtype: DTypeLike) -> dict:
    """The lattice's arrays on ``backend``'s device, weights in ``dtype``
    (built once, kept by ``lat``, see :func:`cached`)."""
    return cached(lat, "arrays", backend, dtype, lambda: upload(backend, lattice_host_arrays(lat), dtype))


def default_block_size(max_width: int) -> int:
    """Threads per block: the widest sequence (its states, or its chunks of
    column arcs) rounded up to a power of two, between 32 and 1024."""
    b = 32
    while b < max_width and b < 1024:
        b *= 2
    return b


def launch_block_size(block_size: int | None, max_width: int) -> int:
    """``block_size`` (None: :func:`default_block_size`) rounded up to a
    whole number of warps (the kernels reduce over warps), checked."""
    if block_size is None:
        return default_block_size(max_width)
    block = int(block_size)
    if not 1 <= block <= 1024:
        raise ValueError(f"block_size: expected 1..1024, got {block}")
    return -(-block // 32) * 32


#: the shared memory the engine kernels' static arrays may take (ptxas reports 3.5 KiB for the float64
#: recursions; tests/cuda/test_cuda_compile.py checks every engine kernel against it): a block's dynamic
#: shared memory is what its limit leaves beside them
STATIC_SHARED = 4 * 1024
#: dynamic shared memory a launch may use without a per-kernel opt-in (48 KiB
#: less the kernels' static arrays); a backend with ``max_shared_mem`` (the
#: device's opt-in limit) allows more
SHARED_BYTES = 48 * 1024 - STATIC_SHARED
#: how many values of a row one thread stages (``kStage`` in forward_backward.cuh)
STAGE = 4


def shared_budget(backend: KernelBackend) -> int:
    """Dynamic shared memory (bytes) a block of the engine kernels may use on ``backend``."""
    limit = getattr(backend, "max_shared_mem", None)
    return SHARED_BYTES if limit is None else max(SHARED_BYTES, int(limit) - STATIC_SHARED)


#: the shared-memory modes :func:`shared_plan` considers, best first: 0 (rows and scores in device memory, the
#: arc table in shared memory where it fits) measured fastest or level with the others on every benchmark graph
#: (CTC, RNN-T, multi-blank, TDT, the denominator: docs/gpu.md, "Launch defaults").  Mode 0 always fits, so
#: 2 and 1 run only where this tuple is narrowed (``benchmarks/gpu_block_sweep.py`` does)
MODES = (0, 2, 1)
#: whether :func:`shared_plan` gives a mode the sequence's arcs in shared memory, in the order tried
ARC_TABLES = (True, False)
#: the flag of ``mode`` that adds the arc table (``kArcTable`` in forward_backward.cuh)
ARC_TABLE = 4
#: the most states or columns of a sequence, and the longest span plus one, an arc table's 16-bit ids hold
_TABLE_IDS = 65536


def arc_table_bytes(shape: dict, max_span: int, itemsize: int) -> int | None:
    """Shared memory (bytes) of the widest sequence's arc table (forward_backward.cuh's ``ArcTable``: per arc its
    weight and 16-bit end, column and, with spans, span; per state an int offset), or None when its ids do not
    fit 16 bits.  The lattice's arrays have spans exactly when ``max_span > 1`` (:func:`lattice_host_arrays`),
    and the kernels copy them into the table then."""
    W, nc, A = shape["max_states"], shape["max_columns"], shape["max_arcs"]
    if W > _TABLE_IDS or nc > _TABLE_IDS or max_span >= _TABLE_IDS - 1:
        return None
    return A * itemsize + 4 * (W + 1) + 2 * A * (3 if max_span > 1 else 2)


def shared_plan(shape: dict, max_span: int, itemsize: int, block: int, budget: int) -> tuple:
    """``(mode, bytes)``: what a block of the recursions keeps in shared
    memory (forward_backward.cuh's ``mode``: 2 keeps the rows' ring and
    stages each frame's scores, 1 keeps the ring, 0 neither; plus
    :data:`ARC_TABLE` when it also copies its sequence's arcs there once)
    -- the first of :data:`MODES` that fits ``budget``, with the arc table
    first when :data:`ARC_TABLES` allows it and it fits -- and the dynamic
    shared memory it then takes.  Every mode gives the same bits."""
    W, nc = shape["max_states"], shape["max_columns"]
    ring = (max_span + 1) * W * itemsize
    sizes = {2: ring + (max_span + 1) * nc * itemsize, 1: ring, 0: 0}
    table = arc_table_bytes(shape, max_span, itemsize)
    tables = [t for t in ARC_TABLES if not t or table is not None]  # a table only where its ids fit
    for mode in MODES:
        if mode == 2 and nc > STAGE * block:
            continue  # a thread stages at most STAGE values of a row
        for with_table in tables:
            size = sizes[mode] + (table if with_table else 0)
            if size <= budget:  # (mode 0 without a table takes none)
                return mode | (ARC_TABLE if with_table else 0), size
    raise ValueError(f"no shared-memory mode of {MODES} fits {budget} bytes")


#: lanes never make a block wider than this, or than the block the states and staging ask for
LANE_THREADS = 256


def lanes_per_state(max_states: int, max_degree: int, threads: int) -> int:
    """How many lanes of a warp share each state of the recursions (forward_backward.cuh's ``Lanes``): the
    largest power of two that leaves each lane at least two of the busiest state's arcs and keeps the
    widest sequence's states times the lanes within ``max(threads, LANE_THREADS)`` (``threads``: the block the
    states and the staging ask for).  It depends on the lattice alone, so the results' bits do not depend on
    the block size; 1 for graphs of two or three arcs a state (CTC, RNN-T)."""
    room = max(int(threads), LANE_THREADS)
    lanes = 1
    while lanes < 32 and 4 * lanes <= max_degree and 2 * lanes * max_states <= room:
        lanes *= 2
    return lanes


def state_lanes(shape: dict) -> int:
    """The lanes a state of a lattice of sizes ``shape`` (:func:`layout_shape`) takes in every recursion launch
    over it (:func:`lanes_per_state`, for the block its states and the staging of its scores ask for)."""
    wanted = default_block_size(max(shape["max_states"], -(-shape["max_columns"] // STAGE)))
    return lanes_per_state(shape["max_states"], shape["max_degree"], wanted)


def recursion_plan(shape: dict, max_span: int, itemsize: int, block_size: int | None, budget: int) -> tuple:
    """``(lanes, block, mode, shared_bytes)`` of the recursion launch over a lattice of sizes ``shape``
    (:func:`layout_shape`): the lanes a state takes (:func:`state_lanes`), the block -- enough threads for
    the widest sequence's states times their lanes, and to stage its scores (:data:`STAGE` values a thread),
    unless ``block_size`` is given -- and :func:`shared_plan`'s choice of shared memory within ``budget``."""
    lanes = state_lanes(shape)
    block = launch_block_size(block_size, max(shape["max_states"] * lanes, -(-shape["max_columns"] // STAGE)))
    return (lanes, block, *shared_plan(shape, max_span, itemsize, block, budget))


#: the blocks a direction of a sequence may take as a thread block cluster (``cluster.cu``'s instantiations; 1:
#: one block, ``engine.cu``)
CLUSTERS = (1, 2, 4, 8)
#: the ``cluster`` of :func:`forward_backward` when none is given: ``"auto"``, :func:`auto_cluster`'s size where
#: the device runs clusters (docs/gpu.md, "Launch defaults")
CLUSTER: int | str = "auto"
#: the SMs :func:`auto_cluster` assumes of a backend that does not say (``multiprocessors``): an H100's or H200's
DEFAULT_SMS = 132


#: the widest sequence's states times their lanes up to which :func:`auto_cluster` keeps one block a direction,
#: and the threads a block of a cluster it picks then covers at most
CLUSTER_FROM, CLUSTER_BLOCK = 256, 512


def auto_cluster(shape: dict, N: int, lanes: int, sms: int) -> int:
    """The cluster size ``cluster="auto"`` takes: 1 where the widest sequence's states times their lanes are at
    most :data:`CLUSTER_FROM`; else the smallest of 2, 4, 8 whose blocks of :data:`CLUSTER_BLOCK` threads cover
    them (8 at most), halved until the ``2 N`` clusters fit the device's ``sms`` SMs at once.  The H200 sweeps
    of docs/gpu.md ("Launch defaults") measured this size fastest, or within 2% of the fastest, on every
    benchmark graph: 1 for CTC at 202 states a sequence and for RNN-T and multi-blank (123 and 246 lanes); 2
    for TDT (492 lanes: 1.88 ms against 2.15 ms with one block); 4 for CTC at 2,002 states (5.75 ms against
    9.54 ms with one block and 6.13 ms with 8); 8 for CTC at 6,002 states (15.6 ms against 38.6 ms).  (CTC at
    102 states a sequence, 64 sequences: 1 block 0.48-0.60 ms, 2 blocks 0.47 ms, within the runs' noise.)"""
    width = shape["max_states"] * lanes
    if width <= CLUSTER_FROM:
        return 1
    k = next((k for k in CLUSTERS[1:] if k * CLUSTER_BLOCK >= width), CLUSTERS[-1])
    while k > 1 and 2 * N * k > sms:
        k //= 2
    return k


def clusters_pay(lat: Lattice, leaky: tuple[float, Array] | None, backend: Callable[[], KernelBackend]) -> bool:
    """Whether this engine with the default ``cluster`` (:data:`CLUSTER`) spreads each direction of the
    sequences of ``lat`` -- whose sequences all use one graph, its one-sequence lattice sizing the launch -- over
    several blocks on the backend ``backend()`` gives (asked for only when the lattice alone does not settle
    it): no leaky HMM, a device that runs clusters, and :func:`auto_cluster` above 1 (for ``"auto"``).
    ``engine="auto"`` then takes this engine (:func:`chainfb.engines.select`) where the shared-graph engine
    would run one block a direction: a long CTC sequence alone in its batch (T = 4000, S = 3000: 15.6 ms
    against 39.8 ms on an H200, docs/gpu.md)."""
    if CLUSTER == 1 or leaky is not None:
        return False
    if CLUSTER != "auto":
        return bool(getattr(backend(), "clusters", False))
    shape = layout_shape(lattice_host_arrays(lat.graph_lattice()))
    lanes, N = state_lanes(shape), lat.num_sequences
    if auto_cluster(shape, N, lanes, 2 * N * CLUSTERS[-1]) == 1:  # one block on any device: no device asked
        return False
    device = backend()
    return bool(getattr(device, "clusters", False)) and auto_cluster(shape, N, lanes, _sms(device)) > 1


def _sms(backend: KernelBackend) -> int:
    """The backend's SMs (:data:`DEFAULT_SMS` where it does not say)."""
    return int(getattr(backend, "multiprocessors", DEFAULT_SMS))


def cluster_plan(shape: dict, max_span: int, itemsize: int, block_size: int | None, budget: int,
                 cluster: int) -> tuple:
    """``(lanes, block, mode, shared_bytes)`` of the recursion launch with each direction of a sequence spread
    over a cluster of ``cluster`` blocks (``cluster.cu``): the lanes of :func:`state_lanes` (the same for
    every launch of a lattice, so every cluster size gives the same bits), a block of enough threads for the
    widest sequence's states times their lanes over the ``cluster`` blocks (unless ``block_size`` is given),
    the rows in device memory (mode 0) with the arc table where it fits ``budget`` beside the row maxima's
    partials, ``[2, cluster * 32]`` values."""
    lanes = state_lanes(shape)
    block = launch_block_size(block_size, -(-shape["max_states"] * lanes // cluster))
    partials = 2 * cluster * 32 * itemsize
    table = arc_table_bytes(shape, max_span, itemsize)
    if ARC_TABLES[0] and table is not None and partials + table <= budget:
        return lanes, block, ARC_TABLE, partials + table
    return lanes, block, 0, partials


def check_cluster(backend: KernelBackend, cluster: int | str, leaky: tuple[float, Array] | None,
                  layout: Callable[..., tuple]) -> int | str:
    """``cluster`` as an int of :data:`CLUSTERS` (or ``"auto"``), checked against what the launch can do: blocks
    of a cluster need a backend that runs them (``backend.clusters``: a device of compute capability 9.0 or later)
    and the per-sequence kernels without the leaky HMM.  ``"auto"`` stays ``"auto"`` where all of these hold (the
    launcher then takes :func:`auto_cluster`'s size), else it is 1."""
    if isinstance(cluster, str) and cluster == "auto":
        ok = getattr(backend, "clusters", False) and leaky is None and layout is _lattice_layout
        return "auto" if ok else 1
    if isinstance(cluster, bool) or not isinstance(cluster, (int, np.integer)) or int(cluster) not in CLUSTERS:
        raise ValueError(f"cluster: expected one of {CLUSTERS} or 'auto', got {cluster!r}")
    cluster = int(cluster)
    if cluster > 1:
        if not getattr(backend, "clusters", False):
            raise ValueError(f"cluster: {cluster} blocks a sequence need thread block clusters (compute "
                             f"capability 9.0 or later); this device has none")
        if leaky is not None:
            raise ValueError("cluster: the leaky HMM runs with one block a sequence (cluster=1)")
        if layout is not _lattice_layout:
            raise ValueError("cluster: only the per-sequence kernels (the cuda engine) run as clusters")
    return cluster


#: frames a block of the posterior kernel covers (at least; more where a frame a block would make over 2^20
#: blocks).  A block reads its sequence's arcs by column (12 bytes an arc, from L2) at each of its frames, and
#: they stay in L1 from one of its frames to the next: several frames a block read them from L2 once for
#: several frames, with fewer blocks to fill the SMs.  4: in two H200 sweeps
#: (``benchmarks/gpu_block_sweep.py --posterior-frames``, docs/gpu.md "Launch defaults") 4 frames a block measured
#: faster than 1 or level with it on the CTC, RNN-T, multi-blank and shared-graph launches (up to 24% at
#: T = 150, N = 64), and within 1.5% of it on TDT's.
POSTERIOR_FRAMES = 4


def posterior_launch(N: int, T: int, max_chunks: int, frames: int | None = None) -> tuple:
    """``(frames per block, blocks, threads)`` of the posterior kernel: a
    block per sequence and ``frames`` frames (None: :data:`POSTERIOR_FRAMES`;
    more past 2^20 blocks), threads over the widest sequence's chunks
    (32..256)."""
    frames = POSTERIOR_FRAMES if frames is None else frames
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or frames < 1:
        raise ValueError(f"frames: expected an int >= 1, got {frames!r}")
    F = max(int(frames), -(-N * T // 2**20))
    block = 32
    while block < max_chunks and block < 256:
        block *= 2
    return F, N * -(-T // F), block


def _device_lengths(backend: KernelBackend, lat: Lattice, h: np.ndarray) -> Array:
    """Host lengths ``h [N]`` as an int64 device array, the copy kept by ``lat`` (per device and stream, see
    :func:`cached`) for the last lengths it ran with: a loss that runs a lattice again with the same lengths (the
    same labels and frames, step after step) uploads nothing.  The kernels only read it."""
    slot = cached(lat, "lengths", backend, np.int64, dict)
    key = h.astype(np.int64, copy=False).tobytes()
    got = slot.get(key)
    if got is None:
        got = backend.xp.array(h, dtype=np.int64)  # a copy, on a host backend too: the caller's array may change
        slot.clear()
        slot[key] = got
    return got


def check_inputs(backend: KernelBackend, lat: Lattice, X: Array, lengths: Array) -> tuple[Array, Array, np.dtype]:
    """``(X, lengths, dtype)``: ``X [T, C]`` float32/float64 C-contiguous and
    ``lengths`` int64 ``[N]`` on ``backend``'s device, checked (host lengths
    must lie in ``[0, T]``; device ones are clamped by the kernels)."""
    xp = backend.xp
    if X.ndim != 2 or X.shape[1] != lat.num_columns:
        raise ValueError(f"X: expected shape [T, {lat.num_columns}], got {tuple(X.shape)}")
    dtype = np.dtype(X.dtype)
    if dtype not in REAL_TYPES:
        raise TypeError(f"X: expected dtype float32 or float64, got {dtype}")
    T, C = X.shape
    if T > _I32_MAX or C > _I32_MAX:
        raise ValueError(f"X: shape {tuple(X.shape)} too large")
    if not X.flags.c_contiguous:
        X = xp.ascontiguousarray(X)
    h = host_array(lengths)
    N = lat.num_sequences
    if h is not None and h.dtype.kind in "iu":
        if h.size and (h.min() < 0 or h.max() > T):
            raise ValueError(f"lengths: every length must lie in [0, T={T}], got {h[(h < 0) | (h > T)][0]}")
        if h.shape == (N,):
            return X, _device_lengths(backend, lat, h), dtype
    lengths = xp.asarray(lengths)
    if lengths.shape != (N,):
        raise ValueError(f"lengths: expected shape ({N},), got {tuple(lengths.shape)}")
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"lengths: expected integers, got dtype {lengths.dtype}")
    return X, xp.ascontiguousarray(lengths.astype(np.int64, copy=False)), dtype


def leak_log_c(leaky: tuple[float, Array] | None, dtype: np.dtype) -> np.floating:
    """``log(c)`` of ``leaky = (c, log_init)`` in ``dtype`` (``-inf`` for
    ``c = 0``: no leak, but paths start from ``log_init``); 0 without a leak."""
    if leaky is None:
        return dtype.type(0)
    coef = float(leaky[0])
    if not 0.0 <= coef < 1.0:
        raise ValueError(f"leaky: the coefficient must lie in [0, 1), got {coef}")
    with np.errstate(divide="ignore"):
        return dtype.type(np.log(coef))


def check_log_init(xp: ModuleType, log_init: Array, S: int, dtype: DTypeLike) -> Array:
    """``log_init`` as a contiguous ``[S]`` array of ``dtype`` on ``xp``."""
    out = xp.ascontiguousarray(xp.asarray(log_init, dtype=dtype))
    if out.shape != (S,):
        raise ValueError(f"leaky: log_init must have shape ({S},), got {tuple(out.shape)}")
    return out


def run_engine(backend: KernelBackend, lat: Lattice, X: Array, lengths: Array, leaky: tuple[float, Array] | None,
               need_posteriors: bool, block_size: int | None,
               layout: Callable[..., tuple], cluster: int | str = 1) -> tuple[Array, Array | None]:
    """The engine protocol on ``backend`` through a pair of kernels:
    ``chainfb::{prefix}_recursion`` (a block per sequence and direction: the
    forward and the backward run at the same time) and
    ``chainfb::{prefix}_posteriors`` (a block per sequence and frame).

    ``layout(backend, lat, dtype, leaky)`` describes the pair: ``(prefix,
    rec_head, post_head, log_init, shape)`` -- each kernel's own leading
    arguments (those every engine kernel takes follow, see ``engine.cu``),
    the device ``log_init`` (None without a leak) and the sizes of the
    lattice's arrays (``max_states``, ``max_columns``, ``max_chunks``,
    ``max_degree``).  The recursion's lanes, block and shared memory are
    :func:`recursion_plan`'s, or with ``cluster`` > 1 (a cluster of blocks a
    direction, ``cluster.cu``) :func:`cluster_plan`'s.  Returns ``(loglike
    [N], post [T, C] or None)``."""
    cluster = check_cluster(backend, cluster, leaky, layout)
    X, lengths, dtype = check_inputs(backend, lat, X, lengths)
    max_span = int(lat.max_span)
    if leaky is not None and max_span > 1:
        raise ValueError(f"leaky: the leaky HMM is not defined for arcs that span several frames (max span "
                         f"{max_span})")
    log_c = leak_log_c(leaky, dtype)
    xp = backend.xp
    T, C = X.shape
    N, S = lat.num_sequences, lat.num_states
    if N == 0:
        return xp.zeros(0, dtype=dtype), xp.zeros((T, C), dtype=dtype) if need_posteriors else None
    post = xp.empty((T, C), dtype=dtype) if need_posteriors else None  # (the posterior kernel writes every element)
    prefix, rec_head, post_head, log_init, shape = layout(backend, lat, dtype, leaky)
    if cluster == "auto":
        cluster = auto_cluster(shape, N, state_lanes(shape), _sms(backend))
    r = REAL_TYPES[dtype]
    if cluster > 1:  # each direction on `cluster` blocks
        lanes, block, mode, shared = cluster_plan(shape, max_span, dtype.itemsize, block_size,
                                                  shared_budget(backend), cluster)
        kernel, blocks = f"chainfb::fb_cluster_recursion<{r}, {cluster}>", cluster * N
    else:
        lanes, block, mode, shared = recursion_plan(shape, max_span, dtype.itemsize, block_size,
                                                    shared_budget(backend))
        kernel, blocks = f"chainfb::{prefix}_recursion<{r}>", N
    init = null_or(log_init)  # a null pointer: no leak
    # the rows, their offsets and each sequence's z in one allocation: the forward's alpha, P and z, and
    # with posteriors the backward's beta and Q (else null pointers)
    forward = [((T + 1, S), dtype), ((N, T + 1), np.float64), ((N,), dtype)]
    backward = [((T + 1, S), dtype), ((N, T + 1), np.float64)] if need_posteriors else []
    alpha, offs, lz, *rest = scratch(backend, forward + backward)
    beta, qoffs = rest or (null_or(None), null_or(None))
    loglike = xp.empty(N, dtype=dtype)  # (returned: its own allocation, which keeps no rows alive)
    i32 = np.int32
    rows = [lengths, X, i32(T), i32(C), alpha, beta, i32(S), offs, qoffs]
    backend.launch(kernel, blocks * (2 if need_posteriors else 1), block,
                   [i32(N)] + rec_head + rows + [i32(mode), i32(lanes), init, log_c, loglike, lz], shared_mem=shared)
    if not need_posteriors:
        return loglike, None
    F, grid, pblock = posterior_launch(N, T, shape["max_chunks"])
    backend.launch(f"chainfb::{prefix}_posteriors<{r}>", grid, pblock,
                   [i32(N), i32(F)] + post_head + [lengths, X, i32(T), i32(C), alpha, beta, i32(S), offs, qoffs,
                                                   loglike, lz, post],
                   shared_mem=shape["max_chunks"] * dtype.itemsize)
    return loglike, post


def _instance_log_init(xp, lat: Lattice, log_init, dtype):
    """``log_init`` as the lattice's ``[S]`` on the device: as given, or a
    graph-local ``[Sg]`` repeated for every sequence when all use one graph."""
    fst = lat.shared_fst
    if fst is not None and np.shape(log_init) == (fst.num_states,) != (lat.num_states,):
        log_init = xp.tile(xp.asarray(log_init, dtype=dtype), lat.num_sequences)
    return check_log_init(xp, log_init, lat.num_states, dtype)


def layout_shape(a: dict) -> dict:
    """The sizes :func:`run_engine` needs from a lattice's arrays."""
    return {k: a[k] for k in ("max_states", "max_columns", "max_chunks", "max_degree", "max_arcs")}


def chunk_args(a: dict, span: Array) -> list:
    """The posterior kernels' arrays of the arcs by column and their chunks."""
    return [a["ca_src"], a["ca_dst"], a["ca_lp"], span, np.int32(a["max_span"]), a["chunk_arc"], a["chunk_col"],
            a["chunk_sole"], a["mc_col"], a["mc_begin"], a["mc_end"]]


def _lattice_layout(backend, lat: Lattice, dtype, leaky):
    """engine.cu's kernels over the lattice's own arrays (see :func:`run_engine`)."""
    a = lattice_arrays(backend, lat, dtype)
    log_init = None if leaky is None else _instance_log_init(backend.xp, lat, leaky[1], dtype)
    rec = [a["state_off"], a["col_off"], a["start"], a["final"], a["in_ptr"], a["in_src"], a["in_lp"], a["in_col"],
           null_or(a["in_span"]), a["out_ptr"], a["out_dst"], a["out_lp"], a["out_col"], null_or(a["out_span"]),
           np.int32(a["max_span"])]
    post = [a["state_off"], a["col_off"], a["chunk_ptr"], a["mc_ptr"]] + chunk_args(a, null_or(a["ca_span"]))
    return "fb", rec, post, log_init, layout_shape(a)


def forward_backward(backend: KernelBackend, lat: Lattice, X: Array, lengths: Array,
                     leaky: tuple[float, Array] | None = None, need_posteriors: bool = True,
                     block_size: int | None = None, cluster: int | str | None = None) -> tuple[Array, Array | None]:
    """Forward-backward over a lattice through the kernels of ``engine.cu``
    (``cluster.cu`` for the recursion with ``cluster`` > 1).

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
    block_size : threads per block (1..1024, rounded up to a multiple of
        32), or None for :func:`default_block_size` of the widest sequence.
    cluster : 1, 2, 4 or 8 -- the blocks each direction of a sequence takes
        (a thread block cluster: compute capability 9.0 or later, no leaky
        HMM; the same bits as 1) --, ``"auto"`` (:func:`auto_cluster`'s
        size where clusters can run, else 1), or None for :data:`CLUSTER`
        (1: no device has measured clusters yet;
        ``benchmarks/gpu_block_sweep.py`` does).

    Returns
    -------
    loglike : ``backend.xp`` ``[N]`` (dtype of ``X``)
    posteriors : ``backend.xp`` ``[T, C]`` or None
    """
    return run_engine(backend, lat, X, lengths, leaky, need_posteriors, block_size, _lattice_layout,
                      CLUSTER if cluster is None else cluster)


def best_path(lat: Lattice, X: Array, lengths: Array) -> tuple:
    """Viterbi for CuPy scores: there is no max-semiring kernel, so ``X`` is
    copied to the host and :func:`chainfb.engines.numpy_log.best_path` runs
    (same return values, NumPy arrays; arcs spanning several frames as
    there)."""
    from . import check, numpy_log

    check("numpy", lat, "best_path")

    def host(a):
        return a.get() if hasattr(a, "get") else a

    return numpy_log.best_path(lat, np.asarray(host(X), dtype=np.float64), np.asarray(host(lengths), dtype=np.int64))
