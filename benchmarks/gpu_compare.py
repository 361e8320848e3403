"""GPU-vs-CPU checks: every criterion of chainfb on the same inputs on the device and on the CPU, values and
gradients compared, and the two 20,000-frame posterior-sum checks of ``tests/engines/test_engine.py`` on the device.

Criteria (the cases of ``benchmarks/_gpu_cases.py``): ``ctc_loss``, ``rnnt_loss`` (float32, float64, float16, bfloat16
logits), ``multiblank_rnnt_loss``, ``tdt_loss``, ``DenominatorGraph`` (shared-graph and per-sequence kernels),
``ChainLoss``, ``simple_rnnt_loss``, ``prune_ranges`` + ``pruned_rnnt_loss``, ``forced_align``, ``fst_loglike`` on
numerator graphs, ``forward_backward`` on graphs whose arcs span frames.  For each output: the largest absolute
difference, the same relative to the largest CPU magnitude, and pass when it is within the case's tolerance
(float32 rounding for float32 inputs, see ``_gpu_cases.tolerance``) and the infinities and NaNs sit at the same
places.

Long inputs (``--long-frames``, default 20000): a 50-phone numerator graph with scores in [-1e4, 1e4] (every
frame's posteriors sum to 1 within 1e-8) and a four-arc graph with the same extreme scores (within 1e-10, the
log-likelihood within 1e-12 relative of the CPU path's), float64.

    python -m benchmarks.gpu_compare [--json FILE] [--deadline UNIX_TIME] [--cpu-engine auto|numpy] [--emulate]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback

import torch

from ._gpu_place import json_number, make_place, until, write_json


def difference(dev, cpu, tol: float) -> dict:
    """``dev`` against ``cpu``: ``max_abs`` (over elements finite on both sides), ``rel`` (that over the largest
    finite ``|cpu|``), ``nonfinite_mismatch`` (elements where one side is finite and the other not, or where both are
    not finite and differ), ``ok`` (no such element and ``max_abs <= tol * max(1, max |cpu|)``)."""
    a = dev.detach().cpu().to(torch.float64)
    b = cpu.detach().cpu().to(torch.float64)
    if a.shape != b.shape:
        return dict(shape=list(b.shape), ok=False, note=f"shape {list(a.shape)} on the device, {list(b.shape)} on "
                                                        "the CPU")
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    mismatch = int(((fa != fb) | (~fa & ~fb & ~same)).sum())
    both = fa & fb
    d = (a - b).abs()[both]
    max_abs = float(d.max()) if d.numel() else 0.0
    scale = float(b[both].abs().max()) if d.numel() else 0.0
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    ok = mismatch == 0 and max_abs <= tol * max(1.0, scale)
    return dict(shape=list(b.shape), max_abs=max_abs, rel=json_number(rel), nonfinite_mismatch=mismatch, tol=tol,
                ok=ok)


def compare_case(place, name, case, tol) -> list:
    """Rows of one criterion: the case on the CPU (the reference) and on the device, output by output."""
    cpu = case(torch.as_tensor)
    with place.scope():
        dev = case(place.tensor)
        place.sync()
    return [dict(case=name, output=k, **difference(dev[k], cpu[k], tol)) for k in cpu]


def long_cases(frames: int) -> dict:
    """``{name: (fst, scores [1, T, P] float64, bound on |frame posterior sum - 1|, bound on the posteriors'
    difference from the CPU path's)}``: the two long checks of tests/engines/test_engine.py."""
    import numpy as np

    from chainfb import Fst
    from chainfb.testing import numerator_like_fst

    rng = np.random.default_rng(5)
    num = numerator_like_fst(rng, num_phones=50, num_pdfs=200)
    rng = np.random.default_rng(5)
    num_scores = rng.uniform(-1e4, 1e4, size=(1, frames, 200))
    rng = np.random.default_rng(5)
    four = Fst.from_arcs([(0, 0, 0, -0.1), (0, 1, 1, -2.0), (1, 1, 2, -0.05), (1, 0, 0, -3.0)], {1: 0.0})
    four_scores = rng.uniform(-1e4, 1e4, size=(1, frames, 3))
    return {f"numerator graph, T = {frames}": (num, num_scores, 1e-8, 1e-8),
            f"extreme scores, T = {frames}": (four, four_scores, 1e-10, 1e-9)}


def long_check(place, name, fst, scores, sum_bound, post_bound) -> list:
    import chainfb

    ll_c, post_c = chainfb.forward_backward(fst, torch.from_numpy(scores))
    with place.scope():
        ll, post = chainfb.forward_backward(fst, place.tensor(scores))
        place.sync()
    ll, post = ll.cpu(), post.cpu()
    worst = float((post[0].sum(-1) - 1.0).abs().max())
    rows = [dict(case=name, output="max |frame posterior sum - 1|", max_abs=worst, tol=sum_bound,
                 ok=bool(torch.isfinite(ll).all()) and worst <= sum_bound),
            dict(case=name, output="loglike vs CPU", **difference(ll, ll_c, 1e-12)),
            dict(case=name, output="posteriors vs CPU", **difference(post, post_c, post_bound))]
    rows[1]["ok"] = rows[1]["ok"] and bool(torch.isfinite(ll).all())
    return rows


def run(place, deadline: float, json_path: str | None, frames: int) -> dict:
    """Every criterion, then the long checks, until ``deadline`` (Unix time): the rest is listed as skipped."""
    from ._gpu_cases import CASES, tolerance

    items = [(name, lambda name=name, case=case: compare_case(place, name, case, tolerance(name)))
             for name, case in CASES.items()]
    items += [(name, lambda name=name, c=c: long_check(place, name, *c)) for name, c in long_cases(frames).items()]
    result = dict(mode=place.name, rows=[], errors=[], skipped=[], current=None)
    for name, item in until(deadline, items, result, json_path):
        t0 = time.perf_counter()
        try:
            rows = item()
        except Exception as e:  # noqa: BLE001 -- recorded, the other checks still run
            traceback.print_exc()
            result["errors"].append(dict(case=name, error=f"{type(e).__name__}: {e}"))
            continue
        for r in rows:
            r["seconds"] = time.perf_counter() - t0
        result["rows"] += rows
    result["ok"] = not result["errors"] and all(r["ok"] for r in result["rows"])
    if json_path:
        write_json(json_path, result)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the rows to this file (rewritten after every check)")
    ap.add_argument("--deadline", type=float, default=math.inf, help="Unix time after which no check starts")
    ap.add_argument("--long-frames", type=int, default=20000, help="frames of the long checks (default 20000)")
    ap.add_argument("--cpu-engine", choices=["auto", "numpy"], default="auto",
                    help="the CPU path's engine: what 'auto' picks (the compiled one with Numba), or NumPy's")
    ap.add_argument("--emulate", action="store_true", help="on the CPU through the kernels' emulation")
    args = ap.parse_args(argv)
    if args.cpu_engine == "numpy":
        from chainfb.engines import numba_log

        numba_log.numba = None
    result = run(make_place(args.emulate), args.deadline, args.json, args.long_frames)
    bad = [r for r in result["rows"] if not r["ok"]]
    for r in bad:
        print(f"gpu_compare: {r['case']}: {r['output']} differs: {r}", file=sys.stderr)
    for e in result["errors"]:
        print(f"gpu_compare: {e['case']}: {e['error']}", file=sys.stderr)
    print(f"gpu_compare: {len(result['rows'])} outputs compared, {len(bad)} differ, {len(result['errors'])} checks "
          f"failed, {len(result['skipped'])} skipped (time)")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
