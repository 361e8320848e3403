"""Compatibility modules (torchaudio, NeMo/ESPnet, SpeechBrain) and, when
installed, comparisons against the real peers."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb.compat import espnet, speechbrain
from chainfb.compat import torchaudio as ta_compat

from oracles.transducer import grid_reference


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def batch(seed=0, B=3, T=6, U=3, V=7, dtype=torch.float64, blank_last=True, reserved=1):
    rng = np.random.default_rng(seed)
    Tb = rng.integers(1, T + 1, B)
    Tb[0] = T
    Ub = rng.integers(0, U + 1, B)
    Ub[0] = U
    lo, hi = (0, V - reserved) if blank_last else (1, V)
    tg = rng.integers(lo, hi, (B, U))
    x = torch.tensor(rng.normal(size=(B, T, U + 1, V)), dtype=dtype)
    return x, i32(tg), i32(Tb), i32(Ub)


# ------------------------------------------------------------- torchaudio
def test_torchaudio_compat_matches_core_and_module():
    x, tg, Tb, Ub = batch()
    a = ta_compat.rnnt_loss(x, tg, Tb, Ub, reduction="none")
    b = chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="none")
    assert torch.equal(a, b)
    m = ta_compat.RNNTLoss(blank=-1, reduction="sum")
    assert m(x, tg, Tb, Ub).item() == pytest.approx(b.sum().item(), rel=1e-14)


def test_torchaudio_clamp_before_batch_scaling():
    x, tg, Tb, Ub = batch(1)
    x.requires_grad_()
    chainfb.rnnt_loss(x, tg, Tb, Ub, reduction="sum").backward()
    full = x.grad.clone()
    x.grad = None
    c = 0.05
    ta_compat.rnnt_loss(x, tg, Tb, Ub, clamp=c, reduction="mean").backward()
    assert (full > c).any() and (full < -c).any()
    np.testing.assert_allclose(x.grad.numpy(), full.clamp(-c, c).numpy() / 3, atol=1e-15)


def test_torchaudio_validation():
    x, tg, Tb, Ub = batch(2)
    with pytest.raises(TypeError, match="int32"):
        ta_compat.rnnt_loss(x, tg.long(), Tb, Ub)
    with pytest.raises(ValueError, match="max\\(logit_lengths\\)"):
        ta_compat.rnnt_loss(x, tg, Tb - 1, Ub)
    with pytest.raises(ValueError, match="max\\(target_lengths\\)"):
        ta_compat.rnnt_loss(x, tg, Tb, Ub - 1)
    with pytest.raises(ValueError, match="targets"):
        ta_compat.rnnt_loss(x, torch.cat([tg, tg], 1), Tb, Ub)
    with pytest.raises(ValueError, match="reduction"):
        ta_compat.rnnt_loss(x, tg, Tb, Ub, reduction="batchmean")


def test_gradcheck_torchaudio_compat():
    x, tg, Tb, Ub = batch(3, B=2, T=3, U=2, V=4)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda z: ta_compat.rnnt_loss(z, tg, Tb, Ub, blank=-1), (x,))


# -------------------------------------------------------------- NeMo/ESPnet
def test_espnet_mean_is_sum_over_batch_with_shape_1():
    x, tg, Tb, Ub = batch(4, blank_last=False)
    x.requires_grad_()
    loss = espnet.RNNTLossNumba(blank=0)(x, tg, Tb, Ub)
    core = chainfb.rnnt_loss(x, tg, Tb, Ub, blank=0, reduction="none")
    assert loss.shape == (1,)
    assert loss.item() == pytest.approx(core.sum().item() / 3, rel=1e-14)
    assert espnet.RNNTLossNumba(blank=0, reduction="sum")(x, tg, Tb, Ub).shape == (1,)
    assert espnet.RNNTLossNumba(blank=0, reduction="none")(x, tg, Tb, Ub).shape == (3,)
    loss.backward()
    g = x.grad.clone()
    x.grad = None
    core.sum().backward()
    np.testing.assert_allclose(g.numpy(), x.grad.numpy() / 3, atol=1e-15)


def test_espnet_fastemit_and_clamp():
    x, tg, Tb, Ub = batch(5, blank_last=False)
    lam, c = 0.2, 0.02
    x.requires_grad_()
    cost = espnet.RNNTLossNumba(blank=0, reduction="none", fastemit_lambda=lam, clamp=c)(x, tg, Tb, Ub)
    cost.sum().backward()
    for b in range(3):
        lp, g = grid_reference(x.detach()[b].numpy(), tg[b].numpy(), int(Tb[b]), int(Ub[b]), 0, fastemit=lam)
        assert cost[b].item() == pytest.approx(-(1 + lam) * lp, rel=1e-12)
        np.testing.assert_allclose(x.grad[b].numpy(), np.clip(g, -c, c), atol=1e-12)
    # clamp <= 0 disables in the module; the functional form rejects a negative clamp
    assert espnet.RNNTLossNumba(clamp=-1).clamp == 0.0
    with pytest.raises(ValueError, match="clamp"):
        espnet.rnnt_loss(x, tg, Tb, Ub, clamp=-1.0)
    f = espnet.rnnt_loss(x, tg, Tb, Ub, reduction="none", fastemit_lambda=lam, clamp=c)
    assert torch.equal(f.detach(), cost.detach())


def test_espnet_multiblank_matches_core_and_gradcheck():
    x, tg, Tb, Ub = batch(6, B=2, T=5, U=2, V=6, reserved=3)
    x.requires_grad_()
    m = espnet.MultiblankRNNTLossNumba(blank=5, big_blank_durations=[2, 3], reduction="none", sigma=0.05)
    a = m(x, tg, Tb, Ub)
    b = chainfb.multiblank_rnnt_loss(x, tg, Tb, Ub, 5, [2, 3], sigma=0.05, reduction="none")
    assert torch.equal(a.detach(), b.detach())
    assert torch.autograd.gradcheck(lambda z: m(z, tg, Tb, Ub), (x,))
    with pytest.raises(ValueError, match="big_blank_durations"):
        espnet.MultiblankRNNTLossNumba(blank=5, big_blank_durations=[1])(x, tg, Tb, Ub)


def test_gradcheck_espnet():
    x, tg, Tb, Ub = batch(7, B=2, T=3, U=2, V=4, blank_last=False)
    x.requires_grad_()
    m = espnet.RNNTLossNumba(blank=0)
    assert torch.autograd.gradcheck(lambda z: m(z, tg, Tb, Ub), (x,))


# -------------------------------------------------------------- SpeechBrain
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_speechbrain_loss_and_its_gradient_quirk(reduction):
    x, tg, Tb, Ub = batch(8, blank_last=False)
    x.requires_grad_()
    loss = speechbrain.TransducerLoss(blank=0, reduction=reduction)(x, tg, Tb, Ub)
    nll = chainfb.rnnt_loss(x, tg, Tb, Ub, blank=0, reduction="none")
    per = nll.detach() / Tb.double()
    want = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(loss.detach().numpy(), want.numpy(), rtol=1e-14)
    loss.sum().backward()
    g = x.grad.clone()
    x.grad = None
    nll.sum().backward()
    # SpeechBrain's gradient: d(-log P)/d logits, not divided by T_b nor by B
    np.testing.assert_allclose(g.numpy(), x.grad.numpy(), atol=1e-15)


def test_speechbrain_true_gradient_gradcheck():
    x, tg, Tb, Ub = batch(9, B=2, T=4, U=2, V=4, blank_last=False)
    x.requires_grad_()
    m = speechbrain.TransducerLoss(blank=0, reduction="mean", true_gradient=True)
    assert torch.autograd.gradcheck(lambda z: m(z, tg, Tb, Ub), (x,))
    n = speechbrain.TransducerLoss(blank=0, reduction="none", true_gradient=True)
    assert torch.autograd.gradcheck(lambda z: n(z, tg, Tb, Ub), (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_speechbrain_divisor_follows_the_costs(dtype):
    # the frame counts are host integers; the division must happen on the costs' device and in their dtype
    # ("meta" stands in for CUDA: like CUDA it refuses a [B] operand on the CPU)
    Tb = np.array([4, 2, 5])
    costs = torch.ones(3, dtype=dtype, device="meta")
    out = speechbrain._per_frame(costs, Tb)
    assert out.device == costs.device and out.dtype == dtype and out.shape == (3,)
    cpu = speechbrain._per_frame(torch.tensor([8.0, 3.0, 5.0], dtype=dtype), Tb)
    assert cpu.dtype == dtype
    np.testing.assert_allclose(cpu.double().numpy(), [2.0, 1.5, 1.0])


@pytest.mark.parametrize("true_gradient", [False, True])
def test_speechbrain_float32(true_gradient):
    x, tg, Tb, Ub = batch(10, blank_last=False)
    m = speechbrain.TransducerLoss(blank=0, reduction="none", true_gradient=true_gradient)
    loss32 = m(x.float().requires_grad_(), tg, Tb, Ub)
    assert loss32.dtype == torch.float32
    np.testing.assert_allclose(loss32.detach().double().numpy(), m(x, tg, Tb, Ub).detach().numpy(), rtol=1e-5)


def _cuda_available():
    try:
        import cupy

        return torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU, torch with CUDA and CuPy")
class TestSpeechBrainCuda:
    @pytest.mark.parametrize("true_gradient", [False, True])
    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    def test_matches_cpu(self, true_gradient, reduction):
        x, tg, Tb, Ub = batch(11, blank_last=False)
        m = speechbrain.TransducerLoss(blank=0, reduction=reduction, true_gradient=true_gradient)
        xc = x.clone().requires_grad_()
        xg = x.cuda().requires_grad_()
        lc = m(xc, tg, Tb, Ub)
        lg = m(xg, tg.cuda(), Tb.cuda(), Ub.cuda())
        assert lg.device.type == "cuda" and lg.dtype == lc.dtype
        np.testing.assert_allclose(lg.detach().cpu().numpy(), lc.detach().numpy(), rtol=1e-10)
        lc.sum().backward()
        lg.sum().backward()
        np.testing.assert_allclose(xg.grad.cpu().numpy(), xc.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_speechbrain_bad_reduction():
    with pytest.raises(ValueError, match="reduction"):
        speechbrain.TransducerLoss(reduction="avg")


# ------------------------------------------------------------------ peers
@pytest.mark.parametrize("blank", [0, -1])
@pytest.mark.parametrize("clamp", [-1.0, 0.03])
@pytest.mark.parametrize("fused", [True, False])
def test_against_torchaudio(blank, clamp, fused):
    ta = pytest.importorskip("torchaudio.functional")
    x, tg, Tb, Ub = batch(10, B=4, T=12, U=6, V=9, dtype=torch.float32, blank_last=blank < 0)
    if not fused:
        x = torch.log_softmax(x, -1)
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    a = ta.rnnt_loss(x1, tg, Tb, Ub, blank=blank, clamp=clamp, reduction="none", fused_log_softmax=fused)
    b = ta_compat.rnnt_loss(x2, tg, Tb, Ub, blank=blank, clamp=clamp, reduction="none", fused_log_softmax=fused)
    np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5)
    w = torch.rand(4)
    (a * w).sum().backward()
    (b * w).sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), x1.grad.numpy(), atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_against_warprnnt_numba(reduction, lam):
    wn = pytest.importorskip("warprnnt_numba")
    x, tg, Tb, Ub = batch(11, B=4, T=10, U=5, V=8, dtype=torch.float32, blank_last=False)
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    clamp = 0.05 if reduction == "sum" else -1  # the numba CPU path clamps after batch scaling
    a = wn.RNNTLossNumba(blank=0, reduction=reduction, fastemit_lambda=lam, clamp=clamp)(x1, tg, Tb, Ub)
    b = espnet.RNNTLossNumba(blank=0, reduction=reduction, fastemit_lambda=lam, clamp=clamp)(x2, tg, Tb, Ub)
    assert a.shape == b.shape
    np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5)
    a.sum().backward()
    b.sum().backward()
    np.testing.assert_allclose(x2.grad.numpy(), x1.grad.numpy(), atol=1e-5)
