"""CTC compiled into the engine: chainfb.ctc_loss against
torch.nn.functional.ctc_loss, against alignment enumeration, gradcheck, the
graph's structure, bad inputs; per device (CPU, CUDA, emulated kernels)."""

import itertools
import math
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
import pytest
import torch
import torch.nn.functional as F

import chainfb
import chainfb.ctc as ctc_module
import chainfb.engines.cuda as cuda_engine
import chainfb.engines.numba_log.arrays as numba_arrays
from tests.cycles import cyclic_garbage
from tests.devices import OnCPU, OnCPUNumPy, OnCUDA, OnEmulatedKernels
from tests.oracles.ctc import ctc_fst
from tests.oracles.fst import brute_force


def alignment_enumeration(lp: np.ndarray, labels, blank: int) -> float:
    """log p(labels | lp [T, C]) by summing over every frame labelling that
    collapses (merge repeats, drop blanks) to ``labels``."""
    T, C = lp.shape
    total = -math.inf
    for path in itertools.product(range(C), repeat=T):
        out, prev = [], None
        for c in path:
            if c != prev and c != blank:
                out.append(c)
            prev = c
        if out == list(labels):
            total = np.logaddexp(total, sum(lp[t, c] for t, c in enumerate(path)))
    return total


def batch(rng, T=9, N=5, C=6, blank=0):
    """Logits [T, N, C] and padded targets with a repeated label, an
    impossible pair (too few frames), a zero-length input and a zero-length
    target."""
    logits = torch.from_numpy(rng.normal(size=(T, N, C)))
    labels = [c for c in range(C) if c != blank]
    tg = torch.from_numpy(rng.choice(labels, size=(N, 4))).long()
    tg[0, 1] = tg[0, 2]  # a repeat: needs a blank between
    il = torch.tensor([T, T - 2, 3, 0, 5][:N])
    tl = torch.tensor([4, 3, 3, 0, 0][:N])
    tg[2, :3] = tg[2, 0]  # three equal labels in 3 frames: impossible
    return logits, tg, il, tl


class CtcTests:
    def compare(self, logits, tg, il, tl, blank=0, reduction="none", zero_infinity=False, dtype=torch.float64,
                concatenated=False, rtol=1e-9):
        x = logits.to(dtype)
        if concatenated:
            tg = torch.cat([tg[n, : tl[n]] for n in range(len(tl))])
        ref = F.ctc_loss(x.log_softmax(-1), tg, il, tl, blank=blank, reduction=reduction,
                         zero_infinity=zero_infinity)
        xd = self.tensor(x.clone()).requires_grad_()
        out = chainfb.ctc_loss(xd.log_softmax(-1), self.tensor(tg), self.tensor(il), self.tensor(tl), blank=blank,
                               reduction=reduction, zero_infinity=zero_infinity)
        assert out.dtype == dtype and out.device.type == self.device and out.shape == ref.shape
        np.testing.assert_allclose(self.numpy(out), ref.numpy(), rtol=rtol)
        finite = torch.isfinite(ref) if ref.dim() else torch.tensor(bool(torch.isfinite(ref)))
        if bool(finite.all()):
            xr = x.clone().requires_grad_()
            g_ref, = torch.autograd.grad(F.ctc_loss(xr.log_softmax(-1), tg, il, tl, blank=blank, reduction=reduction,
                                                    zero_infinity=zero_infinity).sum(), xr)
            g, = torch.autograd.grad(out.sum(), xd)
            np.testing.assert_allclose(self.numpy(g), g_ref.numpy(), atol=1e-9 if dtype == torch.float64 else 2e-5)
        return out

    @pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
    @pytest.mark.parametrize("zero_infinity", [False, True])
    def test_against_torch(self, rng, reduction, zero_infinity):
        logits, tg, il, tl = batch(rng)
        out = self.compare(logits, tg, il, tl, reduction=reduction, zero_infinity=zero_infinity)
        if reduction == "none":
            assert (out[2] == 0) if zero_infinity else torch.isinf(out[2])  # the impossible pair
            assert out[4].item() != 0 and out[3].item() == 0  # T=5, U=0: all blanks; T=0, U=0: 0

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    @pytest.mark.parametrize("concatenated", [False, True])
    def test_dtypes_and_target_layouts(self, rng, dtype, concatenated):
        logits, tg, il, tl = batch(rng)
        self.compare(logits, tg, il, tl, reduction="mean", zero_infinity=True, dtype=dtype,
                     concatenated=concatenated, rtol=1e-9 if dtype == torch.float64 else 1e-5)

    @pytest.mark.parametrize("blank", [2, 5])
    def test_blank_not_zero(self, rng, blank):
        logits, tg, il, tl = batch(rng, blank=blank)
        self.compare(logits, tg, il, tl, blank=blank, reduction="sum", zero_infinity=True)

    def test_repeated_labels_need_a_blank(self):
        # "a a" needs at least 3 frames; "a b" 2
        logits = torch.zeros(2, 2, 3, dtype=torch.float64)
        out = chainfb.ctc_loss(self.tensor(logits.log_softmax(-1)), self.tensor(torch.tensor([[1, 1], [1, 2]])),
                               self.tensor(torch.tensor([2, 2])), self.tensor(torch.tensor([2, 2])),
                               reduction="none")
        assert torch.isinf(out[0]) and out[1].item() == pytest.approx(2 * math.log(3))

    def test_against_alignment_enumeration(self, rng):
        T, C = 4, 3
        lp = torch.from_numpy(rng.normal(size=(T, 3, C))).log_softmax(-1)
        tg = torch.tensor([[1, 2], [1, 1], [2, 0]])
        tl = torch.tensor([2, 2, 1])
        il = torch.tensor([4, 4, 3])
        out = chainfb.ctc_loss(self.tensor(lp), self.tensor(tg), self.tensor(il), self.tensor(tl), reduction="none")
        for n in range(3):
            ref = alignment_enumeration(lp[: il[n], n].numpy(), tg[n, : tl[n]].tolist(), 0)
            assert out[n].item() == pytest.approx(-ref, rel=1e-12)

    def test_gradcheck(self, rng):
        # the gradient w.r.t. free (unnormalised) log-probs is exact
        x = self.tensor(torch.from_numpy(rng.normal(size=(5, 2, 4)))).requires_grad_()
        tg, il, tl = self.tensor(torch.tensor([[1, 1], [2, 3]])), self.tensor(torch.tensor([5, 4])), \
            self.tensor(torch.tensor([2, 1]))
        assert torch.autograd.gradcheck(lambda z: chainfb.ctc_loss(z, tg, il, tl, reduction="mean"), (x,))

    def test_unbatched(self, rng):
        lp = torch.from_numpy(rng.normal(size=(6, 4))).log_softmax(-1)
        tg = torch.tensor([1, 3])
        ref = F.ctc_loss(lp, tg, torch.tensor(6), torch.tensor(2), reduction="mean")
        out = chainfb.ctc_loss(self.tensor(lp), self.tensor(tg), torch.tensor(6), torch.tensor(2), reduction="mean")
        assert out.shape == ref.shape and out.item() == pytest.approx(ref.item(), rel=1e-12)


    def test_each_sequence_gradient_times_its_incoming_gradient(self):
        """Backward scales each sequence's gradient by its incoming gradient, a non-finite one counting as 0
        (written once, in backward, from the scaled posteriors)."""
        g = torch.Generator().manual_seed(7)
        lp = torch.randn(9, 4, 30, generator=g, dtype=torch.float64).log_softmax(-1)
        targets, il, tl = torch.tensor([[1, 2], [3, 3], [4, 5], [6, 7]]), [9, 8, 9, 7], [2, 2, 2, 1]
        x = self.tensor(lp).requires_grad_()
        cost = chainfb.ctc_loss(x, self.tensor(targets), il, tl, reduction="none")
        (unit,) = torch.autograd.grad(cost.sum(), x)
        weights = self.tensor(torch.tensor([0.5, -2.0, float("inf"), float("nan")], dtype=torch.float64))
        (got,) = torch.autograd.grad((chainfb.ctc_loss(x, self.tensor(targets), il, tl, reduction="none")
                                      * weights).sum(), x)
        want = unit * self.tensor(torch.tensor([0.5, -2.0, 0.0, 0.0], dtype=torch.float64)).view(1, -1, 1)
        np.testing.assert_allclose(self.numpy(got), self.numpy(want), rtol=1e-12, atol=0)
        assert not got[:, 2:].any()

    @pytest.mark.parametrize("reduction, zero_infinity", [("none", False), ("mean", False), ("sum", True)])
    def test_targets_compiled_ahead(self, rng, reduction, zero_infinity, monkeypatch):
        """Labels compiled ahead (``CtcTargets``, handed over pickled as a DataLoader worker does) give the
        loss and the gradient of the same labels given as a tensor, bit for bit; the step compiles nothing and
        builds none of the engine's index arrays (they came with the object)."""
        logits, tg, il, tl = batch(rng, blank=2)
        x = self.tensor(logits).log_softmax(-1).detach()
        made = chainfb.CtcTargets(tg, tl, blank=2, device="cuda" if self.engine_device == "gpu" else "cpu")
        assert made.num_sequences == 5 and made.target_lengths.tolist() == tl.tolist() and made.blank == 2
        prepared = pickle.loads(pickle.dumps(made))
        outs = []
        for targets, lengths in ((self.tensor(tg), self.tensor(tl)), (prepared, None), (prepared, tl.tolist())):
            xd = x.clone().requires_grad_()
            out = chainfb.ctc_loss(xd, targets, self.tensor(il), lengths, blank=2, reduction=reduction,
                                   zero_infinity=zero_infinity)
            outs.append((out, torch.autograd.grad(out.sum(), xd)[0]))
            if targets is prepared:
                assert made.lattice.num_states == prepared.lattice.num_states
            else:  # from here on, a compile or an index array built in the step is an error
                def boom(*a, **k):
                    raise AssertionError("built in the step")

                monkeypatch.setattr(ctc_module, "_compile", boom)
                monkeypatch.setattr(cuda_engine, "_host_arrays", boom)
                monkeypatch.setattr(numba_arrays, "_lattice_arrays", boom)
        for out, grad in outs[1:]:
            assert torch.equal(out, outs[0][0]) and torch.equal(grad, outs[0][1])

    def test_same_labels_reuse_the_reduction_weights(self, rng, monkeypatch):
        """The reduced loss's per-sequence weights reach the loss's device once per label set and reduction (a
        GPU step with the labels of an earlier step copies nothing for them); the values follow the reduction."""
        logits, tg, il, tl = batch(rng)
        monkeypatch.setattr(ctc_module, "_compiled", type(ctc_module._compiled)(8))  # no lattice of other tests
        made = []
        real = chainfb.checks.values_like
        monkeypatch.setattr(chainfb.checks, "values_like", lambda *a: made.append(1) or real(*a))
        x = self.tensor(logits).log_softmax(-1)
        for reduction, copies in (("mean", 1), ("mean", 1), ("sum", 2), ("mean", 2), ("sum", 2)):
            out = chainfb.ctc_loss(x, self.tensor(tg), self.tensor(il), self.tensor(tl), reduction=reduction,
                                   zero_infinity=False)
            want = F.ctc_loss(logits.log_softmax(-1), tg, il, tl, reduction=reduction)
            assert len(made) == copies and out.item() == pytest.approx(want.item(), rel=1e-12)

    def test_targets_compiled_ahead_refuse_what_they_do_not_match(self, rng):
        logits, tg, il, tl = batch(rng)
        x = self.tensor(logits).log_softmax(-1)
        made = chainfb.CtcTargets(tg, tl)
        with pytest.raises(ValueError, match="^blank: 1 is not the blank"):
            chainfb.ctc_loss(x, made, self.tensor(il), None, blank=1)
        with pytest.raises(ValueError, match="^target_lengths: .* are not the lengths"):
            chainfb.ctc_loss(x, made, self.tensor(il), [4, 3, 3, 0, 1])
        with pytest.raises(ValueError, match="^targets: 5 sequences do not match log_probs' batch size 4"):
            chainfb.ctc_loss(x[:, :4], made, self.tensor(il[:4]), None)
        with pytest.raises(ValueError, match=r"^targets: label \d+ \(sequence 0\) is outside the vocabulary"):
            chainfb.ctc_loss(x[:, :, :3], chainfb.CtcTargets([[5, 1]] + [[1]] * 4), self.tensor(il), None)

    @pytest.mark.parametrize("N", [1, 3])  # one sequence: the shared-graph engines, with their graph's lattice
    def test_new_labels_leave_no_reference_cycle(self, N):
        """A step with labels not seen before compiles a graph, its lattice and the engine's arrays (on a
        GPU, device copies); once the compile cache drops them, reference counting frees them all."""
        g = torch.Generator().manual_seed(N)
        lp = torch.randn(6, N, 5, generator=g, dtype=torch.float64).log_softmax(-1)

        def step():
            x = self.tensor(lp).requires_grad_()
            chainfb.ctc_loss(x, self.tensor(torch.randint(1, 5, (N, 2), generator=g)), [6] * N, [2] * N).backward()

        step()
        assert cyclic_garbage(step, 12) == []  # more label sets than the compile cache keeps


class TestCtcCPU(CtcTests, OnCPU):
    pass


class TestCtcCPUNumPy(CtcTests, OnCPUNumPy):
    pass


class TestCtcCUDA(CtcTests, OnCUDA):
    @pytest.mark.parametrize("lengths", ["tensors", "lists"])
    def test_host_labels_never_synchronise(self, rng, lengths):
        """Labels and lengths on the host (as a data loader gives them): a step -- loss and backward, every
        reduction -- makes no synchronising torch call (``torch.cuda.set_sync_debug_mode("error")`` raises on
        one), so the host's compile overlaps the device's queued work."""
        logits, tg, il, tl = batch(rng)
        if lengths == "lists":
            il, tl = il.tolist(), tl.tolist()
        x = self.tensor(logits).log_softmax(-1).detach().requires_grad_()
        torch.cuda.synchronize()
        for reduction in ("mean", "sum", "none"):
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = chainfb.ctc_loss(x, tg, il, tl, reduction=reduction, zero_infinity=True)
                out.sum().backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert torch.isfinite(x.grad).all()


class TestCtcEmulated(CtcTests, OnEmulatedKernels):
    pass


# --------------------------------------------------------------- the graph
def test_ctc_graph_structure():
    g = chainfb.ctc_graph(torch.tensor([[3, 3, 4, 0], [5, 0, 0, 0]]), torch.tensor([3, 0]), blank=0)
    assert isinstance(g, chainfb.FstBatch) and g.num_sequences == 2
    f, e = g.fsts
    assert f.num_states == 2 * 3 + 2 and e.num_states == 2
    arcs = {(int(s), int(d), int(p)) for s, d, p in zip(f.src, f.dst, f.pdf)}
    # positions: 1 blank, 2 '3', 3 blank, 4 '3', 5 blank, 6 '4', 7 blank
    assert (0, 1, 0) in arcs and (0, 2, 3) in arcs
    assert all((s, s, p) in arcs for s, p in zip(range(1, 8), [0, 3, 0, 3, 0, 4, 0]))
    assert (2, 4, 3) not in arcs  # no skip between equal labels
    assert (4, 6, 4) in arcs  # a skip between different labels
    assert len(arcs) == f.num_arcs == 2 + 7 + 6 + 1
    assert np.flatnonzero(f.final > -np.inf).tolist() == [6, 7]
    assert np.flatnonzero(e.final > -np.inf).tolist() == [0, 1]  # U = 0: the start is final
    assert all(np.all(x.log_prob == 0) for x in g.fsts)


@pytest.mark.parametrize("compiler", ["numpy", "compiled"])
@pytest.mark.parametrize("seed", range(6))
def test_ctc_graph_arrays_match_the_definition(seed, compiler, monkeypatch):
    # the compiler builds all sequences at once; each graph equals the one
    # written arc by arc from the definition, and so do the packed arrays, the
    # arcs' indexes and the columns (which the compiled one hands to the batch)
    from chainfb.engines import numba_log

    if compiler == "numpy":
        monkeypatch.setattr(numba_log, "numba", None)
    elif not numba_log.available():
        pytest.skip("Numba is not available")
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 4 + seed, size=rng.integers(0, 7)) for _ in range(rng.integers(1, 9))]
    blank = int(rng.integers(0, 4))
    rows = [r[r != blank] for r in rows] if seed else [np.zeros(0, np.int64)] * 3  # no labels at all
    if seed == 5:  # repeats: no skip between equal labels
        rows = [np.repeat(r, 2) for r in rows]
    got = chainfb.ctc_graph(rows, blank=blank)
    want = chainfb.FstBatch([ctc_fst(r, blank) for r in rows])
    for name in ("state_offsets", "arc_offsets", "start", "final", "src", "dst", "pdf", "log_prob", "span",
                 "fwd_order", "in_ptr", "bwd_order", "out_ptr", "seq_to_graph"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    for part, a, b in zip(("ptr", "pdfs", "local_col"), got.columns(), want.columns()):
        assert a.dtype == b.dtype, part
        np.testing.assert_array_equal(a, b, err_msg=part)
    assert got.max_span == want.max_span and got.num_pdfs == want.num_pdfs and got.num_graphs == len(rows)
    for f, g in zip(got.fsts, want.fsts):
        assert f.arcs() == g.arcs() and f.start == g.start and np.array_equal(f.final, g.final)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), max_size=12), min_size=1, max_size=10), st.integers(0, 9),
       st.sampled_from([10, 5000]))
def test_compiled_ctc_compiler_equals_the_numpy_one(rows, blank, scale):
    """Differential: the compiled compiler (one pass) and the NumPy one give the same batch, indexes and columns for
    any label sets (empty ones, repeats, the blank anywhere in the vocabulary, a wide vocabulary)."""
    from chainfb import ctc
    from chainfb.engines import numba_log

    if not numba_log.available():
        pytest.skip("Numba is not available")
    rows = [[y * scale // 10 + (y >= blank) for y in r] for r in rows]  # never the blank
    U = np.array([len(r) for r in rows], dtype=np.int64)
    y = np.array([v for r in rows for v in r], dtype=np.int64)
    a, b = ctc._ctc_batch_compiled(U, y, blank), ctc._ctc_batch(U, y, blank)
    for name in ("state_offsets", "arc_offsets", "start", "final", "src", "dst", "pdf", "log_prob", "span",
                 "fwd_order", "in_ptr", "bwd_order", "out_ptr"):
        u, v = getattr(a, name), getattr(b, name)
        assert u.dtype == v.dtype and np.array_equal(u, v), name
    for u, v in zip(a.columns(), b.columns()):
        assert u.dtype == v.dtype and np.array_equal(u, v)


def test_ctc_graph_of_sparse_label_ids():
    """Label ids far beyond the labels' count (only ``ctc_graph`` takes labels without a vocabulary size): the
    compiled compiler's table of the vocabulary would be that wide, so the NumPy one builds the graphs."""
    rows = [[5, 2**40, 5], [2**40 + 7]]
    got = chainfb.ctc_graph(rows, blank=0)
    want = chainfb.FstBatch([ctc_fst(r, 0) for r in rows])
    for name in ("src", "dst", "pdf", "fwd_order", "in_ptr"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    for a, b in zip(got.columns(), want.columns()):
        np.testing.assert_array_equal(a, b)


def test_ctc_graph_inputs():
    a = chainfb.ctc_graph([[1, 2], [3]])
    b = chainfb.ctc_graph(torch.tensor([1, 2, 3]), [2, 1])
    c = chainfb.ctc_graph(np.array([[1, 2], [3, 0]]), np.array([2, 1]))
    for x, y in ((a, b), (a, c)):
        for f1, f2 in zip(x.fsts, y.fsts):
            assert np.array_equal(f1.pdf, f2.pdf) and np.array_equal(f1.src, f2.src)


def test_ctc_graph_mixes_with_the_engine(rng):
    # the CTC graph through the generic API equals ctc_loss, and path enumeration
    lp = torch.from_numpy(rng.normal(size=(4, 2, 3))).log_softmax(-1)
    tg = torch.tensor([[1, 2], [2, 2]])
    g = chainfb.ctc_graph(tg, blank=0)
    ll = chainfb.fst_loglike(lp.transpose(0, 1), g, lengths=[4, 4])
    ref = chainfb.ctc_loss(lp, tg, torch.tensor([4, 4]), torch.tensor([2, 2]), reduction="none")
    np.testing.assert_allclose(-ll.numpy(), ref.numpy(), rtol=1e-12)
    for n in range(2):
        Z, post = brute_force(g.fsts[n], lp[:, n].numpy(), 4)
        assert ll[n].item() == pytest.approx(Z, rel=1e-12)
        _, p = chainfb.forward_backward(g, lp.transpose(0, 1).numpy())
        np.testing.assert_allclose(p[n], post, atol=1e-12)


# --------------------------------------------------------------- bad inputs
def _args(**kw):
    a = dict(log_probs=torch.zeros(4, 2, 3).log_softmax(-1), targets=torch.tensor([[1, 2], [1, 0]]),
             input_lengths=torch.tensor([4, 3]), target_lengths=torch.tensor([2, 1]))
    a.update(kw)
    return a


@pytest.mark.parametrize("kw, exc, name", [
    (dict(log_probs=np.zeros((4, 2, 3))), TypeError, "log_probs"),
    (dict(log_probs=torch.zeros(4, 2, 3, dtype=torch.int32)), TypeError, "log_probs"),
    (dict(log_probs=torch.zeros(4, 2, 3, 1)), ValueError, "log_probs"),
    (dict(targets=torch.tensor([[1, 2]])), ValueError, "targets"),
    (dict(targets=torch.tensor([[1, 3], [1, 0]])), ValueError, "targets"),
    (dict(targets=torch.tensor([[1.0, 2.0], [1.0, 0.0]])), TypeError, "targets"),
    (dict(targets=torch.tensor([1, 2, 1, 2])), ValueError, "target_lengths"),
    (dict(input_lengths=torch.tensor([5, 3])), ValueError, "input_lengths"),
    (dict(input_lengths=torch.tensor([4])), ValueError, "input_lengths"),
    (dict(input_lengths=torch.tensor([4.0, 3.0])), TypeError, "input_lengths"),
    (dict(target_lengths=torch.tensor([3, 1])), ValueError, "target_lengths"),
    (dict(target_lengths=torch.tensor([-1, 1])), ValueError, "target_lengths"),
    (dict(blank=3), ValueError, "blank"),
    (dict(blank=-1), ValueError, "blank"),
    (dict(blank=1.0), TypeError, "blank"),
    (dict(reduction="batchmean"), ValueError, "reduction"),
])
def test_bad_inputs(kw, exc, name):
    with pytest.raises(exc, match=name):
        chainfb.ctc_loss(**_args(**kw))


def test_threads_share_the_layout_cache():
    """Many threads, more label sets than the cache holds: every call gets
    its own graphs' loss (no KeyError from a half-updated cache, no graphs
    of another thread's labels)."""
    from threads import in_threads

    rng = np.random.default_rng(7)
    T, C = 6, 4
    cases = []
    for _ in range(24):  # > the cache's 8 entries: entries are evicted while other threads use them
        tg = torch.from_numpy(rng.integers(1, C, size=(2, 2)))
        lp = torch.from_numpy(rng.normal(size=(T, 2, C))).log_softmax(-1)
        ref = chainfb.ctc_loss(lp, tg, torch.tensor([T, T]), torch.tensor([2, 2]), reduction="none")
        cases.append((lp, tg, ref))

    def work(seed):
        order = np.random.default_rng(seed).permutation(len(cases) * 4) % len(cases)
        for i in order:
            lp, tg, ref = cases[i]
            got = chainfb.ctc_loss(lp, tg, torch.tensor([T, T]), torch.tensor([2, 2]), reduction="none")
            assert torch.allclose(got, ref, rtol=1e-12, atol=0), f"case {i}: {got} != {ref}"

    errors = in_threads(work, 6)
    assert not errors, errors[:3]


def test_bad_flags_and_layouts():
    with pytest.raises(TypeError, match="zero_infinity"):
        chainfb.ctc_loss(**_args(zero_infinity="False"))
    with pytest.raises(TypeError, match="zero_infinity"):
        chainfb.ctc_loss(**_args(zero_infinity=1))


def test_layout_cache_is_the_thread_safe_lru():
    """The compiled-layout cache is :class:`chainfb.checks.LRU` (its thread
    safety is tested in test_checks.py: the unlocked get-then-move_to_end it
    replaced raised KeyError a few times per 10^5 operations)."""
    from chainfb import checks
    from chainfb.ctc import _compiled

    assert isinstance(_compiled, checks.LRU)


def _collate(batch):
    """A DataLoader's collate_fn that compiles the batch's CTC labels in the worker."""
    targets = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True)
    lengths = torch.tensor([len(y) for y in batch])
    return chainfb.CtcTargets(targets, lengths, device="cuda"), targets, lengths


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), max_size=5), min_size=1, max_size=5), st.integers(0, 1),
       st.sampled_from(["none", "mean", "sum"]), st.booleans(), st.data())
def test_targets_compiled_ahead_equal_the_labels_themselves(rows, blank, reduction, nan, data):
    """Differential: for any label sets (empty ones, repeats, impossible pairs of lengths) and a NaN frame placed
    anywhere, ``CtcTargets`` (pickled and back) give the loss and the gradient of the labels as a tensor, bit for
    bit; a NaN stays in its own sequence."""
    N, T, C = len(rows), 6, 8
    rows = [[v + (v >= blank) for v in r] for r in rows]  # never the blank
    il = torch.tensor(data.draw(st.lists(st.integers(0, T), min_size=N, max_size=N)))
    lp = torch.randn(T, N, C, generator=torch.Generator().manual_seed(len(rows)), dtype=torch.float64)
    hit = data.draw(st.integers(0, N - 1))
    if nan:
        lp[data.draw(st.integers(0, T - 1)), hit, 0] = float("nan")
    lp = lp.log_softmax(-1)
    tl = torch.tensor([len(r) for r in rows])
    padded = torch.zeros(N, max(1, int(tl.max())), dtype=torch.long)
    for n, r in enumerate(rows):
        padded[n, : len(r)] = torch.tensor(r, dtype=torch.long)
    made = pickle.loads(pickle.dumps(chainfb.CtcTargets(rows, blank=blank)))
    outs = []
    for targets in (padded, made):
        x = lp.clone().requires_grad_()
        out = chainfb.ctc_loss(x, targets, il, tl, blank=blank, reduction=reduction)
        outs.append((out, torch.autograd.grad(out.sum(), x)[0]))
    (a, ga), (b, gb) = outs
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])
    assert torch.equal(ga.nan_to_num(7.0), gb.nan_to_num(7.0))
    if reduction == "none":
        others = torch.arange(N) != hit
        assert not b[others].isnan().any() and not gb[:, others].isnan().any()


def test_targets_compiled_ahead_pickle_their_arrays_as_one_tensor():
    """A pickled ``CtcTargets`` is a small header and one tensor holding its arrays (a DataLoader worker hands a
    tensor over through shared memory); unpickled, its arrays are views of that tensor's memory."""
    made = chainfb.CtcTargets([[1, 2, 2], [3], [4, 5]], device="cuda")
    _, args = made.__reduce__()
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert len(tensors) == 1 and tensors[0].dtype == torch.uint8
    assert all(isinstance(a, (bytes, list)) for a in args if a is not tensors[0])
    assert sum(len(a) for a in args if isinstance(a, bytes)) < tensors[0].numel()
    back = pickle.loads(pickle.dumps(made))
    memory = back.labels
    while isinstance(memory, np.ndarray):  # a view of a view ... of the tensor's memory, not a copy
        memory = memory.base
    assert isinstance(memory, torch.Tensor)
    assert back.labels.tolist() == [1, 2, 2, 3, 4, 5] and back.target_lengths.tolist() == [3, 1, 2]
    assert cuda_engine.HOST_ARRAYS in back.lattice.memo.keys()


def test_targets_compiled_ahead_in_a_dataloader_worker():
    """``CtcTargets`` made in a DataLoader worker process come through the worker's hand-over with their index
    arrays and give the loss of the labels themselves."""
    g = torch.Generator().manual_seed(3)
    labels = [torch.randint(1, 7, (int(n),), generator=g) for n in (3, 1, 4, 2, 0, 3)]
    loader = torch.utils.data.DataLoader(labels, batch_size=3, collate_fn=_collate, num_workers=1)
    lp = torch.randn(8, 3, 7, generator=g, dtype=torch.float64).log_softmax(-1)
    for made, targets, lengths in loader:
        assert cuda_engine.HOST_ARRAYS in made.lattice.memo.keys()
        il = torch.tensor([8, 7, 6])
        want = F.ctc_loss(lp, targets, il, lengths, reduction="none")
        np.testing.assert_allclose(chainfb.ctc_loss(lp, made, il, None, reduction="none").numpy(), want.numpy(),
                                   rtol=1e-12)
