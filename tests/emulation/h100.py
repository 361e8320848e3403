"""The current kernels priced on an H100 from times measured on one, and
the measured steps they are part of.

:mod:`emulation.cost_model` prices work in units fitted to the kernels
before their rewrite (an H200 run), and under-predicts the current ones
4-7x.  This module prices each launch of the current kernels from the
times one H100 measured for them (``benchmarks/gpu_check.sh``, the run of
docs/gpu.md "Measured on an H100"):

- the recursions (``fb_recursion``, ``fb_shared_recursion``):
  :mod:`emulation.recursion_fit`, the unit costs of the launch's
  shared-memory mode, from the lattice it ran on and its block size;
- the posteriors (``fb_posteriors``, ``fb_shared_posteriors``): a launch
  cost plus the bytes of the rows of alphas and betas they read over one
  rate, fitted to the four CTC launches of :data:`POSTERIOR_BYTES_H100`;
- the transducer maps (``transducer_gather``, ``transducer_grad``): the
  bytes they move (counted by the emulation) over each kernel's rate,
  fitted to the two RNN-T batches of :data:`MAPS_H100`.

:data:`STEPS_H100` holds, per benchmark case, the measured step (forward +
backward), the peer's step and the chainfb kernels' sum in the same run:
what a step spends outside the kernels (the host's work between the labels'
transfer and the first launch, the array operations around the kernels) is
their difference, and a predicted step is the predicted kernels plus that
measured remainder.  So a change to a kernel is judged against the peer's
measured time with everything else as measured.

    PYTHONPATH=tests python -m emulation.h100
"""

from __future__ import annotations

import numpy as np

from . import recursion_fit
from .recursion_fit import LAUNCH_NS, POSTERIORS_H100

__all__ = ["STEPS_H100", "MAPS_H100", "posterior_rate", "map_rates", "recursion_time", "posterior_time",
           "map_time", "report", "cluster_rows", "cluster_report"]

#: benchmark case -> (chainfb step ms, peer step ms, chainfb kernels ms), one H100 80GB HBM3, torch 2.11 +
#: CUDA 13, median of 5 steps (``benchmarks/gpu_check.sh OUT --steps env,tests,compare,bench --bench
#: ctc,rnnt,durations,denominator``); the peers: torch's ``ctc_loss``, torchaudio's ``rnnt_loss``, and for TDT and
#: multi-blank chainfb's own RNN-T on the durations batch (B = 8, T = 200, U = 40, V = 256)
STEPS_H100 = {
    "ctc T=500 N=16 C=500 S=100": (1.754, 1.655, 0.904 + 0.041),
    "ctc T=2000 N=8 C=100 S=1000": (10.759, 7.650, 8.804 + 1.050),
    "ctc T=4000 N=1 C=5000 S=3000": (48.102, 48.944, 45.511 + 1.037),
    "ctc T=150 N=64 C=5000 S=50": (2.036, 1.432, 0.294 + 0.034),
    "rnnt B=8 V=500": (3.011, 6.192, 0.889 + 0.426 + 0.596 + 0.017),
    # the LF-MMI denominator, 128 x 150 frames: the shared-graph kernels against the per-sequence ones (not fitted:
    # its threads carry ~15x the arcs of the fitted launches)
    "den 128x150 (3,379 states, 47,932 arcs, leaky HMM)": (37.7, 82.2, 18.4 + 18.3),
}

#: the map kernels on the RNN-T batches, ms: (B, V) -> (gather, gradient), same run
MAPS_H100 = {(8, 500): (0.426, 0.596), (32, 1024): (2.887, 5.368)}


def posterior_bytes(T: int, S: int, itemsize: int = 4) -> float:
    """Bytes of the rows a posterior launch reads: ``T + 1`` rows of alphas
    and of betas over ``S`` states."""
    return 2.0 * (T + 1) * S * itemsize


def posterior_rate() -> float:
    """Bytes / ns of the posterior kernels: least squares on the log of
    :data:`~emulation.recursion_fit.POSTERIORS_H100`'s times, less a launch."""
    b = np.array([posterior_bytes(T, N * (2 * S + 2)) for T, N, _C, S in POSTERIORS_H100])
    t = np.array(list(POSTERIORS_H100.values())) * 1e6 - LAUNCH_NS
    return float(np.exp(np.mean(np.log(b / t))))


def posterior_time(T: int, S: int, itemsize: int = 4, rate: float | None = None) -> float:
    """Predicted seconds of a posterior launch over ``T`` frames and ``S`` states."""
    rate = posterior_rate() if rate is None else rate
    return (LAUNCH_NS + posterior_bytes(T, S, itemsize) / rate) * 1e-9


def map_rates(map_bytes: dict) -> dict:
    """``{"gather": bytes / ns, "grad": bytes / ns}`` fitted to
    :data:`MAPS_H100` from ``map_bytes``: ``(B, V) -> (gather bytes, grad
    bytes)`` as the emulation counts them at those batches."""
    out = {}
    for i, kind in enumerate(("gather", "grad")):
        r = [map_bytes[k][i] / (ms[i] * 1e6 - LAUNCH_NS) for k, ms in MAPS_H100.items()]
        out[kind] = float(np.exp(np.mean(np.log(r))))
    return out


def map_time(kind: str, nbytes: float, rates: dict) -> float:
    """Predicted seconds of a map launch moving ``nbytes``."""
    return (LAUNCH_NS + nbytes / rates[kind]) * 1e-9


_FITS: dict = {}


def recursion_time(lat, lengths, block: int, mode: int, lanes: int = 1, cluster: int = 1) -> float:
    """Predicted seconds of a recursion launch over ``lat`` (``lengths``
    frames per sequence) with ``block`` threads in shared-memory ``mode``,
    ``lanes`` threads a state, ``cluster`` blocks a direction (the cluster's
    barrier priced as a block's: see :func:`cluster_rows`).  A mode with the
    arc table (:data:`chainfb.engines.cuda.ARC_TABLE`) is priced as the mode
    without it: no device has measured the table, so the model claims no
    gain."""
    from chainfb.engines.cuda import ARC_TABLE

    mode &= ~ARC_TABLE
    if mode not in _FITS:
        _FITS[mode] = recursion_fit.fit(mode)[0]
    blocks = recursion_fit.recursion_blocks(lat, lengths, block, lanes, cluster)
    return recursion_fit.predict(blocks, _FITS[mode])


def cluster_rows(shapes_=None, clusters=(2, 4, 8)) -> list:
    """The CTC benchmark steps with each direction of a sequence over a thread block cluster (cluster.cu), priced
    as far as measurements go: per shape and cluster size, at the block the engine plans for it
    (:func:`chainfb.engines.cuda.cluster_plan`, the shape's lanes), the recursion by the mode-0 refit with the
    cluster's threads (:func:`~emulation.recursion_fit.recursion_blocks`), plus the posteriors and the step's
    measured remainder as in :data:`STEPS_H100`.  No device has run a cluster: the cost of its barrier over one
    block's (a cluster-wide barrier and the row maxima pushed to the other blocks' shared memory) is unknown, so
    each row gives the step without it and the largest extra time per frame (``s``) at which the step still meets
    the peer's time, and at which the cluster still beats one block in mode 0.  Rows: dicts with ``case, cluster,
    block, one_block_ms`` (the recursion, one block, mode 0), ``recursion_ms`` (s = 0), ``step_ratio`` (s = 0),
    ``meets_if_s_ns``, ``beats_one_block_if_s_ns``; shapes whose 2N clusters do not fit 132 SMs at once are
    left out, and those of one sequence (the step runs the shared-graph kernels there)."""
    from chainfb.engines import cuda as cuda_engine

    from . import shapes

    rows = []
    for shape in shapes_ or shapes.CTC_SHAPES:
        T, N, C, S = shape
        name = f"ctc T={T} N={N} C={C} S={S}"
        if name not in STEPS_H100 or N == 1:
            continue  # (one sequence runs on the shared-graph kernels, which take one block a sequence)
        lat, lengths, _ = shapes.ctc_lattice(*shape)
        step, peer, measured = STEPS_H100[name]
        rest = step - measured
        post = posterior_time(int(lengths.max()), lat.num_states) * 1e3
        shape_ = cuda_engine.layout_shape(cuda_engine.lattice_host_arrays(lat))
        lanes, one, _, _ = cuda_engine.recursion_plan(shape_, 1, 4, None, 227 * 1024)
        base = recursion_time(lat, lengths, one, 0, lanes) * 1e3
        frames = float(np.max(lengths))
        for K in clusters:
            if 2 * N * K > 132:
                continue
            block = cuda_engine.cluster_plan(shape_, 1, 4, None, 227 * 1024, K)[1]
            rec = recursion_time(lat, lengths, block, 0, lanes, K) * 1e3
            rows.append(dict(case=name, cluster=K, block=block, one_block_ms=base, recursion_ms=rec,
                             step_ratio=(rec + post + rest) / peer,
                             meets_if_s_ns=(peer - rest - post - rec) / frames * 1e6,
                             beats_one_block_if_s_ns=(base - rec) / frames * 1e6))
    return rows


def cluster_report() -> str:
    """:func:`cluster_rows` as text."""
    lines = ["thread block clusters (cluster.cu), not measured on a device: recursion by the mode-0 refit, s = the "
             "cluster barrier's extra time a frame over a block's"]
    for r in cluster_rows():
        lines.append(f"  {r['case']}: {r['cluster']} blocks of {r['block']}: recursion {r['recursion_ms']:.3f} ms + "
                     f"s per frame (one block, mode 0: {r['one_block_ms']:.3f} ms); step {r['step_ratio']:.2f}x the "
                     f"peer at s = 0; meets the peer if s <= {r['meets_if_s_ns']:.0f} ns, beats one block if s <= "
                     f"{r['beats_one_block_if_s_ns']:.0f} ns")
    return "\n".join(lines)


def report() -> str:
    """The posterior fit against its points, as text."""
    rate = posterior_rate()
    lines = [f"posteriors: launch {LAUNCH_NS:.0f} ns + rows' bytes / {rate:.0f} bytes/ns"]
    for (T, N, C, S), ms in POSTERIORS_H100.items():
        got = posterior_time(T, N * (2 * S + 2), rate=rate) * 1e3
        lines.append(f"  T, N, C, S = {(T, N, C, S)}: measured {ms:.3f} ms, fitted {got:.3f} ms ({got / ms:.2f}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
    print(cluster_report())
