"""The public API on each device: the same test bodies for "cpu" and "cuda"
(torchaudio style: a base class and thin per-device subclasses).  The CUDA
classes skip cleanly without a GPU (CI); on a GPU machine they check the
CuPy RawKernel path against the NumPy path."""

import numpy as np
import pytest
import torch

import chainfb
from chainfb import FstBatch, Lattice
from chainfb.engine import forward_backward_lattice
from chainfb.testing import random_fst
from rnnt_reference import rnnt_reference, rnnt_step_case


def _cuda_available():
    try:
        import cupy

        return torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


CUDA = _cuda_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU, torch with CUDA and CuPy")


def _graphs(seed, n=4):
    rng = np.random.default_rng(seed)
    return [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=6, num_finals=2) for _ in range(n)], rng


class _DeviceTests:
    device = "cpu"

    def tensor(self, a, dtype=torch.float64):
        return torch.as_tensor(np.asarray(a), dtype=dtype).to(self.device)

    def test_forward_backward_matches_numpy(self):
        fsts, rng = _graphs(0)
        N, T, P = 4, 7, 6
        scores = rng.normal(size=(N, T, P))
        lengths = np.array([7, 0, 3, 1])
        ll_ref, post_ref = chainfb.forward_backward(fsts, scores, lengths)
        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
            ll, post = chainfb.forward_backward(fsts, self.tensor(scores, dtype), lengths)
            assert ll.device.type == self.device and post.device.type == self.device and post.dtype == dtype
            np.testing.assert_allclose(ll.cpu().double().numpy(), ll_ref, rtol=tol, atol=tol)
            np.testing.assert_allclose(post.cpu().double().numpy(), post_ref, rtol=tol, atol=tol)
            assert not torch.isnan(post).any()

    def test_fst_loglike_gradcheck(self):
        fsts, rng = _graphs(1, n=2)
        scores = self.tensor(rng.normal(size=(2, 4, 6))).requires_grad_(True)
        lengths = [4, 3]
        assert torch.autograd.gradcheck(lambda s: chainfb.fst_loglike(s, fsts, lengths), (scores,))

    def test_fst_loglike_impossible_gives_zero_grad(self):
        f = chainfb.Fst.from_arcs([(0, 1, 0, 0.0)], {1: 0.0}, num_states=2)  # exactly one frame
        scores = self.tensor(np.zeros((1, 3, 2))).requires_grad_(True)
        ll = chainfb.fst_loglike(scores, [f], [3])
        assert torch.isneginf(ll).all()
        ll.sum().backward()
        assert torch.equal(scores.grad, torch.zeros_like(scores))

    def test_kaldi_api(self):
        fsts, rng = _graphs(2, n=3)
        N, T, P = 3, 5, 8
        out = rng.normal(size=(T * N, P))
        sup = chainfb.Supervision(fsts, T, weight=0.5, lengths=[5, 4, 5])
        ref_deriv = np.zeros((T * N, P))
        ok_ref, tot_ref = chainfb.GenericNumeratorComputation(sup, out).forward_backward(ref_deriv)
        deriv = self.tensor(np.zeros((T * N, P)))
        comp = chainfb.GenericNumeratorComputation(sup, self.tensor(out))
        ok, tot = comp.forward_backward(deriv)
        assert ok == ok_ref
        np.testing.assert_allclose(tot, tot_ref, rtol=1e-10)
        np.testing.assert_allclose(deriv.cpu().numpy(), ref_deriv, atol=1e-10)
        np.testing.assert_allclose(comp.compute_objf(), tot_ref, rtol=1e-10)


class TestCPU(_DeviceTests):
    device = "cpu"


@pytest.mark.cuda
@requires_cuda
class TestCUDA(_DeviceTests):
    device = "cuda"

    def test_engine_leaky_and_bitwise_deterministic(self):
        import cupy

        from chainfb.cuda import forward_backward_lattice_cuda

        rng = np.random.default_rng(3)
        f = random_fst(rng, num_states=300, num_arcs=3000, num_pdfs=50, num_finals=300)
        lat = Lattice.of(FstBatch([f], np.zeros(5, dtype=np.int64)))  # larger than a block
        init = rng.random(lat.num_states)
        for n in range(5):
            sl = slice(lat.state_offsets[n], lat.state_offsets[n + 1])
            init[sl] /= init[sl].sum()
        X = rng.normal(size=(60, lat.num_columns))
        lengths = np.array([60, 59, 1, 0, 30])
        for leaky in (None, (0.1, np.log(init))):
            ll_ref, post_ref = forward_backward_lattice(lat, X.copy(), lengths, leaky=leaky)
            runs = [forward_backward_lattice_cuda(lat, cupy.asarray(X), cupy.asarray(lengths), leaky=leaky)
                    for _ in range(2)]
            ll, post = (a.get() for a in runs[0])
            np.testing.assert_allclose(ll, ll_ref, rtol=1e-10)
            np.testing.assert_allclose(post, post_ref, atol=1e-10)
            assert np.array_equal(runs[1][0].get(), ll) and np.array_equal(runs[1][1].get(), post)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
    def test_transducer_kernels_match_twins(self, dtype):
        from chainfb.cuda import transducer_gather, transducer_grad, twins
        from chainfb.cuda.transducer_maps import transducer_symbols

        rng = np.random.default_rng(4)
        B, T, Umax, V, M = 4, 20, 6, 40, 2
        U1 = Umax + 1
        T_len = np.array([20, 11, 5, 20])
        U_len = np.array([6, 2, 0, 6])
        targets = rng.integers(0, V - 3, (B, Umax))
        colidx = -np.ones((B, U1, M + 2), dtype=np.int32)
        c = 0
        for b in range(B):
            for u in range(U_len[b] + 1):
                for j in range(M + 2):
                    if not (j == 1 and u >= U_len[b]):
                        colidx[b, u, j] = c
                        c += 1
        zero_col = np.arange(c, c + B, dtype=np.int32)
        C = c + B
        rows = T + Umax
        sym = transducer_symbols(targets, U_len, U1, V - 1, [V - 2, V - 3])
        kw = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len)
        logits_cpu = torch.randn(B, T, U1, V, dtype=torch.float32).to(dtype)
        logits = logits_cpu.cuda()
        X, lse = transducer_gather(logits, num_rows=rows, num_columns=C, zero_col=zero_col, **kw)
        Xt, lset = twins.transducer_gather(logits_cpu, num_rows=rows, num_columns=C, zero_col=zero_col, **kw)
        tol = 1e-12 if dtype == torch.float64 else 2e-6
        np.testing.assert_allclose(X.get(), Xt, rtol=tol, atol=tol)
        np.testing.assert_allclose(lse.get(), lset, rtol=tol, atol=tol)
        post = rng.random((rows, C))
        for fastemit, clamp in ((0.0, -1.0), (0.2, 0.03)):
            w = np.array([1.0, 1.0 + fastemit, 1.0, 1.0])  # FastEmit weighs the label kind
            g = transducer_grad(logits, post=post, lse=lse, scale=np.full(B, 0.5), kind_weight=w, clamp=clamp, **kw)
            gt = twins.transducer_grad(logits_cpu, post=post, lse=lset, scale=np.full(B, 0.5), kind_weight=w,
                                       clamp=clamp, **kw)
            assert g.dtype == dtype and g.is_cuda
            rt = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5, torch.float64: 1e-12}[dtype]
            np.testing.assert_allclose(g.cpu().double().numpy(), gt.double().numpy(), rtol=rt, atol=rt)

    def test_cupy_view_zero_copy_on_torch_stream(self):
        import cupy

        from chainfb.cuda import cupy_view

        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = torch.arange(6.0, device="cuda")
            a = cupy_view(t)
            assert a.data.ptr == t.data_ptr()
            assert cupy.cuda.get_current_stream().ptr == s.cuda_stream
            a *= 2
        s.synchronize()
        assert torch.equal(t.cpu(), torch.arange(6.0) * 2)
        b = cupy_view(torch.ones(3, device="cuda", dtype=torch.bfloat16))
        assert b.dtype == np.int16 and int(b[0]) == 0x3F80

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_rnnt_kernels_and_engine_match_direct_recursion(self, dtype):
        import cupy

        from chainfb.cuda import forward_backward_lattice_cuda, transducer_gather, transducer_grad

        rng = np.random.default_rng(5)
        logits_np, lat, args, rows, T_len, U_len, ref_args = rnnt_step_case(rng)
        logits = torch.tensor(logits_np, dtype=dtype, device="cuda")
        X, lse = transducer_gather(logits, num_rows=rows, num_columns=lat.num_columns, **args)
        ll, post = forward_backward_lattice_cuda(lat, X, cupy.asarray(T_len + U_len))
        grad = transducer_grad(logits, post=post, lse=lse, scale=1.0, kind_weight=[1.0, 1.0], **args)
        lt = torch.tensor(logits_np, requires_grad=True)
        ref = rnnt_reference(lt, T_len=T_len, U_len=U_len, **ref_args)
        ref.sum().backward()
        tol = 1e-10 if dtype == torch.float64 else 1e-4
        np.testing.assert_allclose(-ll.get(), ref.detach().numpy(), rtol=tol)
        np.testing.assert_allclose(grad.cpu().double().numpy(), lt.grad.numpy(), atol=tol)
