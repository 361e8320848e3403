"""The engine seam: one protocol, five implementations, one place that picks.

Every engine is a module with two functions over a
:class:`~chainfb.lattice.Lattice` and a compact score matrix ``X [T, C]``
(one column per distinct ``(sequence, pdf)``, see :mod:`chainfb.score_map`):

``forward_backward(lat, X, lengths, leaky=None, need_posteriors=True)``
    ``(loglike [N], posteriors [T, C] or None)``: the log of the total
    weight of the paths of exactly ``lengths[n]`` arcs from the start state
    to a final state, and ``d loglike / d X``.  ``leaky = (c, log_init [S])``
    is Kaldi's leaky HMM (``log_init [Sg]``, graph-local, when every
    sequence uses one graph of ``Sg`` states).  Frames past a sequence's length are ignored
    (``X`` may be overwritten there).
``best_path(lat, X, lengths)``
    ``(score [N], arcs [N, max(lengths)])``: the same recursion in the max
    semiring; ``arcs[n, t]`` is the winning arc read at frame ``t``, as an
    index into the FstBatch's flat arc arrays, and ``-1`` at frames inside an
    arc that spans several frames (covered, not read), past a length or
    without a path.

Arcs may span several frames (``Fst.span``, ``Lattice.max_span > 1``): an
arc read at frame ``t`` scores ``w + X[t, col]`` and lands at frame
``t + span``; a path ends exactly at frame ``lengths[n]``.  Posteriors count
an arc at the frame it is read.  Every engine runs such lattices (no leaky
HMM with them).

What each engine can do -- where it runs, Viterbi, the leaky HMM, spans,
graphs shared by every sequence only, float32 scores as they are, threads,
an optional dependency -- is one row of :data:`CAPABILITIES`; :func:`select`
filters that table (``engine="auto"``) or checks a name against it, and
:func:`engines_with` lists the engines that can do something (the tests are
parametrised from it).

The CUDA engines take the kernel backend to run on as their first argument,
``forward_backward(backend, lat, X, lengths, leaky=None,
need_posteriors=True, block_size=None, cluster=1)`` (backend interface in
:mod:`chainfb.cuda.kernels`; ``X`` and the results are ``backend.xp``
arrays); :func:`forward_backward` here resolves it once, with
:func:`chainfb.cuda.kernels.backend_for`.

The implementations:

- :mod:`~chainfb.engines.numpy_log` -- NumPy, log domain, float64; the
  reference and the general CPU engine.
- :mod:`~chainfb.engines.numba_log` -- the same forward-backward as loops
  compiled by Numba (a default dependency; ``CHAINFB_NUMBA=0`` turns it
  off), scaled probabilities with an exact log-domain escape, threads over
  sequences; several times faster on lattices with few states per frame
  (CTC, transducer and numerator graphs).  No leaky HMM, no Viterbi.
- :mod:`~chainfb.engines.scipy_shared` -- SciPy sparse products in the
  scaled probability domain, for lattices whose sequences all share one
  graph (the LF-MMI denominator), several times faster there.
- :mod:`~chainfb.engines.cuda` -- CuPy RawKernels (``chainfb/cuda/engine.cu``),
  one graph instance per sequence.
- :mod:`~chainfb.engines.cuda_shared` -- CuPy RawKernels
  (``chainfb/cuda/shared_graph.cu``) for lattices whose sequences all share
  one graph: every block reads the one graph (the LF-MMI denominator on the
  GPU).

:func:`select` is the only place that chooses between them; criteria and
public functions call :func:`forward_backward` / :func:`best_path` here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .._arrays import Array
from ..cuda import kernels
from ..lattice import Lattice
from .threads import get_num_threads, set_num_threads

__all__ = ["ENGINES", "CAPABILITIES", "Capabilities", "engines_with", "select", "prepare", "forward_backward",
           "best_path", "set_num_threads", "get_num_threads"]


@dataclass(frozen=True)
class Capabilities:
    """What one engine can do (a row of :data:`CAPABILITIES`)."""

    #: ``"cpu"`` (NumPy scores) or ``"gpu"`` (CuPy scores, on a kernel backend)
    device: str
    #: ``best_path``: the recursion in the max semiring (the GPU engines decode on the host)
    viterbi: bool
    #: Kaldi's leaky HMM (never together with arcs that span several frames)
    leaky: bool
    #: arcs that span several frames (``Lattice.max_span > 1``)
    spans: bool
    #: runs only lattices whose sequences all use one graph
    shared_graph_only: bool
    #: reads float32 scores as they are (the others get them as float64)
    float32: bool
    #: splits a call over :func:`get_num_threads` threads
    threads: bool
    #: an optional dependency it needs at run time ("" for none)
    needs: str = ""


#: every engine and what it can do; :func:`select` reads nothing else about them
CAPABILITIES = {
    "numpy": Capabilities("cpu", viterbi=True, leaky=True, spans=True, shared_graph_only=False, float32=False,
                          threads=True),
    "numba": Capabilities("cpu", viterbi=False, leaky=False, spans=True, shared_graph_only=False, float32=True,
                          threads=True, needs="numba"),
    "shared": Capabilities("cpu", viterbi=True, leaky=True, spans=True, shared_graph_only=True, float32=False,
                           threads=True),
    "cuda": Capabilities("gpu", viterbi=True, leaky=True, spans=True, shared_graph_only=False, float32=True,
                         threads=False),
    "cuda_shared": Capabilities("gpu", viterbi=True, leaky=True, spans=True, shared_graph_only=True, float32=True,
                                threads=False),
}

#: engine names accepted by ``engine=``
ENGINES = ("auto",) + tuple(CAPABILITIES)

# the shared-graph engine pays off from about this many arcs of the shared graph
_SHARED_MIN_ARCS = 2000


def engines_with(**wants: object) -> tuple:
    """The names of the engines whose :class:`Capabilities` have every field
    given equal to its value, in the table's order, e.g.
    ``engines_with(device="cpu", spans=True)``."""
    known = {f.name for f in fields(Capabilities)}
    unknown = sorted(set(wants) - known)
    if unknown:
        raise ValueError(f"wants: unknown capabilities {unknown}; expected some of {sorted(known)}")
    return tuple(name for name, caps in CAPABILITIES.items()
                 if all(getattr(caps, k) == v for k, v in wants.items()))


#: the engines that run arcs spanning several frames (``Lattice.max_span > 1``), from :data:`CAPABILITIES`
SPAN_ENGINES: tuple = engines_with(spans=True)


def _module(name):
    if name == "numpy":
        from . import numpy_log

        return numpy_log
    if name == "numba":
        from . import numba_log

        return numba_log
    if name == "shared":
        from . import scipy_shared

        return scipy_shared
    if name == "cuda_shared":
        from . import cuda_shared

        return cuda_shared
    from . import cuda

    return cuda


def _one_graph(lat) -> bool:
    """Whether every sequence of ``lat`` uses one graph (read from the lattice, without cutting the batch's
    :class:`~chainfb.fst.Fst` objects)."""
    return lat.graph is not None


def _kernel_engine(lat, engine: str, X=None, leaky=None) -> str:
    """The CUDA engine for ``lat``: ``"cuda"`` when asked for, else
    ``"cuda_shared"`` on a one-graph lattice -- unless ``engine="auto"`` and
    the per-sequence kernels would spread each sequence over a cluster of
    blocks (:func:`chainfb.engines.cuda.clusters_pay`) -- and ``"cuda"``
    otherwise."""
    if engine == "cuda":
        return "cuda"
    if _one_graph(lat):
        if engine == "auto" and X is not None:
            from . import cuda

            if cuda.clusters_pay(lat, leaky, lambda: kernels.backend_for(X)):
                return "cuda"
        return "cuda_shared"
    if engine == "cuda_shared":
        raise ValueError("engine: 'cuda_shared' needs every sequence to use one graph")
    return "cuda"


def _refusal(name: str, lat, op: str, leaky) -> str:
    """Why engine ``name`` cannot run ``op`` on ``lat`` (with ``leaky``), by
    its row of :data:`CAPABILITIES` ("" when it can)."""
    caps = CAPABILITIES[name]
    spans = getattr(lat, "max_span", 1) > 1
    if op == "best_path" and not caps.viterbi:
        return f"engine: {name!r} has no best_path (Viterbi); engines that do: {', '.join(engines_with(viterbi=True))}"
    if leaky is not None and not caps.leaky:
        return (f"engine: {name!r} runs forward-backward without leaky only; engines with the leaky HMM: "
                f"{', '.join(engines_with(leaky=True))}")
    if spans and not caps.spans:
        return (f"engine: {name!r} does not run arcs that span several frames (max span {lat.max_span}); "
                f"engines that do: {', '.join(engines_with(spans=True)) or 'none'}")
    return ""


def check(name: str, lat: Lattice, op: str = "forward_backward", leaky: tuple[float, Array] | None = None) -> str:
    """``name``, or a ``ValueError`` saying what of ``op`` on ``lat`` its row
    of :data:`CAPABILITIES` lacks."""
    why = _refusal(name, lat, op, leaky)
    if why:
        raise ValueError(why)
    return name


def select(lat: Lattice, X: Array, op: str = "forward_backward", engine: str = "auto",
           leaky: tuple[float, Array] | None = None) -> str:
    """The name of the engine that runs ``op`` (``"forward_backward"`` or
    ``"best_path"``) on ``lat`` and ``X``.

    ``engine="auto"``: among the engines of :data:`CAPABILITIES` that run on
    the device of ``X`` and can do ``op`` on ``lat`` (Viterbi, the leaky HMM,
    spans): for CuPy scores ``"cuda_shared"`` when every sequence uses one
    graph (the denominator) unless the per-sequence kernels would run each
    sequence on a cluster of blocks (few long sequences:
    :func:`chainfb.engines.cuda.clusters_pay`), ``"cuda"`` otherwise; on the CPU ``"shared"``
    for a forward-backward when every sequence uses one graph of at least
    2000 arcs, there are at least two sequences, and the shared-graph engine
    gives the exact numbers (:func:`chainfb.engines.scipy_shared.is_exact`:
    finite scores whose per-frame spread plus the arc weights' spread is
    under :data:`~chainfb.engines.scipy_shared.MAX_SPREAD` nats); ``"numba"``
    when it can (no leaky HMM, no Viterbi) unless the compiled engine is off
    (``CHAINFB_NUMBA=0``, or a Numba that cannot be imported); ``"numpy"``
    otherwise.  An explicit name is checked against where ``X`` lives
    (:func:`chainfb.cuda.kernels.on_device`), against the lattice and
    against its row of :data:`CAPABILITIES` (a ``ValueError`` saying what
    it lacks).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(map(repr, ENGINES))}, got {engine!r}")
    on_gpu = kernels.on_device(X)
    if engine == "auto":
        return _auto(lat, X, op, leaky, on_gpu)
    caps = CAPABILITIES[engine]
    if on_gpu != (caps.device == "gpu"):
        where = "CuPy (GPU)" if on_gpu else "NumPy (CPU)"
        raise ValueError(f"engine: {engine!r} cannot run on {where} scores")
    if on_gpu:
        return check(_kernel_engine(lat, engine), lat, op, leaky)
    if caps.shared_graph_only and not _one_graph(lat):
        raise ValueError(f"engine: {engine!r} needs every sequence to use one graph")
    if caps.needs == "numba":
        from .numba_log import require

        require()
    return check(engine, lat, op, leaky)


def _auto(lat, X, op, leaky, on_gpu) -> str:
    """The engine ``engine="auto"`` picks (see :func:`select`) among those
    whose row of :data:`CAPABILITIES` fits."""
    if on_gpu:
        return check(_kernel_engine(lat, "auto", X if op == "forward_backward" else None, leaky), lat, op, leaky)

    def ok(name):
        return CAPABILITIES[name].device == "cpu" and not _refusal(name, lat, op, leaky)

    if op == "forward_backward" and lat.num_sequences >= 2 and ok("shared"):
        from . import scipy_shared

        g = scipy_shared.shared_graph(lat)
        if g is not None and g.num_arcs >= _SHARED_MIN_ARCS and scipy_shared.is_exact(lat, X):
            return "shared"
    if ok("numba"):
        from .numba_log import available

        if available():
            return "numba"
    return check("numpy", lat, op, leaky)


def prepare(lat: Lattice, gpu: bool) -> dict:
    """Build now, on the host, what the per-sequence engine that runs ``lat``
    keeps in :meth:`~chainfb.lattice.Lattice.cache` from its first run: the
    CUDA engine's index arrays (before their upload) when ``gpu``, else the
    compiled engine's arrays.  For work done ahead of the step that runs
    the lattice, e.g. in a data-loading process
    (:class:`chainfb.CtcTargets`).  A lattice of several sequences that all
    use one graph keeps its data per graph instead (the shared-graph
    engines): then nothing is built.  Returns those entries of the cache
    (built now or before), ``{key: value}``."""
    if _one_graph(lat) and lat.num_sequences > 1:
        return {}
    if gpu:
        from .cuda import HOST_ARRAYS, lattice_host_arrays

        return {HOST_ARRAYS: lattice_host_arrays(lat)}
    from . import numba_log

    if not numba_log.available():
        return {}
    from .numba_log.arrays import ARRAYS, lattice_arrays

    return {ARRAYS: lattice_arrays(lat)}


def forward_backward(lat: Lattice, X: Array, lengths: Array, leaky: tuple[float, Array] | None = None,
                     need_posteriors: bool = True, engine: str = "auto") -> tuple[Array, Array | None]:
    """Run the engine :func:`select` picks (protocol in the module docstring);
    a CUDA engine runs on the kernel backend of ``X``
    (:func:`chainfb.cuda.kernels.backend_for`)."""
    name = select(lat, X, "forward_backward", engine, leaky)
    module = _module(name)
    caps = CAPABILITIES[name]
    if not caps.float32:  # the compiled engine and the kernels read float32 as it is
        X = _float64(X)
    if caps.device == "gpu":
        return module.forward_backward(kernels.backend_for(X), lat, X, lengths, leaky, need_posteriors)
    return module.forward_backward(lat, X, lengths, leaky=leaky, need_posteriors=need_posteriors)


def best_path(lat: Lattice, X: Array, lengths: Array, engine: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """Viterbi through the engine :func:`select` picks (CuPy scores are
    decoded on the host: there is no max-semiring kernel); ``arcs[n, t]`` is
    the arc read at frame ``t`` (``-1`` inside a spanning arc, past a length
    or without a path)."""
    return _module(select(lat, X, "best_path", engine)).best_path(lat, _float64(X), lengths)


def _float64(X):
    """Float32 host scores (what a criterion gathers from float32 inputs, for
    the compiled engine and the kernels) as the float64 the NumPy and SciPy
    engines read."""
    return X.astype(np.float64) if isinstance(X, np.ndarray) and X.dtype == np.float32 else X
