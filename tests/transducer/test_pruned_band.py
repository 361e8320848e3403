"""The pruned loss on the band's own graph (chainfb.transducer.grid.BandGridCriterion)
against the full grid with -inf outside the band (the float64 loop reference in
tests/oracles/fast_rnnt.py), for bands as prune_ranges makes them and for
bands that must fall back to the full grid; and the fused log-prob functions
of the simple and pruned losses against autograd through plain torch."""

import numpy as np
import pytest
import torch

from chainfb.compat import fast_rnnt as fr
from chainfb.transducer import grid, pruned

from oracles import fast_rnnt as ref


def close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a.detach().double()), np.asarray(b.detach().double()), rtol=tol, atol=tol)


def band_case(seed, B=5, S=7, T=9, R=3, C=6):
    """Logits on a random band whose start rises by 0 .. R - 1 per frame and
    reaches each sequence's last symbol on its last frame (as prune_ranges
    makes it), lengths with padding, S_b = 0, S_b < R - 1 and T_b = 1."""
    rng = np.random.default_rng(seed)
    bd = np.array([[0, 0, S, T], [0, 0, 3, 6], [0, 0, 0, 4], [0, 0, 1, 1], [0, 0, 5, 5]])[:B]
    start = np.zeros((B, T), dtype=np.int64)
    for b, (_, _, s_end, t_end) in enumerate(bd):
        last = max(s_end - R + 1, 0)
        for t in range(1, T):
            start[b, t] = min(start[b, t - 1] + rng.integers(0, R), last, S + 1 - R)
        start[b, t_end - 1:] = last
    ranges = torch.from_numpy(start[:, :, None] + np.arange(R))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, R, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    return logits, symbols, ranges, torch.from_numpy(bd)


@pytest.mark.parametrize("delay_penalty", [0.0, 0.3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_band_graph_equals_the_full_grid(seed, delay_penalty):
    logits, symbols, ranges, bd = band_case(seed)
    assert grid.band_start(ranges, bd.numpy()) is not None  # the band's own graph runs
    x = logits.clone().requires_grad_()
    kw = dict(boundary=bd, delay_penalty=delay_penalty)
    loss, (pxg, pyg) = fr.rnnt_loss_pruned(x, symbols, ranges, 0, reduction="none", return_grad=True, **kw)
    want, (pxg_ref, pyg_ref) = ref.rnnt_loss_pruned_reference(logits, symbols, ranges, 0, reduction="none",
                                                              return_grad=True, **kw)
    close(loss, want)
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    assert pxg.shape == (5, 7, 10) and pyg.shape == (5, 8, 9)
    # the logits' gradient equals the full grid's (torch autograd through the -inf-padded grids)
    w = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    (loss * w).sum().backward()
    y = logits.clone().requires_grad_()
    px, py = pruned.rnnt_logprobs_pruned(y, symbols, ranges, 0, bd, delay_penalty=delay_penalty)
    (-pruned.grid_loglike(px, py, bd) * w).sum().backward()
    close(x.grad, y.grad)


def test_band_graph_float32_matches_float64_to_rounding():
    logits, symbols, ranges, bd = band_case(3)
    got = fr.rnnt_loss_pruned(logits.float(), symbols, ranges, 0, bd, reduction="none")
    want = ref.rnnt_loss_pruned_reference(logits, symbols, ranges, 0, bd, reduction="none")
    assert got.dtype == torch.float32
    close(got, want, tol=1e-5)


def _falling(ranges):
    r = ranges.clone()
    r[0, 3] = r[0, 2] - 1 if r[0, 2, 0] > 0 else r[0, 2] + 1  # start moves back (or a hole opens)
    r[0, 3] = r[0, 3].clamp(min=0)
    r[0, 4:] = torch.maximum(r[0, 4:], r[0, 3])
    return r


@pytest.mark.parametrize("bend", ["holes", "falling", "late_start", "short_of_the_end", "offset_boundary"])
def test_bands_the_band_graph_cannot_run_fall_back_to_the_full_grid(bend):
    logits, symbols, ranges, bd = band_case(4)
    if bend == "holes":  # a row that is not consecutive positions
        ranges = ranges.clone()
        ranges[0, 2, 2] += 1
    elif bend == "falling":
        ranges = _falling(ranges)
    elif bend == "late_start":  # (0, 0) outside the band: no path
        ranges = ranges.clone()
        ranges[1, 0] += 1
    elif bend == "short_of_the_end":  # the last frame's band misses s_end: no path
        ranges = ranges.clone()
        ranges[0, -1] -= 2
    else:  # a boundary that does not start at (0, 0)
        bd = bd.clone()
        bd[0, 0] = 1
    assert grid.band_start(ranges, bd.numpy()) is None
    x = logits.clone().requires_grad_()
    loss, (pxg, pyg) = fr.rnnt_loss_pruned(x, symbols, ranges, 0, bd, reduction="none", return_grad=True)
    # the full grid with -inf outside the band (the scores at the positions ranges names)
    px, py = pruned.rnnt_logprobs_pruned(logits, symbols, ranges, 0, bd)
    want, (pxg_ref, pyg_ref) = pruned.grid_loglike(px, py, bd, return_grad=True)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(loss), fin)
    close(loss[fin], -want[fin])
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    if bend != "holes":  # k2 reads a band as consecutive positions from ranges[:, :, 0]
        close(loss[fin], ref.rnnt_loss_pruned_reference(logits, symbols, ranges, 0, bd, reduction="none")[fin])


def test_band_graph_after_prune_ranges_on_a_batch():
    """The pipeline's own ranges take the band graph, and its loss is the reference's."""
    g = torch.Generator().manual_seed(5)
    B, S, T, C = 3, 6, 11, 7
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    bd = torch.tensor([[0, 0, 6, 11], [0, 0, 2, 7], [0, 0, 6, 6]])
    for s_range in (2, 3, 5):
        _, grads = fr.rnnt_loss_simple(lm, am, symbols, 0, bd, return_grad=True)
        ranges = fr.get_rnnt_prune_ranges(*grads, bd, s_range)
        assert grid.band_start(ranges, bd.numpy()) is not None
        am_p, lm_p = fr.do_rnnt_pruning(am, lm, ranges)
        band = am_p + torch.tanh(lm_p)
        close(fr.rnnt_loss_pruned(band, symbols, ranges, 0, bd, reduction="sum"),
              ref.rnnt_loss_pruned_reference(band, symbols, ranges, 0, bd, reduction="sum"))


def test_band_graph_has_s_range_states():
    logits, symbols, ranges, bd = band_case(6)
    start = grid.band_start(ranges, bd.numpy())
    crit = grid.BandGridCriterion(logits[..., 0], logits[..., 1], start, bd.numpy())
    assert crit.lattice.num_states == 5 * 3  # R states per sequence, whatever S
    assert crit.lengths.tolist() == (bd[:, 2] + bd[:, 3]).tolist()


# ------------------------------------------------------------ fused log-probs


def _additive_reference(am, lm, sy, blank):
    """(px, py) of the additive joiner through plain torch (autograd's gradient)."""
    norm = torch.logsumexp(am[:, None, :, :] + lm[:, :, None, :], dim=3)  # [B, S + 1, T]
    S = lm.shape[1] - 1
    px = torch.gather(am.transpose(1, 2), 1, sy[:, :, None].expand(-1, -1, am.shape[1]))
    px = px + torch.gather(lm[:, :S], 2, sy[:, :, None]) - norm[:, :S]
    return px, am[:, :, blank][:, None, :] + lm[:, :, blank][:, :, None] - norm


def _regular_reference(px, t_end):
    """The regular topology's px: the column t = T and t = t_end at -inf."""
    px = torch.nn.functional.pad(px, (0, 1), value=-np.inf)
    keep = torch.ones_like(px, dtype=torch.bool)
    for b, t in enumerate(t_end):
        keep[b, :, t] = False
    return torch.where(keep, px, torch.full_like(px, -np.inf))


@pytest.mark.parametrize("S", [0, 1, 4])
@pytest.mark.parametrize("regular", [False, True])
@pytest.mark.parametrize("compiled", [True, False])
def test_additive_logprobs_and_gradient_match_autograd(S, regular, compiled, monkeypatch):
    """Both score maps of the additive joiner (compiled and torch), with and
    without the regular topology's -inf column, against plain autograd: the
    same numbers, and the same gradient (none through the -inf entries)."""
    from chainfb.transducer.maps import compiled as cpu_maps

    if compiled and not cpu_maps.available(torch.float64):
        pytest.skip("no compiled score maps")
    if not compiled:
        monkeypatch.setattr(cpu_maps, "available", lambda dtype=None: False)
    g = torch.Generator().manual_seed(S)
    am = torch.randn(3, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    lm = (3 * torch.randn(3, S + 1, 6, generator=g, dtype=torch.float64)).requires_grad_()
    sy = torch.randint(0, 6, (3, S), generator=g)
    bd = np.array([[0, 0, S, 5], [0, 0, S, 3], [0, 1, S, 5]]) if regular else None
    got = pruned._AdditiveLogprobs.apply(am, lm, sy, 2, bd)
    want = _additive_reference(am, lm, sy, 2)
    if regular:
        want = (_regular_reference(want[0], bd[:, 3]), want[1])
    grads = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in want]
    for a, b in zip(got, want):
        assert a.shape == b.shape
        close(a, b)
    d_got = torch.autograd.grad(got, (am, lm), grads)
    d_want = torch.autograd.grad(want, (am, lm), grads)
    for a, b in zip(d_got, d_want):
        close(a, b)
    assert torch.autograd.gradcheck(lambda a, m: pruned._AdditiveLogprobs.apply(a, m, sy, 2, bd)[1], (am, lm))
    if not regular:  # (the -inf entries of the regular px defeat finite differences)
        assert torch.autograd.gradcheck(lambda a, m: pruned._AdditiveLogprobs.apply(a, m, sy, 2, bd), (am, lm))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_additive_score_maps_agree_to_the_bit(dtype, monkeypatch):
    """The compiled additive joiner does torch's operations in torch's order."""
    from chainfb.transducer.maps import compiled as cpu_maps

    if not cpu_maps.available(dtype):
        pytest.skip("no compiled score maps")
    g = torch.Generator().manual_seed(5)
    B, T, S, C = 4, 37, 9, 23
    am, lm = torch.randn(B, T, C, generator=g, dtype=dtype), torch.randn(B, S + 1, C, generator=g, dtype=dtype)
    sy = torch.randint(0, C, (B, S), generator=g)
    bd = np.array([[0, 0, S, T], [0, 0, 3, 20], [0, 0, S, 1], [0, 0, 0, 36]])
    for b in (bd, None):
        got = pruned._AdditiveLogprobs.apply(am, lm, sy, 0, b)
        with monkeypatch.context() as m:
            m.setattr(cpu_maps, "available", lambda dtype=None: False)
            want = pruned._AdditiveLogprobs.apply(am, lm, sy, 0, b)
        for x, y in zip(got, want):
            assert torch.equal(x, y)


def test_softmax_scale_is_the_log_sum_exp():
    """The joiner's rows as softmax and log-scale: exp(x) = softmax * exp(scale),
    the scale being logsumexp (rows with -inf entries, large and small values)."""
    g = torch.Generator().manual_seed(9)
    x = 40 * torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    x[0, 0, :3] = -np.inf
    x[1, 2] = x[1, 2] - 800.0
    e, scale = pruned._softmax_scale(x)
    close(scale[..., 0], torch.logsumexp(x, dim=2), tol=1e-12)
    close(e, torch.softmax(x, dim=2), tol=1e-15)
    assert e.shape == x.shape and scale.shape == (3, 4, 1)


def test_band_logprobs_gradient_with_minus_inf_logits():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64)
    x[0, 1, 2, 3] = -np.inf  # a symbol that cannot be emitted there
    sym = torch.randint(0, 5, (2, 4, 3), generator=g)
    sym[0, 1, 2] = 4
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = pruned._BandLogprobs.apply(a, sym, 0)
    lsm = torch.log_softmax(b, dim=3)
    want = (torch.gather(lsm, 3, sym[..., None])[..., 0], lsm[..., 0])
    grads = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in want]
    for u, v in zip(got, want):
        close(u, v)
    torch.autograd.backward(got, grads)
    torch.autograd.backward(want, grads)
    close(a.grad, b.grad)
    y = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: pruned._BandLogprobs.apply(t, sym, 0), (y,))


def test_fused_logprobs_refuse_second_derivatives():
    g = torch.Generator().manual_seed(8)
    am = torch.randn(2, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    lm = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    px, py = pruned._AdditiveLogprobs.apply(am, lm, torch.ones(2, 2, dtype=torch.int64), 0, None)
    d_am, = torch.autograd.grad(px.sum() + py.sum(), am, create_graph=True)
    with pytest.raises(RuntimeError):
        d_am.sum().backward()
    x = torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    px, py = pruned._BandLogprobs.apply(x, torch.ones(2, 4, 3, dtype=torch.int64), 0)
    d_x, = torch.autograd.grad(px.sum() + py.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        torch.autograd.grad(d_x.sum(), x)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_grid_return_grad_runs_the_engine_once(monkeypatch, requires_grad):
    """``return_grad`` gives the same totals and occupancies whether or not
    the inputs require grad, from one engine run either way."""
    from chainfb import criterion

    torch.manual_seed(3)
    B, S, T = 2, 4, 6
    px = torch.randn(B, S, T + 1, dtype=torch.float64).log_softmax(1)
    py = torch.randn(B, S + 1, T, dtype=torch.float64).log_softmax(1)
    want_total, want_grads = grid.grid_loglike(px.clone().requires_grad_(), py.clone().requires_grad_(),
                                               return_grad=True)
    calls = []
    run = criterion.engines.forward_backward
    monkeypatch.setattr(criterion.engines, "forward_backward", lambda *a, **k: calls.append(1) or run(*a, **k))
    total, grads = grid.grid_loglike(px.requires_grad_(requires_grad), py.requires_grad_(requires_grad),
                                     return_grad=True)
    assert len(calls) == 1
    torch.testing.assert_close(total.detach(), want_total.detach(), rtol=0, atol=0)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
