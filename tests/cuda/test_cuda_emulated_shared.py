"""The shared-graph CUDA engine (chainfb/cuda/shared_graph.cu, one graph read
by every block), run on the CPU through the kernel emulation: against the
NumPy engine and, bit for bit, against the per-sequence kernels of
engine.cu; the leaky HMM on and off, unequal lengths, float32 and float64,
NaN propagation, the device caches, and the engine picker.  Out-of-range
device lengths (and the ASan run) are in test_cuda_emulated_nan_bounds.py /
test_cuda_emulated.py."""

import numpy as np
import pytest
import torch

from chainfb import FstBatch, Lattice
from chainfb import engines
from chainfb.chain import DenominatorGraph, Topology, den_graph, estimate_phone_lm
from chainfb.engines import cuda_shared
from chainfb.engines.cuda import forward_backward as lattice_forward_backward
from chainfb.engines.cuda_shared import forward_backward as shared_forward_backward
from chainfb.engines.numpy_log import forward_backward as forward_backward_numpy
from chainfb.testing import random_fst

from emulation import find_compiler, run_on

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture
def be(emulated_backend):
    return emulated_backend


def phone_lm_den(seed, num_phones=4):
    """A small LF-MMI denominator graph from a phone LM (chain topology)."""
    rng = np.random.default_rng(seed)
    seqs = [list(rng.integers(0, num_phones, rng.integers(2, 9))) for _ in range(30)]
    topo = Topology.chain()
    lm = estimate_phone_lm(seqs, 3, 2, 10)
    return DenominatorGraph(den_graph(lm, topo), topo.num_pdfs(num_phones))


def shared_case(fst, N, T, rng, leaky_c):
    """The lattice of ``N`` sequences on ``fst``, scores ``X [T, C]`` and
    ``leaky = (c, log_init [S])`` (one initial distribution for all) or None."""
    lat = Lattice.of(FstBatch([fst], np.zeros(N, dtype=np.int64)))
    X = rng.normal(scale=2.0, size=(T, lat.num_columns))
    if leaky_c is None:
        return lat, X, None
    init = rng.random(fst.num_states) + 0.01
    return lat, X, (leaky_c, np.tile(np.log(init / init.sum()), N))


def compare(be, lat, X, lengths, leaky, dtype, block):
    """The shared-graph kernels against the NumPy engine and against the
    per-sequence kernels (the same bits for the same block size)."""
    ll, post = forward_backward_numpy(lat, X.copy(), lengths, leaky=leaky)
    Xs = X.astype(dtype)
    lls, posts = shared_forward_backward(be, lat, Xs.copy(), lengths, leaky=leaky, block_size=block)
    llk, postk = lattice_forward_backward(be, lat, Xs.copy(), lengths, leaky=leaky, block_size=block)
    assert lls.dtype == dtype and posts.dtype == dtype and posts.shape == post.shape
    np.testing.assert_array_equal(lls, llk)
    np.testing.assert_array_equal(posts, postk)
    np.testing.assert_array_equal(np.isneginf(lls), np.isneginf(ll))
    tol = 1e-10 if dtype == np.float64 else 2e-5
    fin = np.isfinite(ll)
    np.testing.assert_allclose(lls[fin], ll[fin], rtol=tol, atol=tol)
    np.testing.assert_allclose(posts, post, rtol=tol, atol=tol)
    return lls, posts


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("leaky_c", [None, 0.1, 0.0])
@pytest.mark.parametrize("block", [1, 5, 32])
def test_phone_lm_den_graph_matches_numpy(be, dtype, leaky_c, block):
    den = phone_lm_den(1)
    rng = np.random.default_rng(2)
    lat, X, leaky = shared_case(den.fst, 4, 9, rng, leaky_c)
    lengths = np.array([9, 4, 0, 7])
    ll, post = compare(be, lat, X, lengths, leaky, dtype, block)
    assert np.isfinite(ll).all()
    sums = np.add.reduceat(post, np.arange(0, lat.num_columns, lat.num_columns // 4), axis=1)
    valid = np.arange(9)[:, None] < lengths[None, :]
    np.testing.assert_allclose(sums[valid], 1.0, atol=1e-4)  # every valid frame's posteriors sum to 1
    assert not sums[~valid].any()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("leaky_c", [None, 0.05])
def test_random_graphs_unequal_lengths(be, seed, leaky_c):
    rng = np.random.default_rng(seed)
    f = random_fst(rng, num_states=int(rng.integers(1, 9)), num_arcs=int(rng.integers(1, 30)), num_pdfs=4,
                   num_finals=int(rng.integers(1, 2)))
    N, T = int(rng.integers(1, 6)), 7
    lat, X, leaky = shared_case(f, N, T, rng, leaky_c)
    X[rng.random(X.shape) < 0.1] = -np.inf
    compare(be, lat, X, rng.integers(0, T + 1, N), leaky, np.float64, int(rng.integers(1, 9)))


def test_per_sequence_log_init(be):
    """A log_init whose rows differ per sequence is used as given (a device
    array too)."""
    rng = np.random.default_rng(3)
    f = random_fst(rng, num_states=6, num_arcs=20, num_pdfs=3, num_finals=6)
    lat, X, _ = shared_case(f, 3, 6, rng, None)
    init = rng.random(lat.num_states) + 0.01
    for n in range(3):
        sl = slice(lat.state_offsets[n], lat.state_offsets[n + 1])
        init[sl] /= init[sl].sum()
    compare(be, lat, X, np.array([6, 2, 5]), (0.1, np.log(init)), np.float64, 4)


def test_nan_frames_propagate_like_numpy(be):
    rng = np.random.default_rng(4)
    den = phone_lm_den(5)
    for leaky_c in (None, 0.1):
        lat, X, leaky = shared_case(den.fst, 4, 6, rng, leaky_c)
        K = lat.num_columns // 4
        lengths = np.array([6, 4, 3, 6])
        X[1, 1 * K + 2] = np.nan  # inside sequence 1
        X[3, 2 * K] = np.nan  # past sequence 2's length: ignored
        for dtype in (np.float64, np.float32):
            ll, post = forward_backward_numpy(lat, X.copy(), lengths, leaky=leaky)
            lls, posts = shared_forward_backward(be, lat, X.astype(dtype), lengths, leaky=leaky, block_size=8)
            assert np.isnan(ll[1]) and not np.isnan(ll[[0, 2, 3]]).any()
            np.testing.assert_array_equal(np.isnan(lls), np.isnan(ll))
            np.testing.assert_array_equal(np.isnan(posts), np.isnan(post))
            tol = 1e-10 if dtype == np.float64 else 2e-5
            np.testing.assert_allclose(lls, ll, rtol=tol, atol=tol)
            np.testing.assert_allclose(posts, post, rtol=tol, atol=tol)


def test_device_arrays_are_cached(be, monkeypatch):
    """The graph's arrays and the shared log_init are built once per lattice
    and dtype; a changed log_init is uploaded again."""
    rng = np.random.default_rng(6)
    den = phone_lm_den(7)
    lat, X, leaky = shared_case(den.fst, 3, 5, rng, 0.1)
    lengths = np.array([5, 5, 3])
    uploads = []
    real = cuda_shared.check_log_init
    monkeypatch.setattr(cuda_shared, "check_log_init", lambda *a: uploads.append(a[2]) or real(*a))
    first = shared_forward_backward(be, lat, X.copy(), lengths, leaky=leaky)
    memo = lat.graph_lattice().memo

    def device_arrays():
        return [k for k in memo.keys() if k[:2] == ("cuda", "arrays")]

    graph = memo[("cuda", "arrays", be.cache_key(), "float64")]
    same = shared_forward_backward(be, lat, X.copy(), lengths, leaky=(0.1, leaky[1].copy()))
    assert memo[("cuda", "arrays", be.cache_key(), "float64")] is graph and len(device_arrays()) == 1
    assert uploads == [den.num_states]  # one upload, of the graph's [Sg]
    np.testing.assert_array_equal(same[1], first[1])
    other = leaky[1] - 1.0  # another log_init, still one for all sequences
    changed = shared_forward_backward(be, lat, X.copy(), lengths, leaky=(0.1, other))
    assert uploads == [den.num_states] * 2
    ref = forward_backward_numpy(lat, X.copy(), lengths, leaky=(0.1, other))
    np.testing.assert_allclose(changed[0], ref[0], rtol=1e-10)
    shared_forward_backward(be, lat, X.astype(np.float32), lengths, leaky=leaky)
    assert len(device_arrays()) == 2  # one per dtype


def test_argument_errors(be):
    rng = np.random.default_rng(8)
    f = random_fst(rng)
    lat, X, leaky = shared_case(f, 2, 3, rng, 0.1)
    with pytest.raises(ValueError, match="leaky"):
        shared_forward_backward(be, lat, X.copy(), [3, 3], leaky=(0.1, np.zeros(lat.num_states + 1)))
    with pytest.raises(ValueError, match="leaky"):
        shared_forward_backward(be, lat, X.copy(), [3, 3], leaky=(1.0, leaky[1]))
    with pytest.raises(ValueError, match="lengths"):
        shared_forward_backward(be, lat, X.copy(), [3, 4])
    with pytest.raises(ValueError, match="X"):
        shared_forward_backward(be, lat, X[:, 1:].copy(), [3, 3])
    with pytest.raises(ValueError, match="block_size"):
        shared_forward_backward(be, lat, X.copy(), [3, 3], block_size=2048)
    two = Lattice.of(FstBatch([f, random_fst(rng)]))
    with pytest.raises(ValueError, match="one graph"):
        shared_forward_backward(be, two, np.zeros((3, two.num_columns)), [3, 3])


# ---------------------------------------------------------------- the engine picker


class _FakeCupyArray:
    """Stands for CuPy scores in :func:`chainfb.engines.select` (which looks
    at the module of the array's type only)."""

    __module__ = "cupy._core.core"


def test_select_picks_the_shared_kernels_for_one_graph():
    rng = np.random.default_rng(9)
    f, g = random_fst(rng), random_fst(rng)
    shared = Lattice.of(FstBatch([f], np.zeros(3, dtype=np.int64)))
    several = Lattice.of(FstBatch([f, g]))
    gpu = _FakeCupyArray()
    assert engines.select(shared, gpu) == "cuda_shared"
    assert engines.select(several, gpu) == "cuda"
    assert engines.select(shared, gpu, engine="cuda") == "cuda"
    assert engines.select(shared, gpu, engine="cuda_shared") == "cuda_shared"
    with pytest.raises(ValueError, match="'cuda_shared' needs every sequence to use one graph"):
        engines.select(several, gpu, engine="cuda_shared")
    with pytest.raises(ValueError, match="'cuda_shared' cannot run on NumPy"):
        engines.select(shared, np.zeros((2, shared.num_columns)), engine="cuda_shared")
    with pytest.raises(ValueError, match="'numpy' cannot run on CuPy"):
        engines.select(shared, gpu, engine="numpy")
    with run_on(object()):  # every array counts as device data, as in the emulated tests
        assert engines.select(shared, np.zeros(1)) == "cuda_shared"
        assert engines.select(several, np.zeros(1)) == "cuda"
        assert engines.select(shared, np.zeros(1), engine="cuda") == "cuda"
        with pytest.raises(ValueError, match="'numpy' cannot run on CuPy"):
            engines.select(shared, np.zeros(1), engine="numpy")
        with pytest.raises(ValueError, match="'shared' cannot run on CuPy"):
            engines.select(several, np.zeros(1), engine="shared")


@pytest.mark.parametrize("coefficient", [0.1, 0.0])
def test_denominator_and_chain_loss_run_the_shared_kernels(be, coefficient):
    """DenominatorGraph (and so ChainLoss) on the kernel path launch the
    shared-graph kernels and the pdf score map's, with the NumPy path's numbers."""
    den = phone_lm_den(10)
    rng = np.random.default_rng(11)
    y = rng.normal(scale=3, size=(3, 7, den.num_pdfs))
    lengths = [7, 5, 2]
    start = len(be.launches)
    with run_on(be):
        ll, post = den.forward_backward(torch.from_numpy(y), lengths, coefficient)
    names = {name for name, _, _ in be.launches[start:]}
    assert names == {"chainfb::fb_shared_recursion<double>", "chainfb::fb_shared_posteriors<double>",
                     "chainfb::pdf_gather<double, double>", "chainfb::pdf_scatter<double, double>"}
    ll_ref, post_ref = den.forward_backward(y, lengths, coefficient, engine="numpy")
    np.testing.assert_allclose(ll.numpy(), ll_ref, rtol=1e-10)
    np.testing.assert_allclose(post.numpy(), post_ref, atol=1e-10)


def test_select_takes_the_cluster_kernels_for_few_long_sequences(emulated_backend, monkeypatch):
    """``engine="auto"`` runs a one-graph lattice on the per-sequence kernels where they spread each sequence over
    a cluster of blocks (one CTC sequence of 3,000 labels: 6,002 states), and on the shared-graph kernels where
    they do not: many sequences, the leaky HMM, a device without clusters, one block by default."""
    from chainfb.ctc import _compile
    from chainfb.engines import cuda

    rng = np.random.default_rng(3)
    one, _ = _compile(np.array([3000]), rng.integers(1, 50, 3000), 0)
    many = Lattice.of(FstBatch(one.batch.fsts, np.zeros(80, dtype=np.int64)))
    assert one.graph == 0 and many.graph == 0 and one.num_states == 6002
    leaky = (0.1, np.zeros(one.num_states))
    with run_on(emulated_backend):
        assert engines.select(one, np.zeros(1)) == "cuda"
        assert engines.select(many, np.zeros(1)) == "cuda_shared"  # 160 directions fill the SMs already
        assert engines.select(one, np.zeros(1), leaky=leaky) == "cuda_shared"
        monkeypatch.setattr(cuda, "CLUSTER", 1)
        assert engines.select(one, np.zeros(1)) == "cuda_shared"
        monkeypatch.setattr(cuda, "CLUSTER", "auto")
        monkeypatch.setattr(type(emulated_backend), "clusters", False, raising=False)
        assert engines.select(one, np.zeros(1)) == "cuda_shared"
