"""What the kernel emulation (tests/emulation/emulate.h) catches beyond a plain
run: barriers after an exited thread, uninitialised shared memory (poisoned
with NaN, one copy per block), launch limits, blocks in a random order, and
data races (ThreadSanitizer on a replay of recorded launches)."""

import os
import subprocess

import numpy as np
import pytest

from emulation import EmulatedBackend, build, build_replay, find_compiler

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no host C++ compiler")


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    d = tmp_path_factory.mktemp("selftest")
    return EmulatedBackend(build(str(d), extra_flags=("-DCHAINFB_EMULATE_SELFTEST",)))


def test_barrier_after_exit_is_an_error(selftest):
    out = np.zeros(8, dtype=np.int32)
    with pytest.raises(RuntimeError, match="exited"):
        selftest.launch("cfb_selftest::early_exit_then_sync", 2, 8, [out])
    selftest.launch("cfb_selftest::early_exit_then_sync", 1, 1, [out])  # one thread: no barrier is left waiting


def test_shared_memory_is_per_block_and_poisoned(selftest):
    out = np.zeros(6 * 8, dtype=np.float32)
    selftest.launch("cfb_selftest::read_shared_first", 6, 8, [out])
    assert np.isnan(out).all()  # every block reads its own fresh, poisoned copy


def test_launch_limits(selftest):
    out = np.zeros(2, dtype=np.float64)
    with pytest.raises(RuntimeError, match="shared memory"):
        selftest.launch("cfb_selftest::too_much_shared", 2, 32, [out])
    with pytest.raises(ValueError, match="1024"):
        selftest.launch("cfb_selftest::block_order", 1, 1025, [np.zeros(1, np.int32), np.zeros(1, np.int32)])
    import ctypes

    args = (ctypes.c_void_p * 2)()
    assert selftest.lib.cfb_launch(b"cfb_selftest::block_order", 1, 2048, args) == 1
    assert b"1024" in selftest.lib.cfb_last_error()


def test_blocks_run_in_random_order(selftest):
    order = np.full(64, -1, dtype=np.int32)
    counter = np.zeros(1, dtype=np.int32)
    selftest.launch("cfb_selftest::block_order", 64, 2, [order, counter])
    assert sorted(order) == list(range(64)) and list(order) != list(range(64))


def _run_kernels(be):
    """A few engine and transducer launches (inputs as in the other tests)."""
    import test_cuda_emulated as t

    rng = np.random.default_rng(0)
    lat = t.Lattice.of(t.FstBatch([t.random_fst(rng, num_states=5, num_arcs=12) for _ in range(3)]))
    X = rng.normal(size=(5, lat.num_columns))
    t._compare(be, lat, X, np.array([5, 2, 0]), block=4, leaky=(0.1, np.log(np.full(lat.num_states, 0.2))))
    t._compare(be, lat, X, np.array([5, 3, 1]), block=8, dtype=np.float32, rtol=2e-5, atol=2e-6)
    logits, args, C, rows, zc = t._case(rng, M=2)
    x = t._as_input(logits, "f16")
    Xe, lse = t.transducer_gather(be, x, num_rows=rows, num_columns=C, zero_col=zc, threads_per_row=4,
                                     block_size=8, **args)
    t.transducer_grad(be, x, post=np.abs(np.nan_to_num(Xe, neginf=0.0)), lse=lse, scale=1.0,
                         kind_weight=np.ones(4), clamp=0.5, threads_per_row=4, block_size=8, **args)


def test_replay_of_recorded_launches(tmp_path):
    rec = tmp_path / "rec"
    rec.mkdir()
    be = EmulatedBackend(build(str(tmp_path)), record_to=str(rec))
    _run_kernels(be)
    files = sorted(str(p) for p in rec.iterdir())
    assert len(files) == len(be.launches) >= 5
    res = subprocess.run([build_replay(str(tmp_path)), *files], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "REPLAYED" in res.stdout, res.stderr


def test_emulation_under_tsan(tmp_path):
    """No data race in the kernels (a missing __syncthreads would be one):
    the launches of a few engine and transducer calls, recorded and replayed
    by a ThreadSanitizer build."""
    rec = tmp_path / "rec"
    rec.mkdir()
    be = EmulatedBackend(build(str(tmp_path)), record_to=str(rec))
    _run_kernels(be)
    try:
        exe = build_replay(str(tmp_path), extra_flags=("-fsanitize=thread",))
    except RuntimeError as e:
        pytest.skip(f"ThreadSanitizer build not available: {str(e)[-200:]}")
    files = sorted(str(p) for p in rec.iterdir())
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    res = subprocess.run([exe, *files], capture_output=True, text=True, env=env, timeout=300)
    if "REPLAYED" not in res.stdout and "ThreadSanitizer" not in res.stderr:
        pytest.skip(f"could not run under TSan: {res.stderr[-300:]}")
    assert "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == 0 and "REPLAYED" in res.stdout, res.stderr[-2000:]
