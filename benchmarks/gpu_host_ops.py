"""What single operations of a GPU step cost the host: uploads, views, conversions between torch and CuPy,
allocations, a chainfb launch, small torch operations -- each the median of ``--repeat`` calls after 50 warm-up
ones, timed by the host clock without synchronising (the host's cost, not the device's).  A GPU only.

    python -m benchmarks.gpu_host_ops [--repeat 2000] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ._gpu_place import write_lines


def measure(fn, repeat: int) -> float:
    """The median microseconds of ``fn()`` over ``repeat`` calls after 50 warm-up ones."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def cases():
    """``(label, fn)`` pairs; the CuPy ones run inside chainfb's torch stream scope, as chainfb calls them."""
    import cupy

    from chainfb.cuda import interop, kernels

    dev = torch.device("cuda")
    x = torch.randn(500, 16, 500, device=dev)
    v = torch.randn(16, device=dev)
    host = np.arange(30000, dtype=np.int32)
    labels = torch.randint(1, 500, (16, 100), device=dev)
    pinned = torch.empty(30000, dtype=torch.int32).pin_memory()
    pageable = torch.from_numpy(host.copy())
    small = np.ones(16)
    be = kernels.cupy_backend()
    with interop.torch_stream(dev.index or 0):
        big = cupy.zeros((16, 500, 500), dtype=cupy.float32)
        buf = cupy.empty(30000 * 4, dtype=cupy.uint8)
        X, offs = cupy.zeros((500, 64), dtype=cupy.float32), cupy.zeros(64, dtype=cupy.int64)
        flat = cupy.zeros(500 * 16 * 500, dtype=cupy.float32)
    gather_args = [flat, np.int64(flat.size), np.int64(500), offs, np.int32(1), np.int32(64), np.int32(0),
                   np.float64(0), np.float64(0), X]
    on_stream = [
        ("cupy.asarray(host int32 [16])", lambda: cupy.asarray(host[:16])),
        ("cupy.asarray(host int32 [30000])", lambda: cupy.asarray(host)),
        ("a CuPy view over a buffer", lambda: cupy.ndarray((1000,), cupy.int32, buf.data + 4096)),
        ("torch.from_dlpack(CuPy [16, 500, 500])", lambda: torch.from_dlpack(big)),
        ("cupy_view(tensor [500, 16, 500])", lambda: interop.cupy_view(x)),
        ("cupy.zeros([16, 500, 500]) (torch's allocator)", lambda: cupy.zeros((16, 500, 500), dtype=cupy.float32)),
        ("cupy.empty(16)", lambda: cupy.empty(16, dtype=cupy.float32)),
        ("CupyBackend.launch pdf_gather (10 arguments, 1 block)",
         lambda: be.launch("chainfb::pdf_gather<float, float>", 1, 256, gather_args)),
    ]
    plain = [
        ("torch.zeros([500, 16, 500])", lambda: torch.zeros(500, 16, 500, device=dev)),
        ("torch negation [16]", lambda: -v),
        ("torch.dot [16]", lambda: torch.dot(v, v)),
        ("torch.tensor(host [16]).to(cuda, non_blocking=True)",
         lambda: torch.tensor(small, dtype=torch.float32).to(dev, non_blocking=True)),
        ("pinned [30000] int32 .to(cuda, non_blocking=True)", lambda: pinned.to(dev, non_blocking=True)),
        ("pageable [30000] int32 .to(cuda, non_blocking=True)", lambda: pageable.to(dev, non_blocking=True)),
        ("device labels .cpu() (a synchronisation)", lambda: labels.cpu()),
    ]
    return [(label, fn, True) for label, fn in on_stream] + [(label, fn, False) for label, fn in plain]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2000, help="timed calls of each operation")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    from chainfb.cuda import interop

    lines = []
    for label, fn, scoped in cases():
        if scoped:
            with interop.torch_stream(torch.cuda.current_device()):
                us = measure(fn, args.repeat)
        else:
            us = measure(fn, args.repeat)
        lines.append(f"{label:60s} {us:8.1f} us")
        print(lines[-1], flush=True)
    write_lines(args.out, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
