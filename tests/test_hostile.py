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


# ------------------------------------------------------- padding never reaches a gradient

_B, _T, _U, _V = 3, 6, 3, 5
_TB, _UB = torch.tensor([6, 4, 5]), torch.tensor([3, 1, 0])
# k2's boundary rows [s_begin, t_begin, s_end, t_end]: begins past 0 leave padding in front too
_BOUNDARY = torch.tensor([[0, 0, 3, 6], [1, 1, 2, 5], [0, 2, 1, 4]])


def _pad_masks(boundary):
    """``(frame_pad [B, T], row_pad [B, U + 1])``: True outside each sequence."""
    t, s = torch.arange(_T), torch.arange(_U + 1)
    s0, t0, s1, t1 = boundary.T
    return ((t[None] < t0[:, None]) | (t[None] >= t1[:, None]),
            (s[None] < s0[:, None]) | (s[None] > s1[:, None]))


def _lengths_boundary():
    z = torch.zeros_like(_TB)
    return torch.stack([z, z, _UB, _TB], dim=1)


def _padded_losses():
    """``name -> (make(fill) -> (inputs, masks), loss(*inputs))``: each loss
    with its inputs, non-finite ``fill`` (or clean random values, ``fill=None``)
    put in the padding (``masks``: True in the padding of each input)."""
    from chainfb.compat import fast_rnnt
    from chainfb.transducer import grid_rnnt_loss, prune_ranges, pruned_rnnt_loss, simple_rnnt_loss

    g = torch.Generator().manual_seed(3)
    targets = torch.randint(1, _V - 2, (_B, _U), generator=g)  # (V - 2: a big blank)
    am0 = torch.randn(_B, _T, _V, generator=g, dtype=torch.float64)
    lm0 = torch.randn(_B, _U + 1, _V, generator=g, dtype=torch.float64)
    x0 = torch.randn(_B, _T, _U + 1, _V + 3, generator=g, dtype=torch.float64)
    noise = torch.randn(_B, _T, _U + 1, _V + 3, generator=g, dtype=torch.float64)

    def fill_in(x, mask, fill):
        x = x.clone()
        x[mask] = noise[..., :x.shape[-1]].reshape(-1, x.shape[-1])[:int(mask.sum())] if fill is None else fill
        return x

    def additive(boundary):
        fp, rp = _pad_masks(boundary)
        return lambda fill: ((fill_in(am0, fp, fill), fill_in(lm0, rp, fill)), (fp, rp))

    def joint(boundary, V=_V):
        fp, rp = _pad_masks(boundary)
        cell = fp[:, :, None] | rp[:, None, :]
        return lambda fill: ((fill_in(x0[..., :V], cell, fill),), (cell,))

    def band(boundary, rnnt_type):
        fp, rp = _pad_masks(boundary)
        px, py = fast_rnnt.get_rnnt_logprobs(lm0, am0, targets, 0, rnnt_type, boundary)
        _, grads = fast_rnnt.mutual_information_recursion(px, py, boundary, return_grad=True)
        ranges = prune_ranges(*grads, boundary, 3)
        cell = fp[:, :, None] | torch.gather(rp, 1, ranges.reshape(_B, -1)).reshape(ranges.shape)
        return (lambda fill: ((fill_in(x0[:, :, :3, :_V], cell, fill),), (cell,))), ranges

    lb = _lengths_boundary()
    cases = {}
    for rt in ("regular", "modified", "constrained"):
        cases[f"simple-{rt}"] = (additive(lb), lambda am, lm, rt=rt: simple_rnnt_loss(
            am, lm, targets, _TB, _UB, blank=0, rnnt_type=rt, delay_penalty=0.1, reduction="sum"))
        cases[f"grid-{rt}"] = (joint(lb), lambda x, rt=rt: grid_rnnt_loss(
            x, targets, _TB, _UB, blank=0, rnnt_type=rt, delay_penalty=0.1, reduction="sum"))
        cases[f"fast_rnnt.rnnt_loss_simple-{rt}"] = (additive(_BOUNDARY), lambda am, lm, rt=rt: (
            fast_rnnt.rnnt_loss_simple(lm, am, targets, 0, _BOUNDARY, rt, reduction="sum")))
        cases[f"fast_rnnt.rnnt_loss-{rt}"] = (joint(_BOUNDARY), lambda x, rt=rt: fast_rnnt.rnnt_loss(
            x, targets, 0, _BOUNDARY, rt, reduction="sum"))
        make, ranges = band(lb, rt)
        cases[f"pruned-{rt}"] = (make, lambda x, rt=rt, r=ranges: pruned_rnnt_loss(
            x, targets, r, _TB, _UB, blank=0, rnnt_type=rt, reduction="sum"))
        make, ranges = band(_BOUNDARY, rt)
        cases[f"fast_rnnt.rnnt_loss_pruned-{rt}"] = (make, lambda x, rt=rt, r=ranges: fast_rnnt.rnnt_loss_pruned(
            x, targets, r, 0, _BOUNDARY, rt, reduction="sum"))
    # the smoothed loss: am's padding only (lm's padding rows enter k2's batch unigram)
    fp, _ = _pad_masks(lb)
    cases["smoothed"] = (lambda fill: ((fill_in(am0, fp, fill), lm0), (fp, torch.zeros(lm0.shape[:2], dtype=bool))),
                         lambda am, lm: simple_rnnt_loss(am, lm, targets, _TB, _UB, blank=0, lm_only_scale=0.2,
                                                         am_only_scale=0.1, reduction="sum"))
    cases["rnnt"] = (joint(lb), lambda x: chainfb.rnnt_loss(x, targets.int(), _TB.int(), _UB.int(), blank=0,
                                                            reduction="sum"))
    cases["multiblank"] = (joint(lb), lambda x: chainfb.multiblank_rnnt_loss(
        x, targets.int(), _TB.int(), _UB.int(), blank=_V - 1, big_blank_durations=[2], sigma=0.05, reduction="sum"))
    cases["tdt"] = (joint(lb, _V + 3), lambda x: chainfb.tdt_loss(
        x, targets, _TB, _UB, blank=_V - 1, durations=[0, 1, 2], sigma=0.05, reduction="sum"))
    cases["speechbrain"] = (joint(lb), lambda x: speechbrain.TransducerLoss(blank=0, reduction="sum")(
        x, targets.int(), _TB.int(), _UB.int()))
    return cases


_PADDED = sorted(_padded_losses())


@pytest.mark.parametrize("engine", ["compiled", "numpy"])
@pytest.mark.parametrize("name", _PADDED)
def test_non_finite_padding_never_reaches_a_gradient(name, engine, request):
    """-inf, NaN or +inf in the padding (frames past ``T_b``, rows past
    ``U_b``, cells outside a boundary): the loss of the clean padding, a
    finite gradient, zero in the padding and the same elsewhere."""
    if engine == "numpy":
        request.getfixturevalue("numpy_engine")
    make, loss = _padded_losses()[name]
    clean, masks = make(None)
    clean = [t.requires_grad_() for t in clean]
    want = loss(*clean)
    want.backward()
    for fill in (-math.inf, math.nan, math.inf):
        xs = [t.requires_grad_() for t in make(fill)[0]]
        got = loss(*xs)
        torch.testing.assert_close(got, want, msg=f"{name}, {fill} in the padding: loss")
        got.backward()
        for x, c, m in zip(xs, clean, masks):
            assert torch.isfinite(x.grad).all(), f"{name}, {fill} in the padding: non-finite gradient"
            assert not x.grad[m].any(), f"{name}, {fill} in the padding: gradient in the padding"
            torch.testing.assert_close(x.grad[~m], c.grad[~m], msg=f"{name}, {fill} in the padding: gradient")


def test_smoothed_loss_counts_non_finite_lm_padding_as_zero():
    """With smoothing, lm's padding rows enter k2's batch unigram, so their
    values count; non-finite ones count as 0 (a finite loss, no gradient
    there) instead of turning every sequence's loss into NaN."""
    from chainfb.transducer import simple_rnnt_loss

    g = torch.Generator().manual_seed(4)
    targets = torch.randint(1, _V, (_B, _U), generator=g)
    am = torch.randn(_B, _T, _V, generator=g, dtype=torch.float64)
    lm = torch.randn(_B, _U + 1, _V, generator=g, dtype=torch.float64)
    pad = _pad_masks(_lengths_boundary())[1]
    zero = lm.clone()
    zero[pad] = 0.0
    loss = lambda m: simple_rnnt_loss(am, m, targets, _TB, _UB, blank=0, lm_only_scale=0.2, am_only_scale=0.1,
                                      reduction="none")
    want = loss(zero)
    for fill in (-math.inf, math.nan, math.inf):
        m = lm.clone()
        m[pad] = fill
        m.requires_grad_()
        got = loss(m)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        assert torch.isfinite(m.grad).all() and not m.grad[pad].any()
