"""What durations cost: ``chainfb.tdt_loss`` and ``chainfb.multiblank_rnnt_loss``
against ``chainfb.rnnt_loss`` on the same shape, measured in one run.

Time: B = 8, T = 200, U = 40, V = 256 (every utterance full length),
float32 logits requiring grad, reduction "sum"; one step = loss +
``backward()``, the three losses interleaved, median of ``--repeat`` steps
each after a warm-up, and the ratio of each median to ``rnnt_loss``'s.
``tdt_loss`` runs on ``[B, T, U + 1, V + 5]`` logits (durations ``[0, 1,
2, 3, 4]``), ``multiblank_rnnt_loss`` on the ``V`` logits with big blanks
of durations ``[2, 4]`` (at ``V - 2``, ``V - 3``; the blank is ``V - 1``).

Memory: B = 1, T = 1000, U = 50, V = 256; each case runs in a fresh
process: the growth of the peak resident memory (Linux ``VmHWM``, reset
through ``/proc/self/clear_refs``) above the inputs during a first step
(compilation included) and during a second one (the compiled layout
cached).  It includes the gradient (the size of the logits).  The cases
pair a short duration set with one holding a duration of ``T - 1``; the
time of the second step and the fastest of ``--repeat`` more are printed
too (what a long duration costs in time).

    python -m benchmarks.bench_durations [--repeat 7] [--threads 2] [--numpy-engine] [--skip-memory]

``--numpy-engine`` hides Numba (the engine ``auto`` then picks is the NumPy one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from ._memory import reset_peak, status_bytes

warnings.filterwarnings("ignore")

MEMORY_CASES = {
    "multiblank [2, 4]": ("multiblank", [2, 4]),
    "multiblank [2, 999]": ("multiblank", [2, 999]),
    "tdt [0, 1, 2, 3, 4]": ("tdt", [0, 1, 2, 3, 4]),
    "tdt [0, 1, 2, 3, 999]": ("tdt", [0, 1, 2, 3, 999]),
}


def setup(args):
    import torch

    import chainfb

    torch.set_num_threads(args.threads)
    chainfb.engines.set_num_threads(args.threads)
    if args.numpy_engine:
        from chainfb.engines import numba_log

        numba_log.numba = None
    return torch, chainfb


def make_step(kind, durations, B, T, U, V, seed=0, device="cpu"):
    """``step()`` running one loss + backward of ``kind`` on fixed random inputs (placed on ``device``); returns
    the loss."""
    import torch

    import chainfb

    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, V - 1 - (len(durations) if kind == "multiblank" else 0), (B, U), generator=g)
    Tl, Ul = torch.full((B,), T), torch.full((B,), U)
    width = V + len(durations) if kind == "tdt" else V
    logits = torch.randn(B, T, U + 1, width, generator=g).to(device)
    targets, Tl, Ul = targets.to(device), Tl.to(device), Ul.to(device)

    def step():
        x = logits.detach().requires_grad_()
        if kind == "rnnt":
            loss = chainfb.rnnt_loss(x, targets, Tl, Ul, blank=V - 1, reduction="sum")
        elif kind == "multiblank":
            loss = chainfb.multiblank_rnnt_loss(x, targets, Tl, Ul, V - 1, durations, reduction="sum")
        else:
            loss = chainfb.tdt_loss(x, targets, Tl, Ul, V - 1, durations, reduction="sum")
        loss.backward()
        return float(loss)

    return step


def run_time(args, B=8, T=200, U=40, V=256):
    torch, chainfb = setup(args)
    from chainfb.engines import numba_log

    cases = {"rnnt_loss": ("rnnt", []), "multiblank_rnnt_loss [2, 4]": ("multiblank", [2, 4]),
             "tdt_loss [0, 1, 2, 3, 4]": ("tdt", [0, 1, 2, 3, 4])}
    steps = {k: make_step(kind, d, B, T, U, V) for k, (kind, d) in cases.items()}
    engine = "compiled (Numba)" if numba_log.available() else "NumPy"
    print(f"# chainfb from {os.path.dirname(chainfb.__file__)}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"# time: torch {torch.__version__}, threads {args.threads}, B={B} T={T} U={U} V={V} float32, "
          f"loss + backward, median (and min) of {args.repeat}; CPU engine: {engine}")
    vals, times = {}, {k: [] for k in steps}
    for s in steps.values():
        s()  # warm-up: compiles the layouts (and the Numba kernels)
    for _ in range(args.repeat):
        for k, s in steps.items():
            t0 = time.perf_counter()
            vals[k] = s()
            times[k].append(time.perf_counter() - t0)
    ref, ref_min = statistics.median(times["rnnt_loss"]), min(times["rnnt_loss"])
    print(f"{'loss':30s} {'median s':>9s} {'min s':>8s} {'loss value':>14s}  vs rnnt_loss (median, min)")
    for k in steps:
        t, m = statistics.median(times[k]), min(times[k])
        print(f"{k:30s} {t:9.4f} {m:8.4f} {vals[k]:14.4f}  {t / ref:6.2f}x {m / ref_min:6.2f}x")




def memory_worker(args, B=1, T=1000, U=50, V=256):
    """One memory case in this process; prints a JSON line."""
    setup(args)
    kind, durations = MEMORY_CASES[args.worker]
    step = make_step(kind, durations, B, T, U, V)
    out = {}
    for name in ("first", "second"):
        reset_peak()
        base = status_bytes("VmRSS")
        t0 = time.perf_counter()
        step()
        out[name + " s"] = time.perf_counter() - t0
        out[name] = status_bytes("VmHWM") - base
    out["later s"] = min(_timed(step) for _ in range(args.repeat))
    print(json.dumps(out))


def _timed(step) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def run_memory(args):
    print("# memory: B=1 T=1000 U=50 V=256 float32, loss + backward, peak RSS growth above the inputs, "
          f"a fresh process per case; time: the second step, and the fastest of {args.repeat} more")
    print(f"{'case':24s} {'first step MiB':>15s} {'second step MiB':>16s} {'second s':>9s} {'min s':>8s}")
    res = {}
    for case in MEMORY_CASES:
        cmd = [sys.executable, "-m", __spec__.name, "--worker", case, "--threads", str(args.threads)]
        if args.numpy_engine:
            cmd.append("--numpy-engine")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{case:24s} failed: {last}")
            continue
        res[case] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{case:24s} {res[case]['first'] / 2**20:15.0f} {res[case]['second'] / 2**20:16.0f} "
              f"{res[case]['second s']:9.4f} {res[case]['later s']:8.4f}")
    for short, long in (("multiblank [2, 4]", "multiblank [2, 999]"), ("tdt [0, 1, 2, 3, 4]", "tdt [0, 1, 2, 3, 999]")):
        if short in res and long in res:
            print(f"# {long} / {short}: memory first {res[long]['first'] / res[short]['first']:.2f}x, "
                  f"second {res[long]['second'] / res[short]['second']:.2f}x; "
                  f"time {res[long]['later s'] / res[short]['later s']:.2f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--numpy-engine", action="store_true", help="hide Numba: run the NumPy engine")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--worker", default=None, choices=list(MEMORY_CASES), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.threads < 1:
        ap.error("--repeat and --threads must be >= 1")
    if args.worker:
        return memory_worker(args)
    if not args.skip_time:
        run_time(args)
    if not args.skip_memory:
        run_memory(args)


if __name__ == "__main__":
    main()
