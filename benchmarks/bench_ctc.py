"""Forward+backward time of ``chainfb.ctc_loss`` against torch's CPU
``torch.nn.functional.ctc_loss``, measured in one run.

T=500, N=16, C=500, S=100 (``--size T N C S`` for another; every sequence full length), float32
log-softmax outputs, reduction "mean"; one step = loss + ``backward()``,
the methods interleaved, median of ``--repeat`` steps each after a
warm-up, and the ratio of the medians to torch's.  chainfb's compiled
graph is cached per targets, so the steps after the warm-up reuse it; the
"uncached" row compiles it every step (new targets each step in
training).  chainfb runs on the engine ``auto`` picks: the compiled one
(Numba is a default dependency); the "NumPy engine" row hides Numba for
comparison.

    python -m benchmarks.bench_ctc [--repeat 7] [--seed 0] [--size 500 16 500 100]

``--long``: long sequences on one thread (``torch.set_num_threads(1)``,
``chainfb.engines.set_num_threads(1)``): N=1, C=1000, (T=2000, S=1000)
and (T=4000, S=3000), float32 log-softmax outputs (``--dtype float64``
for doubles).  Each method runs in a fresh process: after a warm-up on a
small input (imports, compiled code), ``--repeat`` steps (loss +
``backward()``, new graph every step for chainfb: its compile is
counted), each with the peak resident size reset (``/proc/self/clear_refs``)
first; printed: the median wall time, the median CPU time
(``time.process_time``) and the largest peak RSS growth (``VmHWM`` above
the resident size before the step), with their ratios to torch's.

    python -m benchmarks.bench_ctc --long [--repeat 3] [--dtype float32|float64]

``--compile``: the host's work for a new label set on the GPU path, at the
shapes of the GPU benchmark (``benchmarks/gpu_bench.py``): what
``ctc_loss`` compiles (the CTC graphs, their lattice and score map) and the
CUDA engine's index arrays of the lattice (before their upload); the median
of ``--repeat`` new label sets after one.  On the GPU this work runs between
the labels' transfer to the host and the first kernel of the step.

    python -m benchmarks.bench_ctc --compile [--repeat 7]

``--host-step``: the host's share of a GPU step, without a GPU: ``ctc_loss``
+ ``backward()`` on the GPU code path (the CUDA engine, its launchers and
array code) with every kernel launch replaced by nothing and NumPy arrays as
device memory (the tests' ``emulation.placement.run_on``), at the GPU
benchmark's shapes with 2 frames (the host's work does not depend on T; the
arrays' does): the median step with the same labels every step (the graph
cached) and with new labels every step, and the page faults of a step with
new labels (fresh pages the host's allocations touched).  NumPy's array operations run here
where CuPy's would be queued on the device, so this bounds the host's work
from above.

    PYTHONPATH=tests python -m benchmarks.bench_ctc --host-step [--repeat 7]

``--host-step-loader``: the same step in the main process of a training
loop, which first takes the step's labels from a ``DataLoader`` with one
worker (the worker given time to make them first): the labels the same
every step, new every step (compiled in the step), and new but compiled in
the worker (``chainfb.CtcTargets`` in its ``collate_fn``, handed over
through shared memory); and the time to make one ``CtcTargets``.

    PYTHONPATH=tests python -m benchmarks.bench_ctc --host-step-loader [--repeat 7]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

import chainfb

from . import gpu_bench

warnings.filterwarnings("ignore")


def run(args, T=500, N=16, C=500, S=100):
    import torch.nn.functional as F

    from chainfb import ctc as ctc_module

    torch.manual_seed(args.seed)
    log_probs = torch.randn(T, N, C).log_softmax(-1)
    targets = torch.randint(1, C, (N, S))
    il, tl = torch.full((N,), T), torch.full((N,), S)

    def uncached(*a):
        ctc_module._compiled.clear()
        return chainfb.ctc_loss(*a)

    from chainfb.engines import numba_log

    def numpy_engine(*a):
        saved, numba_log.numba = numba_log.numba, None  # what `auto` picks with CHAINFB_NUMBA=0
        try:
            return chainfb.ctc_loss(*a)
        finally:
            numba_log.numba = saved

    fns = {"torch.nn.functional.ctc_loss": F.ctc_loss, "chainfb.ctc_loss": chainfb.ctc_loss,
           "chainfb.ctc_loss (uncached)": uncached}
    if numba_log.available():
        fns["chainfb.ctc_loss (NumPy engine)"] = numpy_engine

    def one(fn):
        x = log_probs.clone().requires_grad_()
        t0 = time.perf_counter()
        loss = fn(x, targets, il, tl)
        loss.backward()
        return time.perf_counter() - t0, float(loss)

    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, T={T} N={N} C={C} S={S} float32, "
          f"loss + backward, median of {args.repeat}; chainfb's CPU engine: "
          f"{'compiled (Numba ' + numba_log.numba.__version__ + ')' if numba_log.available() else 'NumPy'}")
    times = {k: [] for k in fns}
    vals = {}
    for fn in fns.values():
        one(fn)  # warm-up
    for _ in range(args.repeat):
        for k, fn in fns.items():
            dt, vals[k] = one(fn)
            times[k].append(dt)
    ref = statistics.median(times["torch.nn.functional.ctc_loss"])
    print(f"{'method':30s} {'time s':>8s} {'loss':>12s}  vs torch")
    for k in fns:
        t = statistics.median(times[k])
        print(f"{k:30s} {t:8.4f} {vals[k]:12.6f}  {t / ref:6.2f}x")


LONG_SHAPES = ((2000, 1000), (4000, 3000))  # (T, S); N=1
LONG_C = 1000
LONG_METHODS = ("torch.nn.functional.ctc_loss", "chainfb.ctc_loss")


def long_worker(args):
    """In this (fresh) process: one method on one long shape (see the docstring); prints one line of numbers."""
    import torch.nn.functional as F

    from chainfb import ctc as ctc_module
    from chainfb.engines import set_num_threads
    from ._memory import reset_peak, status_bytes

    torch.set_num_threads(1)
    set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    T, S = args.shape
    torch.manual_seed(args.seed)

    def chainfb_fresh(*a):  # a new graph each step, as in training
        ctc_module._compiled.clear()
        return chainfb.ctc_loss(*a)

    fn = F.ctc_loss if args.method == LONG_METHODS[0] else chainfb_fresh

    def inputs(T, S):
        lp = torch.randn(T, 1, LONG_C, dtype=dtype).log_softmax(-1)
        return lp, torch.randint(1, LONG_C, (1, S)), torch.full((1,), T), torch.full((1,), S)

    def step(lp, tg, il, tl):
        x = lp.clone().requires_grad_()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = fn(x, tg, il, tl)
        loss.backward()
        return time.perf_counter() - t0, time.process_time() - c0, float(loss)

    step(*inputs(50, 20))  # warm-up: imports, compiled code
    data = inputs(T, S)
    walls, cpus, grows = [], [], []
    for _ in range(args.repeat):
        gc.collect()
        base = status_bytes("VmRSS")
        if not reset_peak():
            raise SystemExit("--long needs /proc/self/clear_refs to reset the peak resident size")
        wall, cpu, loss = step(*data)
        grows.append(status_bytes("VmHWM") - base)
        walls.append(wall)
        cpus.append(cpu)
    print(statistics.median(walls), statistics.median(cpus), max(grows), loss)


def run_long(args):
    from chainfb.engines import numba_log

    env = dict(os.environ)  # the children import the chainfb this process imported
    root = os.path.dirname(os.path.dirname(os.path.abspath(chainfb.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    engine = f"compiled (Numba {numba_log.numba.__version__})" if numba_log.available() else "NumPy"
    print(f"# torch {torch.__version__}, one thread, N=1 C={LONG_C} {args.dtype}, loss + backward, "
          f"median of {args.repeat} per fresh process; chainfb from {root}, CPU engine: {engine}")
    print(f"{'T':>5s} {'S':>5s} {'method':30s} {'wall s':>8s} {'CPU s':>8s} {'peak MiB':>9s} {'loss':>12s}  "
          f"{'time vs torch':>13s} {'memory vs torch':>15s}", flush=True)
    for T, S in LONG_SHAPES:
        ref = None
        for method in LONG_METHODS:
            cmd = [sys.executable, "-m", __spec__.name, "--long-worker", method, "--shape", str(T), str(S),
                   "--repeat", str(args.repeat), "--seed", str(args.seed), "--dtype", args.dtype]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode:
                sys.stderr.write(r.stdout + r.stderr)
                return r.returncode
            wall, cpu, grow, loss = map(float, r.stdout.split()[-4:])
            ref = ref or (wall, grow)
            print(f"{T:5d} {S:5d} {method:30s} {wall:8.3f} {cpu:8.3f} {grow / 2**20:9.1f} {loss:12.4f}  "
                  f"{wall / ref[0]:12.2f}x {grow / ref[1]:14.2f}x", flush=True)
    return 0


#: (T, N, C, S) of the GPU benchmark's CTC cases
GPU_SHAPES = tuple(gpu_bench.CTC_SHAPES["cuda"])


def run_compile(args):
    from chainfb.ctc import _compile
    from chainfb.engines.cuda import lattice_host_arrays

    print("host work for a new label set (ctc_loss's compile + the CUDA engine's index arrays), "
          f"median of {args.repeat}")
    print(f"{'T, N, C, S':24s} {'arcs':>8s} {'ms':>8s}")
    for T, N, C, S in GPU_SHAPES:
        g = torch.Generator().manual_seed(args.seed)
        times, arcs = [], 0
        for _ in range(args.repeat + 1):
            labels = torch.randint(1, C, (N * S,), generator=g).numpy()
            t0 = time.perf_counter()
            lat, _ = _compile(np.full(N, S), labels, 0)
            lattice_host_arrays(lat)
            times.append(time.perf_counter() - t0)
            arcs = lat.num_arcs
        print(f"{str((T, N, C, S)):24s} {arcs:8d} {statistics.median(times[1:]) * 1e3:8.2f}")


class _NoLaunch:
    """A kernel backend over NumPy arrays whose launches do nothing."""

    xp = np
    max_shared_mem = 227 * 1024

    def launch(self, name, grid, block, args, shared_mem=0):
        pass

    def cache_key(self):
        return ("host",)


def _host_case(T, N, C, S, seed, frames=2):
    """The inputs of a host-step measurement at a GPU shape: log-probs of ``frames`` frames, lengths, and a label
    set maker."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(frames, N, C, generator=g).log_softmax(-1)
    il, tl = torch.full((N,), frames), torch.full((N,), S)
    return lp, il, tl, lambda: torch.randint(1, C, (N, S), generator=g)


def run_host_step(args):
    from emulation.placement import run_on

    import resource

    print(f"host time of a GPU step (loss + backward, no kernels run), 2 frames, median of {args.repeat}; and the "
          "median page faults (fresh pages) of a step with new labels")
    print(f"{'T, N, C, S':24s} {'same labels ms':>15s} {'new labels ms':>14s} {'faults':>7s}")
    for T, N, C, S in GPU_SHAPES:
        lp, il, tl, labels = _host_case(T, N, C, S, args.seed)
        sets = [labels() for _ in range(args.repeat + 2)]
        out = []
        with run_on(_NoLaunch()):
            for new in (False, True):
                times, faults = [], []
                for i in range(args.repeat + 1):
                    x = lp.clone().requires_grad_()
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t0 = time.perf_counter()
                    chainfb.ctc_loss(x, sets[i if new else 0], il, tl).backward()
                    times.append(time.perf_counter() - t0)
                    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                out.append(statistics.median(times[1:]) * 1e3)
        print(f"{str((T, N, C, S)):24s} {out[0]:15.2f} {out[1]:14.2f} {statistics.median(faults[1:]):7.0f}")


def _compiled_ahead(target_lengths, labels):
    """A ``collate_fn``: the labels compiled in the loader's worker."""
    return chainfb.CtcTargets(labels, target_lengths, device="cuda")


def run_host_step_loader(args):
    from emulation.placement import run_on

    print(f"host time of a GPU step in the main process (no kernels run), 2 frames, median of {args.repeat}: "
          "receiving the step's labels from a one-worker DataLoader, then loss + backward; the labels the same "
          "every step, new every step (compiled in the step), new and compiled in the worker "
          "(chainfb.CtcTargets in its collate_fn); and the time to make one CtcTargets")
    print(f"{'T, N, C, S':24s} {'same labels ms':>15s} {'new labels ms':>14s} {'ahead ms':>9s} {'making ms':>10s}")
    for T, N, C, S in GPU_SHAPES:
        lp, il, tl, labels = _host_case(T, N, C, S, args.seed)
        first = labels()
        cases = {"same": ([first] * (args.repeat + 1), None),  # (no collate_fn: each tensor as it is)
                 "new": ([labels() for _ in range(args.repeat + 1)], None),
                 "ahead": ([labels() for _ in range(args.repeat + 1)], functools.partial(_compiled_ahead, tl))}
        out = []
        with run_on(_NoLaunch()):
            for sets, collate in cases.values():
                loader = torch.utils.data.DataLoader(sets, batch_size=None, collate_fn=collate, num_workers=1,
                                                     prefetch_factor=4)
                times = []
                for y_next in _timed_batches(loader):
                    x = lp.clone().requires_grad_()
                    t0 = time.perf_counter()
                    chainfb.ctc_loss(x, y_next(), il, tl).backward()
                    times.append(time.perf_counter() - t0)
                out.append(statistics.median(times[1:]) * 1e3)
        making = []
        for _ in range(args.repeat + 1):
            t0 = time.perf_counter()
            chainfb.CtcTargets(labels(), tl, device="cuda")
            making.append(time.perf_counter() - t0)
        print(f"{str((T, N, C, S)):24s} {out[0]:15.2f} {out[1]:14.2f} {out[2]:9.2f} "
              f"{statistics.median(making[1:]) * 1e3:10.2f}")


def _timed_batches(loader):
    """For each batch of ``loader``, a function that takes it from the loader (timed by the caller), called once
    the worker has had time to make it (so the step waits for no work of the worker's)."""
    it = iter(loader)
    for _ in range(len(loader)):
        time.sleep(0.005)
        yield lambda: next(it)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=None, help="steps per method (default 7, with --long 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--long", action="store_true", help="long sequences, one thread, time and peak memory")
    ap.add_argument("--compile", action="store_true", help="the host work of a new label set on the GPU path")
    ap.add_argument("--host-step", action="store_true", help="the host's share of a GPU step (PYTHONPATH=tests)")
    ap.add_argument("--host-step-loader", action="store_true",
                    help="the same, the labels from a DataLoader, compiled there or in the step (PYTHONPATH=tests)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="with --long")
    ap.add_argument("--long-worker", dest="method", choices=LONG_METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--shape", type=int, nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, nargs=4, metavar=("T", "N", "C", "S"), default=(500, 16, 500, 100),
                    help="the default run's shape (default: 500 16 500 100)")
    args = ap.parse_args(argv)
    if args.repeat is None:
        args.repeat = 3 if args.long or args.method else 7
    if args.method:
        return long_worker(args)
    if args.long:
        return run_long(args)
    if args.compile:
        return run_compile(args)
    if args.host_step:
        return run_host_step(args)
    if args.host_step_loader:
        return run_host_step_loader(args)
    return run(args, *args.size)


if __name__ == "__main__":
    raise SystemExit(main() or 0)
