"""A cost model of chainfb's kernels on a GPU, from the work the emulation
counts (``EmulatedBackend(..., count=True)``), calibrated on measured device
times.

The engine kernels are latency-bound: one block per sequence, a frame loop
inside, a barrier per frame.  A block's time is the sum over its phases (the
stretches between barriers) of its slowest thread's work, plus a cost per
barrier; a launch's time is its launch cost plus the makespan of its blocks
on the device's SMs (blocks placed, in order, on the first free slot; slots
= SMs x blocks resident per SM).  The map kernels stream the logits: their
time is the bytes they move over the device's bandwidth.

Work is counted in the kernels' units (``chainfb::Work``, see
``chainfb/cuda/common.cuh``): an arc term (a source value and an arc's score
read, added, exponentiated; ``...Shared`` when both come from shared memory),
a state or column result (a log and a store), a warp shuffle, and streamed
bytes.  Each unit costs a time on the critical path (:class:`Costs`).

Calibration (:func:`calibrate`): the unit costs of arc terms and results in
double and float, the cost of a barrier, and the factor that an arc term
costs more when a block's arcs do not fit its SM's L1 cache are solved from
one H200 run of the kernels as they were before their rewrite (their work is
counted here from the lattices, :func:`previous_engine_blocks`, by the
loops those kernels ran): CTC forward and backward at T = 2000, N = 8, S =
1000 (20.6 ms, 751 ms), RNN-T forward and backward at B = 8, V = 500 (0.79,
0.73 ms), and the LF-MMI denominator (0.112 s).  Units the old kernels did
not have (arc terms read from shared memory) are priced from the others by
the difference of memory latencies (:data:`LATENCY_NS`), a published
microbenchmark figure, not a measurement of ours.  The model is a guide for
choosing between kernel designs before a GPU can confirm them; its figures
are predictions, labelled so wherever they are printed.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

__all__ = ["Device", "H200", "H100", "Costs", "CALIBRATION", "calibrate", "launch_time", "previous_engine_blocks",
           "LATENCY_NS"]


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    sms: int
    threads_per_sm: int
    shared_per_sm: int  # bytes
    l1_bytes: int  # the part of an SM's L1 a block's arc arrays may take
    bandwidth: float  # bytes / s


#: NVIDIA H200 SXM (the device of the calibration run) and H100 SXM
H200 = Device("NVIDIA H200", sms=132, threads_per_sm=2048, shared_per_sm=228 * 1024, l1_bytes=192 * 1024,
              bandwidth=4.8e12)
H100 = Device("NVIDIA H100 SXM", sms=132, threads_per_sm=2048, shared_per_sm=228 * 1024, l1_bytes=192 * 1024,
              bandwidth=3.35e12)

#: load latencies on Hopper, ns at 1.75 GHz (L2 hit ~ 260 cycles, shared memory
#: ~ 30 cycles; Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU
#: Architecture", 2024): used only to price the units the calibrated kernels
#: did not have
LATENCY_NS = {"l2": 150.0, "shared": 17.0}

#: streamed bytes reach this fraction of the bandwidth (copy kernels on Hopper reach ~90%)
BANDWIDTH_EFFICIENCY = 0.9


@dataclasses.dataclass
class Costs:
    """ns on a thread's critical path per unit (an arc term, a result; in
    double or float), per memory wait (a thread's first read of a frame's
    data from device memory), per barrier, per launch; the factor on arc
    terms of blocks whose arcs do not fit L1."""

    arc_d: float
    arc_f: float
    state_d: float
    state_f: float
    wait: float
    barrier: float = 50.0
    shuffle: float = 15.0
    launch: float = 4000.0
    l2_factor: float = 1.0

    def weights(self, l2: bool = False) -> dict:
        """The emulation's work weights (ns per unit) for a block whose arcs
        do (not) fit L1.  An arc term read from shared memory costs the same
        less the difference of a memory and a shared-memory read
        (:data:`LATENCY_NS`)."""
        f = self.l2_factor if l2 else 1.0
        saved = LATENCY_NS["l2"] - LATENCY_NS["shared"]
        return {
            "kWorkArcD": self.arc_d * f,
            "kWorkArcF": self.arc_f * f,
            "kWorkArcSharedD": max(self.arc_d * f - saved, 0.25 * self.arc_d * f),
            "kWorkArcSharedF": max(self.arc_f * f - saved, 0.25 * self.arc_f * f),
            "kWorkStateD": self.state_d,
            "kWorkStateF": self.state_f,
            "kWorkStateSharedD": self.state_d,
            "kWorkStateSharedF": self.state_f,
            "kWorkMemoryWait": self.wait,
            "kWorkShuffle": self.shuffle,
            "kWorkBytes": 0.0,
        }


def _occupancy(device: Device, block: int, shared_mem: int) -> int:
    by_threads = device.threads_per_sm // max(block, 1)
    by_shared = device.shared_per_sm // max(shared_mem + 3 * 1024, 1)
    return max(1, min(by_threads, by_shared, 32))


def makespan(spans, device: Device, block: int, shared_mem: int) -> float:
    """Blocks of the given spans (ns), placed in launch order on the first
    free of the device's slots: the time the last one ends."""
    slots = device.sms * _occupancy(device, block, shared_mem)
    free = [0.0] * min(slots, max(len(spans), 1))
    heapq.heapify(free)
    end = 0.0
    for s in spans:
        t = heapq.heappop(free) + float(s)
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def launch_time(stats, costs: Costs, device: Device = H200, l2: bool = False) -> float:
    """Predicted device time (ns) of one counted launch (a
    :class:`~emulation.backend.LaunchStats` counted with ``costs.weights(l2)``):
    launch cost + max(makespan of the blocks' spans, streamed bytes over the
    bandwidth)."""
    spans = np.asarray(stats.span_weighted, dtype=np.float64) + costs.barrier * (np.asarray(stats.phases) - 1)
    compute = makespan(spans, device, stats.block, stats.shared_mem)
    stream = stats.work.get("kWorkBytes", 0) / (device.bandwidth * BANDWIDTH_EFFICIENCY) * 1e9
    return costs.launch + max(compute, stream)


# ----------------------------------------------------------------------------- the kernels before their rewrite


def _previous_block_size(width: int) -> int:
    b = 32
    while b < width and b < 256:
        b *= 2
    return b


def previous_engine_blocks(lat, lengths, leaky: bool = False) -> dict:
    """The work of the engine kernels as they were before their rewrite (one
    thread per state for the recursion and one per column for the
    posteriors, threads striding; every row in device memory), counted from
    the lattice: ``{"forward": (units per block [N, 3] as (arcs, results,
    memory waits) on the critical path, phases [N]), "backward": ...}``.  Per frame the
    forward's slowest thread does its states' in-arcs and results; the
    backward's does its columns' arcs and results and its states' out-arcs
    and results; the leaky HMM adds a block reduction (log2(block) + 2
    phases) and two passes over the thread's states."""
    h = {}
    state_off, col_off = lat.state_offsets, lat.col_offsets
    width = max(np.diff(state_off).max(initial=0), np.diff(col_off).max(initial=0))
    nt = _previous_block_size(int(width))
    in_deg = np.diff(lat.fwd.ptr)
    out_deg = np.diff(lat.bwd.ptr)
    col_arcs = np.bincount(lat.bwd.col, minlength=lat.num_columns)
    N = lat.num_sequences
    fwd = np.zeros((N, 2))
    bwd = np.zeros((N, 2))
    for n in range(N):
        s = np.arange(state_off[n], state_off[n + 1])
        c = np.arange(col_off[n], col_off[n + 1])
        thread_s = (s - s[0]) % nt if s.size else s
        thread_c = (c - c[0]) % nt if c.size else c
        f_arcs = np.bincount(thread_s, weights=in_deg[s], minlength=nt)
        f_res = np.bincount(thread_s, minlength=nt).astype(float)
        b_arcs = np.bincount(thread_s, weights=out_deg[s], minlength=nt) + np.bincount(
            thread_c, weights=col_arcs[c], minlength=nt)
        b_res = f_res + np.bincount(thread_c, minlength=nt)
        i = int(np.argmax(f_arcs + 3 * f_res))
        fwd[n] = f_arcs[i], f_res[i]
        i = int(np.argmax(b_arcs + 3 * b_res))
        bwd[n] = b_arcs[i], b_res[i]
        if leaky:
            fwd[n, 1] += 2 * f_res.max()
            bwd[n, 1] += 2 * f_res.max()
    L = np.asarray(lengths, dtype=np.float64)
    extra = (int(np.log2(nt)) + 2) if leaky else 0
    phases = L * (1 + extra) + 1
    waits = L  # each frame's first read of device memory (every row and score lived there)
    h["forward"] = (np.column_stack([fwd * L[:, None], waits]), phases)
    h["backward"] = (np.column_stack([bwd * L[:, None], waits]), phases)
    h["block"] = nt
    return h


def previous_engine_time(units, phases, block, costs: Costs, real: str, device: Device = H200,
                         l2: bool = False) -> float:
    """Predicted time (ns) of one previous-engine launch from
    :func:`previous_engine_blocks`'s units."""
    arc = costs.arc_d if real == "double" else costs.arc_f
    res = costs.state_d if real == "double" else costs.state_f
    f = costs.l2_factor if l2 else 1.0
    spans = (units[:, 0] * arc * f + units[:, 1] * res + units[:, 2] * costs.wait
             + costs.barrier * (np.asarray(phases) - 1))
    return costs.launch + makespan(spans, device, block, 0)


# ----------------------------------------------------------------------------- calibration

#: the measured device times the model is fitted to (one NVIDIA H200, torch
#: 2.11 + CUDA 13, CuPy 14.2, CUDA events, median of repeats; the kernels as
#: they were before their rewrite): case -> (kernel, real type, seconds)
CALIBRATION = {
    "ctc T=2000 N=8 C=100 S=1000": {"forward": ("double", 20.6e-3), "backward": ("double", 751e-3)},
    "rnnt B=8 V=500": {"forward": ("float", 0.79e-3), "backward": ("float", 0.73e-3)},
    "den 128x150": {"both": ("double", 0.112)},
}


def calibration_cases():
    """The lattices and lengths of :data:`CALIBRATION` (the benchmarks'
    shapes and seeds: benchmarks/bench_ctc.py's long CTC case,
    benchmarks/bench_transducer.py's batch, benchmarks/bench_engine.py --den)."""
    from . import shapes

    return {
        "ctc T=2000 N=8 C=100 S=1000": shapes.ctc_lattice(2000, 8, 100, 1000),
        "rnnt B=8 V=500": shapes.rnnt_lattice(*shapes.librispeech_batch(8)),
        "den 128x150": shapes.den_lattice(128, 150),
    }


def _real(case):
    return "float" if case.startswith("rnnt") else "double"


def calibrate(cases=None) -> tuple:
    """``(Costs, report)``: unit costs fitted (least squares on the log of
    the times) to :data:`CALIBRATION`, and per case the measured and fitted
    seconds."""
    from scipy.optimize import least_squares

    cases = cases if cases is not None else calibration_cases()
    pre = {name: (lat, lengths, leaky, previous_engine_blocks(lat, lengths, leaky))
           for name, (lat, lengths, leaky) in cases.items()}
    l2 = {name: not fits_l1(lat) for name, (lat, *_rest) in cases.items()}

    def costs_of(p):
        a_d, s_d, ratio, wait, kappa = np.exp(p)
        return Costs(arc_d=a_d, arc_f=a_d * ratio, state_d=s_d, state_f=s_d * ratio, wait=wait, l2_factor=kappa)

    def predicted(costs):
        got = []
        for name, meas in CALIBRATION.items():
            lat, lengths, leaky, h = pre[name]
            t = {k: previous_engine_time(h[k][0], h[k][1], h["block"], costs, _real(name), l2=l2[name]) * 1e-9
                 for k in ("forward", "backward")}
            for kernel, (_, sec) in meas.items():
                got.append((name, kernel, sec, t["forward"] + t["backward"] if kernel == "both" else t[kernel]))
        return got

    def residuals(p):
        return [np.log(fit / sec) for _, _, sec, fit in predicted(costs_of(p))]

    # bounds: float units within a factor of three of double ones (the kernels
    # wait on memory more than on arithmetic), a memory wait between an L2 hit
    # and a few device-memory latencies, an L2-resident arc term at most ten
    # times an L1-resident one; the barrier is fixed (Costs.barrier)
    p0 = np.log([200.0, 500.0, 0.8, 300.0, 3.0])
    lo, hi = np.log([1, 1, 0.33, LATENCY_NS["l2"], 1]), np.log([1e4, 1e4, 1.5, 2000, 10])
    fit = least_squares(residuals, p0, bounds=(lo, hi))
    costs = costs_of(fit.x)
    return costs, predicted(costs)


def fits_l1(lat, device: Device = H200) -> bool:
    """Whether one sequence's arc arrays (in-arcs, out-arcs and arcs by
    column: ~36 bytes an arc) fit the part of L1 a block may keep."""
    if lat.shared_fst is not None:
        widest = lat.shared_fst.num_arcs
    else:
        seq_arcs = np.bincount(lat.seq_of_state[lat.fwd.src], minlength=lat.num_sequences)
        widest = int(seq_arcs.max(initial=0))
    return widest * 36 <= device.l1_bytes
