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


def close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(torch.as_tensor(a).detach().double()),
                               np.asarray(torch.as_tensor(b).detach().double()), rtol=tol, atol=tol)


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
