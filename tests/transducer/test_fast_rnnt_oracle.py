"""Self-checks of the k2 / fast_rnnt reference (tests/oracles/fast_rnnt.py):
path enumeration, autograd, a direct RNN-T recursion, and the documented
properties of the k2 functions."""

import itertools

import pytest
import torch

from oracles import fast_rnnt as ref

TYPES = ["regular", "modified", "constrained"]


# ----------------------------------------------------------------------------
# independent helpers


def enumerate_paths(sb, tb, se, te, diagonal):
    """Every monotone path from (sb, tb) to (se, te) as a list of arcs
    ``("x", s, t)`` (symbol from cell (s, t)) / ``("y", s, t)`` (blank)."""
    out = []

    def walk(s, t, arcs):
        if (s, t) == (se, te):
            out.append(list(arcs))
            return
        dt = 1 if diagonal else 0
        if s + 1 <= se and t + dt <= te:
            walk(s + 1, t + dt, arcs + [("x", s, t)])
        if t + 1 <= te:
            walk(s, t + 1, arcs + [("y", s, t)])

    walk(sb, tb, [])
    return out


def enum_total(px, py, boundary=None):
    """Differentiable total by enumeration (torch), shape [B]."""
    B, S, T1 = px.shape
    T = py.shape[2]
    rows = [(0, 0, S, T)] * B if boundary is None else boundary.tolist()
    totals = []
    for b, (sb, tb, se, te) in enumerate(rows):
        scores = []
        for path in enumerate_paths(sb, tb, se, te, diagonal=(T1 == T)):
            sc = px.new_zeros(())
            for kind, s, t in path:
                sc = sc + (px[b, s, t] if kind == "x" else py[b, s, t])
            scores.append(sc)
        if scores:
            totals.append(torch.logsumexp(torch.stack(scores), 0))
        else:
            totals.append(px.new_tensor(float("-inf")))
    return torch.stack(totals)


def rnnt_direct(logits, targets, t_len, u_len, blank):
    """Plain RNN-T loss (torchaudio's definition) by a direct recursion:
    alpha over t in [0, T), u in [0, U]; loss = -(alpha[T-1, U] + blank(T-1, U))."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    out = []
    for b in range(logits.shape[0]):
        T, U = int(t_len[b]), int(u_len[b])
        alpha = [[None] * (U + 1) for _ in range(T)]
        for t in range(T):
            for u in range(U + 1):
                terms = []
                if t == 0 and u == 0:
                    terms.append(lp.new_zeros(()))
                if t > 0:
                    terms.append(alpha[t - 1][u] + lp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t][u - 1] + lp[b, t, u - 1, targets[b, u - 1]])
                alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
        out.append(-(alpha[T - 1][U] + lp[b, T - 1, U, blank]))
    return torch.stack(out)


def path_score_constrained(lp, b, path, sym, blank):
    """Constrained: a symbol at (s, t) costs log P(y_s | s, t) + log P(blank | s+1, t)
    and moves to (s+1, t+1); a blank costs log P(blank | s, t)."""
    sc = 0.0
    for kind, s, t in path:
        if kind == "x":
            sc += lp[b, t, s, sym[b, s]] + lp[b, t, s + 1, blank]
        else:
            sc += lp[b, t, s, blank]
    return sc


def random_case(B=3, S=3, T=5, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(0, C - 1, (B, S), generator=g)
    return am, lm, symbols, C - 1


def as_boundary(rows):
    return torch.tensor(rows, dtype=torch.int64)


# ----------------------------------------------------------------------------
# the recursion


MI_CASES = {
    "regular": (4, [[0, 0, 3, 4], [1, 0, 3, 4], [0, 1, 2, 3], [0, 0, 0, 2], [0, 0, 2, 0], [1, 2, 1, 2]]),
    "modified": (4, [[0, 0, 3, 4], [1, 0, 3, 4], [0, 1, 2, 3], [0, 0, 0, 2], [0, 0, 2, 2], [1, 2, 1, 2]]),
}


@pytest.mark.parametrize("kind", ["regular", "modified"])
@pytest.mark.parametrize("use_boundary", [False, True])
def test_mi_matches_enumeration_and_autograd(kind, use_boundary):
    T, rows = MI_CASES[kind]
    B, S = len(rows), 3
    g = torch.Generator().manual_seed(7)
    T1 = T + 1 if kind == "regular" else T
    px = torch.randn(B, S, T1, generator=g, dtype=torch.float64, requires_grad=True)
    py = torch.randn(B, S + 1, T, generator=g, dtype=torch.float64, requires_grad=True)
    boundary = as_boundary(rows) if use_boundary else None

    total, pxg, pyg = ref.mi_reference(px, py, boundary)
    expect = enum_total(px, py, boundary)
    torch.testing.assert_close(total, expect.detach(), rtol=1e-12, atol=1e-12)
    gx, gy = torch.autograd.grad(expect.sum(), [px, py])
    torch.testing.assert_close(pxg, gx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(pyg, gy, rtol=1e-10, atol=1e-12)

    # every path uses (s_end - s_begin) symbol arcs and a fixed number of blanks
    rows = rows if use_boundary else [[0, 0, S, T]] * B
    for b, (sb, tb, se, te) in enumerate(rows):
        n_blank = (te - tb) - ((se - sb) if kind == "modified" else 0)
        assert pxg[b].sum().item() == pytest.approx(se - sb)
        assert pyg[b].sum().item() == pytest.approx(n_blank)


def test_mi_infeasible_modified_is_minus_inf_with_zero_grads():
    px = torch.randn(1, 3, 2, dtype=torch.float64)
    py = torch.randn(1, 4, 2, dtype=torch.float64)
    total, pxg, pyg = ref.mi_reference(px, py)  # S = 3 symbols in T = 2 frames
    assert total.item() == float("-inf")
    assert pxg.abs().sum() == 0 and pyg.abs().sum() == 0


def test_mi_empty_rectangle():
    px = torch.randn(1, 2, 4, dtype=torch.float64)
    py = torch.randn(1, 3, 3, dtype=torch.float64)
    total, pxg, pyg = ref.mi_reference(px, py, as_boundary([[1, 2, 1, 2]]))
    assert total.item() == 0.0
    assert pxg.abs().sum() == 0 and pyg.abs().sum() == 0


# ----------------------------------------------------------------------------
# px / py


def test_k2_basic_example():
    """The example of k2's test_rnnt_loss_basic (k2 publishes no number; all
    routes must agree with torchaudio's definition)."""
    lm = torch.tensor([[[0, 0, 1], [0, 1, 1], [1, 0, 1], [2, 2, 0]]], dtype=torch.float64)
    am = torch.tensor([[[0, 1, 2], [0, 0, 0], [0, 2, 4], [0, 3, 3]]], dtype=torch.float64)
    symbols = torch.tensor([[0, 1, 0]])
    term = 2
    logits = am.unsqueeze(2) + lm.unsqueeze(1)
    expect = rnnt_direct(logits, symbols, [4], [3], term)
    px, py = ref.logprobs_simple(lm, am, symbols, term)
    assert px.shape == (1, 3, 5) and py.shape == (1, 4, 4)
    loss = ref.loss_from_logprobs(px, py, reduction="none")
    torch.testing.assert_close(loss, expect)
    torch.testing.assert_close(ref.rnnt_loss_reference(logits, symbols, term, reduction="none"), expect)
    torch.testing.assert_close(
        ref.rnnt_loss_smoothed_reference(lm, am, symbols, term, 0.0, 0.0, reduction="none"), expect
    )
    # value of this fixture under the definition above
    assert loss.item() == pytest.approx(7.5040133560218, abs=1e-10)
    # invariance to per-frame constants
    g = torch.Generator().manual_seed(3)
    lm2 = lm + torch.randn(1, 4, 1, generator=g, dtype=torch.float64)
    am2 = am + torch.randn(1, 4, 1, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ref.rnnt_loss_simple_reference(lm2, am2, symbols, term, reduction="none"), expect)


def test_regular_joint_equals_direct_rnnt():
    am, lm, symbols, term = random_case(B=3, S=3, T=5, seed=1)
    logits = am.unsqueeze(2) + torch.tanh(lm.unsqueeze(1) * am.unsqueeze(2))  # a non-additive joiner
    u_len, t_len = [3, 2, 0], [5, 3, 2]
    boundary = as_boundary([[0, 0, u, t] for u, t in zip(u_len, t_len)])
    expect = rnnt_direct(logits, symbols, t_len, u_len, term)
    got = ref.rnnt_loss_reference(logits, symbols, term, boundary, reduction="none")
    torch.testing.assert_close(got, expect)
    full = ref.rnnt_loss_reference(logits, symbols, term, reduction="none")
    torch.testing.assert_close(full, rnnt_direct(logits, symbols, [5] * 3, [3] * 3, term))


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_simple_joint_smoothed_agree(rnnt_type):
    am, lm, symbols, term = random_case(B=3, S=3, T=5, seed=2)
    boundary = as_boundary([[0, 0, 3, 5], [0, 0, 2, 4], [0, 0, 1, 3]])
    logits = am.unsqueeze(2) + lm.unsqueeze(1)
    a = ref.logprobs_simple(lm, am, symbols, term, boundary, rnnt_type)
    b = ref.logprobs_joint(logits, symbols, term, boundary, rnnt_type)
    c = ref.logprobs_smoothed(lm, am, symbols, term, 0.0, 0.0, boundary, rnnt_type)
    for x, y in [(a, b), (a, c)]:
        torch.testing.assert_close(x[0], y[0])
        torch.testing.assert_close(x[1], y[1])
    T1 = 6 if rnnt_type == "regular" else 5
    assert a[0].shape == (3, 3, T1) and a[1].shape == (3, 4, 5)
    if rnnt_type == "regular":
        assert torch.isinf(a[0][:, :, 5]).all()
        for bb, te in enumerate([5, 4, 3]):
            assert torch.isinf(a[0][bb, :, te]).all()
            assert torch.isfinite(a[0][bb, :, :te]).all()


@pytest.mark.parametrize("rnnt_type", ["modified", "constrained"])
def test_modified_and_constrained_paths(rnnt_type):
    am, lm, symbols, term = random_case(B=2, S=2, T=4, seed=3)
    logits = am.unsqueeze(2) + torch.sin(lm.unsqueeze(1) + am.unsqueeze(2))
    lp = torch.log_softmax(logits, dim=-1)
    rows = [[0, 0, 2, 4], [0, 0, 1, 3]]
    loss = ref.rnnt_loss_reference(logits, symbols, term, as_boundary(rows), rnnt_type, reduction="none")
    for b, (sb, tb, se, te) in enumerate(rows):
        scores = []
        for path in enumerate_paths(sb, tb, se, te, diagonal=True):
            if rnnt_type == "constrained":
                scores.append(path_score_constrained(lp, b, path, symbols, term))
            else:
                scores.append(sum(lp[b, t, s, symbols[b, s] if k == "x" else term] for k, s, t in path))
        assert loss[b].item() == pytest.approx(-torch.logsumexp(torch.stack(scores), 0).item(), abs=1e-10)


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("use_boundary", [False, True])
def test_delay_penalty_by_enumeration(rnnt_type, use_boundary):
    am, lm, symbols, term = random_case(B=2, S=2, T=4, seed=4)
    rows = [[0, 0, 2, 4], [0, 0, 1, 3]] if use_boundary else [[0, 0, 2, 4]] * 2
    boundary = as_boundary(rows) if use_boundary else None
    dp = 0.7
    px0, py0 = ref.logprobs_simple(lm, am, symbols, term, boundary, rnnt_type)
    px1, py1 = ref.logprobs_simple(lm, am, symbols, term, boundary, rnnt_type, delay_penalty=dp)
    torch.testing.assert_close(py0, py1)
    loss = ref.loss_from_logprobs(px1, py1, boundary, reduction="none")
    for b, (sb, tb, se, te) in enumerate(rows):
        offset = (te - 1) / 2
        scores = []
        for path in enumerate_paths(sb, tb, se, te, diagonal=rnnt_type != "regular"):
            sc = 0.0
            for k, s, t in path:
                sc += px0[b, s, t].item() + dp * (offset - t) if k == "x" else py0[b, s, t].item()
            scores.append(sc)
        want = -torch.logsumexp(torch.tensor(scores, dtype=torch.float64), 0).item()
        assert loss[b].item() == pytest.approx(want, abs=1e-10)
    # a negative penalty is ignored
    pxn, _ = ref.logprobs_simple(lm, am, symbols, term, boundary, rnnt_type, delay_penalty=-1.0)
    torch.testing.assert_close(pxn, px0)


def test_smoothed_invariance_and_formula():
    am, lm, symbols, term = random_case(B=2, S=3, T=4, seed=5)
    ls, as_ = 0.25, 0.333
    loss = ref.rnnt_loss_smoothed_reference(lm, am, symbols, term, ls, as_, reduction="none")
    g = torch.Generator().manual_seed(9)
    lm2 = lm + torch.randn(2, 4, 1, generator=g, dtype=torch.float64)
    am2 = am + torch.randn(2, 4, 1, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ref.rnnt_loss_smoothed_reference(lm2, am2, symbols, term, ls, as_, reduction="none"),
                               loss)
    # formula, vectorised independently
    px, py = ref.logprobs_smoothed(lm, am, symbols, term, ls, as_)
    lm_lsm = torch.log_softmax(lm, -1)
    uni = lm_lsm.exp().mean(dim=(0, 1)) + torch.finfo(torch.float64).tiny
    am_only = am + uni.log() - torch.logsumexp(am + uni.log(), -1, keepdim=True)  # [B,T,C]
    comb = torch.log_softmax(am.unsqueeze(2) + lm.unsqueeze(1), -1)  # [B,T,S+1,C]
    c = 1 - ls - as_
    py_exp = (c * comb[..., term] + ls * lm_lsm[:, None, :, term] + as_ * am_only[:, :, None, term]).transpose(1, 2)
    torch.testing.assert_close(py, py_exp)
    idx = symbols[:, None, :, None].expand(2, 4, 3, 1)
    px_exp = (c * comb[:, :, :3].gather(3, idx)[..., 0]
              + ls * lm_lsm[:, None, :3].expand(2, 4, 3, 5).gather(3, idx)[..., 0]
              + as_ * am_only[:, :, None].expand(2, 4, 3, 5).gather(3, idx)[..., 0]).transpose(1, 2)
    torch.testing.assert_close(px[:, :, :4], px_exp)
    assert torch.isinf(px[:, :, 4]).all()


def test_reductions_and_return_grad():
    am, lm, symbols, term = random_case(B=3, S=2, T=4, seed=6)
    boundary = as_boundary([[0, 0, 2, 4], [0, 0, 1, 4], [0, 0, 2, 3]])
    none = ref.rnnt_loss_simple_reference(lm, am, symbols, term, boundary, reduction="none")
    assert none.shape == (3,)
    torch.testing.assert_close(ref.rnnt_loss_simple_reference(lm, am, symbols, term, boundary, reduction="sum"),
                               none.sum())
    torch.testing.assert_close(ref.rnnt_loss_simple_reference(lm, am, symbols, term, boundary), none.sum() / 3)
    with pytest.raises(ValueError):
        ref.reduce_loss(none, "avg")
    loss, (pxg, pyg) = ref.rnnt_loss_simple_reference(
        lm, am, symbols, term, boundary, reduction="mean", return_grad=True
    )
    torch.testing.assert_close(loss, none.mean())
    px, py = ref.logprobs_simple(lm, am, symbols, term, boundary)
    px, py = px.clone().requires_grad_(), py.clone().requires_grad_()
    gx, gy = torch.autograd.grad(-(-enum_total(px, py, boundary)).sum(), [px, py])
    torch.testing.assert_close(pxg, gx)
    torch.testing.assert_close(pyg, gy)
    assert (pxg >= 0).all() and (pyg >= 0).all()


# ----------------------------------------------------------------------------
# pruning


def test_monotonic_lower_bound_published_examples():
    assert ref._reverse_cummin([0, 2, 1, 3, 6, 5, 8]) == [0, 1, 1, 3, 5, 5, 8]
    x = [[12, 18, 5, 4, 18, 17], [11, 14, 14, 3, 10, 4], [19, 3, 8, 13, 7, 19]]
    y = [[4, 4, 4, 4, 17, 17], [3, 3, 3, 3, 4, 4], [3, 3, 7, 7, 7, 19]]
    assert [ref._reverse_cummin(r) for r in x] == y


def _grads(rnnt_type, seed=0, B=3, S=4, T=7):
    am, lm, symbols, term = random_case(B=B, S=S, T=T, seed=seed)
    boundary = as_boundary([[0, 0, S, T], [0, 0, S - 2, T - 2], [0, 0, 1, T - 3]])
    _, (pxg, pyg) = ref.rnnt_loss_simple_reference(
        lm, am, symbols, term, boundary, rnnt_type, reduction="none", return_grad=True
    )
    return am, lm, symbols, term, boundary, pxg, pyg


def check_range_constraints(ranges, boundary, S, step):
    B, T, r = ranges.shape
    assert ranges.dtype == torch.int64
    assert (ranges == ranges[:, :, :1] + torch.arange(r)).all()
    start = ranges[:, :, 0]
    assert (start[:, 0] == 0).all()
    assert (start >= 0).all() and (ranges <= S).all()
    d = start[:, 1:] - start[:, :-1]
    assert (d >= 0).all() and (d <= step - 1).all()


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("legacy", [False, True])
def test_prune_ranges_constraints(rnnt_type, legacy):
    am, lm, symbols, term, boundary, pxg, pyg = _grads(rnnt_type, seed=11)
    S = symbols.shape[1]
    lo = 1 if (legacy or rnnt_type != "regular") else 2
    for s_range in range(lo, S + 3):
        ranges = ref.prune_ranges_reference(pxg, pyg, boundary, s_range, legacy=legacy)
        width = min(s_range, S if legacy else S + 1) if s_range > S else s_range
        assert ranges.shape == (3, 7, width)
        step = 2 if rnnt_type != "regular" else width
        check_range_constraints(ranges, boundary, S, step)


def test_prune_ranges_widen_and_full_band_equals_full_loss():
    for rnnt_type in TYPES:
        am, lm, symbols, term, boundary, pxg, pyg = _grads(rnnt_type, seed=12)
        S = symbols.shape[1]
        ranges = ref.prune_ranges_reference(pxg, pyg, boundary, s_range=S + 5)
        assert ranges.shape[2] == S + 1
        assert (ranges == torch.arange(S + 1)).all()
        am_p, lm_p = ref.do_rnnt_pruning_reference(am, lm, ranges)
        logits_p = torch.sigmoid(am_p + lm_p)
        logits = torch.sigmoid(am.unsqueeze(2) + lm.unsqueeze(1))
        full = ref.rnnt_loss_reference(logits, symbols, term, boundary, rnnt_type, reduction="none")
        pruned = ref.rnnt_loss_pruned_reference(logits_p, symbols, ranges, term, boundary, rnnt_type, reduction="none")
        torch.testing.assert_close(pruned, full)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_pruned_logprobs_band(rnnt_type):
    am, lm, symbols, term, boundary, pxg, pyg = _grads(rnnt_type, seed=13)
    B, T, C = am.shape
    S = symbols.shape[1]
    s_range = 2
    ranges = ref.prune_ranges_reference(pxg, pyg, boundary, s_range)
    am_p, lm_p = ref.do_rnnt_pruning_reference(am, lm, ranges)
    assert am_p.shape == lm_p.shape == (B, T, s_range, C)
    for b, t, k in itertools.product(range(B), range(T), range(s_range)):
        assert torch.equal(am_p[b, t, k], am[b, t]) and torch.equal(lm_p[b, t, k], lm[b, ranges[b, t, k]])
    logits_p = torch.tanh(am_p + lm_p)
    logits = torch.tanh(am.unsqueeze(2) + lm.unsqueeze(1))
    px_f, py_f = ref.logprobs_joint(logits, symbols, term, boundary, rnnt_type, delay_penalty=0.3)
    px_p, py_p = ref.pruned_logprobs_reference(logits_p, symbols, ranges, term, boundary, rnnt_type, delay_penalty=0.3)
    in_band = torch.zeros(B, S + 1, T, dtype=torch.bool)
    for b, t in itertools.product(range(B), range(T)):
        in_band[b, ranges[b, t], t] = True
    torch.testing.assert_close(py_p[in_band], py_f[in_band])
    assert torch.isinf(py_p[~in_band]).all()
    px_band = in_band[:, :S].clone()
    if rnnt_type == "constrained":  # px += py[:, 1:] needs s+1 in the band too
        px_band &= in_band[:, 1:]
    T1 = px_f.shape[2]
    torch.testing.assert_close(px_p[:, :, :T][px_band], px_f[:, :, :T][px_band])
    assert torch.isinf(px_p[:, :, :T][~in_band[:, :S]]).all()
    if T1 == T + 1:
        assert torch.isinf(px_p[:, :, T]).all()
    # the pruned loss can only be larger (fewer paths, same arc scores)
    full = ref.loss_from_logprobs(px_f, py_f, boundary, reduction="none")
    pruned = ref.loss_from_logprobs(px_p, py_p, boundary, reduction="none")
    assert (pruned >= full - 1e-12).all()


def test_prune_ranges_small_by_hand():
    """One sequence, S = 2, T = 4, regular, hand-made grads: the argmax rule,
    the last-frame padding, and the adjustment."""
    S, T = 2, 4
    pxg = torch.zeros(1, S, T + 1, dtype=torch.float64)
    pyg = torch.zeros(1, S + 1, T, dtype=torch.float64)
    # blank occupancy concentrated on s = 2 at t = 1 (too early: a jump of 2)
    pyg[0, 0, 0] = 1.0
    pyg[0, 2, 1] = 1.0
    pyg[0, 2, 2] = 1.0
    boundary = as_boundary([[0, 0, S, T]])
    ranges = ref.prune_ranges_reference(pxg, pyg, boundary, s_range=2)
    # raw argmax: t0 -> 0, t1 -> 1, t2 -> 1; t3 (>= t_end - 1) -> s_end - 1 = 1
    assert ranges[0, :, 0].tolist() == [0, 1, 1, 1]
    ranges1 = ref.prune_ranges_reference(pxg, pyg, boundary, s_range=1, legacy=True)
    # legacy with s_range 1: t1,t2 -> 2, padding s_end = 2; step <= 0 forces all 0
    assert ranges1[0, :, 0].tolist() == [0, 0, 0, 0]
