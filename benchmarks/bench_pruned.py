"""Time of each part of the pruned RNN-T loss (k2 / fast_rnnt's recipe):
chainfb's :mod:`chainfb.compat.fast_rnnt` against ``fast_rnnt`` when it is
installed, measured in one run.

Shapes: LibriSpeech after 4x subsampling as ``benchmarks/bench_transducer.py
--pruned`` draws them (B = 8, V = 500, H = 256, T <= 250, U <= 71),
float32.  Each repeat draws a new batch for the parts and another for the
whole step, as a training loop meets a new batch every step, and both
methods run them; with ``--same-batch`` every repeat runs the first batch
again (chainfb then finds its per-batch plans -- layouts, score plans -- in
its caches).  ``am = Linear(H, V)(enc)``, ``lm = Linear(H, V)(dec)``, the
joiner ``Linear(H, V)(tanh(enc_p + dec_p))`` on the band.  The parts,
as icefall calls them:

- simple fwd: ``rnnt_loss_simple(lm, am, ..., return_grad=True)`` (the
  loss and the arc occupancies ``(px_grad, py_grad)``);
- simple bwd: ``simple_loss.backward()`` into ``am`` and ``lm``;
- prune ranges: ``get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range)``;
- do pruning: ``do_rnnt_pruning(enc, dec, ranges)``;
- pruned fwd: ``rnnt_loss_pruned(logits, ...)`` (``logits [B, T, s_range,
  V]``, a leaf that requires grad);
- pruned bwd: ``pruned_loss.backward()`` into the logits;
- whole step: all of the above with the joiner, ``loss = 0.5 * simple +
  pruned``, and ``backward()`` through the layers.

Methods are interleaved, each part's time is the median over ``--repeat``
runs (after one warm-up; ``--stat min`` for the least disturbed run on a
busy machine), with ``--threads`` torch and engine threads (default 2).

    PYTHONPATH=$PWD python -m benchmarks.bench_pruned [--repeat 7] [--threads 2] [--s-range 5] [--stat median|min]
        [--same-batch] [--recursion]

``--recursion`` times only ``mutual_information_recursion(px, py, boundary,
return_grad=True)`` (the grid's total and occupancies), every method on the
same ``(px, py)``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from chainfb.engines import set_num_threads as set_engine_threads

from .bench_transducer import case_boundary, pruned_case

warnings.filterwarnings("ignore")

PARTS = ("simple fwd", "simple bwd", "prune ranges", "do pruning", "pruned fwd", "pruned bwd", "whole step")


def methods():
    """``{name: module}`` with the k2 / fast_rnnt API: chainfb's, and fast_rnnt's when installed."""
    from chainfb.compat import fast_rnnt as ours

    out = {"chainfb": ours}
    try:
        import fast_rnnt

        out[f"fast_rnnt {getattr(fast_rnnt, '__version__', '?')}"] = fast_rnnt
    except Exception as e:  # noqa: BLE001
        print(f"# fast_rnnt not available ({type(e).__name__}: {e}): its rows are left out")
    return out


def _timed(times, part, fn):
    t0 = time.perf_counter()
    out = fn()
    times[part] = time.perf_counter() - t0
    return out


def parts(ft, case, s_range, timed=_timed):
    """One pass over the loss parts with the module ``ft``: ``{part: seconds}`` (``timed(times, part, fn)``
    runs ``fn``, stores its time in ``times[part]`` and returns its result)."""
    _timed = timed
    enc, dec, targets, T, U, layers = case
    symbols = targets.long()
    boundary = case_boundary(T, U)
    with torch.no_grad():
        am0, lm0 = layers["am"](enc), layers["lm"](dec)
    times = {}
    am, lm = am0.clone().requires_grad_(), lm0.clone().requires_grad_()
    simple, (px_grad, py_grad) = _timed(times, "simple fwd", lambda: ft.rnnt_loss_simple(
        lm=lm, am=am, symbols=symbols, termination_symbol=0, boundary=boundary, reduction="sum", return_grad=True))
    _timed(times, "simple bwd", simple.backward)
    ranges = _timed(times, "prune ranges", lambda: ft.get_rnnt_prune_ranges(px_grad, py_grad, boundary, s_range))
    e, d = enc.clone().requires_grad_(), dec.clone().requires_grad_()
    enc_p, dec_p = _timed(times, "do pruning", lambda: ft.do_rnnt_pruning(e, d, ranges))
    with torch.no_grad():
        logits = layers["joiner"](torch.tanh(enc_p + dec_p))
    logits.requires_grad_()
    pruned = _timed(times, "pruned fwd", lambda: ft.rnnt_loss_pruned(
        logits=logits, symbols=symbols, ranges=ranges, termination_symbol=0, boundary=boundary, reduction="sum"))
    _timed(times, "pruned bwd", pruned.backward)
    for layer in layers.values():
        layer.zero_grad(set_to_none=True)
    return times


def whole_step(ft, case, s_range):
    """One training step's loss and backward with the module ``ft``, through
    the layers: ``(seconds, loss value)``."""
    enc, dec, targets, T, U, layers = case
    symbols = targets.long()
    boundary = case_boundary(T, U)
    t0 = time.perf_counter()
    e, d = enc.clone().requires_grad_(), dec.clone().requires_grad_()
    am, lm = layers["am"](e), layers["lm"](d)
    simple, grads = ft.rnnt_loss_simple(lm=lm, am=am, symbols=symbols, termination_symbol=0,
                                        boundary=boundary, reduction="sum", return_grad=True)
    ranges = ft.get_rnnt_prune_ranges(grads[0], grads[1], boundary, s_range)
    enc_p, dec_p = ft.do_rnnt_pruning(e, d, ranges)
    logits = layers["joiner"](torch.tanh(enc_p + dec_p))
    loss = 0.5 * simple + ft.rnnt_loss_pruned(logits=logits, symbols=symbols, ranges=ranges,
                                              termination_symbol=0, boundary=boundary, reduction="sum")
    loss.backward()
    seconds = time.perf_counter() - t0
    for layer in layers.values():
        layer.zero_grad(set_to_none=True)
    return seconds, float(loss)


def recursion(ms, seed, repeat):
    """``{method: seconds}``: ``mutual_information_recursion(px, py, boundary,
    return_grad=True)`` alone, every method on the same ``(px, py)`` (the
    simple loss's, from chainfb), a new batch each repeat (median)."""
    from chainfb.compat import fast_rnnt as ours

    times = {m: [] for m in ms}
    for r in range(repeat + 1):
        enc, dec, targets, T, U, layers = pruned_case(seed + r)
        boundary = case_boundary(T, U)
        with torch.no_grad():
            px, py = ours.get_rnnt_logprobs(layers["lm"](dec), layers["am"](enc), targets.long(), 0,
                                            boundary=boundary)
        for name, mod in ms.items():
            a, b = px.clone().requires_grad_(), py.clone().requires_grad_()
            t0 = time.perf_counter()
            mod.mutual_information_recursion(a, b, boundary, return_grad=True)
            if r:
                times[name].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--s-range", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="each part's time over the repeats (min: least disturbed by other load)")
    ap.add_argument("--same-batch", action="store_true", help="every repeat runs the first batch again")
    ap.add_argument("--recursion", action="store_true",
                    help="time only the grid recursion with its occupancies, on the same (px, py) for every method")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    set_engine_threads(args.threads)
    ms = methods()
    if args.recursion:
        got = recursion(ms, args.seed, args.repeat)
        print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, mutual_information_recursion("
              f"px, py, boundary, return_grad=True), new batch each repeat, median of {args.repeat}")
        for name, sec in got.items():
            print(f"{name:16s} {sec:8.4f} s" + ("" if name == "chainfb" else f"  chainfb {got['chainfb'] / sec:.2f}x"))
        return
    case = pruned_case(args.seed)
    _, _, _, T, U, _ = case
    shapes = f"T={T.tolist()} U={U.tolist()}"
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, B={len(T)} H=256 V=500 "
          f"s_range={args.s_range}, float32; "
          + (f"every repeat {shapes}" if args.same_batch else f"new batches each repeat (first {shapes})"))
    results = {m: {p: [] for p in PARTS} for m in ms}
    values = {}
    step_case = case
    for r in range(args.repeat + 1):  # the first pass warms up
        if r and not args.same_batch:  # a new batch for the parts, another for the whole step
            case, step_case = pruned_case(args.seed + r), pruned_case(args.seed + args.repeat + r)
        for name, mod in ms.items():
            times = parts(mod, case, args.s_range)
            times["whole step"], values[name] = whole_step(mod, step_case, args.s_range)
            if r:
                for p in PARTS:
                    results[name][p].append(times[p])
    names = list(ms)
    peer = names[1] if len(names) > 1 else None
    stat = statistics.median if args.stat == "median" else min
    med = {m: {p: stat(results[m][p]) for p in PARTS} for m in names}
    print(f"# {args.stat} of {args.repeat} runs")
    head = f"{'part':14s} {'chainfb s':>10s}"
    if peer:
        head += f" {peer + ' s':>16s} {'ratio':>7s}"
    print(head)
    for p in PARTS:
        row = f"{p:14s} {med['chainfb'][p]:10.4f}"
        if peer:
            row += f" {med[peer][p]:16.4f} {med['chainfb'][p] / med[peer][p]:6.2f}x"
        print(row)
    print("# whole-step loss of the last batch: " + ", ".join(f"{m} {v:.3f}" for m, v in values.items()))
    if not peer:
        print("# fast_rnnt is not installed: no ratios (pip install fast_rnnt built against this torch)")


if __name__ == "__main__":
    main()
