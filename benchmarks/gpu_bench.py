"""chainfb's losses on the GPU against a peer measured in the same run, with a per-kernel time breakdown.

Each case times one step (forward + backward, or the call named) with CUDA events on torch's current stream: a
warm-up, then the median of ``--repeat`` steps; peak memory is ``torch.cuda.max_memory_allocated`` above what was
allocated before (chainfb's CuPy work on torch tensors allocates from torch's caching allocator, so it is counted).
Then one more chainfb step runs with every kernel launch between a CUDA event pair: per kernel its launches and
device time, and (``--launches FILE``) every launch's name, grid, block, arguments' shapes and dtypes and scalar
values, so that the same launches can be set up again under the kernels' CPU emulation.

Benchmarks (shapes on the GPU; ``--emulate`` runs the same code on tiny shapes on the CPU, through the kernels'
emulation, and its times are not GPU times):

- ``ctc``: ``chainfb.ctc_loss`` vs ``torch.nn.functional.ctc_loss`` on the device, (T, N, C, S) = (500, 16, 500,
  100), (2000, 8, 100, 1000), (4000, 1, 5000, 3000), (150, 64, 5000, 50), float32 log-softmax outputs, reduction
  mean, each shape twice: the same targets every step (chainfb's compiled graph cached per targets, as in
  benchmarks/bench_ctc.py), and new targets every step, as in training (a graph compiled every step); and, on a
  device with thread block clusters, each shape of several sequences once more with the engine's default
  ``cluster="auto"`` (``chainfb.engines.cuda.auto_cluster``: one block where that suffices; emulated: clusters of 2);
- ``rnnt``: ``chainfb.rnnt_loss`` vs torchaudio's ``rnnt_loss`` (reduction sum, blank 0): B = 8, V = 500 with the
  LibriSpeech-like lengths of benchmarks/bench_transducer.py, and B = 32, T = 500, U = 100, V = 1024;
- ``durations``: ``tdt_loss`` (durations 0..4) and ``multiblank_rnnt_loss`` (big blanks [2, 4]) vs chainfb's own
  ``rnnt_loss`` on the same batch (B = 8, T = 200, U = 40, V = 256, benchmarks/bench_durations.py);
- ``denominator``: the LF-MMI denominator of benchmarks/bench_engine.py --den (a 4-gram phone-LM graph, 128 sequences
  of 150 frames, leaky HMM 0.1): the shared-graph kernels vs the per-sequence kernels, and vs the CPU path;
- ``numerators``: ``chainfb.forward_backward`` on benchmarks/bench_engine.py's cases (a) and (c) vs the CPU path;
- ``pruned``: the parts of the pruned RNN-T pipeline (benchmarks/bench_pruned.py: simple loss, prune ranges, pruning,
  pruned loss) vs fast_rnnt where it is installed, and the whole step vs torchaudio's full loss on the same joiner
  (benchmarks/bench_transducer.py --pruned).

    python -m benchmarks.gpu_bench [--only ctc,rnnt,...] [--repeat 5] [--json FILE] [--launches FILE]
                              [--deadline UNIX_TIME] [--emulate]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import pickle
import statistics
import time
import traceback

import numpy as np
import torch

import chainfb
from chainfb.engines import cuda as cuda_engine

from ._gpu_place import HostEvent, kernel_totals, make_place, until, write_json

#: (T, N, C, S) of the CTC cases, on the GPU and under the emulation
CTC_SHAPES = {"cuda": [(500, 16, 500, 100), (2000, 8, 100, 1000), (4000, 1, 5000, 3000), (150, 64, 5000, 50)],
              "emulated": [(12, 2, 6, 3), (9, 1, 5, 4)]}


def measure(place, step, repeat, host=False) -> dict:
    """A warm-up ``step()``, then ``repeat`` timed ones: ``{"ms": median, "runs": [...], "peak_bytes"}``
    (``host``: a CPU-side step, timed by the host clock, no device memory)."""
    step()
    runs = []
    base = place.reset_peak()
    for _ in range(repeat):
        if host:
            start, end = HostEvent(), HostEvent()
            start.record()
            step()
            end.record()
            runs.append(end.elapsed_ms(start))
        else:
            runs.append(place.timed_ms(step)[1])
    peak = None if host else place.peak_bytes(base)
    return dict(ms=statistics.median(runs), runs=runs, peak_bytes=peak)


def trace(place, step) -> list:
    """One more ``step()`` with every kernel launch traced (see :class:`_gpu_place.LaunchRecorder`)."""
    place.backend.start_trace()
    try:
        step()
        place.sync()
    finally:
        launches = place.backend.stop_trace()
    return launches


class Bench:
    """Collects the cases of one benchmark: each chainfb step measured, traced, and its peer measured."""

    def __init__(self, place, repeat, launches):
        self.place, self.repeat, self.launches = place, repeat, launches
        self.cases = []

    def case(self, bench, case, ours, peer_name, peer, host_peer=False, extra=None):
        """Measure ``ours`` (a chainfb step) and ``peer`` (a step, or a string saying why there is none)."""
        row = dict(case=case, peer_name=peer_name, **(extra or {}))
        for side, step, host in (("chainfb", ours, False), ("peer", peer, host_peer)):
            if isinstance(step, str):
                row[side] = dict(error=step)
                continue
            try:
                with self.place.scope() if not host else contextlib.nullcontext():  # a host peer: the CPU path
                    row[side] = measure(self.place, step, self.repeat, host)
                    if side == "chainfb":
                        launches = trace(self.place, step)
                        self.launches[f"{bench} / {case}"] = launches
                        row["kernels"] = kernel_totals(launches)
            except Exception as e:  # noqa: BLE001 -- recorded, the peer and the other cases still run
                traceback.print_exc()
                row[side] = dict(error=f"{type(e).__name__}: {e}"[:500])
        self.add(row)

    def add(self, row):
        """Append ``row`` with its ratios (chainfb / peer) where both sides were measured."""
        a, b = row["chainfb"], row["peer"]
        if "ms" in a and "ms" in b:
            row["time_ratio"] = a["ms"] / b["ms"]
            if a.get("peak_bytes") and b.get("peak_bytes"):
                row["memory_ratio"] = a["peak_bytes"] / b["peak_bytes"]
        self.cases.append(row)


def loss_step(loss_fn, x, *rest):
    """``step()``: ``loss_fn(leaf, *rest)`` summed and back-propagated, on a new leaf of ``x`` each time."""

    def step():
        leaf = x.detach().requires_grad_()
        loss_fn(leaf, *rest).sum().backward()

    return step


def cycling_step(loss_fn, x, target_sets, *rest):
    """:func:`loss_step` with the next of ``target_sets`` as the targets at each step."""
    turn = iter(range(2**62))

    def step():
        leaf = x.detach().requires_grad_()
        loss_fn(leaf, target_sets[next(turn) % len(target_sets)], *rest).sum().backward()

    return step


def bench_ctc(b, place, emulate):
    import torch.nn.functional as F

    from chainfb.ctc import _compiled as ctc_cache  # the compiled graphs, per label set

    for T, N, C, S in CTC_SHAPES["emulated" if emulate else "cuda"]:
        g = torch.Generator().manual_seed(T + S)
        lp = place.tensor(torch.randn(T, N, C, generator=g).log_softmax(-1))
        targets = place.tensor(torch.randint(1, C, (N, S), generator=g))
        il, tl = place.tensor(torch.full((N,), T)), place.tensor(torch.full((N,), S))
        b.case("ctc", f"T={T} N={N} C={C} S={S}", loss_step(chainfb.ctc_loss, lp, targets, il, tl),
               "torch.nn.functional.ctc_loss", loss_step(F.ctc_loss, lp, targets, il, tl))
        # as in training: other labels every step, so chainfb compiles a graph every step (more label sets
        # than its cache holds), both sides reading the same sets in the same order
        sets = [place.tensor(torch.randint(1, C, (N, S), generator=g)) for _ in range(2 * ctc_cache.size)]
        b.case("ctc", f"T={T} N={N} C={C} S={S}, new labels each step",
               cycling_step(chainfb.ctc_loss, lp, sets, il, tl),
               "torch.nn.functional.ctc_loss", cycling_step(F.ctc_loss, lp, sets, il, tl))
        # the same with the labels and lengths on the host, as a data loader gives them: nothing to read back from
        # the device, so the host's compile of a step can overlap the device's work of the step before.  Other label
        # sets than the case above: that case's sets are still in chainfb's cache, and would not be compiled again
        host_sets = [torch.randint(1, C, (N, S), generator=g) for _ in range(2 * ctc_cache.size)]
        il_h, tl_h = il.cpu(), tl.cpu()
        b.case("ctc", f"T={T} N={N} C={C} S={S}, new labels each step, on the host",
               cycling_step(chainfb.ctc_loss, lp, host_sets, il_h, tl_h),
               "torch.nn.functional.ctc_loss", cycling_step(F.ctc_loss, lp, host_sets, il_h, tl_h))
        # the same with the labels compiled ahead (chainfb.CtcTargets, as a DataLoader worker makes them; each
        # unpickled before the steps, as the main process receives them): one object a step, none reused
        ahead_sets = [torch.randint(1, C, (N, S), generator=g) for _ in range(b.repeat + 2)]
        ahead = [pickle.loads(pickle.dumps(chainfb.CtcTargets(y, tl_h, device="cuda"))) for y in ahead_sets]
        b.case("ctc", f"T={T} N={N} C={C} S={S}, new labels each step, compiled ahead",
               cycling_step(chainfb.ctc_loss, lp, ahead, il_h, tl_h),
               "torch.nn.functional.ctc_loss", cycling_step(F.ctc_loss, lp, ahead_sets, il_h, tl_h))
        if N > 1 and getattr(place.backend, "clusters", False):  # (one sequence: the shared-graph kernels)
            # the default is "auto"; on a GPU the row beside it is one block a direction, under the emulation (whose
            # tiny shapes take one block) two
            cluster = 2 if emulate else 1
            b.case("ctc", f"T={T} N={N} C={C} S={S}, cluster={cluster!r}",
                   engine_default(loss_step(chainfb.ctc_loss, lp, targets, il, tl), cluster),
                   "torch.nn.functional.ctc_loss", loss_step(F.ctc_loss, lp, targets, il, tl))


def engine_default(step, cluster):
    """``step`` run with the CUDA engine's default ``cluster`` set to ``cluster`` (put back after each call)."""

    def run():
        saved = cuda_engine.CLUSTER
        cuda_engine.CLUSTER = cluster
        try:
            step()
        finally:
            cuda_engine.CLUSTER = saved

    return run


def _torchaudio_rnnt():
    """torchaudio's ``rnnt_loss`` (reduction sum, blank 0), or why it is not available."""
    try:
        import torchaudio
        import torchaudio.functional as taf
    except Exception as e:  # noqa: BLE001
        return f"torchaudio not available: {type(e).__name__}: {e}", None
    return f"torchaudio {torchaudio.__version__} rnnt_loss", (
        lambda x, y, t, u: taf.rnnt_loss(x, y, t, u, blank=0, reduction="sum"))


def bench_rnnt(b, place, emulate):
    from .bench_transducer import draw_shapes, make_inputs

    peer_name, peer = _torchaudio_rnnt()

    def ours(x, y, t, u):
        return chainfb.rnnt_loss(x, y, t, u, blank=0, reduction="sum")

    rng = np.random.default_rng(0)
    if emulate:
        T, U, V = np.array([6, 4]), np.array([3, 2]), 8
    else:
        (T, U), V = draw_shapes(rng, 8), 500
    cases = [(f"B={len(T)} V={V} LibriSpeech-like (T max {T.max()}, U max {U.max()})", T, U, V)]
    B, Tm, Um, Vb = (2, 5, 3, 8) if emulate else (32, 500, 100, 1024)
    cases.append((f"B={B} T={Tm} U={Um} V={Vb}", np.full(B, Tm), np.full(B, Um), Vb))
    for name, T, U, V in cases:
        inputs = make_inputs(rng, T, U, V, place.device)
        b.case("rnnt", name, loss_step(ours, *inputs), peer_name, loss_step(peer, *inputs) if peer else peer_name)
        del inputs


def bench_durations(b, place, emulate):
    from .bench_durations import make_step

    B, T, U, V = (2, 6, 3, 10) if emulate else (8, 200, 40, 256)
    rnnt = make_step("rnnt", [], B, T, U, V, device=place.device)
    for kind, durations in (("tdt", [0, 1, 2, 3, 4]), ("multiblank", [2, 4])):
        b.case("durations", f"{kind} {durations}, B={B} T={T} U={U} V={V}",
               make_step(kind, durations, B, T, U, V, device=place.device), "chainfb rnnt_loss", rnnt)


def bench_denominator(b, place, emulate):
    from .bench_engine import den_case

    rng = np.random.default_rng(0)
    den = den_case(rng, num_phones=5, num_utts=50) if emulate else den_case(rng)
    N, T = (2, 6) if emulate else (128, 150)
    scores = rng.normal(size=(N, T, den.num_pdfs)).astype(np.float32)
    lengths = np.full(N, T)
    lengths[N // 2:] = T - rng.integers(0, min(20, T), N - N // 2)
    dev = place.tensor(scores)

    def on(engine, s):
        return lambda: den.forward_backward(s, lengths, 0.1, engine=engine)

    where = f"{den.num_states} states, {den.num_arcs} arcs, {N} seqs x {T} frames, leaky 0.1"
    b.case("denominator", f"shared-graph kernels vs per-sequence kernels; {where}", on("auto", dev),
           "chainfb per-sequence kernels (engine cuda)", on("cuda", dev))
    b.case("denominator", f"shared-graph kernels vs the CPU path; {where}", on("auto", dev),
           "chainfb CPU path (engine auto)", on("auto", scores), host_peer=True)


def bench_numerators(b, place, emulate):
    from .bench_engine import bytes_moved, cases

    rng = np.random.default_rng(0)
    kw = dict(P=20, T=8, sizes=(3, 0, 4), num_phones=3) if emulate else {}
    for name, batch, T, P in cases(rng, "ac", **kw):
        N = batch.num_sequences
        scores = rng.normal(size=(N, T, P)).astype(np.float32)
        lengths = np.full(N, T)
        dev = place.tensor(scores)
        arcs = sum(batch.fsts[g].num_arcs for g in batch.seq_to_graph)
        # each case runs now (b.case times it before the loop moves on); the loop's values bound all the same
        b.case("numerators", f"{name}, {arcs} arcs, T={T}",
               lambda batch=batch, dev=dev, lengths=lengths: chainfb.forward_backward(batch, dev, lengths),
               "chainfb CPU path (engine auto)",
               lambda batch=batch, scores=scores, lengths=lengths: chainfb.forward_backward(batch, scores, lengths),
               host_peer=True, extra=dict(arc_frames=arcs * T, estimated_bytes=bytes_moved(arcs, T)))


def _pruned_case(place, emulate):
    from .bench_transducer import pruned_case

    enc, dec, targets, T, U, layers = (pruned_case(0, batch=2, H=8, V=10, max_T=8, max_U=3) if emulate
                                       else pruned_case(0))
    for layer in layers.values():
        layer.to(place.device)
    return tuple(place.tensor(t) for t in (enc, dec, targets, T, U)) + (layers,)


def bench_pruned(b, place, emulate):
    from .bench_pruned import parts
    from .bench_transducer import pruned_step
    from chainfb.compat import fast_rnnt as ours

    case = _pruned_case(place, emulate)
    try:
        import fast_rnnt as peer_mod
        peer_name = f"fast_rnnt {getattr(peer_mod, '__version__', '?')}"
    except Exception as e:  # noqa: BLE001
        peer_mod, peer_name = None, f"fast_rnnt not available: {type(e).__name__}"

    def timed(times, part, fn):
        out, times[part] = place.timed_ms(fn)
        return out

    def part_times(mod):
        parts(mod, case, 5, timed)  # warm-up
        runs = [parts(mod, case, 5, timed) for _ in range(b.repeat)]
        return {p: statistics.median(r[p] for r in runs) for p in runs[0]}

    with place.scope():
        mine = part_times(ours)
    theirs = part_times(peer_mod) if peer_mod is not None else {}
    for p, ms in mine.items():
        b.add(dict(case=f"part: {p}", peer_name=peer_name, chainfb=dict(ms=ms),
                   peer=dict(ms=theirs[p]) if p in theirs else dict(error=peer_name)))
    ta_name, ta = _torchaudio_rnnt()
    b.case("pruned", "whole step (joiner, 0.5 simple + pruned loss, backward), s_range 5",
           lambda: pruned_step("chainfb pruned", case, 5), "torchaudio full loss, same joiner",
           (lambda: pruned_step("torchaudio full", case, 5)) if ta else ta_name)


BENCHMARKS = {"ctc": bench_ctc, "rnnt": bench_rnnt, "durations": bench_durations, "denominator": bench_denominator,
              "numerators": bench_numerators, "pruned": bench_pruned}


def run(place, only, repeat, deadline, json_path, launches_path) -> dict:
    """The benchmarks named in ``only``, each started only before ``deadline`` (Unix time)."""
    result = dict(mode=place.name, benchmarks=[], skipped=[], errors=[], current=None)
    launches = {}
    for name, bench in until(deadline, ((n, BENCHMARKS[n]) for n in only), result, json_path):
        b = Bench(place, repeat, launches)
        t0 = time.perf_counter()
        try:
            bench(b, place, place.emulated)
        except Exception as e:  # noqa: BLE001 -- recorded with the cases measured so far
            traceback.print_exc()
            result["errors"].append(dict(benchmark=name, error=f"{type(e).__name__}: {e}"[:500]))
        result["benchmarks"].append(dict(name=name, cases=b.cases, seconds=time.perf_counter() - t0))
        if launches_path:
            write_json(launches_path, launches)
    if json_path:
        write_json(json_path, result)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated, of {', '.join(BENCHMARKS)}")
    ap.add_argument("--repeat", type=int, default=5, help="timed steps per case after the warm-up (default 5)")
    ap.add_argument("--json", help="write the results to this file (rewritten after every benchmark)")
    ap.add_argument("--launches", help="write every traced kernel launch to this file")
    ap.add_argument("--deadline", type=float, default=math.inf, help="Unix time after which no benchmark starts")
    ap.add_argument("--emulate", action="store_true", help="tiny shapes on the CPU through the kernels' emulation")
    args = ap.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in BENCHMARKS]
    if unknown or args.repeat < 1:
        ap.error(f"--only: unknown {', '.join(unknown)}" if unknown else "--repeat: expected >= 1")
    result = run(make_place(args.emulate), only, args.repeat, args.deadline, args.json, args.launches)
    for bench in result["benchmarks"]:
        for c in bench["cases"]:
            mine, peer = c["chainfb"], c["peer"]
            print(f"{bench['name']:12s} {c['case'][:60]:60s} chainfb {mine.get('ms', math.nan):10.3f} ms  "
                  f"{c['peer_name'][:40]:40s} {peer.get('ms', math.nan):10.3f} ms")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
