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

pytestmark = pytest.mark.skipif(not numba_log.available(), reason="needs Numba")


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


def _assert_same(got, ref, ll_atol=0.0):
    """``(loglike, posteriors)`` against a reference: the same impossible
    sequences, the finite loglikes to 1e-12, the posteriors to 1e-12."""
    (ll, post), (ll_ref, post_ref) = got, ref
    np.testing.assert_array_equal(np.isneginf(ll), np.isneginf(ll_ref))
    fin = np.isfinite(ll_ref)
    np.testing.assert_allclose(ll[fin], ll_ref[fin], rtol=1e-12, atol=ll_atol)
    np.testing.assert_allclose(post, post_ref, atol=1e-12)


@pytest.mark.parametrize("seed", range(10))
def test_matches_numpy_engine(seed):
    lat, rng = _lattice(seed)
    T = 12
    X = _scores(lat, rng, T)
    lengths = rng.integers(0, T + 1, size=lat.num_sequences)
    (ll, post), (ll_ref, post_ref) = _both(lat, X, lengths)
    _assert_same((ll, post), (ll_ref, post_ref), ll_atol=1e-12)
    fin = np.isfinite(ll_ref)
    assert not post[:, np.isin(lat.col_seq, np.flatnonzero(~fin))].any()  # impossible: zero posteriors
    ll_only, none = numba_log.forward_backward(lat, X.copy(), lengths, need_posteriors=False)
    assert none is None
    np.testing.assert_array_equal(ll_only, ll)


@pytest.mark.parametrize("seed", range(6))
def test_instance_arrays_are_the_lattice_sides(seed):
    """The CSR arrays the compiled engine builds in one pass per side are
    ``lat.fwd`` / ``lat.bwd``'s, in their order: several graphs, sequences
    sharing one, a graph used by no sequence, empty batches of arcs."""
    rng = np.random.default_rng(seed)
    fsts = [random_fst(rng, num_states=int(rng.integers(1, 7)), num_arcs=int(rng.integers(0, 15)), num_pdfs=5,
                       num_finals=1) for _ in range(4)]
    lat = Lattice.of(FstBatch(fsts, seq_to_graph=rng.integers(0, 3, size=int(rng.integers(1, 7)))))
    arrs = numba_log.arrays.lattice_arrays(lat)
    f, b = lat.fwd, lat.bwd
    for got, want in ((arrs.fwd.ptr, f.ptr), (arrs.fwd.other, f.src), (arrs.fwd.log_prob, f.log_prob),
                      (arrs.fwd.col, f.col), (arrs.bwd.ptr, b.ptr), (arrs.bwd.other, b.dst),
                      (arrs.bwd.log_prob, b.log_prob), (arrs.bwd.col, b.col)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(arrs.start, lat.start)
    np.testing.assert_array_equal(arrs.final, lat.final)


@pytest.mark.parametrize("seed", range(4))
def test_every_posterior_is_written(monkeypatch, seed):
    """The one-frame pass starts from uninitialised posteriors: every entry
    of every sequence's columns is written -- past its length, for an
    impossible sequence, a sequence without frames and one with a NaN score
    -- so memory holding garbage gives the NumPy engine's numbers."""
    lat, rng = _lattice(seed, n=7)
    T = 9
    X = _scores(lat, rng, T)
    lengths = rng.integers(1, T + 1, size=lat.num_sequences)
    lengths[0] = 0
    lengths[1] = T
    X[2, lat.col_seq == 3] = np.nan

    class Garbage:  # numpy, with empty() filled with a value no engine writes
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(shape, dtype=float):
            return np.full(shape, 12345.0, dtype=dtype)

    monkeypatch.setattr(numba_log, "np", Garbage())
    got = numba_log.forward_backward(lat, X.copy(), lengths)
    monkeypatch.undo()
    ref = numpy_log.forward_backward(lat, X.copy(), lengths)
    assert not (got[1] == 12345.0).any()
    np.testing.assert_array_equal(np.isnan(got[1]), np.isnan(ref[1]))
    ok = ~np.isnan(ref[1])
    np.testing.assert_allclose(got[1][ok], ref[1][ok], atol=1e-12)


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


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize("where", [0, 1, -1])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_plus_inf_scores_give_nan(monkeypatch, bad, where, held):
    """A NaN or +inf score anywhere in a sequence's row (first, second or last
    of its columns: the frame's maximum skips a NaN that is not first, and
    the held emissions find it) gives NaN for that sequence only, with the
    emissions held for the sequence or formed a row at a time."""
    if not held:
        monkeypatch.setattr(numba_log, "_EMISSIONS_BYTES", 0)
    lat, rng = _lattice(3)  # every sequence has paths of 10 arcs
    X = _scores(lat, rng, 10)
    lengths = np.full(lat.num_sequences, 10)
    hit = int(np.flatnonzero(lat.col_seq == 1)[where])
    X[4, hit] = bad
    (ll, post), (ll_ref, _) = _both(lat, X, lengths)
    assert np.isnan(ll[1]) and np.isnan(ll_ref[1])
    others = np.arange(lat.num_sequences) != 1
    np.testing.assert_allclose(ll[others], ll_ref[others], rtol=1e-12)  # no leak into other sequences
    assert np.isnan(post[:, lat.col_seq == 1]).any()
    assert not np.isnan(post[:, lat.col_seq != 1]).any()


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_bad_score_on_a_dead_state_gives_nan(monkeypatch, bad, held):
    """A NaN or +inf score in a column whose arcs are outside the frame's
    live band (the last label's, at frame 0 of a CTC graph), and not first
    in its row: NaN for that sequence, as the NumPy engine gives, with the
    emissions held or formed a row at a time."""
    if not held:
        monkeypatch.setattr(numba_log, "_EMISSIONS_BYTES", 0)
    rng = np.random.default_rng(3)
    lat = Lattice.of(ctc_graph([[1, 2, 3, 4], [3, 1]], blank=0))
    X = _scores(lat, rng, 12)
    X[0, np.flatnonzero(lat.col_seq == 0)[-1]] = bad
    (ll, post), (ll_ref, post_ref) = _both(lat, X, np.array([12, 12]))
    assert np.isnan(ll[0]) and np.isnan(ll_ref[0])
    np.testing.assert_allclose(ll[1], ll_ref[1], rtol=1e-12)
    np.testing.assert_allclose(post[:, lat.col_seq == 1], post_ref[:, lat.col_seq == 1], atol=1e-12)


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


@pytest.mark.parametrize("spans", [False, True])
def test_threads_match_one_thread(monkeypatch, spans):
    """Sequences split into ranges over 3 threads give one thread's bits
    (the one-frame pass and the spanning pass)."""
    if spans:
        rng = np.random.default_rng(11)
        fsts = [_span_fst(rng, states=5, arcs=14) for _ in range(3)]
        lat = Lattice.of(FstBatch(fsts, seq_to_graph=rng.integers(0, 3, size=9)))
    else:
        lat, rng = _lattice(5, n=9)
    X = _scores(lat, rng, 30)
    lengths = rng.integers(0, 31, size=9)
    passes = numba_log.spanning if spans else numba_log.one_frame
    before = engines.get_num_threads()
    engines.set_num_threads(1)
    try:
        one = numba_log.forward_backward(lat, X.copy(), lengths)
        monkeypatch.setitem(engines.threads.MIN_PARALLEL_WORK, "numba", 0)
        engines.set_num_threads(3)
        calls = []
        run = passes.run
        monkeypatch.setattr(passes, "run", lambda n0, n1, *a: calls.append((n0, n1)) or run(n0, n1, *a))
        three = numba_log.forward_backward(lat, X.copy(), lengths)
        parts = sorted(calls)  # a few ranges per thread, covering the sequences once
        assert 3 < len(parts) <= 3 * engines.threads.PARTS_PER_THREAD
        assert parts[0][0] == 0 and parts[-1][1] == 9 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    finally:
        engines.set_num_threads(before)
    np.testing.assert_array_equal(one[0], three[0])
    np.testing.assert_array_equal(one[1], three[1])


def test_split_cuts_nearest_each_share():
    # contiguous ranges covering every sequence, at most one per thread; with
    # a few long sequences the cut nearest half the work, not the first past it
    work = np.array([39.0, 46.0, 32.0, 46.0, 25.0, 34.0, 4.0, 16.0])
    assert engines.threads.split(work, 2, 0, parts_per_thread=1) == [(0, 3), (3, 8)]
    rng = np.random.default_rng(3)
    for parts in (1, 2, 3, 7, 40):
        work = rng.integers(1, 100, size=25).astype(float)
        ranges = engines.threads.split(work, parts, 0, parts_per_thread=1)
        assert 1 <= len(ranges) <= parts and ranges[0][0] == 0 and ranges[-1][1] == 25
        assert all(a < b for a, b in ranges) and all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))
        if parts == 2:
            best = min(max(work[:c].sum(), work[c:].sum()) for c in range(26))
            assert max(work[a:b].sum() for a, b in ranges) == best
    assert engines.threads.split(np.zeros(0), 4, 0) == [(0, 0)]


@pytest.mark.parametrize("scale", [60.0, 300.0, 900.0])
def test_wide_score_ranges_mix_scaled_and_log_cells(scale):
    # scores this spread leave some alphas and betas below 1e-290 of their
    # frame's largest while the frame's total stays in the scaled range: the
    # backward frame's posteriors come from scaled products and, for the
    # states with a cell kept as a log, from the log domain
    for seed in range(8):
        lat, rng = _lattice(seed, n=4, states=8, arcs=20)
        X = _scores(lat, rng, 12, scale=scale)
        lengths = np.array([12, 7, 3, 12])
        _assert_same(*_both(lat, X, lengths))


@pytest.mark.parametrize("emissions_inside", [False, True])
def test_float32_scores_give_the_float64_numbers(monkeypatch, emissions_inside):
    """Float32 scores are read as they are and widened where they are read:
    the same bits as their float64 copy (emissions formed beforehand or
    inside the pass), with -inf and NaN placed."""
    if emissions_inside:
        monkeypatch.setattr(numba_log, "_EMISSIONS_BYTES", 0)
    lat, rng = _lattice(3, n=6)
    X = _scores(lat, rng, 14, scale=8.0).astype(np.float32)
    X[3, 2] = -np.inf
    X[5, lat.col_offsets[4]] = np.nan  # sequence 4 only
    lengths = rng.integers(0, 15, size=6)
    lengths[4] = 14
    ll32, post32 = numba_log.forward_backward(lat, X, lengths)
    ll64, post64 = numba_log.forward_backward(lat, X.astype(np.float64), lengths)
    np.testing.assert_array_equal(ll32, ll64)
    np.testing.assert_array_equal(post32, post64)
    assert np.isnan(ll32[4]) and not np.isnan(np.delete(ll32, 4)).any()


def test_float32_scores_on_every_cpu_engine():
    """Float32 compact scores through the dispatcher: the compiled engine
    reads them as they are, the NumPy and shared-graph engines a float64
    copy; the same numbers.  ``ctc_loss`` of float32 inputs (which gathers
    float32 scores) matches torch's."""
    import torch

    import chainfb

    rng = np.random.default_rng(5)
    fst = random_fst(rng, num_states=6, num_arcs=15, num_pdfs=5, num_finals=2)
    lat = Lattice.of(FstBatch([fst], seq_to_graph=np.zeros(4, dtype=np.int64)))  # one shared graph
    X = _scores(lat, rng, 10).astype(np.float32)
    lengths = np.array([10, 7, 0, 9])
    got = {e: engines.forward_backward(lat, X, lengths, engine=e) for e in engines.engines_with(device="cpu")}
    for e in set(got) - {"numba"}:
        np.testing.assert_allclose(got["numba"][0], got[e][0], rtol=1e-10)
        np.testing.assert_allclose(got["numba"][1], got[e][1], atol=1e-10)
    torch.manual_seed(0)
    lp = torch.randn(30, 2, 6).log_softmax(-1)
    targets = torch.tensor([[1, 2, 2, 3], [4, 5, 1, 1]])
    il, tl = torch.tensor([30, 21]), torch.tensor([4, 3])
    torch.testing.assert_close(chainfb.ctc_loss(lp, targets, il, tl, reduction="none"),
                               torch.nn.functional.ctc_loss(lp, targets, il, tl, reduction="none"))


def _fork_child(conn, lat, X, lengths):
    conn.send(numba_log.forward_backward(lat, X, lengths)[0])


def test_threads_work_in_a_forked_child(monkeypatch):
    """The thread pools started by a call are not inherited by a forked
    child (a DataLoader worker, say): the child's threaded call finishes and
    gives the parent's numbers."""
    import multiprocessing

    lat, rng = _lattice(5, n=6)
    X = _scores(lat, rng, 20)
    lengths = rng.integers(1, 21, size=6)
    monkeypatch.setitem(engines.threads.MIN_PARALLEL_WORK, "numba", 0)
    before = engines.get_num_threads()
    engines.set_num_threads(2)
    try:
        here = numba_log.forward_backward(lat, X, lengths)[0]  # starts the pool in this process
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_fork_child, args=(child, lat, X, lengths))
        proc.start()
        got = parent.recv() if parent.poll(60) else None
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    finally:
        engines.set_num_threads(before)
    assert got is not None, "the forked child's threaded call did not finish"
    np.testing.assert_array_equal(got, here)


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


def _python_source_with_log_domain_thresholds(monkeypatch):
    """Every compiled function the engine's modules name (and the vector
    math they use) replaced by its Python source, with thresholds that send
    every cell and every frame down the exact log-domain paths."""
    from chainfb.engines import vector_math
    from chainfb.engines.numba_log import arrays, bands, cells, columns, frames, one_frame, spanning

    modules = (arrays, bands, cells, columns, frames, one_frame, spanning, vector_math)
    for module in modules:
        for name, value in list(vars(module).items()):
            if hasattr(value, "py_func"):
                monkeypatch.setattr(module, name, value.py_func)
        for name, value in (("SAFE", 1e300), ("LOG_SAFE", float(np.log(1e300))), ("SAFE_TOTAL", 1e300)):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)
    assert all(not hasattr(v, "py_func") for m in modules for v in vars(m).values())


@pytest.mark.parametrize("shift", [5, 1])
def test_log_domain_paths_alone_give_the_same_numbers(monkeypatch, shift):
    # run the engine's Python source (not the compiled code) with thresholds
    # that send every cell and every frame down the exact log-domain paths
    # (one block per sequence, and blocks of 2 states whatever their arcs)
    monkeypatch.setattr(numba_log, "_BLOCK_SHIFT", shift)
    monkeypatch.setattr(numba_log, "_MAX_BLOCK_SPREAD", np.inf)
    monkeypatch.setattr(numba_log, "_MIN_BLOCKED_STATES", 0)
    _python_source_with_log_domain_thresholds(monkeypatch)
    lat, rng = _lattice(8, n=4)
    X = _scores(lat, rng, 9, scale=5.0)
    X[2, 3] = -np.inf
    lengths = np.array([9, 4, 0, 7])
    _assert_same(*_both(lat, X, lengths))


# ---------------------------------------------------------------------------
# arcs that span frames: the compiled engine and the shared-graph engine
# against path enumeration, the NumPy engine, and the same graph with every
# spanning arc cut into one-frame arcs (exact for any scores)

from chainfb import Fst  # noqa: E402
from chainfb.engines import scipy_shared  # noqa: E402

from oracles.fst import brute_force, expanded_span_one  # noqa: E402


def _span_fst(rng, states=4, arcs=11, pdfs=3, max_span=4, dead_arc=True):
    src = rng.integers(0, states, arcs)
    dst = rng.integers(0, states, arcs)
    dst[:4] = src[:4]  # self-loops, some of them spanning
    span = rng.integers(1, max_span + 1, arcs)
    span[0], span[1] = 1, max_span
    lp = rng.normal(size=arcs) - 0.5
    if dead_arc:
        lp[5] = -np.inf
    finals = {int(s): float(rng.normal()) for s in rng.choice(states, size=2, replace=False)}
    return Fst.from_arcs(zip(src, dst, rng.integers(0, pdfs, arcs), lp, span), finals, start=0,
                         num_states=states)


def _span_run(engine, lat, X, lengths, need=True):
    return engines.forward_backward(lat, X.copy(), lengths, need_posteriors=need, engine=engine)


#: the engines that run spans on the CPU (the one-graph lattices below suit every one), from the table
CPU_SPAN_ENGINES = engines.engines_with(device="cpu", spans=True)




@pytest.mark.parametrize("engine", CPU_SPAN_ENGINES)
@pytest.mark.parametrize("seed", range(8))
def test_spans_match_enumeration(engine, seed):
    rng = np.random.default_rng(100 + seed)
    fst = _span_fst(rng)
    assert fst.max_span == 4
    N, T = 4, 9
    lat = Lattice.of(FstBatch([fst], seq_to_graph=np.zeros(N, dtype=np.int64)))
    x = rng.normal(scale=2.0, size=(N, T, 3))
    x[1, 3, :] = -np.inf  # a frame no arc may read
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    lengths = np.array([T, 0, 5, 7])
    lengths[1] = rng.integers(4, T + 1)
    lengths[2] = 0
    ll, post = _span_run(engine, lat, X, lengths)
    for n in range(N):
        ll_ref, post_ref = brute_force(fst, x[n], int(lengths[n]))
        if ll_ref == -np.inf:
            assert ll[n] == -np.inf
        else:
            np.testing.assert_allclose(ll[n], ll_ref, rtol=1e-12, atol=1e-12)
        cols = np.flatnonzero(lat.col_seq == n)
        np.testing.assert_allclose(post[:, cols], post_ref[:, lat.col_pdf[cols]], atol=1e-12)
    ll_only, none = _span_run(engine, lat, X, lengths, need=False)
    assert none is None
    np.testing.assert_allclose(ll_only, ll, rtol=1e-13)


@pytest.mark.parametrize("seed", range(4))
def test_spans_match_numpy_engine_on_several_graphs(seed):
    rng = np.random.default_rng(200 + seed)
    fsts = [_span_fst(rng, states=5, arcs=14, pdfs=4, max_span=1 + g) for g in range(3)]
    lat = Lattice.of(FstBatch(fsts, seq_to_graph=rng.integers(0, 3, size=6)))
    assert lat.max_span == 3
    X = _scores(lat, rng, 15)
    lengths = rng.integers(0, 16, size=6)
    _assert_same(*_both(lat, X, lengths), ll_atol=1e-12)


@pytest.mark.parametrize("engine", CPU_SPAN_ENGINES)
def test_spans_nan_stays_in_its_sequence(engine):
    rng = np.random.default_rng(7)
    fst = _span_fst(rng, dead_arc=False)
    lat = Lattice.of(FstBatch([fst], seq_to_graph=np.zeros(4, dtype=np.int64)))
    X = _scores(lat, rng, 12)
    lengths = np.array([12, 12, 9, 11])
    clean = _span_run(engine, lat, X, lengths)
    hit = np.flatnonzero(lat.col_seq == 1)
    X[4, hit] = np.nan
    ll, post = _span_run(engine, lat, X, lengths)
    assert np.isfinite(clean[0][1]) and np.isnan(ll[1])
    others = np.arange(4) != 1
    np.testing.assert_array_equal(ll[others], clean[0][others])
    np.testing.assert_array_equal(post[:, lat.col_seq != 1], clean[1][:, lat.col_seq != 1])


@pytest.mark.parametrize("engine, scale, T", [("numba", 1e4, 3000), ("numba", 300.0, 400), ("shared", 20.0, 400)])
def test_spans_match_the_cut_graph_on_long_inputs(engine, scale, T):
    # scores of magnitude 1e4 over thousands of frames: cells far below
    # their frame's best (the log-domain escape), spans across them
    rng = np.random.default_rng(int(scale))
    fst = _span_fst(rng, states=6, arcs=18, pdfs=5, dead_arc=False)
    cut = expanded_span_one(fst, pad_pdf=5)
    N = 3
    lat = Lattice.of(FstBatch([fst], seq_to_graph=np.zeros(N, dtype=np.int64)))
    lat_cut = Lattice.of(FstBatch([cut], seq_to_graph=np.zeros(N, dtype=np.int64)))
    x = rng.normal(scale=scale, size=(N, T, 6))
    x[..., 5] = 0.0
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    X_cut = PdfScoreMap(lat_cut.col_seq, lat_cut.col_pdf).gather(np, x)
    lengths = np.array([T, T // 2, 17])
    ll, post = _span_run(engine, lat, X, lengths)
    ll_ref, post_ref = numpy_log.forward_backward(lat_cut, X_cut, lengths)
    assert np.isfinite(ll_ref).all()
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-12)
    keep = np.isin(lat_cut.col_pdf, np.arange(5))
    np.testing.assert_allclose(post, post_ref[:, keep], atol=1e-9)


def test_span_log_domain_paths_alone_give_the_same_numbers(monkeypatch):
    # the engine's Python source with thresholds that send every cell and
    # every frame total down the exact log-domain paths
    _python_source_with_log_domain_thresholds(monkeypatch)
    rng = np.random.default_rng(12)
    fst = _span_fst(rng)
    lat = Lattice.of(FstBatch([fst], seq_to_graph=np.zeros(3, dtype=np.int64)))
    x = rng.normal(scale=3.0, size=(3, 9, 3))
    X = PdfScoreMap(lat.col_seq, lat.col_pdf).gather(np, x)
    lengths = np.array([9, 6, 0])
    ll, post = numba_log.forward_backward(lat, X, lengths)
    for n in range(3):
        ll_ref, post_ref = brute_force(fst, x[n], int(lengths[n]))
        np.testing.assert_allclose(ll[n], ll_ref, rtol=1e-12)
        cols = np.flatnonzero(lat.col_seq == n)
        np.testing.assert_allclose(post[:, cols], post_ref[:, lat.col_pdf[cols]], atol=1e-12)


def test_span_graphs_select_numba_and_shared_runs_by_name():
    rng = np.random.default_rng(13)
    fst = _span_fst(rng)
    lat = Lattice.of(FstBatch([fst], seq_to_graph=np.zeros(3, dtype=np.int64)))
    X = _scores(lat, rng, 6)
    assert select(lat, X) == "numba"
    assert not scipy_shared.is_exact(lat, X)  # the automatic choice keeps spans on the exact engines
    assert {"numba", "shared"} <= set(engines.engines_with(spans=True))
    ll, post = engines.forward_backward(lat, X, np.array([6, 5, 4]), engine="shared")
    ll2, post2 = engines.forward_backward(lat, X, np.array([6, 5, 4]))
    np.testing.assert_allclose(ll, ll2, rtol=1e-12)
    np.testing.assert_allclose(post, post2, atol=1e-12)
    with pytest.raises(ValueError, match="leaky"):
        scipy_shared.forward_backward(lat, X, np.array([6, 5, 4]), leaky=(0.1, np.zeros(fst.num_states)))


def test_span_one_graphs_keep_the_one_frame_pass(monkeypatch):
    lat, rng = _lattice(14)
    X = _scores(lat, rng, 8)
    monkeypatch.setattr(numba_log.spanning, "run", None)  # never called for span-1 lattices
    ll, _ = numba_log.forward_backward(lat, X, np.full(lat.num_sequences, 8))
    assert np.isfinite(ll).any()


def test_exp_row_matches_numpy_exp():
    """The engine's vector exponential (:func:`chainfb.engines.vector_math.exp_row`): within two units in the last
    place
    of ``np.exp`` on ``[-708, 0]``, an exact 0 for ``-inf`` and below
    ``exp(-708)`` (the log-domain escape sees those scores), NaN for NaN, in
    the compiled code and its Python source."""
    rng = np.random.default_rng(21)
    x = np.concatenate([-rng.exponential(5.0, 5000), -rng.uniform(0, 708, 5000), np.linspace(-1.0, 0.0, 1001),
                        [0.0, -0.0, -1e-300, -0.34657359, -0.34657360, -707.999, -708.0]])
    special = np.array([-708.001, -745.2, -800.0, -np.inf, np.nan])
    from chainfb.engines.vector_math import exp_row as compiled

    for exp_row in (compiled, compiled.py_func):
        for m in (0.0, 3.5, -2.25):
            v = np.concatenate([x, special]) + m
            out = np.empty_like(v)
            exp_row(v, m, out, np.empty(len(v), np.int64))
            ref = np.exp(v[:len(x)] - m)
            np.testing.assert_allclose(out[:len(x)], ref, rtol=4.5e-16, atol=0)  # two units at most
            assert (out[len(x):-1] == 0.0).all() and np.isnan(out[-1])
            v[[3, 50]] = np.nan
            assert exp_row(v, m, out, np.empty(len(v), np.int64)) == 3  # the NaN written
