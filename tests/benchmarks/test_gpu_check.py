"""benchmarks/gpu_check.py and the scripts it runs (gpu_driver.py, gpu_compare.py, gpu_bench.py), without a GPU: the
whole run in its --emulate mode (the kernels' CPU emulation, tiny shapes, a stand-in compute-sanitizer), and the
parts that need CUDA or CuPy with fakes."""

import paths  # tests/paths.py: the repository's and the tests' folders
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from emulation import find_compiler

from benchmarks import _gpu_place, _gpu_report, gpu_check

ROOT = paths.REPO

needs_compiler = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler for the kernel emulation")

# compute-sanitizer's banner and summaries around the program it runs (racecheck adds its hazard summary)
FAKE_SANITIZER = """#!/bin/sh
tool=memcheck
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool=$2; shift 2 ;;
    --*) shift 2 ;;
    *) break ;;
  esac
done
echo "========= COMPUTE-SANITIZER"
"$@"
rc=$?
[ "$tool" = racecheck ] && echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
"""


@pytest.fixture(scope="module")
def emulated_run(tmp_path_factory, emulated_backend):
    """One whole emulated run: every step, the CUDA tests of one file (all skip here), a stand-in sanitizer (the
    kernels' emulation library of this test session)."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    fake = tmp / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    out = tmp / "out"
    # as documented: the tree's benchmarks and chainfb, and the test suite's emulation (PYTHONPATH=tests)
    path = [ROOT, os.path.join(ROOT, "tests"), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env[_gpu_place.EMULATION_LIBRARY] = emulated_backend.lib._name
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--emulate", "--out", str(out),
                        "--time-limit-s", "600", "--tests", "tests/cuda/test_cuda_device.py", "--sanitizer", str(fake),
                        "--sanitizer-tools", "racecheck"], cwd=tmp, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out / "results.json") as f:
        return out, json.load(f), r.stdout


def test_emulated_run_writes_every_result(emulated_run):
    out, res, stdout = emulated_run
    assert "results in" in stdout
    assert {"results.md", "results.json", "launches.json", "steps.tar.gz", "steps"} <= set(os.listdir(out))
    assert res["mode"] == "emulated"
    steps = res["steps"]
    assert list(steps) == list(gpu_check.STEPS)
    for name in ("env", "warm", "tests", "sanitizer", "bench", "sweep", "profile"):
        assert steps[name]["status"] == "ok", (name, steps[name])
    assert steps["warm"]["data"]["errors"] == {}
    assert steps["compare"]["status"] in ("ok", "failed")  # differences are results, not errors
    assert steps["env"]["data"]["device"].startswith("none")
    tests = steps["tests"]["data"]
    assert tests["tests"] > 0 and tests["skipped"] == tests["tests"]  # no GPU here: every CUDA test skips
    assert os.path.exists(out / "steps" / "junit_cuda.xml")
    md = (out / "results.md").read_text()
    for title in ("## Steps", "## Environment", "## CUDA tests", "## Sanitizers", "## GPU vs CPU", "## Benchmarks",
                  "## Engine launches", "## Where a step's time goes", "Emulated run",
                  "The fastest launch of each case and engine"):
        assert title in md


def test_emulated_run_profiles_the_ctc_steps(emulated_run):
    """The profile step times and profiles chainfb's and torch's step at each emulated CTC shape, and chainfb's
    with new labels every step (on the device, and on the host), the Python functions of chainfb's step among
    them."""
    from benchmarks.gpu_bench import CTC_SHAPES

    out, res, _ = emulated_run
    data = res["steps"]["profile"]["data"]
    names = [f"ctc T={T} N={N} C={C} S={S}" for T, N, C, S in CTC_SHAPES["emulated"]]
    assert [c["case"] for c in data["cases"]] == [n + s for n in names
                                                  for s in ("", " (torch)", ", new labels each step",
                                                            ", new labels each step, on the host")]
    for c in data["cases"]:
        assert c["device_ms"] > 0 and c["host_ms"] > 0 and c["python"] and c["ops"], c["case"]
    ours = next(c for c in data["cases"] if c["case"] == names[0])
    assert any(op[0] == "_CriterionFunction" for op in ours["ops"])  # the loss's autograd function, a host op
    assert any(row[0].startswith("ctc.py:") for row in ours["python"])  # chainfb.ctc's Python functions
    assert (out / "steps" / "profile" / "profile.md").exists()


def test_emulated_run_sweeps_modes_arc_tables_and_clusters(emulated_run):
    """The sweep step times each CTC graph in modes 2 and 0, each with and without the arc table, at the engine's
    own block size, over thread block clusters of 2, 4 and 8 blocks a direction (mode 0, with and without the
    table), and with the posterior kernel's 4 and 16 frames a block (mode 2 with the table, one block)."""
    from benchmarks.gpu_bench import CTC_SHAPES

    _, res, _ = emulated_run
    rows = res["steps"]["sweep"]["data"]["rows"]
    assert rows and all(isinstance(r["ms"], float) and r["ms"] > 0 and r["block"] is None for r in rows)
    cases = {r["case"] for r in rows}
    assert cases == {f"ctc T={T} N={N} C={C} S={S}" for T, N, C, S in CTC_SHAPES["emulated"]}
    for case in cases:
        got = {(r["mode"], r["table"], r["cluster"], r["frames"]) for r in rows
               if r["case"] == case and r["engine"] == "cuda"}
        assert got == {(2, True, 1, 1), (2, False, 1, 1), (0, True, 1, 1), (0, False, 1, 1)} | {
            (0, t, k, 1) for t in (True, False) for k in (2, 4, 8)} | {(2, True, 1, 4), (2, True, 1, 16)}
        assert {r["cluster"] for r in rows if r["engine"] == "cuda_shared"} == {1}
        assert {r["frames"] for r in rows if r["engine"] == "cuda_shared"} == {1, 4, 16}


def test_emulated_run_reaches_every_kernel(emulated_run):
    from chainfb.cuda.kernels import KERNELS

    _, res, _ = emulated_run
    san = res["steps"]["sanitizer"]["data"]
    assert san["driver"]["ok"] and san["driver"]["missing"] == []
    assert set(san["driver"]["launches"]) == set(KERNELS) and all(n > 0 for n in san["driver"]["launches"].values())
    race = san["tools"]["racecheck"]
    assert race["ok"] and race["errors"] == 0 and race["hazards"] == 0 and race["driver_ok"]


def test_emulated_run_compares_every_criterion(emulated_run):
    from benchmarks._gpu_cases import CASES

    _, res, _ = emulated_run
    data = res["steps"]["compare"]["data"]
    assert not data["errors"] and not data["skipped"]
    cases = {r["case"] for r in data["rows"]}
    assert set(CASES) <= cases
    assert {"numerator graph, T = 300", "extreme scores, T = 300"} <= cases
    criteria = [r for r in data["rows"] if r["case"] in CASES]
    assert criteria and all(r["ok"] for r in criteria), [r for r in criteria if not r["ok"]]


def test_emulated_run_benchmarks_and_kernel_times(emulated_run):
    from benchmarks import gpu_bench

    out, res, _ = emulated_run
    data = res["steps"]["bench"]["data"]
    assert [b["name"] for b in data["benchmarks"]] == list(gpu_bench.BENCHMARKS)
    assert not data["errors"] and not data["skipped"]
    with open(out / "launches.json") as f:
        launches = json.load(f)
    for b in data["benchmarks"]:
        assert b["cases"]
        for c in b["cases"]:
            assert c["chainfb"]["ms"] > 0, c
            if "kernels" in c:
                assert launches[f"{b['name']} / {c['case']}"]
    traced = [rec for recs in launches.values() for rec in recs]
    assert traced and all(r["ms"] >= 0 and r["grid"] > 0 and r["block"] > 0 for r in traced)
    assert any("shape" in a for r in traced for a in r["args"]) and any("value" in a for r in traced for a in r["args"])
    ctc = next(b for b in data["benchmarks"] if b["name"] == "ctc")
    assert all("ms" in c["peer"] and "time_ratio" in c for c in ctc["cases"])  # torch's CTC on the CPU here
    host = [c for c in ctc["cases"] if c["case"].endswith("new labels each step, on the host")]
    assert len(host) == len(gpu_bench.CTC_SHAPES["emulated"])  # beside the device labels' rows
    ahead = [c for c in ctc["cases"] if c["case"].endswith("new labels each step, compiled ahead")]
    assert len(ahead) == len(host) and all(c["chainfb"]["ms"] > 0 and "ms" in c["peer"] for c in ahead)
    clustered = [c for c in ctc["cases"] if c["case"].endswith("cluster=2")]  # the engine's default set to 2
    assert clustered and all(any(k["name"].startswith("chainfb::fb_cluster_recursion<float, 2>")
                                 for k in c["kernels"]) for c in clustered)


# ---------------------------------------------------------------------------------------------- the parts
class FakeBackend:
    xp = "the array module"

    def __init__(self):
        self.calls = []

    def launch(self, name, grid, block, args, **kwargs):
        self.calls.append((name, grid, block, args, kwargs))

    def cache_key(self):
        return ("fake",)


def test_recorder_passes_keywords_through_and_traces():
    import numpy as np

    inner = FakeBackend()
    rec = _gpu_place.LaunchRecorder(inner, _gpu_place.HostEvent)
    rec.launch("k1", 2, 32, [np.zeros((3, 4), np.float32)])
    rec.start_trace()
    rec.launch("k2", 1, 64, [np.zeros(5, np.int32), np.float64(-np.inf), np.uint64(0)], shared_mem=256)
    traced = rec.stop_trace()
    rec.launch("k2", 1, 64, [], shared_mem=0)
    assert inner.calls[1][4] == {"shared_mem": 256} and inner.calls[2][4] == {"shared_mem": 0}
    assert rec.counts == {"k1": 1, "k2": 2} and rec.xp == inner.xp and rec.cache_key() == ("fake",)
    (t,) = traced
    assert t["name"] == "k2" and t["kwargs"] == {"shared_mem": 256} and t["ms"] >= 0
    assert t["args"] == [{"shape": [5], "dtype": "int32"}, {"dtype": "float64", "value": "-inf"},
                         {"dtype": "uint64", "value": 0}]


@needs_compiler
def test_driver_names_a_listed_kernel_it_did_not_reach(monkeypatch, emulated_backend, capsys):
    import chainfb.cuda.kernels as kernels
    from benchmarks import _gpu_cases
    from benchmarks import gpu_driver

    monkeypatch.setenv(_gpu_place.EMULATION_LIBRARY, emulated_backend.lib._name)
    monkeypatch.setitem(kernels.KERNELS, "chainfb::a_new_kernel<float>", "engine.cu")
    monkeypatch.setattr(gpu_driver, "_engine_calls", lambda place: {})
    monkeypatch.setattr(gpu_driver, "_zero_column_calls", lambda place: {})
    monkeypatch.setattr(_gpu_cases, "CASES", {"fst_loglike": _gpu_cases.fst_loglike})
    assert gpu_driver.main(["--emulate"]) == 1
    err = capsys.readouterr().err
    assert "no call reached" in err and "chainfb::a_new_kernel<float>" in err
    assert "chainfb::fb_recursion<float>" not in err.split("no call reached")[1]  # fst_loglike reached it


def test_sanitizer_log(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n"
                   "=========     at chainfb::fb_recursion<float>(...)\n========= \n"
                   "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n"
                   "========= ERROR SUMMARY: 1 error\n")
    got = _gpu_report.parse_sanitizer(log)
    assert got["errors"] == 1 and not got["ok"] and got["hazards"] == 2 and got["warnings"] == 1
    assert got["reports"][0] == "========= Invalid __global__ read of size 4 bytes"
    # racecheck as compute-sanitizer 2025.3 prints it: its own summary, no ERROR SUMMARY line
    log.write_text("========= COMPUTE-SANITIZER\ngpu_driver (cuda): ok\n"
                   "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    got = _gpu_report.parse_sanitizer(log)
    assert got["ok"] and got["errors"] == 0 and got["hazards"] == 0
    log.write_text("========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)\n")
    assert _gpu_report.parse_sanitizer(log)["errors"] == 2 and not _gpu_report.parse_sanitizer(log)["ok"]
    log.write_text("========= COMPUTE-SANITIZER\nSegmentation fault\n")  # no summary: the run did not finish
    assert _gpu_report.parse_sanitizer(log)["errors"] is None and not _gpu_report.parse_sanitizer(log)["ok"]


def test_junit(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="2.5">'
                   '<testcase classname="tests.test_x.TestCUDA" name="test_a" time="1"/>'
                   '<testcase classname="tests.test_x.TestCUDA" name="test_b" time="1">'
                   '<failure message="AssertionError: 1 != 2&#10;more">trace</failure></testcase>'
                   '<testcase classname="tests.test_x.TestCUDA" name="test_c"><skipped message="no"/></testcase>'
                   '</testsuite></testsuites>')
    got = _gpu_report.parse_junit(xml)
    assert (got["tests"], got["passed"], got["failures"], got["skipped"]) == (3, 1, 1, 1)
    assert got["failed"] == [dict(test="tests.test_x.TestCUDA::test_b", kind="failure",
                                  message="AssertionError: 1 != 2")]
    assert _gpu_report.parse_junit(tmp_path / "missing.xml") is None


def test_time_limit_skips_a_step_it_cannot_fit_and_shares_the_rest(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(gpu_check, "now", lambda: clock[0])
    monkeypatch.setitem(gpu_check.MIN_SECONDS, "env", 8)
    check = gpu_check.Check(gpu_check.main.__globals__["argparse"].Namespace(
        out=str(tmp_path), emulate=False, time_limit_s=120.0, compact=True))
    limits = {}

    def fake_step(name):
        def step(limit):
            limits[name] = limit
            clock[0] += limit  # uses all of it
            return dict(returncode=0, seconds=limit, timed_out=name == "compare", command=name), {"n": 1}, "ok"
        return step

    for name in gpu_check.STEPS:
        monkeypatch.setattr(check, f"step_{name}", fake_step(name))
    check.run(["env", "tests", "sanitizer", "compare", "bench"])
    steps = json.loads((tmp_path / "results.json").read_text())["steps"]
    assert steps["env"]["status"] == "skipped" and "needs at least 8 s" in steps["env"]["reason"]
    assert "env" not in limits and set(limits) == {"tests", "sanitizer", "compare", "bench"}
    assert sum(limits.values()) <= 120 - gpu_check.RESERVE_S + 1e-9
    assert steps["compare"]["status"] == "timeout" and steps["bench"]["status"] == "ok"
    assert not (tmp_path / "steps").exists() and (tmp_path / "steps.tar.gz").exists()  # --compact
    md = (tmp_path / "results.md").read_text()
    assert "| env | skipped |" in md and "could not be written: KeyError" in md  # a bad section: still a report


def test_a_step_over_its_limit_is_stopped(tmp_path):
    r = gpu_check.run_child([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                            str(tmp_path / "x.log"), 1.0)
    assert r["timed_out"] and r["seconds"] < 30
    assert "started" in (tmp_path / "x.log").read_text() and "[stopped after 1 s]" in (tmp_path / "x.log").read_text()


def test_cuda_place_with_fakes(monkeypatch):
    """What needs CUDA and CuPy, on stand-ins: the scope routes device data (and only it) to the recorder, the
    events time through torch's and CuPy's event APIs, the peak memory comes from torch's allocator."""

    import chainfb.cuda.kernels as kernels

    place = object.__new__(_gpu_place.CudaPlace)
    place.backend = _gpu_place.LaunchRecorder(FakeBackend(), _gpu_place.HostEvent)
    DeviceArray = type("ndarray", (), {"__module__": "cupy.fake"})
    with place.scope():
        assert kernels.backend_for(DeviceArray()) is place.backend and kernels.backend_for(torch.zeros(1)) is None
    assert kernels.backend_for(torch.zeros(1)) is None and kernels.backend_for.__module__ == "chainfb.cuda.kernels"

    class FakeTorchEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            self.t = 7.0 if hasattr(FakeTorchEvent, "seen") else 2.0
            FakeTorchEvent.seen = True

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", FakeTorchEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 1124)
    place.step_event = _gpu_place.TorchEvent
    assert place.timed_ms(lambda: "out") == ("out", 5.0)
    assert place.peak_bytes(place.reset_peak()) == 1024

    cupy = types.ModuleType("cupy")
    event = types.SimpleNamespace(record=lambda: None, synchronize=lambda: None)
    cupy.cuda = types.SimpleNamespace(Event=lambda: event, get_elapsed_time=lambda a, b: 1.5)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    start, end = _gpu_place.CupyEvent(), _gpu_place.CupyEvent()
    start.record()
    end.record()
    assert end.elapsed_ms(start) == 1.5


def test_cuda_facts_with_fakes(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                                  total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setitem(sys.modules, "cupy", None)  # not importable
    got = gpu_check.cuda_facts()
    assert got["device"] == "NVIDIA H100 80GB HBM3" and got["sm_count"] == 132 and got["memory_gib"] == 80.0
    assert got["capability"] == "9.0" and got["torch_cuda"] == "13.0" and "cupy_error" in got


# ------------------------------------------- the benchmark tools' --device cuda paths the check builds on
@pytest.fixture
def fake_cuda(monkeypatch, emulated_kernels):
    """CPU tensors stand for CUDA ones (``.cuda()`` keeps them where they are, torch.cuda's timing and memory
    calls are stand-ins) and every chainfb call runs on the emulated kernels."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    for name, fn in dict(synchronize=lambda *a: None, reset_peak_memory_stats=lambda *a: None,
                         memory_allocated=lambda *a: 0, max_memory_allocated=lambda *a: 0,
                         get_device_name=lambda *a: "emulated").items():
        monkeypatch.setattr(torch.cuda, name, fn)
    return emulated_kernels


def test_bench_engine_cuda_paths(fake_cuda, monkeypatch, capsys):
    import functools

    from benchmarks import bench_engine

    monkeypatch.setattr(bench_engine, "cases", functools.partial(bench_engine.cases, P=20, T=8, sizes=(3, 2, 4),
                                                                 num_phones=3))
    bench_engine.main(["--device", "cuda", "--cases", "ac", "--repeat", "1", "--numpy-baseline", "--peak-gbps", "1"])
    out = capsys.readouterr().out
    assert "(a) 3 numerator graphs" in out and "(c) N=4 numerator graphs" in out and "speed-up" in out
    tiny = functools.partial(bench_engine.den_case, num_phones=4, num_utts=30)
    monkeypatch.setattr(bench_engine, "den_case", lambda rng: tiny(rng))
    bench_engine.main(["--device", "cuda", "--den", "--repeat", "1", "--den-seqs", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[-2:]] == ["cuda_shared", "cuda"]
    assert all(float(ln.split()[-1]) < 1e-9 for ln in lines[-2:])  # the posteriors' difference from the CPU path


def test_bench_transducer_cuda_step(fake_cuda):
    import numpy as np

    from benchmarks import bench_transducer

    T, U = np.array([5, 3]), np.array([2, 1])
    inputs = bench_transducer.make_inputs(np.random.default_rng(0), T, U, 7, "cpu")
    dt, peak, val = bench_transducer.step(bench_transducer.methods()["chainfb"], inputs, "cuda")
    assert dt > 0 and peak == 0 and np.isfinite(val)
    assert len(fake_cuda.launches) >= 4  # gather, forward, backward, gradient


def test_bench_transducer_maps_cuda_path(fake_cuda, monkeypatch, capsys):
    import numpy as np

    from benchmarks import bench_transducer_maps
    import chainfb.cuda.kernels as kernels

    monkeypatch.setattr(kernels, "cupy_backend", lambda: fake_cuda)
    pool = types.SimpleNamespace(total_bytes=lambda: 0)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(asarray=np.asarray,
                                                                   get_default_memory_pool=lambda: pool))
    bench_transducer_maps.main(["--device", "cuda", "--batch", "2", "--max-frames", "6", "--max-labels", "3",
                                "--vocab", "8", "--repeat", "1", "--peak-gbps", "1"])
    out = capsys.readouterr().out
    assert "device cuda (emulated), logits (2, 6, 4, 8) float32" in out and "peak memory allocated by torch" in out


def test_host_phases_resolve_and_time(monkeypatch):
    """benchmarks/gpu_host_phases.py (a GPU only) names chainfb functions by module and attribute: every one of them
    exists (a rename fails here, not on a GPU), and a wrapped phase returns what it did and adds its time."""
    import collections

    import numpy as np

    from benchmarks import gpu_host_phases
    from chainfb import ctc

    import importlib.util

    # CuPy's own functions only where CuPy is installed (a GPU machine); chainfb's everywhere
    phases = [(m, p) for m, p in gpu_host_phases.PHASES if m.startswith("chainfb") or importlib.util.find_spec(m)]
    assert sum(m.startswith("chainfb") for m, _ in phases) >= 17
    monkeypatch.setattr(gpu_host_phases, "PHASES", phases)
    for module, path in phases:  # undone by monkeypatch below: instrument sets them all
        owner, name = gpu_host_phases.owner_of(module, path)
        monkeypatch.setattr(owner, name, getattr(owner, name))
    totals, counts = collections.defaultdict(float), collections.Counter()
    gpu_host_phases.instrument(totals, counts)
    lattice, score_map = ctc._compile(np.array([2, 1]), np.array([1, 2, 3]), 0)
    assert lattice.num_sequences == 2
    assert counts == {"chainfb.ctc._compile": 1} and totals["chainfb.ctc._compile"] > 0


def test_host_ops_needs_a_gpu(monkeypatch, capsys):
    """benchmarks/gpu_host_ops.py (a GPU only) says so and exits where torch sees no CUDA device."""
    from benchmarks import gpu_host_ops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_host_ops.main(["--repeat", "3"])
    assert "needs a CUDA device" in capsys.readouterr().err
