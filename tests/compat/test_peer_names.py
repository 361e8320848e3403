"""The names that the peers' users call, beyond the losses themselves:

- k2 / fast_rnnt (chainfb.compat.fast_rnnt): joint_mutual_information_recursion,
  with_cuda, the HAT loss (rnnt_loss_pruned(use_hat_loss=True),
  get_hat_logprobs_pruned), get_rnnt_prune_ranges_deprecated;
- NeMo (chainfb.compat.espnet, chainfb.compat.nemo): the functional losses in
  NeMo's argument order, certify_inputs, RNNTLoss with its reductions and
  resolve_rnnt_loss;
- SpeechBrain (chainfb.compat.speechbrain): transducer_loss with relative lengths;
- torchaudio (chainfb.compat.torchaudio): InputError / InputTypeError, forced_align,
  merge_tokens.

Against path enumeration and the float64 loop references in tests/oracles/,
gradcheck in float64, and the peers' documented rules."""

import math
import sys
import types

import numpy as np
import pytest
import torch

import chainfb
from chainfb.compat import espnet, nemo, speechbrain
from chainfb.compat import fast_rnnt as fr
from chainfb.compat import torchaudio as ta

from oracles import fast_rnnt as ref
from oracles import tdt as tdt_ref
from oracles import transducer as tr_ref


def as_f64(x):
    return x.detach().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def close(a, b, tol=1e-10):
    np.testing.assert_allclose(as_f64(a), as_f64(b), rtol=tol, atol=tol)


# ================================================================ k2 / fast_rnnt


def grid_terms(N, B, S, T, modified, seed):
    """``N`` terms of ``px`` (regular: with k2's ``-inf`` column ``t = T``) and ``py``."""
    g = torch.Generator().manual_seed(seed)
    px = [torch.randn(B, S, T if modified else T + 1, generator=g, dtype=torch.float64) for _ in range(N)]
    py = [torch.randn(B, S + 1, T, generator=g, dtype=torch.float64) for _ in range(N)]
    if not modified:
        px[0][:, :, T] = -math.inf
    return [x.requires_grad_() for x in px], [y.requires_grad_() for y in py]


@pytest.mark.parametrize("modified", [False, True])
def test_joint_mutual_information_splits_the_total_by_term(modified):
    B, S, T = 4, 3, 5
    px, py = grid_terms(3, B, S, T, modified, seed=1)
    bd = torch.tensor([[0, 0, 3, 5], [0, 0, 2, 4], [1, 1, 3, 5], [0, 2, 1, 5]])
    terms = fr.joint_mutual_information_recursion(px, py, bd)
    assert terms.shape == (3, B) and terms.dtype == torch.float64
    total, occ_x, occ_y = ref.mi_reference(sum(px).detach(), sum(py).detach(), bd)
    close(terms.sum(0), total)  # the terms add up to the recursion of the sums
    lo = torch.finfo(torch.float64).min
    for n in (1, 2):  # the other terms: occupancies times that term's scores
        want = (occ_x * px[n].detach().clamp(min=lo)).flatten(1).sum(1) + (occ_y * py[n].detach()).flatten(1).sum(1)
        close(terms[n], want)
    # d term_n / d px[n] = the occupancies (held constant); nothing reaches the other terms
    terms[1].sum().backward()
    close(px[1].grad, occ_x)
    close(py[1].grad, occ_y)
    assert px[0].grad is None or not px[0].grad.any()
    assert px[2].grad is None or not px[2].grad.any()


def test_joint_mutual_information_single_term_and_impossible_sequence():
    px, py = grid_terms(1, 2, 2, 3, False, seed=2)
    bd = torch.tensor([[0, 0, 2, 3], [0, 0, 2, 3]])
    with torch.no_grad():
        py[0][1] = -math.inf  # no path for sequence 1
    one = fr.joint_mutual_information_recursion(px, py, bd)
    close(one[0, 0], fr.mutual_information_recursion(px[0], py[0], bd)[0])
    assert one[0, 1].item() == -math.inf
    one[0, 0].backward()
    assert torch.isfinite(px[0].grad).all() and not px[0].grad[1].any()


@pytest.mark.parametrize("call, exc, match", [
    (lambda px, py: fr.joint_mutual_information_recursion(px[0], py), TypeError, "px"),
    (lambda px, py: fr.joint_mutual_information_recursion([], []), ValueError, "px"),
    (lambda px, py: fr.joint_mutual_information_recursion(px, py[:1]), ValueError, "px, py"),
    (lambda px, py: fr.joint_mutual_information_recursion([px[0], px[1][:, :2]], py), ValueError, r"px\[1\]"),
    (lambda px, py: fr.joint_mutual_information_recursion(px, [py[0], py[1].float()]), ValueError, r"py\[1\]"),
])
def test_joint_mutual_information_bad_inputs(call, exc, match):
    px, py = grid_terms(2, 2, 3, 4, False, seed=3)
    with pytest.raises(exc, match=match):
        call(px, py)


def test_with_cuda_reports_the_gpu_path(monkeypatch):
    assert fr.with_cuda() is (torch.version.cuda is not None and _cupy_matches())
    # a CUDA build of torch with a CuPy of the same CUDA major version
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        runtimeGetVersion=lambda: 13000)))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert fr.with_cuda() is True
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # CuPy built for another CUDA
    assert fr.with_cuda() is False
    monkeypatch.setitem(sys.modules, "cupy", None)  # no CuPy
    assert fr.with_cuda() is False
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build of torch
    assert fr.with_cuda() is False


def _cupy_matches():
    try:
        from chainfb.cuda.kernels import require_cupy

        require_cupy()
        return True
    except Exception:
        return False


def hat_logprobs(logits, blank):
    """HAT's log-probabilities, written from the paper: the blank has
    ``sigmoid(b)``, a symbol ``(1 - sigmoid(b)) * softmax(non-blank logits)``."""
    b = logits[..., blank]
    others = torch.cat([logits[..., :blank], logits[..., blank + 1:]], dim=-1)
    sym = torch.log1p(-torch.sigmoid(b))[..., None] + torch.log_softmax(others, -1)
    out = torch.cat([sym[..., :blank], torch.log(torch.sigmoid(b))[..., None], sym[..., blank:]], dim=-1)
    return out


@pytest.mark.parametrize("blank", [0, 4])
def test_hat_loss_by_path_enumeration(blank):
    """A band of every position (s_range = S + 1) is the whole RNN-T lattice:
    the HAT loss is -log of the sum over every alignment of HAT's arc
    probabilities; its gradient is the enumeration's."""
    g = torch.Generator().manual_seed(4)
    B, T, S, C = 2, 4, 2, 5
    logits = torch.randn(B, T, S + 1, C, generator=g, dtype=torch.float64, requires_grad=True)
    symbols = torch.tensor([[1, 2], [3, 1]]) if blank == 0 else torch.tensor([[1, 2], [3, 0]])
    ranges = torch.arange(S + 1).expand(B, T, S + 1).contiguous()
    T_b, S_b = [4, 3], [2, 1]
    bd = torch.tensor([[0, 0, S_b[0], T_b[0]], [0, 0, S_b[1], T_b[1]]])
    loss = fr.rnnt_loss_pruned(logits, symbols, ranges, blank, bd, reduction="none", use_hat_loss=True)
    lp = hat_logprobs(logits, blank)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(B, T, S + 1, dtype=torch.float64))
    want = torch.stack([-tr_ref.enumerate_loglike(lp[b], symbols[b], T_b[b], S_b[b], blank) for b in range(B)])
    close(loss, want)
    g1 = torch.autograd.grad(loss.sum(), logits)[0]
    g2 = torch.autograd.grad(want.sum(), logits)[0]
    close(g1, g2)


@pytest.mark.parametrize("rnnt_type", ["regular", "modified", "constrained"])
@pytest.mark.parametrize("delay_penalty", [0.0, 0.3])
def test_hat_loss_and_logprobs_against_the_reference(rnnt_type, delay_penalty):
    """A band from prune_ranges: the pruned loss of HAT's (normalised)
    log-probabilities, by the float64 grid reference."""
    am, lm, symbols, blank = _case(seed=5)
    B, T, C = am.shape
    bd = torch.tensor([[0, 0, 4, 7], [0, 0, 1, 5], [0, 0, 3, 4]])
    _, grads = fr.rnnt_loss_simple(lm, am, symbols, blank, bd, rnnt_type=rnnt_type, return_grad=True)
    ranges = fr.get_rnnt_prune_ranges(*grads, bd, 3)
    am_p, lm_p = fr.do_rnnt_pruning(am, lm, ranges)
    logits = torch.tanh(am_p + lm_p).mul(3).detach().requires_grad_()
    lp = hat_logprobs(logits.detach(), blank)
    px, py = fr.get_hat_logprobs_pruned(logits, symbols, ranges, blank, bd, rnnt_type)
    px_ref, py_ref = ref.pruned_logprobs_reference(lp, symbols, ranges, blank, bd, rnnt_type)
    close(px, px_ref)
    close(py, py_ref)
    loss, (pxg, pyg) = fr.rnnt_loss_pruned(logits, symbols, ranges, blank, bd, rnnt_type, delay_penalty, "sum",
                                           True, use_hat_loss=True)
    want, (pxg_ref, pyg_ref) = ref.rnnt_loss_pruned_reference(lp, symbols, ranges, blank, bd, rnnt_type,
                                                              delay_penalty, "sum", True)
    close(loss, want)
    close(pxg, pxg_ref)
    close(pyg, pyg_ref)
    if delay_penalty:
        assert torch.autograd.gradcheck(
            lambda z: fr.rnnt_loss_pruned(z, symbols, ranges, blank, bd, rnnt_type, delay_penalty, "none",
                                          use_hat_loss=True), (logits,), fast_mode=True)


def _case(seed, B=3, S=4, T=7, C=6):
    g = torch.Generator().manual_seed(seed)
    am = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    lm = torch.randn(B, S + 1, C, generator=g, dtype=torch.float64)
    symbols = torch.randint(1, C, (B, S), generator=g)
    return am, lm, symbols, 0


def test_hat_loss_takes_half_precision_and_checks_its_flag():
    am, lm, symbols, blank = _case(seed=6)
    ranges = torch.arange(5).expand(3, 7, 5).contiguous()
    logits = torch.randn(3, 7, 5, 6, dtype=torch.float64)
    full = fr.rnnt_loss_pruned(logits, symbols, ranges, blank, use_hat_loss=True)
    half = fr.rnnt_loss_pruned(logits.to(torch.bfloat16), symbols, ranges, blank, use_hat_loss=True)
    assert half.dtype == torch.bfloat16
    close(half.double(), full, tol=5e-2)
    plain = fr.rnnt_loss_pruned(logits, symbols, ranges, blank)
    assert not torch.allclose(plain, full)
    with pytest.raises(TypeError, match="use_hat_loss"):
        fr.rnnt_loss_pruned(logits, symbols, ranges, blank, use_hat_loss="yes")
    with pytest.raises(ValueError, match="termination_symbol"):
        fr.get_hat_logprobs_pruned(logits, symbols, ranges, 6)


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_deprecated_prune_ranges_against_the_reference(rnnt_type):
    am, lm, symbols, blank = _case(seed=7, B=3, S=5, T=9)
    bd = torch.tensor([[0, 0, 5, 9], [0, 0, 2, 6], [0, 0, 4, 5]])
    _, (pxg, pyg) = fr.rnnt_loss_simple(lm, am, symbols, blank, bd, rnnt_type=rnnt_type, return_grad=True)
    for s_range in range(2 if rnnt_type == "regular" else 1, 6):
        got = fr.get_rnnt_prune_ranges_deprecated(pxg, pyg, bd, s_range)
        assert torch.equal(got, ref.prune_ranges_reference(pxg, pyg, bd, s_range, legacy=True))
    # above S the band is every position: S + 1 of them (never widened, never narrowed to S)
    wide = fr.get_rnnt_prune_ranges_deprecated(pxg, pyg, bd, 9)
    assert torch.equal(wide, torch.arange(6).expand(3, 9, 6))
    # the older choice differs from the newer one somewhere
    assert not torch.equal(fr.get_rnnt_prune_ranges_deprecated(pxg, pyg, bd, 2),
                           fr.get_rnnt_prune_ranges(pxg, pyg, bd, 2))


def test_deprecated_prune_ranges_bad_inputs():
    pxg, pyg = torch.zeros(2, 3, 6), torch.zeros(2, 4, 5)
    with pytest.raises(ValueError, match="s_range"):
        fr.get_rnnt_prune_ranges_deprecated(pxg, pyg, None, 1)
    with pytest.raises(TypeError, match="s_range"):
        fr.get_rnnt_prune_ranges_deprecated(pxg, pyg, None, 2.0)
    with pytest.raises(ValueError, match="px_grad"):
        fr.get_rnnt_prune_ranges_deprecated(pxg[:, :2], pyg, None, 2)
    with pytest.raises(ValueError, match="boundary"):
        fr.get_rnnt_prune_ranges_deprecated(pxg, pyg, torch.tensor([[0, 0, 4, 5]] * 2), 2)
    assert fr.get_rnnt_prune_ranges_deprecated(pxg[:, :, :5], pyg, None, 1).shape == (2, 5, 1)


# ========================================================================= NeMo


def nemo_batch(seed, B=3, T=6, U=3, V=7, labels_below=None, extra=0, dtype=torch.float64):
    """Logits ``[B, T, U + 1, V + extra]``, int64 labels in ``[0, labels_below)``, lengths
    (utterance 0 the longest in both)."""
    rng = np.random.default_rng(seed)
    Tb = rng.integers(1, T + 1, B)
    Tb[0] = T
    Ub = rng.integers(0, U + 1, B)
    Ub[0] = U
    tg = rng.integers(0, labels_below or V - 1, (B, U))
    x = torch.tensor(rng.normal(size=(B, T, U + 1, V + extra)), dtype=dtype)
    return x, torch.tensor(tg), torch.tensor(Tb), torch.tensor(Ub)


def test_nemo_functional_multiblank_in_nemo_argument_order():
    V, durations, sigma = 7, [2, 3], 0.05
    x, tg, Tb, Ub = nemo_batch(8, V=V, labels_below=V - 3)
    x.requires_grad_()
    per = torch.stack([-tr_ref.enumerate_loglike(torch.log_softmax(x[b], -1), tg[b], int(Tb[b]), int(Ub[b]),
                                                 V - 1, durations, sigma) for b in range(3)])
    # reduction is the 7th positional argument, as in NeMo (chainfb.multiblank_rnnt_loss has sigma there)
    none = espnet.multiblank_rnnt_loss(x, tg, Tb, Ub, V - 1, durations, "none", 0.0, 0.0, sigma=sigma)
    close(none, per)
    total = espnet.multiblank_rnnt_loss(x, tg, Tb, Ub, V - 1, durations, "sum", sigma=sigma)
    mean = espnet.multiblank_rnnt_loss(x, tg, Tb, Ub, V - 1, durations, "mean", sigma=sigma)
    assert total.shape == mean.shape == (1,)
    close(total, per.sum())
    close(mean, per.sum() / 3)
    close(torch.autograd.grad(mean.sum(), x)[0], torch.autograd.grad(per.sum() / 3, x)[0])
    with pytest.raises(ValueError, match="clamp"):
        espnet.multiblank_rnnt_loss(x, tg, Tb, Ub, V - 1, durations, "mean", 0.0, -1.0)
    with pytest.raises(ValueError, match="reduction"):
        espnet.multiblank_rnnt_loss(x, tg, Tb, Ub, V - 1, durations, "mean_batch")
    # NeMo's RNNTLoss sets reduction = None on its loss module for the per-utterance costs
    module = espnet.MultiblankRNNTLossNumba(V - 1, durations, sigma=sigma)
    module.reduction = None
    close(module(x, tg, Tb, Ub), per)
    close(espnet.RNNTLossNumba(reduction=None)(x, tg, Tb, Ub), chainfb.rnnt_loss(x, tg, Tb, Ub, 0, reduction="none"))


def test_nemo_functional_tdt_in_nemo_argument_order():
    V, durations, sigma = 5, [0, 1, 2], 0.05
    x, tg, Tb, Ub = nemo_batch(9, V=V, extra=len(durations))
    x.requires_grad_()
    per = torch.stack([-tdt_ref.enumerate_loglike(x[b], tg[b], int(Tb[b]), int(Ub[b]), V - 1, durations, sigma)
                       for b in range(3)])
    none = espnet.tdt_loss(x, tg, Tb, Ub, V - 1, durations, "none", 0.0, 0.0, sigma=sigma)
    close(none, per)
    mean = espnet.tdt_loss(x, tg, Tb, Ub, V - 1, durations, "mean", sigma=sigma)
    assert mean.shape == (1,)
    close(mean, per.sum() / 3)
    close(torch.autograd.grad(mean.sum(), x)[0], torch.autograd.grad(per.sum() / 3, x)[0])
    with pytest.raises(ValueError, match="clamp"):
        espnet.tdt_loss(x, tg, Tb, Ub, V - 1, durations, "mean", 0.0, -0.5)


@pytest.mark.parametrize("change, exc, match", [
    (lambda a: a.update(labels=a["labels"].int()), TypeError, "labels"),
    (lambda a: a.update(lengths=a["lengths"].int()), TypeError, "lengths"),
    (lambda a: a.update(label_lengths=a["label_lengths"].int()), TypeError, "label_lengths"),
    (lambda a: a.update(log_probs=a["log_probs"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "log_probs: must be contiguous"),
    (lambda a: a.update(log_probs=a["log_probs"][0]), ValueError, "log_probs: must be 4-D"),
    (lambda a: a.update(lengths=a["lengths"][:2]), ValueError, "lengths: must have a length per example"),
    (lambda a: a.update(lengths=a["lengths"] - 1), ValueError, "lengths: input length mismatch"),
    (lambda a: a.update(log_probs=a["log_probs"][:, :, :3].contiguous()), ValueError,
     "label_lengths: output length mismatch"),
    (lambda a: a.update(labels=[[1, 2]]), TypeError, "labels"),
])
def test_nemo_certify_inputs(change, exc, match):
    x, tg, Tb, Ub = nemo_batch(10)
    args = dict(log_probs=x, labels=tg, lengths=Tb, label_lengths=Ub)
    assert espnet.certify_inputs(**args) is None
    change(args)
    with pytest.raises(exc, match=match):
        espnet.certify_inputs(**args)


def test_nemo_rnnt_loss_reductions_trimming_and_gradient():
    """NeMo's RNNTLoss: blank = num_classes (the last logit), logits and
    targets trimmed to the longest utterance, per-utterance costs reduced
    as NeMo reduces them (an utterance without labels counts 1 label)."""
    V = 6
    x, tg, Tb, Ub = nemo_batch(11, B=4, T=5, U=3, V=V, labels_below=V - 1)
    Ub[3] = 0
    Tb[0] = 4  # the logits have one frame more than the longest utterance
    tg = torch.cat([tg, tg[:, :1]], 1).int()  # and the targets one column more
    x.requires_grad_()
    per, grads = [], []
    for b in range(4):
        lp, g = tr_ref.grid_reference(x.detach()[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), V - 1)
        per.append(-lp)
        grads.append(g)
    per, grads = torch.tensor(per), torch.tensor(np.stack(grads))
    U1 = Ub.double().clamp(min=1)
    want = {None: per, "mean_batch": per.mean(), "sum": per.sum(), "mean": (per / U1).mean(),
            "mean_volume": per.sum() / Ub.sum()}
    for reduction, value in want.items():
        got = nemo.RNNTLoss(V - 1, reduction=reduction)(log_probs=x, targets=tg, input_lengths=Tb.int(),
                                                         target_lengths=Ub)
        assert got.dtype == torch.float64 and got.shape == value.shape
        close(got, value)
    loss = nemo.RNNTLoss(V - 1, reduction="mean")(x, tg, Tb, Ub)
    loss.backward()
    close(x.grad[:, :4], (grads / (4 * U1)[:, None, None, None])[:, :4])
    assert not x.grad[:, 4].any()


def test_nemo_rnnt_loss_names_and_dtypes():
    V, durations = 5, [0, 1, 2]
    x, tg, Tb, Ub = nemo_batch(12, V=V, extra=len(durations))
    tdt = nemo.RNNTLoss(V - 1, reduction=None, loss_name="tdt", loss_kwargs={"durations": durations, "sigma": 0.05})
    got = tdt(x, tg, Tb, Ub)
    assert got.dtype == torch.float32  # NeMo computes every loss but the default in float32
    want = chainfb.tdt_loss(x.float(), tg, Tb, Ub, V - 1, durations, sigma=0.05, reduction="none")
    close(got, want, tol=1e-6)
    y = x[..., :V]
    plain = nemo.RNNTLoss(V - 1, reduction=None)(y, tg, Tb, Ub)
    assert plain.dtype == torch.float64
    for name in ("warprnnt_numba", "warprnnt", "pytorch"):
        close(nemo.RNNTLoss(V - 1, reduction=None, loss_name=name)(y, tg, Tb, Ub), plain, tol=1e-6)
    mb = nemo.RNNTLoss(V - 1, reduction="sum", loss_name="multiblank_rnnt",
                       loss_kwargs={"big_blank_durations": [2], "sigma": 0.1})
    tg_mb = tg.clamp(max=V - 3)
    close(mb(y, tg_mb, Tb, Ub), chainfb.multiblank_rnnt_loss(y.float(), tg_mb, Tb, Ub, V - 1, [2], sigma=0.1,
                                                             reduction="sum"), tol=1e-6)


def test_nemo_resolve_rnnt_loss():
    m = nemo.resolve_rnnt_loss("default", 4, {"fastemit_lambda": 0.1, "clamp": 0.5})
    assert isinstance(m, espnet.RNNTLossNumba)
    assert (m.blank, m.reduction, m.fastemit_lambda, m.clamp) == (4, "none", 0.1, 0.5)
    kwargs = {"durations": [0, 1], "omega": 0.0, "sigma": 0.05, "fastemit_lambda": 0.0, "unknown": 1}
    with pytest.warns(UserWarning, match="'unknown'"):
        t = nemo.resolve_rnnt_loss("tdt", 4, kwargs)
    assert isinstance(t, espnet.TDTLossNumba) and t.durations == [0, 1] and t.sigma == 0.05
    assert "unknown" in kwargs and len(kwargs) == 5  # NeMo pops; the caller's mapping is left alone
    with pytest.warns(UserWarning, match="'fastemit_lambda'"):
        w = nemo.resolve_rnnt_loss("warprnnt", 4, {"fastemit_lambda": 0.3})
    assert w.fastemit_lambda == 0.0
    mb = nemo.resolve_rnnt_loss("multiblank_rnnt_pytorch", 4, {"big_blank_durations": [2, 4], "sigma": 0.05})
    assert isinstance(mb, espnet.MultiblankRNNTLossNumba) and mb.big_blank_durations == [2, 4]
    assert nemo.resolve_rnnt_default_loss_name() == "warprnnt_numba"
    with pytest.raises(ValueError, match="loss_name"):
        nemo.resolve_rnnt_loss("warprnnt_cuda", 4)
    with pytest.raises(ValueError, match="graph_rnnt"):
        nemo.resolve_rnnt_loss("graph_rnnt", 4)
    with pytest.raises(TypeError, match="loss_kwargs"):
        nemo.resolve_rnnt_loss("default", 4, [("clamp", 1.0)])
    with pytest.raises(ValueError, match="reduction"):
        nemo.RNNTLoss(4, reduction="none")
    x, tg, Tb, Ub = nemo_batch(13)
    with pytest.raises(ValueError, match="input_lengths"):
        nemo.RNNTLoss(6)(x, tg, Tb + 1, Ub)


# ================================================================== SpeechBrain


def test_speechbrain_transducer_loss_relative_lengths():
    """Relative lengths become absolute as SpeechBrain makes them: times the
    padded size, then torch.round (halves to even), not truncated."""
    g = torch.Generator().manual_seed(14)
    B, T, U, V = 4, 6, 4, 5
    x = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64, requires_grad=True)
    tg = torch.randint(1, V, (B, U), generator=g)
    rel_T = torch.tensor([1.0, 0.6, 0.25, 0.75])  # 6, 3.6 -> 4, 1.5 -> 2, 4.5 -> 4
    rel_U = torch.tensor([1.0, 0.5, 0.375, 0.125])  # 4, 2, 1.5 -> 2, 0.5 -> 0
    Tb, Ub = [6, 4, 2, 4], [4, 2, 2, 0]
    lp = torch.log_softmax(x, -1)
    nll = torch.stack([-tr_ref.enumerate_loglike(lp[b], tg[b], Tb[b], Ub[b], 0) for b in range(B)])
    # torchaudio's loss (the default): -log P, batch mean, the exact gradient
    loss = speechbrain.transducer_loss(x, tg, rel_T, rel_U, 0)
    close(loss, nll.mean())
    close(torch.autograd.grad(loss, x)[0], torch.autograd.grad(nll.mean(), x, retain_graph=True)[0])
    assert torch.autograd.gradcheck(lambda z: speechbrain.transducer_loss(z, tg, rel_T, rel_U, 0, "sum"), (x,),
                                    fast_mode=True)
    # SpeechBrain's numba loss: -log P / T_b, its gradient neither divided by T_b nor by B
    sb = speechbrain.transducer_loss(x, tg, rel_T, rel_U, 0, reduction="mean", use_torchaudio=False)
    close(sb, (nll / torch.tensor(Tb)).mean())
    close(torch.autograd.grad(sb, x)[0], torch.autograd.grad(nll.sum(), x)[0])


def test_speechbrain_transducer_loss_errors():
    x = torch.randn(2, 5, 3, 4)
    tg = torch.tensor([[1, 2], [3, 1]])
    with pytest.raises(ValueError, match="input_lens"):
        speechbrain.transducer_loss(x, tg, torch.tensor([1.2, 1.0]), torch.tensor([1.0, 0.5]), 0)
    with pytest.raises(ValueError, match="target_lens"):
        speechbrain.transducer_loss(x, tg, torch.tensor([1.0, 1.0]), torch.tensor([1.0, -0.5]), 0)
    with pytest.raises(TypeError, match="input_lens"):
        speechbrain.transducer_loss(x, tg, [1.0, 1.0], torch.tensor([1.0, 0.5]), 0)
    with pytest.raises(TypeError, match="use_torchaudio"):
        speechbrain.transducer_loss(x, tg, torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.5]), 0,
                                    use_torchaudio="no")
    # through torchaudio: its rule T == max(T_b), raised as torchaudio raises it (a RuntimeError)
    with pytest.raises(RuntimeError, match="max\\(logit_lengths\\)"):
        speechbrain.transducer_loss(x, tg, torch.tensor([0.8, 0.6]), torch.tensor([1.0, 0.5]), 0)
    with pytest.raises(ValueError, match="reduction"):
        speechbrain.transducer_loss(x, tg, torch.tensor([1.0, 0.6]), torch.tensor([1.0, 0.5]), 0, "batchmean")


# =================================================================== torchaudio


def ta_batch():
    g = torch.Generator().manual_seed(15)
    x = torch.randn(2, 4, 3, 5, generator=g)
    return x, torch.tensor([[1, 2], [3, 0]], dtype=torch.int32), torch.tensor([4, 3], dtype=torch.int32), \
        torch.tensor([2, 1], dtype=torch.int32)


@pytest.mark.parametrize("call, kind, match", [
    (lambda x, tg, T, U: ta.rnnt_loss(x, tg.long(), T, U), TypeError, "int32"),
    (lambda x, tg, T, U: ta.rnnt_loss(x.numpy(), tg, T, U), TypeError, "logits"),
    (lambda x, tg, T, U: ta.rnnt_loss(x, tg, T - 1, U), ValueError, "logit_lengths"),
    (lambda x, tg, T, U: ta.rnnt_loss(x, tg, T, U + 1), ValueError, "target_lengths"),
    (lambda x, tg, T, U: ta.rnnt_loss(x, tg, T, U, blank=5), ValueError, "blank"),
    (lambda x, tg, T, U: ta.rnnt_loss(x, tg, T, U, reduction="avg"), ValueError, "reduction"),
    (lambda x, tg, T, U: ta.RNNTLoss(blank=0)(x, tg, T, U - 1), ValueError, "target_lengths|max"),
])
def test_torchaudio_input_errors_are_runtime_errors(call, kind, match):
    """torchaudio raises RuntimeError from its C++ checks; chainfb's errors
    are that and its own ValueError / TypeError."""
    with pytest.raises(RuntimeError, match=match) as info:
        call(*ta_batch())
    assert isinstance(info.value, kind)
    assert isinstance(info.value, ta.InputError if kind is ValueError else ta.InputTypeError)


def ctc_best_score(log_probs, target):
    """The best CTC path's log-probability by enumerating every labelling of the frames."""
    T, C = log_probs.shape
    best = -math.inf
    for labels in np.ndindex(*([C] * T)):
        collapsed = [c for i, c in enumerate(labels) if c != 0 and (i == 0 or c != labels[i - 1])]
        if collapsed == list(target):
            best = max(best, sum(float(log_probs[t, c]) for t, c in enumerate(labels)))
    return best


def test_torchaudio_forced_align_and_merge_tokens():
    g = torch.Generator().manual_seed(16)
    log_probs = torch.randn(2, 5, 4, generator=g, dtype=torch.float64).log_softmax(-1)
    targets = torch.tensor([[1, 1, 3], [2, 0, 0]], dtype=torch.int32)
    il, tl = torch.tensor([5, 4]), torch.tensor([3, 1])
    align, scores = ta.forced_align(log_probs, targets, il, tl)
    ref_align, ref_scores = chainfb.forced_align(log_probs, targets, il, tl)
    assert torch.equal(align, ref_align) and torch.equal(scores, ref_scores)
    close(scores[0].sum(), ctc_best_score(log_probs[0], [1, 1, 3]))
    close(scores[1, :4].sum(), ctc_best_score(log_probs[1, :4], [2]))
    one, _ = ta.forced_align(log_probs[:1], targets[:1])  # torchaudio's form: one utterance, no lengths
    assert torch.equal(one, align[:1])
    assert ta.merge_tokens(align[0], scores[0].exp()) == chainfb.merge_tokens(align[0], scores[0].exp())
    assert [s.token for s in ta.merge_tokens(align[0], scores[0])] == [1, 1, 3]


@pytest.mark.parametrize("call, kind, match", [
    (lambda lp, tg: ta.forced_align(lp, tg, None, torch.tensor([4, 1])), ValueError,
     r"target_lengths: every length must lie in \[0, targets.shape\[1\]=3\], got 4"),
    (lambda lp, tg: ta.forced_align(lp, torch.tensor([[1, 0, 3], [2, 0, 0]])), ValueError, "blank"),
    (lambda lp, tg: ta.forced_align(lp[:, :2], tg, None, torch.tensor([3, 1])), ValueError, "no CTC alignment"),
    (lambda lp, tg: ta.forced_align(lp, tg.double()), TypeError, "targets"),
    (lambda lp, tg: ta.merge_tokens([1, 2], [0.5]), ValueError, "tokens, scores"),
])
def test_torchaudio_forced_align_errors(call, kind, match):
    lp = torch.randn(2, 5, 4).log_softmax(-1)
    tg = torch.tensor([[1, 1, 3], [2, 0, 0]])
    with pytest.raises(RuntimeError, match=match) as info:
        call(lp, tg)
    assert isinstance(info.value, kind)
    assert "T=" not in str(info.value)
