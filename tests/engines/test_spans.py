"""Arcs that span several frames, in every engine that runs them.

An arc read at frame ``t`` scores ``log_prob + X[t, col]`` and lands at
frame ``t + span``; a path ends exactly at the sequence's length.  Each
engine is checked against path enumeration (``tests/oracles/fst.py``) on
random small graphs -- spans 1 to 4, self-loops (spanning ones included),
several finals, ``-inf`` arcs, unequal and zero lengths, NaN in one
sequence --, through the public functions (the engine :func:`select`
picks) and through ``chainfb.engines.forward_backward(..., engine=name)``
for each name in :data:`ENGINES_WITH_SPANS`.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chainfb
from chainfb import Fst, FstBatch, engines
from chainfb.lattice import Lattice
from chainfb.score_map import PdfScoreMap
from chainfb.testing import random_fst
from oracles.fst import brute_force, brute_force_best, expanded_span_one, frame_arcs, reference_forward_backward

#: the engines run by the engine-level forward-backward tests (per-sequence graphs, on the CPU), from the
#: engines' capability table
ENGINES_WITH_SPANS = list(engines.engines_with(device="cpu", spans=True, shared_graph_only=False))
#: ... and by the best-path tests (the engines with a max-semiring pass)
VITERBI_ENGINES_WITH_SPANS = list(engines.engines_with(device="cpu", spans=True, shared_graph_only=False,
                                                       viterbi=True))

FUZZ = settings(max_examples=40, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

P = 3  # pdfs of the random graphs


def random_span_fst(rng, num_states=4, num_arcs=8, max_span=4, num_finals=2) -> Fst:
    """A small random graph whose arcs span 1 to ``max_span`` frames: a
    quarter of the arcs are self-loops (some spanning), one arc in eight has
    weight ``-inf``, several finals, a random start."""
    src = rng.integers(0, num_states, num_arcs)
    dst = rng.integers(0, num_states, num_arcs)
    loops = max(1, num_arcs // 4)
    dst[:loops] = src[:loops]
    span = rng.integers(1, max_span + 1, num_arcs)
    lp = rng.normal(size=num_arcs) - 0.5
    lp[rng.random(num_arcs) < 0.125] = -np.inf
    pdf = rng.integers(0, P, num_arcs)
    finals = {int(s): float(rng.normal()) for s in rng.choice(num_states, size=num_finals, replace=False)}
    return Fst.from_arcs(zip(src, dst, pdf, lp, span), finals, start=int(rng.integers(0, num_states)),
                         num_states=num_states)


def _case(seed, N=4, T=7):
    rng = np.random.default_rng(seed)
    fsts = [random_span_fst(rng, num_states=int(rng.integers(2, 5)), num_arcs=int(rng.integers(3, 10)),
                            num_finals=int(rng.integers(1, 3))) for _ in range(N)]
    if all(f.max_span == 1 for f in fsts):
        fsts[0] = Fst.from_arcs([(0, 0, 1, -0.2, 3), (0, 1, 0, -0.1, 2)], {0: 0.0, 1: -0.3})
    x = rng.normal(scale=2.0, size=(N, T, P))
    lengths = np.array([T, int(rng.integers(0, T + 1)), 0, int(rng.integers(1, T))][:N])
    return fsts, x, lengths


# ---------------------------------------------------------------- running an engine

def _on_engine(name, X):
    """``X`` where engine ``name`` reads it (CuPy for the CUDA engines)."""
    if name in ("cuda", "cuda_shared"):
        cp = pytest.importorskip("cupy")
        return cp.asarray(X)
    return X


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _engine_fb(name, fsts, x, lengths):
    """``(loglike [N], posteriors [N, T, P])`` through ``engines.forward_backward(engine=name)``."""
    lat = Lattice.of(FstBatch(fsts))
    smap = PdfScoreMap(lat.col_seq, lat.col_pdf)
    X = smap.gather(np, x)
    ll, post = engines.forward_backward(lat, _on_engine(name, X), lengths, engine=name)
    ll, post = _host(ll), _host(post)
    full = np.zeros(x.shape)
    smap.scatter_add(np, full, post, accumulate=False)
    return ll, full


def _engine_best(name, fsts, x, lengths):
    """``(score [N], arcs [N, max(lengths)])`` through ``engines.best_path(engine=name)``, arcs
    as indices into each sequence's own Fst (-1 kept)."""
    batch = FstBatch(fsts)
    lat = Lattice.of(batch)
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    score, arcs = engines.best_path(lat, _on_engine(name, X), lengths, engine=name)
    score, arcs = _host(score), _host(arcs)
    first = batch.arc_offsets[batch.seq_to_graph][:, None]
    return score, np.where(arcs >= 0, arcs - first, -1)


def _public_fb(fsts, x, lengths):
    return chainfb.forward_backward(fsts, x, lengths)


# ---------------------------------------------------------------- checks

def _check_fb(fsts, x, lengths, ll, post, skip=()):
    for n, f in enumerate(fsts):
        if n in skip:
            continue
        Z, g = brute_force(f, x[n], lengths[n])
        if Z == -math.inf:
            assert ll[n] == -np.inf, (n, ll[n])
            assert not post[n].any()
        else:
            assert ll[n] == pytest.approx(Z, abs=1e-9, rel=1e-12), n
            np.testing.assert_allclose(post[n], g, atol=1e-9, err_msg=f"sequence {n}")
    T = x.shape[1]
    assert not post[np.arange(T)[None, :] >= np.asarray(lengths)[:, None]].any()  # zero past each length


def _path_score(f, x, arcs_by_frame, length):
    """The score of a path laid out by read frame (``-1`` inside spanning arcs),
    asserting it is a real path of ``f`` ending exactly at ``length``."""
    s, t, v = f.start, 0, 0.0
    while t < length:
        a = int(arcs_by_frame[t])
        assert a >= 0, f"frame {t} is read by no arc"
        assert f.src[a] == s
        assert (arcs_by_frame[t + 1: t + f.span[a]] == -1).all(), "frames inside a spanning arc are -1"
        v += f.log_prob[a] + x[t, f.pdf[a]]
        s, t = int(f.dst[a]), t + int(f.span[a])
    assert t == length
    return v + f.final[s]


def _check_best(fsts, x, lengths, score, arcs):
    for n, f in enumerate(fsts):
        best, _ = brute_force_best(f, x[n], lengths[n])
        row = np.asarray(arcs[n])
        if best == -math.inf:
            assert score[n] == -np.inf and (row == -1).all()
            continue
        assert score[n] == pytest.approx(best, abs=1e-12)
        # ties may pick another path: the returned one is a real path of the best score
        assert _path_score(f, x[n], row, lengths[n]) == pytest.approx(best, abs=1e-12)
        assert (row[lengths[n]:] == -1).all()


# ---------------------------------------------------------------- against enumeration

@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
@pytest.mark.parametrize("seed", range(10))
def test_engine_forward_backward_against_enumeration(engine, seed):
    fsts, x, lengths = _case(seed)
    ll, post = _engine_fb(engine, fsts, x, lengths)
    _check_fb(fsts, x, lengths, ll, post)


@pytest.mark.parametrize("engine", VITERBI_ENGINES_WITH_SPANS)
@pytest.mark.parametrize("seed", range(10))
def test_engine_best_path_against_enumeration(engine, seed):
    fsts, x, lengths = _case(seed)
    score, arcs = _engine_best(engine, fsts, x, lengths)
    assert arcs.shape == (len(fsts), lengths.max())
    _check_best(fsts, x, lengths, score, arcs)


@pytest.mark.parametrize("seed", range(10))
def test_public_functions_against_enumeration(seed):
    fsts, x, lengths = _case(seed)
    ll, post = chainfb.forward_backward(fsts, x, lengths)
    _check_fb(fsts, x, lengths, ll, post)
    score, paths = chainfb.best_path(fsts, x, lengths)
    for n, f in enumerate(fsts):
        best, path = brute_force_best(f, x[n], lengths[n])
        if best == -math.inf:
            assert score[n] == -np.inf and len(paths[n]) == 0
            continue
        assert score[n] == pytest.approx(best, abs=1e-12)
        # the public paths list the arcs in order, without the covered frames
        row = frame_arcs(f, paths[n], lengths[n])
        assert _path_score(f, x[n], row, lengths[n]) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
def test_spanning_self_loops_count_every_duration(engine):
    # one state, a self-loop of span 2 and one of span 3 on pdf 0 (scores 0): the paths of
    # L frames are the compositions of L into 2s and 3s
    f = Fst.from_arcs([(0, 0, 0, 0.0, 2), (0, 0, 0, 0.0, 3)], {0: 0.0})
    T = 9
    x = np.zeros((T + 1, T, 1))
    lengths = np.arange(T + 1)
    ll, post = _engine_fb(engine, [f] * (T + 1), x, lengths)
    count = [1, 0, 1, 1, 1, 2, 2, 3, 4, 5]  # compositions of L into parts 2 and 3
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(ll, np.log(count), atol=1e-12)
    # every path reads frame 0: its posterior is 1 when a path exists
    np.testing.assert_allclose(post[:, 0, 0], (np.array(count) > 0) & (lengths > 0), atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
def test_nan_in_one_sequence_stays_in_it(engine):
    fsts, x, lengths = _case(3)
    x[0, 1, :] = np.nan
    for run in (lambda: _engine_fb(engine, fsts, x, lengths), lambda: _public_fb(fsts, x, lengths)):
        ll, post = run()
        _check_fb(fsts, x, lengths, ll, post, skip=(0,))
        assert np.isfinite(post[1:]).all()


@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
def test_arcs_landing_past_the_length_are_not_paths(engine):
    # from state 0 an arc of span 3 to a final state; lengths 0..4: only length 3 has a path
    f = Fst.from_arcs([(0, 1, 0, -0.5, 3)], {1: 0.0})
    x = np.zeros((5, 4, 1))
    ll, post = _engine_fb(engine, [f] * 5, x, np.arange(5))
    np.testing.assert_array_equal(ll, [-np.inf, -np.inf, -np.inf, -0.5, -np.inf])
    assert post[3, 0, 0] == pytest.approx(1.0) and post.sum() == pytest.approx(1.0)


# ---------------------------------------------------------------- long inputs, large scores

@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_long_inputs_equal_the_expanded_span_one_graph(engine, scale):
    # arcs reading far back across frames of large scores must neither underflow nor drift
    rng = np.random.default_rng(7)
    fsts = [random_span_fst(rng, num_states=5, num_arcs=14, num_finals=3) for _ in range(3)]
    T = 120
    x = np.concatenate([rng.normal(scale=scale, size=(3, T, P)), np.zeros((3, T, 1))], axis=2)
    lengths = np.array([T, 97, 61])
    ll, post = _engine_fb(engine, fsts, x, lengths)
    ref_ll, ref_post = chainfb.forward_backward([expanded_span_one(f, P) for f in fsts], x, lengths)
    np.testing.assert_array_equal(np.isneginf(ll), np.isneginf(ref_ll))
    fin = np.isfinite(ref_ll)
    assert fin.any()
    np.testing.assert_allclose(ll[fin], ref_ll[fin], rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(post[..., :P], ref_post[..., :P], atol=1e-8)


# ---------------------------------------------------------------- span-1 graphs, mixed batches

@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
def test_span_one_sequences_in_a_spanning_batch(engine):
    rng = np.random.default_rng(5)
    plain = [random_fst(rng, num_states=4, num_arcs=9, num_pdfs=P) for _ in range(2)]
    fsts, x, lengths = _case(8)
    batch = [plain[0], fsts[0], plain[1], fsts[1]]
    ll, post = _engine_fb(engine, batch, x, lengths)
    alone_ll, alone_post = chainfb.forward_backward(plain, x[[0, 2]], lengths[[0, 2]])
    np.testing.assert_allclose(ll[[0, 2]], alone_ll, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(post[[0, 2]], alone_post, atol=1e-12)
    _check_fb(batch, x, lengths, ll, post)


def test_span_one_graphs_keep_their_engine():
    from chainfb.engines import numba_log

    rng = np.random.default_rng(0)
    lat = Lattice.of(FstBatch([random_fst(rng) for _ in range(2)]))
    X = np.zeros((3, lat.num_columns))
    assert lat.max_span == 1
    assert engines.select(lat, X) == ("numba" if numba_log.available() else "numpy")
    assert engines.select(lat, X, "best_path") == "numpy"


# ---------------------------------------------------------------- engine choice and refusals

def test_auto_picks_an_engine_that_runs_spans():
    fsts, x, lengths = _case(0)
    lat = Lattice.of(FstBatch(fsts))
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    assert lat.max_span > 1
    for op in ("forward_backward", "best_path"):
        assert engines.select(lat, X, op) in engines.SPAN_ENGINES
    assert "numpy" in engines.SPAN_ENGINES


@pytest.mark.parametrize("name", engines.engines_with(device="cpu"))
def test_an_engine_without_spans_in_the_table_is_refused_and_never_picked(name, monkeypatch):
    """The capability table drives the choice: an engine whose row says it
    runs no spans is refused by name on a lattice with spans, and
    ``engine="auto"`` picks another one."""
    import dataclasses

    from chainfb.engines import numba_log

    if name == "numba" and not numba_log.available():
        pytest.skip("the compiled engine is not available")
    fsts, x, lengths = _case(0)
    lat = Lattice.of(FstBatch([fsts[0]], seq_to_graph=[0] * len(fsts)))  # one graph: 'shared' may run it
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    assert lat.max_span > 1
    engines.forward_backward(lat, X.copy(), lengths, engine=name)  # runs while its row says spans=True
    monkeypatch.setitem(engines.CAPABILITIES, name, dataclasses.replace(engines.CAPABILITIES[name], spans=False))
    with pytest.raises(ValueError, match=f"engine: '{name}' does not run arcs that span several frames"):
        engines.forward_backward(lat, X.copy(), lengths, engine=name)
    if name != "numpy":  # the last resort stays numpy; with spans taken from it, it is refused there too
        for op in ("forward_backward", "best_path"):
            assert engines.select(lat, X, op) != name


def test_leaky_hmm_with_spans_is_refused():
    fsts, x, lengths = _case(0)
    lat = Lattice.of(FstBatch(fsts))
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    with pytest.raises(ValueError, match="leaky"):
        engines.forward_backward(lat, X, lengths, leaky=(0.1, np.zeros(lat.num_states)), engine="numpy")


def test_numpy_threads_match_serial(monkeypatch):
    from chainfb.engines import numpy_log, threads

    rng = np.random.default_rng(11)
    fsts = [random_span_fst(rng, num_states=5, num_arcs=12) for _ in range(3)]
    batch = FstBatch(fsts, seq_to_graph=[0, 1, 2, 2, 1, 0, 0])
    lat = Lattice.of(batch)
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, rng.normal(size=(7, 9, P)))
    lengths = np.array([9, 3, 0, 9, 5, 1, 8])
    serial = numpy_log._forward_backward_serial(lat, X.copy(), lengths, True, None)
    monkeypatch.setitem(threads.MIN_PARALLEL_WORK, "numpy", 0)
    monkeypatch.setattr(threads, "_num_threads", 3)
    threaded = numpy_log.forward_backward(lat, X.copy(), lengths)
    np.testing.assert_array_equal(threaded[0], serial[0])
    np.testing.assert_array_equal(threaded[1], serial[1])


# ---------------------------------------------------------------- OpenFst text

def test_openfst_text_round_trip_with_spans(tmp_path):
    f = Fst.from_arcs([(0, 1, 0, -0.5, 3), (1, 1, 2, 0.0, 1), (1, 2, 1, -np.inf, 2), (0, 2, 4, 0.0, 1)],
                      {1: 0.0, 2: -1.5})
    text = f.to_openfst_text()
    # every arc in the transducer format, the span as output label, the cost always written
    assert text.splitlines()[:2] == ["0\t1\t1\t3\t0.5", "0\t2\t5\t1\t0"]
    assert "1\t2\t2\t2\tInfinity" in text.splitlines()
    g = Fst.from_openfst_text(text, spans=True)
    assert g.arcs(spans=True) == f.arcs(spans=True) and g.to_openfst_text() == text
    np.testing.assert_array_equal(g.final, f.final)
    f.write(tmp_path / "g.txt")
    h = Fst.read(tmp_path / "g.txt", spans=True)
    assert h.arcs(spans=True) == f.arcs(spans=True)
    with pytest.raises(ValueError, match="spans=True"):
        Fst.from_openfst_text(text)


def test_openfst_text_of_span_one_graphs_is_unchanged():
    f = Fst.from_arcs([(0, 1, 0, -0.5), (1, 1, 2, 0.0)], {1: 0.0})
    text = f.to_openfst_text()
    assert text == "0\t1\t1\t0.5\n1\t1\t3\n1\n"
    assert Fst.from_openfst_text(text, spans=True).arcs(spans=True) == f.arcs(spans=True)


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_openfst_text_spans_must_be_positive(bad):
    with pytest.raises(ValueError, match="output label"):
        Fst.from_openfst_text(f"0 1 1 {bad} 0\n1\n", spans=True)


def test_openfst_text_spans_flag_is_checked():
    with pytest.raises(TypeError, match="spans"):
        Fst.from_openfst_text("0 1 1\n1\n", spans="yes")


# ---------------------------------------------------------------- property tests

SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


@st.composite
def span_fst(draw):
    S = draw(st.integers(1, 4))
    A = draw(st.integers(0, 7))
    arc = st.tuples(st.integers(0, S - 1), st.integers(0, S - 1), st.integers(0, P - 1),
                    st.one_of(st.floats(-3, 1), st.just(-math.inf), st.just(-60.0)), st.integers(1, 4))
    arcs = draw(st.lists(arc, min_size=A, max_size=A))
    finals = draw(st.lists(st.one_of(st.just(-math.inf), st.floats(-2, 1)), min_size=S, max_size=S))
    cols = [np.array(c) for c in zip(*arcs)] if arcs else [np.zeros(0, np.int64)] * 3 + [np.zeros(0)] * 2
    src, dst, pdf, w, span = cols
    return Fst(S, draw(st.integers(0, S - 1)), src.astype(np.int64), dst.astype(np.int64), pdf.astype(np.int64),
               w.astype(np.float64), np.array(finals, dtype=np.float64), span.astype(np.int64))


@st.composite
def span_case(draw):
    N = draw(st.integers(1, 3))
    T = draw(st.integers(0, 6))
    fsts = [draw(span_fst()) for _ in range(N)]
    lengths = np.array(draw(st.lists(st.integers(0, T), min_size=N, max_size=N)))
    x = np.random.default_rng(draw(st.integers(0, 2**31 - 1))).uniform(-4, 4, size=(N, T, P))
    if x.size:
        for _ in range(draw(st.integers(0, 2))):
            x.reshape(-1)[draw(st.integers(0, x.size - 1))] = draw(SPECIAL)
    return fsts, x, lengths


def _check_against_loops(fsts, x, lengths, ll, post):
    assert ll.shape == (len(fsts),) and post.shape == x.shape
    for n, f in enumerate(fsts):
        if not np.isfinite(x[n, :lengths[n]]).all():
            continue  # only this sequence may be NaN
        ref, ref_post = reference_forward_backward(f, x[n], lengths[n])
        if ref == -math.inf:
            assert ll[n] == -np.inf and not post[n].any()
        else:
            np.testing.assert_allclose(ll[n], ref, rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(post[n], ref_post, rtol=1e-7, atol=1e-9)
    T = x.shape[1]
    assert not post[np.arange(T)[None, :] >= lengths[:, None]].any()


@FUZZ
@given(case=span_case())
def test_public_forward_backward_property(case):
    fsts, x, lengths = case
    ll, post = chainfb.forward_backward(fsts, x, lengths)
    _check_against_loops(fsts, x, lengths, ll, post)


@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
@FUZZ
@given(case=span_case())
def test_engine_forward_backward_property(engine, case):
    fsts, x, lengths = case
    ll, post = _engine_fb(engine, fsts, x, lengths)
    _check_against_loops(fsts, x, lengths, ll, post)


@pytest.mark.parametrize("engine", VITERBI_ENGINES_WITH_SPANS)
@FUZZ
@given(case=span_case())
def test_engine_best_path_property(engine, case):
    fsts, x, lengths = case
    finite = [n for n in range(len(fsts)) if np.isfinite(x[n, :lengths[n]]).all()]
    score, arcs = _engine_best(engine, fsts, x, lengths)
    for n in finite:
        best, _ = brute_force_best(fsts[n], x[n], lengths[n])
        if best == -math.inf:
            assert score[n] == -np.inf and (arcs[n] == -1).all()
        else:
            assert score[n] == pytest.approx(best, abs=1e-9)
            assert _path_score(fsts[n], x[n], arcs[n], lengths[n]) == pytest.approx(best, abs=1e-9)


# ---------------------------------------------------------------- long spans cost nothing

def _with_long_arcs(fsts, span):
    """Each graph with two more arcs of ``span`` frames (a self-loop and an
    arc into a final state): longer than every sequence, on no path."""
    out = []
    for f in fsts:
        arcs = f.arcs(spans=True) + [(f.start, f.start, 0, 0.0, span), (f.start, int(np.argmax(f.final)), 1, 0.0, span)]
        out.append(Fst.from_arcs(arcs, {s: float(v) for s, v in enumerate(f.final) if v > -np.inf},
                                 start=f.start, num_states=f.num_states))
    return out


@pytest.mark.parametrize("engine", ENGINES_WITH_SPANS)
@pytest.mark.parametrize("span", [20_000, 10**6, 10**9])
def test_arcs_longer_than_every_sequence_cost_nothing(engine, span):
    """Arcs spanning more frames than the longest sequence are on no path:
    the same numbers as without them (path enumeration), and the memory the
    call allocates does not grow with the span (NumPy's allocations are
    traced; the compiled pass is handed only the spans up to the longest
    length, and sizes its work arrays by them)."""
    import tracemalloc

    from chainfb.engines import numba_log

    fsts, x, lengths = _case(4)
    long = _with_long_arcs(fsts, span)
    assert max(f.max_span for f in long) == span
    _engine_fb(engine, fsts, x, lengths)  # compiled and loaded before the memory is traced
    tracemalloc.start()
    try:
        ll, post = _engine_fb(engine, long, x, lengths)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _check_fb(fsts, x, lengths, ll, post)
    assert peak < 1 << 20, f"{peak} bytes for arcs of span {span} over {lengths.max()} frames"
    if engine == "numba":
        bound = numba_log.arrays.span_bound(Lattice.of(FstBatch(long)), lengths)
        assert bound.max() <= lengths.max() and span not in bound


def test_a_long_duration_costs_no_more_than_a_short_one(monkeypatch):
    """Multi-blank step graphs with big blanks of durations [2, 4] and [2,
    999] over 1000 frames: the compiled pass works with the distinct spans
    (1, 2 and the duration) and is handed arrays of the same total size for
    both -- nothing scales with the duration's value."""
    from chainfb.engines import numba_log
    from chainfb.transducer.graphs import multiblank_graphs

    sizes = {}
    run = numba_log.spanning.run

    def arrays_in(args):  # the arrays among the arguments, those in (named) tuples included
        for a in args:
            if isinstance(a, np.ndarray):
                yield a
            elif isinstance(a, tuple):
                yield from arrays_in(a)

    def counted(*args):
        sizes.setdefault(key, []).append(sum(a.size for a in arrays_in(args)))
        return run(*args)

    monkeypatch.setattr(numba_log.spanning, "run", counted)
    rng = np.random.default_rng(15)
    T, U = 1000, 3
    for key in ((2, 4), (2, 999)):
        lat = Lattice.of(multiblank_graphs(np.array([U, U - 1]), list(key), logit_lengths=np.array([T, T - 1])))
        lengths = np.array([T + U, T - 1 + U - 1])
        X = rng.normal(size=(T + U, lat.num_columns))
        ll, _ = numba_log.forward_backward(lat, X, lengths)
        assert np.isfinite(ll).all()
        assert numba_log.arrays.span_bound(lat, lengths).tolist() == [1, *key]
    assert sizes[2, 4] == sizes[2, 999]


@pytest.mark.parametrize("durations", [[2, 4], [2, 23]])
def test_long_durations_match_the_numpy_engine(durations):
    """Multi-blank step graphs with a duration near the length: the compiled
    pass against the NumPy engine (itself checked against enumeration)."""
    from chainfb.engines import numba_log, numpy_log
    from chainfb.transducer.graphs import multiblank_graphs

    rng = np.random.default_rng(16)
    T, U = 25, 3
    lat = Lattice.of(multiblank_graphs(np.array([U, 2, 0]), durations, logit_lengths=np.array([T, 24, 23])))
    lengths = np.array([T + U, 24 + 2, 23])
    X = rng.normal(scale=3.0, size=(T + U, lat.num_columns))
    ll, post = numba_log.forward_backward(lat, X, lengths)
    ll_ref, post_ref = numpy_log.forward_backward(lat, X, lengths)
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)
