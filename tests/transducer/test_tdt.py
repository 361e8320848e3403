"""TDT (token-and-duration transducer): the step graphs and score map of
:mod:`chainfb.transducer.tdt` against path enumeration and a grid-loop
reference, gradcheck, FastEmit / clamp / omega / reductions, NeMo's module,
bad inputs, and per device (CPU, CUDA, the CUDA kernels' emulation)."""

import math
import random

import numpy as np
import pytest
import torch

import chainfb
from chainfb.compat.espnet import TDTLossNumba
from chainfb.transducer.graphs import tdt_graphs, tdt_step_graph

from devices import OnCPU, OnCUDA, OnEmulatedKernels
from oracles.tdt import enumerate_loglike, enumerate_paths, grid_reference


def tdt_batch(seed, B=3, T=5, U=3, V=5, durations=(0, 1, 2), Tb=None, Ub=None, dtype=torch.float64):
    """Random logits ``[B, T, U + 1, V + D]`` (blank ``V - 1``), targets and lengths."""
    rng = np.random.default_rng(seed)
    D = len(durations)
    x = torch.tensor(rng.normal(size=(B, T, U + 1, V + D)), dtype=dtype)
    tg = torch.tensor(rng.integers(0, V - 1, (B, U)))
    if Tb is None:
        Tb = rng.integers(1, T + 1, B)
        Tb[0] = T
    if Ub is None:
        Ub = rng.integers(0, U + 1, B)
        Ub[0] = U
    return x, tg, torch.tensor(np.asarray(Tb)), torch.tensor(np.asarray(Ub))


def exact(x, tg, Tb, Ub, blank, durations, sigma=0.0):
    """Costs and the gradient of their sum by enumeration (float64)."""
    costs, grads = [], []
    for b in range(x.shape[0]):
        xb = x[b].detach().clone().requires_grad_()
        lp = enumerate_loglike(xb, tg[b], int(Tb[b]), int(Ub[b]), blank, durations, sigma)
        if torch.isfinite(lp):
            (-lp).backward()
            grads.append(xb.grad)
        else:
            grads.append(torch.zeros_like(xb))
        costs.append(-lp.item())
    return np.array(costs), torch.stack(grads)


# ------------------------------------------------------- graphs and oracles
def test_oracles_agree_and_count_paths():
    # durations [0, 1], T=2, U=1, by hand (a label of duration 1 from t=1 would land past T - 1)
    paths = enumerate_paths(2, 1, [0, 1])
    assert sorted(paths) == sorted([
        [(0, 0, 1, 0), (0, 1, 0, 1), (1, 1, 0, 1)],   # label d0, blank d1, blank d1
        [(0, 0, 1, 1), (1, 1, 0, 1)],                 # label d1, blank d1
        [(0, 0, 0, 1), (1, 0, 1, 0), (1, 1, 0, 1)],   # blank d1, label d0, blank d1
    ])
    x, tg, Tb, Ub = tdt_batch(0, B=2, durations=(0, 1, 3))
    costs, grads = exact(x, tg, Tb, Ub, 4, (0, 1, 3), 0.1)
    for b in range(2):
        lp, g = grid_reference(x[b].numpy(), tg[b], int(Tb[b]), int(Ub[b]), 4, (0, 1, 3), 0.1)
        assert -lp == pytest.approx(costs[b], rel=1e-12)
        np.testing.assert_allclose(g, grads[b].numpy(), atol=1e-12)


def test_step_graph_shape():
    f = tdt_step_graph(2, [0, 1, 2])
    # main states 0..2 only: a blank of duration d spans d steps, a label of duration d spans d + 1
    assert f.num_states == 3 and f.max_span == 3
    assert np.isfinite(f.final).sum() == 1 and f.final[2] == 0.0
    J = 6
    assert sorted(f.arcs(spans=True)) == sorted(
        [(u, u, u * J + i, 0.0, d) for u in range(3) for i, d in ((1, 1), (2, 2))]
        + [(u, u + 1, u * J + 3 + i, 0.0, d + 1) for u in range(2) for i, d in enumerate((0, 1, 2))])
    # durations longer than the longest utterance get no arcs
    g = tdt_step_graph(2, [0, 1, 2, 10 ** 9], max_frames=4)
    assert g.num_states == 3 and g.num_arcs == f.num_arcs
    # the graph does not grow with the durations
    h = tdt_step_graph(2, [0, 1, 2, 10 ** 9])
    assert h.num_states == 3 and h.num_arcs == f.num_arcs + 3 + 2 and h.max_span == 10 ** 9 + 1
    batch = tdt_graphs([2, 0, 2], [0, 1, 2], logit_lengths=[3, 0, 1])
    assert batch.num_sequences == 3


@pytest.mark.parametrize("durations, sigma", [((0, 1, 2), 0.0), ((1, 3), 0.07), ((0, 1, 2, 3, 4), 0.07),
                                             ((0, 6), 0.0)])
def test_compiled_spans_against_the_loop_oracle(durations, sigma):
    """Compiler and score map alone: the compiled span graphs through the
    per-graph loop oracle (no engine) against the grid reference."""
    from chainfb.transducer import TDTCriterion
    from oracles.lattice import lattice_forward_backward

    x, tg, Tb, Ub = tdt_batch(21, B=4, T=7, U=3, durations=durations, Tb=[7, 2, 5, 1], Ub=[3, 3, 1, 0])
    crit = TDTCriterion(x.shape, tg, Tb.numpy(), Ub.numpy(), 4, durations, sigma)
    assert crit.lattice.num_states == int((Ub + 1).sum())
    X, ctx = crit.start(x)
    loglike, post = lattice_forward_backward(crit.lattice, X, crit.lengths)
    cost, grad = crit.complete(x, loglike, post, ctx)
    for b in range(4):
        lp, g = grid_reference(x[b].numpy(), tg[b], int(Tb[b]), int(Ub[b]), 4, durations, sigma)
        if lp == -math.inf:
            assert cost[b].item() == math.inf and (grad[b] == 0).all()
            continue
        assert cost[b].item() == pytest.approx(-lp, rel=1e-12)
        np.testing.assert_allclose(grad[b].numpy(), g, atol=1e-12)


# ---------------------------------------------------------- enumeration
@pytest.mark.parametrize("durations, sigma", [((0, 1, 2), 0.0), ((1, 2), 0.07), ((0, 1, 2, 3, 4), 0.07),
                                             ((2, 0, 1), 0.0), ((0, 3), 0.07), ((1,), 0.0), ((0, 1), 0.07)])
def test_against_enumeration(durations, sigma):
    x, tg, Tb, Ub = tdt_batch(1, B=4, T=4, U=3, durations=durations, Tb=[4, 3, 2, 1], Ub=[3, 1, 2, 0])
    xd = x.clone().requires_grad_()
    costs = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, list(durations), sigma=sigma, reduction="none")
    costs.sum().backward()
    ref, gref = exact(x, tg, Tb, Ub, 4, durations, sigma)
    np.testing.assert_allclose(costs.detach().numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(xd.grad.numpy(), gref.numpy(), atol=1e-12)


def test_impossible_pairs_cost_inf_with_zero_gradient():
    # T=0; durations [0, 3] with T=2 (no blank lands on T); three labels in one frame without d=0;
    # durations [1, 2] with T=2 and U=2 (each label uses a frame and the last blank one more)
    for Tb_, Ub_, durs in [([3, 0, 2], [3, 1, 1], (0, 3)), ([4, 1, 2], [1, 3, 2], (1, 2))]:
        x, tg, Tb, Ub = tdt_batch(2, B=3, T=4, U=3, durations=durs, Tb=Tb_, Ub=Ub_)
        xd = x.clone().requires_grad_()
        costs = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, reduction="none")
        ref, _ = exact(x, tg, Tb, Ub, 4, durs)
        assert np.isfinite(costs[0].item()) and np.isinf(ref[1:]).all()
        assert torch.isinf(costs[1:]).all()
        costs.sum().backward()
        assert xd.grad[0].any() and not xd.grad[1:].any()


def test_label_cannot_land_on_the_final_point():
    # T=1, U=1, durations [1]: a label of duration 1 from (0, 0) would land on (1, 1) = (T, U): forbidden,
    # and no blank fits before it, so the utterance is impossible
    x, tg, Tb, Ub = tdt_batch(3, B=1, T=1, U=1, durations=(1,), Tb=[1], Ub=[1])
    assert torch.isinf(chainfb.tdt_loss(x, tg, Tb, Ub, 4, [1], reduction="none")).all()
    # with d = 0 the label stays in frame 0 and the final blank of duration 1 ends the utterance
    x, tg, Tb, Ub = tdt_batch(3, B=1, T=1, U=1, durations=(0, 1), Tb=[1], Ub=[1])
    c = chainfb.tdt_loss(x, tg, Tb, Ub, 4, [0, 1], reduction="none")
    ref, _ = exact(x, tg, Tb, Ub, 4, (0, 1))
    assert c.item() == pytest.approx(ref[0], rel=1e-12)


def test_durations_longer_than_the_batch_are_never_taken():
    durs = [0, 1, 2, 10 ** 9]
    x, tg, Tb, Ub = tdt_batch(4, B=2, T=4, U=2, durations=durs)
    xd = x.clone().requires_grad_()
    costs = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, reduction="none")
    costs.sum().backward()
    ref, gref = exact(x, tg, Tb, Ub, 4, durs)
    np.testing.assert_allclose(costs.detach().numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(xd.grad.numpy(), gref.numpy(), atol=1e-12)


def test_property_against_grid_reference():
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hyp.settings(max_examples=15, deadline=None, derandomize=True)
    @hyp.given(durs=st.lists(st.integers(0, 4), min_size=1, max_size=4).filter(lambda d: max(d) > 0),
               T=st.integers(1, 5), U=st.integers(0, 3), seed=st.integers(0, 10 ** 6),
               sigma=st.sampled_from([0.0, 0.05]))
    def check(durs, T, U, seed, sigma):
        x, tg, Tb, Ub = tdt_batch(seed, B=2, T=T, U=U, V=4, durations=durs)
        xd = x.clone().requires_grad_()
        costs = chainfb.tdt_loss(xd, tg, Tb, Ub, 3, durs, sigma=sigma, reduction="none")
        costs.sum().backward()
        for b in range(2):
            lp, g = grid_reference(x[b].numpy(), tg[b], int(Tb[b]), int(Ub[b]), 3, durs, sigma)
            if np.isfinite(lp):
                assert costs[b].item() == pytest.approx(-lp, rel=1e-10)
            else:
                assert math.isinf(costs[b].item())
            np.testing.assert_allclose(xd.grad[b].numpy(), g, atol=1e-10)

    check()


# ---------------------------------------------- fastemit, clamp, omega, reductions
def test_fastemit_and_clamp_follow_nemo():
    durs = (0, 1, 2, 3)
    x, tg, Tb, Ub = tdt_batch(5, B=3, T=6, U=3, durations=durs)
    xd = x.clone().requires_grad_()
    costs = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, sigma=0.05, fastemit_lambda=0.25, clamp=0.1,
                             reduction="none")
    costs.sum().backward()
    for b in range(3):
        lp, g = grid_reference(x[b].numpy(), tg[b], int(Tb[b]), int(Ub[b]), 4, durs, 0.05, fastemit=0.25, clamp=0.1)
        assert costs[b].item() == pytest.approx(-1.25 * lp, rel=1e-12)
        np.testing.assert_allclose(xd.grad[b].numpy(), g, atol=1e-12)
    # the duration gradient is not clamped
    assert xd.grad[..., 5:].abs().max() > 0.1 >= xd.grad[..., :5].abs().max()


def test_omega_mixes_the_rnnt_loss_of_the_token_logits():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(6, B=3, durations=durs)
    V = 5
    r = x[..., :V].clone().requires_grad_()
    rnnt = chainfb.rnnt_loss(r, tg, Tb, Ub, blank=4, reduction="none")
    rnnt.sum().backward()
    t = x.clone().requires_grad_()
    tdt = chainfb.tdt_loss(t, tg, Tb, Ub, 4, durs, sigma=0.1, reduction="none")
    tdt.sum().backward()
    for omega in (1.0, 0.3):
        xd = x.clone().requires_grad_()
        c = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, sigma=0.1, omega=omega, reduction="none")
        c.sum().backward()
        np.testing.assert_allclose(c.detach().numpy(), (omega * rnnt + (1 - omega) * tdt).detach().numpy(),
                                   rtol=1e-12)
        want = (1 - omega) * t.grad
        want[..., :V] += omega * r.grad
        np.testing.assert_allclose(xd.grad.numpy(), want.numpy(), atol=1e-12)
    assert not xd.grad[..., V:].equal(torch.zeros_like(xd.grad[..., V:]))


def test_reductions():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(7, B=3, durations=durs, Ub=[3, 1, 2])
    none = chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, reduction="none")
    assert none.shape == (3,)
    for red, want in [("sum", none.sum()), ("mean", none.mean()), ("mean_batch", none.mean()),
                      ("mean_volume", none.sum() / 6)]:
        got = chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, reduction=red)
        assert got.shape == () and got.item() == pytest.approx(want.item(), rel=1e-12)
    xd = x.clone().requires_grad_()
    chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, reduction="mean_volume").backward()
    _, gref = exact(x, tg, Tb, Ub, 4, durs)
    np.testing.assert_allclose(xd.grad.numpy(), gref.numpy() / 6, atol=1e-12)


def test_second_backward_and_noncontiguous_input():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(8, B=2, durations=durs)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()  # non-contiguous view
    assert not xt.is_contiguous()
    c = chainfb.tdt_loss(xt, tg, Tb, Ub, 4, durs)
    c.backward(retain_graph=True)
    g1 = xt.grad.clone()
    xt.grad = None
    c.backward()
    assert torch.equal(g1, xt.grad)
    _, gref = exact(x, tg, Tb, Ub, 4, durs)
    np.testing.assert_allclose(g1.numpy(), gref.numpy() / 2, atol=1e-12)


def test_omega_is_deterministic_and_reads_no_random_state():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(12, B=2, durations=durs)
    random.seed(5)
    state = random.getstate()
    a = chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, omega=0.5, reduction="none")
    assert random.getstate() == state
    random.seed(6)
    assert torch.equal(a, chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, omega=0.5, reduction="none"))


def test_tdt_batches_share_the_transducer_compiler():
    from chainfb.transducer import TDTCriterion, compile_layout

    durs = (0, 1, 2)
    x, tg, Tb, Ub = tdt_batch(13, B=3, T=5, U=3, durations=durs, Tb=[5, 2, 4], Ub=[3, 1, 3])
    crit = TDTCriterion(x.shape, tg, Tb.numpy(), Ub.numpy(), 4, durs)
    lay = compile_layout(Ub.numpy(), Tb.numpy(), durs, umax=3, family="tdt")
    assert crit.layout is lay and lay.width == 6 and lay.family == "tdt"
    assert compile_layout(Ub.numpy(), Tb.numpy(), umax=3) is not lay  # RNN-T: another layout
    batch = tdt_graphs(Ub.numpy(), durs, Tb.numpy())
    assert batch.num_graphs == 2
    for n in range(3):  # each sequence's graph, whichever packing the layout uses
        g, h = lay.batch.fsts[lay.batch.seq_to_graph[n]], batch.fsts[batch.seq_to_graph[n]]
        assert g.num_states == h.num_states
        for a in ("src", "dst", "pdf", "final", "span"):
            np.testing.assert_array_equal(getattr(g, a), getattr(h, a))


# ------------------------------------------------------------ NeMo's module
def test_nemo_module_reductions_and_clamp():
    durs = [0, 1, 2, 3]
    x, tg, Tb, Ub = tdt_batch(9, B=3, T=6, durations=durs)
    none = TDTLossNumba(blank=4, durations=durs, reduction="none", sigma=0.05)(x, tg, Tb, Ub)
    ref = chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, sigma=0.05, reduction="none")
    assert torch.equal(none, ref)
    xd = x.clone().requires_grad_()
    s = TDTLossNumba(blank=4, durations=durs, reduction="mean", sigma=0.05, clamp=0.2, fastemit_lambda=0.1)(
        xd, tg, Tb, Ub)
    assert s.shape == (1,)
    s.backward()
    want = chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, sigma=0.05, fastemit_lambda=0.1, reduction="none")
    assert s.item() == pytest.approx(want.sum().item() / 3, rel=1e-12)
    for b in range(3):
        _, g = grid_reference(x[b].numpy(), tg[b], int(Tb[b]), int(Ub[b]), 4, durs, 0.05, fastemit=0.1, clamp=0.2)
        np.testing.assert_allclose(xd.grad[b].numpy(), g / 3, atol=1e-12)
    total = TDTLossNumba(blank=4, durations=durs, reduction="sum", clamp=-1)(x, tg, Tb, Ub)
    assert total.shape == (1,)


def test_nemo_module_samples_rnnt_with_probability_omega():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(10, B=2, durations=durs)
    tdt = chainfb.tdt_loss(x, tg, Tb, Ub, 4, durs, sigma=0.05, reduction="none")
    rnnt = chainfb.rnnt_loss(x[..., :5], tg, Tb, Ub, blank=4, reduction="none")
    loss = TDTLossNumba(blank=4, durations=durs, reduction="none", sigma=0.05, omega=0.5)
    random.seed(123)
    draws = [random.uniform(0, 1) < 0.5 for _ in range(8)]
    assert any(draws) and not all(draws)
    random.seed(123)
    for use_rnnt in draws:
        xd = x.clone().requires_grad_()
        c = loss(xd, tg, Tb, Ub)
        torch.testing.assert_close(c.detach(), rnnt if use_rnnt else tdt, rtol=1e-12, atol=0)
        c.sum().backward()
        assert xd.grad[..., 5:].any() != use_rnnt  # the RNN-T branch leaves the durations without gradient


# ------------------------------------------------------------- bad inputs
def test_bad_inputs():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(11, B=2, durations=durs)

    def call(**kw):
        args = dict(logits=x, targets=tg, logit_lengths=Tb, target_lengths=Ub, blank=4, durations=durs)
        args.update(kw)
        return chainfb.tdt_loss(**args)

    for kw, exc, word in [
        (dict(durations=[]), ValueError, "durations"),
        (dict(durations=[0, -1]), ValueError, "durations"),
        (dict(durations=[0, 0]), ValueError, "durations"),
        (dict(durations=[0, 1.5, 2]), TypeError, "durations"),
        (dict(durations="012"), TypeError, "durations"),
        (dict(durations=None), TypeError, "durations"),
        (dict(durations=list(range(1, 9))), ValueError, "durations"),
        (dict(durations=[0, 1, 2**64]), ValueError, "durations"),
        (dict(durations=torch.tensor([0.0, 1.0])), TypeError, "durations"),
        (dict(blank=5), ValueError, "blank"),
        (dict(blank=1.0), TypeError, "blank"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(omega=1.5), ValueError, "omega"),
        (dict(omega="a"), TypeError, "omega"),
        (dict(sigma=float("nan")), ValueError, "sigma"),
        (dict(fastemit_lambda=-1.0), ValueError, "fastemit_lambda"),
        (dict(clamp="x"), TypeError, "clamp"),
        (dict(clamp=float("nan")), ValueError, "clamp"),
        (dict(sigma=True), TypeError, "sigma"),
        (dict(logits=x.numpy()), TypeError, "logits"),
        (dict(logits=x[0]), ValueError, "logits"),
        (dict(targets=tg.float()), TypeError, "targets"),
        (dict(logit_lengths=Tb + 10), ValueError, "logit_lengths"),
        (dict(target_lengths=Ub[:1]), ValueError, "target_lengths"),
        (dict(targets=torch.full_like(tg, 4)), ValueError, "targets"),
    ]:
        with pytest.raises(exc, match=word):
            call(**kw)
    with pytest.raises(ValueError, match="omega"):
        TDTLossNumba(blank=4, durations=durs, omega=2.0)
    with pytest.raises(ValueError, match="reduction"):
        TDTLossNumba(blank=4, durations=durs, reduction="avg")


def test_non_finite_logits_do_not_crash():
    durs = [0, 1, 2]
    x, tg, Tb, Ub = tdt_batch(12, B=2, durations=durs)
    x[1, 0, 0, :] = float("-inf")
    xd = x.clone().requires_grad_()
    c = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, reduction="none")
    c.sum().backward()
    assert np.isfinite(c[0].item()) and not np.isfinite(c[1].item())
    assert torch.isfinite(xd.grad).all() and not xd.grad[1].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_score_maps_match_torch_on_non_finite_logits(monkeypatch, dtype):
    """The compiled CPU gather and gradient (one log for both normalisers,
    the durations exponentiated per frame) give the torch score maps'
    costs and gradients when a row holds NaN or infinities, in the tokens
    or in the durations."""
    from chainfb.transducer.maps import compiled as cpu_maps

    if not cpu_maps.available(dtype):
        pytest.skip("the compiled score maps need Numba")
    durs = [0, 1, 2, 4]
    put = [(2, float("nan")), (5 + 1, float("nan")), (slice(0, 5), float("-inf")), (slice(5, 9), float("-inf")),
           (1, float("inf")), (5 + 2, float("inf")), (slice(None), float("-inf"))]
    for k, (where, value) in enumerate(put):
        x, tg, Tb, Ub = tdt_batch(40 + k, B=4, T=7, U=3, V=5, durations=durs, Tb=[7, 6, 7, 5], Ub=[3, 2, 0, 3],
                                  dtype=dtype)
        x[k % 2, (3 * k) % 5, k % 3, where] = value  # a cell some arc reads
        for kw in ({}, dict(sigma=0.05, fastemit_lambda=0.3, clamp=0.2)):
            out = []
            for compiled in (True, False):
                if not compiled:
                    monkeypatch.setattr(cpu_maps, "available", lambda dtype=None: False)
                xd = x.clone().requires_grad_()
                c = chainfb.tdt_loss(xd, tg, Tb, Ub, 4, durs, reduction="none", **kw)
                c.nansum().backward()
                out.append((c.detach().numpy(), xd.grad.numpy()))
                monkeypatch.undo()
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            np.testing.assert_allclose(out[0][0], out[1][0], rtol=tol, equal_nan=True)
            np.testing.assert_allclose(out[0][1], out[1][1], rtol=tol, atol=tol, equal_nan=True)
            assert np.isfinite(out[0][0][2:]).all()
            if value != value:  # NaN read: NaN out for that utterance only
                assert np.isnan(out[0][0][k % 2])


# ------------------------------------------------------------- per device
class TDTTests:
    """tdt_loss per device: the torch score map runs on the logits' device;
    the engine is NumPy on the CPU, the CUDA kernels on a GPU or under
    emulation."""

    @pytest.mark.parametrize("durs, sigma, fastemit, clamp", [((0, 1, 2), 0.0, 0.0, -1.0),
                                                             ((0, 1, 2, 4), 0.05, 0.3, 0.2), ((1, 3), 0.1, 0.0, -1.0)])
    def test_against_grid_reference(self, durs, sigma, fastemit, clamp):
        x, tg, Tb, Ub = tdt_batch(20, B=4, T=6, U=3, durations=durs)
        xd = self.tensor(x.clone()).requires_grad_()
        costs = chainfb.tdt_loss(xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub), 4, durs, sigma=sigma,
                                 fastemit_lambda=fastemit, clamp=clamp, reduction="none")
        assert costs.device.type == self.device
        costs.sum().backward()
        for b in range(4):
            lp, g = grid_reference(x[b].numpy(), tg[b], int(Tb[b]), int(Ub[b]), 4, durs, sigma, fastemit, clamp)
            if np.isfinite(lp):
                assert costs[b].item() == pytest.approx(-(1 + fastemit) * lp, rel=1e-10)
            else:
                assert math.isinf(costs[b].item())
            np.testing.assert_allclose(self.numpy(xd.grad[b]), g, atol=1e-10)

    def test_gradcheck(self):
        x, tg, Tb, Ub = tdt_batch(21, B=2, T=3, U=2, V=4, durations=(0, 1, 2))
        xd = self.tensor(x.clone()).requires_grad_()
        tg, Tb, Ub = self.tensor(tg), self.tensor(Tb), self.tensor(Ub)
        assert torch.autograd.gradcheck(
            lambda z: chainfb.tdt_loss(z, tg, Tb, Ub, 3, [0, 1, 2], sigma=0.05, reduction="mean"), (xd,))

    def test_impossible_utterance_costs_inf_with_zero_gradient(self):
        x, tg, Tb, Ub = tdt_batch(22, B=2, T=3, U=2, durations=(0, 1), Tb=[3, 0], Ub=[2, 1])
        xd = self.tensor(x.clone()).requires_grad_()
        costs = chainfb.tdt_loss(xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub), 4, [0, 1],
                                 reduction="none")
        assert torch.isinf(costs[1]) and torch.isfinite(costs[0])
        costs.sum().backward()
        assert not xd.grad[1].any() and xd.grad[0].any()

    def test_omega(self):
        x, tg, Tb, Ub = tdt_batch(23, B=2, durations=(0, 1, 2))
        args = (self.tensor(tg), self.tensor(Tb), self.tensor(Ub), 4, [0, 1, 2])
        xd = self.tensor(x.clone()).requires_grad_()
        c = chainfb.tdt_loss(xd, *args, omega=0.25, reduction="sum")
        c.backward()
        ref = chainfb.tdt_loss(x, tg, Tb, Ub, 4, [0, 1, 2], omega=0.25, reduction="sum")
        assert c.item() == pytest.approx(ref.item(), rel=1e-10)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
    def test_low_precision_inputs(self, dtype):
        x, tg, Tb, Ub = tdt_batch(24, B=2, durations=(0, 1, 2))
        ref = chainfb.tdt_loss(x.to(dtype).double(), tg, Tb, Ub, 4, [0, 1, 2], reduction="none")
        xd = self.tensor(x.to(dtype).clone()).requires_grad_()
        costs = chainfb.tdt_loss(xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub), 4, [0, 1, 2],
                                 reduction="none")
        costs.sum().backward()
        assert costs.dtype == dtype and xd.grad.dtype == dtype
        np.testing.assert_allclose(self.numpy(costs.double()), ref.numpy(), rtol=2e-2)

    def test_deterministic_gradient(self):
        x, tg, Tb, Ub = tdt_batch(25, B=3, T=6, U=3, durations=(0, 1, 2, 3), dtype=torch.float32)
        grads = []
        for _ in range(2):
            xd = self.tensor(x.clone()).requires_grad_()
            chainfb.tdt_loss(xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub), 4, [0, 1, 2, 3]).backward()
            grads.append(xd.grad)
        assert torch.equal(grads[0], grads[1])


class TestTDTCPU(TDTTests, OnCPU):
    pass


class TestTDTCUDA(TDTTests, OnCUDA):
    pass


class TestTDTEmulated(TDTTests, OnEmulatedKernels):
    pass
