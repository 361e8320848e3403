"""Launch every kernel instantiation of chainfb at least once, through its public code paths, on tiny inputs: a
driver for compute-sanitizer (memcheck, racecheck, synccheck).

The kernels are those listed in ``chainfb.cuda.kernels.KERNELS``.  The driver runs

- the engines per real type (``chainfb.engines.cuda`` and ``chainfb.engines.cuda_shared`` on float32 and float64
  scores): graphs per sequence and one shared graph, arcs that span frames, the leaky HMM, and (on a device with
  thread block clusters, compute capability 9.0 on) each direction of a sequence over a cluster of 2, 4 and 8 blocks;
- the transducer score maps with a zero column (``chainfb.cuda.transducer_maps``, float32 and float64 logits);
- every criterion on the device (the cases of ``benchmarks/_gpu_cases.py``: CTC, RNN-T per logits dtype, multi-blank,
  TDT, the denominator on both engines, ChainLoss, the simple and pruned losses, forced alignment, numerator graphs,
  graphs with spanning arcs), which also reach the pdf score map's kernels (``pdf_map.cu``) for each pair of dtypes;

with the kernel backend wrapped so that every launch is counted by name.  It fails (exit status 1) naming each
listed kernel that no call reached and each call that raised; ``--json FILE`` writes what ran.

    python -m benchmarks.gpu_driver [--json FILE] [--no-pool] [--emulate]
    compute-sanitizer --tool memcheck --kernel-name kns=chainfb python -m benchmarks.gpu_driver --no-pool

``--no-pool``: device memory straight from the CUDA allocator (CuPy's pool off, torch's caching allocator off
through ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) and each lattice array in an allocation of its own (the backend's
``separate_arrays``), so that memcheck sees every array's own bounds.  ``--emulate``: the
same calls on the CPU through the kernels' emulation of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def _engine_calls(place):
    """``{name: call}``: the engines on each real type, lattice kind and leak (direct calls, the engine protocol
    with the kernel backend first)."""
    import numpy as np

    from chainfb import FstBatch, Lattice
    from chainfb.engines import cuda as per_sequence
    from chainfb.engines import cuda_shared
    from chainfb.testing import random_fst
    from ._gpu_cases import span_fsts

    rng = np.random.default_rng(20)
    plain = [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4) for _ in range(3)]
    spans = span_fsts()
    one = np.zeros(3, dtype=np.int64)
    lattices = {"graphs": Lattice.of(FstBatch(plain)), "shared graph": Lattice.of(FstBatch([plain[0]], one)),
                "graphs with spans": Lattice.of(FstBatch(spans)),
                "shared graph with spans": Lattice.of(FstBatch([spans[0]], one))}
    T = 7
    lengths = np.array([T, T - 2, 1])
    log_init = np.log(rng.dirichlet(np.ones(plain[0].num_states)))  # the shared graph's (the leaky HMM's)
    calls = {}
    for dtype in (np.float32, np.float64):
        for lname, lat in lattices.items():
            engines = [("cuda", per_sequence)] + ([("cuda_shared", cuda_shared)] if "shared" in lname else [])
            leaks = [None, (0.1, log_init)] if lname == "shared graph" else [None]
            for ename, module in engines:
                for leaky in leaks:
                    X = rng.normal(size=(T, lat.num_columns)).astype(dtype)
                    name = f"{ename} {np.dtype(dtype).name} {lname}" + (" leaky" if leaky else "")
                    calls[name] = _engine_call(place, module, lat, X, lengths, leaky)
            if "shared" not in lname and getattr(place.backend, "clusters", False):
                for K in per_sequence.CLUSTERS[1:]:
                    X = rng.normal(size=(T, lat.num_columns)).astype(dtype)
                    name = f"cuda {np.dtype(dtype).name} {lname}, clusters of {K}"
                    calls[name] = _engine_call(place, per_sequence, lat, X, lengths, None, K)
    return calls


def _engine_call(place, module, lat, X, lengths, leaky, cluster=1):
    def call():
        import numpy as np

        be = place.backend
        ll, post = module.forward_backward(be, lat, be.xp.asarray(X), lengths, leaky=leaky, cluster=cluster)
        ll, post = (a.get() if hasattr(a, "get") else np.asarray(a) for a in (ll, post))
        if np.isnan(ll).any() or np.isnan(post).any() or not np.isfinite(ll[0]):
            raise AssertionError(f"loglike {ll}: NaN or an impossible first sequence")

    return call


def _zero_column_calls(place):
    """The transducer score maps called directly with a zero column, on float32 and float64 logits."""
    import numpy as np
    import torch

    from .bench_transducer_maps import make_case
    from chainfb.cuda.transducer_maps import transducer_gather, transducer_grad

    calls = {}
    for dtype in (torch.float32, torch.float64):
        def call(dtype=dtype):
            rng = np.random.default_rng(21)
            B = 2
            kw, C, rows = make_case(rng, B, 6, 3, 8)
            logits = place.tensor(torch.randn(B, 6, 4, 8, generator=torch.Generator().manual_seed(21), dtype=dtype))
            X, lse = transducer_gather(place.backend, logits, num_rows=rows, num_columns=C + B,
                                       zero_col=np.arange(C, C + B), **kw)
            xp = place.backend.xp
            post = xp.asarray(np.abs(rng.normal(size=(rows, C + B))) * 0.01, dtype=X.dtype)
            grad = transducer_grad(place.backend, logits, post=post, lse=lse, scale=1.0,
                                   kind_weight=np.ones(kw["sym"].shape[2]), **kw)
            if not bool(torch.isfinite(grad).all()):
                raise AssertionError("a non-finite gradient")

        calls[f"transducer maps {str(dtype).replace('torch.', '')} with a zero column"] = call
    return calls


def run(place) -> dict:
    """Every call on ``place``; returns what ran and which listed kernels no call reached."""
    from chainfb.cuda.kernels import KERNELS
    from ._gpu_cases import CASES

    calls = {}
    calls.update(_engine_calls(place))
    calls.update(_zero_column_calls(place))
    calls.update({name: (lambda case=case: case(place.tensor)) for name, case in CASES.items()})
    counts = place.backend.counts
    cases = []
    with place.scope():
        for name, call in calls.items():
            before = dict(counts)
            t0 = time.perf_counter()
            try:
                call()
                place.sync()
                error = None
            except Exception as e:  # noqa: BLE001 -- recorded, the other calls still run
                error = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            cases.append(dict(name=name, ok=error is None, error=error, seconds=time.perf_counter() - t0,
                              kernels=sorted(k for k in counts if counts[k] != before.get(k, 0))))
    clusters = getattr(place.backend, "clusters", False)  # cluster.cu's kernels need them
    missing = [k for k in KERNELS if k not in counts and (clusters or KERNELS[k] != "cluster.cu")]
    return dict(mode=place.name, cases=cases, launches=dict(sorted(counts.items())), kernels=list(KERNELS),
                missing=missing, ok=not missing and all(c["ok"] for c in cases))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write what ran (calls, launches per kernel, kernels not reached) to this file")
    ap.add_argument("--no-pool", action="store_true", help="no memory pools (for memcheck)")
    ap.add_argument("--emulate", action="store_true", help="on the CPU through the kernels' emulation")
    args = ap.parse_args(argv)
    if args.no_pool:
        os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # read when torch first allocates on CUDA
    from ._gpu_place import make_place

    place = make_place(args.emulate)
    if args.no_pool:
        place.backend.separate_arrays = True  # each lattice array its own allocation (not one packed upload)
        if not place.emulated:
            import cupy

            cupy.cuda.set_allocator(None)
    result = run(place)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    for c in result["cases"]:
        if not c["ok"]:
            print(f"gpu_driver: {c['name']} failed: {c['error']}", file=sys.stderr)
    if result["missing"]:
        print(f"gpu_driver: kernels listed in chainfb.cuda.kernels.KERNELS that no call reached: "
              f"{', '.join(result['missing'])}", file=sys.stderr)
    n = sum(result["launches"].values())
    print(f"gpu_driver ({place.name}): {len(result['cases'])} calls, {n} launches of {len(result['launches'])} "
          f"kernels, {len(result['missing'])} of {len(result['kernels'])} listed kernels not reached: "
          f"{'ok' if result['ok'] else 'FAILED'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
