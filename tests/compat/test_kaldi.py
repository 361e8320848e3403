"""Kaldi GenericNumeratorComputation parity: layout, stride, weight, ok."""

import math

import numpy as np
import pytest
import torch

from chainfb import Fst, GenericNumeratorComputation, Supervision, forward_backward
from chainfb.testing import random_fst


def kaldi_layout(scores):
    """[N, T, P] -> [T*N, P] with row t*N + n."""
    N, T, P = scores.shape
    return np.ascontiguousarray(scores.transpose(1, 0, 2)).reshape(T * N, P)


def graphs(rng, N, P=5):
    out = []
    for _ in range(N):
        f = random_fst(rng, num_states=5, num_arcs=14, num_pdfs=P)
        finals = {s: -0.5 * s for s in range(5)}  # every state final: never impossible
        out.append(Fst.from_arcs(f.arcs() + [(s, s, s % P, -1.0) for s in range(5)], finals, start=f.start))
    return out


def test_row_ordering_matches_forward_backward(rng):
    N, T, P = 3, 6, 5
    fsts = graphs(rng, N, P)
    scores = rng.normal(size=(N, T, P))
    ll, post = forward_backward(fsts, scores)
    out = kaldi_layout(scores)
    comp = GenericNumeratorComputation(Supervision(fsts, T), out)
    deriv = np.zeros_like(out)
    ok, total = comp.forward_backward(deriv)
    assert ok
    assert total == pytest.approx(ll.sum(), abs=1e-10)
    np.testing.assert_allclose(deriv, kaldi_layout(post), atol=1e-12)
    assert comp.compute_objf() == pytest.approx(total, abs=1e-10)


def test_wide_row_stride_and_weight(rng):
    N, T, P = 2, 5, 5
    fsts = graphs(rng, N, P)
    scores = rng.normal(size=(N, T, P))
    wide = np.zeros((T * N, 9))
    wide[:, :P] = kaldi_layout(scores)
    out = wide[:, :P]  # row stride 9 > num_pdfs 5
    assert out.strides[0] == 9 * 8
    weight = 0.25
    comp = GenericNumeratorComputation(Supervision(fsts, T, weight=weight), out)
    deriv_wide = np.full((T * N, 11), 7.0)
    deriv = deriv_wide[:, 2:2 + P]
    ok, total = comp.forward_backward(deriv)
    ll, post = forward_backward(fsts, scores)
    assert ok and total == pytest.approx(weight * ll.sum())
    np.testing.assert_allclose(deriv - 7.0, weight * kaldi_layout(post), atol=1e-12)
    # derivatives are added, and only into the supervision's columns
    assert np.all(deriv_wide[:, :2] == 7.0) and np.all(deriv_wide[:, 2 + P:] == 7.0)
    used = set(np.concatenate([f.pdf for f in fsts]).tolist())
    for p in set(range(P)) - used:
        assert np.all(deriv[:, p] == 7.0)


def test_torch_inputs_and_per_frame_sums(rng):
    N, T, P = 2, 7, 5
    fsts = graphs(rng, N, P)
    out = torch.randn(T * N, P, dtype=torch.float64)
    deriv = torch.zeros_like(out)
    ok, total = GenericNumeratorComputation(Supervision(fsts, T), out).forward_backward(deriv)
    assert ok and math.isfinite(total)
    sums = deriv.view(T, N, P).sum(-1)
    torch.testing.assert_close(sums, torch.ones(T, N, dtype=torch.float64))


def test_impossible_supervision_not_ok(rng):
    T, P = 2, 3
    chain = Fst.from_arcs([(0, 1, 0, 0.0), (1, 2, 1, 0.0), (2, 3, 2, 0.0)], {3: 0.0})
    fine = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0)], {1: 0.0})
    out = rng.normal(size=(T * 2, P))
    deriv = np.zeros_like(out)
    ok, total = GenericNumeratorComputation(Supervision([fine, chain], T), out).forward_backward(deriv)
    assert not ok and total == -math.inf
    assert not np.isnan(deriv).any()
    assert np.all(deriv.reshape(T, 2, P)[:, 1] == 0)


def test_variable_lengths(rng):
    N, T, P = 3, 6, 5
    fsts = graphs(rng, N, P)
    scores = rng.normal(size=(N, T, P))
    lengths = np.array([6, 2, 4])
    ll, post = forward_backward(fsts, scores, lengths)
    deriv = np.zeros((T * N, P))
    num = GenericNumeratorComputation(Supervision(fsts, T, lengths=lengths), kaldi_layout(scores))
    ok, total = num.forward_backward(deriv)
    assert ok and total == pytest.approx(ll.sum())
    np.testing.assert_allclose(deriv, kaldi_layout(post), atol=1e-12)


def test_bad_inputs(rng):
    fsts = graphs(rng, 2, 5)
    sup = Supervision(fsts, 4)
    with pytest.raises(ValueError, match="nnet_output: expected frames_per_sequence"):
        GenericNumeratorComputation(sup, np.zeros((7, 5)))
    with pytest.raises(ValueError, match="nnet_output: expected a 2-D"):
        GenericNumeratorComputation(sup, np.zeros((2, 4, 5)))
    with pytest.raises(ValueError, match="nnet_output: the graphs use pdf 4"):
        GenericNumeratorComputation(sup, np.zeros((8, 3)))
    with pytest.raises(TypeError, match="supervision"):
        GenericNumeratorComputation("sup", np.zeros((8, 5)))
    comp = GenericNumeratorComputation(sup, np.zeros((8, 5)))
    with pytest.raises(ValueError, match="nnet_output_deriv: expected frames_per_sequence"):
        comp.forward_backward(np.zeros((6, 5)))
    with pytest.raises(ValueError, match="weight"):
        Supervision(fsts, 4, weight=float("nan"))
    with pytest.raises(ValueError, match="frames_per_sequence"):
        Supervision(fsts, -1)
    with pytest.raises(ValueError, match="lengths"):
        Supervision(fsts, 4, lengths=[5, 1])


def test_supervision_numbers_are_checked(rng):
    fsts = graphs(rng, 2, 5)
    with pytest.raises(TypeError, match="frames_per_sequence"):
        Supervision(fsts, True)
    with pytest.raises(TypeError, match="frames_per_sequence"):
        Supervision(fsts, 4.0)
    with pytest.raises(TypeError, match="weight"):
        Supervision(fsts, 4, weight="1")
    with pytest.raises(TypeError, match="weight"):
        Supervision(fsts, 4, weight=True)


def test_negative_strides_name_the_argument(rng):
    fsts = graphs(rng, 2, 5)
    sup = Supervision(fsts, 4)
    out = np.zeros((8, 5))
    with pytest.raises(ValueError, match="nnet_output: strides must be non-negative"):
        GenericNumeratorComputation(sup, out[::-1])
    with pytest.raises(ValueError, match="nnet_output: strides must be non-negative"):
        GenericNumeratorComputation(sup, out[:, ::-1])
    comp = GenericNumeratorComputation(sup, out)
    with pytest.raises(ValueError, match="nnet_output_deriv: strides must be non-negative"):
        comp.forward_backward(np.zeros((8, 5))[::-1])


def test_numerator_loss_reductions(rng):
    import torch

    from chainfb import NumeratorLoss, fst_loglike

    fsts = [Fst.from_arcs([(0, 0, 0, -0.5), (0, 1, 1, -1.0)], {0: -0.2, 1: 0.0}) for _ in range(2)]
    x = torch.from_numpy(rng.normal(size=(2, 5, 3)))
    nll = -fst_loglike(x, fsts, [5, 3])
    assert torch.equal(NumeratorLoss("none")(x, fsts, [5, 3]), nll)
    assert NumeratorLoss("sum")(x, fsts, [5, 3]).item() == pytest.approx(nll.sum().item())
    assert NumeratorLoss("frame")(x, fsts, [5, 3]).item() == pytest.approx(nll.sum().item() / 8)
    assert NumeratorLoss("frame")(x, fsts, torch.tensor([5, 3])).item() == pytest.approx(nll.sum().item() / 8)
    assert NumeratorLoss("frame")(x, fsts).item() == pytest.approx(-fst_loglike(x, fsts).sum().item() / 10)
    # zero frames in all: the sum (the start state is final), divided by 1, not 0/0
    zero = NumeratorLoss("frame")(x, fsts, [0, 0])
    assert zero.item() == pytest.approx(0.4)
    with pytest.raises(ValueError, match="reduction"):
        NumeratorLoss("mean_volume")
    with pytest.raises(ValueError, match="reduction"):
        NumeratorLoss(None)


def test_old_import_path():
    """``chainfb.kaldi`` is the old path of ``chainfb.compat.kaldi``: the same classes, as the package's."""
    import chainfb
    from chainfb import kaldi
    from chainfb.compat import kaldi as compat_kaldi

    assert kaldi.__all__ == compat_kaldi.__all__
    for name in kaldi.__all__:
        assert getattr(kaldi, name) is getattr(compat_kaldi, name) is getattr(chainfb, name)
