"""Boolean arguments of the public functions take True or False only: a
string such as "False", a number or None is a TypeError naming the
argument, never silently truthy."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb import Fst
from chainfb.chain import PhoneGraph, Topology, den_graph, estimate_phone_lm, expand, read_lexicon
from chainfb.compat import speechbrain, torchaudio


def _fst():
    return Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 1, 0.0)], {1: 0.0})


def _lm():
    return estimate_phone_lm([[0, 1, 2], [1, 2], [2, 0, 1]], 3, 2, 20)


def _phones():
    pg = PhoneGraph()
    a, b = pg.add_node(), pg.add_node()
    pg.add_arc(a, b, 0)
    pg.final[b] = 0.0
    return pg


def _rnnt_args():
    return (torch.zeros(1, 2, 2, 3), torch.tensor([[1]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32))


CALLS = {
    "need_posteriors": lambda v: chainfb.forward_backward(_fst(), np.zeros((1, 2, 2)), need_posteriors=v),
    "acceptor": lambda v: Fst.from_openfst_text("0 1 1 1\n1\n", acceptor=v),
    "with_probs": lambda v: read_lexicon(["a 0.5 A"], with_probs=v),
    "sil_probs": lambda v: read_lexicon(["a 0.5 0.1 1 1 A"], sil_probs=v),
    "minimize": lambda v: den_graph(_lm(), Topology.chain(), minimize=v),
    "all_final": lambda v: expand(_phones(), Topology.chain(), all_final=v),
    "zero_infinity": lambda v: chainfb.ctc_loss(torch.zeros(3, 1, 2), torch.tensor([[1]]), [3], [1],
                                                zero_infinity=v),
    "fused_log_softmax": lambda v: torchaudio.rnnt_loss(*_rnnt_args(), blank=0, fused_log_softmax=v),
    "true_gradient": lambda v: speechbrain.TransducerLoss(true_gradient=v),
}


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("value", ["False", 1, 0.0, None])
def test_flags_take_bools_only(name, value):
    if value is None and name in ("acceptor", "with_probs", "sil_probs"):
        pytest.skip("None means: detect it")
    with pytest.raises(TypeError, match=name):
        CALLS[name](value)


@pytest.mark.parametrize("name", list(CALLS))
def test_flags_accept_bools(name):
    for v in (True, False, np.bool_(True)):
        CALLS[name](v)
