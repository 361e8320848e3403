"""Differential property tests: every criterion against an independent
float64 reference on random small cases, with NaN / inf / -inf placed in
scores and arc weights, unequal and zero lengths, on the NumPy engine and
the compiled (Numba) engine.

The properties:

- a sequence whose inputs are finite gets the reference's value (and
  gradient), whatever the other sequences of the batch hold (a NaN or +inf
  elsewhere never leaks into it);
- a sequence with no complete path gets ``-inf`` (a loss of ``inf``) and a
  zero gradient;
- threads sharing the library get the single-threaded numbers.

Hypothesis runs a fixed, derandomized number of examples per test so CI
time is bounded.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chainfb
from chainfb import Fst, FstBatch
from oracles.fst import reference_forward_backward
from oracles.tdt import grid_reference as tdt_reference
from oracles.transducer import grid_reference as transducer_reference
from threads import in_threads

FUZZ = settings(max_examples=50, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(params=["numpy", "compiled"])
def cpu_engine(request, monkeypatch):
    """The NumPy engine (Numba hidden from the engine picker) or the compiled one."""
    from chainfb.engines import numba_log

    if request.param == "numpy":
        monkeypatch.setattr(numba_log, "numba", None)
    elif not numba_log.available():
        pytest.skip("Numba is not installed")
    return request.param


# ---------------------------------------------------------------- drawing

SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


@st.composite
def poisoned(draw, shape, lo=-4.0, hi=4.0, max_specials=2):
    """A float64 array of ``shape`` with a few NaN / +inf / -inf at drawn places."""
    seed = draw(st.integers(0, 2**31 - 1))
    x = np.random.default_rng(seed).uniform(lo, hi, size=shape)
    size = int(np.prod(shape))
    if size:
        for _ in range(draw(st.integers(0, max_specials))):
            x.reshape(-1)[draw(st.integers(0, size - 1))] = draw(SPECIAL)
    return x


@st.composite
def small_fst(draw, num_pdfs=3):
    S = draw(st.integers(1, 4))
    A = draw(st.integers(0, 7))
    arc = st.tuples(st.integers(0, S - 1), st.integers(0, S - 1), st.integers(0, num_pdfs - 1),
                    st.one_of(st.floats(-3, 1), st.just(-math.inf), st.just(-60.0)))
    arcs = draw(st.lists(arc, min_size=A, max_size=A))
    finals = draw(st.lists(st.one_of(st.just(-math.inf), st.floats(-2, 1)), min_size=S, max_size=S))
    src, dst, pdf, w = (np.array(c) for c in zip(*arcs)) if arcs else (np.zeros(0, np.int64),) * 3 + (np.zeros(0),)
    return Fst(S, draw(st.integers(0, S - 1)), src.astype(np.int64), dst.astype(np.int64), pdf.astype(np.int64),
               w.astype(np.float64), np.array(finals, dtype=np.float64))


def _finite_in(x, n, length):
    return bool(np.isfinite(x[n, :length]).all())


# ---------------------------------------------------------------- generic FSTs

@FUZZ
@given(data=st.data())
def test_generic_fst_against_loops(cpu_engine, data):
    N = data.draw(st.integers(1, 3))
    T = data.draw(st.integers(0, 4))
    fsts = [data.draw(small_fst()) for _ in range(N)]
    lengths = np.array(data.draw(st.lists(st.integers(0, T), min_size=N, max_size=N)))
    x = data.draw(poisoned((N, T, 3)))
    loglike, post = chainfb.forward_backward(fsts, x, lengths)
    assert loglike.shape == (N,) and post.shape == (N, T, 3)
    for n in range(N):
        if not _finite_in(x, n, lengths[n]):
            continue  # only this sequence may be NaN
        ref, ref_post = reference_forward_backward(fsts[n], x[n], lengths[n])
        if ref == -math.inf:
            assert loglike[n] == -np.inf, (n, loglike)
            assert (post[n] == 0).all()
        else:
            np.testing.assert_allclose(loglike[n], ref, rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(post[n], ref_post, rtol=1e-7, atol=1e-9)
    assert (post[np.arange(T)[None, :] >= lengths[:, None]] == 0).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_and_plus_inf_arc_weights_are_refused(bad):
    """Arc weights may be -inf (no arc) or any finite number; NaN and +inf
    are refused where the graph is made, naming the argument."""
    with pytest.raises(ValueError, match="^log_prob"):
        Fst(2, 0, np.array([0]), np.array([1]), np.array([0]), np.array([bad]), np.array([-math.inf, 0.0]))


@pytest.mark.parametrize("weight, spread", [(-800.0, 0.0), (800.0, 0.0), (-300.0, 500.0)])
def test_auto_engine_on_a_shared_graph_gives_the_exact_number(weight, spread):
    """The engine picked automatically for a large shared graph agrees with
    the exact NumPy engine even where arc weights alone leave the scaled
    domain's range."""
    from chainfb.engines import forward_backward as engine_fb
    from chainfb.lattice import Lattice

    rng = np.random.default_rng(0)
    S, A, P, N, T = 40, 2400, 5, 3, 6
    src, dst = rng.integers(0, S, A), rng.integers(0, S, A)
    pdf = rng.integers(0, P, A)
    w = weight + rng.uniform(-1, 0, A)  # every path carries such weights
    w[pdf == 0] = -np.inf  # pdf 0 scores best but no path reads it
    fst = Fst(S, 0, src, dst, pdf, w, np.zeros(S))
    lat = Lattice.of(FstBatch([fst], np.zeros(N, dtype=np.int64)))
    x = rng.uniform(-2, 0, (N, T, P))
    x[:, :, 0] += spread
    X = np.ascontiguousarray(x.transpose(1, 0, 2).reshape(T, N * P))
    lengths = np.array([T, T - 1, 2])
    exact, exact_post = engine_fb(lat, X.copy(), lengths, engine="numpy")  # (engines may write past lengths)
    auto, auto_post = engine_fb(lat, X.copy(), lengths)
    assert np.isfinite(exact).all()
    np.testing.assert_allclose(auto, exact, rtol=1e-10)
    np.testing.assert_allclose(auto_post, exact_post, atol=1e-9)


# ---------------------------------------------------------------- CTC vs torch

@FUZZ
@given(data=st.data())
def test_ctc_against_torch(cpu_engine, data):
    N = data.draw(st.integers(1, 3))
    T = data.draw(st.integers(1, 6))
    C = 4
    logits = torch.from_numpy(data.draw(poisoned((T, N, C), max_specials=1)))
    input_lengths = torch.tensor(data.draw(st.lists(st.integers(0, T), min_size=N, max_size=N)))
    target_lengths = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=N, max_size=N)))
    targets = torch.randint(1, C, (N, 3), generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    x = logits.clone().requires_grad_()
    ours = chainfb.ctc_loss(torch.log_softmax(x, -1), targets, input_lengths, target_lengths, reduction="none")
    ours.sum().backward() if torch.isfinite(ours).all() else ours.masked_fill(~torch.isfinite(ours), 0).sum().backward()
    for n in range(N):
        L = int(input_lengths[n])
        if not torch.isfinite(logits[:L, n]).all():
            continue
        y = logits[:, n:n + 1].clone().requires_grad_()
        ref = torch.nn.functional.ctc_loss(torch.log_softmax(y, -1), targets[n:n + 1], input_lengths[n:n + 1],
                                           target_lengths[n:n + 1], reduction="none")
        if torch.isinf(ref).all():
            assert torch.isinf(ours[n]), (n, ours)
            assert (x.grad[:L, n] == 0).all()  # (past L, log_softmax's backward spreads a NaN of its row)
            continue
        ref.sum().backward()
        torch.testing.assert_close(ours[n], ref[0], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(x.grad[:L, n], y.grad[:L, 0], rtol=1e-7, atol=1e-9)


# ---------------------------------------------------------------- transducers vs loops

def _transducer_case(data, B, V, max_T=4, max_U=2, extra=0):
    T = data.draw(st.integers(1, max_T))
    U = data.draw(st.integers(0, max_U))
    Tb = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    Tb[data.draw(st.integers(0, B - 1))] = T
    Ub = data.draw(st.lists(st.integers(0, U), min_size=B, max_size=B))
    Ub[data.draw(st.integers(0, B - 1))] = U
    logits = data.draw(poisoned((B, T, U + 1, V + extra), max_specials=1))
    seed = data.draw(st.integers(0, 999))
    return logits, np.array(Tb), np.array(Ub), np.random.default_rng(seed)


def _check_transducer(loss, grad, logits, Tb, Ub, reference):
    for b in range(len(Tb)):
        if not np.isfinite(logits[b, :Tb[b], :Ub[b] + 1]).all():
            continue
        logP, ref_grad = reference(b)
        if logP == -math.inf:
            assert loss[b] == math.inf and (grad[b] == 0).all(), (b, loss)
            continue
        np.testing.assert_allclose(loss[b], -logP, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(grad[b, :Tb[b], :Ub[b] + 1], ref_grad[:Tb[b], :Ub[b] + 1], rtol=1e-7, atol=1e-9)


@FUZZ
@given(data=st.data())
def test_rnnt_against_loops(cpu_engine, data):
    B, V, blank = data.draw(st.integers(1, 3)), 4, 0
    logits, Tb, Ub, rng = _transducer_case(data, B, V)
    targets = rng.integers(1, V, (B, max(int(Ub.max()), 1)))
    x = torch.from_numpy(logits).requires_grad_()
    loss = chainfb.rnnt_loss(x, torch.from_numpy(targets), torch.from_numpy(Tb), torch.from_numpy(Ub), blank=blank,
                             reduction="none")
    loss.masked_fill(~torch.isfinite(loss), 0).sum().backward()
    _check_transducer(loss.detach().numpy(), x.grad.numpy(), logits, Tb, Ub,
                      lambda b: transducer_reference(logits[b, :Tb[b], :Ub[b] + 1], targets[b], Tb[b], Ub[b], blank))


@FUZZ
@given(data=st.data())
def test_multiblank_against_loops(cpu_engine, data):
    B, V = data.draw(st.integers(1, 3)), 5
    durations = [2, 3]
    blank = V - 1
    logits, Tb, Ub, rng = _transducer_case(data, B, V, max_T=5)
    targets = rng.integers(0, V - 3, (B, max(int(Ub.max()), 1)))
    x = torch.from_numpy(logits).requires_grad_()
    loss = chainfb.multiblank_rnnt_loss(x, torch.from_numpy(targets), torch.from_numpy(Tb), torch.from_numpy(Ub),
                                        blank, durations, reduction="none")
    loss.masked_fill(~torch.isfinite(loss), 0).sum().backward()
    _check_transducer(loss.detach().numpy(), x.grad.numpy(), logits, Tb, Ub,
                      lambda b: transducer_reference(logits[b, :Tb[b], :Ub[b] + 1], targets[b], Tb[b], Ub[b], blank,
                                                     durations))


@FUZZ
@given(data=st.data())
def test_tdt_against_loops(cpu_engine, data):
    B, V = data.draw(st.integers(1, 3)), 4
    durations = [0, 1, 2]
    blank = V - 1
    logits, Tb, Ub, rng = _transducer_case(data, B, V, extra=len(durations))
    targets = rng.integers(0, V - 1, (B, max(int(Ub.max()), 1)))
    x = torch.from_numpy(logits).requires_grad_()
    loss = chainfb.tdt_loss(x, torch.from_numpy(targets), torch.from_numpy(Tb), torch.from_numpy(Ub), blank,
                            durations, reduction="none")
    loss.masked_fill(~torch.isfinite(loss), 0).sum().backward()
    _check_transducer(loss.detach().numpy(), x.grad.numpy(), logits, Tb, Ub,
                      lambda b: tdt_reference(logits[b, :Tb[b], :Ub[b] + 1], targets[b], Tb[b], Ub[b], blank,
                                              durations))


@FUZZ
@given(data=st.data())
def test_simple_grid_loss_against_loops(cpu_engine, data):
    """The (s, t) grid family: k2's simple loss against the loop reference."""
    from chainfb.compat import fast_rnnt
    from oracles.fast_rnnt import rnnt_loss_simple_reference

    B, V = data.draw(st.integers(1, 3)), 4
    T, S = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    am = torch.from_numpy(data.draw(poisoned((B, T, V), max_specials=1)))
    lm = torch.from_numpy(data.draw(poisoned((B, S + 1, V), max_specials=0)))
    symbols = torch.randint(1, V, (B, S), generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    ours = fast_rnnt.rnnt_loss_simple(lm, am, symbols, 0, reduction="none")
    ref = rnnt_loss_simple_reference(lm, am, symbols, 0, reduction="none")
    for b in range(B):
        if torch.isfinite(am[b]).all():
            torch.testing.assert_close(ours[b], ref[b], rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- threads

def test_threads_get_single_threaded_numbers(cpu_engine):
    """CTC, RNN-T and generic FSTs from four threads at once, with layouts
    that change call to call (the compiled-layout caches are shared)."""
    rng = np.random.default_rng(5)
    cases = []
    for i in range(12):
        T, N, C = 6 + i % 3, 2 + i % 2, 5
        lp = torch.log_softmax(torch.from_numpy(rng.normal(size=(T, N, C))), -1)
        tl = torch.from_numpy(rng.integers(0, 3, N))
        tg = torch.from_numpy(rng.integers(1, C, (N, 3)))
        il = torch.from_numpy(rng.integers(3, T + 1, N))
        logits = torch.from_numpy(rng.normal(size=(N, T, 4, C)))
        cases.append((lp, tg, il, tl, logits))

    def run(case):
        lp, tg, il, tl, logits = case
        a = chainfb.ctc_loss(lp, tg, il, tl, reduction="none")
        b = chainfb.rnnt_loss(logits, tg.int(), il.int(), tl.int(), blank=0, reduction="none")
        return torch.cat([a, b])

    expected = [run(c) for c in cases]
    got = {}

    def worker(k):
        for rep in range(6):
            i = (k * 5 + rep * 7) % len(cases)
            got.setdefault(i, []).append(run(cases[i]))

    errors = in_threads(worker, 4)
    assert not errors, errors
    for i, outs in got.items():
        for o in outs:
            torch.testing.assert_close(o, expected[i], rtol=0, atol=0)
