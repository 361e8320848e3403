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
kernels (the CTC score gather, the gradient's zero fill and scatter, the
reductions) -- is priced as the bytes they move (listed under "array ops").
Transducer score maps are run at two small vocabularies and their work
extrapolated to the case's vocabulary (it is affine in V); the engine does
not depend on V.

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
from emulation import recursion_fit
from emulation import shapes

#: peers' forward + backward times measured on one NVIDIA H200 (torch 2.11 + CUDA 13, CUDA events)
PEERS = {
    "ctc T=500 N=16 C=500 S=100": ("torch ctc_loss", 1.6e-3),
    "ctc T=2000 N=8 C=100 S=1000": ("torch ctc_loss", 7.4e-3),
    "ctc T=4000 N=1 C=5000 S=3000": ("torch ctc_loss", 50e-3),
    "ctc T=150 N=64 C=5000 S=50": ("torch ctc_loss", 1.4e-3),
    "rnnt B=8 V=500": ("torchaudio rnnt_loss", 6.0e-3),
}


def _array_op_bytes(case: str, T, N, C, cols) -> float:
    """Bytes moved by the array operations around the CTC kernels: the
    column gather (a 32-byte sector per read element, the compact scores
    written), the gradient's zero fill, the posteriors' scatter (read, and a
    sector per written element)."""
    dense = T * N * C * 4
    return T * cols * (32 + 4) + dense + T * cols * (4 + 32)


@contextlib.contextmanager
def counting(be, costs, l2):
    be.stats.clear()
    be.set_work_weights(costs.weights(l2))
    yield be.stats


def price(stats, costs, device, l2=False):
    return [(s, cm.launch_time(s, costs, device, l2) * 1e-9) for s in stats]


def run_ctc(be, costs, device, T, N, C, S):
    lp, targets, il, tl = shapes.ctc_inputs(T, N, C, S)
    lat, _, _ = shapes.ctc_lattice(T, N, C, S)
    l2 = not cm.fits_l1(lat, device)
    with counting(be, costs, l2) as stats, run_on(be):
        x = lp.clone().requires_grad_()
        chainfb.ctc_loss(x, targets, il, tl, reduction="sum").backward()
    launches = price(stats, costs, device, l2)
    extra = _array_op_bytes("ctc", T, N, C, lat.num_columns // N * N) / (device.bandwidth * 0.9)
    return launches, extra


def run_transducer(be, costs, device, kind, T, U, V, vocabs=(16, 32)):
    """Launches at two small vocabularies, map kernels' work extrapolated to V."""
    runs = []
    for v in vocabs:
        extra = {"rnnt": 0, "multiblank": 0, "tdt": 5}[kind]
        logits, targets, Tl, Ul = shapes.transducer_inputs(T, U, v, extra)
        x = logits.requires_grad_()
        with counting(be, costs, False) as stats, run_on(be):
            if kind == "rnnt":
                loss = chainfb.rnnt_loss(x, targets, Tl, Ul, blank=v - 1, reduction="sum")
            elif kind == "multiblank":
                loss = chainfb.multiblank_rnnt_loss(x, targets, Tl, Ul, v - 1, [2, 4], reduction="sum")
            else:
                loss = chainfb.tdt_loss(x, targets, Tl, Ul, v - 1, [0, 1, 2, 3, 4], reduction="sum")
            loss.backward()
        runs.append(list(stats))
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
    return out, 0.0


def run_den(be, costs, device, N=128, T=150):
    den, scores, lengths = shapes.den_inputs(N, T)
    lat = den._lattice(N)
    l2 = not cm.fits_l1(lat, device)
    with counting(be, costs, l2) as stats, run_on(be):
        den.forward_backward(scores, lengths, 0.1)
    return price(stats, costs, device, l2), 0.0


def show(name, launches, extra, peer=None):
    total = sum(t for _, t in launches) + extra
    print(f"\n## {name}")
    print(f"{'kernel':44s} {'grid':>6s} {'block':>5s} {'phases':>7s} {'arc span':>9s} {'work (arcs)':>12s} "
          f"{'pred. ms':>9s}")
    for s, t in launches:
        arcs = sum(v for k, v in s.span.items() if k.startswith("kWorkArc"))
        work = sum(v for k, v in s.work.items() if k.startswith("kWorkArc"))
        print(f"{s.name:44s} {s.grid:6d} {s.block:5d} {int(np.max(s.phases)):7d} {arcs:9d} {work:12d} "
              f"{t * 1e3:9.3f}")
    if extra:
        print(f"{'array ops (bytes / bandwidth)':44s} {'':6s} {'':5s} {'':7s} {'':9s} {'':12s} {extra * 1e3:9.3f}")
    line = f"predicted total: {total * 1e3:.3f} ms"
    if peer:
        line += f"; {peer[0]} measured {peer[1] * 1e3:.1f} ms: {total / peer[1]:.2f}x"
    print(line)
    return total


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
    cases = set(args.cases.split(","))
    with tempfile.TemporaryDirectory() as d:
        be = EmulatedBackend(build(d), count=True)
        be.max_shared_mem = 227 * 1024  # an H100's or H200's opt-in limit, as the CuPy backend reports it
        torch.manual_seed(0)
        if "ctc" in cases:
            for T, N, C, S in shapes.CTC_SHAPES:
                name = f"ctc T={T} N={N} C={C} S={S}"
                show(name, *run_ctc(be, costs, device, T, N, C, S), PEERS.get(name))
        Tb, Ub = shapes.librispeech_batch(8)
        rnnt = None
        for kind in ("rnnt", "multiblank", "tdt"):
            if kind not in cases:
                continue
            name = f"{kind} B=8 V=500"
            total = show(name, *run_transducer(be, costs, device, kind, Tb, Ub, 500), PEERS.get(name))
            if kind == "rnnt":
                rnnt = total
                floor = 2 * 8 * int(Tb.max()) * (int(Ub.max()) + 1) * 500 * 4 / device.bandwidth
                print(f"one read + one write of the logits at the full bandwidth: {floor * 1e3:.3f} ms: "
                      f"{total / floor:.2f}x")
            elif rnnt:
                print(f"{kind} / rnnt: {total / rnnt:.2f}x")
        if "den" in cases:
            show("den 128x150 (3,379 states, 47,932 arcs, leaky HMM)", *run_den(be, costs, device),
                 ("the previous kernels", 0.112))
    print(f"\n# {time.time() - t0:.0f} s on the CPU")


if __name__ == "__main__":
    main()
