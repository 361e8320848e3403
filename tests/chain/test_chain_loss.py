"""The LF-MMI denominator (leaky HMM) against an independent matrix-product
formula, the shared-graph engine against the one engine and path
enumeration, ChainLoss gradcheck, Kaldi's finite-difference test, and the
fallback for impossible sequences."""

import math
import sys
import warnings

import numpy as np
import pytest
import torch

import chainfb
from chainfb import ChainLoss, DenominatorGraph, Fst
from chainfb.chain import (
    Topology, den_graph, estimate_phone_lm, initial_probs, numerator_graph, read_lexicon,
)
from chainfb.api import PdfCriterion
from chainfb import engines
from chainfb.engines import scipy_shared, threads
from chainfb.testing import random_fst

from devices import OnCPU, OnCUDA, OnEmulatedKernels
from oracles.chain import chain_objective
from oracles.fst import brute_force

#: the CPU engines with the leaky HMM (the denominator), from the engines' capability table
ENGINES = list(engines.engines_with(device="cpu", leaky=True))


def leaky_reference(fst, scores, L, c):
    """Kaldi's leaky-HMM denominator by dense matrix products (independent of
    the engines): alpha' = alpha (I + c 1 init^T); every state final with 1.
    Returns (loglike, d loglike / d scores [T, P]) with scores clamped to [-30, 30]."""
    S = fst.num_states
    T, P = scores.shape
    x = np.clip(scores, -30, 30)
    # initial probs: 100 iterations, independently written
    A = np.zeros((S, S))
    for s, d, _p, lp in fst.arcs():
        A[s, d] += math.exp(lp)
    A = A / (A.sum(axis=1) + np.exp(fst.final))[:, None]  # Kaldi: out-mass incl. final sums to 1
    v = np.zeros(S)
    v[fst.start] = 1
    acc = np.zeros(S)
    for _ in range(100):
        acc += v / 100
        v = v @ A
        v = v / v.sum()
    init = acc / acc.sum()
    lam = np.eye(S) + c * np.outer(np.ones(S), init)

    def M(t):
        m = np.zeros((S, S))
        for s, d, p, lp in fst.arcs():
            m[s, d] += math.exp(lp + x[t, p])
        return m

    Ms = [M(t) for t in range(L)]
    fwd = [init @ lam]
    for t in range(L):
        fwd.append(fwd[-1] @ Ms[t] @ lam)
    bwd = [None] * (L + 1)
    bwd[L] = lam @ np.ones(S)
    for t in range(L - 1, -1, -1):
        bwd[t] = lam @ (Ms[t] @ bwd[t + 1])
    total = fwd[L].sum()
    post = np.zeros((T, P))
    for t in range(L):
        right = bwd[t + 1]
        for s, d, p, lp in fst.arcs():
            post[t, p] += fwd[t][s] * math.exp(lp + x[t, p]) * right[d] / total
    return math.log(total), post, init


def small_den(rng, S=4, A=9, P=3):
    while True:
        f = random_fst(rng, num_states=S, num_arcs=A, num_pdfs=P, start=0)
        # keep graphs where probability mass can always move (Kaldi's den graphs are like that)
        if np.all(np.bincount(f.src, minlength=S) > 0):
            return f


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("c", [0.1, 0.5, 1e-5])
def test_denominator_against_matrix_products(engine, c):
    rng = np.random.default_rng(int(c * 1e5) + 7)
    for _ in range(4):
        f = small_den(rng)
        den = DenominatorGraph(f, num_pdfs=4)
        N, T = 3, 5
        y = rng.normal(scale=3, size=(N, T, 4))
        y[0, 1, 0] = 45.0  # out of range: clamped
        lengths = np.array([5, 3, 1])
        ll, post = den.forward_backward(y, lengths, c, engine=engine)
        for n in range(N):
            Z, g, init = leaky_reference(f, y[n], lengths[n], c)
            assert ll[n] == pytest.approx(Z, abs=1e-9)
            np.testing.assert_allclose(post[n], g, atol=1e-9)
        np.testing.assert_allclose(den.init_probs, init, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_denominator_without_leak_is_path_enumeration(engine):
    """Coefficient 0: no leak, but (as in Kaldi) paths start from the initial
    distribution, not the start state: enumerate from every state."""
    rng = np.random.default_rng(11)
    f = small_den(rng)
    den = DenominatorGraph(f, num_pdfs=3)
    y = rng.normal(size=(2, 4, 3))
    ll, post = den.forward_backward(y, [4, 2], 0.0, engine=engine)
    g0 = den.fst
    for n, L in enumerate([4, 2]):
        Zs, gs = [], []
        for s in range(g0.num_states):
            fs = Fst(g0.num_states, s, g0.src, g0.dst, g0.pdf, g0.log_prob, g0.final)
            Z, g = brute_force(fs, y[n], L)
            Zs.append(Z + den.log_init[s])
            gs.append(g)
        Z = np.logaddexp.reduce(Zs)
        g = sum(np.exp(z - Z) * gi for z, gi in zip(Zs, gs) if z > -np.inf)
        assert ll[n] == pytest.approx(Z, abs=1e-10)
        np.testing.assert_allclose(post[n], g, atol=1e-10)


def test_initial_probs_is_average_occupancy():
    # state 0: arc prob 1 + final prob 1 -> normalised to 1/2 (Kaldi includes finals)
    f = Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 1, math.log(0.5)), (1, 0, 0, math.log(0.5))], {0: 0.0})
    p = initial_probs(f)
    assert p.sum() == pytest.approx(1.0)
    assert 0.3 < p[0] < 0.4
    cur, avg = np.array([1.0, 0.0]), np.zeros(2)
    A = np.array([[0, 0.5], [0.5, 0.5]])
    for _ in range(100):
        avg += cur / 100
        cur = cur @ A
        cur /= cur.sum()
    np.testing.assert_allclose(p, avg, rtol=1e-12)


def den_from_lm(num_phones=5, seed=0, order=3):
    rng = np.random.default_rng(seed)
    seqs = [list(rng.integers(0, num_phones, rng.integers(2, 12))) for _ in range(60)]
    topo = Topology.chain()
    lm = estimate_phone_lm(seqs, order, 2, 20)
    return DenominatorGraph(den_graph(lm, topo), topo.num_pdfs(num_phones))


@pytest.mark.parametrize("engine", ENGINES)
def test_posterior_sums_per_frame_equal_number_of_sequences(engine):
    den = den_from_lm()
    rng = np.random.default_rng(1)
    N, T = 5, 20
    y = rng.normal(scale=4, size=(N, T, den.num_pdfs))
    lengths = np.array([20, 20, 13, 7, 0])
    ll, post = den.forward_backward(y, lengths, 0.1, engine=engine)
    assert np.isfinite(ll[:4]).all()
    per_frame = post.sum(axis=(0, 2))
    expected = (np.arange(T)[:, None] < lengths[None, :]).sum(axis=1)
    np.testing.assert_allclose(per_frame, expected, atol=1e-9)
    assert not post[4].any() and not post[3, 7:].any()


def test_engines_agree_on_real_den_graph():
    den = den_from_lm(6, seed=3, order=4)
    rng = np.random.default_rng(2)
    y = rng.normal(scale=5, size=(4, 30, den.num_pdfs)).astype(np.float32)
    a = den.forward_backward(y, [30, 25, 30, 1], 0.1, engine="numpy")
    b = den.forward_backward(y, [30, 25, 30, 1], 0.1, engine="shared")
    np.testing.assert_allclose(a[0], b[0], rtol=1e-11)
    np.testing.assert_allclose(a[1], b[1], atol=1e-10)
    t = den.forward_backward(torch.from_numpy(y), None, 0.1)
    assert isinstance(t[0], torch.Tensor) and t[1].shape == (4, 30, den.num_pdfs)


@pytest.mark.parametrize("seed", range(10))
def test_shared_engine_against_path_enumeration(seed):
    rng = np.random.default_rng(seed)
    f = random_fst(rng, num_states=int(rng.integers(2, 6)), num_arcs=int(rng.integers(3, 10)), num_pdfs=4,
                   num_finals=int(rng.integers(1, 3)))
    x = rng.normal(scale=2.0, size=(4, 5, 4))
    x[1, 2, 1] = -np.inf
    lengths = np.array([5, 3, 1, 0])
    ll, post = PdfCriterion(f, x.shape, lengths, engine="shared").run(x)
    for n in range(4):
        Z, g = brute_force(f, x[n], lengths[n])
        if Z == -math.inf:
            assert ll[n] == -math.inf and not post[n].any()
        else:
            assert ll[n] == pytest.approx(Z, abs=1e-9)
            np.testing.assert_allclose(post[n], g, atol=1e-9)


def test_shared_engine_bad_inputs():
    f = random_fst(np.random.default_rng(0))
    g = random_fst(np.random.default_rng(1))
    lat = chainfb.Lattice.of(chainfb.FstBatch([f], np.zeros(2, dtype=np.int64)))
    with pytest.raises(ValueError, match="X"):
        scipy_shared.forward_backward(lat, np.zeros((3, 99)), [3, 3])
    with pytest.raises(ValueError, match="lengths"):
        scipy_shared.forward_backward(lat, np.zeros((3, lat.num_columns)), [4, 3])
    with pytest.raises(ValueError, match="one graph"):
        scipy_shared.forward_backward(chainfb.Lattice.of(chainfb.FstBatch([f, g])), np.zeros((3, 9)), [3, 3])
    with pytest.raises(ValueError, match="engine: 'shared' needs"):
        PdfCriterion([f, g], (2, 3, 4), engine="shared").run(np.zeros((2, 3, 4)))


# ---------------------------------------------------------------- ChainLoss
LEX = ["a A B", "a A C", "b B", "c C A D", "d D", "SIL SIL"]
PHONES = ["SIL", "A", "B", "C", "D"]


def setup_loss(**kw):
    lex = read_lexicon(LEX)
    topo = Topology.chain()
    den = den_from_lm(5, seed=4)
    nums = [numerator_graph(w, lex, topo, PHONES, sil_prob=0.2) for w in (["a", "b"], ["c"], ["d", "a"])]
    return ChainLoss(den, **kw), nums


@pytest.mark.parametrize("engine", ENGINES)
def test_chain_loss_gradcheck(engine):
    loss, nums = setup_loss(l2_regularize=0.01, den_engine=engine, reduction="none")
    torch.manual_seed(0)
    y = (3 * torch.randn(3, 8, 10, dtype=torch.float64)).requires_grad_()
    lengths = [8, 6, 7]
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda y: loss(y, nums, lengths, weights), (y,), eps=1e-6, atol=1e-6)
    loss.reduction = "frame"
    assert torch.autograd.gradcheck(lambda y: loss(y, nums, lengths, weights), (y,), eps=1e-6, atol=1e-6)


def test_chain_loss_value_and_derivative_are_kaldis():
    loss, nums = setup_loss(l2_regularize=0.02, out_of_range_regularize=0.01)
    rng = np.random.default_rng(9)
    y = rng.normal(scale=3, size=(3, 8, 10))
    y[0, 0, 0] = 40.0
    yt = torch.tensor(y, requires_grad=True)
    lengths = [8, 6, 7]
    out = loss(yt, nums, lengths)
    out.backward()
    num_ll, num_post = chainfb.forward_backward(nums, y, lengths)
    den_ll, den_post = loss.den_graph.forward_backward(y, lengths, 0.1)
    mask = (np.arange(8)[None, :] < np.array(lengths)[:, None])[:, :, None]
    ym = y * mask
    ex = (y - np.clip(y, -30, 30)) * mask
    objf = (num_ll - den_ll).sum() - 0.5 * 0.02 * (ym ** 2).sum() - 0.5 * 0.01 * (ex ** 2).sum()
    assert out.item() == pytest.approx(-objf, rel=1e-12)
    deriv = num_post - den_post - 0.02 * ym - 0.01 * ex
    np.testing.assert_allclose(yt.grad.numpy(), -deriv, atol=1e-12)
    info = loss.info
    assert info["num"] == pytest.approx(num_ll.sum()) and info["den"] == pytest.approx(den_ll.sum())
    assert info["objf"] == pytest.approx(objf) and info["frames"] == 21 and info["num_fallback"] == 0
    assert info["oor"] == pytest.approx(-0.5 * 0.01 * 100.0)


def test_kaldi_finite_difference_on_full_objective():
    """Kaldi's chain-training test: the predicted change <delta, deriv> matches
    the observed change of the objective for small random perturbations."""
    loss, nums = setup_loss(leaky_hmm_coefficient=0.1, l2_regularize=0.001)
    rng = np.random.default_rng(21)
    y0 = rng.normal(scale=2, size=(3, 10, 10))
    lengths = [10, 9, 8]
    yt = torch.tensor(y0, requires_grad=True)
    base = loss(yt, nums, lengths)
    base.backward()
    grad = yt.grad.numpy()
    predicted, observed = [], []
    for _ in range(5):
        delta = 1e-4 * rng.normal(size=y0.shape)
        new = loss(torch.tensor(y0 + delta), nums, lengths).item()
        predicted.append((delta * grad).sum())
        observed.append(new - base.item())
    predicted, observed = np.array(predicted), np.array(observed)
    assert np.abs(predicted - observed).max() < 1e-3 * np.abs(predicted).max() + 1e-10


def test_fallback_for_impossible_sequence():
    loss, nums = setup_loss()
    y = torch.randn(3, 8, 10, dtype=torch.float64, requires_grad=True)
    lengths = [8, 2, 7]  # 'c' (C A D) cannot fit in 2 frames
    with pytest.warns(RuntimeWarning, match="fallback"):
        out = loss(y, nums, lengths)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(y.grad).all()
    assert not y.grad[1].any()
    assert y.grad[0].abs().sum() > 0
    assert loss.info["num_fallback"] == 1
    # the fallback objective is -10 per frame of the failed sequence
    per = ChainLoss(loss.den_graph, reduction="none", out_of_range_regularize=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = per(y, nums, lengths)
    assert v[1].item() == pytest.approx(10.0 * 2)


def test_fallback_warning_names_the_line_that_called_the_loss():
    loss, nums = setup_loss()
    y = torch.randn(3, 8, 10, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        loss(y, nums, [8, 2, 7])  # through torch's Module.__call__
        loss.forward(y, nums, [8, 2, 7])
    assert [(w.category, w.filename, w.lineno) for w in seen] == [(RuntimeWarning, __file__, line),
                                                                   (RuntimeWarning, __file__, line + 1)]


def test_float32_and_reductions():
    loss, nums = setup_loss()
    y = torch.randn(3, 8, 10, requires_grad=True)
    out = loss(y, nums)
    out.backward()
    assert out.dtype == torch.float32 and y.grad.dtype == torch.float32
    s = loss.info["objf"]
    f = ChainLoss(loss.den_graph, reduction="frame")(y, nums)
    assert f.item() == pytest.approx(-s / 24, rel=1e-5)


def test_chain_loss_bad_inputs():
    loss, nums = setup_loss()
    with pytest.raises(TypeError, match="nnet_output"):
        loss(np.zeros((3, 8, 10)), nums)
    with pytest.raises(ValueError, match="nnet_output"):
        loss(torch.zeros(3, 8), nums)
    with pytest.raises(ValueError, match="nnet_output"):
        loss(torch.zeros(3, 8, 4), nums)
    with pytest.raises(ValueError, match="weights"):
        loss(torch.zeros(3, 8, 10), nums, None, [1.0, 2.0])
    with pytest.raises(ValueError, match="weights: expected 3 finite numbers >= 0"):
        loss(torch.zeros(3, 8, 10), nums, None, [1.0, -1.0, 1.0])  # "frame" would divide by a frame count <= 0
    with pytest.raises(TypeError, match="l2_regularize"):
        ChainLoss(loss.den_graph, l2_regularize="0.1")
    with pytest.raises(ValueError, match="fsts"):
        loss(torch.zeros(2, 8, 10), nums)
    with pytest.raises(ValueError, match="leaky"):
        ChainLoss(loss.den_graph, leaky_hmm_coefficient=1.5)
    with pytest.raises(ValueError, match="reduction"):
        ChainLoss(loss.den_graph, reduction="mean")
    with pytest.raises(ValueError, match="engine"):
        loss.den_graph.forward_backward(np.zeros((1, 2, 10)), engine="gpu")
    with pytest.raises(TypeError, match="fst"):
        DenominatorGraph("x")


def test_kaldi_layout_denominator_computation():
    from chainfb import DenominatorComputation

    den = den_from_lm()
    rng = np.random.default_rng(8)
    N, T = 3, 6
    y = rng.normal(size=(N, T, den.num_pdfs))
    kaldi = np.ascontiguousarray(y.transpose(1, 0, 2).reshape(T * N, -1))  # row t*N + n
    comp = DenominatorComputation(den, N, kaldi, leaky_hmm_coefficient=0.1)
    total = comp.forward()
    ll, post = den.forward_backward(y, None, 0.1)
    assert total == pytest.approx(ll.sum(), rel=1e-12)
    deriv = np.zeros_like(kaldi)
    assert comp.backward(-1.0, deriv)
    np.testing.assert_allclose(deriv.reshape(T, N, -1).transpose(1, 0, 2), -post, atol=1e-12)
    with pytest.raises(ValueError, match="nnet_output"):
        DenominatorComputation(den, 4, kaldi)


def test_shared_engine_threads_match_single_thread(monkeypatch):
    den = den_from_lm(5, seed=6)
    rng = np.random.default_rng(4)
    N, T = 20, 9
    lat, log_init = den._lattice(N), den.log_init
    X = rng.normal(scale=3, size=(T, lat.num_columns))
    lengths = rng.integers(0, T + 1, N)
    leaky = (0.1, log_init)
    monkeypatch.setitem(threads.MIN_PARALLEL_WORK, "shared", 1e30)
    single = scipy_shared.forward_backward(lat, X.copy(), lengths, leaky)
    monkeypatch.setitem(threads.MIN_PARALLEL_WORK, "shared", 0)
    monkeypatch.setattr(threads, "_num_threads", 2)
    multi = scipy_shared.forward_backward(lat, X.copy(), lengths, leaky)
    np.testing.assert_array_equal(single[0], multi[0])
    np.testing.assert_array_equal(single[1], multi[1])


# ---------------------------------------------------------------- per device
class ChainLossTests:
    """ChainLoss on the input's device against :func:`chain_objective` (the
    NumPy float64 reference)."""

    @pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
    def test_matches_numpy_reference(self, dtype, tol):
        loss, nums = setup_loss(l2_regularize=0.02, out_of_range_regularize=0.01, reduction="none")
        rng = np.random.default_rng(31)
        y = rng.normal(scale=3, size=(3, 8, 10))
        y[0, 1, 2] = 35.0
        lengths, weights = [8, 6, 7], [1.0, 0.5, 2.0]
        yt = self.tensor(torch.tensor(y, dtype=dtype)).requires_grad_()
        out = loss(yt, nums, lengths, torch.tensor(weights))
        assert out.device.type == self.device and out.dtype == dtype
        out.sum().backward()
        y_ref = torch.tensor(y, dtype=dtype).double().numpy()
        objf, deriv, info = chain_objective(y_ref, nums, loss.den_graph, lengths, np.array(weights), 0.1, 0.02, 0.01)
        np.testing.assert_allclose(self.numpy(out.double()), -objf, rtol=tol)
        np.testing.assert_allclose(self.numpy(yt.grad.double()), -deriv, atol=tol)
        for k in ("num", "den", "l2", "oor", "objf", "frames"):
            assert loss.info[k] == pytest.approx(info[k], rel=tol)

    def test_fallback_keeps_loss_and_gradient_finite(self):
        loss, nums = setup_loss()
        y = self.tensor(torch.randn(3, 8, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
        y.requires_grad_()
        with pytest.warns(RuntimeWarning, match="fallback"):
            out = loss(y, nums, [8, 2, 7])  # 'c' (C A D) cannot fit in 2 frames
        assert loss.info["num_fallback"] == 1 and torch.isfinite(out)
        out.backward()
        assert torch.isfinite(y.grad).all()


class TestChainLossCPU(ChainLossTests, OnCPU):
    pass


class TestChainLossCUDA(ChainLossTests, OnCUDA):
    pass


class TestChainLossEmulated(ChainLossTests, OnEmulatedKernels):
    pass


# ---------------------------------------------------------------- costs and threads


def test_denominator_lattice_costs_o_arcs_and_caches_per_graph():
    """A batch size costs the denominator no per-sequence arcs: the shared
    engine never builds them, its sparse matrices are built once per graph
    (shared by every N), and log_init travels as the graph's [S]."""
    den = den_from_lm(5, seed=4)
    rng = np.random.default_rng(3)
    results = {}
    for N in (3, 5, 3):
        y = rng.normal(size=(N, 6, den.num_pdfs))
        results[N] = den.forward_backward(y, None, 0.1, engine="shared")
        lat = den._lattice(N)
        assert "fwd" not in lat.__dict__ and "bwd" not in lat.__dict__ and "final" not in lat.__dict__
        crit = den.criterion(y.shape, None, 0.1)
        assert crit.leaky[1] is den.log_init and crit.leaky[1].shape == (den.num_states,)
    assert scipy_shared._matrices(den._lattice(4)) is scipy_shared._matrices(den._lattice(9))
    assert den._lattice(4).graph_lattice() is den._lattice(9).graph_lattice()
    # the log-domain engine expands the graph's log_init itself, and agrees
    y = rng.normal(size=(3, 6, den.num_pdfs))
    a = den.forward_backward(y, [6, 4, 0], 0.1, engine="shared")
    b = den.forward_backward(y, [6, 4, 0], 0.1, engine="numpy")
    np.testing.assert_allclose(a[0], b[0], rtol=1e-11)
    np.testing.assert_allclose(a[1], b[1], atol=1e-10)


def test_shared_engine_groups_of_sequences_match_one_group(monkeypatch):
    """Sequences run in groups whose alphas fit ALPHA_BYTES; the numbers do
    not depend on the grouping."""
    den = den_from_lm(6, seed=3, order=4)
    rng = np.random.default_rng(4)
    y = rng.normal(scale=3, size=(11, 9, den.num_pdfs))
    lengths = rng.integers(0, 10, 11)
    whole = den.forward_backward(y, lengths, 0.1, engine="shared")
    monkeypatch.setattr(scipy_shared, "ALPHA_BYTES", 1)  # one sequence per group
    runs = []
    eng = scipy_shared._matrices(den._lattice(11))
    real = eng._run
    monkeypatch.setattr(eng, "_run", lambda X, *a: runs.append(len(X)) or real(X, *a))
    grouped = den.forward_backward(y, lengths, 0.1, engine="shared")
    assert runs == [1] * 11
    np.testing.assert_allclose(whole[0], grouped[0], rtol=1e-13)  # sums over states may round differently
    np.testing.assert_allclose(whole[1], grouped[1], rtol=1e-12, atol=1e-14)


def test_chain_loss_shared_by_threads():
    """One ChainLoss(reduction="frame") used by several threads at once gives
    each call the value it gives alone (its frame count is the call's own)."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    loss, nums = setup_loss(reduction="frame")
    torch.manual_seed(1)
    cases = []
    for i in range(6):
        lengths = [8 - i, 2 + i, 5]
        weights = [1.0, 0.5 + i, 2.0]
        cases.append((torch.randn(3, 8, 10, dtype=torch.float64), lengths, weights))
    alone = [loss(y, nums, L, w).item() for y, L, w in cases]
    assert len(set(alone)) == len(alone)

    def work(k):
        order = [(k + j) % len(cases) for j in range(40)]
        return [(i, loss(cases[i][0], nums, cases[i][1], cases[i][2]).item()) for i in order]

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        with ThreadPoolExecutor(4) as ex:
            got = [r for part in ex.map(work, range(4)) for r in part]
    finally:
        sys.setswitchinterval(before)
    wrong = [(i, v, alone[i]) for i, v in got if v != alone[i]]
    assert not wrong, wrong[:5]


def test_graph_log_init_on_every_kernel_engine(emulated_backend):
    """The denominator's log_init [S] of the graph: the shared-graph kernels
    use it as is, the per-sequence kernels repeat it per sequence; both agree
    with the NumPy engine."""
    from chainfb.engines import cuda, cuda_shared, numpy_log

    den = den_from_lm(5, seed=4)
    rng = np.random.default_rng(5)
    N, T = 3, 7
    lat = den._lattice(N)
    X = rng.normal(scale=2.0, size=(T, lat.num_columns))
    lengths = np.array([7, 4, 0])
    leaky = (0.1, den.log_init)
    ref = numpy_log.forward_backward(lat, X.copy(), lengths, leaky)
    for run in (cuda.forward_backward, cuda_shared.forward_backward):
        ll, post = run(emulated_backend, lat, X.copy(), lengths, leaky)
        np.testing.assert_allclose(ll, ref[0], rtol=1e-10)
        np.testing.assert_allclose(post, ref[1], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="log_init"):
        cuda.forward_backward(emulated_backend, lat, X.copy(), lengths, (0.1, den.log_init[1:]))
