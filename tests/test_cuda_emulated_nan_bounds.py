"""NaN and out-of-range inputs through the CUDA kernels, run on the CPU
(chainfb.cuda.emulation): NaN propagates exactly as on the NumPy engine and
the torch transducer path; device-side lengths and indices never move an
access out of bounds (the ASan runs are in test_cuda_emulated.py)."""

import numpy as np
import pytest
import torch

from chainfb import FstBatch, Lattice
from chainfb.cuda.emulation import find_compiler
from chainfb.engines.cuda import forward_backward_on
from chainfb.engines.numpy_log import forward_backward as forward_backward_numpy
from chainfb.testing import random_fst

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
    lle, poste = forward_backward_on(be, lat, X.astype(dtype), lengths, leaky=lk, block_size=block)
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
    ll_k, g_k = TransducerCriterion(*args, backend=be).run(logits)
    assert torch.isnan(ll_cpu[1]) and not torch.isnan(ll_cpu[[0, 2]]).any()
    np.testing.assert_allclose(ll_k.numpy(), ll_cpu.numpy(), rtol=1e-10)
    torch.testing.assert_close(g_k, g_cpu, rtol=1e-9, atol=1e-10, equal_nan=True)
    assert not torch.isnan(g_k[[0, 2]]).any()


@pytest.mark.parametrize("kind", ["f32", "f16", "f64"])
def test_transducer_gather_nan_row(be, kind):
    """A NaN logit: its row's lse is NaN and so is every score gathered from
    the row (fused), exactly the NaN pattern of the NumPy twin."""
    from chainfb.cuda.transducer_maps import transducer_gather_on
    from oracles import cuda_twins as twins
    from test_cuda_emulated import _as_input, _case

    rng = np.random.default_rng(5)
    logits, args, C, rows, zc = _case(rng, M=2)
    logits[0, 1, 2, 0] = np.nan
    x = _as_input(logits, kind)
    Xe, lse_e = transducer_gather_on(be, x, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=4,
                                     block_size=8, **args)
    Xt, lse_t = twins.transducer_gather(x, num_rows=rows, num_columns=C, zero_col=zc, **args)
    assert np.isnan(lse_e[0, 1, 2]) and np.isnan(lse_e).sum() == 1
    np.testing.assert_array_equal(np.isnan(Xe), np.isnan(Xt))
    assert np.isnan(Xe).sum() == (args["colidx"][0, 2] >= 0).sum()
