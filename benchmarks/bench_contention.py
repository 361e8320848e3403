"""The digit recipe on a loaded machine: default threads against one thread, with a busy process on every core.

Starts ``--busy`` processes (default: one per CPU this process may use) that spin in a Python loop, then runs
``python -m recipes.digits --epochs 1 --max-steps <--steps>`` (the default corpus, chain; a fresh output directory
each run) in a fresh process per setting, ``--repeat`` times each, the settings interleaved:

- ``default``: the recipe as a user runs it (torch's and chainfb's thread counts left to their defaults; the
  tool makes OpenMP's waiting threads sleep, ``OMP_WAIT_POLICY=PASSIVE``);
- ``one thread``: ``OMP_NUM_THREADS=1`` (torch, and chainfb's engines that run on torch's OpenMP threads);
- with ``--spinning``, also ``spinning``: default threads with GNU libgomp's default waiting (a spin count of
  300000 before a thread sleeps; the tool leaves the policy alone once one is given), what the recipe did before.

Printed per run: the wall seconds of the whole process and of its epoch (training steps and decoding of the test
set, from ``results.json``), then the median of each setting and the ratio default / one thread.  ``--busy 0``
measures without the load.  The corpus is synthesized first if the cache has none (not timed).

    python -m benchmarks.bench_contention [--steps 6] [--repeat 1] [--busy N] [--spinning] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = "recipes.digits"  # run as python -m, from ROOT
SETTINGS = {"default": {}, "one thread": {"OMP_NUM_THREADS": "1"}, "spinning": {"GOMP_SPINCOUNT": "300000"}}


def _busy(n):
    """``n`` processes spinning in a Python loop (terminated by the caller)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _train(args, out, env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    env.update(env_extra)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", RECIPE, "--epochs", "1", "--max-steps", str(args.steps), "--out", out, "--no-progress"]
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"bench_contention.py: error: the recipe failed (exit {r.returncode}):\n"
                         f"{r.stderr[-3000:]}")
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    return wall, res["train_seconds"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6, help="training steps (--max-steps) (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=1, help="runs per setting (default: %(default)s)")
    p.add_argument("--busy", type=int, default=len(os.sched_getaffinity(0)),
                   help="busy-loop processes (default: one per CPU, %(default)s)")
    p.add_argument("--cache-dir", default=None, help="the corpus cache (default: the recipe's)")
    p.add_argument("--spinning", action="store_true",
                   help="also run the recipe with libgomp's default waiting (spinning), as before")
    a = p.parse_args(argv)
    settings = {k: v for k, v in SETTINGS.items() if k != "spinning" or a.spinning}
    if a.steps < 1 or a.repeat < 1 or a.busy < 0:
        p.error("--steps and --repeat must be >= 1, --busy >= 0")
    with tempfile.TemporaryDirectory(prefix="chainfb-contention-") as tmp:
        _train(a, os.path.join(tmp, "warm-up"), SETTINGS["one thread"])  # the corpus and the compiled engine
        busy = _busy(a.busy)
        times = {k: [] for k in settings}
        try:
            for i in range(a.repeat):
                for name, env in settings.items():
                    wall, epoch = _train(a, os.path.join(tmp, f"{name.replace(' ', '-')}-{i}"), env)
                    times[name].append((wall, epoch))
                    print(f"{name:10} run {i + 1}: process {wall:6.1f} s, epoch {epoch:6.1f} s "
                          f"({a.busy} busy processes, {len(os.sched_getaffinity(0))} CPUs)", flush=True)
        finally:
            for b in busy:
                b.terminate()
            for b in busy:
                b.wait()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(e for _, e in v)) for k, v in times.items()}
    for k, (w, e) in med.items():
        print(f"{k:10} median: process {w:6.1f} s, epoch {e:6.1f} s")
    o = med["one thread"]
    for k in [k for k in med if k != "one thread"]:
        print(f"{k} / one thread: process {med[k][0] / o[0]:.2f}x, epoch {med[k][1] / o[1]:.2f}x")


if __name__ == "__main__":
    main()
