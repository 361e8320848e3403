"""Second derivatives are not implemented: asking for one raises a clear
error instead of returning a derivative that treats the posteriors as
constants (or a first-order gradient that silently does not require grad)."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb import Fst


def _penalty(loss, x):
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    return (g * g).sum()


def _ctc(x):
    lp = torch.log_softmax(x, -1)
    return chainfb.ctc_loss(lp, torch.tensor([[1, 2]]), torch.tensor([4]), torch.tensor([2]))


def _rnnt(x):
    return chainfb.rnnt_loss(x, torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
                             torch.tensor([2], dtype=torch.int32), blank=0)


def _fst(x):
    fst = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 2, 0.0)], finals={1: 0.0})
    return chainfb.fst_loglike(x, fst).sum()


@pytest.mark.parametrize("loss, shape", [(_ctc, (4, 1, 3)), (_rnnt, (1, 3, 3, 3)), (_fst, (1, 4, 3))])
def test_a_gradient_penalty_raises(loss, shape):
    x = torch.from_numpy(np.random.default_rng(0).normal(size=shape)).requires_grad_()
    value = loss(x)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        _penalty(value, x).backward()


def test_first_order_gradients_still_work_with_create_graph_off():
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(4, 1, 3))).requires_grad_()
    (g,) = torch.autograd.grad(_ctc(x), x)
    assert torch.isfinite(g).all() and not g.requires_grad


# A gradient penalty through a model: a Linear layer in front of each criterion.  Differentiating the
# penalty w.r.t. the layer's weights follows the criterion's gradient back through its input (the
# layer's output), which is where a second derivative would be needed; it must raise, not silently
# treat the criterion's gradient as a constant.

H = 3


def _linear_loss(case):
    """``(h [*, H], lin, loss(lin(h)))`` for a criterion ``case``."""
    g = torch.Generator().manual_seed(5)
    i32 = dict(dtype=torch.int32)

    def transducer(B, T, U, V):
        return torch.randn(B, T, U + 1, H, generator=g, dtype=torch.float64), V

    if case == "ctc":
        h, V = torch.randn(5, 2, H, generator=g, dtype=torch.float64), 4
        f = lambda y: chainfb.ctc_loss(y.log_softmax(-1), torch.tensor([[1, 2], [3, 0]]), torch.tensor([5, 4]),
                                       torch.tensor([2, 1]))
    elif case == "fst_loglike":
        h, V = torch.randn(2, 4, H, generator=g, dtype=torch.float64), 3
        fst = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 2, 0.0)], finals={1: 0.0})
        f = lambda y: -chainfb.fst_loglike(y.log_softmax(-1), fst, [4, 3]).sum()
    elif case == "chain":
        h, V = torch.randn(2, 4, H, generator=g, dtype=torch.float64), 3
        fst = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 2, 0.0)], finals={1: 0.0})
        den = chainfb.DenominatorGraph(Fst.from_arcs([(0, 0, p, np.log(1 / 3)) for p in range(3)],
                                                     finals={0: 0.0}), num_pdfs=3)
        f = lambda y: chainfb.ChainLoss(den, out_of_range_regularize=0.0)(y, [fst, fst], [4, 3])
    elif case in ("rnnt", "speechbrain", "grid", "fast_rnnt"):
        h, V = transducer(2, 3, 2, 4)
        tg, tl, ul = torch.tensor([[1, 2], [3, 0]], **i32), torch.tensor([3, 2], **i32), torch.tensor([2, 1], **i32)
        if case == "rnnt":
            f = lambda y: chainfb.rnnt_loss(y, tg, tl, ul, blank=0)
        elif case == "speechbrain":
            from chainfb.compat.speechbrain import TransducerLoss
            f = lambda y: TransducerLoss(blank=0)(y, tg, tl, ul)
        elif case == "grid":
            from chainfb.transducer import grid_rnnt_loss
            f = lambda y: grid_rnnt_loss(y, tg, tl, ul, blank=0, rnnt_type="modified")
        else:
            from chainfb.compat import fast_rnnt
            bd = torch.tensor([[0, 0, 2, 3], [0, 0, 1, 2]])
            f = lambda y: fast_rnnt.rnnt_loss(y, tg.long(), 0, bd, delay_penalty=0.1)
    elif case == "multiblank":
        h, V = transducer(2, 4, 2, 6)
        f = lambda y: chainfb.multiblank_rnnt_loss(y, torch.tensor([[1, 2], [3, 0]], **i32),
                                                   torch.tensor([4, 3], **i32), torch.tensor([2, 1], **i32),
                                                   blank=5, big_blank_durations=[2], sigma=0.05)
    elif case == "tdt":
        h, V = transducer(2, 4, 2, 5 + 3)
        f = lambda y: chainfb.tdt_loss(y, torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]),
                                       torch.tensor([2, 1]), blank=4, durations=[0, 1, 2], sigma=0.05)
    elif case in ("simple", "smoothed"):
        from chainfb.transducer import simple_rnnt_loss
        h, V = torch.randn(2, 4, H, generator=g, dtype=torch.float64), 5
        lm = torch.randn(2, 3, V, generator=g, dtype=torch.float64)
        scale = 0.1 if case == "smoothed" else 0.0
        f = lambda y: simple_rnnt_loss(y, lm, torch.tensor([[1, 2], [3, 0]]), torch.tensor([4, 3]),
                                       torch.tensor([2, 1]), blank=0, lm_only_scale=scale, am_only_scale=scale)
    elif case == "pruned":
        from chainfb.transducer import pruned_rnnt_loss
        h, V = torch.randn(2, 4, 2, H, generator=g, dtype=torch.float64), 5
        ranges = torch.tensor([[0, 1], [0, 1], [1, 2], [1, 2]])[None].expand(2, 4, 2)
        f = lambda y: pruned_rnnt_loss(y, torch.tensor([[1, 2], [3, 0]]), ranges, torch.tensor([4, 3]),
                                       torch.tensor([2, 1]), blank=0)
    else:
        raise AssertionError(case)
    lin = torch.nn.Linear(H, V).double()
    return h, lin, f


CASES = ["ctc", "fst_loglike", "chain", "rnnt", "speechbrain", "grid", "fast_rnnt", "multiblank", "tdt",
         "simple", "smoothed", "pruned"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("wrt", ["input", "weight"])
def test_a_gradient_penalty_through_a_layer_raises(case, wrt):
    """Penalty = squared norm of the gradient w.r.t. the layer's input (or
    weight), differentiated w.r.t. the layer's weight: it needs the
    criterion's second derivative, so it raises."""
    h, lin, f = _linear_loss(case)
    h.requires_grad_()
    loss = f(lin(h))
    (g,) = torch.autograd.grad(loss, h if wrt == "input" else lin.weight, create_graph=True)
    # the first derivative itself is still the right one
    (want,) = torch.autograd.grad(f(lin(h)), h if wrt == "input" else lin.weight)
    torch.testing.assert_close(g.detach(), want)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        torch.autograd.grad((g * g).sum(), lin.weight, retain_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        torch.autograd.grad((g * g).sum(), lin.bias)


def test_the_gradient_is_differentiable_in_the_incoming_gradient():
    """The gradient is linear in the incoming gradient: differentiating it
    w.r.t. per-sequence weights of the loss is exact (no second derivative
    of the criterion is needed)."""
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(2, 4, 3))).requires_grad_()
    w = torch.tensor([0.7, -1.3], dtype=torch.float64, requires_grad=True)
    fst = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 2, 0.0)], finals={1: 0.0})
    (g,) = torch.autograd.grad((w * chainfb.fst_loglike(x, fst, [4, 3])).sum(), x, create_graph=True)
    c = torch.from_numpy(np.random.default_rng(2).normal(size=(2, 4, 3)))
    (dw,) = torch.autograd.grad((g * c).sum(), w)
    (post,) = torch.autograd.grad(chainfb.fst_loglike(x, fst, [4, 3]).sum(), x)
    torch.testing.assert_close(dw, (post * c).sum(dim=(1, 2)))
    # and a Hessian-vector product through it (torch.autograd.functional) refuses
    with pytest.raises(RuntimeError, match="differentiate twice"):
        torch.autograd.functional.hvp(lambda z: chainfb.fst_loglike(z, fst, [4, 3]).sum(), x.detach(), c)
