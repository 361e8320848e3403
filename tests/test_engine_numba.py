"""The compiled CPU engine (:mod:`chainfb.engines.numba_log`) against the
NumPy engine it mirrors, on the inputs where they could part: unequal and
zero lengths, impossible sequences, -inf, NaN and +inf scores, scores of
magnitude 1e4 over long inputs, threads; and where :func:`select` sends what."""

import numpy as np
import pytest

from chainfb import FstBatch, ctc_graph, engines
from chainfb.engines import numba_log, numpy_log, select
from chainfb.lattice import Lattice
from chainfb.score_map import PdfScoreMap
from chainfb.testing import random_fst

pytestmark = pytest.mark.skipif(not numba_log.available(), reason="needs Numba (the jit extra)")


def _lattice(seed, n=5, states=6, arcs=15, pdfs=5):
    rng = np.random.default_rng(seed)
    fsts = [random_fst(rng, num_states=states, num_arcs=arcs, num_pdfs=pdfs, num_finals=2) for _ in range(3)]
    return Lattice.of(FstBatch(fsts, seq_to_graph=rng.integers(0, 3, size=n))), rng


def _scores(lat, rng, T, scale=2.0):
    x = rng.normal(scale=scale, size=(lat.num_sequences, T, int(lat.col_pdf.max()) + 1))
    return PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)


def _both(lat, X, lengths, need=True):
    a = numba_log.forward_backward(lat, X.copy(), lengths, need_posteriors=need)
    b = numpy_log.forward_backward(lat, X.copy(), lengths, need_posteriors=need)
    return a, b


@pytest.mark.parametrize("seed", range(10))
def test_matches_numpy_engine(seed):
    lat, rng = _lattice(seed)
    T = 12
    X = _scores(lat, rng, T)
    lengths = rng.integers(0, T + 1, size=lat.num_sequences)
    (ll, post), (ll_ref, post_ref) = _both(lat, X, lengths)
    np.testing.assert_array_equal(np.isneginf(ll), np.isneginf(ll_ref))
    fin = np.isfinite(ll_ref)
    np.testing.assert_allclose(ll[fin], ll_ref[fin], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)
    assert not post[:, np.isin(lat.col_seq, np.flatnonzero(~fin))].any()  # impossible: zero posteriors
    ll_only, none = numba_log.forward_backward(lat, X.copy(), lengths, need_posteriors=False)
    assert none is None
    np.testing.assert_array_equal(ll_only, ll)


def test_ctc_graphs_and_minus_inf_scores():
    rng = np.random.default_rng(3)
    g = ctc_graph([[1, 1, 2], [3], [], [2, 4, 2, 4]], blank=0)
    lat = Lattice.of(g)
    X = _scores(lat, rng, 20)
    X[:, rng.random(X.shape[1]) < 0.2] = -np.inf  # some labels impossible throughout
    X[rng.random(X.shape) < 0.05] = -np.inf
    (ll, post), (ll_ref, post_ref) = _both(lat, X, np.array([20, 7, 0, 9]))
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)


def test_long_input_extreme_scores():
    lat, rng = _lattice(1, n=3)
    T = 5000
    X = _scores(lat, rng, T, scale=1e4)
    lengths = np.array([T, T // 2, 17])
    (ll, post), (ll_ref, post_ref) = _both(lat, X, lengths)
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-9)
    for n in range(3):  # per-frame posterior sums stay at 1 (or 0 where impossible)
        sums = post[: lengths[n], lat.col_seq == n].sum(axis=1)
        if np.isfinite(ll[n]):
            np.testing.assert_allclose(sums, 1.0, atol=1e-9)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_plus_inf_scores_give_nan(bad):
    lat, rng = _lattice(2)
    X = _scores(lat, rng, 10)
    lengths = np.full(lat.num_sequences, 10)
    hit = int(np.flatnonzero(lat.col_seq == 1)[0])
    X[4, hit] = bad
    (ll, post), (ll_ref, _) = _both(lat, X, lengths)
    assert np.isnan(ll[1]) and np.isnan(ll_ref[1])
    others = np.arange(lat.num_sequences) != 1
    np.testing.assert_allclose(ll[others], ll_ref[others], rtol=1e-12)  # no leak into other sequences
    assert np.isnan(post[:, lat.col_seq == 1]).any()
    assert not np.isnan(post[:, lat.col_seq != 1]).any()


def test_nan_past_a_length_is_ignored():
    lat, rng = _lattice(4)
    X = _scores(lat, rng, 10)
    lengths = np.full(lat.num_sequences, 6)
    X[6:] = np.nan
    (ll, post), (ll_ref, post_ref) = _both(lat, X, lengths)
    assert np.isfinite(ll).any()
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    np.testing.assert_allclose(post[:6], post_ref[:6], atol=1e-12)
    assert not post[6:].any()


def test_threads_match_one_thread(monkeypatch):
    lat, rng = _lattice(5, n=9)
    X = _scores(lat, rng, 30)
    lengths = rng.integers(0, 31, size=9)
    before = engines.get_num_threads()
    engines.set_num_threads(1)
    try:
        one = numba_log.forward_backward(lat, X.copy(), lengths)
        monkeypatch.setattr(numba_log, "_MIN_PARALLEL_WORK", 0)
        engines.set_num_threads(3)
        calls = []
        run = numba_log._run
        monkeypatch.setattr(numba_log, "_run", lambda n0, n1, *a: calls.append((n0, n1)) or run(n0, n1, *a))
        three = numba_log.forward_backward(lat, X.copy(), lengths)
        assert len(calls) == 3 and sorted(calls)[0][0] == 0 and sorted(calls)[-1][1] == 9
    finally:
        engines.set_num_threads(before)
    np.testing.assert_array_equal(one[0], three[0])
    np.testing.assert_array_equal(one[1], three[1])


def test_select_picks_numba_without_leaky_only(monkeypatch):
    lat, rng = _lattice(6)
    X = _scores(lat, rng, 5)
    assert select(lat, X) == "numba"
    assert select(lat, X, leaky=(0.1, np.zeros(lat.num_states))) == "numpy"
    assert select(lat, X, op="best_path") == "numpy"
    with pytest.raises(ValueError, match="without leaky"):
        select(lat, X, engine="numba", leaky=(0.1, np.zeros(lat.num_states)))
    monkeypatch.setattr(numba_log, "numba", None)
    assert select(lat, X) == "numpy"
    with pytest.raises(ValueError, match=r'pip install "chainfb\[jit\]"'):
        select(lat, X, engine="numba")


@pytest.mark.parametrize("scale", [30.0, 300.0, 3000.0])
def test_tight_alignments_with_peaky_scores(scale):
    # blank far more likely than every label, and barely enough frames for
    # the labels: the one surviving alignment has alphas and betas that are
    # hundreds to thousands of nats below the frame's best (dead-end) states,
    # so cells leave the scaled range and come back (the log-domain path)
    rng = np.random.default_rng(int(scale))
    labels = [[1, 2, 3, 4, 5, 6, 7, 8], [2, 2, 3], [4, 1, 4, 1, 4]]
    lat = Lattice.of(ctc_graph(labels, blank=0))
    T = 12
    x = rng.normal(size=(3, T, 9))
    x[:, :, 0] += 3.0
    x *= scale
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    lengths = np.array([8, 4, 12])
    (ll, post), (ll_ref, post_ref) = _both(lat, X, lengths)
    assert np.isfinite(ll).all()
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-10)
    for n in range(3):
        np.testing.assert_allclose(post[: lengths[n], lat.col_seq == n].sum(axis=1), 1.0, atol=1e-10)


def test_log_domain_paths_alone_give_the_same_numbers(monkeypatch):
    # run the engine's Python source (not the compiled code) with thresholds
    # that send every cell and every frame down the exact log-domain paths
    for name in ("_logval", "_lse_push", "_store", "_normalise", "_fast_sum", "_slow_cell", "_frame", "_run"):
        monkeypatch.setattr(numba_log, name, getattr(numba_log, name).py_func)
    monkeypatch.setattr(numba_log, "_SAFE", 1e300)
    monkeypatch.setattr(numba_log, "_LOG_SAFE", float(np.log(1e300)))
    monkeypatch.setattr(numba_log, "_SAFE_TOTAL", 1e300)
    lat, rng = _lattice(8, n=4)
    X = _scores(lat, rng, 9, scale=5.0)
    X[2, 3] = -np.inf
    lengths = np.array([9, 4, 0, 7])
    (ll, post), (ll_ref, post_ref) = _both(lat, X, lengths)
    np.testing.assert_array_equal(np.isneginf(ll), np.isneginf(ll_ref))
    fin = np.isfinite(ll_ref)
    np.testing.assert_allclose(ll[fin], ll_ref[fin], rtol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)
