"""Count torch <-> NumPy crossings of one CPU call (forward + backward) of
the public losses.

A crossing is a conversion between a torch tensor and host data: ``.numpy()``,
``torch.from_numpy``, ``torch.as_tensor`` / ``torch.tensor`` of a NumPy
array, ``.cpu()`` of a tensor not on the CPU (on a CPU tensor it returns
the tensor itself), ``.tolist()``, ``.item()``, and the reads of a tensor's
value by the host (``bool()``, ``float()``, ``int()``, ``np.asarray(t)``).
Each is counted by a wrapper installed around the torch function for the
duration of the call; inputs are built, and the graphs compiled (a warm-up
call fills the layout caches), before counting starts, so the numbers are
those of a steady-state training step.

    python -m benchmarks.count_crossings            # the table
    python -m benchmarks.count_crossings --where    # and where each crossing is made
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import traceback

import numpy as np
import torch

import chainfb
import chainfb.testing
from chainfb.chain import (
    DenominatorGraph, Topology, den_graph, estimate_phone_lm, numerator_graph, read_lexicon,
)


class Counter:
    """Counting wrappers around the torch <-> NumPy crossings."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.sites: collections.Counter = collections.Counter()
        self.active = False
        self._depth = 0

    def _hit(self, kind):
        if not self.active or self._depth:
            return
        self.counts[kind] += 1
        # the innermost chainfb line, and the caller of the shared helpers (_arrays, checks)
        lines = [f"{os.path.relpath(fr.filename)}:{fr.lineno}" for fr in reversed(traceback.extract_stack()[:-2])
                 if "chainfb" + os.sep in fr.filename]
        site = lines[0] if lines else "?"
        helpers = ("_arrays.py", "checks.py")
        if lines and site.split(":")[0].endswith(helpers):
            caller = next((ln for ln in lines if not ln.split(":")[0].endswith(helpers)), None)
            site += f" <- {caller}" if caller else ""
        self.sites[(kind, site)] += 1

    def _wrap(self, fn, kind, when=None):
        counter = self

        def wrapper(*args, **kwargs):
            if when is None or when(*args, **kwargs):
                counter._hit(kind)
            counter._depth += 1  # a crossing made inside another one is the same crossing
            try:
                return fn(*args, **kwargs)
            finally:
                counter._depth -= 1

        wrapper.__wrapped__ = fn
        return wrapper

    @contextlib.contextmanager
    def installed(self):
        is_np = lambda x, *a, **k: isinstance(x, np.ndarray)  # noqa: E731
        on_device = lambda t, *a, **k: t.device.type != "cpu"  # noqa: E731 -- .cpu() of a CPU tensor is itself
        patches = [
            (torch.Tensor, "numpy", ".numpy()", None),
            (torch.Tensor, "cpu", ".cpu() of a device tensor", on_device),
            (torch.Tensor, "tolist", ".tolist()", None),
            (torch.Tensor, "item", ".item()", None),
            (torch.Tensor, "__bool__", "bool(t)", None),
            (torch.Tensor, "__float__", "float(t)", None),
            (torch.Tensor, "__int__", "int(t)", None),
            (torch.Tensor, "__index__", "int(t)", None),
            (torch.Tensor, "__array__", "np.asarray(t)", None),
            (torch, "from_numpy", "torch.from_numpy", None),
            (torch, "as_tensor", "torch.as_tensor(ndarray)", is_np),
            (torch, "tensor", "torch.tensor(ndarray)", is_np),
        ]
        saved = []
        for owner, attr, kind, when in patches:
            had = attr in vars(owner)
            orig = getattr(owner, attr)
            saved.append((owner, attr, had, orig))
            setattr(owner, attr, self._wrap(orig, kind, when))
        try:
            yield self
        finally:
            for owner, attr, had, orig in reversed(saved):
                if had:
                    setattr(owner, attr, orig)
                else:
                    delattr(owner, attr)

    @contextlib.contextmanager
    def counting(self):
        self.counts.clear()
        self.sites.clear()
        self.active = True
        try:
            yield self
        finally:
            self.active = False


# ----------------------------------------------------------------- the calls
def ctc_case():
    g = torch.Generator().manual_seed(0)
    T, N, C = 30, 3, 6
    x = torch.randn(T, N, C, generator=g, dtype=torch.float64).log_softmax(-1).requires_grad_()
    targets = torch.tensor([[1, 2, 3, 1], [2, 2, 4, 0], [5, 1, 0, 0]])
    il = torch.tensor([30, 25, 20])
    tl = torch.tensor([4, 3, 2])
    return x, lambda: chainfb.ctc_loss(x, targets, il, tl)


def rnnt_case():
    g = torch.Generator().manual_seed(1)
    B, T, U, V = 3, 12, 4, 6
    x = torch.randn(B, T, U + 1, V, generator=g).requires_grad_()
    targets = torch.tensor([[1, 2, 3, 4], [2, 3, 1, 0], [5, 0, 0, 0]], dtype=torch.int32)
    Tb = torch.tensor([12, 10, 7], dtype=torch.int32)
    Ub = torch.tensor([4, 3, 1], dtype=torch.int32)
    return x, lambda: chainfb.rnnt_loss(x, targets, Tb, Ub, blank=0)


_LEX = ["a A B", "a A C", "b B", "c C A D", "d D", "SIL SIL"]
_PHONES = ["SIL", "A", "B", "C", "D"]


def chain_case():
    rng = np.random.default_rng(4)
    topo = Topology.chain()
    lm = estimate_phone_lm([list(rng.integers(0, 5, rng.integers(2, 12))) for _ in range(60)], 3, 2, 20)
    den = DenominatorGraph(den_graph(lm, topo), topo.num_pdfs(5))
    lex = read_lexicon(_LEX)
    nums = [numerator_graph(w, lex, topo, _PHONES, sil_prob=0.2) for w in (["a", "b"], ["c"], ["d", "a"])]
    loss = chainfb.ChainLoss(den, reduction="frame")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 25, den.num_pdfs, generator=g, dtype=torch.float64).requires_grad_()
    return x, lambda: loss(x, nums, lengths=torch.tensor([25, 20, 16]))


def fst_case():
    rng = np.random.default_rng(3)
    fsts = [chainfb.testing.random_fst(rng, num_states=5, num_arcs=12, num_pdfs=7, start=0) for _ in range(3)]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 20, 7, generator=g, dtype=torch.float64).requires_grad_()
    return x, lambda: chainfb.fst_loglike(x, fsts, torch.tensor([20, 15, 9])).sum()


CASES = {"ctc_loss": ctc_case, "rnnt_loss": rnnt_case, "ChainLoss": chain_case, "fst_loglike": fst_case}


def count(name: str, counter: Counter):
    """Crossings of one forward + backward of case ``name`` (after a warm-up call)."""
    x, call = CASES[name]()
    call().sum().backward()  # warm-up: compiled layouts cached
    x.grad = None
    with counter.counting():
        call().sum().backward()
    return collections.Counter(counter.counts), collections.Counter(counter.sites)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--where", action="store_true", help="list the source line of each crossing")
    ap.add_argument("cases", nargs="*", default=list(CASES), help=f"of {', '.join(CASES)}")
    args = ap.parse_args(argv)
    counter = Counter()
    rows = []
    with counter.installed():
        for name in args.cases:
            rows.append((name, *count(name, counter)))
    kinds = sorted({k for _, c, _ in rows for k in c})
    print(f"{'call (CPU, forward + backward)':32s} {'total':>5s}  by kind")
    for name, c, _ in rows:
        detail = ", ".join(f"{k} {c[k]}" for k in kinds if c[k])
        print(f"{name:32s} {sum(c.values()):5d}  {detail}")
    if args.where:
        for name, _, sites in rows:
            print(f"\n{name}:")
            for (kind, site), n in sorted(sites.items(), key=lambda kv: kv[0][1]):
                print(f"  {n} x {kind:24s} {site}")
    return rows


if __name__ == "__main__":
    main()
