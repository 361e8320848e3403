r"""The compiled CPU engine: the forward-backward of
:mod:`~chainfb.engines.numpy_log` written as loops over frames, states and
arcs and compiled by Numba (a default dependency of chainfb; the ``jit``
extra is kept for compatibility).  Same definitions, same numbers to
rounding.  The NumPy engine pays a dozen array operations per frame, each a
Python call; on lattices with few states per frame (CTC graphs, transducer
step graphs, numerator graphs) that overhead is most of its time.  Here one
frame of a sequence is a pass over its arcs.

The recursion
-------------
A sequence of length ``L`` runs over its graph instance: states ``j``,
arcs ``a = (i -> j)`` with log weight ``lp_a``, column ``c_a`` and span
``k_a`` (1 except in :mod:`.spanning`), scores ``X[t, c]``.  With ``x_a(t)
= exp(lp_a + X[t, c_a])``::

    alpha_0(j)     = [j = start]
    alpha_{t+1}(j) = sum_{arcs i->j} alpha_t(i) x_a(t)
    beta_L(i)      = exp(final(i))
    B_t(i)         = sum_{arcs i->j} x_a(t) beta_{t+1}(j)       (= beta_t(i))
    loglike        = log sum_j alpha_L(j) exp(final(j))

and the posterior of an arc read at frame ``t`` is ``alpha_t(i) x_a(t)
beta_{t+1}(j) / Z_t`` with the frame's own total ``Z_t = sum_i alpha_t(i)
B_t(i)`` (``exp(loglike)`` in exact arithmetic; the NumPy engine
normalises each frame by it too), summed per column.

The scaling
-----------
The arc weights are ``w_a = exp(lp_a - wshift)`` (``wshift``: the largest
finite ``lp``) and the emissions ``E_t(c) = exp(X[t, c] - m_t)`` (``m_t``:
the frame's largest score in the sequence, one ``exp`` per column and
frame), so ``x_a(t) = w_a E_t(c_a) exp(shift_t)`` with ``shift_t = m_t +
wshift``, and one frame is::

    alpha_{t+1}(j) = exp(shift_t) sum_{arcs i->j} alpha_t(i) w E     (forward)
    B_t(i)         = exp(shift_t) sum_{arcs i->j} w E beta_{t+1}(j)  (backward)

-- multiply-adds, no ``exp`` or ``log`` per arc.  Each frame's cells are
kept relative to the frame's scale: the sums leave out ``exp(shift_t)``
and are divided by their largest cell ``c_{t+1}``; ``shift_t + log
c_{t+1}`` joins the sequence's log ``offset``, and ``loglike = offset +
log sum_j alpha_L(j) exp(final(j))``.  Every factor is at most 1, so a sum
is at most its number of terms: nothing overflows.

The log-domain escape
---------------------
A cell's sum is kept as a scaled probability when it is at least ``SAFE =
1e-290`` of the frame's largest: then it is exact to float64's rounding
even if some terms underflowed (each lost term is below ``DBL_MIN ~
2.2e-308``, under ``1e-17`` of the sum).  A smaller (but nonzero) cell is
recomputed in the log domain -- the log-sum-exp of its arcs' ``log(far
end) + lp + score`` -- and kept as its log; such cells enter their
successors' sums as ``exp(log)`` and, when a normalisation brings them
into the safe range, become scaled again (:mod:`.cells`).  Every cell is
thus exact however far it lies below the others (a tight alignment whose
only surviving path is thousands of nats below dead ends), and the common
case costs no transcendental function at all.

Bands and blocks (the one-frame pass)
-------------------------------------
Only the states of each frame's live band (:mod:`.bands`: those that can
be on a path of exactly ``L`` arcs at ``t``) are computed and stored.  In
lattices with a sequence of more than ``_MIN_BLOCKED_STATES`` states whose
arcs stay within a few blocks of the numbering, one scale per frame would
leave most of a long band below ``SAFE`` of the frame's largest (alpha
spreads over thousands of nats across it), so each block of ``2**sh``
states keeps its own log reference ``R``.  Block ``b`` of frame ``t + 1``
is formed relative to the largest reference ``ref`` of the blocks its arcs
read; each far end's product is multiplied by ``exp(R_t[its block] - ref)
<= 1`` (nothing overflows; a cell whose scaled sum falls below ``SAFE``
takes the log-domain escape with the same offsets), and the block is then
divided by its largest cell (:func:`.frames.band_frame`).  The references
are kept relative to the frame's largest, whose log joins the offset.

Posteriors
----------
An arc posterior is ``alpha w E beta exp(R_alpha + R_beta - log Z_t)``, one
factor ``g`` per pair of blocks (``g p`` finite and the other factors at
most 1: the product is exact unless it underflows below ``DBL_MIN``); an
arc with a cell kept as a log takes the log domain, unless a bound on its
posterior (cells and ``w E`` at most 1) is below ``1e-88`` of the frame's
total, the terms the scaled products leave out.  When the scaled total is
at least ``SAFE_TOTAL = 1e-200``, every term left out of it (a cell kept as
a log, below ``1e-290`` times at most the out-degree) is below ``1e-88`` of
it and the scaled products are used; a frame with a smaller total is done
in the log domain.  A backward frame whose cells (and its successor's) are
one block -- every frame when no sequence has more than
``_MIN_BLOCKED_STATES`` states -- is fused with its posteriors
(:func:`.frames.beta_frame_fused`): while ``B_t(i)`` is summed, each arc
whose alpha and beta cells are both scaled adds ``alpha w E beta`` (its
posterior times ``Z_t``) to its column and ``Z_t`` is summed along; the
columns are then multiplied by ``1 / Z_t``.  With ``Z_t >= 1e-200``, a
posterior above ``1e-88`` was formed as a number above ``1e-288`` (no
underflow); the states with a cell kept as a log finish their arcs in the
log domain afterwards, and a frame with a smaller total starts again on
the general path (:func:`.one_frame.frame_log_total`,
:func:`.one_frame.arc_posteriors`).

Emissions are formed inside the pass with the vector exponential of
:mod:`chainfb.engines.vector_math`: a sequence's, at its start, into a work
array that the next sequence reuses (it stays in cache) when they take up
to ``_EMISSIONS_BYTES``; a longer sequence's a frame's row at a time where
it is read.  No second ``[T, C]`` array is held.  Float32 scores are read
as they are (each widened exactly where it is read: the numbers of a
float64 copy at half its memory).

Spans
-----
Arcs that span frames (``lat.max_span > 1``, semantics in
:mod:`chainfb.engines`: an arc read at frame ``t`` lands at ``t + span``)
run in a second pass, :mod:`.spanning`, chosen once per call, so one-frame
lattices keep the pass above unchanged.  An arc from frame ``t + 1 - k``
into frame ``t + 1`` combines cells of different frames' scales: each
frame's log offset is a double-double running sum, so the scale between
two frames is one difference exact to its own rounding, and frame ``t +
1`` is formed relative to the largest of its source frames' references,
each source frame's products rescaled by ``exp`` of its difference to it
(at most 1).  The betas are kept for every frame; each frame's posteriors
are divided by the frame's own total, the paths through a state at ``t``
plus those on an arc read before ``t`` that lands after it.  A frame's
work is its arcs plus a few terms per distinct span: an arc longer than
every sequence is left out (it is on no path), and a duration of 999
frames costs what one of 4 does.

Threads
-------
Sequences are independent: the compiled functions release the GIL, and
contiguous ranges of sequences, a few per thread of about equal work, run
on :func:`chainfb.engines.get_num_threads` threads, the largest first, each
thread taking the next range left; columns belong to one sequence, so the
threads never write the same posterior.  NaN in a sequence's scores gives
NaN out for that sequence only.  ``CHAINFB_NUMBA=0`` in the environment
leaves Numba unused (``auto`` then picks the NumPy engine).  No leaky HMM
and no Viterbi here (those run on the NumPy engines;
:func:`chainfb.engines.select` knows).

Modules
-------
- :mod:`.arrays` -- the lattice as named tuples of CSR arrays, cached on it;
- :mod:`.bands` -- live bands, distances, blocks;
- :mod:`.cells` -- the two encodings of a cell, the thresholds;
- :mod:`.columns` -- a sequence's frame maxima, emissions, posterior columns;
- :mod:`.frames` -- one frame of the one-frame pass (either direction);
- :mod:`.one_frame` -- the one-frame pass over a range of sequences;
- :mod:`.spanning` -- the spanning pass;
- this module -- the driver: arrays, threads, the engine protocol.

Glossary of the short names
---------------------------
Sizes: ``N`` sequences, ``S`` states and ``A`` arcs of all the graph
instances, ``T x C`` the scores ``X`` (``C``: every sequence's columns),
``L`` a sequence's length, ``W`` its number of states, ``K`` the longest
span of a call.

=============== ==============================================================
``s0``          a sequence's first state (``base`` in frame helpers)
``c0 .. c1``    its columns (``cs0 .. cs1``, ``cb = c0``)
``t``, ``t1``   frames (``t1 = t + 1``); ``s``, ``f``: the frame an arc is
                read at / lands at (spanning pass)
``i``, ``j``    local state indices (``k = s0 + i``: the global state);
                ``d``: a far end's index in its frame's band
``a``           an arc (index into a :class:`~.arrays.Side`)
``k``           a state id, or a span (``ks``: the distinct spans; ``long``:
                those > 1; ``q``: an index into them)
cell            one state's alpha or beta at one frame (:mod:`.cells`)
``P``, ``A``    alpha cells (``Pp`` / ``Pn``: the frame read / written;
                ``Pt``: frame ``t``'s); ``LV``: their logs (two-array cells)
``Q``           beta cells (``Qn``: ``beta_{t+1}``); ``LQ``: their logs
``B``, ``Bt``   ``B_t``, the backward sums (``BP``, ``BL``: its work arrays)
band            a frame's live states ``lo[t] .. hi[t]`` (local);
                ``plo``/``nlo``/``tlo``/``qlo``: a band's first state
``off``         per frame, where its cells start in the sequence's work array
``rof``         per frame, where its block references start
block           ``2**sh`` consecutive states (``sh``: the block shift)
``R``           a block's (or a frame's) log reference: ``RA``, ``Ra``
                (alpha), ``RQ``, ``Rq`` (beta), ``RB``, ``Rb`` (``B_t``),
                ``Rp``/``Rn`` (the frame read / written); ``ref``: the
                largest a block reads
``fac``         per block read, ``exp(R[block] - ref)``
``gb``, ``g``   per block of betas, the posterior factor
                ``exp(R_alpha + R_beta - lz)``
``Mrow``        ``m_t``, the frames' largest scores ``[L]``
``E``, ``Es``   emissions ``[L, c1 - c0]``; ``et``, ``ew``: one frame's
``wshift``      the largest arc log weight; ``w``: ``exp(lp - wshift)``
``shift``       ``m_t + wshift``, the scale a frame's sums leave out
``offset``      the sequence's log offset (the frames' shifts and divisors)
``z``, ``lz``   a frame's total ``Z_t`` and its log
``fmax``        the largest final log weight (the final sum's shift)
``O``, ``OB``   the spanning pass's per-frame log offsets, double-double
                (``Oh + Ol``, ``Bh + Bl``)
``r``, ``g``    per span, the rescale ``exp(g - R)`` of the frame it reads
                and its log (spanning pass)
``V``, ``Hd``   per frame and span > 1, the mass in flight and its log
                scale; ``PV``: its prefix sums; ``dq``: the sliding maximum
=============== ==============================================================
"""

from __future__ import annotations

import os

import numpy as np

from ...lattice import Lattice
from ..threads import MIN_PARALLEL_WORK, get_num_threads, parallel, split
from . import one_frame, spanning
from .arrays import block_arrays, distance_arrays, lattice_arrays, span_arrays, span_bound

__all__ = ["available", "forward_backward", "require"]

try:
    import numba
except ImportError:  # a broken install: the NumPy engine everywhere
    numba = None
if os.environ.get("CHAINFB_NUMBA", "1") == "0":  # opt out: the NumPy engine everywhere
    numba = None

# the one-frame pass keeps a log reference per block of 2**_BLOCK_SHIFT states
_BLOCK_SHIFT = 5
# ... unless its blocks' arcs reach more blocks than this on average (then one block per sequence)
_MAX_BLOCK_SPREAD = 4.0
# ... and only in lattices with a sequence of more states than this (below it, the frame's one
# scale leaves few cells to the log-domain escape, and blocks would cost more than they save)
_MIN_BLOCKED_STATES = 512
# a sequence's emissions (float64, frames x columns) up to this size: the one-frame pass forms them at
# the sequence's start into a work array the next sequence reuses; larger ones, a frame's row at a
# time where it is read (twice, once per direction)
_EMISSIONS_BYTES = 8 << 20


def available() -> bool:
    """Whether the compiled engine can run: Numba imports and ``CHAINFB_NUMBA=0`` is not set."""
    return numba is not None


def require() -> None:
    """Raise a clear error when the compiled engine cannot run."""
    if numba is None:
        why = ("it is disabled by CHAINFB_NUMBA=0" if os.environ.get("CHAINFB_NUMBA", "1") == "0" else
               "Numba (a dependency of chainfb) cannot be imported")
        raise ValueError(f'engine: "numba" cannot run: {why}; reinstall it with pip install numba '
                         '(or pip install "chainfb[jit]"), or use engine="numpy"')


def forward_backward(lat: Lattice, X: np.ndarray, lengths: np.ndarray, leaky: tuple[float, np.ndarray] | None = None,
                     need_posteriors: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Forward-backward over a lattice (the engine protocol, see
    :mod:`chainfb.engines`), compiled.

    Parameters
    ----------
    lat : Lattice
    X : float64 (or float32) ``[T, C]`` compact scores (entries past a sequence's length are not read).
    lengths : int64 ``[N]``, each in ``[0, T]``.
    leaky : must be None (the leaky HMM runs on the NumPy engines).
    need_posteriors : bool

    Returns
    -------
    loglike : float64 ``[N]``
    posteriors : float64 ``[T, C]`` or None
    """
    require()
    if leaky is not None:
        raise ValueError("leaky: the numba engine has no leaky HMM; use engine='numpy' or 'shared'")
    # float32 scores are read as they are by the one-frame pass (each widened
    # exactly where it is read: the same numbers as a float64 copy, half its memory)
    X = np.ascontiguousarray(X, dtype=np.float32 if X.dtype == np.float32 and lat.max_span == 1 else np.float64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    N = lat.num_sequences
    T, C = X.shape
    loglike = np.empty(N)
    # the one-frame pass writes every posterior of its sequences; the spanning one adds into zeros
    post = (np.empty if lat.max_span == 1 else np.zeros)((T, C) if need_posteriors else (0, 0))
    la = lattice_arrays(lat)
    work = np.diff(lat.arc_offsets) * (lengths + 1.0) + 1.0  # arcs x frames per sequence
    if lat.max_span == 1:
        run = one_frame.run
        args = (la, distance_arrays(lat), block_arrays(lat, _BLOCK_SHIFT, _MAX_BLOCK_SPREAD, _MIN_BLOCKED_STATES),
                X, lengths, _EMISSIONS_BYTES)
    else:  # arcs that span frames
        run = spanning.run
        args = (la, span_arrays(lat), span_bound(lat, lengths), X, lengths)
    threads = max(1, get_num_threads())
    ranges = split(work, threads, MIN_PARALLEL_WORK["numba"])
    if len(ranges) == 1:
        run(0, N, *args, need_posteriors, loglike, post)
    else:  # a few parts per thread, the largest first
        ranges = sorted(ranges, key=lambda r: -work[r[0]:r[1]].sum())
        parallel(lambda r: run(r[0], r[1], *args, need_posteriors, loglike, post), ranges, threads)
    return loglike, (post if need_posteriors else None)
