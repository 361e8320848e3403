"""Time the transducer score-map kernels (fused log-softmax + gather, fused
gradient) and the fraction of the memory-bandwidth roofline they reach.

Shapes follow the transducer-loss-benchmarking / k2 setting: batch 30, vocab
500, LibriSpeech-like lengths (frames: mean ~318, max 680; labels: mean ~68,
max 151).  Bytes that must move: the live rows of the logits read twice (once
per kernel) and the whole gradient written once.

    python -m benchmarks.bench_transducer_maps --device cuda [--dtype float32|float16|bfloat16]
                                          [--repeat 5] [--peak-gbps 3350] [--family rnnt|multiblank|tdt]
    python -m benchmarks.bench_transducer_maps --device cpu   # tiny smoke run of the kernels' CPU emulation

``--family`` times the maps as a loss compiles them (``TransducerCriterion``
/ ``TDTCriterion``: its layout's tables, ``gather`` and ``finish`` on
fixed posteriors): RNN-T, multi-blank with big blanks ``[2, 4]``, TDT with
durations ``[0, 1, 2, 3, 4]`` (``V + 5`` logits); the bytes are then those
of ``benchmarks/count_map_work.py``'s ``map_bytes``.  Without it, the bare
kernels on RNN-T tables.

The engine pass between the two kernels is not included (it depends on the
transducer compiler); see benchmarks/bench_engine.py for the engine.
"""

import argparse
import time

import numpy as np


def make_case(rng, B, Tmax, Umax, V, M=0):
    from chainfb.transducer import symbol_table

    T_len = rng.integers(max(1, Tmax // 7), max(2, (Tmax * 4) // 5), B)
    U_len = rng.integers(max(0, Umax // 7), max(1, (Umax * 4) // 5), B)
    T_len[0], U_len[0] = Tmax, Umax
    U1 = Umax + 1
    colidx = -np.ones((B, U1, 2 + M), dtype=np.int32)
    c = 0
    for b in range(B):
        n = (U_len[b] + 1) * (2 + M) - 1  # no label column on the last row
        idx = np.arange(c, c + n + 1).reshape(U_len[b] + 1, 2 + M)
        colidx[b, : U_len[b] + 1] = idx
        colidx[b, U_len[b], 1] = -1
        c += n + 1
    targets = rng.integers(1, V - 1 - M, (B, Umax))
    sym = symbol_table(targets, U_len, U1, V - 1, [V - 2 - i for i in range(M)]).numpy()
    kw = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len)
    return kw, c, Tmax + Umax


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float16", "bfloat16", "float32", "float64"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batch", type=int, default=30)
    ap.add_argument("--max-frames", type=int, default=680)
    ap.add_argument("--max-labels", type=int, default=151)
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--peak-gbps", type=float, default=None, help="GPU memory bandwidth, e.g. 3350 (H100 SXM)")
    ap.add_argument("--family", default=None, choices=["rnnt", "multiblank", "tdt"],
                    help="time the maps as this loss compiles them")
    args = ap.parse_args(argv)
    import torch

    rng = np.random.default_rng(0)
    dtype = getattr(torch, args.dtype)
    import functools
    import types

    if args.device == "cpu":  # the kernels under their CPU emulation: a smoke run of the same code
        import tempfile

        from ._emulation import emulation  # the test suite's CPU emulation of the kernels

        emu = emulation()
        be = emu.EmulatedBackend(emu.build(tempfile.mkdtemp(prefix="chainfb-emu-")))
        B, Tmax, Umax, V = 2, 8, 4, 16
    else:
        from chainfb.cuda.kernels import cupy_backend

        be = cupy_backend()
        B, Tmax, Umax, V = args.batch, args.max_frames, args.max_labels, args.vocab
    if args.family:
        return run_family(args, be, B, Tmax, Umax, V)
    from chainfb.cuda import transducer_maps as tm

    impl = types.SimpleNamespace(transducer_gather=functools.partial(tm.transducer_gather, be),
                                 transducer_grad=functools.partial(tm.transducer_grad, be))
    kw, C, rows = make_case(rng, B, Tmax, Umax, V)
    kind_weight = np.ones(kw["sym"].shape[2])
    logits = torch.randn(B, Tmax, Umax + 1, V, dtype=torch.float32).to(dtype)
    if args.device == "cuda":
        logits = logits.cuda()
    post = np.abs(rng.normal(size=(rows, C))) * 0.01

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    X, lse = impl.transducer_gather(logits, num_rows=rows, num_columns=C, **kw)  # warm-up / compile
    if args.device == "cuda":
        import cupy

        post = cupy.asarray(post, dtype=X.dtype)
        torch.cuda.reset_peak_memory_stats()
    g = impl.transducer_grad(logits, post=post, lse=lse, scale=1.0, kind_weight=kind_weight, **kw)
    del g
    tg, tr = [], []
    for _ in range(args.repeat):
        sync()
        t0 = time.perf_counter()
        X, lse = impl.transducer_gather(logits, num_rows=rows, num_columns=C, **kw)
        sync()
        t1 = time.perf_counter()
        g = impl.transducer_grad(logits, post=post, lse=lse, scale=1.0, kind_weight=kind_weight, **kw)
        sync()
        t2 = time.perf_counter()
        del g
        tg.append(t1 - t0)
        tr.append(t2 - t1)
    item = logits.element_size()
    live = sum(int(kw["logit_lengths"][b]) * (int(kw["target_lengths"][b]) + 1) for b in range(B))
    need = 2 * live * V * item + logits.numel() * item
    best = min(a + b for a, b in zip(tg, tr))
    print(f"device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + f", logits {tuple(logits.shape)} {args.dtype}, live rows {live} of {B * Tmax * (Umax + 1)}")
    print(f"gather {min(tg) * 1e3:9.2f} ms   grad {min(tr) * 1e3:9.2f} ms   both {best * 1e3:9.2f} ms")
    gbps = need / best / 1e9
    line = f"bytes that must move {need / 1e9:.2f} GB -> {gbps:.1f} GB/s"
    if args.peak_gbps:
        line += f" = {gbps / args.peak_gbps:.1%} of {args.peak_gbps:.0f} GB/s"
    print(line)
    if args.device == "cuda":
        print(f"peak memory allocated by torch {torch.cuda.max_memory_allocated() / 1e9:.2f} GB "
              f"(CuPy's pool: {cupy.get_default_memory_pool().total_bytes() / 1e9:.2f} GB)")


def run_family(args, be, B, Tmax, Umax, V):
    """Time ``gather`` and ``finish`` of the criterion ``args.family``
    compiles, on the kernel backend ``be``."""
    import torch

    from .count_map_work import CASES, map_bytes

    from chainfb.transducer import TDTCriterion, TransducerCriterion

    rng = np.random.default_rng(0)
    kw, _, _ = make_case(rng, B, Tmax, Umax, V)
    Tl, Ul = kw["logit_lengths"].astype(np.int64), kw["target_lengths"].astype(np.int64)
    durations = [d for name, d in CASES.items() if name.startswith(args.family)][0]
    tdt = args.family == "tdt"
    width = V + len(durations) if tdt else V
    targets = torch.from_numpy(rng.integers(0, V - 1 - len(durations), (B, Umax)))
    logits = torch.randn(B, Tmax, Umax + 1, width, dtype=torch.float32).to(getattr(torch, args.dtype))
    if args.device == "cuda":
        logits, targets = logits.cuda(), targets.cuda()
    shape = tuple(logits.shape)
    if tdt:
        crit = TDTCriterion(shape, targets, Tl, Ul, V - 1, durations, sigma=0.05)
    else:
        crit = TransducerCriterion(shape, targets, Tl, Ul, V - 1, durations, sigma=0.05 if durations else 0.0)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    if args.device == "cuda":
        from chainfb.cuda.interop import torch_stream

        where = torch_stream(logits.device.index)
    else:  # the emulated kernels for every score map (tests/ is on the path, see main)
        from ._emulation import emulation

        where = emulation().run_on(be)
    with where:
        X = crit.gather(logits)  # warm-up: compiles, uploads the tables
        xp = be.xp
        post = xp.asarray(np.abs(rng.normal(size=X.shape)) * 0.01, dtype=X.dtype)
        loglike = xp.zeros(B, dtype=X.dtype)
        crit.finish(logits, loglike, post)
        tg, tr = [], []
        for _ in range(args.repeat):
            sync()
            t0 = time.perf_counter()
            crit.gather(logits)
            sync()
            t1 = time.perf_counter()
            crit.finish(logits, loglike, post)
            sync()
            tg.append(t1 - t0)
            tr.append(time.perf_counter() - t1)
    item = logits.element_size()
    nb = map_bytes(crit.layout, shape, item, np.dtype(X.dtype).itemsize)
    print(f"device {args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + f", {args.family} logits {shape} {args.dtype}")
    for name, t in (("transducer_gather", min(tg)), ("transducer_grad", min(tr))):
        moved = sum(nb[name])
        line = f"{name:18s} {t * 1e3:9.3f} ms  {moved / 2**20:9.1f} MiB -> {moved / t / 1e9:7.1f} GB/s"
        if args.peak_gbps:
            line += f" = {moved / t / 1e9 / args.peak_gbps:.1%} of {args.peak_gbps:.0f} GB/s"
        print(line)


if __name__ == "__main__":
    main()
