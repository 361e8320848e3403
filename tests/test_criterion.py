"""The criterion seam's contract (chainfb.criterion.apply): the gradients a
criterion's ``finish`` gives -- per-sequence rows of a batch-first input, or
per-sequence gradients of an input shared by the batch -- and what apply
makes of them."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb.criterion import Criterion, DeferredGrad, apply

FST = chainfb.Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 2, 0.0)], finals={1: 0.0})


class Biased(Criterion):
    """Pdf graphs over ``scores [N, T, P] + bias [P]``: ``bias`` is one
    parameter shared by every sequence.  ``per_sequence``: ``finish`` gives
    its gradient per sequence ``[N, P]`` (else summed, ``[P]``)."""

    def __init__(self, shape, lengths, per_sequence=True):
        self.pdf = chainfb.PdfCriterion(FST, shape, lengths)
        self.lattice, self.lengths = self.pdf.lattice, self.pdf.lengths
        self.per_sequence = per_sequence

    def gather(self, x, need_grad=True):
        scores, bias = x
        self.y = (scores + bias).detach()
        return self.pdf.gather(self.y, need_grad)

    def finish(self, x, loglike, post):
        value, g = self.pdf.finish(self.y, loglike, post)
        if g is None:
            return value, None
        g_bias = g.sum(dim=1)  # [N, P]: d value[n] / d bias
        return value, (g, g_bias if self.per_sequence else g_bias.sum(dim=0))


def _inputs():
    rng = np.random.default_rng(3)
    scores = torch.from_numpy(rng.normal(size=(4, 5, 3))).requires_grad_()  # [N, T, P]
    bias = torch.from_numpy(rng.normal(size=3)).requires_grad_()
    return scores, bias


@pytest.mark.parametrize("weights", [None, [1.0, -2.0, 0.5, 3.0], [1.0, float("inf"), 2.0, -1.0]])
def test_a_parameter_shared_by_the_batch(weights):
    """Its gradient is the sum over sequences of ``grad_out[n] * d value[n] /
    d bias`` (a non-finite ``grad_out[n]`` counting as 0), as autograd gives
    through the broadcast ``scores + bias``."""
    lengths = [5, 4, 2, 5]
    scores, bias = _inputs()
    w = torch.ones(4, dtype=torch.float64) if weights is None else torch.tensor(weights, dtype=torch.float64)
    apply((scores, bias), Biased(scores.shape, lengths)).backward(w)
    s2, b2 = (t.detach().clone().requires_grad_() for t in (scores, bias))
    torch.autograd.backward(chainfb.fst_loglike(s2 + b2, FST, lengths), torch.where(torch.isfinite(w), w, 0.0))
    torch.testing.assert_close(scores.grad, s2.grad)
    torch.testing.assert_close(bias.grad, b2.grad)
    assert torch.autograd.gradcheck(lambda s, b: apply((s, b), Biased(s.shape, lengths)), (scores, bias))
    # with create_graph=True (the first derivative, tied for a second one)
    (gs, gb) = torch.autograd.grad((apply((scores, bias), Biased(scores.shape, lengths)) * w.nan_to_num(0, 0, 0)).sum(),
                                   (scores, bias), create_graph=True)
    torch.testing.assert_close(gb.detach(), b2.grad)


def test_a_summed_gradient_of_a_shared_parameter_is_refused():
    """A gradient that is neither batch-first like its input nor per
    sequence cannot be scaled per sequence: a clear error when the
    criterion runs, not a torch size error in backward."""
    scores, bias = _inputs()
    with pytest.raises(ValueError, match=r"Biased\.finish: the gradient of input 1 .*\(3,\).*per-sequence .*\(4, 3\)"):
        apply((scores, bias), Biased(scores.shape, [5, 4, 2, 5], per_sequence=False))


def test_pdf_gradient_scaled_without_reading_the_host(monkeypatch):
    """A pdf criterion's backward (CTC here) scales its gradient by the incoming gradient without reading a
    tensor's value on the host (on a GPU that read is a synchronisation that stalls the step)."""
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(8, 3, 6, generator=g, dtype=torch.float64).log_softmax(-1).requires_grad_()
    targets, il, tl = torch.tensor([[1, 2], [3, 3], [4, 0]]), [8, 7, 6], [2, 2, 1]
    weights = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)
    loss = (chainfb.ctc_loss(lp, targets, il, tl, reduction="none") * weights).sum()

    def no_host_value(self):
        raise AssertionError("a tensor's value was read on the host in backward")

    monkeypatch.setattr(torch.Tensor, "__bool__", no_host_value)
    (got,) = torch.autograd.grad(loss, lp)
    monkeypatch.undo()
    # the same gradient from the unscaled one: -posteriors of each sequence times its weight
    (unit,) = torch.autograd.grad(chainfb.ctc_loss(lp, targets, il, tl, reduction="sum"), lp)
    assert torch.allclose(got, unit * weights.view(1, -1, 1), rtol=0, atol=1e-15)
    outside = torch.ones_like(got, dtype=torch.bool)
    for n, row in enumerate(targets.tolist()):
        outside[:, n, [0, *row[: tl[n]]]] = False
    assert (got[outside] == 0).all()


def test_pdf_gradient_is_written_in_backward_already_scaled():
    """A pdf criterion keeps its posteriors, not the dense gradient, from forward to backward: backward writes
    the gradient once, each sequence's columns times its incoming gradient (non-finite: 0; a NaN sequence's
    posteriors stay NaN), as the gradient ``return_grad`` gives times the weights; no dense buffer lives between
    the two passes."""
    import tracemalloc

    g = torch.Generator().manual_seed(4)
    N, T, P = 4, 300, 400  # a dense gradient of 3.8 MB
    fsts = chainfb.ctc_graph(torch.tensor([[1, 2], [3, 3], [4, 5], [6, 7]]))
    scores = torch.randn(N, T, P, generator=g, dtype=torch.float64)
    scores[3, 5, 7] = float("nan")  # sequence 3: NaN
    weights = torch.tensor([0.5, -2.0, float("inf"), 3.0], dtype=torch.float64)
    crit = chainfb.PdfCriterion(fsts, scores.shape)
    _, unscaled = apply(scores, crit, return_grad=True)
    x = scores.clone().requires_grad_()
    tracemalloc.start()
    try:
        value = apply(x, crit)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < scores.numel() * 8 / 4  # the posteriors [T, C] and small arrays, not [N, T, P]
    (got,) = torch.autograd.grad((value * weights).sum(), x)
    want = unscaled * torch.tensor([0.5, -2.0, 0.0, 3.0], dtype=torch.float64).view(-1, 1, 1)
    assert torch.equal(got[:3], want[:3]) and torch.isnan(got[3, :T][:, [0, 6, 7]]).all()
    assert isinstance(crit.run(scores, True, defer=True)[1], DeferredGrad)
    # posteriors more than half the gradient's size (every pdf used): written in forward, as complete does
    dense = chainfb.PdfCriterion(chainfb.ctc_graph(torch.tensor([[1, 2]] * N)), (N, T, 3))
    grad = dense.run(scores[..., :3], True, defer=True)[1]
    assert isinstance(grad, torch.Tensor) and torch.equal(grad, dense.run(scores[..., :3], True)[1])


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_weighted_total(kind):
    """``apply(..., weights=w)`` is ``sum_n w[n] * value[n]`` in one step: the same value and gradients as the
    per-sequence values weighted and summed by torch (also a shared parameter's, and under gradcheck), an
    incoming NaN counting as 0 as everywhere, the first derivative with ``create_graph=True``, and a clear error
    for weights of the wrong length."""
    lengths = [5, 4, 2, 5]
    scores, bias = _inputs()
    w = np.array([0.25, -1.0, 2.0, 0.5])
    weights = w if kind == "numpy" else torch.from_numpy(w)
    total = apply((scores, bias), Biased(scores.shape, lengths), weights=weights)
    assert total.shape == ()
    total.backward()
    s2, b2 = (t.detach().clone().requires_grad_() for t in (scores, bias))
    want = (apply((s2, b2), Biased(scores.shape, lengths)) * torch.from_numpy(w)).sum()
    want.backward()
    torch.testing.assert_close(total, want, rtol=1e-15, atol=0)
    torch.testing.assert_close(scores.grad, s2.grad)
    torch.testing.assert_close(bias.grad, b2.grad)
    assert torch.autograd.gradcheck(lambda s, b: apply((s, b), Biased(s.shape, lengths), weights=weights),
                                    (scores, bias))
    (gs,) = torch.autograd.grad(apply((scores, bias), Biased(scores.shape, lengths), weights=weights), scores,
                                create_graph=True)
    torch.testing.assert_close(gs.detach(), s2.grad)
    (g_nan,) = torch.autograd.grad(apply((scores, bias), Biased(scores.shape, lengths), weights=weights), scores,
                                   torch.tensor(float("nan"), dtype=torch.float64))
    assert torch.equal(g_nan, torch.zeros_like(g_nan))
    with pytest.raises(ValueError, match=r"weights: expected shape \(4,\)"):
        apply((scores, bias), Biased(scores.shape, lengths), weights=w[:3])


def test_ctc_reductions_in_one_step_match_the_per_sequence_losses():
    """``ctc_loss``'s ``"mean"`` and ``"sum"`` (weighted totals of the criterion) equal the per-sequence losses
    reduced by torch, value and gradient, with an impossible sequence (inf, zero gradient) and a NaN one, and
    unbatched; ``zero_infinity`` still zeroes the impossible one."""
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(6, 4, 5, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = torch.tensor([[1, 2, 2], [3, 3, 3], [4, 1, 0], [2, 0, 0]])
    il, tl = [6, 4, 5, 6], [3, 3, 2, 0]  # sequence 1: 3 3 3 needs 5 frames, has 4 (impossible)
    for reduction in ("mean", "sum"):
        for zero_infinity in (False, True):
            x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
            got = chainfb.ctc_loss(x, targets, il, tl, reduction=reduction, zero_infinity=zero_infinity)
            per = chainfb.ctc_loss(y, targets, il, tl, reduction="none", zero_infinity=zero_infinity)
            want = (per / torch.tensor(tl).clamp(min=1)).mean() if reduction == "mean" else per.sum()
            torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
            got.backward(torch.tensor(0.5, dtype=torch.float64))
            if torch.isfinite(want):
                want.backward(torch.tensor(0.5, dtype=torch.float64))
                torch.testing.assert_close(x.grad, y.grad, rtol=1e-13, atol=1e-15)
            assert torch.isfinite(x.grad).all() and (x.grad[:, 1] == 0).all()  # impossible: zero gradient
    x = lp[:, 0].clone().requires_grad_()
    got = chainfb.ctc_loss(x, targets[0], 6, 3)
    torch.testing.assert_close(got, chainfb.ctc_loss(lp[:, 0], targets[0], 6, 3, reduction="none") / 3)
    nan = lp.clone()
    nan[2, 3, 0] = float("nan")  # on sequence 3's only path (blanks)
    x = nan.requires_grad_()
    chainfb.ctc_loss(x, targets, il, tl).backward()
    assert torch.isnan(x.grad[:, 3]).any() and torch.isfinite(x.grad[:, [0, 2]]).all()  # a NaN stays in its sequence


# ------------------------------------------------- one criterion object, two threads at once

def _transducer_case(rng):
    from chainfb.transducer import TransducerCriterion

    B, T, U, V = 3, 6, 3, 5
    targets = torch.from_numpy(rng.integers(1, V, (B, U)))
    Tl, Ul = np.array([6, 4, 5]), np.array([3, 1, 2])
    crit = TransducerCriterion((B, T, U + 1, V), targets, Tl, Ul, 0, fastemit_lambda=0.1)
    return crit, [torch.from_numpy(rng.normal(size=(B, T, U + 1, V))) for _ in range(2)]


def _tdt_case(rng):
    from chainfb.transducer import TDTCriterion

    B, T, U, V, durations = 2, 5, 2, 4, (0, 1, 2)
    targets = torch.from_numpy(rng.integers(1, V, (B, U)))
    crit = TDTCriterion((B, T, U + 1, V + 3), targets, np.array([5, 3]), np.array([2, 1]), 0, durations, 0.05)
    return crit, [torch.from_numpy(rng.normal(size=(B, T, U + 1, V + 3))) for _ in range(2)]


def _grid_case(rng):
    from chainfb.transducer import GridCriterion

    B, S, T = 2, 3, 4
    xs = [(torch.from_numpy(rng.normal(size=(B, S, T + 1))), torch.from_numpy(rng.normal(size=(B, S + 1, T))))
          for _ in range(2)]
    return GridCriterion(*xs[0]), xs


def _pdf_case(rng):
    crit = chainfb.PdfCriterion(FST, (4, 5, 3), [5, 4, 2, 5])
    return crit, [torch.from_numpy(rng.normal(size=(4, 5, 3))) for _ in range(2)]


@pytest.mark.parametrize("backend", ["compiled", "torch_ops"])
@pytest.mark.parametrize("case", [_transducer_case, _tdt_case, _grid_case, _pdf_case],
                         ids=["rnnt", "tdt", "grid", "pdf"])
def test_one_criterion_object_runs_on_two_threads_at_once(case, backend, monkeypatch):
    """A criterion object keeps nothing between its gather and its gradient:
    two threads that run one object on different inputs, both gathers done
    before either reaches the engine (a barrier in front of it), each get
    the numbers a call alone gives."""
    import threading

    from chainfb import criterion as seam
    from chainfb.transducer.maps import compiled

    if backend == "torch_ops":
        monkeypatch.setattr(compiled, "available", lambda dtype=None: False)
    elif not compiled.available(torch.float64):
        pytest.skip("no compiled score maps")
    crit, xs = case(np.random.default_rng(11))
    alone = [crit.run(x, True) for x in xs]
    engine = seam.engines.forward_backward
    barrier = threading.Barrier(2, timeout=60)

    def after_both_gathers(*args, **kwargs):
        barrier.wait()
        return engine(*args, **kwargs)

    monkeypatch.setattr(seam.engines, "forward_backward", after_both_gathers)
    got, errors = [None, None], []

    def work(k):
        try:
            got[k] = crit.run(xs[k], True)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for (value, grad), (v0, g0) in zip(got, alone):
        torch.testing.assert_close(value, v0, rtol=0, atol=0)
        for g, want in zip(grad if isinstance(grad, tuple) else (grad,), g0 if isinstance(g0, tuple) else (g0,)):
            torch.testing.assert_close(g, want, rtol=0, atol=0)
