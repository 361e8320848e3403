"""Small, fixed inputs for every criterion of chainfb, run through its public functions: the GPU-vs-CPU checks
(``benchmarks/gpu_compare.py``) run each case on the CPU and on the device and compare the outputs, and the kernel
driver (``benchmarks/gpu_driver.py``) runs them on the device (under compute-sanitizer).

A case is ``case(to) -> {name: tensor}``: it builds its inputs on the CPU from a fixed seed, places every tensor
input with ``to`` (identity for the CPU, ``Place.tensor`` for the device), runs the loss forward and backward and
returns the values and gradients (or alignments, posteriors) it produced, detached, on that device.
"""

from __future__ import annotations

import numpy as np
import torch

import chainfb
from chainfb import Fst
from chainfb.testing import denominator_like_fst, numerator_like_fst, random_fst


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _ints(values):
    return torch.tensor(values, dtype=torch.int64)


def _leaf(to, x):
    return to(x).detach().requires_grad_()


def ctc(to):
    """``ctc_loss`` (float32 log-softmax outputs, unequal lengths, a repeated label)."""
    g = _gen(1)
    T, N, C = 24, 3, 7
    x = _leaf(to, torch.randn(T, N, C, generator=g).log_softmax(-1))
    targets = _ints([[1, 2, 2, 5], [3, 4, 1, 0], [6, 6, 6, 6]])
    loss = chainfb.ctc_loss(x, to(targets), to(_ints([24, 17, 20])), to(_ints([4, 3, 4])), reduction="none")
    loss.sum().backward()
    return {"loss": loss.detach(), "grad": x.grad}


def _transducer_batch(V, extra=0, dtype=torch.float32, seed=2):
    g = _gen(seed)
    T, U = 9, 4
    logits = torch.randn(3, T, U + 1, V + extra, generator=g).to(dtype)
    return logits, _ints([9, 6, 7]), _ints([4, 2, 0])


def rnnt(dtype):
    """``rnnt_loss`` on ``dtype`` logits (float32, float64, float16, bfloat16: one kernel instantiation each)."""

    def case(to):
        logits, Tl, Ul = _transducer_batch(11, dtype=dtype)
        x = _leaf(to, logits)
        targets = to(_ints([[1, 2, 3, 4], [5, 5, 0, 0], [0, 0, 0, 0]]) + 1).int()
        loss = chainfb.rnnt_loss(x, targets, to(Tl).int(), to(Ul).int(), blank=0, reduction="none")
        loss.sum().backward()
        return {"loss": loss.detach(), "grad": x.grad}

    case.__doc__ = f"rnnt_loss, {str(dtype).replace('torch.', '')} logits"
    return case


def multiblank(to):
    """``multiblank_rnnt_loss``: big blanks of durations 2 and 3, sigma 0.05 (arcs that span frames)."""
    logits, Tl, Ul = _transducer_batch(10, seed=3)
    x = _leaf(to, logits)
    targets = to(_ints([[1, 2, 3, 4], [5, 5, 0, 0], [0, 0, 0, 0]]))
    loss = chainfb.multiblank_rnnt_loss(x, targets, to(Tl), to(Ul), 9, [2, 3], sigma=0.05, reduction="none")
    loss.sum().backward()
    return {"loss": loss.detach(), "grad": x.grad}


def tdt(to):
    """``tdt_loss``: durations 0..4 (arcs that span frames)."""
    logits, Tl, Ul = _transducer_batch(8, extra=5, seed=4)
    x = _leaf(to, logits)
    targets = to(_ints([[1, 2, 3, 4], [5, 5, 0, 0], [0, 0, 0, 0]]))
    loss = chainfb.tdt_loss(x, targets, to(Tl), to(Ul), 0, [0, 1, 2, 3, 4], reduction="none")
    loss.sum().backward()
    return {"loss": loss.detach(), "grad": x.grad}


def _den(num_pdfs=6):
    from chainfb.chain import DenominatorGraph

    return DenominatorGraph(denominator_like_fst(np.random.default_rng(5), num_states=12, num_arcs=60,
                                                 num_pdfs=num_pdfs), num_pdfs)


def denominator(engine):
    """``DenominatorGraph.forward_backward`` with the leaky HMM (0.1) on ``engine`` (auto: the shared-graph
    kernels on the device)."""

    def case(to):
        from chainfb.cuda import kernels

        den = _den()
        scores = to(torch.randn(4, 11, 6, generator=_gen(6)))
        eng = engine if kernels.on_device(scores) else "auto"  # the reference: the CPU path
        ll, post = den.forward_backward(scores, to(_ints([11, 9, 1, 6])), 0.1, engine=eng)
        return {"loglike": ll, "posteriors": post}

    case.__doc__ = f"DenominatorGraph.forward_backward, leaky 0.1, engine {engine!r} on the device"
    return case


def chain(to):
    """``ChainLoss`` (numerators + leaky denominator, reduction none)."""
    from chainfb.chain import ChainLoss

    rng = np.random.default_rng(7)
    nums = [numerator_like_fst(rng, num_phones=2, num_pdfs=6) for _ in range(3)]
    y = _leaf(to, torch.randn(3, 12, 6, generator=_gen(7)))
    loss = ChainLoss(_den(), leaky_hmm_coefficient=0.1, reduction="none")(y, nums, to(_ints([12, 10, 8])))
    loss.sum().backward()
    return {"loss": loss.detach(), "grad": y.grad}


def _grid_batch(to, seed):
    g = _gen(seed)
    am, lm = torch.randn(3, 8, 7, generator=g), torch.randn(3, 5, 7, generator=g)
    targets = to(_ints([[1, 2, 3, 4], [5, 5, 0, 0], [6, 1, 2, 0]]))
    return am, lm, targets, to(_ints([8, 6, 5])), to(_ints([4, 2, 3]))


def simple(to):
    """``simple_rnnt_loss`` with ``return_grad`` (loss, gradients, the arc occupancies)."""
    from chainfb.transducer import simple_rnnt_loss

    am, lm, targets, Tl, Ul = _grid_batch(to, 8)
    am, lm = _leaf(to, am), _leaf(to, lm)
    loss, (px_grad, py_grad) = simple_rnnt_loss(am, lm, targets, Tl, Ul, 0, reduction="none", return_grad=True)
    loss.sum().backward()
    return {"loss": loss.detach(), "grad_am": am.grad, "grad_lm": lm.grad, "px_grad": px_grad, "py_grad": py_grad}


def pruned(to):
    """``prune_ranges`` on the simple loss's occupancies and ``pruned_rnnt_loss`` (the same band, from the CPU, on
    both sides)."""
    from chainfb.transducer import boundary_from_lengths, prune_ranges, pruned_rnnt_loss, simple_rnnt_loss

    am, lm, targets, Tl, Ul = _grid_batch(torch.as_tensor, 9)
    _, grads = simple_rnnt_loss(am, lm, targets, Tl, Ul, 0, reduction="none", return_grad=True)
    bd = boundary_from_lengths(Tl, Ul)
    ranges = prune_ranges(*grads, bd, 3)
    dev_ranges = prune_ranges(*(to(t) for t in grads), to(bd), 3)
    logits = _leaf(to, torch.randn(3, 8, 3, 7, generator=_gen(9)))
    loss = pruned_rnnt_loss(logits, to(targets), to(ranges), to(Tl), to(Ul), 0, reduction="none")
    loss.sum().backward()
    return {"ranges": dev_ranges, "loss": loss.detach(), "grad": logits.grad}


def forced_align(to):
    """``forced_align`` (CTC Viterbi): alignments and their scores."""
    g = _gen(10)
    lp = to(torch.randn(2, 15, 6, generator=g).log_softmax(-1))
    ali, scores = chainfb.forced_align(lp, to(_ints([[1, 2, 2], [3, 4, 0]])), to(_ints([15, 11])),
                                       to(_ints([3, 2])))
    return {"alignment": ali, "scores": scores}


def fst_loglike(to):
    """``fst_loglike`` on numerator graphs (unequal lengths)."""
    rng = np.random.default_rng(11)
    fsts = [numerator_like_fst(rng, num_phones=3, num_pdfs=9) for _ in range(4)]
    s = _leaf(to, torch.randn(4, 14, 9, generator=_gen(11)))
    ll = chainfb.fst_loglike(s, fsts, to(_ints([14, 12, 9, 14])))
    ll.sum().backward()
    return {"loglike": ll.detach(), "grad": s.grad}


def span_fsts(seed=20, n=3, max_span=3) -> list:
    """Random acceptors whose arcs span 1..``max_span`` frames (self-loops among them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = random_fst(rng, num_states=4, num_arcs=9, num_pdfs=3, num_finals=2)
        span = rng.integers(1, max_span + 1, f.num_arcs)
        arcs = [(int(s), int(d), int(p), float(w), int(k)) for s, d, p, w, k in zip(f.src, f.dst, f.pdf, f.log_prob,
                                                                                     span)]
        finals = {int(s): float(w) for s, w in enumerate(f.final) if w > -np.inf}
        out.append(Fst.from_arcs(arcs, finals, start=f.start, num_states=f.num_states))
    return out


def spans(to):
    """``forward_backward`` over graphs whose arcs span 1..3 frames: one graph per sequence, and one graph shared
    by every sequence."""
    fsts = span_fsts()
    s = to(torch.randn(3, 10, 3, generator=_gen(12), dtype=torch.float64))
    lengths = to(_ints([10, 7, 9]))
    ll, post = chainfb.forward_backward(fsts, s, lengths)
    ll_shared, post_shared = chainfb.forward_backward(fsts[0], s, lengths)
    return {"loglike": ll, "posteriors": post, "loglike_shared": ll_shared, "posteriors_shared": post_shared}


#: name -> case, in the order of the report
CASES = {
    "ctc_loss": ctc,
    "rnnt_loss float32": rnnt(torch.float32),
    "rnnt_loss float64": rnnt(torch.float64),
    "rnnt_loss float16": rnnt(torch.float16),
    "rnnt_loss bfloat16": rnnt(torch.bfloat16),
    "multiblank_rnnt_loss": multiblank,
    "tdt_loss": tdt,
    "DenominatorGraph (cuda_shared)": denominator("auto"),
    "DenominatorGraph (cuda)": denominator("cuda"),
    "ChainLoss": chain,
    "simple_rnnt_loss": simple,
    "pruned_rnnt_loss": pruned,
    "forced_align": forced_align,
    "fst_loglike": fst_loglike,
    "forward_backward (spans)": spans,
}


def tolerance(name: str) -> float:
    """The largest difference a case's outputs may show, relative to ``max(1, max |CPU output|)``: float32
    rounding (2^-13, about a thousand float32 ulps) for float32 inputs; the input type's for half and bfloat16; 1e-9
    for float64."""
    if "bfloat16" in name:
        return 2.0 ** -6
    if "float16" in name:
        return 2.0 ** -9
    if "float64" in name or "spans" in name:
        return 1e-9
    return 2.0 ** -13
