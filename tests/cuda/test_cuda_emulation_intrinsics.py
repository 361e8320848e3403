"""What the kernel emulation (tests/emulation/) reproduces and measures
beyond the CUDA subset of today's kernels: the warp intrinsics against
CUDA's definitions, dynamic shared memory, the work counts kernels annotate
(CHAINFB_WORK) and the math modes (CHAINFB_EMULATE_MATH) -- each with the
self-test kernels of ``emulate_selftest.h``, whose results and counts are
known."""

import ctypes
import ctypes.util

import numpy as np
import pytest

from chainfb import Fst, FstBatch, Lattice
from chainfb.engines.cuda import forward_backward
from emulation import EmulatedBackend, find_compiler

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture(scope="module")
def be(emulated_selftest_library):
    return EmulatedBackend(emulated_selftest_library)


@pytest.fixture(scope="module")
def counting(emulated_selftest_library):
    return EmulatedBackend(emulated_selftest_library, count=True)


# ------------------------------------------------------------------ shuffles


def shuffle_reference(kind, values, arg, width):
    """CUDA's warp shuffles as the programming guide states them: lanes form
    segments of ``width``; ``idx`` reads lane ``arg`` modulo ``width`` of the
    segment, ``up`` / ``down`` the lane ``arg`` below / above (its own value
    when that leaves the segment), ``xor`` lane ``lane ^ arg`` (its own value
    when that lies in a later segment)."""
    out = values.copy()
    for t in range(len(values)):
        lane, base = t % 32, t - t % 32
        first = lane // width * width
        if kind == "idx":
            src = first + arg % width
        elif kind == "up":
            src = lane - arg if lane - arg >= first else lane
        elif kind == "down":
            src = lane + arg if lane + arg < first + width else lane
        else:
            src = lane ^ arg if (lane ^ arg) < first + width else lane
        out[t] = values[base + src]
    return out


@pytest.mark.parametrize("width", [32, 16, 8, 4, 2, 1])
def test_shuffles_exchange_values_as_cuda_defines(be, width):
    grid, block = 2, 64
    n = grid * block
    t = np.arange(n)
    v = 1000 * (t // block) + t % block
    types = [(np.int32, v), (np.uint32, (v + 0x80000000) % 2**32), (np.float32, v + 0.25), (np.float64, v + 0.5),
             (np.int64, v + 2**40)]
    args = [0, 1, 2, 3, 5, 7, 15, 16, 17, 31] + [-1, 40]  # srcLane may lie outside [0, width): modulo width
    for arg in args:
        outs = [np.zeros(4 * n, dtype=dt) for dt, _ in types]
        be.launch("cfb_selftest::shuffles", grid, block, [np.int32(arg), np.int32(width)] + outs)
        for out, (dt, vals) in zip(outs, types):
            vals = np.asarray(vals, dtype=dt)
            for i, kind in enumerate(["idx", "up", "down", "xor"]):
                if kind != "idx" and not 0 <= arg < 32:  # (offsets and lane masks beyond a warp: not defined)
                    continue
                want = np.concatenate([shuffle_reference(kind, vals[b * block:(b + 1) * block], arg, width)
                                       for b in range(grid)])
                np.testing.assert_array_equal(out[i * n:(i + 1) * n], want, err_msg=f"{kind} {dt} arg {arg}")


@pytest.mark.parametrize("block", [32, 64, 40, 3])
def test_warp_sum_activemask_and_partial_warps(be, block):
    """__activemask() names the lanes the warp has (the last warp of the
    block may be partial), and a warp-wide sum over them is exact."""
    out = np.zeros(2 * block, dtype=np.int64)
    be.launch("cfb_selftest::warp_sum", 3, block, [out])
    t = np.arange(block)
    warp = t // 32
    sums = np.array([t[warp == w].sum() for w in warp])
    masks = np.array([(1 << int((warp == w).sum())) - 1 for w in warp])
    np.testing.assert_array_equal(out[0::2], sums)
    np.testing.assert_array_equal(out[1::2], masks)


def test_shuffles_are_counted(counting):
    grid, block = 2, 64
    outs = [np.zeros(4 * grid * block, dtype=dt) for dt in (np.int32, np.uint32, np.float32, np.float64, np.int64)]
    counting.launch("cfb_selftest::shuffles", grid, block, [np.int32(1), np.int32(32)] + outs)
    st = counting.stats[-1]
    assert st.work["kWorkShuffle"] == 20 * grid * block and st.span["kWorkShuffle"] == 20
    np.testing.assert_array_equal(st.phases, [1, 1])
    out = np.zeros(2 * 40, dtype=np.int64)
    counting.launch("cfb_selftest::warp_sum", 1, 40, [out])  # 5 xor shuffles or 8 broadcasts, and a __syncwarp
    st = counting.stats[-1]
    assert st.work["kWorkShuffle"] == 32 * 6 + 8 * 9 and st.span["kWorkShuffle"] == 9


# ---------------------------------------------------- dynamic shared memory


def test_dynamic_shared_memory_is_per_block_and_poisoned(be):
    grid, n = 3, 8
    out = np.zeros(grid * 2 * n, dtype=np.float32)
    be.launch("cfb_selftest::dynamic_shared", grid, n, [out, np.int32(0)], shared_mem=n * 4)
    out = out.reshape(grid, 2, n)
    assert np.isnan(out[:, 0]).all()  # read before written: poisoned
    t = np.arange(n)
    for blk in range(grid):
        np.testing.assert_array_equal(out[blk, 1], 1000 * blk + (t - 1) % n)


def test_shared_memory_limits(be):
    out = np.zeros(2 * 2 * 8, dtype=np.float32)
    # 40,000 bytes of static shared memory and 200 KiB of dynamic: over 227 KiB together
    with pytest.raises(RuntimeError, match="static and .* dynamic shared memory"):
        be.launch("cfb_selftest::dynamic_shared", 2, 8, [out, np.int32(1)], shared_mem=200 * 1024)
    be.launch("cfb_selftest::dynamic_shared", 2, 8, [out, np.int32(1)], shared_mem=180 * 1024)
    with pytest.raises(ValueError, match="shared_mem"):
        be.launch("cfb_selftest::dynamic_shared", 2, 8, [out, np.int32(0)], shared_mem=228 * 1024)
    with pytest.raises(ValueError, match="shared_mem"):
        be.launch("cfb_selftest::dynamic_shared", 2, 8, [out, np.int32(0)], shared_mem=-1)
    with pytest.raises(TypeError, match="shared_mem"):
        be.launch("cfb_selftest::dynamic_shared", 2, 8, [out, np.int32(0)], shared_mem=32.0)
    args = (ctypes.c_void_p * 2)()
    assert be.lib.cfb_launch_ex(b"cfb_selftest::dynamic_shared", 1, 8, 228 * 1024, args, 0) == 1
    assert b"dynamic shared memory" in be.lib.cfb_last_error()


# ------------------------------------------------------------- work counts


def test_work_counts_span_and_total(counting):
    """Thread i counts i float arc terms before a barrier and one after:
    span = (blockDim - 1) + 1, total = the sum; thread 0 counts `heavy`
    double state results in the second phase, the others `bytes` bytes."""
    grid, n, heavy, nbytes = 3, 8, 5, 3
    counting.set_work_weights({c: 1.0 for c in counting.work_categories})
    counting.launch("cfb_selftest::work_counts", grid, n, [np.int32(heavy), np.int32(nbytes)])
    st = counting.stats[-1]
    assert (st.name, st.grid, st.block, st.shared_mem) == ("cfb_selftest::work_counts", grid, n, 0)
    assert st["name"] == st.name
    np.testing.assert_array_equal(st.phases, [2] * grid)
    assert st.phases.dtype == np.int64 and st.span_weighted.shape == (grid,)
    zero = {c: 0 for c in counting.work_categories}
    assert st.span == {**zero, "kWorkArcF": (n - 1) + 1, "kWorkStateD": heavy, "kWorkBytes": nbytes}
    assert st.work == {**zero, "kWorkArcF": grid * (n * (n - 1) // 2 + n), "kWorkStateD": grid * heavy,
                       "kWorkBytes": grid * (n - 1) * nbytes}
    # weights 1: phase 1 its heaviest thread does n - 1, phase 2 thread 0 does 1 + heavy (others 1 + bytes)
    np.testing.assert_array_equal(st.span_weighted, [(n - 1) + 1 + heavy] * grid)


def test_weighted_span_takes_the_heavier_thread_by_weight(counting):
    grid, n, heavy, nbytes = 2, 8, 5, 3
    counting.set_work_weights({"kWorkArcF": 1.0, "kWorkStateD": 1.0, "kWorkBytes": 3.0})
    counting.launch("cfb_selftest::work_counts", grid, n, [np.int32(heavy), np.int32(nbytes)])
    # phase 2: thread 0 weighs 1 + 5 = 6, the others 1 + 3 * 3 = 10
    np.testing.assert_array_equal(counting.stats[-1].span_weighted, [(n - 1) + 10] * grid)
    counting.set_work_weights({"kWorkArcF": 0.5, "kWorkStateD": 4.0})  # unnamed categories weigh 0
    counting.launch("cfb_selftest::work_counts", grid, n, [np.int32(heavy), np.int32(nbytes)])
    np.testing.assert_array_equal(counting.stats[-1].span_weighted, [0.5 * (n - 1) + 0.5 + 4.0 * heavy] * grid)
    with pytest.raises(ValueError, match="kWorkNope"):
        counting.set_work_weights({"kWorkNope": 1.0})


def test_counting_off_keeps_no_stats(be):
    be.launch("cfb_selftest::work_counts", 2, 4, [np.int32(1), np.int32(1)])
    assert be.stats == []


def test_engine_kernels_phases(counting):
    """The recursions over L frames pass a barrier per frame at least (blocks
    0, 1: the forwards, 2, 3: the backwards); the posterior kernel has a
    block per sequence and POSTERIOR_FRAMES frames."""
    from chainfb.engines.cuda import POSTERIOR_FRAMES

    two = Fst.from_arcs([(0, 0, 0, -0.5), (0, 1, 1, -1.0), (1, 1, 1, -0.3)], {1: 0.0}, num_states=2)
    lat = Lattice.of(FstBatch([two, two]))
    X = np.random.default_rng(0).normal(size=(50, lat.num_columns))
    start = len(counting.stats)
    forward_backward(counting, lat, X, np.array([50, 20]), block_size=4)
    rec, post = counting.stats[start:]
    assert rec.name == "chainfb::fb_recursion<double>" and post.name == "chainfb::fb_posteriors<double>"
    assert rec.grid == 4 and post.grid == 2 * -(-50 // POSTERIOR_FRAMES)
    for b in (0, 2):
        assert rec.phases[b] > 50 and rec.phases[b + 1] > 20 and rec.phases[b] > rec.phases[b + 1]


# -------------------------------------------------------------- math modes


def _libm():
    name = ctypes.util.find_library("m") or "libm.so.6"
    m = ctypes.CDLL(name)
    for f, t in (("expf", ctypes.c_float), ("logf", ctypes.c_float), ("log1pf", ctypes.c_float),
                 ("exp", ctypes.c_double), ("log", ctypes.c_double), ("log1p", ctypes.c_double)):
        getattr(m, f).restype = t
        getattr(m, f).argtypes = [t]
    return m


def _math_inputs(dtype):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(scale=5.0, size=300), rng.uniform(0.0, 50.0, size=200),
                        [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, -1000.0, 1000.0, np.inf, -np.inf, np.nan, 0.5, -0.5]])
    return x.astype(dtype)


def _run_math(be, x):
    r = "float" if x.dtype == np.float32 else "double"
    out = np.zeros(3 * len(x), dtype=x.dtype)
    be.launch(f"cfb_selftest::math_funcs<{r}>", (len(x) + 63) // 64, 64, [x, np.int32(len(x)), out])
    return out.reshape(3, len(x))


def _libm_results(x):
    m = _libm()
    names = ("expf", "logf", "log1pf") if x.dtype == np.float32 else ("exp", "log", "log1p")
    with np.errstate(all="ignore"):
        return np.array([[getattr(m, f)(float(v)) for v in x] for f in names], dtype=x.dtype)


def _ulps(a, b):
    """Signed ulp steps from b to a (same-signed finite values)."""
    it = np.int32 if a.dtype == np.float32 else np.int64
    ia, ib = a.view(it).astype(object), b.view(it).astype(object)
    return np.array([x - y if y >= 0 else y - x for x, y in zip(ia, ib)], dtype=np.int64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_math_exact_is_libm_bit_for_bit(be, monkeypatch, dtype):
    monkeypatch.delenv("CHAINFB_EMULATE_MATH", raising=False)
    x = _math_inputs(dtype)
    got, ref = _run_math(be, x), _libm_results(x)
    np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))
    monkeypatch.setenv("CHAINFB_EMULATE_MATH", "exact")
    np.testing.assert_array_equal(_run_math(be, x).view(np.uint8), ref.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode, lo, hi", [("ulp2_up", 1, 2), ("ulp2_random", -2, 2)])
def test_math_modes_move_results_by_their_ulps(be, monkeypatch, dtype, mode, lo, hi):
    x = _math_inputs(dtype)
    ref = _libm_results(x)
    monkeypatch.setenv("CHAINFB_EMULATE_MATH", mode)
    got = _run_math(be, x)
    special = ~np.isfinite(ref) | (ref == 0)
    np.testing.assert_array_equal(got[special].view(np.uint8), ref[special].view(np.uint8))  # inf, NaN, 0 kept
    moved = _ulps(got[~special], ref[~special])
    assert moved.min() >= lo and moved.max() <= hi
    assert set(np.unique(moved)) == set(range(lo, hi + 1))  # every step occurs over these inputs
    # numpy's nextafter bounds: lo..hi steps from libm's result
    r, g = ref[~special], got[~special]
    below, above = r, r
    for _ in range(-lo if lo < 0 else 0):
        below = np.nextafter(below, -np.inf)
    for _ in range(hi):
        above = np.nextafter(above, np.inf)
    least = np.nextafter(r, np.inf) if lo == 1 else below
    assert (g >= least).all() and (g <= above).all()
    np.testing.assert_array_equal(_run_math(be, x).view(np.uint8), got.view(np.uint8))  # deterministic
    if mode == "ulp2_random":
        monkeypatch.setenv("CHAINFB_EMULATE_SEED", "777")
        assert not np.array_equal(_run_math(be, x), got, equal_nan=True)  # another seed, other steps


def test_math_mode_reaches_the_engine_and_bad_modes_are_errors(be, monkeypatch):
    two = Fst.from_arcs([(0, 0, 0, -0.5), (0, 1, 1, -1.0), (1, 1, 1, -0.3), (1, 0, 0, -1.2)], {1: 0.0},
                        num_states=2)
    lat = Lattice.of(FstBatch([two]))
    X = np.random.default_rng(1).normal(size=(200, lat.num_columns)).astype(np.float32)
    exact, _ = forward_backward(be, lat, X.copy(), np.array([200]), block_size=4)
    monkeypatch.setenv("CHAINFB_EMULATE_MATH", "ulp2_up")
    up, _ = forward_backward(be, lat, X.copy(), np.array([200]), block_size=4)
    assert up[0] != exact[0] and abs(up[0] - exact[0]) < 1e-3 * abs(exact[0])
    monkeypatch.setenv("CHAINFB_EMULATE_MATH", "ulp3")
    with pytest.raises(RuntimeError, match="CHAINFB_EMULATE_MATH=ulp3"):
        forward_backward(be, lat, X.copy(), np.array([200]), block_size=4)
