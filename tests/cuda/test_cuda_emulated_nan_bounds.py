"""NaN and out-of-range inputs through the CUDA kernels, run on the CPU
(tests/emulation): NaN propagates exactly as on the NumPy engine and
the torch transducer path; device-side lengths and indices never move an
access out of bounds, in the per-sequence and the shared-graph engine
kernels and the transducer maps (the ASan runs are in
test_cuda_emulated.py)."""

import numpy as np
import pytest
import torch

from chainfb import FstBatch, Lattice
from chainfb.engines.cuda import forward_backward as lattice_forward_backward
from chainfb.engines.cuda_shared import forward_backward as shared_forward_backward
from chainfb.engines.numpy_log import forward_backward as forward_backward_numpy
from chainfb.testing import random_fst

from emulation import find_compiler, run_on

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture
def be(emulated_backend):
    return emulated_backend


def _nan_case(seed, leaky):
    rng = np.random.default_rng(seed)
    fsts = [random_fst(rng, num_states=int(rng.integers(2, 7)), num_arcs=int(rng.integers(4, 14)), num_pdfs=3)
            for _ in range(5)]
    lat = Lattice.of(FstBatch(fsts))
    T = 6
    X = rng.normal(size=(T, lat.num_columns))
    lengths = np.array([6, 4, 5, 2, 6])
    cols = lambda n: np.flatnonzero(lat.col_seq == n)  # noqa: E731
    X[1, cols(1)[0]] = np.nan  # inside sequence 1
    X[3, cols(2)[-1]] = np.nan  # inside sequence 2 (a late frame)
    X[4, cols(3)[0]] = np.nan  # past sequence 3's length: ignored
    lk = None
    if leaky:
        init = rng.random(lat.num_states) + 0.01
        for n in range(lat.num_sequences):
            sl = slice(lat.state_offsets[n], lat.state_offsets[n + 1])
            init[sl] /= init[sl].sum()
        lk = (0.1, np.log(init))
    return lat, X, lengths, lk


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("block", [1, 4, 32])
def test_engine_nan_propagates_like_numpy(be, leaky, dtype, block):
    lat, X, lengths, lk = _nan_case(3, leaky)
    ll, post = forward_backward_numpy(lat, X.copy(), lengths, leaky=lk)
    lle, poste = lattice_forward_backward(be, lat, X.astype(dtype), lengths, leaky=lk, block_size=block)
    assert np.isnan(ll[[1, 2]]).all() and not np.isnan(ll[[0, 3, 4]]).any()
    np.testing.assert_array_equal(np.isnan(lle), np.isnan(ll))
    np.testing.assert_array_equal(np.isnan(poste), np.isnan(post))
    tol = 1e-10 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(lle, ll, rtol=tol, atol=tol)  # NaN where NumPy has NaN
    np.testing.assert_allclose(poste, post, rtol=tol, atol=tol)


@pytest.mark.parametrize("durations", [(), (2,)])
@pytest.mark.parametrize("fused, clamp", [(True, -1.0), (True, 0.3), (False, -1.0)])
def test_transducer_nan_logit_like_cpu(be, durations, fused, clamp):
    """A NaN logit makes its row's log-sum-exp NaN on the kernel route as on
    the CPU route: the same NaN pattern in the costs and gradients, the
    other utterances untouched."""
    from chainfb.transducer import TransducerCriterion

    rng = np.random.default_rng(4)
    B, T, U1, V = 3, 5, 3, 6
    logits = torch.from_numpy(rng.normal(size=(B, T, U1, V)))
    logits[1, 2, 1, V - 1] = float("nan")  # the blank logit of a live row of utterance 1
    logits[2, 4, 0, 3] = float("nan")  # a dead row of utterance 2 (t >= T_2)
    Tb, Ub = np.array([5, 4, 3]), np.array([2, 2, 1])
    targets = torch.from_numpy(rng.integers(0, V - 1 - len(durations), size=(B, U1 - 1)))
    args = (logits.shape, targets, Tb, Ub, V - 1, durations, 0.0, fused, 0.0, clamp)
    ll_cpu, g_cpu = TransducerCriterion(*args).run(logits)
    with run_on(be):
        ll_k, g_k = TransducerCriterion(*args).run(logits)
    assert torch.isnan(ll_cpu[1]) and not torch.isnan(ll_cpu[[0, 2]]).any()
    np.testing.assert_allclose(ll_k.numpy(), ll_cpu.numpy(), rtol=1e-10)
    torch.testing.assert_close(g_k, g_cpu, rtol=1e-9, atol=1e-10, equal_nan=True)
    assert not torch.isnan(g_k[[0, 2]]).any()


@pytest.mark.parametrize("durations", [(), (2,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_transducer_inf_logit_like_cpu(be, durations, dtype):
    """A +inf logit that no arc reads: its row's scores are -inf (the
    normaliser is +inf) and the row's softmax is taken as 0, so on the
    kernel route as on the CPU route the utterance keeps a finite cost and a
    finite gradient (no inf * 0)."""
    from chainfb.transducer import TransducerCriterion

    rng = np.random.default_rng(8)
    B, T, U1, V = 3, 5, 3, 6
    logits = torch.from_numpy(rng.normal(size=(B, T, U1, V))).to(dtype)
    targets = torch.tensor([[0, 1], [0, 1], [1, 0]])
    logits[1, 2, 1, 2] = float("inf")  # read by no arc of row (t=2, u=1): not the blank, a big blank or label 1
    Tb, Ub = np.array([5, 4, 3]), np.array([2, 2, 1])
    args = (logits.shape, targets, Tb, Ub, V - 1, durations, 0.0, True, 0.0, -1.0)
    ll_cpu, g_cpu = TransducerCriterion(*args).run(logits)
    with run_on(be):
        ll_k, g_k = TransducerCriterion(*args).run(logits)
    assert torch.isfinite(ll_cpu).all() and torch.isfinite(g_cpu).all()
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(ll_k.numpy(), ll_cpu.numpy(), rtol=tol)
    torch.testing.assert_close(g_k, g_cpu, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["f32", "f16", "f64"])
def test_transducer_gather_nan_row(be, kind):
    """A NaN logit: its row's lse is NaN and so is every score gathered from
    the row (fused), exactly the NaN pattern of the NumPy twin."""
    from chainfb.cuda.transducer_maps import transducer_gather
    from oracles import cuda_twins as twins
    from test_cuda_emulated import _as_input, _case

    rng = np.random.default_rng(5)
    logits, args, C, rows, zc = _case(rng, M=2)
    logits[0, 1, 2, 0] = np.nan
    x = _as_input(logits, kind)
    Xe, lse_e = transducer_gather(be, x, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=4,
                                     block_size=8, **args)
    Xt, lse_t = twins.transducer_gather(x, num_rows=rows, num_columns=C, zero_col=zc, **args)
    assert np.isnan(lse_e[0, 1, 2]) and np.isnan(lse_e).sum() == 1
    np.testing.assert_array_equal(np.isnan(Xe), np.isnan(Xt))
    assert np.isnan(Xe).sum() == (args["colidx"][0, 2] >= 0).sum()


# ---------------------------------------------------------------- out-of-range device inputs


def device_inputs(monkeypatch_setattr):
    """Treat every array as device memory (no host-side checks), as CuPy
    inputs are: the kernels alone must keep every access in bounds."""
    import chainfb.cuda.transducer_maps as tm
    import chainfb.engines.cuda as ce

    monkeypatch_setattr(ce, "host_array", lambda x: None)
    monkeypatch_setattr(tm, "_host", lambda x: None)


def out_of_range_checks(be):
    """Run the kernels on out-of-range lengths, columns and symbols and check
    that they behave as the clamped / ignored inputs (run directly and, in a
    child process, under AddressSanitizer)."""
    from chainfb.cuda.transducer_maps import transducer_gather, transducer_grad
    from test_cuda_emulated import _case

    rng = np.random.default_rng(6)
    fsts = [random_fst(rng, num_states=5, num_arcs=12) for _ in range(4)]
    T = 5
    bad = np.array([T + 7, -3, 2, 2**40])
    ok = np.clip(bad, 0, T)
    # the per-sequence kernels on four graphs, the shared-graph kernels on one graph for four sequences
    for run, lat in ((lattice_forward_backward, Lattice.of(FstBatch(fsts))),
                     (shared_forward_backward, Lattice.of(FstBatch(fsts[:1], np.zeros(4, dtype=np.int64))))):
        X = rng.normal(size=(T, lat.num_columns))
        for leaky in (None, (0.1, np.log(np.full(lat.num_states, 0.2)))):
            for block in (1, 4):
                ll, post = run(be, lat, X.copy(), bad, leaky=leaky, block_size=block)
                llr, postr = forward_backward_numpy(lat, X.copy(), ok, leaky=leaky)
                np.testing.assert_allclose(ll, llr, rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(post, postr, rtol=1e-10, atol=1e-12)

    logits, args, C, rows, zc = _case(rng, M=2)
    B, Tl, U1, V = logits.shape
    sym, colidx = args["sym"].copy(), args["colidx"].copy()
    used = colidx >= 0
    pick = used & (rng.random(sym.shape) < 0.3)
    pick2 = used & ~pick & (rng.random(sym.shape) < 0.3)
    assert pick.any() and pick2.any()
    sym_bad = np.where(pick, np.where(rng.random(sym.shape) < 0.5, V + 3, -7), sym)
    col_bad = np.where(pick2, np.where(rng.random(sym.shape) < 0.5, C + 5, 2**30), colidx)
    cut = np.where(pick | pick2, -1, colidx)  # the same entries, unused
    T_bad = np.array([Tl + 100, -2, 2**31 - 1])
    U_bad = np.array([U1 + 5, 2**31 - 1, -1])
    T_ok, U_ok = np.clip(T_bad, 0, Tl), np.clip(U_bad, -1, U1 - 1)
    zc_bad = np.array([C + 1, -5, 2**31 - 1], dtype=np.int32)
    kw = dict(num_rows=rows, num_columns=C, threads_per_row=2, block_size=4)
    Xb, lseb = transducer_gather(be, logits, sym_bad, col_bad, T_bad, U_bad, zero_col=zc_bad, **kw)
    Xr, lser = transducer_gather(be, logits, sym, cut, T_ok, U_ok, **kw)
    np.testing.assert_array_equal(Xb, Xr)
    np.testing.assert_array_equal(lseb, lser)
    post = rng.random((rows, C)).astype(np.float32)
    gk = dict(post=post, lse=lseb, scale=1.0, kind_weight=np.ones(4), threads_per_row=2, block_size=4)
    gb = transducer_grad(be, logits, sym_bad, col_bad, T_bad, U_bad, **gk)
    gr = transducer_grad(be, logits, sym, cut, T_ok, U_ok, **gk)
    np.testing.assert_array_equal(gb, gr)


def test_out_of_range_device_inputs(be, monkeypatch):
    device_inputs(monkeypatch.setattr)
    out_of_range_checks(be)


def test_host_inputs_are_checked(be):
    from chainfb.cuda.transducer_maps import transducer_gather
    from test_cuda_emulated import _case

    rng = np.random.default_rng(7)
    logits, args, C, rows, zc = _case(rng, M=0)
    T, U1 = logits.shape[1:3]
    for name, bad in (("logit_lengths", [T + 1, 1, 1]), ("logit_lengths", [-1, 1, 1]),
                      ("target_lengths", [U1, 0, 0]), ("target_lengths", [0, -1, 0])):
        with pytest.raises(ValueError, match=name):
            transducer_gather(be, logits, num_rows=rows, num_columns=C, **dict(args, **{name: np.array(bad)}))


def test_gather_offsets_above_2_31(be, tmp_path):
    """The gather reads a row that starts past element 2^31 of the logits
    (a sparse memory-mapped file: no disk is used) with 64-bit offsets.
    (The gradient kernel writes every element of a gradient as large as the
    logits, too big for a test; its row offsets use the same arithmetic.)"""
    from chainfb.cuda.transducer_maps import transducer_gather

    B, V = 2049, 2**20
    try:
        logits = np.memmap(tmp_path / "logits.f16", dtype=np.float16, mode="w+", shape=(B, 1, 1, V))
    except OSError as e:
        pytest.skip(f"no sparse file: {e}")
    assert (B - 1) * V >= 2**31
    row = np.zeros(V, dtype=np.float16)
    row[[0, 7, V - 1]] = [1.5, -2.0, 3.0]
    logits[B - 1, 0, 0, :] = row
    logits.flush()
    sym = np.zeros((B, 1, 2), dtype=np.int32)
    sym[:, :, 0], sym[:, :, 1] = V - 1, 7
    colidx = -np.ones((B, 1, 2), dtype=np.int32)
    colidx[B - 1, 0] = [0, 1]
    T_len = np.zeros(B, dtype=np.int32)
    T_len[B - 1] = 1  # only the last row is live
    X, lse = transducer_gather(be, logits, sym, colidx, T_len, np.zeros(B, dtype=np.int32), num_rows=1,
                                  num_columns=2, threads_per_row=1, block_size=1024)
    r = row.astype(np.float64)
    want_lse = np.log(np.exp(r).sum())
    # (float32 sums of 2^20 terms in one thread: loose tolerances; a wrong row would be off by 2 or more)
    np.testing.assert_allclose(lse[B - 1, 0, 0], want_lse, atol=0.02)
    np.testing.assert_allclose(X[0], [3.0 - want_lse, -2.0 - want_lse], atol=0.02)
    assert not lse[: B - 1].any()
