"""Forward+backward time and peak memory of chainfb's RNN-T loss against
every installed peer (torchaudio, warprnnt_numba), measured in one run.

Shapes follow the transducer-loss-benchmarking suite (vocab 500,
LibriSpeech after 4x subsampling: T mean ~318 / max 680, U mean ~68 /
max 151), scaled down for a CPU: ``--batch`` utterances (default 8) drawn
with a fixed seed, padded to the batch maximum, reduction "sum", logits
float32 requiring grad; one step = loss + ``backward()``.

Memory
------
CPU: peak resident memory of the step *above the inputs*, read from Linux's
``VmHWM`` after resetting it (``echo 5 > /proc/self/clear_refs``) just
before the step; all methods run in this one process, one after another,
and torch returns big blocks to the OS, so each reading is that method's own
peak.  It includes the returned gradient (the size of the logits), so the
floor for any implementation is ~1x the logits.  CUDA (``--device cuda``):
``torch.cuda.max_memory_allocated`` above the inputs.

    python -m benchmarks.bench_transducer [--batch 8] [--repeat 3] [--device cpu|cuda]
    python -m benchmarks.bench_transducer --pruned [--repeat 3] [--s-range 5]

Floor: the same run also times passes over the logits tensor with
torch's threads: ``torch.mul(logits, c, out=new)`` with ``new`` freshly
allocated by NumPy (on this kind of machine much faster than torch's own
allocation of a large tensor, as NumPy asks for huge pages) -- read the
logits, write a new same-size gradient, the least a loss + backward that
returns a new gradient does (column ``x floor``: each method's time as a
multiple of it; measured before and after the methods, the faster reading
used, as freeing other large tensors can leave the kernel without huge
pages); the same
into preallocated, already touched memory (``out=grad``: the bare
bandwidth, column ``x bare``); and a plain read, ``logits.sum()``.

``--pruned`` times the loss part of a training step with a joiner
``Linear(H, V)(tanh(enc + dec))`` (H = 256, V = 500, B = 8, T <= 250,
U <= 71): torchaudio's full loss, chainfb's full loss (both on the 4-D
joiner output), and chainfb's pruned pipeline (simple loss of ``am =
Linear(H, V)(enc)``, ``lm = Linear(H, V)(dec)`` with its arc occupancies,
prune ranges, ``enc``/``dec`` pruned to the band, the joiner on ``[B, T,
s_range, H]``, the pruned loss; loss = 0.5 simple + pruned, then
``backward()``).  Each measurement runs in a fresh process (so each peak is
that method's own), methods interleaved; memory = growth of the peak
resident memory (``VmHWM``) during the step, above the inputs and weights.

    # the peers (torchaudio, warprnnt_numba) may need another torch version;
    # run the script from a separate virtual environment that has them, e.g.
    PYTHONPATH=$PWD venv-peers/bin/python -m benchmarks.bench_transducer

(The CTC benchmark is ``benchmarks/bench_ctc.py``.)
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch

import chainfb

from ._memory import reset_peak, status_bytes

warnings.filterwarnings("ignore")


def draw_shapes(rng, batch):
    """Utterance lengths like LibriSpeech after 4x subsampling (T mean ~318,
    max 680; U ~ 0.21 T, mean ~68, max 151)."""
    T = np.clip(rng.gamma(6.0, 318 / 6.0, batch), 40, 680).astype(int)
    U = np.clip(np.round(T * rng.normal(68 / 318, 0.03, batch)), 1, 151).astype(int)
    return T, U


def make_inputs(rng, T, U, V, device):
    B = len(T)
    logits = torch.randn(B, int(T.max()), int(U.max()) + 1, V, device=device, generator=None)
    targets = torch.from_numpy(rng.integers(1, V, (B, int(U.max())))).to(torch.int32).to(device)
    return (logits, targets, torch.from_numpy(T).to(torch.int32).to(device),
            torch.from_numpy(U).to(torch.int32).to(device))


def methods():
    out = {"chainfb": lambda x, y, t, u: chainfb.rnnt_loss(x, y, t, u, blank=0, reduction="sum")}
    try:
        import torchaudio.functional as taf

        out[f"torchaudio {__import__('torchaudio').__version__}"] = (
            lambda x, y, t, u: taf.rnnt_loss(x, y, t, u, blank=0, reduction="sum")
        )
    except Exception as e:  # noqa: BLE001
        print(f"# torchaudio not available: {type(e).__name__}: {e}")
    try:
        import warprnnt_numba

        loss = warprnnt_numba.RNNTLossNumba(blank=0, reduction="sum")
        out[f"warprnnt_numba {warprnnt_numba.__version__}"] = lambda x, y, t, u: loss(x, y, t, u)
    except Exception as e:  # noqa: BLE001
        print(f"# warprnnt_numba not available: {type(e).__name__}: {e}")
    return out




def bandwidth_floor(logits, repeat):
    """Median seconds of passes over the logits on this machine, now, with
    torch's threads: ``torch.mul(logits, c)`` into a new tensor (NumPy's
    allocation on the CPU) -- read the logits, write a new gradient of the
    same size (its pages faulted in and zeroed by the kernel, as every loss
    that returns a new gradient pays),
    the least any loss + backward must do; the same into preallocated
    (already touched) memory (``out=grad``, the bare bandwidth); and a plain
    read ``logits.sum()``."""
    grad = torch.empty_like(logits)
    grad.fill_(0.0)
    sync = torch.cuda.synchronize if logits.is_cuda else (lambda: None)
    out = {}
    def new_tensor():  # on the CPU the fastest new memory here: NumPy's (huge pages where the kernel has them)
        if logits.is_cuda:
            return torch.empty_like(logits)
        return torch.from_numpy(np.empty(tuple(logits.shape), dtype=torch.empty((), dtype=logits.dtype).numpy().dtype))

    for name, fn in (("read + write new", lambda: torch.mul(logits, 0.5, out=new_tensor())),
                     ("read + write", lambda: torch.mul(logits, 0.5, out=grad)), ("read", lambda: logits.sum())):
        fn()
        times = []
        for _ in range(max(repeat, 5)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def step(fn, inputs, device):
    x = inputs[0].detach().requires_grad_()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset_peak()
        base = status_bytes("VmRSS")
    t0 = time.perf_counter()
    loss = fn(x, *inputs[1:])
    loss.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() if device == "cuda" else status_bytes("VmHWM")) - base
    val = float(loss.sum())
    del x, loss
    return dt, peak, val


PRUNED_METHODS = ("torchaudio full", "chainfb full", "chainfb pruned")


def pruned_case(seed, batch=8, H=256, V=500, max_T=250, max_U=71):
    """Encoder / decoder outputs, targets, lengths and the joiner's layers."""
    rng = np.random.default_rng(seed)
    T, U = draw_shapes(rng, batch)
    T = np.minimum(T, max_T)
    U = np.clip(np.minimum(U, max_U), 1, None)
    torch.manual_seed(seed)
    enc = torch.randn(batch, int(T.max()), H)
    dec = torch.randn(batch, int(U.max()) + 1, H)
    targets = torch.from_numpy(rng.integers(1, V, (batch, int(U.max())))).to(torch.int32)
    layers = {k: torch.nn.Linear(H, V) for k in ("joiner", "am", "lm")}
    return enc, dec, targets, torch.from_numpy(T).to(torch.int32), torch.from_numpy(U).to(torch.int32), layers


def case_boundary(T, U):
    """k2's ``boundary [B, 4]`` (``[0, 0, U_b, T_b]`` rows) of a :func:`pruned_case` batch."""
    return torch.stack([torch.zeros_like(T), torch.zeros_like(T), U, T], 1).long()


def pruned_step(method, case, s_range):
    """One loss + backward of ``method``; returns the loss value."""
    from chainfb.transducer import prune, prune_ranges, pruned_rnnt_loss, simple_rnnt_loss

    enc, dec, targets, T, U, layers = case
    enc, dec = enc.detach().requires_grad_(), dec.detach().requires_grad_()
    if method == "chainfb pruned":
        am, lm = layers["am"](enc), layers["lm"](dec)
        simple, grads = simple_rnnt_loss(am, lm, targets, T, U, blank=0, reduction="sum", return_grad=True)
        boundary = case_boundary(T, U)
        ranges = prune_ranges(*grads, boundary, s_range)
        enc_p, dec_p = prune(enc, dec, ranges)
        logits = layers["joiner"](torch.tanh(enc_p + dec_p))
        loss = 0.5 * simple + pruned_rnnt_loss(logits, targets, ranges, T, U, blank=0, reduction="sum")
    else:
        logits = layers["joiner"](torch.tanh(enc[:, :, None, :] + dec[:, None, :, :]))
        if method == "torchaudio full":
            import torchaudio.functional as taf

            loss = taf.rnnt_loss(logits, targets, T, U, blank=0, reduction="sum")
        else:
            loss = chainfb.rnnt_loss(logits, targets, T, U, blank=0, reduction="sum")
    loss.backward()
    return float(loss)


def pruned_worker(args):
    """Measure one step of one method in this process; print 'time peak value'."""
    case = pruned_case(args.seed)
    pruned_step(args.worker, case, args.s_range)  # warm-up
    reset_peak()
    base = status_bytes("VmRSS")
    t0 = time.perf_counter()
    val = pruned_step(args.worker, case, args.s_range)
    dt = time.perf_counter() - t0
    print(f"{dt} {status_bytes('VmHWM') - base} {val}")


def run_pruned(args):
    import subprocess
    import sys

    enc, dec, targets, T, U, _ = pruned_case(args.seed)
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, B={len(T)} H=256 V=500 "
          f"s_range={args.s_range}")
    print(f"# T={T.tolist()} U={U.tolist()}; full logits {len(T)} x {int(T.max())} x {int(U.max()) + 1} x 500 "
          f"float32 = {len(T) * int(T.max()) * (int(U.max()) + 1) * 500 * 4 / 2**20:.0f} MiB")
    results = {m: [] for m in PRUNED_METHODS}
    for _ in range(args.repeat):
        for m in PRUNED_METHODS:
            r = subprocess.run([sys.executable, "-m", __spec__.name, "--pruned", "--worker", m,
                                "--seed", str(args.seed), "--s-range", str(args.s_range)],
                               capture_output=True, text=True)
            if r.returncode:
                last = (r.stderr.strip().splitlines() or ["?"])[-1]
                print(f"# {m} failed: {last}")
                continue
            dt, peak, val = r.stdout.split()[-3:]
            results[m].append((float(dt), int(peak), float(val)))
    ref = results["torchaudio full"]
    ref_t = statistics.median([r[0] for r in ref]) if ref else None
    ref_m = max(r[1] for r in ref) if ref else None
    print(f"{'method':18s} {'time s':>8s} {'peak growth MiB':>16s} {'loss':>12s}  vs torchaudio (time, memory)")
    for m, rs in results.items():
        if not rs:
            continue
        t, p, v = statistics.median([r[0] for r in rs]), max(r[1] for r in rs), rs[-1][2]
        rel = f"{t / ref_t:6.3f}x, {p / ref_m:6.3f}x" if ref else "(torchaudio not available)"
        print(f"{m:18s} {t:8.3f} {p / 2**20:16.0f} {v:12.2f}  {rel}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pruned", action="store_true", help="the pruned-pipeline comparison (see above)")
    ap.add_argument("--s-range", type=int, default=5)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--skip", default="", help="comma-separated name prefixes of methods to leave out")
    args = ap.parse_args()
    if args.pruned:
        return pruned_worker(args) if args.worker else run_pruned(args)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    T, U = draw_shapes(rng, args.batch)
    inputs = make_inputs(rng, T, U, args.vocab, args.device)
    nbytes = inputs[0].numel() * inputs[0].element_size()
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}")
    print(f"# B={args.batch} V={args.vocab} T={T.tolist()} U={U.tolist()}")
    print(f"# logits {tuple(inputs[0].shape)} float32 = {nbytes / 2**20:.0f} MiB; memory = peak above inputs")
    first = bandwidth_floor(inputs[0].detach(), args.repeat)  # before any method has fragmented memory
    rows = []
    skip = [p for p in args.skip.split(",") if p]
    for name, fn in methods().items():
        if any(name.startswith(p) for p in skip):
            continue
        try:
            step(fn, inputs, args.device)  # warm-up (JIT compilation, caches)
        except Exception as e:  # noqa: BLE001
            print(f"# {name} failed: {type(e).__name__}: {e}")
            continue
        times, peaks = [], []
        for _ in range(args.repeat):
            dt, peak, val = step(fn, inputs, args.device)
            times.append(dt)
            peaks.append(peak)
        rows.append((name, statistics.median(times), max(peaks), val))
    if not rows:
        return
    last = bandwidth_floor(inputs[0].detach(), args.repeat)
    floor = {k: min(first[k], last[k]) for k in first}  # the faster of the two readings: the stricter floor
    fresh, bare = floor["read + write new"], floor["read + write"]
    print(f"# floor readings before / after the methods (read + write new): {first['read + write new']:.3f} / "
          f"{last['read + write new']:.3f} s; the faster is used")
    print(f"# memory-bandwidth floor of the logits (median, same run): read + write a new same-size gradient "
          f"{fresh:.3f} s ({2 * nbytes / fresh / 1e9:.1f} GB/s); into preallocated memory {bare:.3f} s "
          f"({2 * nbytes / bare / 1e9:.1f} GB/s); read only {floor['read']:.3f} s "
          f"({nbytes / floor['read'] / 1e9:.1f} GB/s)")
    ref = rows[0]
    print(f"{'method':28s} {'time s':>8s} {'x floor':>7s} {'x bare':>6s} {'peak MiB':>9s} {'x logits':>8s} "
          f"{'cost':>14s}  chainfb speed-up / memory ratio")
    for name, t, p, v in rows:
        print(
            f"{name:28s} {t:8.3f} {t / fresh:7.2f} {t / bare:6.2f} {p / 2**20:9.0f} {p / nbytes:8.2f} {v:14.4f}  "
            f"{t / ref[1]:6.2f}x faster / {ref[2] / max(p, 1):5.2f}x memory"
        )
    for name, t, _, _ in rows[1:]:
        print(f"# chainfb / {name}: {ref[1] / t:.3f}x the time")


if __name__ == "__main__":
    main()
