"""The CUDA kernels' logic, run on the CPU: the same .cu sources built with
the host compiler under tests/emulation/emulate.h (see tests/emulation),
compared with the NumPy engine and the NumPy twins: block sizes, shared
memory modes, bits, sanitizers.  The engine bodies of the public API (path
enumeration, gradcheck, ...) run on both kernel engines from
tests/engines/test_engine.py (``TestEngineEmulated``)."""

import paths  # tests/paths.py: the repository's and the tests' folders
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainfb import Fst, FstBatch, Lattice
from chainfb.cuda.kernels import KERNELS
from chainfb.cuda.transducer_maps import transducer_gather, transducer_grad
from chainfb.engines.cuda import forward_backward as lattice_forward_backward
from chainfb.engines.numpy_log import forward_backward as forward_backward_numpy
from chainfb.testing import numerator_like_fst, random_fst
from chainfb.transducer import symbol_table

from emulation import EmulatedBackend, build, find_compiler, run_on
from oracles import cuda_twins as twins
from oracles.transducer import rnnt_reference, rnnt_step_case

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture
def be(emulated_backend):
    return emulated_backend


def test_library_has_every_kernel(be):
    assert sorted(be.kernel_names()) == sorted(KERNELS)


# ---------------------------------------------------------------- engine


def _compare(be, lat, X, lengths, leaky=None, block=None, dtype=np.float64, rtol=1e-10, atol=1e-12):
    Xn = X.astype(np.float64).copy()
    ll, post = forward_backward_numpy(lat, Xn, lengths, leaky=leaky)
    Xe = X.astype(dtype).copy()
    lle, poste = lattice_forward_backward(be, lat, Xe, lengths, leaky=leaky, block_size=block)
    assert lle.dtype == dtype and poste.dtype == dtype and poste.shape == post.shape
    np.testing.assert_array_equal(np.isneginf(lle), np.isneginf(ll))
    fin = np.isfinite(ll)
    np.testing.assert_allclose(lle[fin], ll[fin], rtol=rtol, atol=atol)
    np.testing.assert_allclose(poste, post, rtol=rtol, atol=atol)
    assert not np.isnan(poste).any()
    # frames past each length are masked in place (the NumPy engine stops at max(lengths); the kernel masks
    # every frame t >= lengths[seq], as the contract says)
    Tmax = int(lengths.max(initial=0))
    np.testing.assert_array_equal(np.isneginf(Xe[:Tmax]), np.isneginf(Xn[:Tmax]))
    past = np.arange(X.shape[0])[:, None] >= np.asarray(lengths)[lat.col_seq][None, :]
    assert np.isneginf(Xe[past]).all() and np.array_equal(Xe[~past], X.astype(dtype)[~past])
    return lle, poste


@pytest.mark.parametrize("block", [1, 3, 4, 32])
def test_engine_random_graphs_variable_lengths(be, block):
    rng = np.random.default_rng(block)
    fsts = [random_fst(rng, num_states=int(rng.integers(2, 7)), num_arcs=int(rng.integers(4, 14))) for _ in range(7)]
    lat = Lattice.of(FstBatch(fsts))
    T = 6
    X = rng.normal(size=(T, lat.num_columns))
    lengths = np.array([6, 0, 1, 3, 6, 2, 5])
    ll, _ = _compare(be, lat, X, lengths, block=block)
    assert np.isinf(ll).any() and np.isfinite(ll).any()  # both kinds occur in this batch


def test_wide_states_share_lanes(be):
    """States of many arcs take several lanes of a warp each (forward_backward.cuh's Lanes, chosen from the
    lattice): against the NumPy engine, the same bits for every block size (one pass or several over the
    states), and a NaN score stays in its sequence."""
    from chainfb.engines.cuda import default_block_size, lanes_per_state, lattice_host_arrays

    rng = np.random.default_rng(5)
    fsts = [random_fst(rng, num_states=5, num_arcs=70, num_pdfs=7) for _ in range(3)]
    lat = Lattice.of(FstBatch(fsts))
    h = lattice_host_arrays(lat)
    assert lanes_per_state(h["max_states"], h["max_degree"], default_block_size(h["max_states"])) >= 4
    T, lengths = 9, np.array([9, 4, 7])
    X = rng.normal(size=(T, lat.num_columns))
    runs = [_compare(be, lat, X, lengths, block=b) for b in (None, 32, 64)]
    for ll, post in runs[1:]:
        assert np.array_equal(ll, runs[0][0]) and np.array_equal(post, runs[0][1])
    Xn = X.copy()
    Xn[2, np.flatnonzero(lat.col_seq == 1)[0]] = np.nan
    ll, post = lattice_forward_backward(be, lat, Xn, lengths)
    assert np.isnan(ll[1]) and np.array_equal(ll[[0, 2]], runs[0][0][[0, 2]])
    assert np.array_equal(post[:, lat.col_seq != 1], runs[0][1][:, lat.col_seq != 1])


@pytest.mark.parametrize("T, block, num_phones", [(20000, 32, 0), (20000, 256, 75)])
def test_engine_long_sequences(be, T, block, num_phones):
    """Long sequences through the emulated kernels (each thread a fiber, a
    barrier per frame): 20,000 frames of a 2-state graph at 32 threads and of
    a 151-state numerator-like graph at 256 threads, with a second, shorter
    sequence, against the NumPy engine (to the rounding that 20,000 frames of
    log-sums in another order accumulate)."""
    rng = np.random.default_rng(T + block)
    if num_phones:
        fst = numerator_like_fst(rng, num_phones=num_phones, num_pdfs=200)
    else:
        fst = Fst.from_arcs([(0, 0, 0, -0.5), (0, 1, 1, -1.0), (1, 1, 1, -0.3), (1, 0, 0, -1.2)], {1: 0.0},
                            num_states=2)
    lat = Lattice.of(FstBatch([fst, fst]))
    X = rng.normal(size=(T, lat.num_columns))
    _compare(be, lat, X, np.array([T, 500]), block=block, rtol=1e-7, atol=1e-10)


def test_engine_impossible_and_unreachable(be):
    # 0 -a-> 1 (final), 2 unreachable with a self-loop and final: needs exactly 1 frame
    f = Fst.from_arcs([(0, 1, 0, -0.1), (2, 2, 1, 0.0)], {1: 0.0, 2: 0.0}, num_states=3)
    lat = Lattice.of(FstBatch([f, f, f]))
    X = np.zeros((3, lat.num_columns))
    X[0, 0] = -np.inf  # sequence 0 (length 1): its only arc is blocked
    ll, post = _compare(be, lat, X, np.array([1, 1, 3]))
    assert ll[0] == -np.inf and ll[2] == -np.inf and np.isclose(ll[1], -0.1)
    cols0 = lat.col_seq == 0
    assert not post[:, cols0].any()


def test_engine_larger_than_block_and_long(be):
    rng = np.random.default_rng(2)
    fsts = [numerator_like_fst(rng, num_phones=6, num_pdfs=20) for _ in range(3)]
    lat = Lattice.of(FstBatch(fsts))
    T = 150
    X = rng.normal(size=(T, lat.num_columns)) * 3
    _compare(be, lat, X, np.array([150, 97, 40]), block=4, rtol=1e-9)


def test_engine_shared_graph_float32(be):
    rng = np.random.default_rng(3)
    f = random_fst(rng, num_states=8, num_arcs=30, num_pdfs=5, num_finals=3)
    lat = Lattice.of(FstBatch([f], np.zeros(4, dtype=np.int64)))
    X = rng.normal(size=(9, lat.num_columns))
    _compare(be, lat, X, np.array([9, 8, 1, 5]), block=4, dtype=np.float32, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("block", [2, 5, 32])
def test_engine_leaky(be, block):
    rng = np.random.default_rng(4)
    f = random_fst(rng, num_states=7, num_arcs=20, num_pdfs=4, num_finals=7)
    lat = Lattice.of(FstBatch([f], np.zeros(3, dtype=np.int64)))
    init = rng.random(lat.num_states)
    for n in range(3):  # a distribution per sequence
        sl = slice(lat.state_offsets[n], lat.state_offsets[n + 1])
        init[sl] /= init[sl].sum()
    leaky = (0.1, np.log(init))
    X = rng.normal(size=(6, lat.num_columns))
    _compare(be, lat, X, np.array([6, 0, 3]), leaky=leaky, block=block)


def test_engine_deterministic_bitwise(be):
    rng = np.random.default_rng(5)
    fsts = [random_fst(rng, num_states=40, num_arcs=300, num_pdfs=3) for _ in range(4)]
    lat = Lattice.of(FstBatch(fsts))
    X = rng.normal(size=(7, lat.num_columns))
    lengths = np.array([7, 5, 7, 3])
    runs = [lattice_forward_backward(be, lat, X.copy(), lengths, block_size=b) for b in (32, 32, 64, 128)]
    assert np.array_equal(runs[1][0], runs[0][0]) and np.array_equal(runs[1][1], runs[0][1])  # run to run
    for ll, post in runs[2:]:
        # each state, chunk and column summed in a fixed order: the log-likelihoods are the same bits whatever the
        # block size; a frame's total (the divisor of its posteriors) is summed over the block's threads
        assert np.array_equal(ll, runs[0][0])
        np.testing.assert_allclose(post, runs[0][1], rtol=4e-16, atol=0)


def _recorded_launches(be, monkeypatch):
    """Every launch on ``be`` from now on, run and recorded as ``(name, grid, block, args)``."""
    calls = []
    launch = be.launch

    def spy(name, grid, block, args, shared_mem=0):
        calls.append((name, grid, block, args))
        return launch(name, grid, block, args, shared_mem=shared_mem)

    monkeypatch.setattr(be, "launch", spy)
    return calls


def _bits_lattice(rng, case):
    """The lattice of a same-bits case: ``spans`` (arcs spanning up to 3 frames), ``large`` (more states and columns
    than threads), ``lanes`` (few states of many arcs: several lanes a state) or plain random graphs."""
    if case == "spans":
        from test_cuda_emulated_spans import span_fst

        return Lattice.of(FstBatch([span_fst(rng, num_states=6, num_arcs=20, max_span=3) for _ in range(3)]))
    if case == "large":
        return Lattice.of(FstBatch([numerator_like_fst(rng, num_phones=40, num_pdfs=120) for _ in range(2)]))
    if case == "lanes":
        return Lattice.of(FstBatch([random_fst(rng, num_states=6, num_arcs=150, num_pdfs=4) for _ in range(2)]))
    return Lattice.of(FstBatch([random_fst(rng, num_states=20, num_arcs=120, num_pdfs=4) for _ in range(3)]))


@pytest.mark.parametrize("case", ["plain", "spans", "leaky", "shared", "large"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_engine_shared_memory_modes_give_the_same_bits(be, monkeypatch, case, dtype):
    """The three places a block may keep its rows (device memory, a shared
    ring, a shared ring with each frame's inputs staged), each with or
    without its sequence's arcs copied to shared memory, change where values
    live, not one operation."""
    import chainfb.engines.cuda as cuda_engine
    from chainfb.engines import cuda_shared

    rng = np.random.default_rng(11)
    leaky = None
    run = lattice_forward_backward
    if case == "shared":
        f = random_fst(rng, num_states=30, num_arcs=200, num_pdfs=5)
        lat = Lattice.of(FstBatch([f], np.zeros(3, dtype=np.int64)))
        run = cuda_shared.forward_backward
    else:  # "large": every thread stages several values
        lat = _bits_lattice(rng, case)
        if case == "leaky":
            leaky = (0.1, np.log(np.full(lat.num_states, 0.05)))
    X = rng.normal(size=(9, lat.num_columns)).astype(dtype)
    lengths = rng.integers(0, 10, lat.num_sequences)
    lengths[0] = 9
    block = 32 if case == "large" else None
    runs = {}
    calls = _recorded_launches(be, monkeypatch)
    monkeypatch.setattr(cuda_engine, "SHARED_BYTES", 227 * 1024)
    for mode in (2, 1, 0):
        for table in (True, False):
            monkeypatch.setattr(cuda_engine, "MODES", (mode, 0))
            monkeypatch.setattr(cuda_engine, "ARC_TABLES", (table,))
            runs[mode, table] = run(be, lat, X.copy(), lengths, leaky=leaky, block_size=block)
            plan = [int(args[-6]) for name, _, _, args in calls if "_recursion" in name][-1]  # its mode argument
            assert plan == mode | (cuda_engine.ARC_TABLE if table else 0)
    for key, got in runs.items():  # the same bits wherever a block keeps its rows, scores and arcs
        assert np.array_equal(got[0], runs[2, False][0]) and np.array_equal(got[1], runs[2, False][1]), key
    runs[2] = runs[2, False]
    ll, post = forward_backward_numpy(lat, X.astype(np.float64), lengths, leaky=leaky)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(runs[2][0], ll, rtol=tol, atol=tol)
    np.testing.assert_allclose(runs[2][1], post, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", ["plain", "spans", "leaky", "shared", "large"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_posterior_frames_a_block_give_the_same_bits(be, monkeypatch, case, dtype):
    """The posterior kernels with several frames a block (``POSTERIOR_FRAMES``; the last block's frames past T or
    past a sequence's length skipped) compute each frame as with one: the same bits, on both engines."""
    import chainfb.engines.cuda as cuda_engine
    from chainfb.engines import cuda_shared

    rng = np.random.default_rng(12)
    leaky, run = None, lattice_forward_backward
    if case == "shared":
        lat = Lattice.of(FstBatch([random_fst(rng, num_states=30, num_arcs=200, num_pdfs=5)], np.zeros(3, np.int64)))
        run = cuda_shared.forward_backward
    else:
        lat = _bits_lattice(rng, "plain" if case == "leaky" else case)
        if case == "leaky":
            leaky = (0.1, np.log(np.full(lat.num_states, 0.05)))
    X = rng.normal(size=(11, lat.num_columns)).astype(dtype)
    lengths = rng.integers(0, 12, lat.num_sequences)
    lengths[0] = 11
    calls = _recorded_launches(be, monkeypatch)
    runs = {}
    for frames in (1, 2, 4, 11, 16):
        monkeypatch.setattr(cuda_engine, "POSTERIOR_FRAMES", frames)
        runs[frames] = run(be, lat, X.copy(), lengths, leaky=leaky)
        N = lat.num_sequences
        grids = [(int(args[1]), grid) for name, grid, _, args in calls if "_posteriors" in name]  # (F, blocks)
        assert grids[-1] == (frames, N * -(-11 // frames))
    for frames, got in runs.items():
        assert np.array_equal(got[0], runs[1][0]) and np.array_equal(got[1], runs[1][1]), frames
    with pytest.raises(ValueError, match="frames"):
        cuda_engine.posterior_launch(2, 5, 8, 0)


@pytest.mark.parametrize("case", ["plain", "spans", "large", "nan", "lanes"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_engine_clusters_give_the_same_bits(be, monkeypatch, case, dtype):
    """Each direction of a sequence over a cluster of 2, 4 or 8 blocks
    (cluster.cu) reads the same values in the same order as one block with
    its rows in device memory: the same bits, with and without the arc
    table, whatever the lengths (zero included), spans, lanes or NaN."""
    import chainfb.engines.cuda as cuda_engine

    rng = np.random.default_rng(12)
    lat = _bits_lattice(rng, case)  # "large": each of the cluster's threads strides over several states
    X = rng.normal(size=(9, lat.num_columns)).astype(dtype)
    lengths = rng.integers(0, 10, lat.num_sequences)
    lengths[0], lengths[-1] = 9, 0
    if case == "nan":
        lengths[1] = 9
        X[4, lat.col_offsets[1]] = np.nan  # sequence 1's NaN stays in sequence 1
    calls = _recorded_launches(be, monkeypatch)

    def launches():  # the recursions': name, grid, mode, lanes
        return [(name, grid, int(args[-6]), int(args[-5])) for name, grid, _, args in calls if "_recursion" in name]

    monkeypatch.setattr(cuda_engine, "MODES", (0,))
    block = 32
    monkeypatch.setattr(cuda_engine, "ARC_TABLES", (False,))
    ref = lattice_forward_backward(be, lat, X.copy(), lengths, block_size=block)
    if case == "lanes":
        assert launches()[-1][3] > 1
    N = lat.num_sequences
    for K in (2, 4, 8):
        for table in (True, False):
            monkeypatch.setattr(cuda_engine, "ARC_TABLES", (table,))
            got = lattice_forward_backward(be, lat, X.copy(), lengths, block_size=block, cluster=K)
            real = "double" if dtype == np.float64 else "float"
            assert launches()[-1][:3] == (f"chainfb::fb_cluster_recursion<{real}, {K}>", 2 * N * K,
                                          cuda_engine.ARC_TABLE if table else 0)
            assert launches()[-1][3] == launches()[0][3]  # the lanes of one block
            assert np.array_equal(got[0], ref[0], equal_nan=True), (K, table)
            assert np.array_equal(got[1], ref[1], equal_nan=True), (K, table)
    ll, post = forward_backward_numpy(lat, X.astype(np.float64), lengths)
    tol = 1e-10 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(ref[0], ll, rtol=tol, atol=tol)
    np.testing.assert_allclose(ref[1], post, rtol=tol, atol=tol)
    if case == "nan":
        assert np.isnan(ref[0][1]) and np.isfinite(ref[0][0])


@settings(max_examples=15, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), K=st.sampled_from([2, 4, 8]), block=st.sampled_from([32, 64]),
       table=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]), holes=st.integers(0, 3))
def test_clusters_match_one_block_property(be, monkeypatch, seed, K, block, table, dtype, holes):
    """Random graphs, lengths and block sizes, with NaN, +inf and -inf placed among the scores: a cluster of K
    blocks a direction gives the bits of one block (which the tests above hold to the NumPy engine)."""
    import chainfb.engines.cuda as cuda_engine

    rng = np.random.default_rng(seed)
    fsts = [random_fst(rng, num_states=int(rng.integers(1, 40)), num_arcs=int(rng.integers(1, 120)),
                       num_pdfs=int(rng.integers(1, 6))) for _ in range(int(rng.integers(1, 4)))]
    lat = Lattice.of(FstBatch(fsts))
    T = int(rng.integers(1, 9))
    X = rng.normal(scale=3.0, size=(T, lat.num_columns)).astype(dtype)
    for _ in range(holes):  # a non-finite score somewhere
        X[rng.integers(T), rng.integers(lat.num_columns)] = rng.choice([np.nan, np.inf, -np.inf])
    lengths = rng.integers(0, T + 1, lat.num_sequences)
    monkeypatch.setattr(cuda_engine, "MODES", (0,))
    monkeypatch.setattr(cuda_engine, "ARC_TABLES", (table,))
    ref = lattice_forward_backward(be, lat, X.copy(), lengths, block_size=block)
    got = lattice_forward_backward(be, lat, X.copy(), lengths, block_size=block, cluster=K)
    assert np.array_equal(got[0], ref[0], equal_nan=True) and np.array_equal(got[1], ref[1], equal_nan=True)


def test_auto_cluster_covers_the_states_with_blocks_of_512_that_fit_the_sms():
    from chainfb.engines.cuda import auto_cluster

    def shape(states):
        return {"max_states": states}

    assert auto_cluster(shape(256), 8, 1, 132) == 1  # one block: CTC at S <= 127, RNN-T, multi-blank
    assert auto_cluster(shape(123), 8, 4, 132) == 2  # TDT's 492 lanes: at least 2 blocks past 256
    assert auto_cluster(shape(257), 8, 1, 132) == 2
    assert auto_cluster(shape(2002), 8, 1, 132) == 4  # CTC, S = 1000: 4 x 501 threads; 64 blocks on 132 SMs
    assert auto_cluster(shape(4097), 8, 1, 132) == 8 and auto_cluster(shape(6001), 1, 1, 132) == 8  # the most
    assert auto_cluster(shape(4097), 16, 1, 132) == 4  # 32 sequence directions: 4 blocks each fit
    assert auto_cluster(shape(6001), 64, 1, 132) == 1  # 128 directions fill the SMs already
    assert auto_cluster(shape(1500), 30, 1, 132) == 2  # 4 halved: 60 directions x 2 blocks fit


def test_cluster_auto_and_the_module_default(be, monkeypatch):
    """``cluster="auto"`` launches :func:`auto_cluster`'s size where clusters can run (the same bits as one
    block) and one block where they cannot (the leaky HMM, the shared-graph engine, a device without them);
    ``cluster=None`` takes the module's default, ``"auto"``."""
    import chainfb.engines.cuda as cuda_engine
    from chainfb.engines import cuda_shared

    rng = np.random.default_rng(14)
    lat = Lattice.of(FstBatch([random_fst(rng, num_states=40, num_arcs=90, num_pdfs=4) for _ in range(2)]))
    X = rng.normal(size=(6, lat.num_columns))
    lengths = np.array([6, 4])
    calls = _recorded_launches(be, monkeypatch)

    def names():
        return [(name, grid) for name, grid, _, _ in calls]

    assert cuda_engine.CLUSTER == "auto"
    ref = lattice_forward_backward(be, lat, X.copy(), lengths, block_size=32)
    assert names()[-2][0] == "chainfb::fb_recursion<double>"  # 40 states: auto_cluster's 1
    monkeypatch.setattr(cuda_engine, "auto_cluster", lambda shape, N, lanes, sms: 4)
    got = lattice_forward_backward(be, lat, X.copy(), lengths, block_size=32, cluster="auto")
    assert names()[-2] == ("chainfb::fb_cluster_recursion<double, 4>", 2 * 2 * 4)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    lattice_forward_backward(be, lat, X.copy(), lengths, block_size=32)  # the module default
    assert names()[-2][0] == "chainfb::fb_cluster_recursion<double, 4>"
    monkeypatch.setattr(cuda_engine, "CLUSTER", 1)
    lattice_forward_backward(be, lat, X.copy(), lengths, block_size=32)
    assert names()[-2][0] == "chainfb::fb_recursion<double>"
    leaky = (0.1, np.log(np.full(lat.num_states, 0.05)))
    lattice_forward_backward(be, lat, X.copy(), lengths, leaky=leaky, cluster="auto")
    assert names()[-2][0] == "chainfb::fb_recursion<double>"
    shared = Lattice.of(FstBatch([random_fst(rng, num_states=5, num_arcs=12)], np.zeros(2, dtype=np.int64)))
    cuda_shared.forward_backward(be, shared, rng.normal(size=(6, shared.num_columns)), lengths, cluster="auto")
    assert names()[-2][0] == "chainfb::fb_shared_recursion<double>"


def test_cluster_argument_is_checked(be):
    from chainfb.engines import cuda_shared

    rng = np.random.default_rng(13)
    lat = Lattice.of(FstBatch([random_fst(rng, num_states=5, num_arcs=12) for _ in range(2)]))
    X = rng.normal(size=(4, lat.num_columns))
    lengths = np.array([4, 3])
    for bad in (3, 0, 16, True, 2.0, "2"):
        with pytest.raises(ValueError, match="cluster: expected one of"):
            lattice_forward_backward(be, lat, X.copy(), lengths, cluster=bad)
    with pytest.raises(ValueError, match="cluster: the leaky HMM"):
        lattice_forward_backward(be, lat, X.copy(), lengths, leaky=(0.1, np.zeros(lat.num_states)), cluster=2)

    class NoClusters:  # a backend (a device before compute capability 9.0) without clusters
        xp, launch, cache_key = be.xp, be.launch, be.cache_key

    with pytest.raises(ValueError, match="compute capability 9.0"):
        lattice_forward_backward(NoClusters(), lat, X.copy(), lengths, cluster=2)
    shared = Lattice.of(FstBatch([random_fst(rng, num_states=5, num_arcs=12)], np.zeros(2, dtype=np.int64)))
    with pytest.raises(ValueError, match="per-sequence kernels"):
        cuda_shared.forward_backward(be, shared, rng.normal(size=(4, shared.num_columns)), lengths, cluster=2)


def test_shared_plan_takes_the_first_mode_that_fits(monkeypatch):
    """By default mode 0 with the arc table where it fits, else mode 0 alone; with the modes in the order 2, 1, 0
    (what the sweep narrows them to), the most that fits."""
    import chainfb.engines.cuda as cuda_engine
    from chainfb.engines.cuda import ARC_TABLE, arc_table_bytes, shared_plan

    shape = {"max_states": 100, "max_columns": 50, "max_arcs": 300}
    table = 300 * 8 + 4 * 101 + 2 * 300 * 2  # weights, state offsets, 16-bit ends and columns
    assert arc_table_bytes(shape, 1, 8) == table
    assert arc_table_bytes(shape, 3, 8) == table + 2 * 300  # and 16-bit spans
    assert cuda_engine.MODES[0] == 0
    assert shared_plan(shape, 1, 8, 32, 10**6) == (ARC_TABLE, table)
    assert shared_plan(shape, 1, 8, 32, table - 1) == (0, 0)
    monkeypatch.setattr(cuda_engine, "MODES", (2, 1, 0))
    assert shared_plan(shape, 1, 8, 32, 10**6) == (2 | ARC_TABLE, 2 * (100 + 50) * 8 + table)
    assert shared_plan(shape, 1, 8, 32, 2 * (100 + 50) * 8) == (2, 2 * (100 + 50) * 8)
    assert shared_plan(shape, 1, 8, 32, 2 * 100 * 8) == (1, 2 * 100 * 8)
    assert shared_plan(shape, 1, 8, 32, 100) == (0, 0)
    assert shared_plan(dict(shape, max_columns=200), 1, 8, 32, 10**6)[0] == 1 | ARC_TABLE  # 200 > 4 values x 32
    wide = dict(shape, max_states=70000)  # state ids past 16 bits: no table
    assert arc_table_bytes(wide, 1, 8) is None and shared_plan(wide, 1, 8, 32, 10**7) == (2, 2 * (70000 + 50) * 8)


def _check_packed(arrays, separate, buffers=1):
    """The NumPy arrays are views of ``buffers`` buffers, each at a multiple of ``PACK_ALIGN`` bytes from its
    buffer's first and no two overlapping (``separate``: each has a buffer of its own)."""
    from chainfb.engines.cuda_memory import PACK_ALIGN

    groups = {}
    for v in arrays:
        base = v.base if v.base is not None else v
        groups.setdefault(id(base), []).append(v)
    if separate:
        assert len(groups) == len(arrays)
        return
    assert len(groups) == buffers
    for views in groups.values():
        origin = min(v.__array_interface__["data"][0] for v in views)
        spans = sorted((v.__array_interface__["data"][0] - origin, v.nbytes) for v in views)
        assert all(a % PACK_ALIGN == 0 for a, _ in spans)
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("separate", [False, True])
def test_a_call_allocates_its_rows_at_once(be, monkeypatch, separate):
    """``scratch`` gives arrays of the shapes and dtypes asked for, views of one allocation (each its own with the
    backend's ``separate_arrays``), that can be written independently; the engine's recursion gets its alpha, beta,
    their offsets and z from it."""
    from chainfb.engines.cuda_memory import scratch

    monkeypatch.setattr(be, "separate_arrays", separate, raising=False)
    specs = [((5, 7), np.float32), ((3, 6), np.float64), ((3,), np.float32), ((0, 4), np.float64), ((2,), np.int32)]
    arrays = scratch(be, specs)
    assert [(a.shape, a.dtype) for a in arrays] == [(s, np.dtype(d)) for s, d in specs]
    assert all(a.flags.c_contiguous and a.flags.writeable for a in arrays)
    for i, a in enumerate(arrays):
        a[...] = i + 1
    assert all((a == i + 1).all() for i, a in enumerate(arrays))
    _check_packed(arrays, separate)

    rng = np.random.default_rng(9)
    lat = Lattice.of(FstBatch([random_fst(rng, num_states=5, num_arcs=12) for _ in range(2)]))
    calls = _recorded_launches(be, monkeypatch)
    lattice_forward_backward(be, lat, rng.normal(size=(4, lat.num_columns)), np.array([4, 3]))
    recursion = next(args for name, _, _, args in calls if "_recursion" in name)
    args = [a for a in recursion if isinstance(a, np.ndarray)]
    alpha, beta, offs, qoffs = args[-6:-2]  # the arrays end with alpha, beta, offs, qoffs, loglike, lz
    rows = [alpha, beta, offs, qoffs, args[-1]]
    assert [a.shape for a in rows] == [(5, lat.num_states)] * 2 + [(2, 5)] * 2 + [(2,)]
    _check_packed(rows, separate)


@pytest.mark.parametrize("separate", [False, True])
def test_a_lattice_is_uploaded_at_once(be, monkeypatch, separate):
    """``lattice_arrays`` copies the lattice's host arrays to the device in one transfer: the int32 arrays and
    the weights in the engine's dtype packed in one buffer.  Every device array is a view of it, at a multiple of
    ``PACK_ALIGN`` bytes, and holds the host array's values.  With the backend's ``separate_arrays`` each array
    has a buffer of its own."""
    from chainfb.engines import cuda as per_sequence
    from test_cuda_emulated_spans import span_fst

    rng = np.random.default_rng(8)
    monkeypatch.setattr(be, "separate_arrays", separate, raising=False)
    for fsts in ([random_fst(rng, num_states=5, num_arcs=12) for _ in range(3)],
                 [span_fst(rng, num_states=5, num_arcs=12, max_span=3) for _ in range(2)]):
        lat = Lattice.of(FstBatch(fsts))
        host = per_sequence.lattice_host_arrays(lat)
        for dtype in (np.float32, np.float64):
            dev = per_sequence.lattice_arrays(be, lat, dtype)
            assert dev.keys() == host.keys()
            arrays = {k: v for k, v in dev.items() if isinstance(v, np.ndarray)}
            assert arrays.keys() == {k for k, v in host.items() if isinstance(v, np.ndarray)}
            for k, v in arrays.items():
                assert v.dtype == (np.dtype(dtype) if host[k].dtype.kind == "f" else host[k].dtype), k
                np.testing.assert_array_equal(v, host[k].astype(v.dtype), err_msg=k)
                assert v.flags.c_contiguous
            _check_packed(list(arrays.values()), separate, buffers=1)
        host_dtypes = {v.dtype for v in host.values() if isinstance(v, np.ndarray)}
        assert host_dtypes == {np.dtype(np.int32), np.dtype(np.float64)}
        assert {k for k, v in dev.items() if not isinstance(v, np.ndarray)} == \
            {k for k, v in host.items() if not isinstance(v, np.ndarray)}


@pytest.mark.parametrize("chunks", ["default", "one arc", "few"])
@pytest.mark.parametrize("kind", ["own graphs", "one shared graph", "shared and own", "ctc"])
def test_host_arrays_compiled_equal_numpy(kind, chunks, monkeypatch):
    """Where Numba runs, the CUDA engine's index arrays of a lattice come from one compiled pass over the batch's
    arcs (``cuda_index.index_arrays``) instead of ``Lattice.fwd`` / ``bwd``, a sort and a dozen array operations:
    the same arrays, value and dtype, and the same sizes, as the NumPy path's.  With chunks of one arc, columns
    have several; with at most three chunks a sequence, the chunk size doubles until they fit or each column is
    one chunk (a sequence with more columns than chunks allowed)."""
    from chainfb import ctc_graph
    from chainfb.engines import cuda as per_sequence, numba_log

    if not numba_log.available():
        pytest.skip("Numba is not available")
    if chunks != "default":
        monkeypatch.setattr(per_sequence, "CHUNK_ARCS", 1)
        monkeypatch.setattr(per_sequence, "MAX_CHUNKS", 3 if chunks == "few" else 10**6)
    rng = np.random.default_rng(11)
    sizes, several = set(), False
    for _ in range(5):
        if kind == "ctc":
            batch = ctc_graph([rng.integers(1, 5, size=rng.integers(0, 6)) for _ in range(4)])
        else:
            fsts = [random_fst(rng) if i else numerator_like_fst(rng, num_phones=4, num_pdfs=6) for i in range(3)]
            seq_to_graph = {"own graphs": None, "one shared graph": [1, 1, 1, 1], "shared and own": [2, 0, 2, 1]}[kind]
            batch = FstBatch(fsts, seq_to_graph)
        compiled = per_sequence._host_arrays(Lattice(batch))
        with monkeypatch.context() as m:
            m.setattr(numba_log, "numba", None)
            plain = per_sequence._host_arrays(Lattice(batch))
        assert compiled.keys() == plain.keys()
        for k, v in plain.items():
            if isinstance(v, np.ndarray):
                assert compiled[k].dtype == v.dtype and np.array_equal(compiled[k], v), k
            else:
                assert compiled[k] == v, k
        sizes.add(compiled["chunk_arcs"])
        several |= compiled["mc_col"].size > 0
        if chunks == "few":  # at most three chunks a sequence, or one a column (no fewer can be)
            assert compiled["max_chunks"] <= max(3, compiled["max_columns"])
    # the branches the default sizes do not reach on such small graphs
    assert {"one arc": several, "few": max(sizes) > 1}.get(chunks, True)


@pytest.mark.parametrize("compiled", [True, False])
def test_sequence_with_more_columns_than_chunks(compiled, monkeypatch):
    """A sequence with more columns holding arcs than ``MAX_CHUNKS`` (a CTC target of 4,200 distinct labels) cannot
    have fewer chunks than columns: the chunk size stops doubling once each column is one chunk (it used to double
    without end), on both paths."""
    from chainfb import ctc_graph
    from chainfb.engines import cuda as per_sequence, numba_log

    if compiled and not numba_log.available():
        pytest.skip("Numba is not available")
    if not compiled:
        monkeypatch.setattr(numba_log, "numba", None)
    lat = Lattice(ctc_graph([np.arange(1, 4201)]))
    a = per_sequence._host_arrays(lat)
    assert lat.num_columns == 4201 > per_sequence.MAX_CHUNKS
    assert a["max_chunks"] == 4201 and a["mc_col"].size == 0  # one chunk a column
    assert a["chunk_arcs"] >= int(np.diff(a["chunk_arc"]).max())


def _numpy_with(**functions) -> types.SimpleNamespace:
    """NumPy as an array module with ``functions`` in place of its own."""
    return types.SimpleNamespace(**{**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")}, **functions})


def _counting_numpy(copies: list):
    """NumPy as an array module whose ``array`` and ``asarray`` -- a host-to-device copy each, on CuPy -- append
    to ``copies``."""
    return _numpy_with(array=lambda *a, **k: copies.append(1) or np.array(*a, **k),
                       asarray=lambda *a, **k: copies.append(1) or np.asarray(*a, **k))


@pytest.mark.parametrize("shared", [False, True])
def test_posteriors_need_no_fill(be, monkeypatch, shared):
    """The posterior kernels write every element of ``post [T, C]`` -- zero past each length and for an
    impossible sequence, NaN up to its length for a NaN one -- so the engine allocates it without a fill: with
    every new device array's bytes all ones (a NaN in every float, what uninitialised memory may hold), the
    posteriors are the NumPy engine's."""
    from chainfb.engines.cuda_shared import forward_backward as shared_forward_backward

    rng = np.random.default_rng(21)
    f = random_fst(rng, num_states=6, num_arcs=16, num_pdfs=4, num_finals=2)
    N, T = 5, 7
    lat = Lattice.of(FstBatch([f], np.zeros(N, dtype=np.int64)) if shared else
                     FstBatch([f] + [random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4) for _ in range(N - 1)]))
    X = rng.normal(size=(T, lat.num_columns))
    X[:, lat.col_seq == 1] = -np.inf  # sequence 1: impossible
    X[2, np.flatnonzero(lat.col_seq == 3)[0]] = np.nan  # sequence 3: NaN
    lengths = np.array([7, 5, 0, 4, 2])
    def empty(shape, dtype=float, **k):
        return np.full(int(np.prod(shape)) * np.dtype(dtype).itemsize, 0xFF, np.uint8).view(dtype).reshape(shape)

    monkeypatch.setattr(be, "xp", _numpy_with(empty=empty))
    run = shared_forward_backward if shared else lattice_forward_backward
    ll, post = forward_backward_numpy(lat, X.copy(), lengths)
    lle, poste = run(be, lat, X.copy(), lengths)
    np.testing.assert_allclose(lle, ll, rtol=1e-10)
    np.testing.assert_allclose(poste, post, rtol=1e-10, atol=1e-12)  # (NaN where the NumPy engine has NaN)
    nan_seq = lat.col_seq == 3
    assert np.isnan(poste[:4, nan_seq]).all() and not poste[4:, nan_seq].any()
    assert not poste[:, lat.col_seq == 1].any() and not np.isnan(poste[:, ~nan_seq]).any()


def test_score_map_uploads_once():
    """A score map's first gather to a device copies its column offsets and the columns' sequences there in one
    transfer (a new CTC label set every step makes a new map every step); the scatter with per-sequence scales
    then copies nothing, and both give the host's numbers."""
    from chainfb.score_map import PdfScoreMap

    rng = np.random.default_rng(13)
    N, T, P, C = 3, 4, 5, 7
    flat = np.sort(rng.choice(N * P, C, replace=False))  # distinct columns (sequence, pdf)
    col_seq, col_pdf = flat // P, flat % P
    copies = []
    counting = _counting_numpy(copies)
    counting.__name__ = "counting"
    scores = rng.normal(size=(N, T, P))
    sm = PdfScoreMap(col_seq, col_pdf)
    X = sm.gather(counting, scores)
    assert len(copies) == 1
    np.testing.assert_array_equal(X, scores[col_seq, :, col_pdf].T)
    target, scale = np.zeros((N, T, P)), np.array([1.0, 2.0, 3.0])
    sm.scatter_add(counting, target, np.ones((T, len(col_seq))), seq_scale=scale)
    assert len(copies) == 1
    want = np.zeros((N, T, P))
    want[col_seq, :, col_pdf] = scale[col_seq][:, None]
    np.testing.assert_array_equal(target, want)


def test_host_lengths_upload_once_per_lattice(be, monkeypatch):
    """Host lengths reach the device once while a lattice runs again with the same values (a loss with the same
    labels every step); other values -- new ones, the ones before (the lattice keeps the last only), or the same
    array changed in place -- are uploaded again, and the results follow them."""
    rng = np.random.default_rng(12)
    lat = Lattice.of(FstBatch([random_fst(rng, num_states=5, num_arcs=12, num_pdfs=4) for _ in range(3)]))
    X = rng.normal(size=(6, lat.num_columns))
    copies = []
    counting = _counting_numpy(copies)
    monkeypatch.setattr(be, "xp", counting)
    a, b = np.array([6, 4, 5]), np.array([6, 2, 5])
    # the first call also uploads the lattice's buffer (its int32 arrays and its weights)
    steps = [(a, 2), ([6, 4, 5], 2), (b, 3), (a, 4), ("b changed", 5), (b, 5)]
    for lengths, want_copies in steps:
        if isinstance(lengths, str):
            b[1] = 3
            lengths = b
        got = lattice_forward_backward(be, lat, X.copy(), lengths)
        want = forward_backward_numpy(lat, X.copy(), np.array(lengths))
        assert len(copies) == want_copies, (lengths, copies)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-12)


def test_arc_tables_hold_spans_exactly_when_the_lattice_has_them():
    """``arc_table_bytes`` counts the spans' 16-bit column when ``max_span > 1``; the kernels copy the span arrays
    into the table whenever the lattice's arrays have them: the two must coincide."""
    from chainfb.engines.cuda import lattice_host_arrays
    from test_cuda_emulated_spans import span_fst

    rng = np.random.default_rng(5)
    for max_span in (1, 2, 3):
        lat = Lattice.of(FstBatch([span_fst(rng, num_states=5, num_arcs=12, max_span=max_span) for _ in range(2)]))
        a = lattice_host_arrays(lat)
        assert lat.max_span == max_span
        for k in ("in_span", "out_span", "ca_span"):
            assert (a[k] is not None) == (max_span > 1), (max_span, k)


def test_engine_forward_only_and_errors(be):
    rng = np.random.default_rng(6)
    lat = Lattice.of(FstBatch([random_fst(rng)]))
    X = rng.normal(size=(3, lat.num_columns))
    ll, post = lattice_forward_backward(be, lat, X.copy(), np.array([3]), need_posteriors=False)
    assert post is None
    np.testing.assert_allclose(ll, forward_backward_numpy(lat, X.copy(), np.array([3]))[0])
    with pytest.raises(ValueError, match="X"):
        lattice_forward_backward(be, lat, X[:, :1].copy(), np.array([3]))
    with pytest.raises(TypeError, match="X"):
        lattice_forward_backward(be, lat, X.astype(np.float16), np.array([3]))
    with pytest.raises(ValueError, match="lengths"):
        lattice_forward_backward(be, lat, X.copy(), np.array([3, 3]))
    with pytest.raises(ValueError, match="lengths"):
        lattice_forward_backward(be, lat, X.copy(), np.array([4]))
    with pytest.raises(TypeError, match="lengths"):
        lattice_forward_backward(be, lat, X.copy(), np.array([3.0]))
    with pytest.raises(ValueError, match="leaky"):
        lattice_forward_backward(be, lat, X.copy(), np.array([3]), leaky=(0.1, np.zeros(1)))
    with pytest.raises(ValueError, match="leaky"):
        lattice_forward_backward(be, lat, X.copy(), np.array([3]), leaky=(1.5, np.zeros(lat.num_states)))


# ---------------------------------------------------------------- transducer score maps


def _case(rng, B=3, T=4, Umax=3, V=7, M=0, dtype=np.float32):
    """Random logits and a multi-blank column layout: kinds blank, label, M
    big blanks; (b, u, j) numbered in order, the label column only for
    u < U_b, some entries -1, a zero column per b."""
    T_len = rng.integers(1, T + 1, B)
    T_len[0] = T
    U_len = rng.integers(0, Umax + 1, B)
    U_len[0] = Umax
    U1 = Umax + 1
    blank = V - 1
    big = [V - 2 - i for i in range(M)]
    targets = rng.integers(0, V - 1 - M, (B, Umax))
    colidx = -np.ones((B, U1, M + 2), dtype=np.int32)
    c = 0
    zero_col = -np.ones(B, dtype=np.int32)
    for b in range(B):
        for u in range(U_len[b] + 1):
            for j in range(M + 2):
                if j == 1 and u >= U_len[b]:
                    continue
                if rng.random() < 0.1:
                    continue
                colidx[b, u, j] = c
                c += 1
        if M:
            zero_col[b] = c
            c += 1
    logits = (rng.normal(size=(B, T, U1, V)) * 2).astype(dtype)
    sym = symbol_table_np(targets, U_len, U1, blank, big)
    args = dict(sym=sym, colidx=colidx, logit_lengths=T_len, target_lengths=U_len)
    return logits, args, c, T + U1 - 1, (zero_col if M else None)


def _as_input(logits, kind):
    if kind == "bf16":
        return torch.from_numpy(logits.astype(np.float32)).to(torch.bfloat16)
    if kind == "torch32":
        return torch.from_numpy(logits.astype(np.float32))
    return logits.astype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[kind])


TOL = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 2e-5, "torch32": 2e-5, "f64": 1e-12}


@pytest.mark.parametrize("kind", ["f32", "f64", "f16", "bf16", "torch32"])
@pytest.mark.parametrize("M", [0, 2])
@pytest.mark.parametrize("fused", [True, False])
def test_transducer_gather_matches_twin(be, kind, M, fused):
    rng = np.random.default_rng(hash((kind, M, fused)) % 2**32)
    logits, args, C, rows, zc = _case(rng, M=M)
    x = _as_input(logits, kind)
    Xe, lse_e = transducer_gather(be, x, num_rows=rows, num_columns=C, zero_col=zc, fused_log_softmax=fused,
                                     threads_per_row=4, block_size=8, **args)
    Xt, lse_t = twins.transducer_gather(x, num_rows=rows, num_columns=C, zero_col=zc, fused_log_softmax=fused,
                                        **args)
    assert Xe.dtype == Xt.dtype == (np.float64 if kind == "f64" else np.float32)
    np.testing.assert_array_equal(np.isneginf(Xe), np.isneginf(Xt))
    tol = 1e-12 if kind == "f64" else 2e-6
    np.testing.assert_allclose(Xe, Xt, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse_e, lse_t, rtol=tol, atol=tol)
    if not fused:  # exact: the 16-bit loads are bit-exact conversions
        np.testing.assert_array_equal(Xe, Xt)


@pytest.mark.parametrize("kind", ["f32", "f64", "f16", "bf16", "torch32"])
@pytest.mark.parametrize("M", [0, 2])
@pytest.mark.parametrize("fastemit,clamp,fused", [(0.0, -1.0, True), (0.25, -1.0, True), (0.1, 0.05, True),
                                                  (0.0, -1.0, False)])
def test_transducer_grad_matches_twin(be, kind, M, fastemit, clamp, fused):
    rng = np.random.default_rng(hash((kind, M, fastemit, fused)) % 2**32)
    logits, args, C, rows, zc = _case(rng, M=M)
    x = _as_input(logits, kind)
    _, lse = twins.transducer_gather(x, num_rows=rows, num_columns=C, zero_col=zc, fused_log_softmax=fused, **args)
    post = rng.random((rows, C)).astype(lse.dtype)
    scale = rng.random(logits.shape[0]) + 0.5
    w = np.ones(M + 2)
    w[1] += fastemit  # FastEmit: the label kind weighs 1 + lambda
    kw = dict(kind_weight=w, clamp=clamp, fused_log_softmax=fused, **args)
    ge = transducer_grad(be, x, post=post, lse=lse, scale=scale, threads_per_row=2, block_size=4, **kw)
    gt = twins.transducer_grad(x, post=post, lse=lse, scale=scale, **kw)
    assert type(ge) is type(gt) and ge.dtype == gt.dtype and tuple(ge.shape) == tuple(gt.shape)
    ge = ge.float().numpy() if isinstance(ge, torch.Tensor) else ge.astype(np.float64)
    gt = gt.float().numpy() if isinstance(gt, torch.Tensor) else gt.astype(np.float64)
    np.testing.assert_allclose(ge, gt, rtol=TOL[kind], atol=TOL[kind])
    # dead rows are exactly zero
    B, T, U1, V = logits.shape
    live = (np.arange(T)[None, :, None] < args["logit_lengths"][:, None, None]) & (
        np.arange(U1)[None, None, :] <= args["target_lengths"][:, None, None])
    assert not ge[~live].any()
    if clamp > 0:
        assert np.abs(ge).max() <= clamp * scale.max() * (1 + TOL[kind])


def _special_floats(rng):
    v = np.concatenate([
        rng.normal(size=300) * 10.0 ** rng.integers(-9, 6, 300),
        [0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e6, np.inf, -np.inf, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
         1.5 * 2.0 ** -25, 2.0 ** -26, 3 * 2.0 ** -25, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
         1.0 + 3 * 2.0 ** -8, 3.4e38, 1e-40],
    ])
    return v.astype(np.float32)


def test_16bit_stores_round_like_numpy_and_torch(be):
    # grad with no softmax, scale 1, weights 1: grad at the blank symbol is exactly -post, rounded by the kernel
    rng = np.random.default_rng(7)
    vals = _special_floats(rng)
    B, T, V = 1, len(vals), 3
    colidx = np.array([[[0, -1]]], dtype=np.int32)
    args = dict(sym=np.array([[[1, -1]]]), colidx=colidx, logit_lengths=[T], target_lengths=[0])
    post = -vals[:, None]  # row n = t (u = 0)
    vals = np.float32(0) - post[:, 0]  # what the kernel rounds (0 - (-(-0.0)) is +0.0)
    lse = np.zeros((B, T, 1), dtype=np.float32)
    for kind in ("f16", "bf16"):
        x = _as_input(np.zeros((B, T, 1, V), dtype=np.float32), kind)
        g = transducer_grad(be, x, post=post, lse=lse, scale=1.0, kind_weight=[1.0, 1.0], fused_log_softmax=False,
                               threads_per_row=1, block_size=16, **args)
        if kind == "f16":
            with np.errstate(over="ignore"):
                want = vals.astype(np.float16)
            np.testing.assert_array_equal(g[0, :, 0, 1].view(np.uint16), want.view(np.uint16))
        else:
            want = torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16)
            assert torch.equal(g[0, :, 0, 1].view(torch.int16), want)


def test_16bit_loads_are_exact(be):
    rng = np.random.default_rng(8)
    bits = np.concatenate([rng.integers(0, 65536, 500), [0, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x03FF, 0x0400, 0x7BFF]])
    T = len(bits)
    colidx = np.array([[[0, -1]]], dtype=np.int32)
    args = dict(sym=np.array([[[0, -1]]]), colidx=colidx, logit_lengths=[T], target_lengths=[0])
    h = bits.astype(np.uint16)
    h = h[(h & 0x7C00) != 0x7C00 | ((h & 0x3FF) == 0)]  # no NaNs (compare equal)
    for kind in ("f16", "bf16"):
        if kind == "f16":
            x = h.view(np.float16).reshape(1, -1, 1, 1)
            want = x.astype(np.float32).ravel()
        else:
            x = torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16).reshape(1, -1, 1, 1)
            want = x.float().numpy().ravel()
            keep = ~np.isnan(want)
            x, want = x[:, keep], want[keep]
        n = x.shape[1]
        X, _ = transducer_gather(be, x, num_rows=n, num_columns=1, fused_log_softmax=False, threads_per_row=1,
                                    block_size=64, **dict(args, logit_lengths=[n]))
        np.testing.assert_array_equal(X[:, 0], want)


# ---------------------------------------------------------------- RNN-T end to end


def test_rnnt_through_kernels_and_engine(be):
    """Step graphs (state u: blank self-loop, label arc u -> u+1) + emulated
    gather + emulated engine + emulated grad = the direct RNN-T recursion."""
    rng = np.random.default_rng(9)
    logits, lat, args, rows, T_len, U_len, ref_args = rnnt_step_case(rng)
    X, lse = transducer_gather(be, logits, num_rows=rows, num_columns=lat.num_columns, threads_per_row=4,
                                  block_size=8, **args)
    ll, post = lattice_forward_backward(be, lat, X, T_len + U_len, block_size=2)
    scale = np.ones(len(T_len))  # the kernel formula is d(-logP) / d logits
    grad = transducer_grad(be, logits, post=post, lse=lse, scale=scale, kind_weight=[1.0, 1.0], threads_per_row=2,
                              block_size=4, **args)
    lt = torch.tensor(logits, requires_grad=True)
    ref = rnnt_reference(lt, T_len=T_len, U_len=U_len, **ref_args)
    ref.sum().backward()
    np.testing.assert_allclose(-ll, ref.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(grad, lt.grad.numpy(), atol=1e-10)


def test_engine_hypothesis(be):
    """Random graphs, lengths, block sizes and dtypes (property-based)."""
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hyp.settings(max_examples=25, deadline=None, derandomize=True)
    @hyp.given(seed=st.integers(0, 2**31), n=st.integers(1, 4), T=st.integers(0, 6), block=st.integers(1, 9),
               leaky=st.booleans())
    def check(seed, n, T, block, leaky):
        rng = np.random.default_rng(seed)
        fsts = [random_fst(rng, num_states=int(rng.integers(1, 6)), num_arcs=int(rng.integers(1, 12)),
                           num_pdfs=3, num_finals=1) for _ in range(n)]
        lat = Lattice.of(FstBatch(fsts))
        X = rng.normal(size=(T, lat.num_columns)) * 2
        X[rng.random(X.shape) < 0.1] = -np.inf
        lengths = rng.integers(0, T + 1, n)
        lk = None
        if leaky:
            init = rng.random(lat.num_states) + 0.01
            for i in range(n):
                sl = slice(lat.state_offsets[i], lat.state_offsets[i + 1])
                init[sl] /= init[sl].sum()
            lk = (0.05, np.log(init))
        _compare(be, lat, X, lengths, leaky=lk, block=block, rtol=1e-9, atol=1e-11)

    check()


def test_emulation_under_ubsan(tmp_path):
    """The kernels have no undefined behaviour (signed overflow, bad shifts,
    out-of-bounds on fixed arrays) on small engine cases (arcs spanning
    frames among them), transducer cases and the pdf score map's."""
    try:
        lib = build(str(tmp_path), extra_flags=("-fsanitize=undefined,bounds", "-fno-sanitize-recover=all"))
        ub = EmulatedBackend(lib)
    except (RuntimeError, OSError) as e:
        pytest.skip(f"UBSan build not available: {str(e)[:200]}")
    rng = np.random.default_rng(11)
    lat = Lattice.of(FstBatch([random_fst(rng, num_states=5, num_arcs=12) for _ in range(3)]))
    X = rng.normal(size=(5, lat.num_columns))
    _compare(ub, lat, X, np.array([5, 2, 0]), block=3)
    import test_cuda_emulated_spans as sp  # arcs that span frames

    for name, case in (("cuda", sp.per_sequence_case), ("cuda_shared", sp.shared_case)):
        sp.check(ub, name, *case(12, N=3, T=5), np.float64, 3)
    for kind in ("f16", "bf16", "f64"):
        logits, args, C, rows, zc = _case(rng, M=2)
        x = _as_input(logits, kind)
        Xe, lse = transducer_gather(ub, x, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=2,
                                       block_size=4, **args)
        transducer_grad(ub, x, post=np.abs(np.nan_to_num(Xe, neginf=0.0)), lse=lse, scale=1.0,
                           kind_weight=[1.0, 1.1, 1.0, 1.0], clamp=0.5, threads_per_row=2, block_size=4, **args)
    import test_cuda_emulated_durations as du  # the duration axis: TDT's tables, rows at several offsets

    du.sanitizer_cases(ub)
    import test_cuda_emulated_pdf_map as pm  # the pdf score map: strided layouts, every dtype pair

    pm.sanitizer_cases(ub)


def test_transducer_argument_errors(be):
    rng = np.random.default_rng(12)
    logits, args, C, rows, zc = _case(rng, M=0)
    kw = dict(num_rows=rows, num_columns=C)
    V = logits.shape[-1]
    sym = args["sym"]
    for fn in (lambda x, **a: transducer_gather(be, x, **a), twins.transducer_gather):
        with pytest.raises(TypeError, match="logits"):
            fn(logits.astype(np.int32), **kw, **args)
        with pytest.raises(ValueError, match="logits"):
            fn(logits[0], **kw, **args)
        with pytest.raises(ValueError, match="sym"):
            fn(logits, **kw, **dict(args, sym=sym[:, :-1]))
        with pytest.raises(ValueError, match="colidx"):
            fn(logits, **kw, **dict(args, sym=np.concatenate([sym, sym], axis=2)))
        with pytest.raises(ValueError, match="colidx"):
            fn(logits, **kw, **dict(args, colidx=args["colidx"] + C))
        with pytest.raises(ValueError, match="sym"):
            fn(logits, **kw, **dict(args, sym=np.where(sym == V - 1, V, sym)))
        with pytest.raises(ValueError, match="sym"):
            fn(logits, **kw, **dict(args, sym=np.where(sym == V - 1, -2, sym)))
        with pytest.raises(ValueError, match="sym"):
            fn(logits, **kw, **dict(args, sym=torch.from_numpy(np.where(sym == V - 1, V, sym))))
        with pytest.raises(TypeError, match="sym"):
            fn(logits, **kw, **dict(args, sym=sym.astype(np.float64)))
        with pytest.raises(TypeError, match="logit_lengths"):
            fn(logits, **kw, **dict(args, logit_lengths=np.ones(3)))
    with pytest.raises(ValueError, match="threads_per_row"):
        transducer_gather(be, logits, threads_per_row=3, block_size=6, **kw, **args)
    _, lse = twins.transducer_gather(logits, **kw, **args)
    post = np.ones((rows, C), dtype=np.float32)
    for fn in (lambda x, **a: transducer_grad(be, x, **a), twins.transducer_grad):
        for w in ([1.0], np.ones(3), np.ones((1, 2)), 1.0):
            with pytest.raises(ValueError, match="kind_weight"):
                fn(logits, post=post, lse=lse, scale=1.0, kind_weight=w, **args)
        with pytest.raises(TypeError, match="kind_weight"):
            fn(logits, post=post, lse=lse, scale=1.0, kind_weight=np.array(["a", "b"]), **args)


def test_transducer_unused_kinds_contribute_nothing(be):
    """An entry with sym = -1 is unused even where its colidx names a column:
    the gather leaves that column alone and its posterior does not reach the
    gradient, exactly as if colidx were -1 there."""
    rng = np.random.default_rng(13)
    logits, args, C, rows, zc = _case(rng, M=2)
    sym, colidx = args["sym"].copy(), args["colidx"]
    drop = (rng.random(sym.shape) < 0.3) & (colidx >= 0)
    assert drop.any()
    sym[drop] = -1
    cut = np.where(drop, -1, colidx)  # the same layout, the dropped entries removed through colidx
    kw = dict(num_rows=rows, num_columns=C, zero_col=zc)
    a_sym = dict(args, sym=sym)
    a_cut = dict(args, sym=sym, colidx=cut)
    a_cut2 = dict(args, colidx=cut)  # the original symbols: they must not matter where colidx is -1
    Xs, lse = transducer_gather(be, logits, threads_per_row=2, block_size=4, **kw, **a_sym)
    for a in (a_cut, a_cut2):
        Xc, lsec = transducer_gather(be, logits, threads_per_row=2, block_size=4, **kw, **a)
        np.testing.assert_array_equal(Xs, Xc)
        np.testing.assert_array_equal(lse, lsec)
    Xt = twins.transducer_gather(logits, **kw, **a_sym)[0]
    np.testing.assert_array_equal(np.isneginf(Xs), np.isneginf(Xt))
    np.testing.assert_allclose(Xs, Xt, rtol=2e-6, atol=2e-6)
    assert np.isneginf(Xs[:, colidx[drop]]).all()
    post = rng.random((rows, C)).astype(np.float32)
    post[:, colidx[drop]] = 1e3  # would dominate the gradient if it were read
    w = np.array([1.0, 1.5, 0.5, 2.0])
    gk = dict(post=post, lse=lse, scale=1.0, kind_weight=w, threads_per_row=2, block_size=4)
    gs = transducer_grad(be, logits, **gk, **a_sym)
    for a in (a_cut, a_cut2):
        np.testing.assert_array_equal(gs, transducer_grad(be, logits, **gk, **a))
    gt = twins.transducer_grad(logits, post=post, lse=lse, scale=1.0, kind_weight=w, **a_sym)
    np.testing.assert_allclose(gs, gt, rtol=2e-5, atol=2e-5)
    assert np.abs(gs).max() < 10


@pytest.mark.parametrize("fused", [True, False])
def test_transducer_kind_weight_scales_per_formula(be, fused):
    """grad = scale * (softmax * sum_j w_j post_j - sum_j w_j post_j [k == sym_j]):
    the kernel against the twin for arbitrary weights (zero and negative
    included), and linear in w: the sum of the one-kind gradients e_j, each
    times w_j."""
    rng = np.random.default_rng(14)
    logits, args, C, rows, zc = _case(rng, M=2, dtype=np.float64)
    J = args["sym"].shape[2]
    _, lse = twins.transducer_gather(logits, num_rows=rows, num_columns=C, zero_col=zc, fused_log_softmax=fused,
                                     **args)
    post = rng.random((rows, C))
    scale = rng.random(logits.shape[0]) + 0.5
    kw = dict(post=post, lse=lse, scale=scale, fused_log_softmax=fused, **args)
    w = np.array([0.0, 2.5, -0.75, 1.25])
    g = transducer_grad(be, logits, kind_weight=w, threads_per_row=4, block_size=8, **kw)
    np.testing.assert_allclose(g, twins.transducer_grad(logits, kind_weight=w, **kw), rtol=1e-12, atol=1e-12)
    parts = [transducer_grad(be, logits, kind_weight=np.eye(J)[j], threads_per_row=4, block_size=8, **kw)
             for j in range(J)]
    np.testing.assert_allclose(g, sum(wj * p for wj, p in zip(w, parts)), rtol=1e-12, atol=1e-12)
    # doubling every weight doubles the gradient exactly (powers of two)
    np.testing.assert_array_equal(transducer_grad(be, logits, kind_weight=2 * w, threads_per_row=4, block_size=8,
                                                     **kw), 2 * g)


def test_emulation_under_asan(tmp_path):
    """No out-of-bounds access in any kernel (the shared-graph engine's
    included) on small cases (arcs spanning frames among them), nor on
    out-of-range device lengths, columns and symbols: the emulation built
    with AddressSanitizer, run in a child
    process with libasan preloaded (NumPy's buffers then get red zones)."""
    import os
    import subprocess
    import sys

    from emulation import find_compiler as fc

    cxx = fc()
    libasan = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not libasan or not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("libasan not available")
    here = paths.TESTS
    script = tmp_path / "asan_child.py"
    script.write_text(f"""
import sys
sys.path[:0] = [{here!r}, {os.path.dirname(os.path.abspath(__file__))!r}]
import numpy as np
import test_cuda_emulated as t
from emulation import build, EmulatedBackend
be = EmulatedBackend(build({str(tmp_path)!r}, extra_flags=("-fsanitize=address",)))
be.separate_arrays = True  # each lattice array in its own NumPy buffer, with its own red zones
rng = np.random.default_rng(0)
for block in (1, 3, 8):
    lat = t.Lattice.of(t.FstBatch([t.random_fst(rng, num_states=5, num_arcs=12) for _ in range(3)]))
    X = rng.normal(size=(5, lat.num_columns))
    t._compare(be, lat, X, np.array([5, 2, 0]), block=block)
    t._compare(be, lat, X, np.array([5, 2, 0]), block=block, leaky=(0.1, np.log(np.full(lat.num_states, 0.2))))
    for K in (2, 8):  # a sequence's direction over a cluster of blocks
        t.lattice_forward_backward(be, lat, X.copy(), np.array([5, 2, 0]), block_size=block, cluster=K)
for kind in ("f16", "bf16", "f32", "f64"):
    for M in (0, 2):
        logits, args, C, rows, zc = t._case(rng, M=M)
        x = t._as_input(logits, kind)
        Xe, lse = t.transducer_gather(be, x, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=2,
                                         block_size=4, **args)
        t.transducer_grad(be, x, post=np.abs(np.nan_to_num(Xe, neginf=0.0)), lse=lse, scale=1.0,
                             kind_weight=np.linspace(0.5, 1.5, M + 2), clamp=0.5, threads_per_row=2, block_size=4,
                             **args)
import test_cuda_emulated_shared as sh  # the shared-graph kernels
den = sh.phone_lm_den(1).fst
for leaky_c in (None, 0.1):
    lat, X, leaky = sh.shared_case(den, 3, 5, rng, leaky_c)
    sh.compare(be, lat, X, np.array([5, 2, 0]), leaky, np.float64, 3)
import test_cuda_emulated_nan_bounds as nb  # out-of-range lengths, columns and symbols, as device inputs
nb.device_inputs(setattr)
nb.out_of_range_checks(be)
import test_cuda_emulated_spans as sp  # arcs that span frames, out-of-range lengths included
sp.asan_cases(be)
import test_cuda_emulated_durations as du  # the transducer kernels' duration axis
du.sanitizer_cases(be)
import test_cuda_emulated_pdf_map as pm  # the score map of pdf-labelled graphs
pm.sanitizer_cases(be)
print("ASAN-CLEAN")
""")
    env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here)] + [p for p in [env.get("PYTHONPATH")] if p])
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    if "ASAN-CLEAN" not in res.stdout and "AddressSanitizer" not in res.stderr:
        pytest.skip(f"could not run under ASan: {res.stderr[-300:]}")
    assert "ERROR: AddressSanitizer" not in res.stderr, res.stderr[-3000:]
    assert "ASAN-CLEAN" in res.stdout


# ------------------------------------------- transducer losses, kernel route


@pytest.mark.parametrize("durations", [(), (2, 3)])
@pytest.mark.parametrize("fastemit, clamp, fused", [(0.0, -1.0, True), (0.5, 0.3, True), (0.0, -1.0, False)])
def test_transducer_costs_kernel_route_matches_cpu(be, durations, fastemit, clamp, fused):
    """The route CUDA logits take (gather kernel -> engine kernels -> gradient
    kernel), run under emulation, against the CPU score map + NumPy engine."""
    from chainfb.transducer import TransducerCriterion

    rng = np.random.default_rng(5)
    B, T, U1, V = 3, 6, 4, 7
    logits = torch.from_numpy(rng.normal(size=(B, T, U1, V)))
    Tb = np.array([6, 4, 1])
    Ub = np.array([3, 0, 2])
    blank = V - 1
    targets = torch.from_numpy(rng.integers(0, V - 1 - len(durations), size=(B, U1 - 1)))
    sigma = 0.05 if durations else 0.0
    args = (logits.shape, targets, Tb, Ub, blank, durations, sigma, fused, fastemit, clamp)
    ll_cpu, g_cpu = TransducerCriterion(*args).run(logits)
    with run_on(be):
        ll_k, g_k = TransducerCriterion(*args).run(logits)
    np.testing.assert_allclose(ll_k.numpy(), ll_cpu.numpy(), rtol=1e-10)
    torch.testing.assert_close(g_k, g_cpu, rtol=1e-9, atol=1e-10)


def symbol_table_np(targets, U_len, U1, blank, big=()):
    return symbol_table(targets, U_len, U1, blank, big).numpy()


def test_transducer_symbols_table():
    """Kind 0 the blank, kind 1 the label for u < U_b (-1 beyond, and targets
    may be wider than U1 - 1), kind 2 + i big blank i."""
    targets = torch.tensor([[3, 1, 2, 0, 0], [2, 0, 0, 0, 0]])
    sym = symbol_table_np(targets, [3, 1], 4, 6, [5, 4])
    assert sym.dtype == np.int32 and sym.shape == (2, 4, 4)
    np.testing.assert_array_equal(sym[:, :, 0], 6)
    np.testing.assert_array_equal(sym[:, :, 2], 5)
    np.testing.assert_array_equal(sym[:, :, 3], 4)
    np.testing.assert_array_equal(sym[:, :, 1], [[3, 1, 2, -1], [2, -1, -1, -1]])
    np.testing.assert_array_equal(symbol_table_np(targets.numpy()[:, :3], [3, 1], 4, 6, [5, 4]), sym)
    rnnt = symbol_table_np(np.zeros((2, 0), dtype=np.int64), [0, 0], 1, 0)
    np.testing.assert_array_equal(rnnt, [[[0, -1]], [[0, -1]]])

    # the host build a GPU's table comes from (for targets already read to the host): the same table
    from chainfb.transducer.criterion import host_symbols

    for lengths, width in (([3, 1], 5), ([3, 1], 3), ([0, 0], 0)):
        tg = targets[:, :width]
        np.testing.assert_array_equal(host_symbols(tg.numpy(), np.array(lengths), 4, 6, [5, 4]),
                                      symbol_table_np(tg, lengths, 4, 6, [5, 4]))
