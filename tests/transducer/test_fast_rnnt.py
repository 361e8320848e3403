"""The pruned RNN-T family (chainfb.transducer.pruned, chainfb.compat.fast_rnnt)
against the float64 reference in tests/oracles/fast_rnnt.py (plain loops
over the grid), for every rnnt_type, the delay penalty, unequal lengths,
S_b = 1 and T_b = S_b; gradcheck; bad inputs; and, per device, the whole
pruned pipeline through the engine (CPU, CUDA, the emulated kernels)."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb.compat import fast_rnnt as fr
from chainfb.transducer import pruned

from devices import OnCPU, OnCPUNumPy, OnCUDA, OnEmulatedKernels
from oracles import fast_rnnt as ref

TYPES = ["regular", "modified", "constrained"]
# unequal lengths, S_b = 1, T_b = S_b, S_b = 0
BOUNDARY = torch.tensor([[0, 0, 4, 7], [0, 0, 1, 5], [0, 0, 3, 3], [0, 0, 0, 2]])


def case(seed=0, B=4, S=4, T=7, C=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64).to(dtype)
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64).to(dtype)
    symbols = torch.randint(1, C, (B, S), generator=g)
    return am, lm, symbols, 0


def close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a.detach().double()), np.asarray(b.detach().double()), rtol=tol, atol=tol)


# ------------------------------------------------------------------ the grid


@pytest.mark.parametrize("modified", [False, True])
def test_mutual_information_against_reference(modified):
    g = torch.Generator().manual_seed(1)
    B, S, T = 6, 3, 4
    px = torch.randn(B, S, T if modified else T + 1, generator=g, dtype=torch.float64, requires_grad=True)
    py = torch.randn(B, S + 1, T, generator=g, dtype=torch.float64, requires_grad=True)
    bd = torch.tensor([[0, 0, 3, 4], [1, 0, 3, 4], [0, 1, 2, 3], [0, 0, 0, 2], [0, 0, 2, 2], [1, 2, 1, 2]])
    total, (pxg, pyg) = fr.mutual_information_recursion(px, py, bd, return_grad=True)
    t_ref, pxg_ref, pyg_ref = ref.mi_reference(px.detach(), py.detach(), bd)
    close(total, t_ref)
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    total.sum().backward()
    close(px.grad, pxg_ref)
    close(py.grad, pyg_ref)
    assert torch.autograd.gradcheck(lambda a, b: fr.mutual_information_recursion(a, b, bd), (px, py))


def test_mutual_information_without_grad_and_returned_grads_are_fresh():
    g = torch.Generator().manual_seed(2)
    px = torch.randn(2, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    py = torch.randn(2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    total, (pxg, pyg) = fr.mutual_information_recursion(px, py, return_grad=True)
    keep = pxg.clone()
    (3.0 * total.sum()).backward()  # scales the gradient saved by autograd, not the returned one
    assert torch.equal(pxg, keep)
    close(px.grad, 3.0 * pxg)
    with torch.no_grad():
        t2, (pxg2, _) = fr.mutual_information_recursion(px, py, return_grad=True)
    close(t2, total)
    close(pxg2, pxg)
    assert fr.mutual_information_recursion(px.detach().float(), py.detach().float()).dtype == torch.float32


# ------------------------------------------------------------ every function


@pytest.mark.parametrize("rnnt_type", TYPES)
@pytest.mark.parametrize("delay_penalty", [0.0, 0.25])
@pytest.mark.parametrize("use_boundary", [False, True])
def test_losses_against_reference(rnnt_type, delay_penalty, use_boundary):
    am, lm, symbols, term = case()
    bd = BOUNDARY if use_boundary else None
    kw = dict(boundary=bd, rnnt_type=rnnt_type, delay_penalty=delay_penalty, reduction="none")
    lm_, am_ = lm.clone().requires_grad_(), am.clone().requires_grad_()
    loss, (pxg, pyg) = fr.rnnt_loss_simple(lm_, am_, symbols, term, return_grad=True, **kw)
    want, (pxg_ref, pyg_ref) = ref.rnnt_loss_simple_reference(lm, am, symbols, term, return_grad=True, **kw)
    close(loss, want)
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    close(fr.rnnt_loss_smoothed(lm, am, symbols, term, 0.2, 0.1, **kw),
          ref.rnnt_loss_smoothed_reference(lm, am, symbols, term, 0.2, 0.1, **kw))
    logits = am[:, :, None, :] + torch.tanh(lm[:, None, :, :])
    close(fr.rnnt_loss(logits, symbols, term, **kw), ref.rnnt_loss_reference(logits, symbols, term, **kw))
    bd2 = BOUNDARY if use_boundary else torch.tensor([[0, 0, 4, 7]] * 4)
    ranges = fr.get_rnnt_prune_ranges(pxg, pyg, bd2, 3)
    assert torch.equal(ranges, ref.prune_ranges_reference(pxg, pyg, bd2, 3))
    am_p, lm_p = fr.do_rnnt_pruning(am, lm, ranges)
    am_r, lm_r = ref.do_rnnt_pruning_reference(am, lm, ranges)
    close(am_p, am_r)
    close(lm_p, lm_r)
    band = am_p + torch.tanh(lm_p)
    close(fr.rnnt_loss_pruned(band, symbols, ranges, term, **kw),
          ref.rnnt_loss_pruned_reference(band, symbols, ranges, term, **kw))
    # the loss's gradient reaches the joiner inputs (its values: test_gradcheck)
    loss.sum().backward()
    assert torch.isfinite(lm_.grad).all() and torch.isfinite(am_.grad).all() and am_.grad.abs().sum() > 0


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_logprobs_against_reference(rnnt_type):
    am, lm, symbols, term = case(seed=3)
    for got, want in (
        (fr.get_rnnt_logprobs(lm, am, symbols, term, rnnt_type, BOUNDARY),
         ref.logprobs_simple(lm, am, symbols, term, BOUNDARY, rnnt_type)),
        (fr.get_rnnt_logprobs_smoothed(lm, am, symbols, term, 0.3, 0.0, BOUNDARY, rnnt_type),
         ref.logprobs_smoothed(lm, am, symbols, term, 0.3, 0.0, BOUNDARY, rnnt_type)),
        (fr.get_rnnt_logprobs_joint(am[:, :, None] + lm[:, None], symbols, term, rnnt_type, BOUNDARY),
         ref.logprobs_joint(am[:, :, None] + lm[:, None], symbols, term, BOUNDARY, rnnt_type)),
    ):
        for a, b in zip(got, want):
            assert a.shape == b.shape
            fin = torch.isfinite(b)
            assert torch.equal(torch.isfinite(a), fin)
            close(a[fin], b[fin])


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_gradcheck(rnnt_type):
    am, lm, symbols, term = case(seed=4, B=3, S=2, T=4, C=4)
    bd = torch.tensor([[0, 0, 2, 4], [0, 0, 1, 3], [0, 0, 2, 2]])
    am.requires_grad_()
    lm.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, m: fr.rnnt_loss_smoothed(m, a, symbols, term, 0.1, 0.2, bd, rnnt_type, 0.1, "sum"), (am, lm))
    logits = (am[:, :, None] + lm[:, None]).detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fr.rnnt_loss(x, symbols, term, bd, rnnt_type, 0.2, "mean"),
                                    (logits,))
    ranges = pruned.prune_ranges(*fr.rnnt_loss_simple(lm, am, symbols, term, bd, rnnt_type, return_grad=True)[1],
                                 bd, 2)
    band = torch.randn(3, 4, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: fr.rnnt_loss_pruned(x, symbols, ranges, term, bd, rnnt_type), (band,))


def test_regular_equals_chainfb_and_torchaudio_definition():
    """rnnt_type="regular" is torchaudio's RNN-T: same numbers as chainfb.rnnt_loss
    (fused route) and through the grid (with a zero delay penalty forced through it)."""
    am, lm, symbols, term = case(seed=5)
    logits = (am[:, :, None] + torch.tanh(lm[:, None])).requires_grad_()
    T_b, U_b = BOUNDARY[:, 3], BOUNDARY[:, 2]
    ours = fr.rnnt_loss(logits, symbols, term, BOUNDARY, reduction="none")
    grid = pruned.grid_rnnt_loss(logits, symbols, T_b, U_b, term, reduction="none")
    full = chainfb.rnnt_loss(logits, symbols.int(), T_b.int(), U_b.int(), blank=term, reduction="none")
    close(ours, full)
    close(grid, full)
    g1, = torch.autograd.grad(grid.sum(), logits)
    g2, = torch.autograd.grad(full.sum(), logits)
    close(g1, g2)


def test_full_band_pruned_equals_full_loss():
    am, lm, symbols, term = case(seed=6)
    for rnnt_type in TYPES:
        _, grads = fr.rnnt_loss_simple(lm, am, symbols, term, BOUNDARY, rnnt_type, return_grad=True)
        ranges = fr.get_rnnt_prune_ranges(*grads, BOUNDARY, 10)  # s_range >= S + 1: the whole grid
        assert ranges.shape[2] == 5
        am_p, lm_p = fr.do_rnnt_pruning(am, lm, ranges)
        logits_p = am_p + torch.tanh(lm_p)
        logits = am[:, :, None] + torch.tanh(lm[:, None])
        close(fr.rnnt_loss_pruned(logits_p, symbols, ranges, term, BOUNDARY, rnnt_type, reduction="none"),
              fr.rnnt_loss(logits, symbols, term, BOUNDARY, rnnt_type, reduction="none"))


def test_ranges_satisfy_documented_constraints():
    am, lm, symbols, term = case(seed=7, B=4, S=6, T=9)
    bd = torch.tensor([[0, 0, 6, 9], [0, 0, 2, 8], [0, 0, 6, 6], [0, 0, 1, 4]])
    for rnnt_type, s_range in (("regular", 2), ("regular", 4), ("modified", 1), ("constrained", 3)):
        _, grads = fr.rnnt_loss_simple(lm, am, symbols, term, bd, rnnt_type, return_grad=True)
        ranges = fr.get_rnnt_prune_ranges(*grads, bd, s_range)
        step = s_range if rnnt_type == "regular" else 2
        assert ranges.dtype == torch.int64 and ranges.shape == (4, 9, s_range)
        assert (ranges == ranges[:, :, :1] + torch.arange(s_range)).all()
        start = ranges[:, :, 0]
        assert (start[:, 0] == 0).all() and (ranges >= 0).all() and (ranges <= 6).all()
        d = start[:, 1:] - start[:, :-1]
        assert (d >= 0).all() and (d <= step - 1).all()
        # from the last frame on, the band reaches the end of the transcript
        for b in range(4):
            t_end, s_end = int(bd[b, 3]), int(bd[b, 2])
            assert (ranges[b, t_end - 1:, -1] >= min(s_end, s_range - 1)).all()


def test_native_lengths_api_matches_boundary_api():
    am, lm, symbols, term = case(seed=8)
    T_b, U_b = BOUNDARY[:, 3], BOUNDARY[:, 2]
    loss, grads = pruned.simple_rnnt_loss(am, lm, symbols, T_b, U_b, term, rnnt_type="constrained",
                                          delay_penalty=0.1, lm_only_scale=0.25, am_only_scale=0.0,
                                          reduction="sum", return_grad=True)
    want, grads_k2 = fr.rnnt_loss_smoothed(lm, am, symbols, term, 0.25, 0.0, BOUNDARY, "constrained", 0.1, "sum",
                                           return_grad=True)
    close(loss, want)
    close(grads[0], grads_k2[0])
    ranges = pruned.prune_ranges(*grads, BOUNDARY, 3)
    am_p, lm_p = pruned.prune(am, lm, ranges)
    close(pruned.pruned_rnnt_loss(am_p + lm_p, symbols, ranges, T_b, U_b, term, "constrained", 0.1),
          fr.rnnt_loss_pruned(am_p + lm_p, symbols, ranges, term, BOUNDARY, "constrained", 0.1))
    assert chainfb.transducer.simple_rnnt_loss is pruned.simple_rnnt_loss


@pytest.mark.parametrize("seed", range(3))
def test_prune_rows_match_an_element_gather(seed):
    """``prune`` copies whole rows of ``lm``: the values and the gradient of
    an element-wise gather (every position of the band repeated across
    frames, so rows receive many gradients), non-contiguous ``lm``, and
    gradcheck in float64."""
    g = torch.Generator().manual_seed(seed)
    B, T, S1, D, R = 3, 6, 5, 4, 3
    am = torch.randn(B, T, D, dtype=torch.float64, generator=g, requires_grad=True)
    lm = torch.randn(B, D, S1, dtype=torch.float64, generator=g).transpose(1, 2).requires_grad_()  # strided
    start = torch.randint(0, S1 - R + 1, (B, T), generator=g).sort(dim=1).values
    ranges = start[:, :, None] + torch.arange(R)
    am_p, lm_p = pruned.prune(am, lm, ranges)
    want = torch.gather(lm, 1, ranges.reshape(B, T * R, 1).expand(B, T * R, D)).reshape(B, T, R, D)
    assert torch.equal(lm_p, want) and torch.equal(am_p, am[:, :, None, :].expand(B, T, R, D))
    out = torch.randn(B, T, R, D, dtype=torch.float64, generator=g)
    got, = torch.autograd.grad(lm_p, lm, out)
    ref, = torch.autograd.grad(want, lm, out)
    torch.testing.assert_close(got, ref, rtol=1e-14, atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, m: pruned.prune(a, m, ranges), (am, lm))


def test_legacy_modified_keyword():
    am, lm, symbols, term = case(seed=9)
    close(fr.rnnt_loss_simple(lm, am, symbols, term, modified=True),
          fr.rnnt_loss_simple(lm, am, symbols, term, rnnt_type="modified"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs(dtype):
    am, lm, symbols, term = case(seed=10)
    want = fr.rnnt_loss_simple(lm.to(dtype).double(), am.to(dtype).double(), symbols, term, reduction="none")
    a, m = am.to(dtype).requires_grad_(), lm.to(dtype).requires_grad_()
    got = fr.rnnt_loss_simple(m, a, symbols, term, reduction="none")
    assert got.dtype == dtype
    got.sum().backward()
    assert a.grad.dtype == dtype and torch.isfinite(a.grad.float()).all()
    np.testing.assert_allclose(got.double().detach().numpy(), want.numpy(), rtol=2e-2)


@pytest.mark.parametrize("call, exc, match", [
    (lambda a, m, s, r: fr.rnnt_loss_pruned(torch.zeros(4, 7, 3, 6), s, r[:, :, :2], 0), ValueError, "ranges"),
    (lambda a, m, s, r: fr.rnnt_loss_pruned(torch.zeros(4, 7, 3, 6), s, r[:, :5], 0), ValueError, "ranges"),
    (lambda a, m, s, r: fr.rnnt_loss_pruned(torch.zeros(4, 7, 3, 6), s, r + 3, 0), ValueError, "ranges"),
    (lambda a, m, s, r: fr.rnnt_loss_pruned(torch.zeros(4, 7, 3, 6), s, r.float(), 0), TypeError, "ranges"),
    (lambda a, m, s, r: fr.get_rnnt_prune_ranges(torch.zeros(4, 4, 8), torch.zeros(4, 5, 7), None, 0),
     ValueError, "s_range"),
    (lambda a, m, s, r: fr.get_rnnt_prune_ranges(torch.zeros(4, 4, 8), torch.zeros(4, 5, 7), None, 1.0),
     TypeError, "s_range"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a[:, :3], s, 0, rnnt_type="modified"), ValueError, "T >= S"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s + 10, 0), ValueError, "symbols"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s, 6), ValueError, "blank"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s, 0, rnnt_type="pruned"), ValueError, "rnnt_type"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s, 0, reduction="avg"), ValueError, "reduction"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s, 0, boundary=torch.tensor([[0, 0, 5, 7]] * 4)),
     ValueError, "boundary"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s, 0, boundary=torch.zeros(3, 4, dtype=torch.int64)),
     ValueError, "boundary"),
    (lambda a, m, s, r: fr.rnnt_loss_simple(m, a, s, 0, delay_penalty=float("nan")), ValueError, "delay_penalty"),
    (lambda a, m, s, r: fr.mutual_information_recursion(torch.zeros(4, 4, 5), torch.zeros(4, 5, 7)),
     ValueError, "px"),
    (lambda a, m, s, r: fr.do_rnnt_pruning(a, m[:, :, :3], r), ValueError, "lm"),
])
def test_bad_inputs(call, exc, match):
    am, lm, symbols, term = case(seed=11)
    ranges = torch.zeros(4, 7, 3, dtype=torch.int64) + torch.arange(3)
    with pytest.raises(exc, match=match):
        call(am, lm, symbols, ranges)


# ------------------------------------------------- k2 / fast_rnnt 1.3 parity


def test_prune_ranges_widen_a_band_too_narrow_for_the_regular_transducer():
    """S = 9 symbols in T = 3 frames: a band of 2 (start rising by 1 per
    frame) never reaches symbol 9; k2 widens it to (9 - 1) // 3 + 2 = 4 with
    a warning, which forces the starts [0, 3, 6] and a finite pruned loss."""
    am, lm, symbols, term = case(seed=20, B=1, S=9, T=3, C=12)
    bd = torch.tensor([[0, 0, 9, 3]])
    _, grads = fr.rnnt_loss_simple(lm, am, symbols, term, bd, return_grad=True)
    for s_range in (1, 2, 3):
        with pytest.warns(UserWarning, match="widened to 4"):
            ranges = fr.get_rnnt_prune_ranges(*grads, bd, s_range)
        assert ranges.shape == (1, 3, 4) and ranges[0, :, 0].tolist() == [0, 3, 6]
        assert torch.equal(ranges, ref.prune_ranges_reference(*grads, bd, s_range))
    with pytest.warns(UserWarning, match="widened to 4"):
        assert torch.equal(pruned.prune_ranges(*grads, bd, 2), ranges)
    am_p, lm_p = fr.do_rnnt_pruning(am, lm, ranges)
    loss = fr.rnnt_loss_pruned(am_p + torch.tanh(lm_p), symbols, ranges, term, bd, reduction="none")
    assert torch.isfinite(loss).all()
    close(loss, ref.rnnt_loss_pruned_reference(am_p + torch.tanh(lm_p), symbols, ranges, term, bd, reduction="none"))
    # the widest need in the batch sets the width; rows without symbols or frames need nothing
    assert pruned.min_s_range(torch.tensor([[0, 0, 20, 2], [0, 0, 17, 3], [0, 0, 0, 5], [0, 0, 4, 0]])) == 11
    # wide enough: no warning, no widening; modified/constrained never widen (a symbol consumes a frame)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fr.get_rnnt_prune_ranges(*grads, bd, 4).shape == (1, 3, 4)
        am, lm, symbols, term = case(seed=21, B=1, S=3, T=3, C=6)
        _, grads = fr.rnnt_loss_simple(lm, am, symbols, term, rnnt_type="modified", return_grad=True)
        assert fr.get_rnnt_prune_ranges(*grads, None, 1).shape == (1, 3, 1)
    with pytest.raises(ValueError, match="s_range"):
        fr.get_rnnt_prune_ranges(*grads, None, 0)


@pytest.mark.parametrize("rnnt_type", TYPES)
def test_full_and_pruned_loss_return_occupancies(rnnt_type):
    """return_grad=True on rnnt_loss and rnnt_loss_pruned: (loss, (px_grad,
    py_grad)), the occupation of every arc (d total / d px, py) whatever the
    reduction, as rnnt_loss_simple gives."""
    am, lm, symbols, term = case(seed=22)
    logits = am[:, :, None, :] + torch.tanh(lm[:, None, :, :])
    kw = dict(boundary=BOUNDARY, rnnt_type=rnnt_type, delay_penalty=0.2)
    loss, (pxg, pyg) = fr.rnnt_loss(logits, symbols, term, reduction="mean", return_grad=True, **kw)
    want, (pxg_ref, pyg_ref) = ref.rnnt_loss_reference(logits, symbols, term, reduction="mean", return_grad=True,
                                                       **kw)
    close(loss, want)
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    assert pxg.shape == (4, 4, 8 if rnnt_type == "regular" else 7) and pyg.shape == (4, 5, 7)
    close(fr.rnnt_loss(logits, symbols, term, reduction="sum", **kw), 4 * loss)
    ranges = fr.get_rnnt_prune_ranges(pxg, pyg, BOUNDARY, 3)
    am_p, lm_p = fr.do_rnnt_pruning(am, lm, ranges)
    band = am_p + torch.tanh(lm_p)
    loss, (pxg, pyg) = fr.rnnt_loss_pruned(band, symbols, ranges, term, reduction="sum", return_grad=True, **kw)
    want, (pxg_ref, pyg_ref) = ref.rnnt_loss_pruned_reference(band, symbols, ranges, term, reduction="sum",
                                                              return_grad=True, **kw)
    close(loss, want)
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    # the regular type's fused route is skipped for return_grad; its numbers are the grid's
    loss, (pxg, _) = fr.rnnt_loss(logits, symbols, term, BOUNDARY, reduction="none", return_grad=True)
    close(loss, fr.rnnt_loss(logits, symbols, term, BOUNDARY, reduction="none"))
    close(pxg, fr.mutual_information_recursion(*fr.get_rnnt_logprobs_joint(logits, symbols, term, "regular",
                                                                           BOUNDARY), BOUNDARY, True)[1][0])
    # the native lengths-based losses return the same occupancies
    g = pruned.pruned_rnnt_loss(band, symbols, ranges, BOUNDARY[:, 3], BOUNDARY[:, 2], term, rnnt_type, 0.2,
                                return_grad=True)[1]
    close(g[1], pyg_ref)
    g = pruned.grid_rnnt_loss(logits, symbols, BOUNDARY[:, 3], BOUNDARY[:, 2], term, rnnt_type, 0.2,
                              return_grad=True)[1]
    close(g[0], ref.rnnt_loss_reference(logits, symbols, term, return_grad=True, **kw)[1][0])


def test_argument_order_is_k2s():
    """k2 takes rnnt_type before boundary in get_rnnt_logprobs and
    get_rnnt_logprobs_joint, boundary before rnnt_type in the smoothed and
    pruned ones, and boundary=None everywhere but get_rnnt_prune_ranges."""
    import inspect
    head = ["symbols", "termination_symbol"]
    want = {
        fr.get_rnnt_logprobs: ["lm", "am", *head, "rnnt_type", "boundary"],
        fr.get_rnnt_logprobs_joint: ["logits", *head, "rnnt_type", "boundary"],
        fr.get_rnnt_logprobs_smoothed: ["lm", "am", *head, "lm_only_scale", "am_only_scale", "boundary",
                                        "rnnt_type"],
        fr.get_rnnt_logprobs_pruned: ["logits", "symbols", "ranges", "termination_symbol", "boundary", "rnnt_type"],
        fr.rnnt_loss_simple: ["lm", "am", *head, "boundary", "rnnt_type", "delay_penalty", "reduction",
                              "return_grad"],
        fr.rnnt_loss: ["logits", *head, "boundary", "rnnt_type", "delay_penalty", "reduction", "return_grad"],
        fr.rnnt_loss_smoothed: ["lm", "am", *head, "lm_only_scale", "am_only_scale", "boundary", "rnnt_type",
                                "delay_penalty", "reduction", "return_grad"],
        fr.rnnt_loss_pruned: ["logits", "symbols", "ranges", "termination_symbol", "boundary", "rnnt_type",
                              "delay_penalty", "reduction", "return_grad"],
        fr.get_rnnt_prune_ranges: ["px_grad", "py_grad", "boundary", "s_range"],
    }
    for f, names in want.items():
        params = inspect.signature(f).parameters
        assert [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD] == names, f.__name__
        if "boundary" in names and f is not fr.get_rnnt_prune_ranges:
            assert params["boundary"].default is None, f.__name__
    am, lm, symbols, term = case(seed=23)
    px, py = fr.get_rnnt_logprobs(lm, am, symbols, term, "modified", BOUNDARY)
    assert px.shape == (4, 4, 7)
    close(px, fr.get_rnnt_logprobs(lm, am, symbols, term, boundary=BOUNDARY, rnnt_type="modified")[0])
    logits = am[:, :, None] + lm[:, None]
    px, _ = fr.get_rnnt_logprobs_joint(logits, symbols, term, "constrained", BOUNDARY)
    close(px, ref.logprobs_joint(logits, symbols, term, BOUNDARY, "constrained")[0])
    ranges = torch.zeros(4, 7, 5, dtype=torch.int64) + torch.arange(5)
    px, py = fr.get_rnnt_logprobs_pruned(logits, symbols, ranges, term)  # boundary defaults to [0, 0, S, T]
    close(px, fr.get_rnnt_logprobs_joint(logits, symbols, term)[0])


def test_band_ties_break_as_k2_in_float32():
    """k2 sums each band's occupancy on its own in the gradients' dtype and
    takes the first maximum: with float32 grads where 1 + 3e-8 == 1, bands 0
    and 2 tie at frame 1 and k2 keeps band 0; float64 scores keep band 2."""
    S, T = 4, 4
    pxg = torch.zeros(1, S, T + 1)
    pyg = torch.zeros(1, S + 1, T)
    pyg[0, 0, 0] = 1.0
    pyg[0, :, 1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 3e-8])
    pyg[0, 2:, 2] = 1.0
    bd = torch.tensor([[0, 0, S, T]])
    k2_like = fr.get_rnnt_prune_ranges(pxg, pyg, bd, 3)
    assert k2_like[0, :, 0].tolist() == [0, 0, 2, 2]
    assert torch.equal(k2_like, ref.prune_ranges_reference(pxg, pyg, bd, 3, score_dtype=np.float32))
    wide = pruned.prune_ranges(pxg, pyg, bd, 3)  # the native default: float64 scores
    assert wide[0, :, 0].tolist() == [0, 2, 2, 2]
    assert torch.equal(wide, ref.prune_ranges_reference(pxg, pyg, bd, 3))
    assert torch.equal(pruned.prune_ranges(pxg, pyg, bd, 3, band_scores="input"), k2_like)
    with pytest.raises(ValueError, match="band_scores"):
        pruned.prune_ranges(pxg, pyg, bd, 3, band_scores="float32")


@pytest.mark.parametrize("call, exc, match", [
    (lambda a, m, s: fr.rnnt_loss_simple(m, a, s, 0, boundary=[[0, 0, 4.7, 7.0]] * 4), TypeError, "boundary"),
    (lambda a, m, s: fr.rnnt_loss_simple(m, a, s, 0, boundary=torch.tensor([[0, 0, 4, 7]] * 4).bool()),
     TypeError, "boundary"),
    (lambda a, m, s: fr.get_rnnt_prune_ranges(torch.zeros(4, 4, 8), torch.zeros(4, 5, 7),
                                              torch.tensor([[0.0, 0.0, 4.0, 7.0]] * 4), 3), TypeError, "boundary"),
    (lambda a, m, s: fr.rnnt_loss_simple(m, a, s, 0, return_grad="yes"), TypeError, "return_grad"),
    (lambda a, m, s: fr.rnnt_loss_pruned(torch.zeros(4, 7, 3, 6), s, torch.zeros(4, 7, 3, dtype=torch.int64), 0,
                                         reduction="avg"), ValueError, "reduction"),
    (lambda a, m, s: fr.rnnt_loss(a[:, :, None] + m[:, None], s, 0, reduction="batch"), ValueError, "reduction"),
    (lambda a, m, s: fr.rnnt_loss_smoothed(m, a, s, 0, lm_only_scale="0.1"), TypeError, "lm_only_scale"),
    (lambda a, m, s: fr.rnnt_loss_simple(m, a, s, 0, delay_penalty=True), TypeError, "delay_penalty"),
    (lambda a, m, s: fr.rnnt_loss_simple(m, a, s, 0, modified="yes"), TypeError, "modified"),
    (lambda a, m, s: pruned.simple_rnnt_loss(a, m, s, torch.tensor([4.7, 5.0, 7.0, 7.0]), [4, 4, 4, 4], 0),
     TypeError, "logit_lengths"),
    (lambda a, m, s: pruned.simple_rnnt_loss(a, m, s, [7, 7, 7, 7], [True, True, True, True], 0),
     TypeError, "target_lengths"),
    (lambda a, m, s: pruned.simple_rnnt_loss(a, m, s, [7, 7, 7, 8], [4, 4, 4, 4], 0), ValueError, "logit_lengths"),
    (lambda a, m, s: pruned.simple_rnnt_loss(a, m, s, [7, 7, 7, 7], [4, 4, 4, 5], 0), ValueError, "target_lengths"),
    (lambda a, m, s: pruned.grid_rnnt_loss(a[:, :, None] + m[:, None], s, [7.0] * 4, [4] * 4, 0), TypeError,
     "logit_lengths"),
    (lambda a, m, s: pruned.pruned_rnnt_loss(torch.zeros(4, 7, 3, 6), s, torch.zeros(4, 7, 3, dtype=torch.int64),
                                             [7] * 4, np.array([4.0] * 4), 0), TypeError, "target_lengths"),
    (lambda a, m, s: pruned.simple_rnnt_loss(a, m, s, [7] * 4, [4] * 4, 0, reduction="frame"), ValueError,
     "reduction"),
])
def test_lengths_and_flags_are_checked_not_truncated(call, exc, match):
    am, lm, symbols, _ = case(seed=24)
    with pytest.raises(exc, match=match):
        call(am, lm, symbols)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mutual_information_takes_half_precision(dtype):
    g = torch.Generator().manual_seed(25)
    px = torch.randn(3, 2, 5, generator=g).to(dtype).requires_grad_()
    py = torch.randn(3, 3, 4, generator=g).to(dtype).requires_grad_()
    bd = torch.tensor([[0, 0, 2, 4], [0, 0, 1, 3], [0, 1, 2, 4]])
    total, (pxg, pyg) = fr.mutual_information_recursion(px, py, bd, return_grad=True)
    want, (pxg32, pyg32) = fr.mutual_information_recursion(px.detach().float(), py.detach().float(), bd, True)
    assert total.dtype == pxg.dtype == pyg.dtype == dtype
    close(total.float(), want.to(dtype).float())
    close(pxg.float(), pxg32.to(dtype).float())
    total.sum().backward()
    assert px.grad.dtype == dtype and torch.equal(px.grad, pxg) and torch.equal(py.grad, pyg)
    with pytest.raises(TypeError, match="px, py"):
        fr.mutual_information_recursion(px.detach(), py.detach().float())


def test_gather_plans_are_a_thread_safe_lru():
    from concurrent.futures import ThreadPoolExecutor

    from chainfb import checks
    from chainfb.transducer import grid

    assert isinstance(grid._PLANS, checks.LRU)
    g = torch.Generator().manual_seed(26)
    px = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    py = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    bds = [torch.tensor([[0, 0, 3, 5], [0, 0, s, t]]) for s in range(4) for t in range(1, 6)]
    want = [ref.mi_reference(px, py, bd)[0] for bd in bds]
    grid._PLANS.clear()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda bd: fr.mutual_information_recursion(px, py, bd), bds * 2))
    for a, b in zip(got, want * 2):
        close(a, b)
    assert len(grid._PLANS) <= grid._PLANS.size


# ----------------------------------------------------------------- per device


class PrunedPipelineTests:
    """The whole pruned pipeline (simple loss -> ranges -> pruning -> joiner
    on the band -> pruned loss) on the device, against the reference."""

    @pytest.mark.parametrize("rnnt_type", TYPES)
    def test_pipeline_matches_reference(self, rnnt_type):
        am, lm, symbols, term = case(seed=12)
        a, m = self.tensor(am.clone()).requires_grad_(), self.tensor(lm.clone()).requires_grad_()
        sy, T_b, U_b = self.tensor(symbols), self.tensor(BOUNDARY[:, 3]), self.tensor(BOUNDARY[:, 2])
        simple, (pxg, pyg) = pruned.simple_rnnt_loss(a, m, sy, T_b, U_b, term, rnnt_type=rnnt_type,
                                                     delay_penalty=0.1, reduction="none", return_grad=True)
        assert simple.device.type == self.device and pxg.device.type == self.device
        want, (pxg_ref, _) = ref.rnnt_loss_simple_reference(lm, am, symbols, term, BOUNDARY, rnnt_type, 0.1,
                                                            "none", return_grad=True)
        close(simple.cpu(), want)
        close(pxg.cpu(), pxg_ref)
        ranges = pruned.prune_ranges(pxg, pyg, self.tensor(BOUNDARY), 3)
        assert torch.equal(ranges.cpu(), ref.prune_ranges_reference(pxg.cpu(), pyg.cpu(), BOUNDARY, 3))
        am_p, lm_p = pruned.prune(a, m, ranges)
        band = am_p + torch.tanh(lm_p)
        loss = pruned.pruned_rnnt_loss(band, sy, ranges, T_b, U_b, term, rnnt_type, 0.1, reduction="none")
        close(loss.cpu(), ref.rnnt_loss_pruned_reference(band.detach().cpu(), symbols, ranges.cpu(), term,
                                                         BOUNDARY, rnnt_type, 0.1, "none"))
        (simple.sum() + loss.sum()).backward()
        assert torch.isfinite(a.grad).all() and torch.isfinite(m.grad).all()


    @pytest.mark.parametrize("rnnt_type", TYPES)
    def test_every_grid_a_single_point(self, rnnt_type):
        """``T_b = U_b = 0`` for every sequence, or k2 boundary rows ``[1, 1,
        1, 1]`` (begin symbol and frame = end symbol and frame): one path of
        no arcs, total log-probability 0, no gradient -- the engine runs no
        step at all."""
        am, lm, symbols, term = case(seed=13, B=3, S=2, T=3)
        a, m = self.tensor(am).requires_grad_(), self.tensor(lm).requires_grad_()
        x = self.tensor(am[:, :, None, :] + lm[:, None, :, :]).detach().requires_grad_()
        sy, zero = self.tensor(symbols), self.tensor(torch.zeros(3, dtype=torch.int64))
        point = self.tensor(torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [2, 3, 2, 3]]))
        losses = {
            "simple": pruned.simple_rnnt_loss(a, m, sy, zero, zero, term, rnnt_type, reduction="none"),
            "grid": pruned.grid_rnnt_loss(x, sy, zero, zero, term, rnnt_type, reduction="none"),
            "pruned": pruned.pruned_rnnt_loss(x[:, :, :2], sy, self.tensor(torch.zeros(3, 3, 2, dtype=torch.int64)),
                                              zero, zero, term, rnnt_type, reduction="none"),
            "k2 simple": fr.rnnt_loss_simple(m, a, sy, term, point, rnnt_type, reduction="none"),
            "k2 smoothed": fr.rnnt_loss_smoothed(m, a, sy, term, 0.1, 0.1, point, rnnt_type, reduction="none"),
            "k2 rnnt": fr.rnnt_loss(x, sy, term, point, rnnt_type, reduction="none"),
        }
        for name, loss in losses.items():
            assert loss.device.type == self.device
            assert torch.equal(loss.detach().cpu(), torch.zeros(3, dtype=loss.dtype)), name
        sum(loss.sum() for loss in losses.values()).backward()
        for t in (a, m, x):
            assert torch.equal(t.grad.cpu(), torch.zeros_like(t.grad.cpu()))
        px = self.tensor(torch.randn(3, 2, 4 if rnnt_type == "regular" else 3, dtype=torch.float64))
        py = self.tensor(torch.randn(3, 3, 3, dtype=torch.float64))
        total, grads = fr.mutual_information_recursion(px.requires_grad_(), py.requires_grad_(), point,
                                                       return_grad=True)
        assert torch.equal(total.detach().cpu(), torch.zeros(3, dtype=torch.float64))
        assert not any(g.cpu().any() for g in grads)


class TestPrunedCPU(PrunedPipelineTests, OnCPU):
    pass


class TestPrunedCPUNumPy(PrunedPipelineTests, OnCPUNumPy):
    pass


class TestPrunedCUDA(PrunedPipelineTests, OnCUDA):
    pass


class TestPrunedEmulated(PrunedPipelineTests, OnEmulatedKernels):
    pass


@pytest.mark.parametrize("modified", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grid_score_map_moves_what_the_entries_say(modified, dtype):
    """The grid's compiled score map (rules per sequence) against its
    per-element entries (what the torch score map gathers by), on random
    boundaries: the same scores in, the same gradients out."""
    from chainfb.transducer import grid
    from chainfb.transducer.maps import compiled as cpu_maps

    if not cpu_maps.available(dtype):
        pytest.skip("no compiled score maps")
    rng = np.random.default_rng(27)
    for _ in range(40):
        B, S, T = int(rng.integers(1, 5)), int(rng.integers(0, 6)), int(rng.integers(1, 7))
        s0, t0 = rng.integers(0, S + 1, B), rng.integers(0, T + 1, B)
        bd = torch.tensor(np.stack([s0, t0, [rng.integers(a, S + 1) for a in s0],
                                    [rng.integers(a, T + 1) for a in t0]], 1))
        px = torch.randn(B, S, T if modified else T + 1, dtype=dtype)
        py = torch.randn(B, S + 1, T, dtype=dtype)
        crit = grid.GridCriterion(px, py, bd)
        plan = crit.plan
        shape, pxn, pyn = (plan.num_rows, plan.num_columns), px.numpy(), py.numpy()
        X = cpu_maps.grid_scores(pxn, pyn, plan.boundary, plan.layout.colidx, plan.modified, shape)
        want = cpu_maps.planned_scores((pxn, pyn), (plan.px, plan.py), shape)
        assert X.dtype == want.dtype and np.array_equal(X, want)
        post = rng.random((plan.num_rows, plan.num_columns))
        got_all = cpu_maps.grid_gradients(post, plan.boundary, plan.layout.colidx, plan.modified, pxn.shape, pyn.shape,
                                          pyn.dtype)
        for got, src, entry in zip(got_all, (pxn, pyn), (plan.px, plan.py)):
            exp = cpu_maps.planned_gradient(post, entry, src.shape, src.dtype)
            assert got.dtype == exp.dtype and np.array_equal(got, exp)
