"""The compiled engine's live bands (:mod:`chainfb.engines.numba_log`: each
frame computes and stores only the states between the first and the last
that are reachable from the start in at most ``t`` arcs and reach a final
state in at most ``L - t``, in blocks of states with a log reference each): graphs whose state numbering is not
along the graph, finals reachable only at some lengths, unequal and zero lengths, NaN
and infinite scores -- against the NumPy engine, plain loops and path
enumeration."""

import numpy as np
import pytest

from chainfb import Fst, FstBatch, ctc_graph
from chainfb.engines import numba_log, numpy_log
from chainfb.lattice import Lattice
from chainfb.score_map import PdfScoreMap

from oracles.fst import brute_force, reference_forward_backward

pytestmark = pytest.mark.skipif(not numba_log.available(), reason="needs Numba")


@pytest.fixture(autouse=True, params=[(5, 4.0), (1, np.inf), (0, np.inf)], ids=["blocks32", "blocks2", "blocks1"])
def block_size(request, monkeypatch):
    """Every test with the default blocks, and with blocks of 2 and 1 states
    kept however far their arcs reach (each arc between blocks rescaled),
    each frame's emissions formed inside the pass."""
    monkeypatch.setattr(numba_log, "_BLOCK_SHIFT", request.param[0])
    monkeypatch.setattr(numba_log, "_MAX_BLOCK_SPREAD", request.param[1])
    monkeypatch.setattr(numba_log, "_MIN_BLOCKED_STATES", 0 if request.param[0] < 5 else 512)
    if request.param[0] < 5:  # and the emissions formed inside the pass
        monkeypatch.setattr(numba_log, "_EMISSIONS_BYTES", -1)


def _permuted(fst: Fst, rng) -> Fst:
    """The same graph with its states renumbered at random."""
    perm = rng.permutation(fst.num_states)
    return Fst(fst.num_states, int(perm[fst.start]), perm[fst.src], perm[fst.dst], fst.pdf, fst.log_prob,
               fst.final[np.argsort(perm)])


def _chain(rng, states, pdfs, parity=False):
    """A left-to-right graph with self-loops and skips (``parity``: a ring of
    two-arc steps whose final is reachable only at even lengths)."""
    arcs = []
    for s in range(states - 1):
        if not parity:
            arcs.append((s, s, int(rng.integers(pdfs)), float(rng.normal())))
        arcs.append((s, s + 1, int(rng.integers(pdfs)), float(rng.normal())))
        if s + 2 < states and not parity:
            arcs.append((s, s + 2, int(rng.integers(pdfs)), float(rng.normal())))
    if parity:
        arcs.append((states - 1, 0, int(rng.integers(pdfs)), 0.0))
    finals = {states - 1: float(rng.normal())} if not parity else {0: 0.0}
    return Fst.from_arcs(arcs, finals, start=0, num_states=states)


def _run_all(fsts, x, lengths):
    lat = Lattice.of(FstBatch(fsts))
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    a = numba_log.forward_backward(lat, X.copy(), lengths)
    b = numpy_log.forward_backward(lat, X.copy(), lengths)
    return lat, a, b


def _dense(lat, post, n, T, P):
    out = np.zeros((T, P))
    cols = np.flatnonzero(lat.col_seq == n)
    out[:, lat.col_pdf[cols]] = post[:, cols]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_permuted_numbering_matches_numpy_and_loops(seed):
    rng = np.random.default_rng(seed)
    P, T = 4, 11
    base = [_chain(rng, 7, P), _chain(rng, 5, P, parity=True), _chain(rng, 9, P)]
    fsts = base + [_permuted(f, rng) for f in base]
    lengths = np.array([T, 6, 3, T, 6, 0])
    x = rng.normal(scale=2.0, size=(len(fsts), T, P))
    x[3:] = x[:3]  # the renumbered graphs read the same scores
    lat, (ll, post), (ll_ref, post_ref) = _run_all(fsts, x, lengths)
    np.testing.assert_array_equal(np.isneginf(ll), np.isneginf(ll_ref))
    fin = np.isfinite(ll_ref)
    np.testing.assert_allclose(ll[fin], ll_ref[fin], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)
    for n, f in enumerate(fsts):
        ref, ref_post = reference_forward_backward(f, x[n], lengths[n])
        assert (ll[n] == -np.inf) == (ref == -np.inf)
        if ref > -np.inf:
            np.testing.assert_allclose(ll[n], ref, rtol=1e-10)
            np.testing.assert_allclose(_dense(lat, post, n, T, P), ref_post, atol=1e-10)
    # a renumbered graph gives the numbers of the original
    np.testing.assert_allclose(ll[3:5], ll[:2], rtol=1e-12)


def test_finals_reachable_only_at_even_lengths():
    rng = np.random.default_rng(7)
    P, T = 3, 9
    f = _chain(rng, 3, P, parity=True)  # a ring of 3 states: final at lengths 0, 3, 6, 9
    fsts = [f, _permuted(f, rng)] * 5
    lengths = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    x = rng.normal(size=(len(fsts), T, P))
    lat, (ll, post), (ll_ref, post_ref) = _run_all(fsts, x, lengths)
    assert np.isfinite(ll[lengths % 3 == 0]).all() and np.isneginf(ll[lengths % 3 != 0]).all()
    np.testing.assert_allclose(ll[lengths % 3 == 0], ll_ref[lengths % 3 == 0], rtol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)
    assert not post[:, np.isin(lat.col_seq, np.flatnonzero(lengths % 3 != 0))].any()


@pytest.mark.parametrize("seed", range(4))
def test_small_random_graphs_against_enumeration(seed):
    rng = np.random.default_rng(50 + seed)
    P, T = 3, 5
    fsts = []
    for _ in range(4):
        S = int(rng.integers(2, 6))
        A = int(rng.integers(3, 10))
        src, dst = rng.integers(0, S, A), rng.integers(0, S, A)
        fsts.append(Fst(S, int(rng.integers(S)), src, dst, rng.integers(0, P, A), rng.normal(size=A),
                        np.where(rng.random(S) < 0.4, rng.normal(size=S), -np.inf)))
    lengths = rng.integers(0, T + 1, len(fsts))
    x = rng.normal(size=(len(fsts), T, P))
    lat, (ll, post), _ = _run_all(fsts, x, lengths)
    for n, f in enumerate(fsts):
        ref, ref_post = brute_force(f, x[n], lengths[n])
        assert (ll[n] == -np.inf) == (ref == -np.inf), (n, ll[n], ref)
        if ref > -np.inf:
            np.testing.assert_allclose(ll[n], ref, rtol=1e-10)
            np.testing.assert_allclose(_dense(lat, post, n, T, P), ref_post, atol=1e-10)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_in_a_column_read_only_by_dead_states(bad):
    # state 3 is reachable but can never reach the final state: its column
    # is read only outside the band; the sequence's loglike is still NaN
    # (NaN in, NaN out), the other sequence's numbers are unchanged
    arcs = [(0, 0, 0, -0.5), (0, 1, 1, -0.3), (1, 1, 0, -0.2), (0, 3, 2, -1.0), (3, 3, 2, 0.0)]
    f = Fst.from_arcs(arcs, {1: 0.0}, start=0, num_states=4)
    rng = np.random.default_rng(3)
    T = 6
    x = rng.normal(size=(2, T, 3))
    x[0, 4, 2] = bad
    lat, (ll, post), (ll_ref, post_ref) = _run_all([f, f], x, np.array([T, T]))
    assert np.isnan(ll[0]) and np.isnan(ll_ref[0])
    np.testing.assert_allclose(ll[1], ll_ref[1], rtol=1e-12)
    assert np.isnan(post[:, lat.col_seq == 0]).any()
    np.testing.assert_allclose(post[:, lat.col_seq == 1], post_ref[:, lat.col_seq == 1], atol=1e-12)


def test_long_ctc_band_with_log_domain_cells():
    # many labels over barely more frames: a narrow band whose cells span
    # thousands of nats (scaled, log-kept, and frames with a tiny total)
    rng = np.random.default_rng(11)
    labels = [list(rng.integers(1, 20, 300)), list(rng.integers(1, 20, 120)), []]
    lat = Lattice.of(ctc_graph(labels, blank=0))
    T = 420
    x = rng.normal(scale=3.0, size=(3, T, 20))
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    lengths = np.array([T, 300, 7])
    (ll, post) = numba_log.forward_backward(lat, X.copy(), lengths)
    (ll_ref, post_ref) = numpy_log.forward_backward(lat, X.copy(), lengths)
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-11)
    np.testing.assert_allclose(post, post_ref, atol=1e-9)
    for n in range(3):
        np.testing.assert_allclose(post[: lengths[n], lat.col_seq == n].sum(axis=1), 1.0, atol=1e-9)
