"""Where a loss step's time goes on the GPU: ``torch.profiler`` over chainfb's CTC steps (the shapes of
``benchmarks/gpu_bench.py``, each beside torch's ``ctc_loss``, and again with new labels every step, as in
training: a graph compiled each step, with the labels on the device and on the host) and an RNN-T step, every
CUDA kernel of the process (torch's, CuPy's and chainfb's), every host-side op and the host's Python functions.

For each case: the step's device time (events, median of ``--repeat``), its host time (the clock around the Python
call, no synchronisation: the time the host needs to issue the step), and the step with a synchronisation at the
end; then one profiled step's kernels (name, calls, device ms) and host ops (name, calls, host ms), and cProfile's
Python functions over 5 steps (own and cumulative ms per step).  When the host time is near the synchronised time,
the GPU waits for the host: what the Python table shows is what to cut.  Written to ``--json FILE`` (after each
case) and, with ``--out DIR``, ``DIR/profile.json`` and ``DIR/profile.md``.

    python -m benchmarks.gpu_profile --out DIR [--only ctc,rnnt] [--repeat 10] [--deadline UNIX_TIME]
    PYTHONPATH=tests python -m benchmarks.gpu_profile --json FILE --emulate    # the CPU: the kernels' emulation

``--emulate`` runs the emulated benchmark's tiny CTC shapes on the CPU through the kernels' emulation (no CUDA
activity in the profiler): it checks the script; its times are not GPU times.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time

import torch

import chainfb

from ._gpu_place import make_place, until, write_json
from .gpu_bench import CTC_SHAPES, cycling_step, loss_step


def cases(place, only):
    """``(name, step)`` of the cases in ``only`` (``ctc``, ``rnnt``) on ``place``'s device."""
    import torch.nn.functional as F

    from chainfb.ctc import _compiled as ctc_cache  # the compiled graphs, per label set

    if "ctc" in only:
        for T, N, C, S in CTC_SHAPES["emulated" if place.emulated else "cuda"]:
            g = torch.Generator().manual_seed(T + S)
            lp = place.tensor(torch.randn(T, N, C, generator=g).log_softmax(-1))
            tg = place.tensor(torch.randint(1, C, (N, S), generator=g))
            il, tl = place.tensor(torch.full((N,), T)), place.tensor(torch.full((N,), S))
            name = f"ctc T={T} N={N} C={C} S={S}"
            yield name, loss_step(chainfb.ctc_loss, lp, tg, il, tl)
            yield name + " (torch)", loss_step(F.ctc_loss, lp, tg, il, tl)
            sets = [place.tensor(torch.randint(1, C, (N, S), generator=g)) for _ in range(2 * ctc_cache.size)]
            yield name + ", new labels each step", cycling_step(chainfb.ctc_loss, lp, sets, il, tl)
            # the same labels and lengths on the host (a data loader's): no read-back, so the compile can overlap
            yield name + ", new labels each step, on the host", cycling_step(
                chainfb.ctc_loss, lp, [t.cpu() for t in sets], il.cpu(), tl.cpu())
    if "rnnt" in only and not place.emulated:
        g = torch.Generator().manual_seed(1)
        B, T, U, V = 8, 400, 100, 500
        logits = place.tensor(torch.randn(B, T, U + 1, V, generator=g))
        tg = place.tensor(torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int32))  # blank: V - 1
        lt = place.tensor(torch.full((B,), T, dtype=torch.int32))
        lu = place.tensor(torch.full((B,), U, dtype=torch.int32))
        yield f"rnnt B={B} T={T} U={U} V={V}", loss_step(chainfb.rnnt_loss, logits, tg, lt, lu)


def time_step(place, step, repeat) -> dict:
    """``{"device_ms", "host_ms", "synced_ms"}``: medians over ``repeat`` steps of the events' time, the host's
    time to issue the step, and the time to its end with a synchronisation."""
    dev, host, synced = [], [], []
    for _ in range(repeat):
        place.sync()
        start, end = place.step_event(), place.step_event()
        start.record()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        end.record()
        place.sync()
        t2 = time.perf_counter()
        dev.append(end.elapsed_ms(start))
        host.append((t1 - t0) * 1e3)
        synced.append((t2 - t0) * 1e3)
    return dict(device_ms=statistics.median(dev), host_ms=statistics.median(host), synced_ms=statistics.median(synced))


def profile(place, step) -> tuple:
    """``(kernels, ops)`` of one profiled step: ``[name, calls, device ms]`` per device kernel and ``[name, calls,
    host ms, device ms]`` per host op, most time first."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    activities = [ProfilerActivity.CPU] + ([] if place.emulated else [ProfilerActivity.CUDA])
    with prof(activities=activities) as p:
        step()
        place.sync()
    kernels, ops = {}, {}
    for e in p.events():
        dev_us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0) or 0
        if "CUDA" in str(getattr(e, "device_type", "")):
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.time_range.elapsed_us() / 1e3
        else:
            o = ops.setdefault(e.name, [0, 0.0, 0.0])
            o[0] += 1
            o[1] += e.cpu_time_total / 1e3
            o[2] += dev_us / 1e3
    return (sorted(([n, c, round(ms, 4)] for n, (c, ms) in kernels.items()), key=lambda r: -r[2]),
            sorted(([n, c, round(ms, 4), round(d, 4)] for n, (c, ms, d) in ops.items()), key=lambda r: -r[2]))


def host_profile(place, step, n=5) -> list:
    """The host's Python functions over ``n`` steps (cProfile): ``[name, calls, own ms per step, cumulative ms per
    step]``, the 30 with the most own time."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        step()
    place.sync()
    pr.disable()
    st = pstats.Stats(pr)
    rows = [[f"{os.path.basename(f)}:{line}({fn})", nc, tt / n * 1e3, ct / n * 1e3]
            for (f, line, fn), (cc, nc, tt, ct, _) in st.stats.items()]
    return sorted(rows, key=lambda r: -r[2])[:30]


def markdown(result, device) -> list:
    """``profile.md``'s lines."""
    md = [f"# Where the step's time goes ({device})", ""]
    for r in result:
        md += [f"## {r['case']}", ""]
        if "error" in r:
            md += [f"failed: {r['error']}", ""]
            continue
        md += [f"device {r['device_ms']:.3f} ms, host issue {r['host_ms']:.3f} ms, with synchronisation "
               f"{r['synced_ms']:.3f} ms", "", "| kernel | calls | device ms |", "| --- | --- | --- |"]
        md += [f"| {n[:90]} | {c} | {ms:.4f} |" for n, c, ms in r["kernels"][:25]]
        md += ["", "| host op | calls | host ms (incl. children) |", "| --- | --- | --- |"]
        md += [f"| {n[:90]} | {c} | {ms:.4f} |" for n, c, ms, _ in r["ops"][:25]] + [""]
        md += ["| Python function | calls (5 steps) | own ms per step | cumulative ms per step |",
               "| --- | --- | --- | --- |"]
        md += [f"| {n[:90]} | {c} | {tt:.4f} | {ct:.4f} |" for n, c, tt, ct in r["python"]] + [""]
    return md


def run(place, only, repeat, deadline=math.inf, json_path=None, out=None) -> dict:
    """Profile every case of ``only`` on ``place`` (cases not started by ``deadline``, Unix time, are listed as
    skipped); ``{"device", "cases": [...], "skipped": [...]}``, written as it goes."""
    device = "the kernels' CPU emulation" if place.emulated else torch.cuda.get_device_name()
    result = dict(device=device, cases=[], skipped=[], current=None)

    def save():
        if json_path:
            write_json(json_path, result)
        if out:
            os.makedirs(out, exist_ok=True)
            write_json(os.path.join(out, "profile.json"), result)
            with open(os.path.join(out, "profile.md"), "w") as f:
                f.write("\n".join(markdown(result["cases"], device)) + "\n")

    for name, step in until(deadline, cases(place, only), result, json_path):
        scope = place.scope() if not name.endswith("(torch)") else contextlib.nullcontext()
        try:
            with scope:
                step()
                step()
                t = time_step(place, step, repeat)
                kernels, ops = profile(place, step)
                py = host_profile(place, step)
            result["cases"].append(dict(case=name, **t, kernels=kernels, ops=ops[:40], python=py))
            print(name, t, flush=True)
        except Exception as e:  # noqa: BLE001 -- recorded; the other cases still run
            result["cases"].append(dict(case=name, error=f"{type(e).__name__}: {e}"[:500]))
            print(name, "failed:", e, flush=True)
        save()
    save()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write profile.json and profile.md there")
    ap.add_argument("--json", help="write the results there")
    ap.add_argument("--only", default="ctc,rnnt")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--deadline", type=float, default=math.inf, help="Unix time after which no case starts")
    ap.add_argument("--emulate", action="store_true", help="tiny shapes on the CPU through the kernels' emulation")
    args = ap.parse_args(argv)
    if not (args.out or args.json):
        ap.error("give --out DIR or --json FILE")
    run(make_place(args.emulate), set(args.only.split(",")), args.repeat, args.deadline, args.json, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
