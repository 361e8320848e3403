"""RNN-T and multi-blank RNN-T compiled into the engine: checked against
alignment enumeration, a plain-loop grid reference, gradcheck and the
published fixed vectors."""

import paths  # tests/paths.py: the repository's and the tests' folders
import math

import numpy as np
import pytest
import torch

import chainfb
from chainfb.lattice import Lattice
from chainfb.transducer import TransducerCriterion, compile_layout, multiblank_graphs, rnnt_graphs, step_graph

from devices import OnCPU, OnCUDA, OnEmulatedKernels
from oracles.transducer import enumerate_loglike, enumerate_paths, grid_reference


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def random_batch(rng, B=3, T=5, U=3, V=6, reserved=1, blank_last=True, dtype=torch.float64):
    Tb = rng.integers(1, T + 1, B)
    Tb[0] = T
    Ub = rng.integers(0, U + 1, B)
    Ub[0] = U
    lo, hi = (0, V - reserved) if blank_last else (reserved, V)
    tg = rng.integers(lo, hi, (B, U))
    x = torch.tensor(rng.normal(size=(B, T, U + 1, V)), dtype=dtype)
    return x, torch.tensor(tg), torch.tensor(Tb), torch.tensor(Ub)


# ----------------------------------------------------------- fixed vectors
B1_LOGITS = [0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.2, 0.8, 0.1,
             0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.7, 0.1, 0.2, 0.1, 0.1]
B1_GRADS = [0.17703132, -0.39992708, 0.17703132, 0.17703132, -0.13116692,
            0.12247062, 0.12247062, -0.181684, 0.12247062, -0.1857276,
            0.06269141, 0.06269141, 0.06928471, 0.12624498, -0.32091248,
            0.05456069, -0.2182428, 0.05456069, 0.05456069, 0.05456069,
            0.12073967, 0.12073967, -0.48295838, 0.12073967, 0.12073967,
            0.30741188, 0.16871123, 0.18645471, 0.16871123, -0.83128875]

B2_LOGITS = [
    0.06535690384862791, 0.7875301411923206, 0.08159176605666074, 0.5297155426466327, 0.7506749639230854,
    0.7541348379087998, 0.6097641124736383, 0.8681404965673826, 0.6225318186056529, 0.6685222872103057,
    0.8580392805336061, 0.16453892311765583, 0.989779515236694, 0.944298460961015, 0.6031678586829663,
    0.9467833543605416, 0.666202507295747, 0.28688179752461884, 0.09418426230195986, 0.3666735970751962,
    0.736168049462793, 0.1666804425271342, 0.7141542198635192, 0.3993997272216727, 0.5359823524146038,
    0.29182076440286386, 0.6126422611507932, 0.3242405528768486, 0.8007644367291621, 0.5241057606558068,
    0.779194617063042, 0.18331417220174862, 0.113745182072432, 0.24022162381327106, 0.3394695622533106,
    0.1341595066017014, 0.5055615569388828, 0.051597282072282646, 0.6402903936686337, 0.43073311517251,
    0.8294731834714112, 0.1774668847323424, 0.3207001991262245, 0.04288308912457006, 0.30280282975568984,
    0.6751777088333762, 0.569537369330242, 0.5584738347504452, 0.08313242153985256, 0.06016544344162322,
    0.10795752845152584, 0.7486153608562472, 0.943918041459349, 0.4863558118797222, 0.4181986264486809,
    0.6524078485043804, 0.024242983423721887, 0.13458171554507403, 0.3663418070512402, 0.2958297395361563,
    0.9236695822497084, 0.6899291482654177, 0.7418981733448822, 0.25000547599982104, 0.6034295486281007,
    0.9872887878887768, 0.5926057265215715, 0.8846724004467684, 0.5434495396894328, 0.6607698886038497,
    0.3771277082495921, 0.3580209022231813]
B2_GRADS = [
    -1.86843902e-01, -6.25548810e-02, 2.49398798e-01, -2.03376666e-01, 2.02399328e-01, 9.77333169e-04,
    -1.41016081e-01, 7.91234672e-02, 6.18926100e-02, -1.15517676e-02, -8.12802389e-02, 9.28319991e-02,
    -1.54257029e-01, 2.29432687e-01, -7.51756504e-02, -2.46593088e-01, 1.46404594e-01, 1.00188486e-01,
    -1.29182907e-02, -6.15932420e-02, 7.45115355e-02, -5.59857301e-02, 2.19830811e-01, -1.63845062e-01,
    -4.97626871e-01, 2.09239945e-01, 2.88386941e-01, 1.36048580e-02, -3.02196294e-02, 1.66147724e-02,
    1.13924511e-01, 6.27811998e-02, -1.76705718e-01, -6.67078257e-01, 3.67658824e-01, 2.99419403e-01,
    -3.56343776e-01, -5.53474613e-02, 4.11691219e-01, -9.69219357e-02, 2.94591039e-02, 6.74628317e-02,
    -6.35175705e-02, 2.76544970e-02, 3.58630717e-02, -1.54499024e-01, -7.39420280e-02, 2.28441030e-01,
    -1.66789949e-01, -8.78955179e-05, 1.66877866e-01, -1.72369644e-01, 1.05565332e-01, 6.68043196e-02,
    2.38748826e-02, -1.18255816e-01, 9.43809375e-02, -1.04707085e-01, -1.08934477e-01, 2.13641584e-01,
    -3.69844258e-01, 1.80118099e-01, 1.89726159e-01, 2.57137045e-02, -7.94617534e-02, 5.37480488e-02,
    1.22328237e-01, -2.38788679e-01, 1.16460443e-01, -5.98686993e-01, 3.02203178e-01, 2.96483815e-01]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torchaudio_vector_b1(dtype):
    x = torch.tensor(B1_LOGITS, dtype=dtype).reshape(1, 2, 3, 5).requires_grad_()
    cost = chainfb.rnnt_loss(x, i32([[1, 2]]), i32([2]), i32([2]), blank=-1, reduction="sum")
    cost.backward()
    assert cost.dtype == dtype
    assert cost.item() == pytest.approx(5.09566688538, abs=1e-6)
    np.testing.assert_allclose(x.grad.reshape(-1).numpy(), B1_GRADS, atol=1e-6)


def test_torchaudio_vector_b2():
    x = torch.tensor(B2_LOGITS, dtype=torch.float64).reshape(2, 4, 3, 3).requires_grad_()
    costs = chainfb.rnnt_loss(x, i32([[1, 2], [1, 1]]), i32([4, 4]), i32([2, 2]), blank=0, reduction="none")
    np.testing.assert_allclose(costs.detach().numpy(), [4.2806528590890736, 3.9384369822503591], rtol=1e-12)
    costs.sum().backward()
    np.testing.assert_allclose(x.grad.reshape(-1).numpy(), B2_GRADS, atol=1e-6)  # published in float32


def test_nemo_small_vector():
    # NeMo's small test case: the B1 activations with blank = 0
    x = torch.tensor(B1_LOGITS, dtype=torch.float64).reshape(1, 2, 3, 5)
    cost = chainfb.rnnt_loss(x, i32([[1, 2]]), i32([2]), i32([2]), blank=0, reduction="sum")
    assert cost.item() == pytest.approx(4.495666, abs=1e-6)


# ------------------------------------------------- enumeration / reference
def test_enumeration_counts_alignments():
    # plain RNN-T: C(T + U - 1, U) alignments (the last move is a blank)
    for T in range(1, 5):
        for U in range(0, 4):
            assert len(enumerate_paths(T, U)) == math.comb(T + U - 1, U)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("durations", [(), (2,), (2, 3), (4, 2)])
def test_against_enumeration(seed, durations):
    rng = np.random.default_rng(seed)
    M = len(durations)
    sigma = 0.0 if not M else float(rng.uniform(0, 0.3))
    x, tg, Tb, Ub = random_batch(rng, B=3, T=5, U=3, V=5 + M, reserved=1 + M)
    V = x.shape[-1]
    blank = V - 1
    x.requires_grad_()
    if M:
        costs = chainfb.multiblank_rnnt_loss(x, tg, Tb, Ub, blank, durations, sigma=sigma, reduction="none")
    else:
        costs = chainfb.rnnt_loss(x, tg, Tb, Ub, blank=blank, reduction="none")
    costs.sum().backward()
    for b in range(3):
        xb = x.detach()[b].clone().requires_grad_()
        ll = enumerate_loglike(torch.log_softmax(xb, -1), tg[b], int(Tb[b]), int(Ub[b]), blank, durations, sigma)
        (-ll).backward()
        assert costs[b].item() == pytest.approx(-ll.item(), rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(x.grad[b].numpy(), xb.grad.numpy(), atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("durations", [(), (2, 4)])
def test_against_grid_reference_variable_lengths(seed, durations):
    rng = np.random.default_rng(100 + seed)
    M = len(durations)
    x, tg, Tb, Ub = random_batch(rng, B=5, T=9, U=6, V=8 + M, reserved=1 + M, blank_last=False)
    # blank at index M (big blanks below it): targets must avoid [0, M]
    blank = M
    tg = torch.where(tg <= blank, tg + blank + 1, tg).clamp(max=x.shape[-1] - 1)
    sigma = 0.05 if M else 0.0
    x.requires_grad_()
    if M:
        costs = chainfb.multiblank_rnnt_loss(x, tg, Tb, Ub, blank, durations, sigma=sigma, reduction="none")
    else:
        costs = chainfb.rnnt_loss(x, tg, Tb, Ub, blank=blank, reduction="none")
    costs.sum().backward()
    for b in range(5):
        lp, g = grid_reference(x.detach()[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), blank, durations, sigma)
        assert costs[b].item() == pytest.approx(-lp, rel=1e-12)
        np.testing.assert_allclose(x.grad[b].numpy(), g, atol=1e-12)


def test_fastemit_matches_reference():
    rng = np.random.default_rng(7)
    lam = 0.3
    for durations in [(), (2, 3)]:
        M = len(durations)
        x, tg, Tb, Ub = random_batch(rng, B=3, T=6, U=3, V=6 + M, reserved=1 + M)
        blank = x.shape[-1] - 1
        x.requires_grad_()
        if M:
            costs = chainfb.multiblank_rnnt_loss(
                x, tg, Tb, Ub, blank, durations, sigma=0.1, fastemit_lambda=lam, reduction="none"
            )
        else:
            costs = chainfb.rnnt_loss(x, tg, Tb, Ub, blank=blank, fastemit_lambda=lam, reduction="none")
        costs.sum().backward()
        for b in range(3):
            lp, g = grid_reference(
                x.detach()[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), blank, durations, 0.1 if M else 0.0,
                fastemit=lam
            )
            assert costs[b].item() == pytest.approx(-(1 + lam) * lp, rel=1e-12)
            np.testing.assert_allclose(x.grad[b].numpy(), g, atol=1e-12)


def test_not_fused_log_softmax():
    rng = np.random.default_rng(3)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=5, U=3, V=6)
    lp = torch.log_softmax(x, -1).requires_grad_()
    costs = chainfb.rnnt_loss(lp, tg, Tb, Ub, blank=-1, fused_log_softmax=False, reduction="none")
    ref = chainfb.rnnt_loss(x, tg, Tb, Ub, blank=-1, reduction="none")
    np.testing.assert_allclose(costs.detach().numpy(), ref.numpy(), rtol=1e-12)
    costs.sum().backward()
    for b in range(3):
        _, g = grid_reference(lp.detach()[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), 5, fused=False)
        np.testing.assert_allclose(lp.grad[b].numpy(), g, atol=1e-12)
        assert (lp.grad[b] <= 0).all()


# ------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_gradcheck_rnnt(reduction):
    rng = np.random.default_rng(11)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=4, U=2, V=4)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda z: chainfb.rnnt_loss(z, tg, Tb, Ub, reduction=reduction), (x,))


def test_gradcheck_rnnt_not_fused():
    rng = np.random.default_rng(12)
    x, tg, Tb, Ub = random_batch(rng, B=2, T=3, U=2, V=4)
    x = torch.log_softmax(x, -1).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: chainfb.rnnt_loss(z, tg, Tb, Ub, fused_log_softmax=False), (x,))


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_gradcheck_multiblank(reduction):
    rng = np.random.default_rng(13)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=5, U=2, V=6, reserved=3)
    x.requires_grad_()
    f = lambda z: chainfb.multiblank_rnnt_loss(z, tg, Tb, Ub, 5, [2, 3], sigma=0.05, reduction=reduction)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))


# --------------------------------------------------- clamp and reductions
def test_clamp_symmetric_and_before_reduction():
    rng = np.random.default_rng(5)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=5, U=3, V=6)
    x.requires_grad_()
    chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="sum").backward()
    full = x.grad.clone()
    x.grad = None
    c = 0.05
    chainfb.rnnt_loss(x, tg, Tb, Ub, clamp=c, reduction="mean").backward()
    np.testing.assert_allclose(x.grad.numpy(), full.clamp(-c, c).numpy() / 3, atol=1e-15)
    assert (full.abs() > c).any() and (full > c).any()


def test_reductions_consistent():
    rng = np.random.default_rng(6)
    x, tg, Tb, Ub = random_batch(rng, B=4, T=5, U=3, V=6)
    none = chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="none")
    assert none.shape == (4,)
    assert chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="sum").item() == pytest.approx(none.sum().item(), rel=1e-14)
    assert chainfb.rnnt_loss(x, tg, Tb, Ub).item() == pytest.approx(none.mean().item(), rel=1e-14)


def test_int32_and_int64_agree():
    rng = np.random.default_rng(8)
    x, tg, Tb, Ub = random_batch(rng)
    a = chainfb.rnnt_loss(x, tg.int(), Tb.int(), Ub.int(), reduction="none")
    b = chainfb.rnnt_loss(x, tg.long(), Tb.long(), Ub.long(), reduction="none")
    assert torch.equal(a, b)


def test_padding_gets_zero_gradient_and_larger_tensor_ok():
    rng = np.random.default_rng(9)
    x, tg, Tb, Ub = random_batch(rng, B=2, T=4, U=2, V=5)
    big = torch.randn(2, 7, 5, 5, dtype=torch.float64)
    big[:, :4, :3] = x
    big.requires_grad_()
    tgb = torch.cat([tg, torch.zeros(2, 3, dtype=tg.dtype)], 1)
    a = chainfb.rnnt_loss(big, tgb, Tb, Ub, reduction="none")
    np.testing.assert_allclose(a.detach().numpy(), chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="none").numpy(),
                               rtol=1e-13)
    a.sum().backward()
    for b in range(2):
        assert (big.grad[b, int(Tb[b]):] == 0).all()
        assert (big.grad[b, :, int(Ub[b]) + 1:] == 0).all()


# ------------------------------------------------------------ edge cases
def test_empty_transcript():
    x = torch.randn(1, 3, 1, 4, dtype=torch.float64)
    cost = chainfb.rnnt_loss(x, torch.zeros(1, 0, dtype=torch.int32), i32([3]), i32([0]), reduction="none")
    lp = torch.log_softmax(x, -1)
    assert cost.item() == pytest.approx(-lp[0, :, 0, 3].sum().item(), rel=1e-13)


def test_zero_frames_is_impossible_with_zero_gradient():
    x = torch.randn(2, 3, 3, 4, dtype=torch.float64, requires_grad=True)
    tg = i32([[1, 2], [1, 0]])
    costs = chainfb.rnnt_loss(x, tg, i32([3, 0]), i32([2, 0]), reduction="none")
    assert math.isfinite(costs[0].item()) and costs[1].item() == math.inf
    costs.sum().backward()
    assert (x.grad[1] == 0).all() and torch.isfinite(x.grad).all()


def test_impossible_multiblank_and_nan_logits_zero_gradient():
    # a non-finite logit gives a non-finite cost and a zero gradient for that sample only
    x = torch.randn(2, 3, 2, 5, dtype=torch.float64)
    x[1, 0, 0, 2] = float("nan")
    x.requires_grad_()
    costs = chainfb.rnnt_loss(x, i32([[1], [1]]), i32([3, 3]), i32([1, 1]), reduction="none")
    assert math.isfinite(costs[0].item()) and not math.isfinite(costs[1].item())
    costs[0].backward()
    assert (x.grad[1] == 0).all()


def test_multiblank_only_big_blank_exact_fit():
    # T = 2, U = 0, one big blank of duration 2: paths = blank,blank and the big blank alone
    x = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    cost = chainfb.multiblank_rnnt_loss(x, torch.zeros(1, 0, dtype=torch.int64), i32([2]), i32([0]), 2, [2],
                                        reduction="sum")
    lp = torch.log_softmax(x, -1)[0, :, 0]
    ref = torch.logaddexp(lp[0, 2] + lp[1, 2], lp[0, 1])
    assert cost.item() == pytest.approx(-ref.item(), rel=1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_types(dtype):
    rng = np.random.default_rng(10)
    x, tg, Tb, Ub = random_batch(rng, B=2, T=6, U=3, V=7)
    xh = x.to(dtype).requires_grad_()
    costs = chainfb.rnnt_loss(xh, tg, Tb, Ub, reduction="none")
    assert costs.dtype == dtype
    costs.float().sum().backward()
    assert xh.grad.dtype == dtype
    x64 = xh.detach().double().requires_grad_()
    ref = chainfb.rnnt_loss(x64, tg, Tb, Ub, reduction="none")
    ref.sum().backward()
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}[dtype]
    np.testing.assert_allclose(costs.double().detach().numpy(), ref.detach().numpy(), rtol=tol)
    np.testing.assert_allclose(xh.grad.double().numpy(), x64.grad.numpy(), atol=tol)


def test_no_grad_path():
    rng = np.random.default_rng(14)
    x, tg, Tb, Ub = random_batch(rng)
    with torch.no_grad():
        a = chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="none")
    b = chainfb.rnnt_loss(x.clone().requires_grad_(), tg, Tb, Ub, reduction="none")
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-13)


# ------------------------------------------------------------ the graphs
def test_step_graph_structure():
    f = step_graph(2)
    assert f.num_states == 3 and f.num_arcs == 5 and f.start == 0 and f.max_span == 1
    assert sorted(f.arcs()) == [(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 2, 0.0), (1, 2, 3, 0.0), (2, 2, 4, 0.0)]
    assert f.finals() == {2: 0.0}
    g = step_graph(1, durations=(2, 3), sigma=0.5)
    # main states 0..1 only; W = 4: a big blank of duration d is a self-loop spanning d steps
    assert g.num_states == 2 and g.max_span == 3
    assert sorted(g.arcs(spans=True)) == [
        (0, 0, 0, -0.5, 1), (0, 0, 2, -0.5, 2), (0, 0, 3, -0.5, 3), (0, 1, 1, -0.5, 1),
        (1, 1, 4, -0.5, 1), (1, 1, 6, -0.5, 2), (1, 1, 7, -0.5, 3)]
    assert "digraph" in g.to_dot()


def test_big_blank_costs_one_arc_whatever_its_duration():
    short, long = step_graph(3, durations=(2, 4)), step_graph(3, durations=(2, 10 ** 6))
    assert short.num_states == long.num_states == 4 and short.num_arcs == long.num_arcs == 4 + 3 + 2 * 4
    assert long.max_span == 10 ** 6
    # longer than every utterance of the batch: no arc at all
    capped = step_graph(3, durations=(2, 10 ** 6), max_duration=50)
    assert capped.num_arcs == 4 + 3 + 4 and capped.max_span == 2
    lay = compile_layout([3, 1], [6, 4], durations=(2, 4, 999))
    used = [lay.batch.fsts[g] for g in lay.batch.seq_to_graph]
    assert [f.num_states for f in used] == [4, 2] and max(f.max_span for f in used) == 4
    assert len(lay.real) == lay.lat.num_columns and (lay.col_j >= 0).all()


@pytest.mark.parametrize("durations", [(), (2,), (2, 3), (4, 2), (3, 7)])
def test_compiled_spans_against_the_loop_oracle(durations):
    """Compiler and torch score map alone: the compiled span graphs through
    the per-graph loop oracle (no engine) against the grid reference."""
    from oracles.lattice import lattice_forward_backward

    rng = np.random.default_rng(len(durations) + sum(durations))
    M = len(durations)
    x, tg, Tb, Ub = random_batch(rng, B=4, T=7, U=3, V=5 + M, reserved=1 + M)
    Tb[1], Ub[1] = 2, 3  # too short for the big blanks
    V = x.shape[-1]
    blank, sigma = V - 1, 0.1 if M else 0.0
    crit = TransducerCriterion(x.shape, tg, Tb.numpy(), Ub.numpy(), blank, durations, sigma)
    assert crit.lattice.num_states == int((Ub + 1).sum())
    X = crit.gather(x)
    loglike, post = lattice_forward_backward(crit.lattice, X, crit.lengths)
    cost, grad = crit.finish(x, loglike, post)
    for b in range(4):
        lp, g = grid_reference(x[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), blank, durations, sigma)
        assert cost[b].item() == pytest.approx(-lp, rel=1e-12)
        np.testing.assert_allclose(grad[b].numpy(), g, atol=1e-12)


def test_graph_batches_share_graphs_and_layout_columns():
    batch = rnnt_graphs([2, 0, 2])
    assert isinstance(batch, chainfb.FstBatch) and batch.num_graphs == 2 and batch.num_sequences == 3
    mb = multiblank_graphs([1, 3], [2, 4], sigma=0.1)
    assert mb.num_sequences == 2
    lay = compile_layout([2, 0, 1], [3, 2, 2], durations=(2,))
    assert lay.colidx.shape == (3, 3, 3)
    assert (lay.colidx[1, 1:] == -1).all() and (lay.colidx[0, 2, 1] == -1)
    used = lay.colidx[lay.colidx >= 0]
    assert len(np.unique(used)) == len(used) == len(lay.real)
    with pytest.raises(ValueError, match="big_blank_durations"):
        multiblank_graphs([1], [1])


# ------------------------------------------------------------ bad inputs
def _ok():
    x = torch.randn(2, 3, 3, 5)
    return dict(logits=x, targets=i32([[1, 2], [2, 0]]), logit_lengths=i32([3, 2]), target_lengths=i32([2, 1]))


@pytest.mark.parametrize(
    "change, exc, match",
    [
        (dict(logits=[[1.0]]), TypeError, "logits"),
        (dict(logits=torch.randn(2, 3, 5)), ValueError, "logits"),
        (dict(logits=torch.zeros(2, 3, 3, 5, dtype=torch.int32)), TypeError, "logits"),
        (dict(targets=torch.tensor([[1.0, 2.0], [2.0, 0.0]])), TypeError, "targets"),
        (dict(targets=i32([1, 2])), ValueError, "targets"),
        (dict(targets=i32([[1, 2]])), ValueError, "targets"),
        (dict(targets=i32([[1, 7], [2, 0]])), ValueError, "targets"),
        (dict(targets=i32([[1, 4], [2, 0]])), ValueError, "blank"),
        (dict(targets=i32([[1], [2]])), ValueError, "targets"),
        (dict(logit_lengths=i32([3, 4])), ValueError, "logit_lengths"),
        (dict(logit_lengths=i32([3, -1])), ValueError, "logit_lengths"),
        (dict(logit_lengths=i32([3])), ValueError, "logit_lengths"),
        (dict(logit_lengths=torch.tensor([3.0, 2.0])), TypeError, "logit_lengths"),
        (dict(target_lengths=i32([3, 1])), ValueError, "target_lengths"),
        (dict(target_lengths=i32([2, -1])), ValueError, "target_lengths"),
        (dict(blank=5), ValueError, "blank"),
        (dict(blank=-6), ValueError, "blank"),
        (dict(blank=1.0), TypeError, "blank"),
        (dict(reduction="avg"), ValueError, "reduction"),
        (dict(fastemit_lambda=-0.1), ValueError, "fastemit_lambda"),
        (dict(clamp=float("nan")), ValueError, "clamp"),
        (dict(clamp="1"), TypeError, "clamp"),
        (dict(fused_log_softmax="False"), TypeError, "fused_log_softmax"),
        (dict(fused_log_softmax=1), TypeError, "fused_log_softmax"),
        (dict(fastemit_lambda=float("inf")), ValueError, "fastemit_lambda"),
        (dict(logits=torch.randn(0, 3, 3, 5), targets=torch.zeros(0, 2, dtype=torch.int32),
              logit_lengths=torch.zeros(0, dtype=torch.int32), target_lengths=torch.zeros(0, dtype=torch.int32)),
         ValueError, "B = 0"),
    ],
)
def test_bad_inputs(change, exc, match):
    kw = _ok()
    kw.update(change)
    with pytest.raises(exc, match=match):
        chainfb.rnnt_loss(**kw)


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(big_blank_durations=[1]), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=[]), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=3), TypeError, "big_blank_durations"),
        (dict(big_blank_durations=[2, 3, 4, 5, 6]), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=[2, 2**64]), ValueError, "big_blank_durations"),
        (dict(big_blank_durations=[2, 2.5]), TypeError, "big_blank_durations"),
        (dict(blank=1), ValueError, "blank"),
        (dict(sigma=float("nan")), ValueError, "sigma"),
    ],
)
def test_bad_multiblank_inputs(kw, exc, match):
    args = dict(blank=4, big_blank_durations=[2, 3])
    args.update(kw)
    x = torch.randn(2, 3, 2, 5)
    with pytest.raises(exc, match=match):
        chainfb.multiblank_rnnt_loss(x, i32([[1], [0]]), i32([3, 2]), i32([1, 1]), **args)
    # a label equal to a big blank is rejected too
    with pytest.raises(ValueError, match="targets"):
        chainfb.multiblank_rnnt_loss(x, i32([[3], [0]]), i32([3, 2]), i32([1, 1]), 4, [2, 3])


def test_draw_tool_writes_dot(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(paths.REPO)
    env = dict(__import__("os").environ, PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-m", "chainfb.cli.draw_transducer", "--out", str(tmp_path)], check=True,
                   env=env, capture_output=True)
    text = (tmp_path / "multiblank_U2_d2_3.dot").read_text()
    assert "big3@1 (-0.05), 3 steps" in text and "zero" not in text and "digraph" in text
    assert (tmp_path / "rnnt_U3_pdfs.dot").read_text().count("->") == 7


def test_score_map_gather_layout():
    rng = np.random.default_rng(21)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=5, U=3, V=7, reserved=3)
    durations = (2, 3)
    blank = 6
    lay = compile_layout(Ub.numpy(), Tb.numpy(), durations, 0.0, umax=3)
    crit = TransducerCriterion(x.shape, tg, Tb.numpy(), Ub.numpy(), blank, durations)
    assert crit.layout is lay
    X = crit.gather(x, need_grad=False)
    lp = torch.log_softmax(x, -1).numpy()
    assert X.shape == (int((Tb + Ub).max()), lay.lat.num_columns)
    for b in range(3):
        for u in range(int(Ub[b]) + 1):
            for j in range(4):
                c = lay.colidx[b, u, j]
                if j == 1 and u == Ub[b]:
                    assert c == -1
                    continue
                sym = [blank, int(tg[b, u]) if u < Ub[b] else -1, 5, 4][j]
                for n in range(X.shape[0]):
                    t = n - u
                    want = lp[b, t, u, sym] if 0 <= t < Tb[b] else -np.inf
                    assert X[n, c] == pytest.approx(want, abs=1e-12)
    assert (lay.col_j >= 0).all() and len(lay.real) == X.shape[1]  # no zero-pdf columns: every arc reads a symbol


def test_repeated_backward_recomputes_the_gradient():
    rng = np.random.default_rng(22)
    x, tg, Tb, Ub = random_batch(rng)
    x.requires_grad_()
    loss = chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="mean")
    loss.backward(retain_graph=True)
    g1 = x.grad.clone()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * g1.numpy(), rtol=1e-13)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:

    @settings(max_examples=25, deadline=None)
    @given(
        seed=st.integers(0, 2**31 - 1),
        durations=st.lists(st.integers(2, 4), max_size=2),
        B=st.integers(1, 3),
        T=st.integers(1, 6),
        U=st.integers(0, 3),
        lam=st.sampled_from([0.0, 0.25]),
    )
    def test_property_against_grid_reference(seed, durations, B, T, U, lam):
        rng = np.random.default_rng(seed)
        M = len(durations)
        V = 3 + M
        Tb = rng.integers(1, T + 1, B)
        Tb[0] = T
        Ub = rng.integers(0, U + 1, B)
        Ub[0] = U
        tg = torch.tensor(rng.integers(0, V - 1 - M, (B, U)))
        x = torch.tensor(rng.normal(scale=2.0, size=(B, T, U + 1, V)), requires_grad=True)
        sigma = float(rng.uniform(0, 0.2)) if M else 0.0
        blank = V - 1
        if M:
            costs = chainfb.multiblank_rnnt_loss(
                x, tg, torch.tensor(Tb), torch.tensor(Ub), blank, durations, sigma=sigma, fastemit_lambda=lam,
                reduction="none"
            )
        else:
            costs = chainfb.rnnt_loss(x, tg, torch.tensor(Tb), torch.tensor(Ub), blank=blank, fastemit_lambda=lam,
                                      reduction="none")
        costs.sum().backward()
        for b in range(B):
            lp, g = grid_reference(x.detach()[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), blank, durations,
                                   sigma, fastemit=lam)
            assert costs[b].item() == pytest.approx(-(1 + lam) * lp, rel=1e-11)
            np.testing.assert_allclose(x.grad[b].numpy(), g, atol=1e-11)


def test_non_contiguous_logits():
    rng = np.random.default_rng(23)
    x, tg, Tb, Ub = random_batch(rng, B=2, T=4, U=2, V=5)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()  # same values, other strides
    assert not xt.is_contiguous()
    a = chainfb.rnnt_loss(xt, tg, Tb, Ub, reduction="sum")
    a.backward()
    x.requires_grad_()
    b = chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="sum")
    b.backward()
    assert a.item() == pytest.approx(b.item(), rel=1e-14)
    np.testing.assert_allclose(xt.grad.numpy(), x.grad.numpy(), atol=1e-15)


def test_numpy_fused_flag_is_accepted():
    rng = np.random.default_rng(24)
    x, tg, Tb, Ub = random_batch(rng, B=2, T=3, U=2, V=5)
    a = chainfb.rnnt_loss(x, tg, Tb, Ub, fused_log_softmax=np.bool_(False), reduction="none")
    b = chainfb.rnnt_loss(torch.log_softmax(x, -1), tg, Tb, Ub, fused_log_softmax=False, reduction="none")
    assert torch.equal(a, chainfb.rnnt_loss(x, tg, Tb, Ub, fused_log_softmax=False, reduction="none"))
    assert not torch.allclose(a, b)  # unfused: the logits are read as log-probs as they are


def count_crossings(fn):
    """Run ``fn()`` with every torch <-> NumPy / host crossing counted:
    ``{name: calls}`` for ``Tensor.numpy``, ``torch.from_numpy``,
    ``torch.as_tensor``, ``Tensor.cpu``, ``Tensor.tolist``, ``Tensor.item``."""
    import collections

    counts = collections.Counter()
    patched = [(torch.Tensor, "numpy"), (torch, "from_numpy"), (torch, "as_tensor"), (torch.Tensor, "cpu"),
               (torch.Tensor, "tolist"), (torch.Tensor, "item")]
    saved = [getattr(owner, name) for owner, name in patched]

    def counting(orig, label):
        def f(*a, **k):
            counts[label] += 1
            return orig(*a, **k)
        return f

    try:
        for (owner, name), orig in zip(patched, saved):
            setattr(owner, name, counting(orig, name))
        fn()
    finally:
        for (owner, name), orig in zip(patched, saved):
            setattr(owner, name, orig)
    return dict(counts)


def test_cpu_call_crosses_once_each_way():
    """One forward + backward of rnnt_loss on the CPU: the integer inputs go
    to NumPy in one copy, the scores once, the log-likelihoods and the
    posteriors come back once each (the layout's tables are cached)."""
    rng = np.random.default_rng(25)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=6, U=3, V=6, dtype=torch.float32)
    x.requires_grad_()

    def step():
        chainfb.rnnt_loss(x, tg.int(), Tb.int(), Ub.int(), blank=5).backward()

    step()  # compiles and caches the layout
    counts = count_crossings(step)
    assert counts == {"numpy": 2, "from_numpy": 2}, counts


def test_kernel_metadata_is_cached_per_layout(emulated_kernels, monkeypatch):
    """Under the kernels (here their emulation), the per-layout tables
    (colidx, lengths, kind weights) are built once per device
    and handed to every later call as the same arrays."""
    from chainfb.cuda import transducer_maps

    seen = []
    for name in ("transducer_gather", "transducer_grad"):
        orig = getattr(transducer_maps, name)

        def record(*a, _orig=orig, **k):
            seen.append(list(a[3:6]) + [k.get("zero_col")] + list(a[9:10]))  # kept alive: compared by identity
            return _orig(*a, **k)

        monkeypatch.setattr(transducer_maps, name, record)
    rng = np.random.default_rng(26)
    x, tg, Tb, Ub = random_batch(rng, B=3, T=5, U=3, V=8, reserved=3)
    for _ in range(2):
        xd = x.clone().requires_grad_()
        chainfb.multiblank_rnnt_loss(xd, tg, Tb, Ub, 7, [2, 3], fastemit_lambda=0.1).backward()
    gathers, grads = seen[0::2], seen[1::2]
    assert len(gathers) == 2 and len(gathers[0]) == 4 and len(grads[0]) == 5

    def same(a, b):
        return all(u is v for u, v in zip(a, b))

    assert gathers[0][3] is None  # no zero-pdf columns: a big blank is one arc spanning frames
    assert same(gathers[0], gathers[1]) and same(grads[0], grads[1]) and same(grads[0][:3], gathers[0][:3])


def test_threads_share_the_compiled_layouts():
    """rnnt_loss and tdt_loss from 4 threads, over more batch shapes than the
    caches hold (so entries are evicted while others read them): every
    thread gets exactly the single-thread costs and gradients."""
    from threads import in_threads

    from chainfb.transducer import graphs

    rng = np.random.default_rng(27)
    durs = [0, 1, 2]
    cases = []
    for _ in range(2 * graphs._LAYOUTS.size + 4):
        Tb = torch.tensor(rng.integers(1, 7, 3))
        Ub = torch.tensor(rng.integers(0, 4, 3))
        x = torch.tensor(rng.normal(size=(3, 6, 4, 6 + len(durs))))
        tg = torch.tensor(rng.integers(0, 5, (3, 3)))
        cases.append((x, tg, Tb, Ub))

    def run(case):
        x, tg, Tb, Ub = case
        a = x[..., :6].clone().requires_grad_()
        ra = chainfb.rnnt_loss(a, tg, Tb, Ub, blank=5, reduction="none")
        ra.sum().backward()
        b = x.clone().requires_grad_()
        rb = chainfb.tdt_loss(b, tg, Tb, Ub, 5, durs, sigma=0.05, reduction="none")
        rb.sum().backward()
        return ra.detach(), a.grad, rb.detach(), b.grad

    want = [run(c) for c in cases]
    got = [[None] * len(cases) for _ in range(4)]

    def worker(k):
        for i in (range(len(cases)) if k % 2 == 0 else reversed(range(len(cases)))):
            got[k][i] = run(cases[i])

    errors = in_threads(worker, 4)
    assert not errors, errors
    for k in range(4):
        for w, g in zip(want, got[k]):
            for a, b in zip(w, g):
                assert torch.equal(a, b)


# ------------------------------------------------------------- per device
class TransducerTests:
    """The public losses per device (torch score map on the CPU, the CUDA
    kernels on a GPU or under emulation), against the grid reference."""

    @pytest.mark.parametrize("durations, fastemit, clamp", [((), 0.0, -1.0), ((), 0.3, 0.05), ((2, 4), 0.2, -1.0)])
    def test_against_grid_reference(self, durations, fastemit, clamp):
        rng = np.random.default_rng(300)
        M = len(durations)
        x, tg, Tb, Ub = random_batch(rng, B=4, T=7, U=4, V=7 + M, reserved=1 + M)
        blank = x.shape[-1] - 1
        sigma = 0.05 if M else 0.0
        xd = self.tensor(x.clone()).requires_grad_()
        args = (xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub))
        if M:
            costs = chainfb.multiblank_rnnt_loss(*args, blank, durations, sigma=sigma, fastemit_lambda=fastemit,
                                                 clamp=clamp, reduction="none")
        else:
            costs = chainfb.rnnt_loss(*args, blank=blank, fastemit_lambda=fastemit, clamp=clamp, reduction="none")
        assert costs.device.type == self.device
        costs.sum().backward()
        for b in range(4):
            lp, g = grid_reference(x[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), blank, durations, sigma,
                                   fastemit=fastemit)
            if clamp > 0:
                g = np.clip(g, -clamp, clamp)
            assert costs[b].item() == pytest.approx(-(1 + fastemit) * lp, rel=1e-10)
            np.testing.assert_allclose(self.numpy(xd.grad[b]), g, atol=1e-10)

    def test_gradcheck(self):
        rng = np.random.default_rng(301)
        x, tg, Tb, Ub = random_batch(rng, B=2, T=3, U=2, V=4)
        xd = self.tensor(x.clone()).requires_grad_()
        tg, Tb, Ub = self.tensor(tg), self.tensor(Tb), self.tensor(Ub)
        assert torch.autograd.gradcheck(lambda z: chainfb.rnnt_loss(z, tg, Tb, Ub, reduction="mean"), (xd,))

    def test_impossible_utterance_costs_inf_with_zero_gradient(self):
        rng = np.random.default_rng(302)
        x, tg, Tb, Ub = random_batch(rng, B=2, T=3, U=2, V=5)
        Tb[1] = 0
        xd = self.tensor(x.clone()).requires_grad_()
        costs = chainfb.rnnt_loss(xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub), reduction="none")
        assert torch.isinf(costs[1]) and torch.isfinite(costs[0])
        costs.sum().backward()
        assert not xd.grad[1].any() and xd.grad[0].any()

    @pytest.mark.parametrize("durations", [(), (2,)])
    def test_each_utterance_gradient_times_its_incoming_gradient(self, durations):
        """Backward scales each utterance's gradient by its incoming gradient, a non-finite one counting as 0
        (on the kernels, in the gradient kernel's one pass, in backward)."""
        rng = np.random.default_rng(304)
        M = len(durations)
        x, tg, Tb, Ub = random_batch(rng, B=4, T=5, U=3, V=6 + M, reserved=1 + M)
        blank = x.shape[-1] - 1

        def costs(z):
            args = (z, self.tensor(tg), self.tensor(Tb), self.tensor(Ub))
            if M:
                return chainfb.multiblank_rnnt_loss(*args, blank, durations, reduction="none")
            return chainfb.rnnt_loss(*args, blank=blank, reduction="none")

        xd = self.tensor(x.clone()).requires_grad_()
        (unit,) = torch.autograd.grad(costs(xd).sum(), xd)
        weights = self.tensor(torch.tensor([0.5, -2.0, float("inf"), float("nan")], dtype=x.dtype))
        (got,) = torch.autograd.grad((costs(xd) * weights).sum(), xd)
        want = unit * self.tensor(torch.tensor([0.5, -2.0, 0.0, 0.0], dtype=x.dtype)).view(-1, 1, 1, 1)
        np.testing.assert_allclose(self.numpy(got), self.numpy(want), rtol=1e-12, atol=0)
        assert not got[2:].any()

    def test_logits_changed_in_place_before_backward_is_an_error(self):
        """The gradient may be written in backward from the logits (the kernels): logits changed in place after
        forward are autograd's usual error, on every device."""
        rng = np.random.default_rng(305)
        x, tg, Tb, Ub = random_batch(rng, B=2, T=4, U=2, V=5)
        leaf = self.tensor(x.clone()).requires_grad_()
        logits = leaf * 1.0
        cost = chainfb.rnnt_loss(logits, self.tensor(tg), self.tensor(Tb), self.tensor(Ub))
        with torch.no_grad():
            logits.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            cost.backward()

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
    def test_low_precision_inputs(self, dtype):
        rng = np.random.default_rng(303)
        x, tg, Tb, Ub = random_batch(rng, B=2, T=5, U=3, V=6)
        ref = chainfb.rnnt_loss(x.to(dtype).double(), tg, Tb, Ub, reduction="none")
        xd = self.tensor(x.to(dtype).clone()).requires_grad_()
        costs = chainfb.rnnt_loss(xd, self.tensor(tg), self.tensor(Tb), self.tensor(Ub), reduction="none")
        costs.sum().backward()
        assert costs.dtype == dtype and xd.grad.dtype == dtype
        np.testing.assert_allclose(self.numpy(costs.double()), ref.numpy(), rtol=2e-2)


class TestTransducerCPU(TransducerTests, OnCPU):
    pass


class TestTransducerCUDA(TransducerTests, OnCUDA):
    pass


class TestTransducerEmulated(TransducerTests, OnEmulatedKernels):
    pass


@pytest.mark.parametrize("family,durations", [("rnnt", ()), ("rnnt", (2, 40)), ("tdt", (0, 1, 3, 40))])
def test_packed_step_graphs_are_the_batch_graphs(family, durations):
    """compile_layout's graphs, taken from one packing of every label count,
    are each sequence's own step graph (frameless utterances impossible,
    durations longer than every utterance without arcs), and the lattice's
    columns follow; label counts past the packing bound take the batch's
    own graphs."""
    from chainfb.transducer import graphs

    rng = np.random.default_rng(31)
    for top in (20, graphs._PACKED_MAX + 3):
        U = rng.integers(0, top, 6)
        U[0] = top - 1
        T = rng.integers(0, 30, 6)
        T[1] = 0
        lay = compile_layout(U, T, durations, umax=top - 1, family=family)
        own = graphs._batch_graphs(U, T, graphs._builder(family, durations, 0.0, T))
        for n in range(6):
            g, h = lay.batch.fsts[lay.batch.seq_to_graph[n]], own.fsts[own.seq_to_graph[n]]
            assert g == h
        lat = lay.lat
        assert lat.num_columns == Lattice(own).num_columns
        np.testing.assert_array_equal(lat.col_pdf, Lattice(own).col_pdf)
        np.testing.assert_array_equal(lat.final, Lattice(own).final)
