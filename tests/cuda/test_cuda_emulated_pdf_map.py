"""The score map of pdf-labelled graphs through its kernels (``pdf_map.cu``,
run on the CPU under the emulation): the same bits as the NumPy path of
:class:`chainfb.PdfScoreMap` for every layout of the network output, dtype,
scale, per-sequence scale, clip and non-finite value, one launch each way,
and no access outside the arrays (:func:`sanitizer_cases`, run by
``test_cuda_emulated.py``'s AddressSanitizer test)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainfb.score_map import PdfScoreMap
from chainfb.cuda import pdf_maps

from emulation import find_compiler, run_on

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3.0e38, -31.0, 31.0])


@pytest.fixture
def be(emulated_backend):
    return emulated_backend


def _layout(rng, N, T, P, order, dtype, special=True):
    """``[N, T, P]`` scores laid out in memory in ``order`` (a permutation of
    the axes, slowest first), each innermost row followed by two elements
    outside the view (a slice of a wider array, so not contiguous); special
    floats placed at random."""
    sizes = {0: N, 1: T, 2: P}
    shape = [sizes[a] for a in order]
    shape[-1] += 2
    base = (rng.normal(size=shape) * 10).astype(dtype)
    if special:
        flat = base.reshape(-1)
        idx = rng.integers(0, flat.size, size=max(1, flat.size // 10))
        flat[idx] = rng.choice(SPECIAL, size=idx.size).astype(dtype)
    return _view(base, order)


def _view(base, order):
    """The ``[N, T, P]`` view of a padded ``base`` laid out in ``order``."""
    return np.transpose(base[..., :base.shape[-1] - 2], np.argsort(order))


def _copy(view, order):
    """A copy of ``view`` (a :func:`_layout`) with the same layout and padding."""
    return _view(view.base.copy(), order)


def _map(rng, N, P, max_cols=None):
    """A score map over a random set of distinct ``(n, p)`` columns, in sequence order."""
    cols = [(n, p) for n in range(N) for p in sorted(rng.choice(P, size=rng.integers(1, P + 1), replace=False))]
    if max_cols is not None:
        cols = cols[:max_cols]
    seq, pdf = (np.array(c, dtype=np.int64) for c in zip(*cols))
    return PdfScoreMap(seq, pdf)


def _bits(a):
    """The bytes of ``a``'s elements (NaN payloads and the sign of zero included)."""
    return np.ascontiguousarray(a).view(np.uint8)


def _launched(be, fn):
    """``(fn(), the names of the kernels it launched on be)``."""
    before = len(be.launches)
    out = fn()
    return out, [name for name, *_ in be.launches[before:]]


ORDERS = [(0, 1, 2), (1, 0, 2), (2, 1, 0), (1, 2, 0)]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("in_dtype, out_dtype", [(np.float32, np.float32), (np.float32, np.float64),
                                                 (np.float64, np.float64)])
@pytest.mark.parametrize("clip", [None, (-30.0, 30.0)])
def test_gather_gives_the_numpy_bits(be, order, in_dtype, out_dtype, clip):
    rng = np.random.default_rng(abs(hash((order, clip))) % 2**32)
    scores = _layout(rng, 3, 5, 7, order, in_dtype)
    smap = _map(rng, 3, 7)
    want = smap.gather(np, scores, dtype=out_dtype, clip=clip)
    with run_on(be):
        got, names = _launched(be, lambda: smap.gather(np, scores, dtype=out_dtype, clip=clip))
    assert names == [pdf_maps.gather_kernel(in_dtype, out_dtype)]
    assert got.dtype == out_dtype and got.shape == (5, smap.col_seq.size) and got.flags.c_contiguous
    np.testing.assert_array_equal(_bits(got), _bits(want))  # bits, NaN payloads and -0.0 included


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("post_dtype, target_dtype", [(np.float32, np.float32), (np.float64, np.float32),
                                                      (np.float64, np.float64)])
@pytest.mark.parametrize("scale, per_sequence, accumulate", [(1.0, False, False), (0.5, False, True),
                                                             (1.0, True, False), (-2.0, True, True)])
def test_scatter_gives_the_numpy_bits(be, order, post_dtype, target_dtype, scale, per_sequence, accumulate):
    rng = np.random.default_rng(abs(hash((order, scale, per_sequence, accumulate))) % 2**32)
    N, T, P = 3, 6, 5
    smap = _map(rng, N, P)
    post = rng.normal(size=(T - 1, smap.col_seq.size)).astype(post_dtype)  # fewer frames than the target
    post.reshape(-1)[rng.integers(0, post.size, 4)] = rng.choice(SPECIAL, 4)
    seq_scale = np.array([0.25, -3.0, np.inf])[:N].astype(np.float32) if per_sequence else None
    target0 = _layout(rng, N, T, P, order, target_dtype, special=False)
    want, got = _copy(target0, order), _copy(target0, order)
    assert got.strides == target0.strides
    with np.errstate(over="ignore", invalid="ignore"):  # the special values overflow, as they do in the kernel
        smap.scatter_add(np, want, post.copy(), scale, accumulate, seq_scale=seq_scale)
    with run_on(be):
        _, names = _launched(be, lambda: smap.scatter_add(np, got, post.copy(), scale, accumulate,
                                                          seq_scale=seq_scale))
    assert names == [pdf_maps.scatter_kernel(post_dtype, target_dtype)]
    np.testing.assert_array_equal(_bits(got), _bits(want))
    # the padding after every row, outside the [N, T, P] view, is untouched
    np.testing.assert_array_equal(got.base[..., -2:], target0.base[..., -2:])


@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), N=st.integers(1, 4), T=st.integers(1, 6), P=st.integers(1, 6),
       order=st.sampled_from(ORDERS), f64=st.booleans())
def test_gather_then_scatter_property(be, seed, N, T, P, order, f64):
    """Random layouts and column sets: both kernels give the NumPy path's bits."""
    rng = np.random.default_rng(seed)
    dtype = np.float64 if f64 else np.float32
    scores = _layout(rng, N, T, P, order, dtype)
    smap = _map(rng, N, P)
    X = smap.gather(np, scores, dtype=dtype)
    want, got = _copy(scores, order), _copy(scores, order)
    smap.scatter_add(np, want, X.copy(), accumulate=False)
    with run_on(be):
        Xe = smap.gather(np, scores, dtype=dtype)
        smap.scatter_add(np, got, Xe.copy(), accumulate=False)
    np.testing.assert_array_equal(_bits(Xe), _bits(X))
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("pdfs, sectors", [(np.arange(64), 8), (np.arange(0, 64, 8), 8), (np.arange(0, 16), 2),
                                            (np.array([0, 1, 9, 17, 18]), 3)])
def test_bytes_are_counted_by_sector(be, pdfs, sectors):
    """What the cost model reads of a launch (``kWorkBytes``): a 32-byte
    sector of the strided array for each run of columns in one sector, plus
    the compact array's elements."""
    scores = np.zeros((1, 2, 64), dtype=np.float32)
    smap = PdfScoreMap(np.zeros(len(pdfs), dtype=np.int64), pdfs)
    be.count, be.stats[:] = True, []
    try:
        with run_on(be):
            X = smap.gather(np, scores, dtype=np.float32)
            smap.scatter_add(np, scores, X, accumulate=False)
            smap.scatter_add(np, scores, X, accumulate=True)
    finally:
        be.count = False
    got = [s.work["kWorkBytes"] for s in be.stats]
    per_frame = 32 * sectors + 4 * len(pdfs)
    assert got == [2 * per_frame, 2 * per_frame, 2 * (per_frame + 32 * sectors)]


def test_a_dtype_without_a_kernel_takes_the_array_operations(be):
    """float16 gradients (no kernel) still get the NumPy path's values."""
    rng = np.random.default_rng(1)
    smap = _map(rng, 2, 4)
    post = rng.normal(size=(3, smap.col_seq.size)).astype(np.float32)
    want, got = np.zeros((2, 3, 4), np.float16), np.zeros((2, 3, 4), np.float16)
    smap.scatter_add(np, want, post.copy(), accumulate=False)
    with run_on(be):
        _, names = _launched(be, lambda: smap.scatter_add(np, got, post.copy(), accumulate=False))
    assert names == [] and pdf_maps.scatter_kernel(np.float32, np.float16) is None
    np.testing.assert_array_equal(got, want)


def test_ctc_step_maps_its_scores_in_one_launch_each_way(be):
    """A CTC step on the GPU path: the gather, the recursion, the posteriors
    and the scatter -- four launches and no others -- and the CPU path's
    loss and gradient."""
    import chainfb

    g = torch.Generator().manual_seed(0)
    lp = torch.randn(12, 3, 6, generator=g).log_softmax(-1).requires_grad_()
    y, il, tl = torch.randint(1, 6, (3, 4), generator=g), torch.tensor([12, 9, 7]), torch.tensor([4, 2, 3])
    want = chainfb.ctc_loss(lp, y, il, tl)
    gw, = torch.autograd.grad(want, lp)
    with run_on(be):
        def step():
            loss = chainfb.ctc_loss(lp, y, il, tl)
            return loss, torch.autograd.grad(loss, lp)[0]

        (got, gg), names = _launched(be, step)
    assert names == ["chainfb::pdf_gather<float, float>", "chainfb::fb_recursion<float>",
                     "chainfb::fb_posteriors<float>", "chainfb::pdf_scatter<float, float>"]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gg, gw, rtol=1e-5, atol=1e-6)


def sanitizer_cases(be):
    """Both kernels on every layout and dtype pair, the arrays in buffers of
    their own (an access past one is past its buffer): for the
    AddressSanitizer run."""
    rng = np.random.default_rng(0)
    for order in ORDERS:
        for (i, o) in ((np.float32, np.float32), (np.float32, np.float64), (np.float64, np.float64)):
            scores = _layout(rng, 2, 3, 4, order, i)
            smap = _map(rng, 2, 4)
            offs = np.ascontiguousarray(smap._offsets(np, scores)[0])
            X = pdf_maps.gather(be, scores, offs, o, clip=(-1.0, 1.0))
            target = _layout(rng, 2, 3, 4, order, np.float32 if i == np.float32 and o == np.float64 else o)
            toffs = np.ascontiguousarray(smap._offsets(np, target)[0])
            pdf_maps.scatter(be, target, X, toffs, 0.5, np.array([1.0, -1.0], dtype=X.dtype),
                             np.ascontiguousarray(smap.col_seq), accumulate=True)
