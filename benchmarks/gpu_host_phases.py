"""Where the host's time of a CTC step goes on a GPU, phase by phase, with the labels the same every step, new on
the device, new on the host and new but compiled ahead (``chainfb.CtcTargets`` made, pickled and unpickled before
the steps, as a ``DataLoader`` worker hands them over; one object a step), against torch's ``ctc_loss`` with new
labels.

Each phase is a chainfb function wrapped in a wall-clock timer (inclusive: a phase holds the phases it calls).
Unlike cProfile (``benchmarks/gpu_profile.py``), the timers also see ``backward()``, which torch's autograd runs
in a thread of its own for CUDA tensors.  Each step is a loss + ``backward()`` timed by the host clock, then a
synchronisation; after 10 warm-up steps, the medians of ``--steps`` steps and each phase's mean per step.
A GPU only (CuPy and a CUDA device).

    python -m benchmarks.gpu_host_phases [--steps 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import pickle
import statistics
import time

import torch

from ._gpu_place import write_lines

#: (module, attribute) of each timed phase
PHASES = [("chainfb.ctc", "_to_host"), ("chainfb.ctc", "_labels"), ("chainfb.ctc", "_compile"),
          ("chainfb.engines.cuda", "lattice_host_arrays"), ("chainfb.engines.cuda", "upload"),
          ("chainfb.engines.cuda", "run_engine"), ("chainfb.engines.cuda", "_device_lengths"),
          ("chainfb.engines.cuda", "scratch"), ("chainfb.engines.cuda_memory", "_on_device"),
          ("chainfb.cuda.pdf_maps", "gather"), ("chainfb.cuda.pdf_maps", "scatter"),
          ("chainfb.criterion", "DeferredGrad.materialize"), ("chainfb.criterion", "_CriterionFunction._gradients"),
          ("chainfb.score_map", "PdfScoreMap._offsets"), ("chainfb.score_map", "PdfScoreMap._sequences"),
          ("chainfb.cuda.kernels", "CupyBackend.launch"), ("chainfb.cuda.interop", "torch_malloc"),
          ("cupy", "asarray"), ("cupy", "array")]
SHAPES = [(500, 16, 500, 100), (150, 64, 5000, 50)]


def owner_of(module: str, path: str) -> tuple:
    """``(owner, name)``: the object holding phase ``module``.``path`` (a module or a class) and its name there."""
    import importlib

    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name


def instrument(totals: dict, counts: collections.Counter) -> None:
    """Wrap every phase of :data:`PHASES` in a timer adding to ``totals`` / ``counts``."""
    for module, path in PHASES:
        owner, name = owner_of(module, path)
        fn, label = getattr(owner, name), f"{module}.{path}"

        def timed(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                totals[_label] += time.perf_counter() - t0
                counts[_label] += 1

        setattr(owner, name, functools.wraps(fn)(timed))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50, help="timed steps per case after 10 warm-up ones")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    import chainfb

    totals, counts = collections.defaultdict(float), collections.Counter()
    instrument(totals, counts)
    dev, lines = torch.device("cuda"), []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    for T, N, C, S in SHAPES:
        g = torch.Generator().manual_seed(T + S)
        lp = torch.randn(T, N, C, generator=g).log_softmax(-1).to(dev)
        il, tl = torch.full((N,), T), torch.full((N,), S)
        n = args.steps + 10
        sets = [torch.randint(1, C, (N, S), generator=g) for _ in range(4 * n)]
        cases = {"chainfb, same labels (device)": (chainfb.ctc_loss, [sets[0].to(dev)] * n, il.to(dev), tl.to(dev)),
                 "chainfb, new labels on the device": (chainfb.ctc_loss, [s.to(dev) for s in sets[:n]], il.to(dev),
                                                       tl.to(dev)),
                 "chainfb, new labels on the host": (chainfb.ctc_loss, sets[n:2 * n], il, tl),
                 "chainfb, new labels compiled ahead": (chainfb.ctc_loss, [
                     pickle.loads(pickle.dumps(chainfb.CtcTargets(s, tl, device="cuda"))) for s in sets[3 * n:]],
                     il.to(dev), None),
                 "torch, new labels on the device": (torch.nn.functional.ctc_loss,
                                                     [s.to(dev) for s in sets[2 * n:3 * n]], il.to(dev), tl.to(dev))}
        for case, (loss_fn, ys, a, b) in cases.items():
            fwd, bwd, wait, total = [], [], [], []
            for i, y in enumerate(ys):
                if i == 10:
                    totals.clear()
                    counts.clear()
                torch.cuda.synchronize()
                x = lp.detach().requires_grad_()
                t0 = time.perf_counter()
                loss = loss_fn(x, y, a, b).sum()
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                if i >= 10:
                    fwd.append(t1 - t0), bwd.append(t2 - t1), wait.append(t3 - t2), total.append(t3 - t0)
            ms = {k: statistics.median(v) * 1e3 for k, v in
                  (("loss", fwd), ("backward", bwd), ("wait", wait), ("step", total))}
            say(f"## T={T} N={N} C={C} S={S}, {case}: median ms: loss {ms['loss']:.3f}, backward {ms['backward']:.3f}, "
                f"then waiting for the device {ms['wait']:.3f}; step {ms['step']:.3f}")
            for label, t in sorted(totals.items(), key=lambda kv: -kv[1]):
                say(f"  {label:55s} {t / args.steps * 1e3:8.3f} ms a step  {counts[label] / args.steps:5.1f} calls")
            say()
        gc.collect()
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
