"""Where a loss step's time goes on the GPU: ``torch.profiler`` over chainfb's CTC and RNN-T steps (the shapes of
``benchmarks/gpu_bench.py``), every CUDA kernel of the process (torch's, CuPy's and chainfb's) and every host-side op.

For each case: the step's device time (CUDA events, median of ``--repeat``), its host time (the clock around the
Python call, no synchronisation: the time the host needs to issue the step), and the step with a synchronisation
at the end; then one profiled step's kernels (name, calls, device ms) and host ops (name, calls, host ms), written
to ``--out DIR`` as ``profile.json`` and ``profile.md``.

    python -m benchmarks.gpu_profile --out DIR [--only ctc,rnnt] [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import chainfb

from .gpu_bench import CTC_SHAPES, loss_step


def cases(only):
    dev = torch.device("cuda")
    import torch.nn.functional as F

    if "ctc" in only:
        for T, N, C, S in CTC_SHAPES["cuda"]:
            g = torch.Generator().manual_seed(T + S)
            lp = torch.randn(T, N, C, generator=g).log_softmax(-1).to(dev)
            tg = torch.randint(1, C, (N, S), generator=g).to(dev)
            il, tl = torch.full((N,), T, device=dev), torch.full((N,), S, device=dev)
            name = f"ctc T={T} N={N} C={C} S={S}"
            yield name, loss_step(chainfb.ctc_loss, lp, tg, il, tl)
            yield name + " (torch)", loss_step(F.ctc_loss, lp, tg, il, tl)
    if "rnnt" in only:
        g = torch.Generator().manual_seed(1)
        B, T, U, V = 8, 400, 100, 500
        logits = torch.randn(B, T, U + 1, V, generator=g).to(dev)
        tg = torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int32).to(dev)  # blank: V - 1 (the default)
        lt = torch.full((B,), T, dtype=torch.int32, device=dev)
        lu = torch.full((B,), U, dtype=torch.int32, device=dev)
        yield f"rnnt B={B} T={T} U={U} V={V}", loss_step(chainfb.rnnt_loss, logits, tg, lt, lu)


def time_step(step, repeat):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dev, host, synced = [], [], []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        end.record()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        dev.append(start.elapsed_time(end))
        host.append((t1 - t0) * 1e3)
        synced.append((t2 - t0) * 1e3)
    return dict(device_ms=statistics.median(dev), host_ms=statistics.median(host), synced_ms=statistics.median(synced))


def profile(step):
    from torch.profiler import ProfilerActivity, profile as prof

    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        step()
        torch.cuda.synchronize()
    kernels, ops = {}, {}
    for e in p.events():
        dev_us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0) or 0
        kind = str(getattr(e, "device_type", ""))
        if "CUDA" in kind:
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


def host_profile(step, n=5) -> list:
    """The host's Python functions over ``n`` steps (cProfile): ``[name, calls, own ms per step, cumulative ms per
    step]``, the 30 with the most own time."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    rows = [[f"{os.path.basename(f)}:{line}({fn})", nc, tt / n * 1e3, ct / n * 1e3]
            for (f, line, fn), (cc, nc, tt, ct, _) in st.stats.items()]
    return sorted(rows, key=lambda r: -r[2])[:30]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="ctc,rnnt")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(","))
    result, md = [], [f"# Where the step's time goes ({torch.cuda.get_device_name()})", ""]
    for name, step in cases(only):
        try:
            step()
            step()
            t = time_step(step, args.repeat)
            kernels, ops = profile(step)
            py = host_profile(step)
        except Exception as e:  # noqa: BLE001 -- recorded; the other cases still run
            result.append(dict(case=name, error=f"{type(e).__name__}: {e}"))
            md += [f"## {name}", "", f"failed: {type(e).__name__}: {e}", ""]
            print(name, "failed:", e, flush=True)
            continue
        result.append(dict(case=name, **t, kernels=kernels, ops=ops[:40], python=py))
        md += [f"## {name}", "", f"device {t['device_ms']:.3f} ms, host issue {t['host_ms']:.3f} ms, "
               f"with synchronisation {t['synced_ms']:.3f} ms", "", "| kernel | calls | device ms |",
               "| --- | --- | --- |"]
        md += [f"| {n[:90]} | {c} | {ms:.4f} |" for n, c, ms in kernels[:25]]
        md += ["", "| host op | calls | host ms (incl. children) |", "| --- | --- | --- |"]
        md += [f"| {n[:90]} | {c} | {ms:.4f} |" for n, c, ms, _ in ops[:25]] + [""]
        md += ["| Python function | calls (5 steps) | own ms per step | cumulative ms per step |",
               "| --- | --- | --- | --- |"]
        md += [f"| {n[:90]} | {c} | {tt:.4f} | {ct:.4f} |" for n, c, tt, ct in py] + [""]
        print(name, t, flush=True)
        with open(os.path.join(args.out, "profile.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(args.out, "profile.md"), "w") as f:
            f.write("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
