"""Arcs that span frames through the CUDA kernels, run on the CPU (the
kernel emulation of tests/emulation): the per-sequence kernels (engine.cu)
and the shared-graph kernels (shared_graph.cu) against path enumeration and
the float64 loop reference (tests/oracles/fst.py) on random graphs with
spans 1..4 (spanning self-loops, several finals, -inf arcs), unequal and
zero lengths, float32 and float64; the two kernels giving the same bits;
NaN kept in its sequence; log-domain exactness for arcs from far back;
out-of-range device lengths; the leaky HMM refused."""

import types

import numpy as np
import pytest

from chainfb import Fst, FstBatch, Lattice
from chainfb import engines
from chainfb.engines.cuda import forward_backward as lattice_forward_backward
from chainfb.engines.cuda_shared import forward_backward as shared_forward_backward
from chainfb.engines.numpy_log import forward_backward as forward_backward_numpy
from chainfb.testing import random_fst

from emulation import find_compiler, run_on
from oracles.fst import brute_force, brute_force_best, frame_arcs, reference_forward_backward

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")

#: the kernel engines that run spans, from the engines' capability table
ENGINES = {name: {"cuda": lattice_forward_backward, "cuda_shared": shared_forward_backward}[name]
           for name in engines.engines_with(device="gpu", spans=True)}


@pytest.fixture
def be(emulated_backend):
    return emulated_backend


def span_fst(rng, num_states=4, num_arcs=10, num_pdfs=3, max_span=4, num_finals=2) -> Fst:
    """A random acceptor whose arcs span 1..max_span frames (self-loops
    among them, some spanning), one arc at -inf."""
    f = random_fst(rng, num_states=num_states, num_arcs=num_arcs, num_pdfs=num_pdfs, num_finals=num_finals)
    span = rng.integers(1, max_span + 1, f.num_arcs)
    span[0] = max_span  # the first arcs are self-loops (random_fst): one spans max_span frames
    lp = f.log_prob.copy()
    lp[-1] = -np.inf
    arcs = [(int(s), int(d), int(p), float(w), int(k)) for s, d, p, w, k in zip(f.src, f.dst, f.pdf, lp, span)]
    finals = {int(s): float(w) for s, w in enumerate(f.final) if w > -np.inf}
    return Fst.from_arcs(arcs, finals, start=f.start, num_states=f.num_states)


def sequence_scores(lat, X, n, num_pdfs):
    """Sequence ``n``'s scores ``[T, num_pdfs]`` over pdfs from the compact
    ``X [T, C]`` (pdfs without a column get 0: no arc reads them)."""
    scores = np.zeros((X.shape[0], num_pdfs))
    cols = np.flatnonzero(lat.col_seq == n)
    scores[:, lat.col_pdf[cols]] = X[:, cols]
    return scores


def oracle(lat, fsts, seq_graph, X, lengths, oracle_fn, num_pdfs):
    """``(loglike [N], post [T, C])`` of every sequence by ``oracle_fn``
    (``brute_force`` or ``reference_forward_backward``)."""
    N = len(lengths)
    ll = np.empty(N)
    post = np.zeros_like(X, dtype=np.float64)
    for n in range(N):
        fst = fsts[seq_graph[n]]
        L = int(lengths[n])
        ll[n], p = oracle_fn(fst, sequence_scores(lat, X, n, num_pdfs), L)
        cols = np.flatnonzero(lat.col_seq == n)
        post[:, cols] = p[:, lat.col_pdf[cols]]
    return ll, post


def check(be, name, lat, fsts, seq_graph, X, lengths, dtype, block, oracle_fn=brute_force, num_pdfs=3, tol=None):
    """Engine ``name`` on ``X`` (as ``dtype``) against the oracle; returns
    its ``(loglike, post)``."""
    ll, post = oracle(lat, fsts, seq_graph, X, lengths, oracle_fn, num_pdfs)
    Xe = X.astype(dtype)
    lle, poste = ENGINES[name](be, lat, Xe.copy(), lengths, block_size=block)
    assert lle.dtype == dtype and poste.dtype == dtype and poste.shape == X.shape
    np.testing.assert_array_equal(np.isneginf(lle), np.isneginf(ll))
    tol = tol if tol is not None else (1e-10 if dtype == np.float64 else 3e-5)
    fin = np.isfinite(ll)
    np.testing.assert_allclose(lle[fin], ll[fin], rtol=tol, atol=tol)
    np.testing.assert_allclose(poste, post, rtol=tol, atol=tol)
    assert not poste[:, np.isneginf(ll)[lat.col_seq]].any()
    past = np.arange(X.shape[0])[:, None] >= np.asarray(lengths)[lat.col_seq][None, :]
    assert not poste[past].any()
    return lle, poste


def per_sequence_case(seed, N=6, T=7, max_span=4):
    rng = np.random.default_rng(seed)
    fsts = [span_fst(rng, num_states=int(rng.integers(2, 5)), num_arcs=int(rng.integers(5, 11)), max_span=max_span)
            for _ in range(N)]
    lat = Lattice.of(FstBatch(fsts))
    X = rng.normal(size=(T, lat.num_columns))
    lengths = rng.integers(0, T + 1, N)
    lengths[:2] = [T, 0]
    return lat, fsts, np.arange(N), X, lengths


def shared_case(seed, N=5, T=7, max_span=4):
    rng = np.random.default_rng(seed)
    f = span_fst(rng, num_states=4, num_arcs=12, max_span=max_span, num_finals=3)
    lat = Lattice.of(FstBatch([f], np.zeros(N, dtype=np.int64)))
    X = rng.normal(size=(T, lat.num_columns))
    lengths = rng.integers(0, T + 1, N)
    lengths[:2] = [T, 0]
    return lat, [f], np.zeros(N, dtype=np.int64), X, lengths


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("block", [1, 4, 32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_sequence_kernels_match_path_enumeration(be, seed, block, dtype):
    lat, fsts, sg, X, lengths = per_sequence_case(seed)
    assert lat.max_span > 1
    ll, _ = check(be, "cuda", lat, fsts, sg, X, lengths, dtype, block)
    assert np.isfinite(ll).any()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("block", [1, 4, 32])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_shared_graph_kernels_match_path_enumeration_and_the_per_sequence_bits(be, seed, block, dtype):
    lat, fsts, sg, X, lengths = shared_case(seed)
    assert lat.max_span > 1 and lat.shared_fst is not None
    lls, posts = check(be, "cuda_shared", lat, fsts, sg, X, lengths, dtype, block)
    llk, postk = lattice_forward_backward(be, lat, X.astype(dtype), lengths, block_size=block)
    np.testing.assert_array_equal(lls, llk)  # same arithmetic in both kernels: the same bits
    np.testing.assert_array_equal(posts, postk)
    assert np.isfinite(lls).any()


@pytest.mark.parametrize("max_span", [2, 3, 4])
def test_longer_sequences_match_the_loop_reference(be, max_span):
    """Lengths well past the spans (the ring of beta rows wraps many times)."""
    rng = np.random.default_rng(10 + max_span)
    fsts = [span_fst(rng, num_states=5, num_arcs=14, max_span=max_span, num_finals=3) for _ in range(4)]
    lat = Lattice.of(FstBatch(fsts))
    T = 23
    X = rng.normal(size=(T, lat.num_columns))
    lengths = np.array([23, 17, 1, 12])
    ll, _ = check(be, "cuda", lat, fsts, np.arange(4), X, lengths, np.float64, 4, reference_forward_backward)
    assert np.isfinite(ll).sum() >= 2


def test_block_size_does_not_change_the_bits(be):
    lat, fsts, sg, X, lengths = per_sequence_case(7)
    runs = [lattice_forward_backward(be, lat, X.copy(), lengths, block_size=b) for b in (1, 3, 8, 64)]
    for ll, post in runs[1:]:
        assert np.array_equal(ll, runs[0][0]) and np.array_equal(post, runs[0][1])


def test_spanning_self_loop_and_exact_landing(be):
    """0 -(pdf 0, span 3)-> 0 self-loop, 0 -(pdf 1, span 2)-> 1 final: a path
    exists for lengths 2, 5, 8 (3i + 2) only; the posterior of the self-loop
    is 1 at frames 0, 3, ... and the exit's at L - 2."""
    f = Fst.from_arcs([(0, 0, 0, -0.25, 3), (0, 1, 1, -0.5, 2)], {1: 0.1})
    N, T = 9, 8
    lat = Lattice.of(FstBatch([f], np.zeros(N, dtype=np.int64)))
    X = np.zeros((T, lat.num_columns))
    lengths = np.arange(N)
    for name in ENGINES:
        ll, post = ENGINES[name](be, lat, X.copy(), lengths, block_size=2)
        for L in range(N):
            cols = lat.col_seq == L
            if L >= 2 and (L - 2) % 3 == 0:
                loops = (L - 2) // 3
                np.testing.assert_allclose(ll[L], -0.25 * loops - 0.5 + 0.1, rtol=1e-14)
                want = np.zeros((T, 2))
                want[np.arange(loops) * 3, 0] = 1.0
                want[L - 2, 1] = 1.0
                np.testing.assert_allclose(post[:, cols], want[:, lat.col_pdf[cols]], atol=1e-14)
            else:
                assert ll[L] == -np.inf and not post[:, cols].any()


def test_nan_stays_in_its_sequence(be):
    lat, fsts, sg, X, lengths = shared_case(8, N=4, T=6, max_span=3)
    lengths = np.array([6, 5, 4, 6])
    K = lat.num_columns // 4
    X[0, 1 * K] = np.nan  # frame 0 of sequence 1: every arc of that column read there lands by frame 3 <= 5
    X[5, 2 * K + 1] = np.nan  # past sequence 2's length: ignored
    for name in ENGINES:
        for dtype in (np.float64, np.float32):
            ll, post = ENGINES[name](be, lat, X.astype(dtype), lengths, block_size=4)
            assert np.isnan(ll[1]) and not np.isnan(ll[[0, 2, 3]]).any()
            cols1 = lat.col_seq == 1
            assert np.isnan(post[:5, cols1]).all() and not post[5:, cols1].any()
            assert not np.isnan(post[:, ~cols1]).any()
            lln, postn = forward_backward_numpy(lat, X.copy(), lengths)  # the same NaN pattern as NumPy
            np.testing.assert_array_equal(np.isnan(ll), np.isnan(lln))
            np.testing.assert_array_equal(np.isnan(post), np.isnan(postn))
            keep = np.array([0, 2, 3])
            Xc = X.copy()
            Xc[:, cols1] = 0.0
            ref_ll, ref_post = oracle(lat, fsts, sg, Xc, lengths, brute_force, 3)
            tol = 1e-10 if dtype == np.float64 else 3e-5
            fin = np.isfinite(ref_ll[keep])
            np.testing.assert_allclose(ll[keep][fin], ref_ll[keep][fin], rtol=tol, atol=tol)
            np.testing.assert_allclose(post[:, ~cols1], ref_post[:, ~cols1], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_arcs_from_far_back_are_exact(be, dtype):
    """Scores of hundreds of nats per frame: the log domain carries an arc
    that skips 4 frames exactly (no scaled product to underflow)."""
    rng = np.random.default_rng(20)
    f = span_fst(rng, num_states=4, num_arcs=12, max_span=4, num_finals=3)
    lat = Lattice.of(FstBatch([f], np.zeros(3, dtype=np.int64)))
    T = 12
    X = rng.normal(size=(T, lat.num_columns)) * 150.0 - 300.0
    lengths = np.array([12, 9, 11])
    tol = 1e-9 if dtype == np.float64 else 1e-4
    ll, _ = check(be, "cuda_shared", lat, [f], np.zeros(3, dtype=np.int64), X, lengths, dtype, 4,
                  reference_forward_backward, tol=tol)
    # totals far below what a float32 (or, for the longest, float64) probability can hold
    assert np.isfinite(ll).any() and (ll[np.isfinite(ll)] < -400).all()


def asan_cases(be):
    """Span cases for the AddressSanitizer run of test_cuda_emulated.py."""
    for block in (1, 3):
        lat, fsts, sg, X, lengths = per_sequence_case(30, N=3, T=5)
        check(be, "cuda", lat, fsts, sg, X, lengths, np.float64, block)
        lat, fsts, sg, X, lengths = shared_case(31, N=3, T=5)
        check(be, "cuda_shared", lat, fsts, sg, X, lengths, np.float64, block)
    out_of_range_lengths(be)


def out_of_range_lengths(be):
    """Device lengths past T or negative, spans reaching past T: as the
    clamped lengths (the kernels alone keep every access in bounds)."""
    T = 5
    bad = np.array([T + 9, -4, 3, 2**40])
    ok = np.clip(bad, 0, T)
    for name, case in (("cuda", per_sequence_case), ("cuda_shared", shared_case)):
        lat, fsts, sg, X, _ = case(40, N=4, T=T)
        for block in (1, 4):
            ll, post = ENGINES[name](be, lat, X.copy(), bad, block_size=block)
            llr, postr = ENGINES[name](be, lat, X.copy(), ok, block_size=block)
            np.testing.assert_array_equal(ll, llr)
            np.testing.assert_array_equal(post, postr)
        check(be, name, lat, fsts, sg, X, ok, np.float64, 4)


def test_out_of_range_device_lengths(be, monkeypatch):
    from test_cuda_emulated_nan_bounds import device_inputs

    device_inputs(monkeypatch.setattr)
    out_of_range_lengths(be)


def test_leaky_hmm_is_refused_with_spans(be):
    lat, *_ = shared_case(50, N=2)
    X = np.zeros((7, lat.num_columns))
    leaky = (0.1, np.full(lat.num_states, -1.0))
    for name in ENGINES:
        with pytest.raises(ValueError, match="leaky"):
            ENGINES[name](be, lat, X.copy(), np.array([7, 3]), leaky=leaky)


def test_dispatch_runs_spans_on_both_kernel_engines(be):
    """engines.forward_backward runs spanning arcs on the kernel engines
    (cuda and cuda_shared run spans by the capability table)."""
    assert set(ENGINES) == {"cuda", "cuda_shared"}
    lat, fsts, sg, X, lengths = shared_case(60, N=3, T=6)
    ll, post = oracle(lat, fsts, sg, X, lengths, brute_force, 3)
    with run_on(be):
        for name in ("auto", "cuda", "cuda_shared"):
            before = len(be.launches)
            lle, poste = engines.forward_backward(lat, X.copy(), lengths, engine=name)
            want = "fb" if name == "cuda" else "fb_shared"
            assert {n.split("<")[0] for n, _, _ in be.launches[before:]} == {f"chainfb::{want}_recursion",
                                                                                f"chainfb::{want}_posteriors"}
            fin = np.isfinite(ll)
            np.testing.assert_array_equal(np.isneginf(lle), np.isneginf(ll))
            np.testing.assert_allclose(lle[fin], ll[fin], rtol=1e-10)
            np.testing.assert_allclose(poste, post, rtol=1e-10, atol=1e-12)


def test_best_path_of_kernel_scores(be):
    """Viterbi of scores on the device runs on the host through the NumPy
    engine: with spans it does so only where that engine runs spans, and
    then matches enumeration (the arc read at each frame, -1 inside a
    spanning arc); elsewhere it is refused."""
    lat, fsts, sg, X, lengths = per_sequence_case(70, N=4, T=6)
    with run_on(be):
        if not engines.CAPABILITIES["numpy"].spans:
            with pytest.raises(ValueError, match="span"):
                engines.best_path(lat, X.copy(), lengths, engine="cuda")
            return
        score, arcs = engines.best_path(lat, X.copy(), lengths, engine="cuda")
    for n in range(len(lengths)):
        L = int(lengths[n])
        best, path = brute_force_best(fsts[n], sequence_scores(lat, X, n, 3), L)
        if best == -np.inf:
            assert score[n] == -np.inf and (arcs[n] == -1).all()
            continue
        np.testing.assert_allclose(score[n], best, rtol=1e-12)
        local = np.where(arcs[n, :L] >= 0, arcs[n, :L] - lat.batch.arc_offsets[sg[n]], -1)
        np.testing.assert_array_equal(local, frame_arcs(fsts[n], path, L))
        assert (arcs[n, L:] == -1).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernels_match_the_numpy_engine(be, dtype):
    """Both kernels against the NumPy engine on longer sequences (the
    per-sequence kernels on several graphs, the shared ones on one)."""
    rng = np.random.default_rng(80)
    fsts = [span_fst(rng, num_states=6, num_arcs=18, max_span=4, num_finals=3) for _ in range(3)]
    T = 30
    tol = 1e-10 if dtype == np.float64 else 5e-5
    for name, sg in (("cuda", np.array([0, 1, 2, 0])), ("cuda_shared", np.zeros(4, dtype=np.int64))):
        lat = Lattice.of(FstBatch(fsts if name == "cuda" else fsts[:1], sg))
        X = rng.normal(size=(T, lat.num_columns))
        lengths = np.array([30, 22, 0, 27])
        ll, post = forward_backward_numpy(lat, X.copy(), lengths)
        lle, poste = ENGINES[name](be, lat, X.astype(dtype), lengths, block_size=8)
        assert np.isfinite(ll).sum() >= 2
        np.testing.assert_array_equal(np.isneginf(lle), np.isneginf(ll))
        fin = np.isfinite(ll)
        np.testing.assert_allclose(lle[fin], ll[fin], rtol=tol, atol=tol)
        np.testing.assert_allclose(poste, post, rtol=tol, atol=tol)


class _PoisonedNumpy:
    """NumPy whose ``empty`` fills float arrays with NaN."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype=float, **kw):
        out = np.empty(shape, dtype=dtype, **kw)
        if out.dtype.kind == "f":
            out.fill(np.nan)
        return out


def test_unwritten_rows_are_never_read(be):
    """The alpha rows and the ring of beta rows the kernels allocate start as
    NaN: results still match enumeration, so no row is read before it is
    written (rows past a length, ring rows not yet filled)."""
    poisoned = types.SimpleNamespace(xp=_PoisonedNumpy(), launch=be.launch, cache_key=lambda: ("poisoned", id(be)))
    for seed in (90, 91):
        for name, case in (("cuda", per_sequence_case), ("cuda_shared", shared_case)):
            lat, fsts, sg, X, lengths = case(seed)
            check(poisoned, name, lat, fsts, sg, X, lengths, np.float64, 3)
