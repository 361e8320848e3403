"""Predicted GPU time of chainfb's losses, from the work of every kernel
launch counted on the CPU, against the GPU peers' measured times.

Each case runs the public loss (forward + backward) with every kernel on the
kernel emulation with counting on (``tests/emulation``: the same ``.cu``
sources, run on the CPU), then prices each launch with the cost model
(``tests/emulation/cost_model.py``: per block, the sum over its phases of its
slowest thread's work plus a cost per barrier; per launch, the makespan of
its blocks on the device plus a launch cost, or its streamed bytes over the
bandwidth).  The model's unit costs are fitted to one H200 run of the
kernels as they were before their rewrite; its calibration is printed
first, with the fitted and the measured times.

Printed per case: each launch (kernel, grid, block, the largest block's
phases and span per unit, the work per unit, the predicted time), the
predicted total, and the peer's time measured on an H200 with the ratio.
Work the model does not count -- CuPy and torch array operations around the
kernels (the CTC gradient's zero fill) -- is priced as the bytes it moves
(listed under "array ops"); the score maps are kernels (``pdf_map.cu``,
``transducer.cu``) priced by the bytes the emulation counts.  In the prices
from the H100, a pdf score map's launches are marked "rest": the H100 ran
them as CuPy array operations, which the step's measured time outside the
kernels holds.
Transducer score maps are run at two small vocabularies and their work
extrapolated to the case's vocabulary (it is affine in V); the engine does
not depend on V.

Each launch is also priced from one H100's measurements of the current
kernels (``tests/emulation/h100.py``: the recursions by the refit of
``emulation.recursion_fit``, the posteriors and the maps by their bytes over
fitted rates; column "H100 ms"), and the step as those kernels plus the
time the same step measured outside its kernels, against the peer measured
on that H100, with the measured ratio beside it.  The header also prices the
CTC steps with each direction of a sequence over a thread block cluster
(``cluster.cu``, not yet measured on a device): the recursion by the same
refit, and the most its cluster barrier may add a frame for the step to meet
the peer (``emulation.h100.cluster_report``).

    PYTHONPATH=tests python -m benchmarks.gpu_model [--cases ctc,rnnt,tdt,multiblank,den] [--device h200|h100]

These are predictions of a model, not measurements; ``benchmarks/gpu_check.py``
measures on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import numpy as np
import torch

import chainfb
from emulation import EmulatedBackend, build, run_on
from emulation import cost_model as cm
from emulation import h100, recursion_fit
from emulation import shapes
from chainfb.engines import cuda as cuda_engine

#: peers' forward + backward times measured on one NVIDIA H200 (torch 2.11 + CUDA 13, CUDA events)
PEERS = {
    "ctc T=500 N=16 C=500 S=100": ("torch ctc_loss", 1.6e-3),
    "ctc T=2000 N=8 C=100 S=1000": ("torch ctc_loss", 7.4e-3),
    "ctc T=4000 N=1 C=5000 S=3000": ("torch ctc_loss", 50e-3),
    "ctc T=150 N=64 C=5000 S=50": ("torch ctc_loss", 1.4e-3),
    "rnnt B=8 V=500": ("torchaudio rnnt_loss", 6.0e-3),
}


def _array_op_bytes(T, N, C) -> float:
    """Bytes written by the one array operation around the CTC kernels: the
    gradient's zero fill (the score gather and the posteriors' scatter are
    kernels, ``pdf_map.cu``, priced by the bytes the emulation counts)."""
    return T * N * C * 4


@contextlib.contextmanager
def counting(be, costs, l2):
    """Count the launches' work; yields ``(stats, calls)``: every launch's
    :class:`~emulation.backend.LaunchStats`, and every engine call's
    ``(lattice, lengths)`` in order (each call launches one recursion)."""
    be.stats.clear()
    be.set_work_weights(costs.weights(l2))
    calls = []
    check = cuda_engine.check_inputs

    def recording(backend, lat, X, lengths):
        calls.append((lat, np.asarray(lengths)))
        return check(backend, lat, X, lengths)

    cuda_engine.check_inputs = recording
    try:
        yield be.stats, calls
    finally:
        cuda_engine.check_inputs = check


def h100_prices(stats, calls, map_rates, budget) -> list:
    """Each launch priced from the H100's measured times of the current
    kernels (:mod:`emulation.h100`): seconds, in the order of ``stats``; a
    recursion with the lanes and shared-memory mode the engine planned for it
    (:func:`chainfb.engines.cuda.recursion_plan`, ``budget``: the backend's
    shared memory a block may use)."""
    out, calls, lat, lengths = [], list(calls), None, None
    for s in stats:
        kind = s.name.split("<")[0].split("::")[-1]
        if kind.endswith("_recursion"):
            lat, lengths = calls.pop(0)
            cluster = int(s.name.split(",")[1].rstrip(">")) if kind == "fb_cluster_recursion" else 1
            lanes, block, mode, _ = recursion_plan(lat, 8 if "<double" in s.name else 4, budget, cluster)
            assert block == s.block, (s.name, block, s.block)
            out.append(h100.recursion_time(lat, lengths, block, mode, lanes, cluster))
        elif kind.endswith("_posteriors"):
            out.append(h100.posterior_time(int(lengths.max()), lat.num_states))
        elif kind.startswith("transducer_"):
            out.append(h100.map_time(kind.split("_")[1], s.work.get("kWorkBytes", 0), map_rates))
        elif kind.startswith("pdf_"):  # CuPy array operations when the H100 ran: in the step's measured remainder
            out.append(None)
        else:
            raise ValueError(f"no H100 price for {s.name}")
    return out


def recursion_plan(lat, itemsize: int, budget: int, cluster: int = 1) -> tuple:
    """The engine's plan of the recursion launch over ``lat`` at its default
    block size (the sizes of the one graph when every sequence uses it, as
    the shared-graph engine reads them), each direction over ``cluster``
    blocks."""
    sized = lat.graph_lattice() if lat.graph is not None else lat
    shape = cuda_engine.layout_shape(cuda_engine.lattice_host_arrays(sized))
    if cluster > 1:
        return cuda_engine.cluster_plan(shape, int(lat.max_span), itemsize, None, budget, cluster)
    return cuda_engine.recursion_plan(shape, int(lat.max_span), itemsize, None, budget)


def fitted_map_rates() -> dict:
    """:func:`emulation.h100.map_rates` from the bytes the maps move at the
    two measured RNN-T batches (``benchmarks.count_map_work.map_bytes``)."""
    from .count_map_work import criterion_layout, map_bytes

    counted = {}
    for B, V in h100.MAPS_H100:
        T, U = shapes.librispeech_batch(B) if B == 8 else (np.full(B, 500), np.full(B, 100))
        shape = (B, int(T.max()), int(U.max()) + 1, V)
        got = map_bytes(criterion_layout("rnnt", shape[2], T, U, ()), shape)
        counted[(B, V)] = tuple(sum(got[f"transducer_{k}"]) for k in ("gather", "grad"))
    return h100.map_rates(counted)


def price(stats, costs, device, l2=False):
    return [(s, cm.launch_time(s, costs, device, l2) * 1e-9) for s in stats]


def run_ctc(be, costs, device, T, N, C, S):
    lp, targets, il, tl = shapes.ctc_inputs(T, N, C, S)
    lat, _, _ = shapes.ctc_lattice(T, N, C, S)
    l2 = not cm.fits_l1(lat, device)
    with counting(be, costs, l2) as (stats, calls), run_on(be):
        x = lp.clone().requires_grad_()
        chainfb.ctc_loss(x, targets, il, tl, reduction="sum").backward()
    launches = price(stats, costs, device, l2)
    extra = _array_op_bytes(T, N, C) / (device.bandwidth * 0.9)
    return launches, extra, list(calls)


def run_transducer(be, costs, device, kind, T, U, V, vocabs=(16, 32)):
    """Launches at two small vocabularies, map kernels' work extrapolated to V."""
    runs = []
    for v in vocabs:
        extra = {"rnnt": 0, "multiblank": 0, "tdt": 5}[kind]
        logits, targets, Tl, Ul = shapes.transducer_inputs(T, U, v, extra)
        x = logits.requires_grad_()
        with counting(be, costs, False) as (stats, calls), run_on(be):
            if kind == "rnnt":
                loss = chainfb.rnnt_loss(x, targets, Tl, Ul, blank=v - 1, reduction="sum")
            elif kind == "multiblank":
                loss = chainfb.multiblank_rnnt_loss(x, targets, Tl, Ul, v - 1, [2, 4], reduction="sum")
            else:
                loss = chainfb.tdt_loss(x, targets, Tl, Ul, v - 1, [0, 1, 2, 3, 4], reduction="sum")
            loss.backward()
        runs.append(list(stats))
        engine_calls = list(calls)
    (a, b), (va, vb) = (runs[0], runs[1]), vocabs
    out = []
    for sa, sb in zip(a, b):
        s = sa
        if sa.work.get("kWorkBytes", 0) or sb.work.get("kWorkBytes", 0):
            scale = (V - va) / (vb - va)
            work = {k: int(sa.work[k] + (sb.work[k] - sa.work[k]) * scale) for k in sa.work}
            span = (sa.span_weighted + (sb.span_weighted - sa.span_weighted) * scale)
            s = type(sa)(sa.name, sa.grid, sa.block, sa.shared_mem, sa.phases, span, sa.span, work)
        out.append((s, cm.launch_time(s, costs, device) * 1e-9))
    return out, 0.0, engine_calls


def run_den(be, costs, device, N=128, T=150):
    den, scores, lengths = shapes.den_inputs(N, T)
    lat = den._lattice(N)
    l2 = not cm.fits_l1(lat, device)
    with counting(be, costs, l2) as (stats, calls), run_on(be):
        den.forward_backward(scores, lengths, 0.1)
    return price(stats, costs, device, l2), 0.0, list(calls)


def show(name, launches, extra, calls, rates, budget, peer=None):
    """Print a case's launches, priced both ways; returns the H100-priced kernels' seconds."""
    total = sum(t for _, t in launches) + extra
    fitted = h100_prices([s for s, _ in launches], calls, rates, budget)
    print(f"\n## {name}")
    print(f"{'kernel':44s} {'grid':>6s} {'block':>5s} {'phases':>7s} {'arc span':>9s} {'work (arcs)':>12s} "
          f"{'pred. ms':>9s} {'H100 ms':>8s}")
    for (s, t), f in zip(launches, fitted):
        arcs = sum(v for k, v in s.span.items() if k.startswith("kWorkArc"))
        work = sum(v for k, v in s.work.items() if k.startswith("kWorkArc"))
        print(f"{s.name:44s} {s.grid:6d} {s.block:5d} {int(np.max(s.phases)):7d} {arcs:9d} {work:12d} "
              f"{t * 1e3:9.3f} " + ("    rest" if f is None else f"{f * 1e3:8.3f}"))
    if any(f is None for f in fitted):
        print("(rest: a score map the H100 ran as CuPy array operations, in the step's measured time outside the "
              "kernels)")
    fitted = [f for f in fitted if f is not None]
    if extra:
        print(f"{'array ops (bytes / bandwidth)':44s} {'':6s} {'':5s} {'':7s} {'':9s} {'':12s} {extra * 1e3:9.3f}")
    line = f"predicted total (units of the H200 calibration): {total * 1e3:.3f} ms"
    if peer:
        line += f"; {peer[0]} measured {peer[1] * 1e3:.1f} ms on an H200: {total / peer[1]:.2f}x"
    print(line)
    kernels = sum(fitted)
    line = f"kernels priced from the H100's measurements: {kernels * 1e3:.3f} ms"
    if name in h100.STEPS_H100:
        step, peer_ms, measured = h100.STEPS_H100[name]
        rest = step - measured
        pred = kernels * 1e3 + rest
        line += (f" (measured {measured:.3f}); + the step's measured time outside the kernels {rest:.3f} ms = "
                 f"{pred:.3f} ms against the peer's {peer_ms:.3f} ms: {pred / peer_ms:.2f}x (measured "
                 f"{step / peer_ms:.2f}x)")
    print(line)
    return kernels


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="ctc,rnnt,multiblank,tdt,den")
    ap.add_argument("--device", default="h200", choices=["h200", "h100"])
    args = ap.parse_args(argv)
    device = {"h200": cm.H200, "h100": cm.H100}[args.device]
    t0 = time.time()
    costs, report = cm.calibrate()
    print(f"# cost model for {device.name}; unit costs (ns): arc {costs.arc_d:.0f} (double) / {costs.arc_f:.0f} "
          f"(float), result {costs.state_d:.0f} / {costs.state_f:.0f}, barrier {costs.barrier:.0f}, "
          f"L2 factor {costs.l2_factor:.2f}")
    print("# calibration (the kernels before their rewrite, H200): case, kernel, measured ms, fitted ms")
    for case, kernel, sec, fit in report:
        print(f"#   {case:30s} {kernel:9s} {sec * 1e3:9.3f} {fit * 1e3:9.3f}  ({fit / sec:.2f}x)")
    print("# the recursion kernels refitted to an H100's measured times (emulation.recursion_fit; predictions "
          "below use the units above, which under-predict these kernels 4-7x):")
    for line in recursion_fit.report().splitlines():
        if not line.startswith("  T,"):
            print("#   " + line.strip())
    print("# the current kernels priced from one H100's measurements of them (emulation.h100, "
          "emulation.recursion_fit):")
    for line in h100.report().splitlines():
        print("#   " + line.strip())
    rates = fitted_map_rates()
    print(f"#   maps: bytes / {rates['gather']:.0f} (gather), / {rates['grad']:.0f} (gradient) bytes/ns")
    for line in h100.cluster_report().splitlines():
        print("#   " + line.strip())
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory() as d:
        be = EmulatedBackend(build(d), count=True)
        be.max_shared_mem = 227 * 1024  # an H100's or H200's opt-in limit, as the CuPy backend reports it
        budget = cuda_engine.shared_budget(be)
        torch.manual_seed(0)
        if "ctc" in cases:
            for T, N, C, S in shapes.CTC_SHAPES:
                name = f"ctc T={T} N={N} C={C} S={S}"
                show(name, *run_ctc(be, costs, device, T, N, C, S), rates, budget, PEERS.get(name))
        Tb, Ub = shapes.librispeech_batch(8)
        rnnt = None
        for kind in ("rnnt", "multiblank", "tdt"):
            if kind not in cases:
                continue
            name = f"{kind} B=8 V=500"
            total = show(name, *run_transducer(be, costs, device, kind, Tb, Ub, 500), rates, budget,
                         PEERS.get(name))
            if kind == "rnnt":
                rnnt = total
                floor = 2 * 8 * int(Tb.max()) * (int(Ub.max()) + 1) * 500 * 4 / cm.H100.bandwidth
                print(f"one read + one write of the logits at an H100's bandwidth: {floor * 1e3:.3f} ms; the "
                      f"kernels priced from the H100: {total / floor:.2f}x (target <= 2x)")
            elif rnnt:
                print(f"{kind} / rnnt, kernels priced from the H100: {total / rnnt:.2f}x "
                      f"(target <= {1.15 if kind == 'multiblank' else 1.3}x)")
        if "den" in cases:
            show("den 128x150 (3,379 states, 47,932 arcs, leaky HMM)", *run_den(be, costs, device), rates, budget,
                 ("the previous kernels", 0.112))
    print(f"\n# {time.time() - t0:.0f} s on the CPU")


if __name__ == "__main__":
    main()
