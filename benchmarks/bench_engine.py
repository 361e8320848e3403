"""Forward+backward throughput of the engine, in arc-frames per second.

Cases: (a) 64 numerator-like graphs of ~300 arcs, T=150; (b) one
denominator-sized graph (3,000 states, 50,000 arcs) shared by 32 sequences,
T=150; (c) N=128 numerator-like graphs, T=150 (the GPU speed-up target:
>= 50x the NumPy path).  ``arc-frames`` = arcs of all sequences x frames.
``seconds`` times the public call ``chainfb.forward_backward`` (gather of
the used pdf columns, engine, scatter into a new dense ``[N, T, P]``
posterior array); on the CPU ``engine s`` times the engine alone.

    python -m benchmarks.bench_engine [--repeat 3] [--device cpu|cuda] [--cases abc]
                                 [--numpy-baseline] [--peak-gbps 3350]

On the CPU, cases (a) and (c) also print the throughput per CPU-second
(``time.process_time``, all threads) of the public call on the engine
``auto`` picks (the compiled one with Numba), min and median of
``--repeat`` calls (default at least 9 here, so a bimodal spread shows),
against Kaldi's per-sequence CPU numerator loop
(``GenericNumeratorComputation``): 21 M arc-frames per CPU-second, the
published figure for this kind of graph and machine (Kaldi is not run
here); the target is at most 0.8x Kaldi's time (>= 26.3 M).

With ``--device cuda`` and ``--numpy-baseline`` each case is also timed on
the NumPy path in the same run and the speed-up printed.  The roofline
column estimates the bytes the two kernels must move (forward: per arc and
frame the source alpha, weight, column score and two indices; backward: the
same twice over, once for beta and once for the column posteriors) and
divides by the time: compare it with the GPU's memory bandwidth
(``--peak-gbps``, e.g. 3350 for an H100 SXM, 4800 for an H200).
``--den``: the LF-MMI denominator at Kaldi's scale instead: a 4-gram phone-LM
graph (40 phones, chain topology: ~3,400 states, ~48,000 arcs, 80 pdfs)
shared by 128 sequences, T=150, leaky HMM 0.1.  On the CPU: the sparse
shared-graph engine (``shared``) and the log-domain engine (``numpy``); on
the GPU: the shared-graph kernels (``cuda_shared``, what ``"auto"`` picks)
and the per-sequence kernels (``cuda``), each compared with the CPU path
(largest differences of the log-likelihoods and of the posteriors).

    python -m benchmarks.bench_engine [--repeat 3] [--device cpu|cuda] [--den [--den-seqs 128]]

``--den --first-call``: the cost of a ``ChainLoss`` forward+backward on
that denominator (CPU) when its batch size is new, measured in fresh
processes: the first call's time against a steady call's (best of
``--repeat``) and their ratio, the time of a call after a change of ``N``
(``N - 1``), and the peak resident memory (``VmHWM`` of
``/proc/self/status``) grown above what the process held before the first
call -- after the first call, after a steady call (the peak reset first
where ``/proc/self/clear_refs`` allows it), and after ``N`` alternated
between ``N - 1`` and ``N`` five times.  Times are wall-clock and CPU
(``time.process_time``, all threads: less sensitive to other work on the
machine).  Two processes: a cold one (the first call also imports SciPy
and loads the compiled engine) and a warm one, where a small ChainLoss
(another graph, 4 sequences) ran first.

    python -m benchmarks.bench_engine --den --first-call [--den-seqs 128] [--repeat 3]
"""

import argparse
import time

import numpy as np

import chainfb
from chainfb.testing import denominator_like_fst, kaldi_sized_denominator, numerator_like_fst

from ._memory import reset_peak, status_bytes
from ._timing import call_times


def cases(rng, which, P=2000, T=150, sizes=(64, 32, 128), num_phones=50):
    """``(name, batch, T, P)`` of each case in ``which``; ``sizes``: the sequences of (a), (b), (c);
    ``num_phones``: of the numerator graphs (the defaults are the cases above)."""
    if "a" in which:
        graphs = [numerator_like_fst(rng, num_phones=num_phones, num_pdfs=P) for _ in range(sizes[0])]
        yield f"(a) {sizes[0]} numerator graphs", chainfb.FstBatch(graphs), T, P
    if "b" in which:
        den = denominator_like_fst(rng, num_pdfs=P)
        yield f"(b) 1 den graph x {sizes[1]} seqs", chainfb.FstBatch([den], np.zeros(sizes[1], dtype=np.int64)), T, P
    if "c" in which:
        graphs = [numerator_like_fst(rng, num_phones=num_phones, num_pdfs=P) for _ in range(sizes[2])]
        yield f"(c) N={sizes[2]} numerator graphs", chainfb.FstBatch(graphs), T, P


def run(batch, scores, lengths, repeat):
    """The least wall time of ``repeat`` public calls (after a warm-up call; the device synchronized)."""
    chainfb.forward_backward(batch, scores, lengths)  # warm-up (builds the lattice, compiles the kernels)
    return min(call_times(lambda: chainfb.forward_backward(batch, scores, lengths), repeat))


KALDI_NUM_MAF_PER_CPU_S = 21.0  # Kaldi's numerator loop, M arc-frames per CPU-second (published figure)


def cpu_throughput(batch, scores, lengths, arcs, T, repeat):
    """M arc-frames per CPU-second of ``repeat`` public calls: (min, median, max)."""
    rates = sorted(arcs * T / c / 1e6 for c in call_times(lambda: chainfb.forward_backward(batch, scores, lengths),
                                                          repeat, timer=time.process_time))
    return rates[0], rates[len(rates) // 2], rates[-1]


def run_engine(batch, scores, lengths, repeat):
    """The least time of ``repeat`` calls of the engine ``auto`` picks alone (CPU): forward+backward on the compact
    scores, without the gather from and the scatter into the ``[N, T, P]`` arrays."""
    from chainfb.engines import forward_backward
    from chainfb.lattice import Lattice
    from chainfb.score_map import PdfScoreMap

    lat = Lattice.of(batch)
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, scores)
    return min(call_times(lambda: forward_backward(lat, X, lengths), repeat))


def bytes_moved(arcs, T, real=8):
    """Rough lower bound of the engine's global-memory traffic (see the docstring)."""
    per_arc_frame = 3 * (2 * real + real + 2 * 4)  # alpha/beta + weight + score, two int32 indices; x3 passes
    return arcs * T * per_arc_frame


def den_case(rng, num_phones=40, num_utts=4000):
    """A Kaldi-sized denominator graph (:func:`chainfb.testing.kaldi_sized_denominator`)."""
    return kaldi_sized_denominator(rng, num_phones, num_utts)


def run_den(args):
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    den = den_case(rng)
    print(f"den graph: {den} (built in {time.perf_counter() - t0:.1f} s)")
    N, T = args.den_seqs, 150
    scores = rng.normal(size=(N, T, den.num_pdfs)).astype(np.float32)
    lengths = np.full(N, T)
    lengths[N // 2:] = T - rng.integers(0, 20, N - N // 2)
    engines = ["shared", "numpy"] if args.device == "cpu" else ["cuda_shared", "cuda"]
    head = f"{'engine':12s} {'seqs':>5s} {'frames':>6s} {'seconds':>8s} {'M arc-frames/s':>15s}"
    if args.device == "cuda":
        import torch

        ref_ll, ref_post = den.forward_backward(scores, lengths, 0.1)  # the CPU path
        scores = torch.from_numpy(scores).cuda()
        head += f" {'max |d ll| vs CPU':>18s} {'max |d post| vs CPU':>20s}"
    print(head)
    for eng in engines:
        def once(eng=eng):
            if args.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = den.forward_backward(scores, lengths, 0.1, engine=eng)
            if args.device == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t, out

        once()  # warm-up (builds the lattice / sparse matrices, compiles the kernels)
        runs = [once() for _ in range(args.repeat)]
        best = min(t for t, _ in runs)
        line = f"{eng:12s} {N:5d} {T:6d} {best:8.3f} {den.num_arcs * N * T / best / 1e6:15.1f}"
        if args.device == "cuda":
            ll, post = (a.cpu().numpy() for a in runs[-1][1])
            line += f" {np.abs(ll - ref_ll).max():18.3g} {np.abs(post - ref_post).max():20.3g}"
        print(line, flush=True)
    if args.device == "cpu":
        # the whole LF-MMI loss: numerators (the one engine) + denominator (shared path) + backward
        import torch

        from chainfb.chain import ChainLoss

        nums = chainfb.FstBatch([numerator_like_fst(rng, num_phones=30, num_pdfs=den.num_pdfs) for _ in range(N)])
        loss_fn = ChainLoss(den, leaky_hmm_coefficient=0.1)
        y = torch.from_numpy(scores).requires_grad_()

        def step():
            loss_fn(y, nums, lengths).backward()

        step()
        best = min(call_times(step, args.repeat))
        print(f"ChainLoss forward+backward ({N} numerator graphs of ~{nums.num_arcs // N} arcs + den): {best:.3f} s")




def first_call_worker(args):
    """In this (fresh) process: the first ChainLoss call, steady calls, N changes (see the docstring)."""
    import gc

    import torch

    from chainfb.chain import ChainLoss

    rng = np.random.default_rng(0)
    den = den_case(rng)
    N, T = args.den_seqs, 150
    scores = rng.normal(size=(N, T, den.num_pdfs)).astype(np.float32)
    lengths = np.full(N, T)
    lengths[N // 2:] = T - rng.integers(0, 20, N - N // 2)
    nums = [numerator_like_fst(rng, num_phones=30, num_pdfs=den.num_pdfs) for _ in range(N)]
    loss_fn = ChainLoss(den, leaky_hmm_coefficient=0.1)
    if args.warm:  # imports and compiled code loaded, no cache of this graph
        small = den_case(np.random.default_rng(1), num_phones=5, num_utts=50)
        ys = torch.from_numpy(rng.normal(size=(4, 20, small.num_pdfs)).astype(np.float32)).requires_grad_()
        warm_nums = chainfb.FstBatch([numerator_like_fst(rng, num_phones=5, num_pdfs=small.num_pdfs)
                                      for _ in range(4)])
        ChainLoss(small, den_engine="shared")(ys, warm_nums).backward()

    cpu = []

    def step(n):
        y = torch.from_numpy(scores[:n]).requires_grad_()
        t, c = time.perf_counter(), time.process_time()
        loss_fn(y, chainfb.FstBatch(nums[:n]), lengths[:n]).backward()
        cpu.append(time.process_time() - c)
        return time.perf_counter() - t

    gc.collect()
    base = status_bytes("VmRSS")
    reset_peak()
    first = step(N)
    cpu_first = cpu[-1]
    grow_first = status_bytes("VmHWM") - base
    steady = min(step(N) for _ in range(args.repeat))
    cpu_steady = min(cpu[-args.repeat:])
    gc.collect()
    before = status_bytes("VmRSS")
    reset = reset_peak()
    step(N)
    grow_steady = status_bytes("VmHWM") - before if reset else float("nan")
    change = step(N - 1)
    cpu_change = cpu[-1]
    alternate = [step(n) for _ in range(5) for n in (N - 1, N)]
    cpu_alternate = max(cpu[-10:])
    grow_all = status_bytes("VmHWM") - base
    mib = 2**20
    print(f"{'warm' if args.warm else 'cold'} process; den graph: {den}; ChainLoss forward+backward, N={N}, T={T}, "
          f"{args.repeat} steady calls")
    print(f"first call           {first:8.3f} s wall {cpu_first:8.3f} s CPU   peak RSS growth "
          f"{grow_first / mib:8.1f} MiB")
    print(f"steady call (best)   {steady:8.3f} s wall {cpu_steady:8.3f} s CPU   peak RSS growth "
          f"{grow_steady / mib:8.1f} MiB (one call, peak reset)")
    print(f"first / steady       {first / steady:8.2f}   wall {cpu_first / cpu_steady:8.2f}   CPU")
    print(f"N -> {N - 1} (first)     {change:8.3f} s wall {cpu_change:8.3f} s CPU")
    print(f"N {N - 1}/{N} x5 (max)    {max(alternate):8.3f} s wall {cpu_alternate:8.3f} s CPU   peak RSS growth "
          f"{grow_all / mib:8.1f} MiB (whole run, above the RSS before the first call)", flush=True)


def run_first_call(args):
    import subprocess
    import sys

    import os

    cmd = [sys.executable, "-m", __spec__.name, "--den", "--first-call", "--worker", "--den-seqs", str(args.den_seqs),
           "--repeat", str(args.repeat)]
    env = dict(os.environ)  # the child imports the chainfb this process imported
    root = os.path.dirname(os.path.dirname(os.path.abspath(chainfb.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    print(f"# chainfb from {root}", flush=True)
    for extra in ([], ["--warm"]):
        r = subprocess.run(cmd + extra, capture_output=True, text=True, env=env)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode:
            return r.returncode
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default="ab", help="which cases to run, e.g. abc (default ab)")
    ap.add_argument("--numpy-baseline", action="store_true", help="with --device cuda: also time the NumPy path")
    ap.add_argument("--peak-gbps", type=float, default=None, help="GPU memory bandwidth for the roofline fraction")
    ap.add_argument("--den", action="store_true", help="benchmark the LF-MMI denominator (Kaldi scale)")
    ap.add_argument("--den-seqs", type=int, default=128)
    ap.add_argument("--first-call", action="store_true",
                    help="with --den: first ChainLoss call vs steady ones, N changes, peak memory (fresh process)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.den and args.first_call:
        if args.device != "cpu":
            ap.error("--first-call: measured on the CPU only")
        return first_call_worker(args) if args.worker else run_first_call(args)
    if args.den:
        return run_den(args)
    rng = np.random.default_rng(0)
    head = f"{'case':28s} {'arcs':>9s} {'frames':>6s} {'seconds':>8s} {'M arc-frames/s':>15s}"
    if args.device == "cpu":
        head += f" {'engine s':>8s} {'engine M arc-frames/s':>21s}"
    if args.device == "cuda":
        head += f" {'GB/s (est)':>10s}" + (f" {'roofline':>8s}" if args.peak_gbps else "")
        head += f" {'numpy s':>8s} {'speed-up':>8s}" if args.numpy_baseline else ""
    print(head)
    kaldi = []
    for name, batch, T, P in cases(rng, args.cases):
        N = batch.num_sequences
        scores_np = rng.normal(size=(N, T, P)).astype(np.float32)
        lengths = np.full(N, T)
        scores = scores_np
        if args.device == "cuda":
            import torch

            scores = torch.from_numpy(scores_np).cuda()
        best = run(batch, scores, lengths, args.repeat)
        arcs = sum(batch.fsts[g].num_arcs for g in batch.seq_to_graph)
        line = f"{name:28s} {arcs:9d} {T:6d} {best:8.3f} {arcs * T / best / 1e6:15.1f}"
        if args.device == "cpu":
            eng = run_engine(batch, scores, lengths, args.repeat)
            line += f" {eng:8.3f} {arcs * T / eng / 1e6:21.1f}"
        if args.device == "cuda":
            gbps = bytes_moved(arcs, T) / best / 1e9
            line += f" {gbps:10.1f}"
            if args.peak_gbps:
                line += f" {gbps / args.peak_gbps:8.1%}"
            if args.numpy_baseline:
                base = run(batch, scores_np, lengths, max(1, args.repeat // 2))
                line += f" {base:8.3f} {base / best:7.1f}x"
        print(line, flush=True)
        if args.device == "cpu" and name[:3] in ("(a)", "(c)"):
            lo, med, hi = cpu_throughput(batch, scores, lengths, arcs, T, max(args.repeat, 9))
            kaldi.append(f"{name:28s} {lo:10.1f} {med:10.1f} {hi:10.1f} {KALDI_NUM_MAF_PER_CPU_S / med:10.2f}x")
    if kaldi:
        print(f"\nM arc-frames per CPU-second (time.process_time, {max(args.repeat, 9)} calls), vs Kaldi's numerator "
              f"loop: {KALDI_NUM_MAF_PER_CPU_S:.0f} M (published figure, Kaldi not run here); time ratio = Kaldi's "
              f"rate / ours (target <= 0.80x)")
        print(f"{'case':28s} {'min':>10s} {'median':>10s} {'max':>10s} {'time vs Kaldi':>11s}")
        print("\n".join(kaldi), flush=True)


if __name__ == "__main__":
    sys_exit = main()
    raise SystemExit(sys_exit or 0)
