"""The current engine kernels' recursion on a GPU, fitted to device times
measured on one H100 (the cost model of :mod:`emulation.cost_model` prices
these kernels from units fitted to the kernels before their rewrite, and
under-predicts them 4-7x).

What the measurement shows (``python -m benchmarks.gpu_block_sweep``: the recursion and
posterior kernels on the CTC benchmark graphs, per block size and
shared-memory mode): a block runs one direction of one sequence, a frame at
a time, and its time is proportional to the states each thread carries.  So
a block's time is modelled, per frame, as

    arc x (the most arc terms a thread adds in the frame)
  + state x (the most states a thread finishes in the frame)
  + frame + warp x (the block's warps)          (its barrier and reductions)

summed over the sequence's frames; a launch takes its slowest block (the
benchmark graphs have at most 128 blocks: one wave on 132 SMs) plus a launch
cost.  The four unit costs are fitted per shared-memory mode (least squares
on the log of the times) to :data:`SWEEP_H100`, less the posterior kernel's
time measured in the same run (:data:`POSTERIORS_H100`).  Arc and state
costs are nearly collinear on CTC graphs (two to three arcs a state); the
RNN-T batch's measured recursion, not used in the fit, checks them
(:func:`report`).

    PYTHONPATH=tests python -m emulation.recursion_fit
"""

from __future__ import annotations

import numpy as np

__all__ = ["SWEEP_H100", "POSTERIORS_H100", "RNNT_H100", "recursion_blocks", "predict", "fit", "report"]

#: ``python -m benchmarks.gpu_block_sweep --repeat 4`` on one NVIDIA H100 80GB HBM3 (driver 580.159.04, CuPy 14.2,
#: CUDA 13): ``((T, N, C, S), engine, mode) -> {threads per block: ms}``, the recursion and posterior kernels of
#: ``chainfb.engines.<engine>.forward_backward`` on float32 CTC scores, median of 4
SWEEP_H100 = {
    ((500, 16, 500, 100), "cuda", 2): {128: 1.52, 256: 1.06, 512: 1.134, 1024: 1.381},
    ((500, 16, 500, 100), "cuda", 1): {128: 1.472, 256: 1.028, 512: 1.085, 1024: 1.223},
    ((500, 16, 500, 100), "cuda", 0): {128: 1.419, 256: 0.97, 512: 1.004, 1024: 1.139},
    ((2000, 8, 100, 1000), "cuda", 2): {128: 35.997, 256: 18.715, 512: 11.836, 1024: 10.0},
    ((2000, 8, 100, 1000), "cuda", 1): {128: 36.323, 256: 18.884, 512: 11.9, 1024: 9.805},
    ((2000, 8, 100, 1000), "cuda", 0): {128: 31.42, 256: 17.976, 512: 11.44, 1024: 9.249},
    ((4000, 1, 5000, 3000), "cuda", 2): {128: 240.161, 256: 120.628, 512: 64.466, 1024: 46.973},
    ((4000, 1, 5000, 3000), "cuda", 1): {128: 277.022, 256: 162.195, 512: 72.322, 1024: 45.244},
    ((4000, 1, 5000, 3000), "cuda", 0): {128: 239.966, 256: 120.603, 512: 64.247, 1024: 41.465},
    ((4000, 1, 5000, 3000), "cuda_shared", 2): {128: 236.758, 256: 119.1, 512: 63.931, 1024: 46.541},
    ((4000, 1, 5000, 3000), "cuda_shared", 1): {128: 273.621, 256: 160.414, 512: 72.876, 1024: 45.365},
    ((4000, 1, 5000, 3000), "cuda_shared", 0): {128: 237.01, 256: 119.052, 512: 63.992, 1024: 42.016},
    ((150, 64, 5000, 50), "cuda", 2): {128: 0.388, 256: 0.384, 512: 0.4, 1024: 0.477},
    ((150, 64, 5000, 50), "cuda", 1): {128: 0.368, 256: 0.371, 512: 0.388, 1024: 0.425},
    ((150, 64, 5000, 50), "cuda", 0): {128: 0.353, 256: 0.354, 512: 0.364, 1024: 0.398},
}

#: the posterior kernel's time (ms) in ``benchmarks/gpu_bench.py``'s traced step, same machine and day
POSTERIORS_H100 = {(500, 16, 500, 100): 0.042, (2000, 8, 100, 1000): 1.033, (4000, 1, 5000, 3000): 1.023,
                   (150, 64, 5000, 50): 0.034}

#: ``benchmarks/gpu_bench.py``'s RNN-T batch (B = 8, LibriSpeech-like lengths): the recursion kernel, ms, its
#: default launch (mode 2), same machine and day
RNNT_H100 = 0.889

#: the cost of a launch, ns
LAUNCH_NS = 5000.0


def recursion_blocks(lat, lengths, block: int, lanes: int = 1, cluster: int = 1) -> np.ndarray:
    """``[2N, 4]``: per block of the recursion launch (each sequence's forward,
    then its backward) its frames, the most arc terms and the most states a
    thread takes in a frame, and its warps -- groups of ``lanes`` threads
    striding over the sequence's states as the kernels do, a lane taking
    every ``lanes``-th arc of its state.  With several lanes a state, the
    merge of their sums (``log2(lanes)`` shuffle steps) is counted as that
    many arc terms: an assumption, not a fitted cost (the sweep had one lane
    a state).  With ``cluster`` > 1 (cluster.cu) a direction's threads are
    the ``cluster * block`` threads of its cluster, and each row is one of
    its ``cluster`` blocks (the same for each: the busiest thread of the
    group, the warps of one block)."""
    state_off = lat.state_offsets
    in_deg, out_deg = np.diff(lat.fwd.ptr), np.diff(lat.bwd.ptr)
    L = np.asarray(lengths, dtype=np.float64)
    groups = max(1, cluster * block // lanes)
    rows = []
    for deg in (in_deg, out_deg):
        for n in range(lat.num_sequences):
            s = np.arange(state_off[n], state_off[n + 1])
            thread = (s - state_off[n]) % groups
            terms = np.ceil(deg[s] / lanes) + np.log2(lanes)
            arcs = np.bincount(thread, weights=terms, minlength=groups)
            states = np.bincount(thread, minlength=groups)
            rows.append((L[n], arcs.max(initial=0), states.max(initial=0), block // 32))
    return np.asarray(rows, dtype=np.float64)


def predict(blocks: np.ndarray, p) -> float:
    """Predicted seconds of a recursion launch from :func:`recursion_blocks`
    and the unit costs ``p = (arc, state, frame, warp)`` in ns."""
    arc, state, frame, warp = p
    per_block = blocks[:, 0] * (arc * blocks[:, 1] + state * blocks[:, 2] + frame + warp * blocks[:, 3])
    return (LAUNCH_NS + per_block.max(initial=0.0)) * 1e-9


def _points(mode: int):
    from . import shapes

    lats = {}
    out = []
    for (shape, _engine, m), times in SWEEP_H100.items():
        if m != mode:
            continue
        if shape not in lats:
            lat, lengths, _ = shapes.ctc_lattice(*shape)
            lats[shape] = (lat, lengths)
        lat, lengths = lats[shape]
        for block, ms in times.items():
            out.append((shape, block, recursion_blocks(lat, lengths, block), (ms - POSTERIORS_H100[shape]) * 1e-3))
    return out


def fit(mode: int = 2) -> tuple:
    """``(p, rows)``: the unit costs (ns: arc, state, frame, warp) fitted to
    the sweep's times in ``mode``, and per point ``(shape, block, measured s,
    fitted s)``."""
    from scipy.optimize import least_squares

    pts = _points(mode)

    def residuals(q):
        return [np.log(predict(b, np.exp(q)) / sec) for _, _, b, sec in pts]

    res = least_squares(residuals, np.log([200.0, 300.0, 1000.0, 50.0]), bounds=(np.log(1e-2), np.log(1e5)))
    p = np.exp(res.x)
    return p, [(shape, block, sec, predict(b, p)) for shape, block, b, sec in pts]


def report() -> str:
    """The fit per mode and the RNN-T check, as text."""
    from . import shapes

    lines = []
    rnnt_lat, rnnt_len, _ = shapes.rnnt_lattice(*shapes.librispeech_batch(8))
    states = int(np.diff(rnnt_lat.state_offsets).max())
    block = 32
    while block < states and block < 1024:
        block *= 2
    for mode in (2, 1, 0):
        p, rows = fit(mode)
        ratios = [fit_s / sec for *_, sec, fit_s in rows]
        lines.append(f"mode {mode}: arc {p[0]:.0f} ns, state {p[1]:.0f} ns, frame {p[2]:.0f} ns, warp {p[3]:.0f} ns;"
                     f" fitted / measured {min(ratios):.2f}x-{max(ratios):.2f}x over {len(rows)} launches")
        for shape, blk, sec, fit_s in rows:
            lines.append(f"  T, N, C, S = {shape}, {blk:4d} threads: measured {sec * 1e3:8.3f} ms, "
                         f"fitted {fit_s * 1e3:8.3f} ms ({fit_s / sec:.2f}x)")
        if mode == 2:
            got = predict(recursion_blocks(rnnt_lat, rnnt_len, block), p)
            lines.append(f"  check, not fitted: RNN-T B=8 V=500 recursion ({block} threads) predicted "
                         f"{got * 1e3:.3f} ms, measured {RNNT_H100:.3f} ms ({got * 1e3 / RNNT_H100:.2f}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
