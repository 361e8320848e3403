"""The engines through their public entry points, against path enumeration
and an independent loop reference.  One implementation of each test; thin
subclasses run it per device (CUDA ones skip without a GPU), and on each
device once per engine that the capability table lists for it
(``chainfb.engines.engines_with``, through the ``pinned_engine`` fixture and
the ``engines`` mark: ``one_graph=True`` where every lattice of the body is
one shared graph, so the shared-graph-only engines run it too;
``viterbi=True`` for best paths)."""

import math

import numpy as np
import pytest
import torch

import chainfb
from chainfb import Fst, FstBatch, forward_backward, fst_loglike
from chainfb.testing import random_fst

from devices import OnCPU, OnCUDA, OnEmulatedKernels
from oracles.fst import brute_force, brute_force_best, reference_forward_backward


def _graphs(seed, n=4):
    rng = np.random.default_rng(seed)
    return [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=6, num_finals=2) for _ in range(n)], rng


@pytest.mark.usefixtures("pinned_engine")
class EngineTests:
    """The engines through the public API; the device comes from the
    subclass, the engine from the ``pinned_engine`` parameter."""

    def run(self, fsts, scores, lengths=None):
        ll, post = forward_backward(fsts, self.tensor(scores), lengths)
        return ll.cpu().numpy(), post.cpu().numpy()

    # -- exhaustive path enumeration -------------------------------------
    @pytest.mark.parametrize("seed", range(12))
    def test_against_path_enumeration(self, seed):
        rng = np.random.default_rng(seed)
        fsts = [
            random_fst(rng, num_states=int(rng.integers(2, 6)), num_arcs=int(rng.integers(3, 10)),
                       num_pdfs=4, num_finals=int(rng.integers(1, 3)))
            for _ in range(4)
        ]
        T = 5
        scores = rng.normal(scale=2.0, size=(4, T, 4))
        lengths = np.array([5, 3, 1, 4])
        ll, post = self.run(fsts, scores, lengths)
        for n, f in enumerate(fsts):
            Z, g = brute_force(f, scores[n], lengths[n])
            if Z == -math.inf:
                assert ll[n] == -math.inf
                assert not post[n].any()
            else:
                np.testing.assert_allclose(ll[n], Z, rtol=1e-12)
                np.testing.assert_allclose(post[n], g, atol=1e-12)

    @pytest.mark.engines(one_graph=True)
    def test_features_of_real_graphs(self):
        # self-loops, two finals, an unreachable state (4), a dead end (3),
        # one pdf on many arcs, start state 2
        arcs = [(2, 2, 0, -0.1), (2, 0, 1, -1.0), (0, 0, 1, -0.3), (0, 1, 0, -0.2),
                (1, 1, 1, -0.4), (0, 3, 2, 0.0), (4, 1, 0, 0.0), (1, 0, 0, -2.0)]
        f = Fst.from_arcs(arcs, {1: 0.0, 0: -1.0}, start=2)
        rng = np.random.default_rng(0)
        scores = rng.normal(size=(1, 6, 3))
        ll, post = self.run(f, scores)
        Z, g = brute_force(f, scores[0])
        assert abs(ll[0] - Z) < 1e-9
        np.testing.assert_allclose(post[0], g, atol=1e-9)

    # -- independent reference on larger graphs ---------------------------
    def test_against_loop_reference(self):
        rng = np.random.default_rng(7)
        fsts = [random_fst(rng, num_states=12, num_arcs=40, num_pdfs=10, num_finals=3) for _ in range(3)]
        T = 30
        scores = rng.normal(size=(3, T, 10))
        lengths = np.array([30, 17, 25])
        ll, post = self.run(fsts, scores, lengths)
        for n, f in enumerate(fsts):
            Z, g = reference_forward_backward(f, scores[n], lengths[n])
            assert ll[n] == pytest.approx(Z, abs=1e-9) if Z > -math.inf else ll[n] == -math.inf
            np.testing.assert_allclose(post[n], g, atol=1e-9)

    @pytest.mark.engines(one_graph=True)  # and several graphs: those run where auto puts them, for comparison
    def test_shared_graph_and_batch(self):
        rng = np.random.default_rng(3)
        f = random_fst(rng, num_states=6, num_arcs=15, num_pdfs=5)
        g = random_fst(rng, num_states=6, num_arcs=15, num_pdfs=5)
        scores = rng.normal(size=(5, 8, 5))
        ll_shared, post_shared = self.run(f, scores)
        ll_list, post_list = self.run([f] * 5, scores)
        np.testing.assert_allclose(ll_shared, ll_list, atol=1e-12)
        np.testing.assert_allclose(post_shared, post_list, atol=1e-12)
        b = FstBatch([f, g], seq_to_graph=[1, 0, 1, 1, 0])
        ll_b, post_b = self.run(b, scores)
        ll_l, post_l = self.run([g, f, g, g, f], scores)
        np.testing.assert_allclose(ll_b, ll_l, atol=1e-12)
        np.testing.assert_allclose(post_b, post_l, atol=1e-12)

    @pytest.mark.engines(one_graph=True)
    def test_posteriors_sum_to_one_per_frame(self):
        rng = np.random.default_rng(4)
        f = random_fst(rng, num_states=8, num_arcs=30, num_pdfs=6)
        f = Fst.from_arcs(f.arcs() + [(s, s, 0, 0.0) for s in range(8)], {s: 0.0 for s in range(8)})
        scores = rng.normal(size=(3, 12, 6))
        lengths = np.array([12, 5, 1])
        ll, post = self.run(f, scores, lengths)
        sums = post.sum(-1)
        for n, L in enumerate(lengths):
            np.testing.assert_allclose(sums[n, :L], 1.0, atol=1e-10)
            assert not sums[n, L:].any()

    # -- edge cases ----------------------------------------------------------
    @pytest.mark.engines(one_graph=True)
    def test_length_zero_and_one(self):
        f = Fst.from_arcs([(0, 1, 0, -0.5), (1, 1, 1, 0.0)], {0: -2.0, 1: 0.0})
        scores = np.array([[[1.0, 2.0], [3.0, 4.0]]] * 2)
        ll, post = self.run(f, scores, [0, 1])
        assert ll[0] == pytest.approx(-2.0)
        assert not post[0].any()
        assert ll[1] == pytest.approx(-0.5 + 1.0)
        np.testing.assert_allclose(post[1], [[1, 0], [0, 0]])

    def test_impossible_sequences_are_minus_inf_with_zero_posteriors(self):
        # needs at least 3 frames; a dead-end graph; an all-(-inf) graph
        chain = Fst.from_arcs([(0, 1, 0, 0.0), (1, 2, 1, 0.0), (2, 3, 0, 0.0)], {3: 0.0})
        dead = Fst.from_arcs([(0, 1, 0, 0.0), (1, 1, 0, 0.0)], {2: 0.0}, num_states=3)
        never = Fst.from_openfst_text("0 1 1 Infinity\n1\n")
        scores = np.random.default_rng(0).normal(size=(3, 2, 2))
        ll, post = self.run([chain, dead, never], scores)
        assert np.all(ll == -np.inf)
        assert not post.any() and not np.isnan(post).any()
        s = self.tensor(scores).requires_grad_()
        out = fst_loglike(s, [chain, dead, never])
        out.sum().backward()
        assert torch.all(s.grad == 0)

    @pytest.mark.engines(one_graph=True, wide_scores=True)
    def test_long_numerator_graph_posterior_sums(self):
        """The bound docs/usage.md states: on a 50-phone numerator graph, T = 20,000
        frames of scores in [-1e4, 1e4], every frame's posteriors sum to 1 within
        1e-8 (the error is about 2**-52 times the log-score gap between the
        states alive at a frame; measured worst 9.3e-10)."""
        from chainfb.testing import numerator_like_fst

        rng = np.random.default_rng(5)
        f = numerator_like_fst(rng, num_phones=50, num_pdfs=200)
        ll, post = self.run(f, rng.uniform(-1e4, 1e4, size=(1, 20000, 200)))
        assert np.isfinite(ll).all()
        np.testing.assert_allclose(post[0].sum(-1), 1.0, atol=1e-8)

    @pytest.mark.engines(one_graph=True, wide_scores=True)
    def test_long_input_extreme_scores(self):
        rng = np.random.default_rng(5)
        f = Fst.from_arcs([(0, 0, 0, -0.1), (0, 1, 1, -2.0), (1, 1, 2, -0.05), (1, 0, 0, -3.0)], {1: 0.0})
        T = 20000
        scores = rng.uniform(-1e4, 1e4, size=(1, T, 3))
        ll, post = self.run(f, scores)
        assert np.isfinite(ll).all()
        np.testing.assert_allclose(post[0].sum(-1), 1.0, atol=1e-10)
        Z, g = reference_forward_backward(f, scores[0])
        assert ll[0] == pytest.approx(Z, rel=1e-12)
        # the plain reference divides by a total of magnitude 1e8, so its
        # posteriors carry a common relative error ~1e-5 per frame; compare
        # shapes per frame (the engine's own per-frame sums are checked above)
        np.testing.assert_allclose(post[0], g / g.sum(-1, keepdims=True), atol=1e-9)

    @pytest.mark.engines(one_graph=True)
    def test_dtypes_and_array_types(self):
        rng = np.random.default_rng(6)
        f = random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4)
        s64 = rng.normal(size=(2, 7, 4))
        ll64, p64 = forward_backward(f, self.tensor(s64))
        ll32, p32 = forward_backward(f, self.tensor(s64.astype(np.float32)))
        assert ll64.dtype == torch.float64 and p64.dtype == torch.float64
        assert ll32.dtype == torch.float32 and p32.dtype == torch.float32
        np.testing.assert_allclose(ll32.cpu().numpy(), ll64.cpu().numpy(), rtol=1e-5)
        np.testing.assert_allclose(p32.cpu().numpy(), p64.cpu().numpy(), atol=1e-5)

    @pytest.mark.engines(one_graph=True)
    def test_strided_scores(self):
        rng = np.random.default_rng(8)
        f = random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4)
        big = rng.normal(size=(9, 3, 6))  # [T, N, wide]; view as [N, T, 4]
        view = self.tensor(big)[:, :, 1:5].transpose(0, 1)
        ll, post = forward_backward(f, view)
        ll2, post2 = forward_backward(f, view.contiguous())
        torch.testing.assert_close(ll, ll2)
        torch.testing.assert_close(post, post2)

    def test_gradcheck(self):
        rng = np.random.default_rng(9)
        fsts = [random_fst(rng, num_states=4, num_arcs=9, num_pdfs=3) for _ in range(2)]
        fsts.append(Fst.from_arcs([(0, 1, 0, 0.0)], {1: 0.0}))  # possible only with length 1
        s = self.tensor(rng.normal(size=(3, 4, 3))).requires_grad_()
        lengths = torch.tensor([4, 3, 1])
        assert torch.autograd.gradcheck(lambda x: fst_loglike(x, fsts, lengths), (s,))
        loss = chainfb.NumeratorLoss(reduction="frame")
        assert torch.autograd.gradcheck(lambda x: loss(x, fsts, lengths), (s,))

    # -- bad input -------------------------------------------------------------
    @pytest.mark.engines(runs=False)  # every call stops at the argument checks
    def test_bad_inputs(self):
        f = Fst.from_arcs([(0, 1, 2, 0.0)], {1: 0.0})
        good = self.tensor(np.zeros((2, 3, 4)))
        with pytest.raises(ValueError, match="scores: expected a 3-D"):
            forward_backward(f, good[0])
        with pytest.raises(ValueError, match="only P=2 columns"):
            forward_backward(f, good[..., :2])
        with pytest.raises(TypeError, match="scores: expected dtype"):
            forward_backward(f, good.to(torch.int32))
        with pytest.raises(TypeError, match="scores"):
            forward_backward(f, [[[0.0]]])
        with pytest.raises(ValueError, match="lengths: every length must lie in"):
            forward_backward(f, good, [1, 4])
        with pytest.raises(ValueError, match="lengths: every length must lie in"):
            forward_backward(f, good, [-1, 2])
        with pytest.raises(ValueError, match=r"lengths: expected shape \(2,\)"):
            forward_backward(f, good, [1, 2, 3])
        with pytest.raises(TypeError, match="lengths: expected integer"):
            forward_backward(f, good, [1.0, 2.0])
        with pytest.raises(ValueError, match="fsts: the batch has 3 sequences"):
            forward_backward([f, f, f], good)
        with pytest.raises(TypeError, match="fsts: expected an Fst"):
            forward_backward("graph", good)
        with pytest.raises(TypeError, match="scores: expected a torch.Tensor"):
            fst_loglike(np.zeros((2, 3, 4)), f)
        with pytest.raises(ValueError, match="reduction"):
            chainfb.NumeratorLoss(reduction="avg")

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
        scores = self.tensor(rng.normal(size=(2, 4, 6)), torch.float64).requires_grad_(True)
        lengths = [4, 3]
        assert torch.autograd.gradcheck(lambda s: chainfb.fst_loglike(s, fsts, lengths), (scores,))

    @pytest.mark.engines(one_graph=True)
    def test_fst_loglike_impossible_gives_zero_grad(self):
        f = chainfb.Fst.from_arcs([(0, 1, 0, 0.0)], {1: 0.0}, num_states=2)  # exactly one frame
        scores = self.tensor(np.zeros((1, 3, 2)), torch.float64).requires_grad_(True)
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
        deriv = self.tensor(np.zeros((T * N, P)), torch.float64)
        comp = chainfb.GenericNumeratorComputation(sup, self.tensor(out, torch.float64))
        ok, tot = comp.forward_backward(deriv)
        assert ok == ok_ref
        np.testing.assert_allclose(tot, tot_ref, rtol=1e-10)
        np.testing.assert_allclose(deriv.cpu().numpy(), ref_deriv, atol=1e-10)
        np.testing.assert_allclose(comp.compute_objf(), tot_ref, rtol=1e-10)

    # -- best path (Viterbi) -------------------------------------------------
    @pytest.mark.engines(viterbi=True)
    @pytest.mark.parametrize("seed", range(8))
    def test_best_path_against_enumeration(self, seed):
        rng = np.random.default_rng(seed)
        fsts = [random_fst(rng, num_states=4, num_arcs=8, num_pdfs=3, num_finals=2) for _ in range(3)]
        scores = rng.normal(scale=2.0, size=(3, 4, 3))
        lengths = np.array([4, 2, 0])
        score, paths = chainfb.best_path(fsts, self.tensor(scores), lengths)
        for n, f in enumerate(fsts):
            best, _ = brute_force_best(f, scores[n], lengths[n])
            if best == -math.inf:
                assert score[n] == -math.inf and len(paths[n]) == 0
                continue
            assert score[n] == pytest.approx(best, abs=1e-12)
            # the returned path is a real path of that score
            p = paths[n]
            assert len(p) == lengths[n]
            s, v = f.start, 0.0
            for t, a in enumerate(p):
                assert f.src[a] == s
                v += f.log_prob[a] + scores[n, t, f.pdf[a]]
                s = f.dst[a]
            assert v + f.final[s] == pytest.approx(best, abs=1e-12)

    @pytest.mark.engines(one_graph=True, viterbi=True)
    def test_best_path_shared_graph_matches_single(self):
        rng = np.random.default_rng(3)
        f = random_fst(rng, num_states=6, num_arcs=18, num_pdfs=4)
        scores = rng.normal(size=(5, 7, 4))
        lengths = np.array([7, 3, 5, 1, 6])
        score, paths = chainfb.best_path(f, self.tensor(scores), lengths)
        for n in range(5):
            s1, p1 = chainfb.best_path(f, self.tensor(scores[n:n + 1]), lengths[n:n + 1])
            assert score[n] == s1[0]
            np.testing.assert_array_equal(paths[n], p1[0])


class TestEngineCPU(EngineTests, OnCPU):
    pass


class TestEngineCUDA(EngineTests, OnCUDA):
    pass


class TestEngineEmulated(EngineTests, OnEmulatedKernels):
    """The same bodies through the CUDA kernels' CPU emulation."""

    @pytest.mark.engines(one_graph=True, wide_scores=True)  # as the two bodies it runs
    @pytest.mark.parametrize("math", ["ulp2_up", "ulp2_random"])
    @pytest.mark.parametrize("case", ["test_long_numerator_graph_posterior_sums", "test_long_input_extreme_scores"])
    def test_long_inputs_with_inexact_exp_and_log(self, monkeypatch, math, case):
        """The two long-input bounds hold when every exp and log errs by up to
        2 ulp, biased one way or at random (a device's double exp and log are
        within 1-2 ulp where the host's libm is within 0.5)."""
        monkeypatch.setenv("CHAINFB_EMULATE_MATH", math)
        getattr(self, case)()


def test_numpy_input_gives_numpy_output():
    f = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], {1: 0.0})
    ll, post = forward_backward(f, np.zeros((1, 3, 2), dtype=np.float32))
    assert isinstance(ll, np.ndarray) and isinstance(post, np.ndarray)
    assert ll.dtype == np.float32 and post.dtype == np.float32
    assert ll[0] == pytest.approx(math.log(3))


def test_forward_only():
    f = Fst.from_arcs([(0, 0, 0, 0.0), (0, 1, 1, 0.0), (1, 1, 1, 0.0)], {1: 0.0})
    ll, post = forward_backward(f, np.zeros((1, 3, 2)), need_posteriors=False)
    assert post is None and ll[0] == pytest.approx(math.log(3))


def test_threaded_split_matches_serial(monkeypatch):
    from chainfb.engines import numpy_log as engine
    from chainfb.engines import threads
    from chainfb.lattice import Lattice
    from chainfb.score_map import PdfScoreMap

    rng = np.random.default_rng(11)
    fsts = [random_fst(rng, num_states=6, num_arcs=15, num_pdfs=5) for _ in range(3)]
    batch = FstBatch(fsts, seq_to_graph=[0, 1, 2, 2, 1, 0, 0])
    lat = Lattice.of(batch)
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, rng.normal(size=(7, 9, 5)))
    lengths = np.array([9, 3, 0, 9, 5, 1, 8])
    log_init = np.log(rng.dirichlet(np.ones(lat.num_states)))
    for leaky in (None, (0.1, log_init)):
        serial = engine._forward_backward_serial(lat, X.copy(), lengths, True, leaky)
        monkeypatch.setitem(threads.MIN_PARALLEL_WORK, "numpy", 0)
        monkeypatch.setattr(threads, "_num_threads", 3)
        threaded = engine.forward_backward(lat, X.copy(), lengths, leaky, True)
        assert len(lat.parts(threads.split(np.diff(lat.arc_offsets) + 1.0, 3, 0, parts_per_thread=1))) == 3
        # equal up to the last bit NumPy's vectorised exp may flip at a different array position
        np.testing.assert_allclose(serial[0], threaded[0], rtol=1e-14)
        np.testing.assert_allclose(serial[1], threaded[1], rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="n: expected a positive"):
        chainfb.engines.set_num_threads(0)


def test_lattice_builds_instance_arcs_on_demand():
    """A lattice costs O(sequences + columns) until an engine asks for its
    per-instance arcs; their CSR pointers, segments and columns are those
    the sorted arcs define."""
    from chainfb.lattice import Lattice

    rng = np.random.default_rng(12)
    fsts = [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=6) for _ in range(3)]
    batch = FstBatch(fsts, seq_to_graph=[2, 0, 2, 1, 1])
    lat = Lattice(batch)
    assert not {"fwd", "bwd", "final", "seq_of_state"} & set(lat.__dict__)
    assert lat.num_arcs == sum(fsts[g].num_arcs for g in batch.seq_to_graph)
    np.testing.assert_array_equal(lat.col_offsets, np.searchsorted(lat.col_seq, np.arange(6)))
    for side, key in ((lat.fwd, "dst"), (lat.bwd, "src")):
        keys = getattr(side, key)
        assert (np.diff(keys) >= 0).all()
        np.testing.assert_array_equal(side.ptr, np.searchsorted(keys, np.arange(lat.num_states + 1)))
        np.testing.assert_array_equal(side.key_states, np.unique(keys))
        np.testing.assert_array_equal(side.seg_starts, np.searchsorted(keys, np.unique(keys)))
        np.testing.assert_array_equal(lat.col_seq[side.col], side.seq)
        np.testing.assert_array_equal(lat.col_pdf[side.col], batch.pdf[side.arc])
    np.testing.assert_array_equal(np.diff(lat.arc_offsets), np.bincount(lat.fwd.seq, minlength=5))
    assert lat.shared_fst is None
    with pytest.raises(ValueError, match="one graph"):
        lat.graph_lattice()


def test_batch_with_sequences_shares_graphs():
    """Another sequence-to-graph map over the same packed graphs shares the
    arrays and the per-graph cache; its lattice is that of a new batch."""
    from chainfb.lattice import Lattice

    rng = np.random.default_rng(13)
    fsts = [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=6) for _ in range(2)]
    base = FstBatch(fsts)
    derived = base.with_sequences([1, 1, 1])
    key = ("test", "memo")
    assert derived.src is base.src and derived.cache(key, object) is base.cache(key, object)  # the graphs' memo
    assert derived.cache(key, object, per_batch=True) is not base.cache(key, object, per_batch=True)
    a, b = Lattice(derived), Lattice(FstBatch(fsts, [1, 1, 1]))
    assert a.shared_fst is fsts[1] and a.graph == 1
    for k in ("state_offsets", "start", "col_seq", "col_pdf", "final"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    for k in ("arc", "src", "dst", "col", "ptr"):
        np.testing.assert_array_equal(getattr(a.fwd, k), getattr(b.fwd, k))
    g = a.graph_lattice()
    assert g is Lattice(base.with_sequences([1, 1])).graph_lattice() and g.num_sequences == 1
    assert g.num_states == fsts[1].num_states
    # a graph-local per-state vector is the lattice's [S] repeated per sequence
    v = rng.normal(size=fsts[1].num_states)
    np.testing.assert_array_equal(a.state_values(v), np.tile(v, 3))
    with pytest.raises(ValueError, match="log_init"):
        a.state_values(np.zeros(4))
    with pytest.raises(ValueError, match="seq_to_graph"):
        base.with_sequences([0, 2])

