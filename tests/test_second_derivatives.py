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
