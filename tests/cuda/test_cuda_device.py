"""CUDA-only checks (the kernels against their NumPy twins on the device,
CuPy interop); the public API per device is in test_engine.py and
test_transducer.py (``OnCUDA`` subclasses).  Skipped without a GPU."""

import numpy as np
import pytest
import torch

from chainfb import FstBatch, Lattice
from chainfb.cuda import cupy_backend
from chainfb.engines.numpy_log import forward_backward as forward_backward_numpy
from chainfb.testing import random_fst
from chainfb.transducer import symbol_table

from devices import OnCUDA
from oracles import cuda_twins as twins
from oracles.transducer import rnnt_reference, rnnt_step_case


class TestHostValuesOnTheDevice(OnCUDA):
    def test_reductions_by_host_lengths_never_synchronise(self):
        """``checks.reduce``'s per-length means with host totals (TDT's, the compat losses') copy them to the
        device without a synchronising call (``torch.cuda.set_sync_debug_mode("error")`` raises on one)."""
        from chainfb import checks

        values = torch.tensor([1.0, 3.0], device="cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = [checks.reduce(values, how, total) for how, total in
                   (("mean_volume", [2, 6]), ("frame", 4), ("mean_volume", torch.tensor([2, 6])))]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert [float(o) for o in out] == [0.5, 1.0, 0.5]


class TestCudaKernels(OnCUDA):
    def test_engine_leaky_and_bitwise_deterministic(self):
        import cupy

        from chainfb.engines.cuda import forward_backward as forward_backward_cuda

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
            ll_ref, post_ref = forward_backward_numpy(lat, X.copy(), lengths, leaky=leaky)
            runs = [forward_backward_cuda(cupy_backend(), lat, cupy.asarray(X), cupy.asarray(lengths), leaky=leaky)
                    for _ in range(2)]
            ll, post = (a.get() for a in runs[0])
            np.testing.assert_allclose(ll, ll_ref, rtol=1e-10)
            np.testing.assert_allclose(post, post_ref, atol=1e-10)
            assert np.array_equal(runs[1][0].get(), ll) and np.array_equal(runs[1][1].get(), post)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_clusters_give_the_bits_of_one_block(self, dtype):
        """Each direction of a sequence over a thread block cluster (cluster.cu) on the device: the same bits as
        one block with its rows in device memory, for 2, 4 and 8 blocks, with and without the arc table (a
        device before compute capability 9.0 refuses them)."""
        import cupy

        import chainfb.engines.cuda as cuda_engine
        from chainfb.testing import numerator_like_fst

        backend = cupy_backend()
        rng = np.random.default_rng(9)
        lat = Lattice.of(FstBatch([numerator_like_fst(rng, num_phones=60, num_pdfs=200) for _ in range(3)]))
        X = cupy.asarray(rng.normal(scale=3.0, size=(80, lat.num_columns)).astype(dtype))
        lengths = np.array([80, 41, 0])
        if not backend.clusters:
            with pytest.raises(ValueError, match="compute capability 9.0"):
                cuda_engine.forward_backward(backend, lat, X.copy(), lengths, cluster=2)
            return
        saved = cuda_engine.MODES, cuda_engine.ARC_TABLES
        try:
            cuda_engine.MODES, cuda_engine.ARC_TABLES = (0,), (False,)
            ref = [a.get() for a in cuda_engine.forward_backward(backend, lat, X.copy(), lengths, block_size=64)]
            for table in (True, False):
                cuda_engine.ARC_TABLES = (table,)
                for K in (2, 4, 8):
                    got = cuda_engine.forward_backward(backend, lat, X.copy(), lengths, block_size=64, cluster=K)
                    assert np.array_equal(got[0].get(), ref[0]) and np.array_equal(got[1].get(), ref[1]), (K, table)
        finally:
            cuda_engine.MODES, cuda_engine.ARC_TABLES = saved
        ll, post = forward_backward_numpy(lat, X.get().astype(np.float64), lengths)
        tol = 1e-9 if dtype == np.float64 else 2e-4
        np.testing.assert_allclose(ref[0], ll, rtol=tol, atol=tol)
        np.testing.assert_allclose(ref[1], post, rtol=tol, atol=tol)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_shared_graph_kernels_match_numpy_and_lattice_kernels(self, dtype):
        import cupy

        from chainfb.engines.cuda import forward_backward as lattice_cuda
        from chainfb.engines.cuda_shared import forward_backward as shared_cuda
        from chainfb.testing import denominator_like_fst

        rng = np.random.default_rng(6)
        f = denominator_like_fst(rng, num_states=400, num_arcs=5000, num_pdfs=60)
        N, T = 6, 40
        lat = Lattice.of(FstBatch([f], np.zeros(N, dtype=np.int64)))
        X = rng.normal(scale=2.0, size=(T, lat.num_columns))
        lengths = np.array([40, 39, 1, 0, 20, 40])
        init = rng.random(f.num_states)
        leaky = (0.1, np.tile(np.log(init / init.sum()), N))
        ll_ref, post_ref = forward_backward_numpy(lat, X.copy(), lengths, leaky=leaky)
        Xd, Ld = cupy.asarray(X, dtype=dtype), cupy.asarray(lengths)
        ll, post = shared_cuda(cupy_backend(), lat, Xd.copy(), Ld, leaky=leaky)
        llk, postk = lattice_cuda(cupy_backend(), lat, Xd.copy(), Ld, leaky=leaky)
        assert cupy.array_equal(ll, llk) and cupy.array_equal(post, postk)  # the same arithmetic
        tol = 1e-10 if dtype == np.float64 else 2e-4
        np.testing.assert_allclose(ll.get(), ll_ref, rtol=tol)
        np.testing.assert_allclose(post.get(), post_ref, atol=tol)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
    def test_transducer_kernels_match_twins(self, dtype):
        from chainfb.cuda.transducer_maps import transducer_gather, transducer_grad

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
        sym = symbol_table(targets, U_len, U1, V - 1, [V - 2, V - 3])
        kw = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len)
        logits_cpu = torch.randn(B, T, U1, V, dtype=torch.float32).to(dtype)
        logits = logits_cpu.cuda()
        X, lse = transducer_gather(cupy_backend(), logits, num_rows=rows, num_columns=C, zero_col=zero_col, **kw)
        Xt, lset = twins.transducer_gather(logits_cpu, num_rows=rows, num_columns=C, zero_col=zero_col, **kw)
        tol = 1e-12 if dtype == torch.float64 else 2e-6
        np.testing.assert_allclose(X.get(), Xt, rtol=tol, atol=tol)
        np.testing.assert_allclose(lse.get(), lset, rtol=tol, atol=tol)
        post = rng.random((rows, C))
        for fastemit, clamp in ((0.0, -1.0), (0.2, 0.03)):
            w = np.array([1.0, 1.0 + fastemit, 1.0, 1.0])  # FastEmit weighs the label kind
            g = transducer_grad(cupy_backend(), logits, post=post, lse=lse, scale=np.full(B, 0.5), kind_weight=w,
                                clamp=clamp, **kw)
            gt = twins.transducer_grad(logits_cpu, post=post, lse=lset, scale=np.full(B, 0.5), kind_weight=w,
                                       clamp=clamp, **kw)
            assert g.dtype == dtype and g.is_cuda
            rt = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5, torch.float64: 1e-12}[dtype]
            np.testing.assert_allclose(g.cpu().double().numpy(), gt.double().numpy(), rtol=rt, atol=rt)

    def test_cupy_view_zero_copy_on_torch_stream(self):
        import cupy

        from chainfb.cuda import cupy_view, torch_stream

        s = torch.cuda.Stream()
        before = cupy.cuda.get_current_stream().ptr, cupy.cuda.get_allocator()
        with torch.cuda.stream(s):
            t = torch.arange(6.0, device="cuda")
            a = cupy_view(t)  # a view changes no CuPy state
            assert a.data.ptr == t.data_ptr()
            assert (cupy.cuda.get_current_stream().ptr, cupy.cuda.get_allocator()) == before
            with torch_stream(t.device.index):
                assert cupy.cuda.get_current_stream().ptr == s.cuda_stream
                a *= 2
            assert (cupy.cuda.get_current_stream().ptr, cupy.cuda.get_allocator()) == before
        s.synchronize()
        assert torch.equal(t.cpu(), torch.arange(6.0) * 2)
        b = cupy_view(torch.ones(3, device="cuda", dtype=torch.bfloat16))
        assert b.dtype == np.int16 and int(b[0]) == 0x3F80

    def test_cupy_view_wraps_directly_inside_torch_stream(self):
        """Inside torch_stream a view is made over the tensor's memory (no DLPack), for every layout torch makes,
        writable through, keeping the tensor alive; torch's stream handle, its allocator's blocks."""
        import cupy

        import chainfb.cuda.interop as interop

        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            assert interop.current_torch_stream(0) == s.cuda_stream == torch.cuda.current_stream().cuda_stream
            base = torch.arange(4 * 6 * 5, dtype=torch.float32, device="cuda").reshape(4, 6, 5)
            with interop.torch_stream(0):
                calls = []
                real = cupy.from_dlpack
                cupy.from_dlpack = lambda t: calls.append(t) or real(t)
                try:
                    for t in (base, base.transpose(0, 2), base[1:3, 2:, 1:4], base[::2, ::3, ::2],
                              base[:1, :1].expand(3, 6, 5), base.to(torch.int16)[:, 1], base[:0]):
                        a = interop.cupy_view(t)
                        np.testing.assert_array_equal(cupy.asnumpy(a), t.cpu().numpy())
                        assert a.data.ptr == t.data_ptr() or t.numel() == 0
                finally:
                    cupy.from_dlpack = real
                assert len(calls) == 1  # the empty tensor only
                view = interop.cupy_view(base[1])
                del base
                view *= 2  # the tensor's memory, kept alive by the view
                used = torch.cuda.memory_allocated()
                block = cupy.empty(1 << 20, dtype=cupy.uint8)  # from torch's caching allocator
                assert torch.cuda.memory_allocated() >= used + (1 << 20)
                del block
                assert torch.cuda.memory_allocated() == used
            s.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(view), 2 * np.arange(30, 60, dtype=np.float32).reshape(6, 5))

    def test_chain_loss_on_a_side_stream_leaves_cupy_state(self):
        """ChainLoss on CUDA tensors under a non-default torch stream: the
        numbers of the CPU path, and CuPy's current stream and allocator as
        the caller set them (a stream and pool of its own)."""
        import cupy

        from chainfb import ChainLoss
        from chainfb.testing import denominator_like_fst, numerator_like_fst

        rng = np.random.default_rng(7)
        den = denominator_like_fst(rng, num_states=50, num_arcs=400, num_pdfs=12)
        nums = [numerator_like_fst(rng, num_phones=3, num_pdfs=12) for _ in range(3)]
        y = torch.from_numpy(rng.normal(size=(3, 30, 12)))
        ref = ChainLoss(den)(y.clone().requires_grad_(), nums)
        mine, pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
        side = torch.cuda.Stream()
        with mine, cupy.cuda.using_allocator(pool.malloc):
            with torch.cuda.stream(side):
                yc = y.cuda().requires_grad_()
                loss = ChainLoss(den)(yc, nums)
                loss.backward()
            assert cupy.cuda.get_current_stream().ptr == mine.ptr
            assert cupy.cuda.get_allocator() == pool.malloc
        side.synchronize()
        np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-10)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_rnnt_kernels_and_engine_match_direct_recursion(self, dtype):
        import cupy

        from chainfb.cuda.transducer_maps import transducer_gather, transducer_grad
        from chainfb.engines.cuda import forward_backward as forward_backward_cuda

        rng = np.random.default_rng(5)
        logits_np, lat, args, rows, T_len, U_len, ref_args = rnnt_step_case(rng)
        logits = torch.tensor(logits_np, dtype=dtype, device="cuda")
        X, lse = transducer_gather(cupy_backend(), logits, num_rows=rows, num_columns=lat.num_columns, **args)
        ll, post = forward_backward_cuda(cupy_backend(), lat, X, cupy.asarray(T_len + U_len))
        grad = transducer_grad(cupy_backend(), logits, post=post, lse=lse, scale=1.0, kind_weight=[1.0, 1.0], **args)
        lt = torch.tensor(logits_np, requires_grad=True)
        ref = rnnt_reference(lt, T_len=T_len, U_len=U_len, **ref_args)
        ref.sum().backward()
        tol = 1e-10 if dtype == torch.float64 else 1e-4
        np.testing.assert_allclose(-ll.get(), ref.detach().numpy(), rtol=tol)
        np.testing.assert_allclose(grad.cpu().double().numpy(), lt.grad.numpy(), atol=tol)

    @pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (2, 1, 0)])
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_pdf_map_kernels_give_the_numpy_values(self, order, dtype):
        """The pdf score map's kernels (pdf_map.cu) on the device, on strided layouts of the output: the compact
        scores (clipped) and the scattered, per-sequence scaled gradient are the NumPy path's numbers to the bit
        (NaN payloads aside: the device's arithmetic gives its own NaN)."""
        import cupy

        from test_cuda_emulated_pdf_map import _copy, _layout, _map

        def same(got, want):
            got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
            nan = np.isnan(want)
            np.testing.assert_array_equal(np.isnan(got), nan)
            np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))

        def on_device(view):  # the same layout (and padding) in device memory
            base = cupy.asarray(view.base)
            return cupy.transpose(base[..., :base.shape[-1] - 2], tuple(int(i) for i in np.argsort(order)))

        rng = np.random.default_rng(4)
        scores = _layout(rng, 3, 40, 50, order, dtype)
        smap = _map(rng, 3, 50)
        X = smap.gather(cupy, on_device(scores), dtype=dtype, clip=(-30.0, 30.0))
        same(X.get(), smap.gather(np, scores, dtype=dtype, clip=(-30.0, 30.0)))
        target = _layout(rng, 3, 40, 50, order, dtype, special=False)
        post = rng.normal(size=X.shape).astype(dtype)
        scale = np.array([0.5, -2.0, 3.0], dtype=dtype)
        want = _copy(target, order)
        smap.scatter_add(np, want, post.copy(), 0.25, accumulate=True, seq_scale=scale)
        got = on_device(target)
        smap.scatter_add(cupy, got, cupy.asarray(post), 0.25, accumulate=True, seq_scale=cupy.asarray(scale))
        same(got.get(), want)

    def test_transducer_symbol_table_is_copied_from_the_host(self):
        """CUDA targets the loss has read to the host: the symbol table built there, on the device, int32, equal
        to the one built on the device."""
        from chainfb.transducer import TransducerCriterion
        from chainfb.transducer.criterion import host_symbols

        tg = torch.tensor([[3, 1, 2, 0], [2, 0, 0, 0]], device="cuda")
        crit = TransducerCriterion((2, 5, 4, 7), tg, np.array([5, 4]), np.array([3, 1]), 6,
                                   host_targets=tg.cpu().numpy())
        assert crit.sym.is_cuda and crit.sym.dtype == torch.int32
        np.testing.assert_array_equal(crit.sym.cpu().numpy(), host_symbols(tg.cpu().numpy(), np.array([3, 1]), 4, 6))
        assert torch.equal(crit.sym, symbol_table(tg, torch.tensor([3, 1], device="cuda"), 4, 6))
