"""What one transducer loss call (forward + backward) costs on the kernel
route -- the route of CUDA logits: the score-map kernels of
``chainfb/cuda/transducer.cu`` around the engine kernels -- counted without
a GPU, for ``rnnt_loss``, ``multiblank_rnnt_loss`` (big blanks ``[2, 4]``)
and ``tdt_loss`` (durations ``[0, 1, 2, 3, 4]``).

Counted under the kernels' CPU emulation (``tests/emulation``, counting the
kernels' ``CHAINFB_WORK(chainfb::kWorkBytes, n)`` annotations), on a small batch with float32 logits after a warm-up
call:
the kernel launches, the torch operations that are not views (each one at
least one launch on a GPU) with the bytes of their tensors, and the bytes
each score-map kernel moves by its annotations next to the count of
:func:`map_bytes` (they must agree).  Then :func:`map_bytes` at the
benchmark shapes (``benchmarks/bench_transducer.py``'s batch: vocabulary 500,
LibriSpeech-like lengths, seed 0), against the bytes of the logits.

    python -m benchmarks.count_map_work [--batch 8] [--vocab 500] [--seed 0]

Bytes of a kernel: logits rows read, ``X`` / ``lse`` / posteriors read or
written, gradient written; the ``[B, U1, J]`` tables, re-read from cache
by every frame, are left out.
"""

from __future__ import annotations

import argparse
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {"rnnt": (), "multiblank [2, 4]": (2, 4), "tdt [0, 1, 2, 3, 4]": (0, 1, 2, 3, 4)}


def counting_backend():
    """The emulated kernels counting their work: ``(backend, take)``,
    ``take()`` the bytes annotated since the last call."""
    from ._emulation import emulation

    emu = emulation()
    be = emu.EmulatedBackend(emu.build(tempfile.mkdtemp(prefix="chainfb-work-")), count=True)
    seen = [0]

    def take():
        total = sum(s.work.get("kWorkBytes", 0) for s in be.stats[seen[0]:])
        seen[0] = len(be.stats)
        return total

    return be, take


def make_case(name, T, U, V, seed=0):
    """Float32 logits, targets and lengths for case ``name`` (T, U: ``[B]`` lengths)."""
    import numpy as np
    import torch

    durations = CASES[name]
    tdt = name.startswith("tdt")
    rng = np.random.default_rng(seed)
    B = len(T)
    width = V + len(durations) if tdt else V
    reserved = 1 if tdt else 1 + len(durations)
    logits = torch.from_numpy(rng.normal(size=(B, int(max(T)), int(max(U)) + 1, width)).astype(np.float32))
    targets = torch.from_numpy(rng.integers(0, V - reserved, (B, max(int(max(U)), 1))))
    return logits, targets, torch.as_tensor(T), torch.as_tensor(U), durations


def loss(name, x, targets, T, U, durations):
    import chainfb

    V = x.shape[-1] - (len(durations) if name.startswith("tdt") else 0)
    if name.startswith("tdt"):
        return chainfb.tdt_loss(x, targets, T, U, V - 1, list(durations), reduction="sum")
    if durations:
        return chainfb.multiblank_rnnt_loss(x, targets, T, U, V - 1, list(durations), reduction="sum")
    return chainfb.rnnt_loss(x, targets, T, U, blank=V - 1, reduction="sum")


def criterion_layout(name, U1, T, U, durations):
    """The compiled layout of case ``name`` for logits with ``U1`` label
    positions (what the loss compiles)."""
    import numpy as np

    from chainfb.transducer.graphs import compile_layout

    T, U = np.asarray(T, dtype=np.int64), np.asarray(U, dtype=np.int64)
    family = "tdt" if name.startswith("tdt") else "rnnt"
    return compile_layout(U, T, durations, umax=U1 - 1, family=family)


def map_bytes(layout, shape, item_in: int = 4, item_r: int = 4) -> dict:
    """Bytes the gather and the gradient kernel move for ``layout`` and
    logits of ``shape = (B, T, U1, V + D)`` (``item_in``, ``item_r``: the
    bytes of a logit and of the compute type): ``{kernel: (read, written)}``.

    Gather: the rows it reads (live, and read by some arc) once; ``X``
    whole (every column, every step); ``lse`` for every row.  Gradient:
    those rows and their ``lse`` and posteriors (one per arc read); the
    gradient whole."""
    import numpy as np

    B, T, U1, W = shape
    counts = layout.slot_counts()  # [B, U1, J]: the frames each arc is read at
    D = len(layout.durations) if layout.family == "tdt" else 0
    nrm = 2 if D else 1
    t = np.arange(T)
    read_at = (t[None, None, None, :] < counts[..., None]).any(axis=2)  # [B, U1, T]
    rows_read = int(read_at.sum())
    arcs_read = int(counts.sum())
    X = layout.num_steps * layout.lat.num_columns
    gather = (rows_read * W * item_in, X * item_r + B * T * U1 * nrm * item_r)
    grad = (rows_read * (W * item_in + nrm * item_r) + arcs_read * item_r, B * T * U1 * W * item_in)
    return {"transducer_gather": gather, "transducer_grad": grad}


def count_call(be, take, name, case):
    """Launches, torch operations and annotated bytes of one loss + backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ._emulation import emulation

    run_on = emulation().run_on

    x, targets, T, U, durations = case
    ops = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view:
                flat = [a for a in args if isinstance(a, torch.Tensor)]
                flat += [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
                ops.append((func.__name__, sum(a.numel() * a.element_size() for a in flat)))
            return out

    per_kernel = {}
    launch = be.launch

    def counted(kname, grid, block, args, **kw):
        launch(kname, grid, block, args, **kw)
        key = kname.split("<")[0].split("::")[-1]
        per_kernel[key] = per_kernel.get(key, 0) + take()

    be.launch = counted
    try:
        with run_on(be):
            xd = x.clone().requires_grad_()
            loss(name, xd, targets, T, U, durations).backward()  # warm-up: layouts compiled, tables uploaded
            before = len(be.launches)
            take()
            per_kernel.clear()
            xd = x.clone().requires_grad_()
            with Ops():
                loss(name, xd, targets, T, U, durations).backward()
    finally:
        be.launch = launch
    return [n for n, _, _ in be.launches[before:]], ops, per_kernel


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.batch < 1 or args.vocab < 8:
        ap.error("--batch must be >= 1 and --vocab >= 8")
    import numpy as np

    from .bench_transducer import draw_shapes

    be, take = counting_backend()
    T, U, V = np.array([9, 6, 3]), np.array([3, 1, 2]), 37
    print(f"# counted under the emulation: B={len(T)} T={T.tolist()} U={U.tolist()} V={V} float32, "
          f"loss + backward after a warm-up call")
    for name in CASES:
        case = make_case(name, T, U, V)
        names, ops, got = count_call(be, take, name, case)
        lay = criterion_layout(name, case[0].shape[2], T, U, case[4])
        want = {k: sum(v) for k, v in map_bytes(lay, tuple(case[0].shape)).items()}
        print(f"{name}: {len(names)} kernel launches ({', '.join(n.split('<')[0].split('::')[-1] for n in names)}); "
              f"{len(ops)} torch operations moving {sum(b for _, b in ops)} bytes "
              f"({', '.join(sorted(set(n for n, _ in ops)))})")
        for k in want:
            ok = "agrees" if got.get(k) == want[k] else "DIFFERS"
            print(f"    {k}: annotated {got.get(k)} bytes, counted {want[k]} ({ok})")
    rng = np.random.default_rng(args.seed)
    T, U = draw_shapes(rng, args.batch)
    print(f"# at the benchmark shapes: B={args.batch} V={args.vocab} T={T.tolist()} U={U.tolist()} float32 "
          f"(read + written, and as a multiple of the logits' bytes)")
    for name, durations in CASES.items():
        W = args.vocab + (len(durations) if name.startswith("tdt") else 0)
        shape = (args.batch, int(T.max()), int(U.max()) + 1, W)
        lay = criterion_layout(name, shape[2], T, U, durations)
        logits = int(np.prod(shape)) * 4
        parts = []
        for k, (r, w) in map_bytes(lay, shape).items():
            parts.append(f"{k} {r / 2**20:.1f} + {w / 2**20:.1f} MiB = {(r + w) / logits:.3f}x")
        print(f"{name}: logits {logits / 2**20:.1f} MiB; " + "; ".join(parts))


if __name__ == "__main__":
    main()
