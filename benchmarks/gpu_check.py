"""One command that checks chainfb on a GPU machine and writes what it found: ``DIR/results.md`` (tables) and
``DIR/results.json`` (everything), rewritten after every step, and each step's log under ``DIR/steps/`` (bundled
in ``DIR/steps.tar.gz``).

Steps, each in its own process with its own time limit, all within ``--time-limit-s`` (default 480 s); a step that
finds too little of the time left is skipped and the reason recorded, a step that runs over its limit is stopped
(what it wrote so far is kept):

1. ``env``: GPU name, driver, SM count, memory; torch, CUDA, CuPy, NVRTC and the other versions;
   ``warm``: the CPU engine's Numba functions compiled once (tiny CPU losses), so that the later steps' processes
   load them from the cache instead of each compiling them within its own time limit;
2. ``tests``: the CUDA test classes, ``pytest -q -m cuda tests/ -p no:cacheprovider`` (junit XML in ``DIR/steps``);
3. ``sanitizer``: ``benchmarks/gpu_driver.py`` (every kernel of ``chainfb.cuda.kernels.KERNELS`` through the public
   code paths on tiny inputs; it fails naming a kernel it did not reach), then the same under compute-sanitizer's
   memcheck, racecheck and synccheck (chainfb's kernels only, no memory pools);
4. ``compare``: ``benchmarks/gpu_compare.py``, every criterion on the GPU against the CPU path (values and gradients;
   the NumPy engine and torch score maps there, the test suite's reference, which needs no compiling) and the two
   20,000-frame posterior-sum checks;
5. ``bench``: ``benchmarks/gpu_bench.py``, timings and peak memory against peers measured in the same run, with each
   case's per-kernel device times (every traced launch in ``DIR/launches.json``);
6. ``sweep``: ``benchmarks/gpu_block_sweep.py``, the engine kernels alone on the benchmark graphs in each
   shared-memory mode, with and without the arc table, at the engine's own block size, with one block or a thread
   block cluster of 2, 4 or 8 a direction, and the posterior kernel with 1, 4 or 16 frames a block
   (``--sweep-cases``, ``--sweep-modes``, ``--sweep-blocks``, ``--sweep-clusters``, ``--sweep-posterior-frames``):
   what decides the engine's default launch;
7. ``profile``: ``benchmarks/gpu_profile.py`` on the CTC shapes (chainfb's step and torch's) and an RNN-T step:
   device, host-issue and synchronised times, every kernel, host op and the host's Python functions -- where a
   step bound by the host spends it.

The exit status is 0 whenever the run completed: failures are reported in the results, not as a crash.

    python -m benchmarks.gpu_check --out DIR [--time-limit-s 480]
    PYTHONPATH=tests python -m benchmarks.gpu_check --out DIR --emulate    # the CPU: the kernels' emulation

From the repository root (the steps run there, with the tree's chainfb).  ``--emulate`` runs the same steps without a
GPU (the kernels' CPU emulation of the test suite, on the path by ``PYTHONPATH=tests``, tiny shapes; the
tests step then skips every CUDA test and the sanitizer step needs a ``--sanitizer`` to run): it checks the
script, and its times are not GPU times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

from ._gpu_place import EMULATION_LIBRARY, write_json
from ._gpu_report import parse_junit, parse_sanitizer, render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the steps, in order, and their share of the time limit (what an earlier step leaves goes to the later ones)
STEPS = {"env": 0.04, "warm": 0.22, "tests": 0.16, "sanitizer": 0.20, "compare": 0.10, "bench": 0.24, "sweep": 0.12,
         "profile": 0.08}
#: the least time each step is started with (seconds)
MIN_SECONDS = {"env": 5, "warm": 20, "tests": 20, "sanitizer": 20, "compare": 15, "bench": 20, "sweep": 15,
               "profile": 15}
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
#: each step's log under DIR/steps (the sanitizer step also writes sanitizer_<tool>.log)
LOGS = {"env": "env.log", "warm": "warm.log", "tests": "tests.log", "sanitizer": "driver.log", "compare": "compare.log",
        "bench": "bench.log", "sweep": "sweep.log", "profile": "profile.log"}
RESERVE_S = 5  # kept back for writing the results
now = time.time  # the clock of the time limit


def child_env(extra=None) -> dict:
    """This process's environment for a step run from the repository root: the tree's chainfb and benchmarks first,
    then the entries of ``PYTHONPATH`` as this process resolved them (``PYTHONPATH=tests`` for ``--emulate``)."""
    env = dict(os.environ)
    given = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *given])
    env.update(extra or {})
    return env


def run_child(cmd, log_path, limit_s, env=None) -> dict:
    """Run ``cmd`` (its own process group) with stdout and stderr into ``log_path``; stopped after ``limit_s``.
    Returns ``{"returncode", "seconds", "cpu_s", "timed_out", "command"}``."""
    t0, cpu0 = time.time(), _children_cpu()
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(env), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=max(limit_s, 1)), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc, timed_out = proc.wait(), True
            log.write(f"\n[stopped after {limit_s:.0f} s]\n")
    return dict(returncode=rc, seconds=time.time() - t0, cpu_s=round(_children_cpu() - cpu0, 1), timed_out=timed_out,
                command=" ".join(cmd))


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def log_tail(path, lines=15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class Check:
    """One run of the steps (see the module docstring)."""

    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.steps_dir = os.path.join(self.out, "steps")
        os.makedirs(self.steps_dir, exist_ok=True)
        self.t0 = now()
        self.results = dict(tool="benchmarks/gpu_check.py", mode="emulated" if args.emulate else "cuda",
                            started=time.strftime("%Y-%m-%d %H:%M:%S %Z"), time_limit_s=args.time_limit_s, steps={})

    def py(self, module, *args):
        """The command of a step: ``module`` of the benchmarks (``gpu_driver``) in a fresh interpreter."""
        return [sys.executable, "-m", f"{__package__}.{module}", *args] + (["--emulate"] if self.args.emulate else [])

    def path(self, name):
        return os.path.join(self.steps_dir, name)

    def left(self) -> float:
        return self.args.time_limit_s - (now() - self.t0) - RESERVE_S

    # -- steps -------------------------------------------------------------------------------------------
    def step_env(self, limit):
        r = run_child(self.py("gpu_check", "--facts", self.path("env.json")), self.path("env.log"), limit)
        facts = read_json(self.path("env.json"))
        return r, facts, "ok" if facts else "error"

    def step_warm(self, limit):
        r = run_child(self.py("gpu_check", "--warm", self.path("warm.json")), self.path("warm.log"), limit)
        data = read_json(self.path("warm.json"))
        return r, data, "ok" if data else "error"

    def step_tests(self, limit):
        junit = self.path("junit_cuda.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", *self.args.tests, "-p", "no:cacheprovider",
               f"--junitxml={junit}", "-rfE", "--durations=10"]
        r = run_child(cmd, self.path("tests.log"), limit)
        data = parse_junit(junit)
        if data is None:
            return r, None, "error"
        return r, data, "ok" if data["failures"] + data["errors"] == 0 and r["returncode"] in (0, 5) else "failed"

    def step_sanitizer(self, limit):
        t0 = time.time()
        t_end = t0 + limit
        # the plain run also pays for whatever the warm step did not compile
        plain = run_child(self.py("gpu_driver", "--json", self.path("driver.json")), self.path("driver.log"),
                          limit * 0.4)
        data = dict(driver=read_json(self.path("driver.json")), driver_run=plain, tools={})
        ok = bool(data["driver"] and data["driver"]["ok"])
        exe = self.args.sanitizer or shutil.which("compute-sanitizer") or next(
            (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
        if exe is None:
            data["sanitizer"] = "compute-sanitizer not found (PATH, /usr/local/cuda/bin): no sanitizer run"
            return dict(plain, seconds=time.time() - t0), data, "ok" if ok else "failed"
        data["sanitizer"] = exe
        tools = [t for t in self.args.sanitizer_tools.split(",") if t]
        for i, tool in enumerate(tools):
            share = (t_end - time.time()) / (len(tools) - i)
            if share < 5:
                data["tools"][tool] = dict(skipped=f"{max(share, 0):.0f} s left of the step")
                ok = False
                continue
            log = self.path(f"sanitizer_{tool}.log")
            cmd = [exe, "--tool", tool, "--kernel-name", "kns=chainfb",
                   *self.py("gpu_driver", "--no-pool", "--json", self.path(f"driver_{tool}.json"))]
            r = run_child(cmd, log, share, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
            found = parse_sanitizer(log)
            found.update(r)
            driver = read_json(self.path(f"driver_{tool}.json"))
            found["driver_ok"] = bool(driver and driver["ok"])
            data["tools"][tool] = found
            ok = ok and found["ok"] and found["driver_ok"] and not r["timed_out"]
        cpu = plain["cpu_s"] + sum(t.get("cpu_s", 0) for t in data["tools"].values())
        return dict(plain, seconds=time.time() - t0, cpu_s=round(cpu, 1)), data, "ok" if ok else "failed"

    def script(self, step, module, limit, *args, margin=30.0):
        """Step ``step``'s run of benchmarks/``module``.py with ``--json`` (``DIR/steps/<step>.json``), ``args`` and
        ``--deadline`` (``margin`` seconds, at most a quarter of ``limit``, before the step's limit);
        ``(run_child's record, the JSON it wrote or None)``."""
        path = self.path(f"{step}.json")
        cmd = self.py(module, "--json", path, *args, "--deadline", str(time.time() + limit - min(margin, limit / 4)))
        r = run_child(cmd, self.path(LOGS[step]), limit)
        return r, read_json(path)

    def step_compare(self, limit):
        extra = ["--long-frames", "300"] if self.args.emulate else []
        r, data = self.script("compare", "gpu_compare", limit, "--cpu-engine", "numpy", *extra)
        if data is None:
            return r, None, "error"
        return r, data, "ok" if data.get("ok") else "failed"

    def step_bench(self, limit):
        only = ["--only", self.args.bench] if self.args.bench else []
        r, data = self.script("bench", "gpu_bench", limit, "--launches", os.path.join(self.out, "launches.json"),
                              "--repeat", str(self.args.repeat), *only, margin=60.0)
        if data is None:
            return r, None, "error"
        return r, data, "ok" if not data.get("errors") and not data.get("skipped") else "failed"

    def step_sweep(self, limit):
        cases = self.args.sweep_cases or ("ctc" if self.args.emulate else "ctc,rnnt,multiblank,tdt,den")
        r, data = self.script("sweep", "gpu_block_sweep", limit, "--cases", cases, "--modes", self.args.sweep_modes,
                              "--tables", "1,0", "--blocks", self.args.sweep_blocks, "--clusters",
                              self.args.sweep_clusters, "--posterior-frames", self.args.sweep_posterior_frames,
                              "--repeat", str(self.args.repeat))
        if data is None:
            return r, None, "error"
        errors = [row for row in data["rows"] if isinstance(row["ms"], str) and row.get("fits", True)]
        return r, data, "ok" if not errors and not data.get("skipped") else "failed"

    def step_profile(self, limit):
        r, data = self.script("profile", "gpu_profile", limit, "--out", self.path("profile"), "--repeat",
                              str(self.args.repeat))
        if data is None:
            return r, None, "error"
        failed = any("error" in c for c in data["cases"]) or data.get("skipped")
        return r, data, "failed" if failed else "ok"

    # -- the run -------------------------------------------------------------------------------------------
    def run(self, steps):
        if self.args.emulate:
            self.build_emulation()
        for i, name in enumerate(steps):
            left = self.left()
            limit = left * STEPS[name] / sum(STEPS[s] for s in steps[i:])
            rec = dict(limit_s=round(limit, 1), log=f"steps/{LOGS[name]}")
            if limit < MIN_SECONDS[name]:
                rec.update(status="skipped", reason=f"{max(left, 0):.0f} s left: {limit:.0f} s for this "
                                                     f"step, which needs at least {MIN_SECONDS[name]} s")
            else:
                try:
                    r, data, status = getattr(self, f"step_{name}")(limit)
                    rec.update(status="timeout" if r["timed_out"] else status, seconds=round(r["seconds"], 1),
                               cpu_s=r.get("cpu_s"), command=r["command"], returncode=r["returncode"], data=data)
                    if r["timed_out"]:
                        rec["reason"] = f"stopped after its limit of {limit:.0f} s (what it wrote is kept)"
                    if status == "error" and not r["timed_out"]:
                        rec["reason"] = f"no results (exit status {r['returncode']}); log tail:\n" + log_tail(
                            self.path(LOGS[name]))
                except Exception as e:  # noqa: BLE001 -- a step's failure is reported, the others still run
                    rec.update(status="error", reason=f"{type(e).__name__}: {e}")
            self.results["steps"][name] = rec
            self.save()
        done = self.results["steps"]
        self.results["steps"] = {name: done.get(name, dict(status="skipped", reason="not asked for (--steps)"))
                                 for name in STEPS}
        self.save(final=True)

    def build_emulation(self):
        import tempfile

        from ._emulation import emulation

        build = emulation().build

        if os.path.isfile(os.environ.get(EMULATION_LIBRARY, "")):
            self.results["emulation_library"] = os.environ[EMULATION_LIBRARY]  # built already: used as it is
            return
        t0 = time.time()
        self.tmp = tempfile.mkdtemp(prefix="chainfb-emu-")
        os.environ[EMULATION_LIBRARY] = build(self.tmp)
        self.results["emulation_build_s"] = round(time.time() - t0, 1)

    def save(self, final=False):
        self.results["elapsed_s"] = round(now() - self.t0, 1)
        write_json(os.path.join(self.out, "results.json"), self.results)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(render(self.results))
        with tarfile.open(os.path.join(self.out, "steps.tar.gz"), "w:gz") as tar:
            tar.add(self.steps_dir, arcname="steps")
        if final and self.args.compact:
            shutil.rmtree(self.steps_dir, ignore_errors=True)
        if final and getattr(self, "tmp", None):
            shutil.rmtree(self.tmp, ignore_errors=True)


def facts(path, emulate):
    """The ``env`` step (in its own process): versions and the device, written to ``path``."""
    import platform

    from importlib import metadata

    out = dict(python=platform.python_version(), platform=platform.platform(), cpus=os.cpu_count())
    for dist in ("torch", "numpy", "scipy", "numba", "cupy-cuda13x", "cupy-cuda12x", "torchaudio", "fast_rnnt",
                 "pytest"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    with open(os.path.join(ROOT, "chainfb", "__init__.py")) as f:
        out["chainfb"] = next((ln.split("=")[1].strip().strip('"') for ln in f if ln.startswith("__version__")), "?")
    commands = {"nvcc": ["nvcc", "--version"], "compute-sanitizer": ["compute-sanitizer", "--version"],
                "nvidia-smi": ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                               "power.limit", "--format=csv,noheader"], "g++": ["g++", "--version"]}
    for name, cmd in commands.items():
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            lines = [ln for ln in r.stdout.strip().splitlines() if ln.strip()]
            out[name] = lines[-1] if name != "g++" else lines[0]
        except Exception as e:  # noqa: BLE001
            out[name] = f"not available ({type(e).__name__})"
    try:
        # "-dirty" when the tracked files differ from that commit (a copied tree whose .git is older than its files)
        out["commit"] = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=ROOT,
                                       capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        out["commit"] = "unknown"
    if emulate:
        out["device"] = "none: the kernels run on the CPU through the test suite's emulation"
    else:
        out.update(cuda_facts())
    write_json(path, out)


def warm(path) -> None:
    """The ``warm`` step (in its own process): every case of ``benchmarks/_gpu_cases.py`` on the CPU (the criteria whose
    CPU path Numba compiles: CTC, the transducers, the simple and pruned losses, spanning arcs), and the CUDA engine's
    index arrays of a small CTC lattice, which the GPU path builds on the host by compiled passes, so that the compiled
    functions are in the cache; writes the seconds, the number of functions compiled and any case that raised."""
    t0 = time.time()
    from ._gpu_cases import CASES

    from chainfb import Lattice, ctc_graph
    from chainfb.engines import cuda as cuda_engine, numba_cache

    errors = {}
    for name, case in CASES.items():
        if "(cuda" in name:
            continue  # a GPU engine by name
        try:
            case(lambda x: x)  # on the CPU
        except Exception as e:  # noqa: BLE001 -- recorded; the compare step reports the cases themselves
            errors[name] = f"{type(e).__name__}: {e}"
    try:
        cuda_engine.lattice_host_arrays(Lattice.of(ctc_graph([[1, 2, 2], [3]])))
    except Exception as e:  # noqa: BLE001 -- recorded as the cases are
        errors["CUDA engine's host arrays"] = f"{type(e).__name__}: {e}"
    write_json(path, dict(seconds=round(time.time() - t0, 1), compiled=numba_cache.compiled(), errors=errors))


def cuda_facts() -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    out = dict(device=p.name, capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
               memory_gib=round(p.total_memory / 2**30, 1), torch_cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version(), device_count=torch.cuda.device_count())
    try:
        import cupy

        rt = cupy.cuda.runtime
        out.update(driver=rt.driverGetVersion(), cupy_cuda_runtime=rt.runtimeGetVersion(),
                   nvrtc=".".join(map(str, cupy.cuda.nvrtc.getVersion())))
    except Exception as e:  # noqa: BLE001
        out["cupy_error"] = f"{type(e).__name__}: {e}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the directory of the results (made if missing)")
    ap.add_argument("--time-limit-s", type=float, default=480.0, help="time for the whole run (default 480 s)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    ap.add_argument("--tests", nargs="+", default=["tests/"], help="what the tests step collects (default tests/)")
    ap.add_argument("--sanitizer", help="the compute-sanitizer executable (default: found on the PATH)")
    ap.add_argument("--sanitizer-tools", default=",".join(SANITIZER_TOOLS), help="default: %(default)s")
    ap.add_argument("--bench", help="the benchmarks to run (benchmarks/gpu_bench.py --only; default all)")
    ap.add_argument("--repeat", type=int, default=None, help="timed steps per benchmark case (default 5, emulated 1)")
    ap.add_argument("--sweep-cases", help="gpu_block_sweep.py --cases (default all; emulated: ctc)")
    ap.add_argument("--sweep-modes", default="2,0", help="gpu_block_sweep.py --modes (default %(default)s)")
    ap.add_argument("--sweep-blocks", default="default", help="gpu_block_sweep.py --blocks (default %(default)s)")
    ap.add_argument("--sweep-clusters", default="1,2,4,8",
                    help="gpu_block_sweep.py --clusters (default %(default)s)")
    ap.add_argument("--sweep-posterior-frames", default="1,4,16",
                    help="gpu_block_sweep.py --posterior-frames (default %(default)s)")
    ap.add_argument("--compact", action="store_true", help="at the end keep steps.tar.gz, remove DIR/steps")
    ap.add_argument("--emulate", action="store_true", help="on the CPU through the kernels' emulation (tiny shapes)")
    ap.add_argument("--facts", help=argparse.SUPPRESS)  # the env step's own process: write the facts there
    ap.add_argument("--warm", help=argparse.SUPPRESS)  # the warm step's own process: write what it did there
    args = ap.parse_args(argv)
    if args.facts:
        facts(args.facts, args.emulate)
        return 0
    if args.warm:
        warm(args.warm)
        return 0
    steps = [s for s in args.steps.split(",") if s]
    if not args.out:
        ap.error("--out is required")
    if any(s not in STEPS for s in steps):
        ap.error(f"--steps: expected names among {', '.join(STEPS)}, got {args.steps!r}")
    if args.time_limit_s <= RESERVE_S:
        ap.error(f"--time-limit-s: expected more than {RESERVE_S} s, got {args.time_limit_s}")
    args.repeat = args.repeat or (1 if args.emulate else 5)
    check = Check(args)
    check.run(steps)
    done = ", ".join(f"{k} {v['status']}" for k, v in check.results["steps"].items())
    print(f"gpu_check: {done}; {check.results['elapsed_s']} s; results in {os.path.join(check.out, 'results.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
