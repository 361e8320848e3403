"""Hostile inputs: bounded resources, no silent coercion, and the promises the
docs make (each case answers within milliseconds, with a clear error naming
the argument, or with the documented result)."""

import math
import time
import warnings

import numpy as np
import pytest
import torch

import chainfb
from chainfb import Fst
from chainfb.compat import espnet, speechbrain


def quick(fn, limit=2.0):
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        assert time.perf_counter() - t0 < limit


def _rnnt_batch(T=4, U=2, V=6, B=2):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    tg = torch.randint(0, V - 3, (B, U), generator=g, dtype=torch.int32)
    return x, tg, torch.full((B,), T, dtype=torch.int32), torch.full((B,), U, dtype=torch.int32)


# ---------------------------------------------------------- bounded resources


@pytest.mark.parametrize("d", [10**6, 10**9])
def test_huge_big_blank_duration_is_bounded(d):
    """A big blank longer than every utterance can never be taken: the graphs
    leave it out (no auxiliary chain of a million states), same loss as any
    other too-long duration."""
    x, tg, T, U = _rnnt_batch()
    got = quick(lambda: chainfb.multiblank_rnnt_loss(x, tg, T, U, blank=5, big_blank_durations=[2, d]))
    assert torch.equal(got, chainfb.multiblank_rnnt_loss(x, tg, T, U, blank=5, big_blank_durations=[2, 5]))


def test_huge_state_ids_do_not_allocate():
    with pytest.raises(ValueError, match="far beyond"):
        quick(lambda: Fst.from_openfst_text("0 2147483647 1\n2147483647\n"))
    with pytest.raises(ValueError, match="far beyond"):
        quick(lambda: Fst.from_arcs([(0, 2**31 - 1, 0, 0.0)], {2**31 - 1: 0.0}))
    with pytest.raises(ValueError, match="2\\*\\*62"):
        Fst.from_openfst_text("0 1 1\n99999999999999999999999\n")
    with pytest.raises(ValueError, match="2\\*\\*62"):
        Fst.from_arcs([(0, 2**64, 0, 0.0)], {1: 0.0})
    # sparse ids are fine when asked for explicitly, and modest gaps are fine
    assert Fst.from_arcs([(0, 5000, 0, 0.0)], {5000: 0.0}, num_states=5001).num_states == 5001
    assert Fst.from_arcs([(0, 9, 0, 0.0)], {9: 0.0}).num_states == 10


def test_reading_a_binary_file_says_what_it_is_not(tmp_path):
    p = tmp_path / "graph.fst"
    p.write_bytes(b"\xd6\xfd\xb2~" + bytes(range(256)))  # OpenFst's binary magic, then noise
    with pytest.raises(ValueError, match="graph.fst: damaged binary FST: has a damaged header"):
        Fst.read(p)
    p.write_bytes(b"\xff\xfe" + bytes(range(256)))  # no magic, not text
    with pytest.raises(ValueError, match="neither an OpenFst/Kaldi text FST nor a binary .*read_kaldi_fst_archive"):
        Fst.read(p)


# ------------------------------------------------------ no silent coercion


def test_fractional_ids_and_pdfs_are_errors():
    with pytest.raises(ValueError, match="arcs\\[0\\]: destination state must be an integer"):
        Fst.from_arcs([(0, 1.9, 0, 0.0)], {1: 0.0})
    with pytest.raises(ValueError, match="arcs\\[1\\]: pdf must be an integer"):
        Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 0.5, 0.0)], {1: 0.0})
    with pytest.raises(TypeError, match="arcs\\[0\\]: source state must be an integer"):
        Fst.from_arcs([("0", 1, 0, 0.0)], {1: 0.0})
    with pytest.raises(TypeError, match="finals: state must be an integer"):
        Fst.from_arcs([(0, 1, 0, 0.0)], {True: 0.0})
    # integral floats and NumPy integers are integers
    f = Fst.from_arcs([(np.int32(0), 1.0, np.int64(2), 0.0)], {1: 0.0})
    assert f.dst.tolist() == [1] and f.pdf.tolist() == [2]


@pytest.mark.parametrize("durations, exc", [([2.7], TypeError), ("23", TypeError), ([True], TypeError),
                                            (3, TypeError)])
def test_durations_must_be_integers(durations, exc):
    x, tg, T, U = _rnnt_batch()
    with pytest.raises(exc, match="big_blank_durations"):
        chainfb.multiblank_rnnt_loss(x, tg, T, U, blank=5, big_blank_durations=durations)


@pytest.mark.parametrize("lam", [float("nan"), float("inf"), -0.1])
def test_nemo_fastemit_must_be_finite(lam):
    with pytest.raises(ValueError, match="fastemit_lambda"):
        espnet.RNNTLossNumba(blank=0, fastemit_lambda=lam)
    with pytest.raises(ValueError, match="fastemit_lambda"):
        espnet.MultiblankRNNTLossNumba(blank=5, big_blank_durations=[2], fastemit_lambda=lam)


@pytest.mark.parametrize("kw", [dict(l2_regularize=float("nan")), dict(out_of_range_regularize=float("inf")),
                                dict(l2_regularize=-1.0)])
def test_chain_loss_regularisers_must_be_finite(kw):
    f = Fst.from_arcs([(0, 0, 0, 0.0)], {0: 0.0})
    with pytest.raises(ValueError, match=next(iter(kw))):
        chainfb.ChainLoss(f, **kw)


def test_numpy_scalars_are_numbers():
    x, tg, T, U = _rnnt_batch()
    a = chainfb.multiblank_rnnt_loss(x, tg, T, U, blank=5, big_blank_durations=[np.int64(2)], sigma=np.float32(0.1),
                                     fastemit_lambda=np.float64(0.2), clamp=np.float32(5.0))
    b = chainfb.multiblank_rnnt_loss(x, tg, T, U, blank=5, big_blank_durations=[2], sigma=float(np.float32(0.1)),
                                     fastemit_lambda=0.2, clamp=5.0)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="sigma"):
        chainfb.multiblank_rnnt_loss(x, tg, T, U, blank=5, big_blank_durations=[2], sigma="0.1")


def test_bfloat16_scores_give_bfloat16_results():
    f = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], {1: 0.0})
    s = torch.zeros(2, 3, 2, dtype=torch.bfloat16, requires_grad=True)
    ll, post = chainfb.forward_backward(f, s)
    assert ll.dtype == post.dtype == torch.bfloat16
    assert ll[0].item() == pytest.approx(math.log(3), rel=1e-2)
    chainfb.fst_loglike(s, f).sum().backward()
    assert s.grad.dtype == torch.bfloat16


def test_empty_batch_with_empty_lengths():
    f = Fst.from_arcs([(0, 0, 0, 0.0)], {0: 0.0})
    ll, post = chainfb.forward_backward(f, np.zeros((0, 3, 1)), lengths=[])
    assert ll.shape == (0,) and post.shape == (0, 3, 1)


# ------------------------------------------------------------ promises kept


def test_text_round_trip_without_a_usable_final_state():
    f = Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 1, -0.5)], {1: -math.inf})
    g = Fst.from_openfst_text(f.to_openfst_text())
    assert g == f
    impossible = chainfb.transducer.step_graph(2, possible=False)
    assert Fst.from_openfst_text(impossible.to_openfst_text()) == impossible


def test_chain_loss_nan_output_falls_back_for_the_whole_sequence():
    from chainfb.chain import Topology, den_graph, estimate_phone_lm, numerator_graph, read_lexicon

    lex = read_lexicon(["a A B", "b B", "SIL SIL"])
    phones = ["SIL", "A", "B"]
    topo = Topology.chain()
    lm = estimate_phone_lm([[1, 2], [2], [1, 2, 2]], order=2)
    den = den_graph(lm, topo)
    loss = chainfb.ChainLoss(den, l2_regularize=0.01, reduction="none")
    nums = [numerator_graph(w, lex, topo, phones, sil_prob=0.2) for w in (["a"], ["b"])]
    y = torch.randn(2, 8, topo.num_pdfs(len(phones)), dtype=torch.float64)
    y[0, 3, 1] = float("nan")
    y[1, 7, 0] = float("nan")  # past sequence 1's length: ignored
    y.requires_grad_()
    with pytest.warns(RuntimeWarning, match="fallback"):
        out = loss(y, nums, [8, 6])
    assert torch.isfinite(out).all()
    assert out[0].item() == pytest.approx(10.0 * 8)  # -(-10 per frame)
    out.sum().backward()
    assert torch.isfinite(y.grad).all() and not y.grad[0].any() and y.grad[1].any()
    assert loss.info["num_fallback"] == 1


def test_speechbrain_none_reduction_and_infinite_incoming_gradient():
    x, tg, T, U = _rnnt_batch()
    T = torch.tensor([4, 0], dtype=torch.int32)  # the second utterance is impossible
    a = x.clone().requires_grad_()
    sb = speechbrain.TransducerLoss(blank=5, reduction="none")(a, tg, T, U)
    assert torch.isinf(sb[1])
    sb.backward(torch.tensor([1.0, math.inf], dtype=torch.float64))
    b = x.clone().requires_grad_()
    ref = chainfb.rnnt_loss(b, tg, T, U, blank=5, reduction="none")
    ref.backward(torch.tensor([1.0, math.inf], dtype=torch.float64))
    assert torch.isfinite(a.grad).all() and not a.grad[1].any()
    torch.testing.assert_close(a.grad, b.grad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        speechbrain.TransducerLoss(blank=5, reduction="mean")(x, tg, torch.tensor([4, 3], dtype=torch.int32), U)
